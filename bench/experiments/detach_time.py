"""How long a `memtrace run`'s probes outlive it (issue 14), single uprobes
against multi-uprobe links, side by side in one run.

    sudo .venv/bin/python bench/experiments/detach_time.py [--rounds R] [--launches N]

Each round copies the test libcuda to a fresh file (a new inode), traces a
short launch loop through it with `memtrace run`, and from the moment memtrace
exits runs the same loop untraced, again and again, until it is back to its
untraced speed: until then the run's probes are still in the library (the
kernel removes single uprobes one by one, each after a grace period) and every
process calling it takes their traps. Printed per mode: memtrace's own time
around its command (start and exit: the run's wall time minus the
command's), and the time from memtrace's exit until the loop runs clean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Spread


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--give-up", type=float, default=60.0, help="seconds to wait for a clean loop")
    a = ap.parse_args()
    harness.need_root("detach_time")
    rec = Record()
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-detach-"))
    fx = harness.build_fixtures(tmp / "fx")
    print(f"machine: {harness.describe()}; {a.launches} launches a loop")
    results: dict[str, list[tuple[float, float]]] = {"single": [], "multi": []}
    for r, mode in harness.alternating(list(results), a.rounds, "reverse"):
        lib = harness.fresh_copy(fx / "lib" / "libcuda.so.1", tmp / f"round{r}-{mode}")
        argv = [str(fx / "launchloop"), str(lib), str(a.launches), "0", "0"]
        clean = min(
            harness.loop_seconds(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
            for _ in range(5)
        )
        env = dict(os.environ, MEMTRACE_UPROBE_MULTI="1" if mode == "multi" else "0")
        summary = tmp / "summary.json"
        t0 = time.monotonic()
        run = [sys.executable, "-m", "memtrace", "run", "--no-host", "--format", "json", "-o", str(summary), "--"]
        subprocess.run([*run, *argv], capture_output=True, check=True, env=env, cwd=REPO)
        ended = time.monotonic()
        around_s = (ended - t0) - json.loads(summary.read_text())["command"]["wall_seconds"]
        while True:
            took = harness.loop_seconds(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
            gone = time.monotonic() - ended
            if took < 2 * clean or gone > a.give_up:
                break
        results[mode].append((around_s, gone))
        print(
            f"  round {r + 1} {mode:6} memtrace around its command {around_s:.3f} s; probes gone {gone:.3f} s after it"
        )
    for mode, rs in results.items():
        around, gone = Spread.of(x for x, _ in rs), Spread.of(g for _, g in rs)
        print(
            f"{mode:6} memtrace's start and exit around its command: median {around.median:.3f} s; "
            f"its probes gone: median {gone.median:.3f} s after it ({gone.range()})"
        )
        rec.add(f"a run's probes gone after it, {mode} uprobes", gone.median, "s", ".3f", spread=gone)
    shutil.rmtree(tmp, ignore_errors=True)
    rec.write()


if __name__ == "__main__":
    main()
