"""What `memtrace push` costs on a node where nothing is traced (an idle GPU
node of a DaemonSet fleet, or one between jobs); with --old, this checkout
against another commit's, side by side in one run.

    sudo .venv/bin/python bench/targets/idle_agent.py [--rounds R] [--seconds S]
    git worktree add /tmp/old COMMIT
    sudo .venv/bin/python bench/targets/idle_agent.py --old /tmp/old [--rounds R] [--seconds S]

Each round starts `memtrace push` from each tree in turn (PYTHONPATH set to
it, its C helpers built there if missing), pushing every 5 s to an OTLP
sink in this process that answers 200, with the test NVML (one GPU, its
script read once: FAKE_NVML_STATIC) so that the C sampler reads a GPU as
well as the host's interfaces. No CUDA process runs. The agent's threads'
CPU time is read from /proc from --settle seconds after its start (programs
loaded, calibrated) for S seconds; then it is stopped with SIGINT.

Printed: each round's share of one core per arm with its busiest threads,
the medians and, with --old, their ratio (this checkout over the other).
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, CpuWindow, Reading, Record, Spread


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


def one(tree: Path, fx: Path, tmp: Path, endpoint: str, settle: float, seconds: float) -> CpuWindow:
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        LD_LIBRARY_PATH=str(fx / "nvml"),
        FAKE_NVML_SCRIPT=str(tmp / "nvml.script"),
        FAKE_NVML_STATIC="1",
    )
    agent = harness.pinned([sys.executable, "-m", "memtrace", "push", "--endpoint", endpoint], 0)
    p = subprocess.Popen(agent, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(settle)
        first = Reading.of(p.pid)
        time.sleep(seconds)
        last = Reading.of(p.pid)
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    if p.returncode != 0 or not first.threads or not last.threads:
        sys.exit(f"idle_agent: memtrace push from {tree} failed (rc {p.returncode}): {err[-2000:]}")
    return CpuWindow.between(first, last)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="a worktree of the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0, help="each arm's measured window")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds from the agent's start to the window's")
    a = ap.parse_args()
    harness.need_root("idle_agent")
    rec = Record()
    trees = harness.trees("idle_agent", a.old)
    harness.build_helper(REPO)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-idle-agent-"))
    fx = harness.build_fixtures(tmp / "fx", quiet=True)
    sys.path.insert(0, str(REPO / "tests"))
    from test_nvml import HEALTHY, gpu, script  # the healthy test GPU bench/targets/diagnose.py uses

    (tmp / "nvml.script").write_text(script(count=1, driver="580.0", **gpu(0, uuid="GPU-bench", **HEALTHY)))
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    print(f"machine: {harness.describe()}; {a.seconds:g} s an arm")
    shares: dict[str, list[float]] = {arm: [] for arm in trees}
    for r, arm in harness.alternating(list(trees), a.rounds):
        w = one(trees[arm], fx, tmp, endpoint, a.settle, a.seconds)
        shares[arm].append(w.share)
        print(f"round {r + 1} {arm}: {w.share:.2%} ({w.busiest()})", flush=True)
    sink.shutdown()
    new = Spread.of(x * 100 for x in shares["new"])
    rec.add("memtrace push with nothing to trace", new.median, "% of a core", ".2f", spread=new)
    if "old" in shares:
        old = Spread.of(x * 100 for x in shares["old"])
        ratio = harness.over(new.median, old.median)
        print(f"median: {new.median:.2f}% against {old.median:.2f}% of one core (ratio {ratio:.2f})")
        rec.add("memtrace push with nothing to trace, the --old tree", old.median, "% of a core", ".2f", spread=old)
        rec.add(
            "memtrace push with nothing to trace, this tree over --old",
            ratio,
            "x",
            ".2f",
            spread=harness.ratio_spread(shares["new"], shares["old"]),
            note=str(a.old),
        )
    rec.write()


if __name__ == "__main__":
    main()
