"""What the agent's drain and fold threads cost while a job trickles events
(issue 16: the agent at most 1% of a core).

    sudo .venv/bin/python bench/targets/agent_cpu.py [--seconds S] [--rounds N]

A training-like job (tests/fixtures/trainjob.c through the test CUDA
libraries: a 30 ms step of copies, kernels and a wait, about 400 events a
second) is traced by an agent in this process, which drains and folds as
`memtrace run` does (no host sampling, no diagnosis: those are
bench/targets/host_sampling.py's). Three schedules, alternating in rounds, side by
side in one run:

  every drain   the previous design: a drain every 5 ms, and a fold of what
                it read after each one (here: the fold thread woken every
                5 ms)
  20 ms, 0.1 s  the design of 2026-11-25: drains put off, doubling up to
                20 ms, while a drain reads under 1/64 of the ring; a fold
                once 4096 events wait, or every 100 ms
  quiet ring    this one: drains put off the same way up to IDLE_STRETCH
                periods (40 ms), a fold once 4096 events wait or every
                FOLD_LATENCY_S (0.5 s)
  numpy reader  the same, the ring read by the numpy reader rather than
                memtrace's C reader (memtrace/bpf/ringbuf.py; the numpy
                one is what runs where the C helpers are not built)

Printed: this process's CPU (every thread) as a share of one core, per
round and the median, and the ratio.

    sudo .venv/bin/python bench/targets/agent_cpu.py --host [--seconds S] [--rounds N]

The agent as `memtrace run` has it by default instead: host sampling (the
C sampler at 100 Hz, the Python sample every 0.5 s), the live diagnosis on
its tick, the overhead budget. Two arms, alternating in rounds beside the
same job:

  timers        the drain thread on its own timer (a quiet ring: every
                40 ms) and the fold thread every FOLD_LATENCY_S (0.5 s),
                beside the diagnosis tick that drains and folds every 0.5 s
  guarded       the C sampler watches the events ring (Agent.guard_ring):
                quiet drains and folds every GUARDED_QUIET_S (1 s), a drain
                woken within a tick once 1/64 of the ring waits; the
                diagnosis tick does the rest

Printed per round and as medians: the process's CPU as a share of one core,
and each agent thread's.

    sudo .venv/bin/python bench/targets/agent_cpu.py --floor [--seconds S] [--rounds N]

The agent against its floor on this machine (issue 41): the agent as `--host`
has it (guarded) and, in the same windows beside the same traced job, a bare
sampler in C (bench/src/floor.c: a 100 Hz wake, one NIC dump and the NVML
reads the C sampler makes per tick, nothing else). Both read the test NVML
(re-run under its LD_LIBRARY_PATH), so both make the same NVML calls. Printed:
the agent's CPU over the floor's as a ratio, whole (fold, diagnosis, budget,
Python sampling and all), without the fold and the diagnosis (the CPU the
agent counts in them, Agent.fold_cpu_ns and LiveDiagnosis.cpu_ns: the fold
grows with the traced job's events, which the floor has none of), and its C
sampler's thread alone (the same work as the floor, in the agent's process).
Every CPU figure is read from the CPU clocks, to the ns (the threads'
breakdown printed beside them is /proc's, to the tick).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import CpuWindow, Reading, Record, Spread, Target


def copies(model: object) -> int:
    """Copy calls the model holds, every process."""
    procs = model.processes.values()  # type: ignore[attr-defined]
    return sum(c.calls for p in procs for c in p.copy_view().values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0, help="each measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host", action="store_true", help="the agent as `memtrace run` has it: host sampling, diagnosis")
    ap.add_argument("--floor", action="store_true", help="the agent against a bare C sampler, side by side")
    a = ap.parse_args()
    harness.need_root("agent_cpu")
    rec = Record("agent_cpu_floor" if a.floor else "agent_cpu_host" if a.host else "agent_cpu")
    if a.floor:
        floor(a.seconds, a.rounds, rec)
    elif a.host:
        host_arms(a.seconds, a.rounds, rec)
    else:
        schedules(a.seconds, a.rounds, rec)
    rec.write()


def schedules(seconds: float, rounds: int, rec: Record) -> None:
    """The drain and fold threads' schedules, the agent alone."""
    from memtrace.runtime import agent as agent_mod

    fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-agent-cpu-")))
    link = harness.idle_pcie_link(fx / "pcie", 2 << 30)
    arms = {
        "every drain": (1, agent_mod.DRAIN_INTERVAL_S, "c"),
        "20 ms, 0.1 s": (4, 0.1, "c"),
        "quiet ring": (agent_mod.IDLE_STRETCH, agent_mod.FOLD_LATENCY_S, "c"),
        "numpy reader": (agent_mod.IDLE_STRETCH, agent_mod.FOLD_LATENCY_S, "numpy"),
    }
    total = (seconds + 1.5) * len(arms) * rounds + 20
    job_cmd = [str(fx / "trainjob"), "-t", str(total), "-L", "3000000", "-w", "1500000", "-k", "1500"]
    job_cmd = harness.pinned([*job_cmd, "-c", "8", "-b", str(1 << 20)], harness.LAST_CPU)
    harness.pin_self({0})  # the agent on another CPU than the job's
    results: dict[str, list[float]] = {k: [] for k in arms}
    events: dict[str, list[float]] = {k: [] for k in arms}
    with harness.cuda_agent(only_traced=True) as agent:
        job = subprocess.Popen(job_cmd, env=dict(os.environ, FAKE_PCIE=str(link), WORKLOAD_TRUTH="/dev/null"))
        try:
            time.sleep(0.5)
            agent.cuda.trace_pid(job.pid)
            agent.scan([job.pid])
            print(f"machine: {harness.describe()}; {seconds:g} s a round")
            ring = agent.cuda.events
            c_reader = ring._c  # None where the C helpers are not built: then both rows read with numpy
            for r, name in harness.alternating(list(arms), rounds):
                stretch, fold, reader = arms[name]
                agent_mod.IDLE_STRETCH, agent_mod.FOLD_LATENCY_S = stretch, fold
                ring._c = c_reader if reader == "c" else None
                with agent.draining():
                    time.sleep(1.0)  # settle into the schedule
                    with agent.locked() as model:
                        before_events = copies(model)
                    c0, t0 = time.process_time(), time.monotonic()
                    time.sleep(seconds)
                    c1, t1 = time.process_time(), time.monotonic()
                    with agent.locked() as model:
                        after_events = copies(model)
                results[name].append((c1 - c0) / (t1 - t0))
                events[name].append((after_events - before_events) / (t1 - t0))
                print(
                    f"round {r + 1}  {name:12s} {results[name][-1]:6.2%} of one core"
                    f"  ({events[name][-1]:,.0f} copies/s folded)",
                    flush=True,
                )
        finally:
            job.kill()
            job.wait()
    med = {k: Spread.of(v) for k, v in results.items()}
    old, mid, new, nump = (med[k].median for k in arms)
    print(
        f"median: every drain {old:.2%}, 20 ms/0.1 s {mid:.2%}, quiet ring {new:.2%}, numpy reader {nump:.2%} "
        f"of one core; ratio {harness.over(new, old):.2f} to every drain, {harness.over(new, mid):.2f} to "
        f"20 ms/0.1 s, {harness.over(new, nump):.2f} to the numpy reader"
        + ("" if c_reader is not None else " (no C reader here: both numpy)")
    )
    for k in arms:
        rec.add(
            f"agent's drain and fold threads, {k}",
            med[k].median * 100,
            "% of a core",
            ".2f",
            spread=Spread.of(x * 100 for x in results[k]),
        )
    rec.add(
        "agent's drain and fold threads, quiet ring against every drain",
        harness.over(new, old),
        "x",
        ".2f",
        spread=harness.ratio_spread(results["quiet ring"], results["every drain"]),
    )


def host_job(fx: Path, seconds: float) -> list[str]:
    """A training-like job at about 400 steps a second (copies, a wait and CPU work each step),
    on the last CPU."""
    job = [str(fx / "trainjob"), "-t", str(seconds), "-k", "500", "-L", "200000", "-w", "100000"]
    return harness.pinned(job, harness.LAST_CPU)


def trace_job(agent: Any, signals: Any, pid: int, mode: str) -> Any:
    """Trace the job, start the host signals on it; the C sampler (exits where it does not run)."""
    time.sleep(0.5)
    agent.cuda.trace_pid(pid)
    agent.scan([pid])
    signals.start([pid])
    if signals._fast is None:
        sys.exit(f"agent_cpu {mode}: the C sampler does not run here (no NIC, or not built)")
    return signals._fast


def host_arms(seconds: float, rounds: int, rec: Record) -> None:
    """`--host`: the timers against the guarded ring, with host sampling and the diagnosis on."""
    fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-agent-cpu-")))
    arms = ("timers", "guarded")
    total = (seconds + 1.5) * len(arms) * rounds + 30
    job_cmd = host_job(fx, total)
    harness.pin_self({0})
    share: dict[str, list[float]] = {k: [] for k in arms}
    per_thread: dict[str, dict[str, list[float]]] = {k: {} for k in arms}
    rates: dict[str, list[float]] = {k: [] for k in arms}
    with harness.run_agent() as (agent, signals):
        job = subprocess.Popen(job_cmd, env=dict(os.environ, WORKLOAD_TRUTH="/dev/null"))
        try:
            fast = trace_job(agent, signals, job.pid, "--host")
            print(f"machine: {harness.describe()}; {seconds:g} s a round")
            with agent.draining(), signals.sampling():
                time.sleep(3.0)  # probes attached, calibrated, the budget settled
                for r, arm in harness.alternating(arms, rounds):
                    if arm == "guarded":
                        agent.guard_ring(fast)
                    else:
                        agent.unguard_ring()
                    time.sleep(1.5)  # settle into the arm's schedule
                    with agent.locked() as model:
                        before = copies(model)
                    first = Reading.of(os.getpid())
                    time.sleep(seconds)
                    w = CpuWindow.between(first, Reading.of(os.getpid()))
                    with agent.locked() as model:
                        after = copies(model)
                    share[arm].append(w.share)
                    rates[arm].append((after - before) / w.wall_s)
                    for name, s in w.shares().items():
                        per_thread[arm].setdefault(name, []).append(s)
                    print(
                        f"round {r + 1}  {arm:8s} {share[arm][-1]:6.2%} of one core "
                        f"({rates[arm][-1]:,.0f} copies/s folded; {w.busiest(at_least=0, only=True)})",
                        flush=True,
                    )
            signals.close()
        finally:
            job.kill()
            job.wait()
    med = {k: Spread.of(v) for k, v in share.items()}
    for arm in arms:
        threads = sorted(
            ((statistics.median(v), k) for k, v in per_thread[arm].items() if k.startswith("memtrace")), reverse=True
        )
        print(
            f"median  {arm:8s} {med[arm].median:6.2%}: "
            + ", ".join(f"{k.removeprefix('memtrace-')} {v:.2%}" for v, k in threads)
        )
    guarded, timers = med["guarded"].median, med["timers"].median
    rec.add(
        "agent CPU with host sampling and diagnosis, guarded",
        guarded * 100,
        "% of a core",
        ".2f",
        Target("<=", 1),
        Spread.of(x * 100 for x in share["guarded"]),
    )
    rec.add(
        "agent CPU with host sampling and diagnosis, timers",
        timers * 100,
        "% of a core",
        ".2f",
        spread=Spread.of(x * 100 for x in share["timers"]),
    )
    rec.add(
        "agent CPU with host sampling and diagnosis, guarded against timers",
        harness.over(guarded, timers),
        "x",
        ".2f",
        spread=harness.ratio_spread(share["guarded"], share["timers"]),
    )


def floor(seconds: float, rounds: int, rec: Record) -> None:
    """`--floor`: the agent (guarded, as run has it) and the bare sampler, measured over the same
    windows beside one traced job; the bench re-runs itself under the test NVML first."""
    fx = Path(os.environ.get("MEMTRACE_FLOOR_FIXTURES", ""))
    if not os.environ.get("MEMTRACE_FLOOR_FIXTURES"):
        sys.path.insert(0, str(harness.REPO / "tests"))
        from test_nvml import HEALTHY, gpu, script

        fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-agent-floor-")))
        nvml = fx / "nvml.script"
        nvml.write_text(
            script(count=1, driver="580.0", **gpu(0, uuid="GPU-floor", **{**HEALTHY, "pcie_link": fx / "pcie"}))
        )
        harness.idle_pcie_link(fx / "pcie", 2 << 30)
        env = dict(
            os.environ,
            MEMTRACE_FLOOR_FIXTURES=str(fx),
            LD_LIBRARY_PATH=str(fx / "nvml"),
            FAKE_NVML_SCRIPT=str(nvml),
        )
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    exe = harness.build_c("floor.c", fx / "floor", ["-Wall"], ["-ldl"])
    total = (seconds + 1.0) * rounds + 40
    job_cmd = host_job(fx, total)
    harness.pin_self({0})
    parts = ("agent", "sampler", "floor", "fold", "diagnosis", "sample", "events", "folds")
    got: dict[str, list[float]] = {k: [] for k in parts}
    with pipeline() as pipe:
        agent, signals, diagnosis = pipe.agent, pipe.host, pipe.diagnosis
        assert signals is not None and diagnosis is not None
        job = subprocess.Popen(job_cmd, env=dict(os.environ, WORKLOAD_TRUTH="/dev/null", FAKE_PCIE=str(fx / "pcie")))
        bare = subprocess.Popen(
            ["taskset", "-c", "0", str(exe), str(total), str(fx / "nvml" / "libnvidia-ml.so.1")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            fast = trace_job(agent, signals, job.pid, "--floor")
            gpus = len(signals.book.gpus)
            print(f"machine: {harness.describe()}; {seconds:g} s a round; GPUs the agent sees: {gpus} (test NVML)")
            with agent.draining(), signals.sampling():
                agent.guard_ring(fast)
                time.sleep(3.0)  # probes attached, calibrated, the budget settled
                sampler = sampler_clock()
                for r in range(rounds):
                    c0 = cpu_now(bare.pid, sampler, agent, diagnosis, signals)
                    with agent.locked() as model:
                        before, folds0 = model.events, agent.folds
                    a0 = Reading.of(os.getpid())
                    time.sleep(seconds)
                    a = CpuWindow.between(a0, Reading.of(os.getpid()))
                    with agent.locked() as model:
                        after, folds1 = model.events, agent.folds
                    c1 = cpu_now(bare.pid, sampler, agent, diagnosis, signals)
                    for k, v0, v1 in zip(parts[:-2], c0[1:], c1[1:], strict=True):
                        got[k].append((v1 - v0) / 1e9 / (c1[0] - c0[0]))
                    got["events"].append((after - before) / (c1[0] - c0[0]))
                    got["folds"].append((folds1 - folds0) / (c1[0] - c0[0]))
                    print(
                        f"round {r + 1}  agent {got['agent'][-1]:6.2%}  its C sampler {got['sampler'][-1]:6.2%}  "
                        f"floor {got['floor'][-1]:6.2%} of one core; of the agent: fold {got['fold'][-1]:.2%} "
                        f"({got['events'][-1]:,.0f} events/s in {got['folds'][-1]:.1f} folds/s), "
                        f"diagnosis {got['diagnosis'][-1]:.2%}, host samples {got['sample'][-1]:.2%}; "
                        f"its threads: {a.busiest(at_least=0)}",
                        flush=True,
                    )
            signals.close()
        finally:
            job.kill()
            job.wait()
            bare.kill()
            bare.wait()
    bare_of = [a - f - d for a, f, d in zip(got["agent"], got["fold"], got["diagnosis"], strict=True)]
    ag, sa, fl, fo, di, sm, ba = (
        Spread.of(x).median
        for x in (got["agent"], got["sampler"], got["floor"], got["fold"], got["diagnosis"], got["sample"], bare_of)
    )
    print(
        f"median: agent {ag:.2%} ({ba:.2%} without the fold {fo:.2%} and the diagnosis {di:.2%}; "
        f"host samples {sm:.2%}), its C sampler {sa:.2%}, the bare sampler {fl:.2%} of one core; "
        f"agent {harness.over(ag, fl):.2f}x the floor, {harness.over(ba, fl):.2f}x without the fold and the "
        f"diagnosis, its sampler {harness.over(sa, fl):.2f}x"
    )
    rec.add(
        "bare sampler (100 Hz: wake, NIC dump, NVML reads)",
        fl * 100,
        "% of a core",
        ".2f",
        spread=Spread.of(x * 100 for x in got["floor"]),
    )
    rec.add(
        "agent CPU over the bare sampler's floor",
        harness.over(ag, fl),
        "x",
        ".2f",
        Target("<=", 1.3),
        harness.ratio_spread(got["agent"], got["floor"]),
    )
    rec.add(
        "agent CPU over the bare sampler's floor, without the fold and the diagnosis",
        harness.over(ba, fl),
        "x",
        ".2f",
        Target("<=", 1.3),
        harness.ratio_spread(bare_of, got["floor"]),
    )
    rec.add(
        "agent's C sampler thread over the bare sampler's floor",
        harness.over(sa, fl),
        "x",
        ".2f",
        spread=harness.ratio_spread(got["sampler"], got["floor"]),
    )
    rec.add(
        "agent's fold beside the floor (CUDA events into the model)",
        fo * 100,
        "% of a core",
        ".2f",
        spread=Spread.of(x * 100 for x in got["fold"]),
        note=f"{Spread.of(got['events']).median:,.0f} events/s folded",
    )
    per_fold = [f / n * 1e3 for f, n in zip(got["fold"], got["folds"], strict=True) if n > 0]
    if per_fold:  # a fold's cost is mostly fixed: the CPU a fold takes, and how often the agent folds
        rec.add(
            "agent's fold, CPU per fold",
            Spread.of(per_fold).median,
            "ms",
            ".2f",
            spread=Spread.of(per_fold),
            note=f"{Spread.of(got['folds']).median:.1f} folds/s",
        )
    rec.add(
        "agent's live diagnosis beside the floor",
        di * 100,
        "% of a core",
        ".2f",
        spread=Spread.of(x * 100 for x in got["diagnosis"]),
    )


@contextlib.contextmanager
def pipeline() -> Iterator[Any]:
    """The agent as harness.run_agent has it (`memtrace run`'s defaults), as its Pipeline: the
    live diagnosis too, whose CPU is counted apart."""
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions

    opts = PipelineOptions(
        cuda=Options(only_traced=True, hold_nccl=True),
        host=HostOptions(interval_s=0.5),
        budget=0.01,
        from_exec=True,
    )
    with Pipeline(opts) as pipe:
        yield pipe


def sampler_clock() -> int:
    """The CPU clock of this process's C sampler thread (memtrace-fast): read to the ns, not the tick."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "memtrace-fast":
                return thread_clock(int(tid))
    sys.exit("agent_cpu --floor: no memtrace-fast thread")


def thread_clock(tid: int) -> int:
    """A thread's CPU clock (of this process), as clock_getcpuclockid would give it."""
    return (~tid << 3) | 6  # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD


def process_clock(pid: int) -> int:
    """A process's CPU clock, every thread's."""
    return (~pid << 3) | 2  # CPUCLOCK_SCHED


def cpu_now(bare: int, sampler: int, agent: Any, diagnosis: Any, signals: Any) -> tuple[float, ...]:
    """The time now and the CPU ns so far of: this process (the agent), its C sampler, the bare
    sampler, the agent's folds, its diagnosis, its host samples."""
    return (
        time.monotonic(),
        time.process_time_ns(),
        time.clock_gettime_ns(sampler),
        time.clock_gettime_ns(process_clock(bare)),
        agent.fold_cpu_ns,
        diagnosis.cpu_ns,
        signals.sample_cpu_ns,
    )


if __name__ == "__main__":
    main()
