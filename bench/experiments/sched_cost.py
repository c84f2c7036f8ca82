"""Cost of the CPU sensor's sched probes per context switch (issue 15).

    sudo .venv/bin/python bench/experiments/sched_cost.py [--trips N] [--rounds R]

Two processes pinned to one CPU ping-pong a byte over pipes
(bench/src/pingpong.c): each round trip is two context switches and two
wakeups, so the loop is nothing but scheduling. Side by side in one run,
rounds alternating (the order rotating each round), it is measured
  unloaded   no sched programs
  other      the sensor loaded and tracing some other process: what every
             process on the host pays (the programs run on every switch,
             find the pid is not traced, return)
  traced     the sensor tracing both ping-pong processes: histograms,
             switch counts, preemptor lookups on every switch
and reported as ns per round trip, the ratio to unloaded (median of the
rounds' ratios, since this VM's speed drifts) and the added ns per context
switch ((loaded - unloaded) / 2 per round trip; the wakeup probes included).

Wall-clock A/B on a shared 2-CPU VM is noisy, so one more run per loaded mode
measures the programs themselves: the kernel's BPF run-time statistics
(BPF_ENABLE_STATS, held only for that run: the fd turns them off again when
closed), in ns per program invocation and per context switch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from memtrace.bpf.libbpf import Libbpf
from memtrace.sensors.sched import SchedSensor
from memtrace.sensors.sched.sensor import PROGRAMS

MODES = ("unloaded", "other", "traced")
CPU = 1 if harness.CPUS > 1 else 0


def build(tmp: Path) -> Path:
    return harness.build_c("pingpong.c", tmp / "pingpong", ["-Wall"])


def prog_stats() -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of the sched programs loaded last (ours: this
    bpftool shows no owner pids, so the newest program of each name)."""
    r = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True)
    newest: dict[str, dict[str, int]] = {}
    for p in json.loads(r.stdout):
        name = p.get("name")
        if name in PROGRAMS and (name not in newest or p["id"] > newest[name]["id"]):
            newest[name] = p
    return {n: (int(p.get("run_time_ns", 0)), int(p.get("run_cnt", 0))) for n, p in newest.items()}


def one_run(binary: Path, trips: int, mode: str, stats: dict[str, tuple[int, int]] | None = None) -> float:
    """ns per round trip; with `stats`, the programs' own run time is measured into it."""
    p = subprocess.Popen([str(binary), str(trips), str(CPU)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    pids = [int(x) for x in p.stdout.readline().split()]
    sensor = None
    try:
        if mode != "unloaded":
            sensor = SchedSensor()
            sensor.start(pids if mode == "traced" else [os.getpid()])
        stats_fd = -1
        if stats is not None:
            lib = Libbpf.get().lib
            lib.bpf_enable_stats.argtypes = [ctypes.c_int]
            stats_fd = lib.bpf_enable_stats(0)  # BPF_STATS_RUN_TIME
            assert stats_fd >= 0, "cannot enable BPF run-time statistics"
            before = prog_stats()
        p.stdin.write("g")
        p.stdin.flush()
        ns = int(p.stdout.readline())
        p.wait()
        if stats is not None:
            after = prog_stats()
            os.close(stats_fd)
            for name, (t, n) in after.items():
                t0, n0 = before.get(name, (0, 0))
                stats[name] = (t - t0, n - n0)
        if mode == "traced":
            assert sensor is not None
            st = sensor.read()
            switches = sum(s.voluntary + s.involuntary for s in st.values())
            assert switches >= 2 * trips, f"the sensor saw {switches} switches for {trips} round trips"
    finally:
        if sensor is not None:
            sensor.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    return ns / trips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trips", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    harness.need_root("sched_cost")
    with tempfile.TemporaryDirectory() as d:
        binary = build(Path(d))
        one_run(binary, a.trips // 10, "traced")  # warm up (and check the sensor sees the switches)
        res: dict[str, list[float]] = {m: [] for m in MODES}
        for _, m in harness.alternating(MODES, a.rounds, "rotate"):
            res[m].append(one_run(binary, a.trips, m))
        measured: dict[str, dict[str, tuple[int, int]]] = {}
        for m in MODES[1:]:
            measured[m] = {}
            one_run(binary, a.trips, m, measured[m])
    med = {m: statistics.median(v) for m, v in res.items()}
    print(
        f"machine: {harness.describe()}; "
        f"{a.trips:,} round trips (2 switches each) per run, both processes on CPU {CPU}, "
        f"{a.rounds} rounds alternating, medians"
    )
    print(f"{'':10} {'ns/round trip':>14} {'ratio':>8} {'ns/switch added':>16}   ratio range over rounds")
    for m in MODES:
        ratios = harness.ratios(res[m], res["unloaded"])
        added = [(x - u) / 2 for x, u in zip(res[m], res["unloaded"], strict=True)]
        rng = f"{min(ratios):.3f}-{max(ratios):.3f}" if m != "unloaded" else ""
        print(f"{m:10} {med[m]:14.1f} {statistics.median(ratios):8.3f} {statistics.median(added):16.1f}   {rng}")
    print("in-kernel cost of the programs themselves (BPF run-time statistics, one run per mode):")
    for m, st in measured.items():
        parts = [f"{name} {t / n:.0f} ns x {n / a.trips:.2f}/trip" for name, (t, n) in sorted(st.items()) if n]
        total = sum(t for t, _ in st.values()) / a.trips / 2
        print(f"  {m:8} {total:6.0f} ns per switch   ({'; '.join(parts)})")


if __name__ == "__main__":
    main()
