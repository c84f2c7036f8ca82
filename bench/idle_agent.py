"""What `memtrace push` costs on a node where nothing is traced (an idle GPU
node of a DaemonSet fleet, or one between jobs), this checkout against
another commit's, side by side in one run.

    git worktree add /tmp/old COMMIT
    sudo .venv/bin/python bench/idle_agent.py --old /tmp/old [--rounds R] [--seconds S]

Each round starts `memtrace push` from each tree in turn (PYTHONPATH set to
it, its C helpers built there if missing), pushing every 5 s to an OTLP
sink in this process that answers 200, with the test NVML (one GPU, its
script read once: FAKE_NVML_STATIC) so that the C sampler reads a GPU as
well as the host's interfaces. No CUDA process runs. The agent's threads'
CPU time is read from /proc from SETTLE_S after its start (programs
loaded, calibrated) for S seconds; then it is stopped with SIGINT.

Printed: each round's share of one core per arm with its busiest threads,
the medians and their ratio (this checkout over the other).
"""

from __future__ import annotations

import argparse
import http.server
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import REPO, build_fixtures, build_helper, need_root, old_checkout

SETTLE_S = 5.0


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and keeps nothing."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def one(tree: Path, fx: Path, tmp: Path, endpoint: str, seconds: float) -> tuple[float, dict[str, float]]:
    sys.path.insert(0, str(REPO))
    from memtrace.sources.procfs import thread_cpu_seconds

    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        LD_LIBRARY_PATH=str(fx / "nvml"),
        FAKE_NVML_SCRIPT=str(tmp / "nvml.script"),
        FAKE_NVML_STATIC="1",
    )
    agent = [sys.executable, "-m", "memtrace", "push", "--endpoint", endpoint]
    if (os.cpu_count() or 1) > 1:
        agent = ["taskset", "-c", "0", *agent]
    p = subprocess.Popen(agent, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(SETTLE_S)
        t0, first = time.monotonic(), thread_cpu_seconds(p.pid)
        time.sleep(seconds)
        t1, last = time.monotonic(), thread_cpu_seconds(p.pid)
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    if p.returncode != 0 or not first or not last:
        sys.exit(f"idle_agent: memtrace push from {tree} failed (rc {p.returncode}): {err[-2000:]}")
    per: dict[str, float] = {}
    for tid, (name, cpu) in last.items():
        per[name] = per.get(name, 0.0) + cpu - first.get(tid, (name, 0.0))[1]
    wall = t1 - t0
    return sum(per.values()) / wall, {k: v / wall for k, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, required=True, help="a worktree of the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0, help="each arm's measured window")
    a = ap.parse_args()
    need_root("idle_agent")
    old = old_checkout("idle_agent", a.old)
    build_helper(REPO)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-idle-agent-"))
    fx = build_fixtures(tmp / "fx", quiet=True)
    sys.path.insert(0, str(REPO / "tests"))
    from test_nvml import HEALTHY, gpu, script  # the healthy test GPU bench/diagnose uses

    (tmp / "nvml.script").write_text(script(count=1, driver="580.0", **gpu(0, uuid="GPU-bench", **HEALTHY)))
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}; {a.seconds:g} s an arm")
    shares: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(a.rounds):
        for arm, tree in (("old", old), ("new", REPO)):
            share, threads = one(tree, fx, tmp, endpoint, a.seconds)
            shares[arm].append(share)
            busy = sorted(
                ((k.removeprefix("memtrace-"), v) for k, v in threads.items() if v >= 0.0005), key=lambda kv: -kv[1]
            )
            detail = ", ".join(f"{k} {v:.2%}" for k, v in busy)
            print(f"round {r + 1} {arm}: {share:.2%} ({detail})", flush=True)
    sink.shutdown()
    mo, mn = statistics.median(shares["old"]), statistics.median(shares["new"])
    print(
        f"SUMMARY | memtrace push with nothing to trace | {mn:.2%} against {mo:.2%} of one core (ratio {mn / mo:.2f})"
    )


if __name__ == "__main__":
    main()
