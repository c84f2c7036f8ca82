"""`memtrace run`'s own CPU, this checkout against another commit's, side by
side in one run (issue 16: the agent at most 1% of a core).

    git worktree add /tmp/old COMMIT
    sudo .venv/bin/python bench/experiments/agent_ab.py --old /tmp/old [--rounds R] [--seconds S]

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
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, CpuWindow, Record, Spread, Target

SETTLE_S = 5.0


def one(tree: Path, fx: Path, tmp: Path, seconds: float) -> CpuWindow:
    job = harness.pinned(harness.training_job(fx, seconds), harness.LAST_CPU)
    agent = [sys.executable, "-m", "memtrace", "run", "-o", str(tmp / "summary.json"), "--format", "json", "--"]
    agent = harness.pinned(agent, 0)
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        LD_LIBRARY_PATH=str(fx / "nvml"),
        FAKE_NVML_SCRIPT=str(tmp / "nvml.script"),
        FAKE_PCIE=str(tmp / "pcie"),
        WORKLOAD_TRUTH="/dev/null",
    )
    rc, _, window = harness.watch_threads([*agent, *job], SETTLE_S, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    if rc != 0 or window is None:
        sys.exit(f"agent_ab: memtrace run from {tree} failed (rc {rc}) or ended before {SETTLE_S:g} s")
    return window


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, required=True, help="a worktree of the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=25.0, help="each run of the job")
    a = ap.parse_args()
    harness.need_root("agent_ab")
    rec = Record()
    trees = harness.trees("agent_ab", a.old)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-agent-ab-"))
    fx = harness.build_fixtures(tmp / "fx")
    sys.path.insert(0, str(REPO / "tests"))
    from test_nvml import HEALTHY, gpu, script  # the healthy test GPU bench/targets/diagnose.py uses

    (tmp / "nvml.script").write_text(script(count=1, driver="580.0", **gpu(0, uuid="GPU-bench", **HEALTHY)))
    harness.idle_pcie_link(tmp / "pcie")
    print(f"machine: {harness.describe()}; job {a.seconds:g} s")
    shares: dict[str, list[float]] = {"old": [], "new": []}
    for r, arm in harness.alternating(list(trees), a.rounds):
        w = one(trees[arm], fx, tmp, a.seconds)
        shares[arm].append(w.share)
        print(f"round {r + 1} {arm}: {w.share:.2%} over {w.wall_s:.2f} s ({w.busiest()})", flush=True)
    new, old_ = Spread.of(x * 100 for x in shares["new"]), Spread.of(x * 100 for x in shares["old"])
    ratio = harness.over(new.median, old_.median)
    print(f"median: {new.median:.2f}% against {old_.median:.2f}% of one core (ratio {ratio:.2f})")
    rec.add("memtrace run's CPU beside a training-like job", new.median, "% of a core", ".2f", Target("<=", 1), new)
    rec.add(
        "memtrace run's CPU beside a training-like job, the --old tree",
        old_.median,
        "% of a core",
        ".2f",
        spread=old_,
        note=str(a.old),
    )
    rec.add(
        "memtrace run's CPU, this tree over --old",
        ratio,
        "x",
        ".2f",
        spread=harness.ratio_spread(shares["new"], shares["old"]),
    )
    rec.write()


if __name__ == "__main__":
    main()
