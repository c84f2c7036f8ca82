"""One job's steps with the host-wide agent on and off, in turns (issue 18:
a job at most 1% slower under memtrace with the default budget).

    sudo .venv/bin/python bench/targets/agent_onoff.py [--seconds 150] [--period 10]
    sudo python3 bench/targets/agent_onoff.py --times T.json -- CMD...   (a job of your own)

A/B runs of separate processes differ by more than the 1% sought
(docs/perf/notes.md), so the A/B is
made inside one process: the job runs throughout, and `memtrace push` (the
DaemonSet's agent, default budget, host sampling, diagnosis; pushing to a
closed loopback port, every push refused and counted) is started and
stopped in turns of --period seconds, off first and last. Steps are
assigned to the turn they ended in, leaving out --settle seconds after
each start and stop (attaching, calibrating, detaching). Printed: each on
turn's median step against the off turns beside it, and the median of
those ratios.

Default job: tests/fixtures/trainjob.c through the test CUDA libraries, a
step of 3 ms CPU (2 loading, 1 after the wait), four 64 KiB copies and
three 300 us kernels, pinned to CPU 1; the agent to CPU 0 (this VM has
two). Twice: through the libraries as the tests build them (-O2: their
launch and copy entries are single-stepped, the dear kind of trap), and
through the same built push-first (as every CUDA entry point is: emulated,
the cheap kind; bench/experiments/entry_cost.py).
--job launch: tests/fixtures/launchloop.c instead, 20 us of CPU work a
launch, a step of 100 launches and a 64-byte copy: the budget's case. A job of your own writes its
step end times to --times as JSON: "step_end_unix_nano" (CLOCK_REALTIME,
as examples/torch_steady.py does) or "step_end_ns" (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Record, Spread, Target


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def turns_of(a: argparse.Namespace, job_argv: list[str], env: dict[str, str], times: Path) -> list[float] | None:
    """Run the job with the agent on and off in turns; print what its steps did.
    Each on turn's median step over the off turns' beside it (None: the job failed)."""
    clock = time.time_ns if not times.name.endswith(".jsonl") else time.monotonic_ns
    agent_argv = [sys.executable, "-m", "memtrace", "push", "--endpoint", "http://127.0.0.1:9", "--interval", "5"]
    log = open(a.agent_log, "ab") if a.agent_log else subprocess.DEVNULL  # noqa: SIM115 - kept for the run
    job = subprocess.Popen(["taskset", "-c", a.job_cpu, *job_argv], env=env)
    t_end = time.monotonic() + a.seconds
    turns: list[tuple[int, int]] = []  # (started, stopped) of each on turn, in the job's clock
    time.sleep(a.period)
    while time.monotonic() + 2 * a.period < t_end and job.poll() is None:
        start = clock()
        agent = subprocess.Popen(["taskset", "-c", a.agent_cpu, *agent_argv], stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(a.period)
        agent.send_signal(signal.SIGINT)
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        turns.append((start, clock()))
        time.sleep(a.period)
    rc = job.wait()
    if rc != 0:
        print(f"the job failed (exit {rc})")
        return None
    doc = json.loads(times.read_text().splitlines()[-1])
    ends = sorted(doc.get("step_end_unix_nano") or doc["step_end_ns"])
    steps = [(e, (e - s) / 1e6) for s, e in zip(ends, ends[1:], strict=False)]
    settle = int(a.settle * 1e9)

    def within(lo: int, hi: int) -> list[float]:
        return [ms for e, ms in steps if lo + settle <= e <= hi]

    offs = [within(0 if i == 0 else turns[i - 1][1], turns[i][0]) for i in range(len(turns))]
    offs.append(within(turns[-1][1], ends[-1]) if turns else [])
    ratios = []
    print(f"{len(turns)} on turns of {a.period:.0f} s, {a.settle:.0f} s left out after each start and stop")
    for i, (lo, hi) in enumerate(turns):
        on = median_or_none(within(lo, hi))
        beside = [m for m in (median_or_none(offs[i]), median_or_none(offs[i + 1])) if m is not None]
        if on is None or not beside:
            continue
        off = statistics.mean(beside)
        ratios.append(on / off)
        print(f"  turn {i + 1}: on {on:.3f} ms, off beside it {off:.3f} ms, ratio {on / off:.4f}")
    if not ratios:
        print("no turn had steps on and off: give --seconds more time")
        return None
    all_on = [ms for lo, hi in turns for ms in within(lo, hi)]
    all_off = [ms for o in offs for ms in o]
    print(
        f"median of the turns' ratios {statistics.median(ratios):.4f} (range {min(ratios):.4f}-{max(ratios):.4f}); "
        f"all steps: on {statistics.median(all_on):.3f} ms (n={len(all_on)}), off {statistics.median(all_off):.3f} ms "
        f"(n={len(all_off)}), ratio {statistics.median(all_on) / statistics.median(all_off):.4f}"
    )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--period", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--times", type=Path, help="where a job of your own writes its step end times")
    ap.add_argument("--libs", choices=("both", "as-built", "pushfirst"), default="both", help="the default job's")
    ap.add_argument("--job", choices=("train", "launch"), default="train", help="the default job")
    ap.add_argument("--job-cpu", default="1")
    ap.add_argument("--agent-cpu", default="0")
    ap.add_argument("--agent-log", type=Path, help="the agent's stderr (default: discarded)")
    a, job_argv = ap.parse_known_args()
    if job_argv and job_argv[0] == "--":
        job_argv = job_argv[1:]
    if bool(job_argv) != bool(a.times):
        ap.error("a job of your own needs --times, and --times a job")
    harness.need_root("agent_onoff", "memtrace push loads BPF programs")
    rec = Record()
    print(f"machine: {harness.describe()}")
    if job_argv:
        print(f"job: {' '.join(job_argv)}")
        rc = record(rec, "a job of your own", turns_of(a, job_argv, dict(os.environ), a.times))
        if rec.figures:
            rec.write()
        return rc
    tmp = Path(tempfile.mkdtemp(prefix="onoff-"))
    fx = harness.build_fixtures(tmp / "fx")
    rc = 0
    for libs in ("as-built", "pushfirst") if a.libs == "both" else (a.libs,):
        times = tmp / f"{libs}.jsonl"
        env = dict(os.environ, WORKLOAD_TRUTH=str(times))
        libdir = fx / ("pushfirst" if libs == "pushfirst" else "lib")
        if a.job == "train":
            iters = ["-L", str(harness.work_iterations(fx, 2.0)), "-w", str(harness.work_iterations(fx, 1.0))]
            job = [str(fx / "trainjob"), "-t", str(a.seconds), "-c", "4", "-b", "65536", "-k", "300", *iters]
            env["LD_LIBRARY_PATH"] = str(libdir)  # before trainjob's RUNPATH
        else:  # 20 us of work a launch, a step of 100 launches and a copy, for --seconds
            job = [str(fx / "launchloop"), str(libdir / "libcuda.so.1"), str(int(a.seconds / 20e-6))]
            job += [str(harness.work_iterations(fx, 0.02)), "100"]
        what = "entries a push, as CUDA's" if libs == "pushfirst" else "launch and copy entries single-stepped"
        print(f"job: {Path(job[0]).name} {' '.join(job[2:])}, test libraries {libs} ({what})")
        rc |= record(rec, f"{a.job} job, test libraries {libs}", turns_of(a, job, env, times))
    if rec.figures:
        rec.write()
    return rc


def record(rec: Record, what: str, ratios: list[float] | None) -> int:
    """The job's turns as a figure (the median of the turns' ratios); 1 where there are none."""
    if ratios is None:
        return 1
    r = Spread.of(ratios)
    rec.add(f"job's step with memtrace push on against off, {what}", r.median, "x", ".4f", Target("<=", 1.01), r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
