"""CPU time of a traced process as the CPU sensor (bpf/sched.bpf.c) measures
it: run-queue latency and off-CPU time as log2 histograms, on-CPU time,
context switches and who took the CPU. Plain values: the sensor makes them,
the model and the report read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from memtrace.core.ids import ProcessKey


def slot_bounds_us(slot: int) -> tuple[int, int]:
    """[low, high) in microseconds of a histogram slot (the last one is open)."""
    return (0 if slot == 0 else 1 << slot), (1 << (slot + 1))


def quantile_us(hist: tuple[int, ...], q: float) -> float | None:
    """The q-quantile of a log2 histogram, interpolated inside its slot; None if empty."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for slot, n in enumerate(hist):
        if n and seen + n >= rank:
            lo, hi = slot_bounds_us(slot)
            return lo + (hi - lo) * (rank - seen) / n
        seen += n
    lo, hi = slot_bounds_us(len(hist) - 1)
    return float(hi)


@dataclass(frozen=True)
class Preemptor:
    """Who took the CPU from a traced process: one cgroup (v2 id = its kernfs inode)."""

    cgroup_id: int  # 0: nobody, the CPU went idle (the process's own quota throttled it)
    count: int  # involuntary switches of the traced process in its favour
    wait_ns: int  # run-queue wait of the traced threads that followed
    pid: int  # the cgroup's process waited on longest (a vote weighted by time: bpf/sched.h); 0: the idle task
    comm: str


@dataclass(frozen=True)
class CpuStats:
    """Where one traced process's threads spent their time since tracing began."""

    pid: int
    start_ns: int  # the process's start (ProcessKey): a reused pid is another process
    runq_hist: tuple[int, ...]  # run-queue latency, log2 slots of microseconds
    offcpu_hist: tuple[int, ...]  # blocked time, log2 slots of microseconds
    runq_ns: int
    offcpu_ns: int
    oncpu_ns: int
    voluntary: int
    involuntary: int
    cgroup_id: int  # the process's own cgroup (v2), as last seen at a switch
    preemptors: tuple[Preemptor, ...] = field(default=())
    # Its execs and cgroup moves since tracing began: when either grows, who
    # it is (command, executable, cgroup) is read again.
    execs: int = 0
    moves: int = 0
    # Time its threads held a CPU without running: the hypervisor's steal,
    # which the kernel leaves out of their runtime. With it, on-CPU, off-CPU
    # and run-queue time add up to the wall clock.
    stolen_ns: int = 0

    @property
    def key(self) -> ProcessKey:
        return ProcessKey(self.pid, self.start_ns)

    def runq_quantile_us(self, q: float) -> float | None:
        return quantile_us(self.runq_hist, q)

    def offcpu_quantile_us(self, q: float) -> float | None:
        return quantile_us(self.offcpu_hist, q)

    def since(self, before: CpuStats) -> CpuStats:
        """What happened between an earlier reading and this one (a sampling window)."""
        old = {p.cgroup_id: p for p in before.preemptors}
        pre = []
        for p in self.preemptors:
            o = old.get(p.cgroup_id)
            count = p.count - (o.count if o else 0)
            wait = p.wait_ns - (o.wait_ns if o else 0)
            if count or wait:
                pre.append(Preemptor(p.cgroup_id, count, wait, p.pid, p.comm))
        return CpuStats(
            pid=self.pid,
            start_ns=self.start_ns,
            runq_hist=tuple(a - b for a, b in zip(self.runq_hist, before.runq_hist, strict=True)),
            offcpu_hist=tuple(a - b for a, b in zip(self.offcpu_hist, before.offcpu_hist, strict=True)),
            runq_ns=self.runq_ns - before.runq_ns,
            offcpu_ns=self.offcpu_ns - before.offcpu_ns,
            oncpu_ns=self.oncpu_ns - before.oncpu_ns,
            voluntary=self.voluntary - before.voluntary,
            involuntary=self.involuntary - before.involuntary,
            cgroup_id=self.cgroup_id,
            preemptors=tuple(sorted(pre, key=lambda p: (-p.wait_ns, -p.count))),
            execs=self.execs - before.execs,
            moves=self.moves - before.moves,
            stolen_ns=self.stolen_ns - before.stolen_ns,
        )
