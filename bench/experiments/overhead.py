"""What memtrace costs a CPU-bound launch loop, against what it says it costs (issue 18).

    sudo .venv/bin/python bench/experiments/overhead.py [--rounds R] [--launches N] [--work W] [--copy-every C]

The worst case for probes: a loop through the test libcuda that makes N
cuLaunchKernel calls, each followed by W iterations of CPU work, and a
64-byte copy every C launches (tests/fixtures/launchloop.c). Side by side in
one run, alternating which goes first in each round:

  untraced   the loop alone: its own time (it reads the clock itself)
  traced     the same loop under `memtrace run --no-host`: its own time,
             and what memtrace says the probes cost it (JSON `overhead`)

Printed: the loop's median time each way and their ratio; the time the
probes really added (traced - untraced) against memtrace's own estimate
(traps x the calibrated trap cost), and the share of the loop's CPU time
each is. Each round loads a fresh copy of the library (a new inode): an
untraced round must not take traps on probes a previous round's agent is
still detaching in the background.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Spread, Target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launches", type=int, default=200_000)
    ap.add_argument("--work", type=int, default=2000, help="CPU work iterations after each launch")
    ap.add_argument("--copy-every", type=int, default=100)
    a = ap.parse_args()
    harness.need_root("overhead")
    rec = Record()
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-overhead-"))
    fx = harness.build_fixtures(tmp / "fx")
    memtrace = [sys.executable, "-m", "memtrace"]
    untraced: list[float] = []
    traced: list[float] = []
    estimates: list[dict[str, float]] = []
    print(f"machine: {harness.describe()}")
    print(f"launch loop: {a.launches:,} launches, {a.work} work iterations each, a copy every {a.copy_every}")
    for r, mode in harness.alternating(("untraced", "traced"), a.rounds, "reverse"):
        # memtrace knows the library by its name
        lib = harness.fresh_copy(fx / "lib" / "libcuda.so.1", tmp / f"round{r}-{mode}")
        argv = [str(fx / "launchloop"), str(lib), str(a.launches), str(a.work), str(a.copy_every)]
        if mode == "untraced":
            out = subprocess.run(argv, capture_output=True, text=True, check=True)
            untraced.append(harness.loop_seconds(out.stdout))
            print(f"  round {r + 1} untraced {untraced[-1]:.3f} s")
            continue
        summary = tmp / "summary.json"
        out = subprocess.run(
            [*memtrace, "run", "--no-host", "--format", "json", "-o", str(summary), "--", *argv],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        traced.append(harness.loop_seconds(out.stdout))
        rows = json.loads(summary.read_text())["overhead"]
        if len(rows) != 1:
            sys.exit(f"overhead: expected the loop's overhead in the summary, got {rows}: {out.stderr[-2000:]}")
        (row,) = rows
        estimates.append(row)
        print(
            f"  round {r + 1} traced   {traced[-1]:.3f} s  traps {row['traps']:,}  "
            f"memtrace says {row['estimated_seconds']:.3f} s ({row['share_of_cpu']:.1%} of "
            f"{row['cpu_seconds']:.3f} s CPU), {row['trap_seconds'] * 1e6:.2f} us a trap"
            f"{'' if row['calibrated'] else ' (not calibrated)'}"
        )
    u, t = statistics.median(untraced), statistics.median(traced)
    est = statistics.median(e["estimated_seconds"] for e in estimates)
    cpu = statistics.median(e["cpu_seconds"] for e in estimates)
    traps = statistics.median(e["traps"] for e in estimates)
    added = t - u
    print(f"untraced loop {u:.3f} s [{min(untraced):.3f}-{max(untraced):.3f}]")
    print(f"traced   loop {t:.3f} s [{min(traced):.3f}-{max(traced):.3f}]  ratio {t / u:.3f}")
    print(
        f"the probes added {added:.3f} s ({added / traps * 1e6:.2f} us a trap, {added / cpu:.1%} of the traced "
        f"CPU time); memtrace said {est:.3f} s ({est / cpu:.1%}): estimate/measured {est / added:.2f}"
        if added > 0
        else f"the probes added nothing measurable; memtrace said {est:.3f} s ({est / cpu:.1%})"
    )
    if added > 0:
        rec.add("memtrace's own cost estimate on a launch loop, estimate/measured", est / added, "x", ".2f")
    rec.add(
        "launch loop traced/untraced (no budget enforced)",
        t / u,
        "x",
        ".3f",
        Target("<=", 1.01),
        Spread.of(harness.ratios(traced, untraced)),
    )
    shutil.rmtree(tmp, ignore_errors=True)
    rec.write()


if __name__ == "__main__":
    main()
