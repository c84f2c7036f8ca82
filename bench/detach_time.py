"""How long a `memtrace run`'s probes outlive it (issue 14), single uprobes
against multi-uprobe links, side by side in one run.

    sudo .venv/bin/python bench/detach_time.py [--rounds R] [--launches N]

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
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, build_fixtures, loop_seconds, need_root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--give-up", type=float, default=60.0, help="seconds to wait for a clean loop")
    a = ap.parse_args()
    need_root("detach_time")
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-detach-"))
    fx = tmp / "fx"
    build_fixtures(fx)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}; {a.launches} launches a loop")
    results: dict[str, list[tuple[float, float]]] = {"multi": [], "single": []}
    for r in range(a.rounds):
        for mode in ("single", "multi") if r % 2 == 0 else ("multi", "single"):
            lib = tmp / f"round{r}-{mode}" / "libcuda.so.1"
            lib.parent.mkdir()
            shutil.copy(fx / "lib" / "libcuda.so.1", lib)
            argv = [str(fx / "launchloop"), str(lib), str(a.launches), "0", "0"]
            clean = min(
                loop_seconds(subprocess.run(argv, capture_output=True, text=True, check=True).stdout) for _ in range(5)
            )
            env = dict(os.environ, MEMTRACE_UPROBE_MULTI="1" if mode == "multi" else "0")
            summary = tmp / "summary.json"
            t0 = time.monotonic()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "memtrace",
                    "run",
                    "--no-host",
                    "--format",
                    "json",
                    "-o",
                    str(summary),
                    "--",
                    *argv,
                ],
                capture_output=True,
                check=True,
                env=env,
                cwd=REPO,
            )
            ended = time.monotonic()
            around_s = (ended - t0) - json.loads(summary.read_text())["command"]["wall_seconds"]
            while True:
                took = loop_seconds(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
                gone = time.monotonic() - ended
                if took < 2 * clean or gone > a.give_up:
                    break
            results[mode].append((around_s, gone))
            print(
                f"  round {r + 1} {mode:6} memtrace around its command {around_s:.3f} s; "
                f"probes gone {gone:.3f} s after it"
            )
    for mode, rs in results.items():
        print(
            f"{mode:6} memtrace's start and exit around its command: "
            f"median {statistics.median(x for x, _ in rs):.3f} s; "
            f"its probes gone: median {statistics.median(g for _, g in rs):.3f} s after it"
        )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
