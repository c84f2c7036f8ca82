"""The overhead budget on the worst case: a CPU-bound launch loop.

    sudo .venv/bin/python bench/overhead_budget.py [--rounds 3] [--launches 1000000] [--work-us 20]
        [--copy-every 1000] [--libs as-built|pushfirst]

tests/fixtures/launchloop.c makes LAUNCHES cuLaunchKernel calls through the
test libcuda, each followed by a fixed amount of CPU work (about WORK_US, sized
here at start) and a 64-byte copy every COPY_EVERY launches. Three configurations run
in alternating order each round, under `memtrace run` as users run it:
untraced, traced with the default budget (1% of the process's CPU time), and
traced with the budget off (every launch probed: what the budget saves). The
loop times itself (from its first launch to its last), so the agent's start
and its attach time are not counted. Reported: medians and spreads of the
loop's time, ratios to untraced, the launch count memtrace reports against the
loop's own, the share of launches that took a trap (the duty cycle's effect),
and memtrace's own overhead estimate for the process.

--libs: the test libcuda as the tests build it (-O2: its launch and copy
entries begin with an instruction the kernel single-steps, ~10 us a trap on
this VM), or the same built push-first (tests/fixtures/Makefile's
pushfirst/: every entry begins with a push, as every CUDA entry point
does, which the kernel emulates: ~1 us; bench/entry_cost.py).

The copies are exact probes, never sampled: at ~10 us a trap (this VM) and a
copy every 100 launches they alone cost ~1% of a 20 us launch, so the default
is a copy every 1000 launches; --copy-every 100 shows that floor.

Then a GPU-bound simulated training step (bench/src/trainstep.c, as
bench/step_time.py --simulate runs it), untraced against traced with the
default budget: the budget must leave such a loop unchanged.

Not a timed test: the machine is shared; run it niced and read the spreads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, build_fixtures, need_root


def build(tmp: Path, libs: str) -> tuple[Path, Path, Path]:
    build_fixtures(tmp, quiet=True)
    loop, step = tmp / "launchloop", tmp / "trainstep"
    subprocess.run(
        ["cc", "-O2", "-o", str(loop), str(REPO / "tests" / "fixtures" / "launchloop.c"), "-ldl"], check=True
    )
    subprocess.run(["cc", "-O2", "-o", str(step), str(REPO / "bench" / "src" / "trainstep.c"), "-ldl"], check=True)
    return tmp / ("pushfirst" if libs == "pushfirst" else "lib") / "libcuda.so.1", loop, step


def memtrace_run(
    argv: list[str], budget: str | None, out: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cmd = [sys.executable, "-m", "memtrace", "run", "--no-host", "--format", "json", "-o", str(out)]
    if budget is not None:
        cmd += ["--overhead-budget", budget]
    p = subprocess.run([*cmd, "--", *argv], capture_output=True, text=True, check=True)
    return p, json.loads(out.read_text())


def fresh_library(lib: Path, tmp: Path, n: int) -> Path:
    """A copy of the test libcuda with an inode of its own: the previous traced round's
    probes are detached in the background (seconds) and must not reach this round."""
    d = tmp / f"round{n}"
    d.mkdir()
    shutil.copy(lib, d / lib.name)
    return d / lib.name


def loop_round(argv: list[str], mode: str, out: Path) -> dict[str, Any]:
    if mode == "untraced":
        # Another agent on the host (host-wide probes on every libcuda it sees) would make
        # "untraced" traced: a bare loop of launches with no work says whether one is there.
        bare = subprocess.run([*argv[:2], "20000", "0", "0"], capture_output=True, text=True, check=True)
        p = subprocess.run(argv, capture_output=True, text=True, check=True)
        doc: dict[str, Any] = {"bare_ns": float(bare.stdout.split()[7]) / 20000 * 1e9}
    else:
        p, doc = memtrace_run(argv, None if mode == "budget 1%" else "off", out)
    w = p.stdout.split()
    r: dict[str, Any] = {"seconds": float(w[7]), "truth": int(w[1]), **doc}
    if "launches" in doc:
        r["launches"] = sum(row["launches"] for row in doc["launches"])
        r["estimated"] = any(row["estimated"] for row in doc["launches"])
        o = doc.get("overhead") or [{}]
        r["share"] = o[0].get("share_of_cpu")
        r["trap_us"] = (o[0].get("trap_seconds") or 0) * 1e6
        r["traps"] = o[0].get("traps")
        r["launch_traps"] = o[0].get("launch_traps") or 0
        r["duty"] = o[0].get("launch_duty")
    return r


def spread(xs: list[float]) -> str:
    m = statistics.median(xs)
    return f"{m:.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=1_000_000)
    ap.add_argument("--work-us", type=float, default=20.0)
    ap.add_argument("--copy-every", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=200, help="GPU-bound simulated steps per round")
    ap.add_argument("--libs", choices=("as-built", "pushfirst"), default="as-built", help="the test libcuda's entries")
    a = ap.parse_args()
    need_root("overhead_budget", "memtrace attaches uprobes")
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-budget-"))
    lib, loop, step = build(tmp, a.libs)
    # Size the work: iterations of the loop's CPU work per microsecond, untraced.
    probe = subprocess.run([str(loop), str(lib), "20000", "2000", "0"], capture_output=True, text=True, check=True)
    per_us = 2000 / (float(probe.stdout.split()[7]) / 20000 * 1e6)
    work = max(int(a.work_us * per_us), 1)
    argv = [str(loop), str(lib), str(a.launches), str(work), str(a.copy_every)]
    print(
        f"launch loop: {a.launches} launches, ~{a.work_us:g} us of CPU work each ({work} iterations), "
        f"a copy every {a.copy_every}; the test libcuda {'built push-first' if a.libs == 'pushfirst' else 'as built'}"
    )
    modes = ["untraced", "budget 1%", "budget off"]
    res: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(a.rounds):
        order = modes[r % 3 :] + modes[: r % 3]
        for m in order:
            lib_n = fresh_library(lib, tmp, len(res["untraced"]) * 10 + len(res[m]) * 3 + modes.index(m) + 100 * r)
            res[m].append(loop_round([argv[0], str(lib_n), *argv[2:]], m, tmp / "out.json"))
            x = res[m][-1]
            more = f"  launches {x['launches']}" if "launches" in x else f"  bare launch {x['bare_ns']:.0f} ns"
            print(f"  round {r + 1} {m:10} {x['seconds']:.3f} s{more}")
    base = statistics.median(x["seconds"] for x in res["untraced"])
    for m in modes:
        xs = res[m]
        ratio = statistics.median(x["seconds"] for x in xs) / base
        line = f"{m:10} loop {spread([x['seconds'] for x in xs])}  ratio {ratio:.3f}"
        if m == "untraced":
            line += f"  bare launch {statistics.median(x['bare_ns'] for x in xs):.0f} ns (foreign probes if >> 100)"
        else:
            errs = [abs(x["launches"] - x["truth"]) / x["truth"] for x in xs]
            line += f"  launch error median {statistics.median(errs):.2%} max {max(errs):.2%}"
            line += f"  estimated {sum(x['estimated'] for x in xs)}/{len(xs)}"
            trapped = statistics.median(x["launch_traps"] / x["truth"] for x in xs)
            line += f"  launches trapped {trapped:.1%}"
            shares = [x["share"] for x in xs if x["share"] is not None]
            if shares:
                line += f"  memtrace's estimate {statistics.median(shares):.1%} of CPU"
            line += f"  trap {statistics.median(x['trap_us'] for x in xs):.1f} us"
        print(line)
    # GPU-bound: the simulated training step (41 launches, 10 us CPU and 63 us GPU each, copies, a sync).
    sargv = [str(step), str(lib), str(a.steps), "41", "10", str(2590 / 41)]
    times: dict[str, list[float]] = {"untraced": [], "budget 1%": []}
    for r in range(a.rounds):
        for m in ["untraced", "budget 1%"] if r % 2 == 0 else ["budget 1%", "untraced"]:
            lib_n = fresh_library(lib, tmp, 1000 + 2 * r + (m == "untraced"))
            run_argv = [sargv[0], str(lib_n), *sargv[2:]]
            if m == "untraced":
                p = subprocess.run(run_argv, capture_output=True, text=True, check=True)
            else:
                p, _ = memtrace_run(run_argv, None, tmp / "out.json")
            times[m].append(json.loads(p.stderr.strip().splitlines()[-1])["median_step_s"])
    mu, mt = statistics.median(times["untraced"]), statistics.median(times["budget 1%"])
    print(
        f"GPU-bound simulated step: untraced {mu * 1e3:.3f} ms [{min(times['untraced']) * 1e3:.3f}-"
        f"{max(times['untraced']) * 1e3:.3f}], budget 1% {mt * 1e3:.3f} ms [{min(times['budget 1%']) * 1e3:.3f}-"
        f"{max(times['budget 1%']) * 1e3:.3f}], ratio {mt / mu:.3f}"
    )


if __name__ == "__main__":
    main()
