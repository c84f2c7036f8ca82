"""`memtrace run`'s own CPU, this checkout against another commit's, side by
side in one run (issue 16: the agent at most 1% of a core).

    git worktree add /tmp/old COMMIT
    sudo .venv/bin/python bench/agent_ab.py --old /tmp/old [--rounds R] [--seconds S]

Each round runs `memtrace run` from each tree in turn (PYTHONPATH set to it,
its C helpers built there if missing) beside the same training-like job
(tests/fixtures/trainjob.c as bench/diagnose shapes it: real CPU work per
step, four 4 MiB copies over the emulated PCIe link, three kernels), with
the test NVML of this checkout for both (its own cost is charged to the
agent), the agent on CPU 0 and the job on the last CPU. The agent's CPU is
read from outside by scripts/gpu/agent_cpu.py from 5 s after its start
(programs loaded, probes attached, calibrated) to its last reading.

Printed: each round's share of one core per arm and its busiest threads,
the medians and their ratio (this checkout over the other).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, build_fixtures, idle_pcie_link, need_root, old_checkout, training_job

SETTLE_S = 5.0


def one(tree: Path, fx: Path, tmp: Path, seconds: float) -> dict:
    out = tmp / "cpu.json"
    cpus = os.cpu_count() or 1
    job = training_job(fx, seconds)
    agent = [sys.executable, "-m", "memtrace", "run", "-o", str(tmp / "summary.json"), "--format", "json", "--"]
    if cpus > 1:
        agent = ["taskset", "-c", "0", *agent]
        job = ["taskset", "-c", str(cpus - 1), *job]
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        LD_LIBRARY_PATH=str(fx / "nvml"),
        FAKE_NVML_SCRIPT=str(tmp / "nvml.script"),
        FAKE_PCIE=str(tmp / "pcie"),
        WORKLOAD_TRUTH="/dev/null",
    )
    measure = [sys.executable, str(REPO / "scripts" / "gpu" / "agent_cpu.py"), str(out), str(SETTLE_S), "--"]
    subprocess.run([*measure, *agent, *job], env=env, cwd=tree, stdout=subprocess.DEVNULL, check=True)
    return dict(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, required=True, help="a worktree of the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=25.0, help="each run of the job")
    a = ap.parse_args()
    need_root("agent_ab")
    old = old_checkout("agent_ab", a.old)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-agent-ab-"))
    fx = tmp / "fx"
    build_fixtures(fx)
    sys.path.insert(0, str(REPO / "tests"))
    from test_nvml import HEALTHY, gpu, script  # the healthy test GPU bench/diagnose uses

    (tmp / "nvml.script").write_text(script(count=1, driver="580.0", **gpu(0, uuid="GPU-bench", **HEALTHY)))
    idle_pcie_link(tmp / "pcie")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}; job {a.seconds:g} s")
    shares: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(a.rounds):
        for arm, tree in (("old", old), ("new", REPO)):
            d = one(tree, fx, tmp, a.seconds)
            shares[arm].append(d["share_of_one_core"])
            top = sorted(d["threads"].items(), key=lambda kv: -kv[1]["share"])
            busy = [(k.removeprefix("memtrace-"), v["share"]) for k, v in top if v["share"] >= 0.0005]
            detail = ", ".join(f"{k} {v:.2%}" for k, v in busy)
            print(f"round {r + 1} {arm}: {d['share_of_one_core']:.2%} over {d['window_s']} s ({detail})", flush=True)
    mo, mn = statistics.median(shares["old"]), statistics.median(shares["new"])
    print(
        f"SUMMARY | memtrace run's CPU beside a training-like job | {mn:.2%} against {mo:.2%} of one core "
        f"(ratio {mn / mo:.2f}) | <= 1% | " + ("met" if mn <= 0.01 else "not met")
    )


if __name__ == "__main__":
    main()
