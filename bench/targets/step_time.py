"""Step time with memtrace tracing against without (issue 6, target 5).

    sudo .venv/bin/python bench/targets/step_time.py [--rounds 5] [--steps 400]
        on the GPU machine: examples/torch_train.py (CNN, DataLoader, AdamW)
    sudo .venv/bin/python bench/targets/step_time.py --simulate [--rounds 5]
        anywhere: bench/src/trainstep.c, a step's calls through the test libcuda

Rounds alternate: the workload alone (A), then the same workload while a
host-wide agent (as `memtrace push` runs it) traces it (B). Each run prints
its median step time; the medians of A and B over the rounds, their ratio,
and the time memtrace adds per step and per intercepted call are printed.
B also prints what the agent saw, so a run that traced nothing cannot pass
for one with no overhead.

--simulate is not the target: it has no GPU. Its step is one step of the
recorded PyTorch loop's calls (two copies in, LAUNCHES launches, a copy out,
a synchronize), each launch after CPU_US of framework work and queueing
GPU_US on a simulated GPU. Two shapes are run: GPU-bound (the H100 loop of
the field notes: 2.59 ms a step, 41 launches) where the CPU waits for the GPU
and the probes' cost hides in that wait, and CPU-bound (no GPU work) where
every nanosecond of probe cost lands on the step: an upper bound.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Spread, Target


def median_step(cmd: list[str]) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True)
    for line in reversed(r.stderr.splitlines()):
        if line.startswith("{") and "median_step_s" in line:
            return float(json.loads(line)["median_step_s"])
    sys.exit(f"step_time: {cmd[0]} printed no step time (exit {r.returncode}): {r.stderr.strip()[-400:]}")


def traced(cmd: list[str]) -> tuple[float, int, int]:
    """The workload's median step with the agent tracing; and the events and launches the agent saw."""
    # Closing waits for the probes to go: the next untraced round must find none left behind.
    with harness.cuda_agent(detach_in_background=False) as agent:
        agent.scan()
        with harness.draining(agent, every_s=0.01):
            step = median_step(cmd)
        agent.poll()
        agent.sync_totals()
        return step, agent.model.events, sum(agent.model.launches.values())


def ab(cmd: list[str], rounds: int, calls_per_step: int, label: str, rec: Record, simulated: bool = False) -> None:
    a: list[float] = []
    b: list[float] = []
    seen = (0, 0)
    for _, arm in harness.alternating(("untraced", "traced"), rounds):
        if arm == "untraced":
            a.append(median_step(cmd))
            continue
        step, events, launches = traced(cmd)
        b.append(step)
        seen = (events, launches)
    ma, mb = Spread.of(a).median, Spread.of(b).median
    ratio = Spread.of(harness.ratios(b, a))
    added = (mb - ma) * 1e6
    print(
        f"{label:34} untraced {ma * 1e3:8.3f} ms  traced {mb * 1e3:8.3f} ms  traced/untraced {mb / ma:6.3f}  "
        f"added {added:7.1f} us/step = {added * 1e3 / calls_per_step:6.0f} ns per intercepted call"
    )
    print(
        f"{'':34} (agent saw {seen[0]:,} events and {seen[1]:,} launches in its last round; "
        f"rounds' ratios {ratio.range()})"
    )
    # Simulated, it stands in for target 5 without being it: no target held.
    rec.add(
        f"step time, {label}, traced/untraced",
        mb / ma,
        "x",
        ".3f",
        None if simulated else Target("<=", 1.01),
        ratio,
        note=f"{added:+.0f} us/step" + (" (simulated: no GPU)" if simulated else ""),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--simulate", action="store_true", help="no GPU: a step's calls through the test libcuda")
    ap.add_argument("--launches", type=int, default=41, help="--simulate: launches a step (the recorded loop's)")
    ap.add_argument("--cpu-us", type=float, default=10.0, help="--simulate: framework CPU time before each launch")
    ap.add_argument("--gpu-us", type=float, default=2590 / 41, help="--simulate: GPU time each launch queues")
    a = ap.parse_args()
    harness.need_root("step_time")
    rec = Record()
    print(f"machine: {harness.describe()}; {a.rounds} rounds, A/B")
    if not a.simulate:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'"],
            capture_output=True,
            text=True,
        )
        if probe.returncode:
            sys.exit(
                "step_time: needs PyTorch and a CUDA GPU (target 5 is measured on the GPU machine); "
                f"this machine: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'no torch'}. "
                "Use --simulate for the stand-in."
            )
        cmd = [sys.executable, str(REPO / "examples" / "torch_train.py"), "--steps", str(a.steps), "--pin"]
        # Calls a step intercepts, from the recorded loop: launches, 2 copies in, 1 out, 1 wait.
        ab(cmd, a.rounds, 41 + 4, "PyTorch CNN training loop", rec)
        rec.write()
        return
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-step-"))
    harness.build_fixtures(tmp)
    loop = harness.build_c("trainstep.c", tmp / "trainstep", libs=["-ldl"])
    base = [str(loop), str(tmp / "lib" / "libcuda.so.1"), str(a.steps), str(a.launches), str(a.cpu_us)]
    calls = a.launches + 4
    print("SIMULATED: no GPU; the test libcuda and a simulated GPU stand in (not target 5)")
    ab([*base, str(a.gpu_us)], a.rounds, calls, f"simulated, GPU-bound ({a.gpu_us:.0f} us GPU/launch)", rec, True)
    ab([*base, "0"], a.rounds, calls, "simulated, CPU-bound (no GPU work)", rec, True)
    rec.write()


if __name__ == "__main__":
    main()
