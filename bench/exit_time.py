"""How long `memtrace run` takes once its command has exited (issue 14: well
under a second), with and without the host signals, side by side in one run.

    sudo .venv/bin/python bench/exit_time.py [--rounds R]

Each round runs `memtrace run -- sh -c 'workload; date +%s.%N > T'` (a short
copy workload through the test CUDA libraries; the shell writes the time it
ends): from that moment, how long until memtrace's summary appears (its
table on stderr, read line by line as it comes) and until memtrace itself
exits. The two arms (`--host`, the default, and `--no-host`) alternate.
Printed: each round, and the medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, build_fixtures, need_root


def one(fx: Path, tmp: Path, host: bool) -> tuple[float, float, float]:
    """(command's wall time, summary after its exit, memtrace's exit after it), seconds."""
    stamp = tmp / "ended"
    stamp.unlink(missing_ok=True)
    cmd = f"{fx / 'workload'} -n 100 -e > /dev/null; date +%s.%N > {stamp}"
    argv = [sys.executable, "-m", "memtrace", "run", "--host" if host else "--no-host", "--", "sh", "-c", cmd]
    env = dict(os.environ, WORKLOAD_TRUTH="/dev/null", PYTHONPATH=str(REPO))
    started = time.time()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    summary_at = None
    for line in p.stderr:
        if summary_at is None and line.strip():
            summary_at = time.time()  # the table's first line (the command writes nothing to stderr)
    p.wait()
    exited = time.time()
    if p.returncode != 0 or summary_at is None:
        sys.exit(f"exit_time: memtrace run failed (exit {p.returncode})")
    ended = float(stamp.read_text())
    return ended - started, summary_at - ended, exited - ended


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    need_root("exit_time")
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-exit-"))
    fx = tmp / "fx"
    build_fixtures(fx)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}; {a.rounds} rounds")
    arms = {"host signals": True, "--no-host": False}
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in arms}
    for r in range(a.rounds):
        for name in arms if r % 2 == 0 else reversed(list(arms)):
            res[name].append(one(fx, tmp, arms[name]))
            run_s, summ, ex = res[name][-1]
            print(
                f"round {r + 1}  {name:12s} start to command's end {run_s * 1000:6.0f} ms;"
                f" after it: summary {summ * 1000:5.0f} ms, memtrace gone {ex * 1000:5.0f} ms",
                flush=True,
            )
    for name, rows in res.items():
        summ = statistics.median(r[1] for r in rows)
        ex = statistics.median(r[2] for r in rows)
        print(f"median  {name:12s} summary {summ * 1000:5.0f} ms, memtrace gone {ex * 1000:5.0f} ms after the command")
    worst = max(statistics.median(r[2] for r in rows) for rows in res.values())
    print(
        f"SUMMARY | memtrace run gone after its command exits (median, worse arm) | {worst * 1000:.0f} ms | "
        f"well under 1 s | " + ("met" if worst < 0.5 else "not met")
    )


if __name__ == "__main__":
    main()
