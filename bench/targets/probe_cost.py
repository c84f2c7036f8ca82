"""Traced-process overhead per intercepted call (issue 6, target 1).

    sudo .venv/bin/python bench/targets/probe_cost.py [--calls N] [--rounds R]

A process pinned to one CPU calls three libcuda entry points of the test
library in tight loops (bench/src/callloop.c): a copy (cuMemcpyHtoDAsync_v2),
a launch (cuLaunchKernel) and a wait (cuStreamSynchronize). Side by side in
one run, rounds alternating, it is measured
  untraced   no probe at all
  bare       programs that only return 0, attached as single uprobes: entry
             and return on the copy and the wait, entry only on the launch
             (bench/src/bare.bpf.c) - the floor of the technique
  bare-multi the same programs through multi-uprobe links, one for the entries
             and one for the returns of the file: the way memtrace attaches its
             own where the kernel has them (6.6+), so its floor there
  bare-pair  bare entry and return probes on the launch too (what a design
             that probes launches like copies pays)
  before     the previous hot path (git ae32709): copies summed into a kernel
             hash at return and written to the ring; launches probed like copies
  memtrace   the agent as shipped
  timeline   the agent as `run --timeline` has it (launch_events): each launch
             also timed by a return probe on the launch symbol, and one record
             on the ring per launch at its return (its slice), drained as ever
and the per-call cost over untraced is reported (medians over the rounds)
with the ratio memtrace/floor (target: at most 1.15; the floor is bare-multi
where memtrace attaches multi-uprobe links, else bare), taken within each
round and then its median over the rounds, since this VM's speed drifts.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np

from bench import harness
from bench.harness import REPO, Record, Spread, Target
from memtrace.bpf.libbpf import BpfObject, Libbpf, uprobe_multi_supported
from memtrace.bpf.ringbuf import EventRing
from memtrace.core.abi import EVENT_DTYPE, Layer, Stat
from memtrace.sensors.cuda import probe_plan

# struct mt_event of the previous hot path: today's without the two pointers, the process start and the
# call stack's id, all added since (48 bytes)
_SINCE = ("dst", "src", "start_ns", "stack")
OLD_EVENT = np.dtype([(n, EVENT_DTYPE.fields[n][0]) for n in EVENT_DTYPE.names if n not in _SINCE])
assert OLD_EVENT.itemsize == 48

BEFORE = "ae32709"  # the last commit with the previous hot path
KINDS = ("copy", "launch", "sync")
LOOP_CPU = 1  # where bench/src/callloop.c pins itself
SYMS = {"copy": "cuMemcpyHtoDAsync_v2", "launch": "cuLaunchKernel", "sync": "cuStreamSynchronize"}
TARGET = Target("<=", 1.15)


def build(tmp: Path) -> tuple[Path, Path, Path, Path | None]:
    """The test libraries, the call loop, the bare object and the 'before' object."""
    fx = harness.build_fixtures(tmp / "fx")
    loop = harness.build_c("callloop.c", tmp / "callloop", libs=["-ldl"])
    bare = harness.build_bpf(REPO / "bench" / "src" / "bare.bpf.c", tmp / "bare.bpf.o")
    before = None
    old = tmp / "before"
    old.mkdir()
    try:
        for f in ("memtrace.bpf.c", "memtrace.h"):
            src = subprocess.run(
                ["git", "-C", str(REPO), "show", f"{BEFORE}:bpf/{f}"], check=True, capture_output=True
            ).stdout
            (old / f).write_bytes(src)
        before = harness.build_bpf(old / "memtrace.bpf.c", tmp / "before.bpf.o", old)
    except subprocess.CalledProcessError as e:
        print(f"(no 'before' figures: {e})")
        before = None
    return fx / "lib" / "libcuda.so.1", loop, bare, before


class Loop:
    def __init__(self, loop: Path, lib: Path, calls: int) -> None:
        self.p = subprocess.Popen(
            [str(loop), str(lib), str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.p.stdout.readline().strip() == "ready"

    def run(self) -> dict[str, float]:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        f = self.p.stdout.readline().split()
        return {f[i]: float(f[i + 1]) for i in range(0, len(f), 2)}

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


def offsets(lib: Path) -> dict[str, tuple[int, int, bool]]:
    plan = {p.symbol: p for p in probe_plan(str(lib), Layer.DRIVER)}
    return {k: (plan[s].offset, plan[s].cookie, plan[s].needs_return) for k, s in SYMS.items()}


def attach_plain(obj_path: Path, enter: str, ret: str, lib: Path, plan: dict, launch_return: bool, cookies=None):  # type: ignore[no-untyped-def]
    obj = BpfObject(obj_path, Libbpf.get())
    obj.load()  # the old object's options keep their defaults: trace every process
    links = []
    for kind, (off, cookie, _needs_return) in plan.items():
        c = cookies[kind] if cookies else cookie
        links.append(obj.attach_uprobe(enter, str(lib), off, c, False))
        if kind != "launch" or launch_return:
            links.append(obj.attach_uprobe(ret, str(lib), off, c, True))
    return obj, links


def attach_multi(obj_path: Path, lib: Path, plan: dict):  # type: ignore[no-untyped-def]
    """The bare programs through one multi-uprobe link for the entries and one
    for the returns (copy and wait), as memtrace attaches its own."""
    obj = BpfObject(obj_path, Libbpf.get())
    for prog in ("bare_enter", "bare_return"):
        obj.load_for_uprobe_multi(prog)
    obj.load()
    entries = [(off, cookie) for off, cookie, _r in plan.values()]
    returns = [(off, cookie) for k, (off, cookie, _r) in plan.items() if k != "launch"]
    links = [
        obj.attach_uprobe_multi(prog, str(lib), [o for o, _c in at], [c for _o, c in at], ret)
        for prog, at, ret in (("bare_enter", entries, False), ("bare_return", returns, True))
    ]
    return obj, links


def detach(obj, links) -> None:  # type: ignore[no-untyped-def]
    for link in links:
        link.destroy()
    obj.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    harness.need_root("probe_cost")
    rec = Record()
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-probe-cost-"))
    lib, loop_bin, bare, before = build(tmp)
    plan = offsets(lib)
    # The old hot path knew copies only: its launch and wait probes carry the
    # copy's cookie, so they cost what probing them like copies cost.
    old_cookie = plan["copy"][1] & ((1 << 37) - 1)
    before_cookies = {k: old_cookie for k in KINDS}
    multi = uprobe_multi_supported()  # memtrace attaches multi-uprobe links here
    floor = "bare-multi" if multi else "bare"
    loop = Loop(loop_bin, lib, a.calls)

    def probed(obj_links: tuple[BpfObject, list]) -> dict[str, float]:  # type: ignore[type-arg]
        obj, links = obj_links
        r = loop.run()
        detach(obj, links)
        return r

    def old_hot_path() -> dict[str, float]:
        assert before is not None
        obj, links = attach_plain(before, "mt_copy_enter", "mt_copy_return", lib, plan, True, before_cookies)
        ring = EventRing(obj.map("events").fd, 16 << 20, OLD_EVENT)
        # Drained every 5 ms, as the agent does (a full ring sends every call down the lost path), on
        # another CPU than the loop's: what is measured is the cost each call pays in the traced process.
        with harness.polling(ring.read, 0.005, away_from=LOOP_CPU):
            r = loop.run()
        ring.close()
        detach(obj, links)
        return r

    def shipped(launch_events: bool = False) -> dict[str, float]:
        with harness.cuda_agent(detach_in_background=False, launch_events=launch_events) as agent:
            agent.scan([loop.p.pid])
            with harness.draining(agent, away_from=LOOP_CPU):
                r = loop.run()
            st = agent.stats()
            assert st[Stat.DROPPED] == 0 and st.get(Stat.LAUNCH_DROPPED, 0) == 0
            # host-wide: another process's launches may be recorded too, never fewer than the loop's
            assert (st.get(Stat.LAUNCH_EVENTS, 0) >= a.calls) if launch_events else not st.get(Stat.LAUNCH_EVENTS, 0)
        return r

    setups: dict[str, Callable[[], dict[str, float]]] = {
        "untraced": loop.run,
        "bare": lambda: probed(attach_plain(bare, "bare_enter", "bare_return", lib, plan, launch_return=False)),
        "bare-pair": lambda: probed(attach_plain(bare, "bare_enter", "bare_return", lib, plan, launch_return=True)),
    }
    if multi:
        setups["bare-multi"] = lambda: probed(attach_multi(bare, lib, plan))
    if before:
        setups["before"] = old_hot_path
    setups["memtrace"] = shipped
    setups["timeline"] = lambda: shipped(launch_events=True)
    results: dict[str, dict[str, list[float]]] = {s: {k: [] for k in KINDS} for s in setups}
    try:
        for _, setup in harness.alternating(list(setups), a.rounds):
            for k, v in setups[setup]().items():
                results[setup][k].append(v)
    finally:
        loop.close()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in results.items()}
    print(f"machine: {harness.describe()}; {a.calls:,} calls per kind per round, {a.rounds} rounds, medians")
    print(f"{'':10}" + "".join(f"{k + ' ns/call':>18}" for k in KINDS))
    for s in med:
        print(f"{s:10}" + "".join(f"{med[s][k]:18.1f}" for k in KINDS))
    print(f"cost over untraced (ns/call) and memtrace / {floor} (the floor as memtrace attaches here):")
    for k in KINDS:
        base = med["untraced"][k]
        over = {s: med[s][k] - base for s in med if s != "untraced"}
        line = "  ".join(f"{s} +{v:.0f}" for s, v in over.items())
        ratio = Spread.of(harness.ratios(results["memtrace"][k], results[floor][k]))
        print(
            f"  {k:7} {line}   memtrace/{floor} = {ratio.median:.3f} (median of the rounds' ratios, "
            f"{ratio.range()})  (target {TARGET})"
        )
        rec.add(f"probe cost, {k} ({SYMS[k]})", ratio.median, f"x {floor}", ".3f", TARGET, ratio)
    tl = Spread.of(harness.ratios(results["timeline"]["launch"], results["memtrace"]["launch"]))
    print(
        f"  a launch with its slice (run --timeline: a return probe and a record): "
        f"+{med['timeline']['launch'] - med['memtrace']['launch']:.0f} ns over memtrace's launch, "
        f"timeline/memtrace = {tl.median:.3f} ({tl.range()})"
    )
    rec.add("probe cost, launch with its timeline slice", tl.median, "x memtrace", ".3f", None, tl)
    if "before" in med:
        print(
            "before -> after (ns/call): "
            + ", ".join(f"{k} {med['before'][k]:.0f} -> {med['memtrace'][k]:.0f}" for k in KINDS)
        )
    rec.write()


if __name__ == "__main__":
    main()
