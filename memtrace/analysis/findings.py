"""Findings: what the numbers mean for a process, with the evidence and the fix.

Each finding is computed from the model alone, so `memtrace run`, `memtrace
top`, the JSON summary and the OTLP export all say the same thing.

A finding is a standing condition worth fixing, and must never cry wolf on
a healthy job:
- pageable_h2d: a share of the H2D bytes came from pageable memory;
- sync_wait: the process spends most of its time waiting for the GPU *and*
  the GPU sits idle waiting for the host between those waits (the step
  breakdown's gpu_idle_share). Waiting for a busy GPU is what a GPU-bound
  loop should do; a process without steps gives no such evidence and has
  no finding;
- overhead_budget_exceeded: memtrace's own probes cost the process more of
  its CPU time than the budget (default 1%), by the calibrated trap cost,
  even with its launch probes sampled (runtime/budget.py): its exact probes
  alone, or the time before the budget acted, or no way to sample them;
- device_memory_growth: the bytes in use keep rising after warm-up (most
  30-second windows higher than the one before, at least 1 GiB above the
  end of warm-up). A caching allocator that fills up and then holds its
  memory (PyTorch's never frees) is flat after warm-up, and a one-off step
  (an evaluation's buffers) is not sustained;
- gpu_memory_uncorrectable: a GPU the process runs on reported an
  uncorrectable memory error during the run (volatile ECC), holds rows
  remapped for uncorrectable errors, has a remapping pending or a failed
  one (NVML's row remapper, Ampere and later). Its data may be corrupt and
  the GPU needs a reset: drain the node. Computed from the host signals
  (`book`), when they were on; one finding per traced process on the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from memtrace.core import apis
from memtrace.core.abi import Direction
from memtrace.core.enums import HostMemory
from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import DEFAULT_BUDGET
from memtrace.core.units import human_bytes
from memtrace.model import Model, Process
from memtrace.model.host import GpuSeries, HostBook
from memtrace.model.process import TREND_WINDOW_NS

GiB = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    # pageable host-to-device copies
    pageable_share: float = 0.20  # of H2D bytes whose host memory is known
    pageable_min_bytes: int = 64 << 20
    # synchronisation waits: a problem only while the GPU idles for the host
    sync_share: float = 0.50  # of the wall time memtrace watched the process
    sync_min_wall_s: float = 1.0
    sync_gpu_idle_share: float = 0.25  # of the step time, the GPU waiting for the host
    # device memory growth: sustained, after warm-up
    growth_bytes: int = 1 * GiB
    growth_warmup_windows: int = 2  # the first minute after the first allocation: caches fill
    growth_min_windows: int = 6  # three minutes of windows after warm-up
    growth_rising_share: float = 0.6  # of the window-to-window changes after warm-up, rises
    # what memtrace's probes cost the process (core/overhead.py), once it has used this much CPU
    overhead_budget: float | None = DEFAULT_BUDGET  # a share of its CPU time; None: no budget
    overhead_min_cpu_s: float = 0.1


@dataclass
class Finding:
    code: str  # pageable_h2d, sync_wait, device_memory_growth
    key: ProcessKey
    process: str
    value: float  # the headline number: a share, or bytes
    summary: str  # the evidence, in words
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0  # the process's start, wall clock (0: unknown)

    @property
    def pid(self) -> int:
        return self.key.pid

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "pid": self.pid,
            "start_time_unix_nano": self.start_ns,
            "process": self.process,
            "value": self.value,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": self.evidence,
        }


def _duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.1f} s"


DEFAULT = Thresholds()


def _start(proc: Process | None) -> int:
    return proc.start_ns if proc else 0


def compute(
    model: Model, th: Thresholds = DEFAULT, now_ns: int | None = None, book: HostBook | None = None
) -> list[Finding]:
    """The findings of every process; `book`: the host signals' book, for the GPUs' memory health."""
    now_ns = now_ns if now_ns is not None else time.time_ns()
    out: list[Finding] = []
    # process -> host kind -> [bytes, bytes timed, their call time ns]. A call's
    # time is its transfer's where the call waits for it: a synchronous API,
    # or pageable memory (the driver stages it before the call returns). An
    # asynchronous copy from pinned memory returns once queued: its bytes over
    # its call time is no bandwidth (docs/design/evidence.md#pinned-async).
    h2d: dict[ProcessKey, dict[int, list[int]]] = {}
    for (key, api, d, host), st in model.copy_view().items():
        if d != Direction.H2D or host in (HostMemory.NONE, HostMemory.UNKNOWN):
            continue
        v = h2d.setdefault(key, {}).setdefault(host, [0, 0, 0])
        v[0] += st.bytes
        if host == HostMemory.PAGEABLE or apis.BY_ID[api].synchronous:
            v[1] += st.bytes
            v[2] += st.duration_ns
    for key, kinds in sorted(h2d.items()):
        total = sum(v[0] for v in kinds.values())
        pageable = kinds.get(HostMemory.PAGEABLE, [0, 0, 0])
        share = pageable[0] / total if total else 0.0
        if pageable[0] < th.pageable_min_bytes or share < th.pageable_share:
            continue
        proc = model.processes.get(key)
        ev: dict[str, Any] = {"h2d_bytes": total, "pageable_bytes": pageable[0]}
        msg = f"{share:.0%} of H2D bytes ({human_bytes(pageable[0])} of {human_bytes(total)}) came from pageable memory"
        if pageable[2]:
            bw = pageable[1] / (pageable[2] / 1e9)
            ev["pageable_bytes_per_second"] = bw
            msg += f" at {bw / 1e9:.1f} GB/s"
        pinned = kinds.get(HostMemory.PINNED)
        if pinned and pinned[1] and pinned[2]:
            pbw = pinned[1] / (pinned[2] / 1e9)
            ev["pinned_bytes_per_second"] = pbw
            msg += f"; pinned copies in the same process reach {pbw / 1e9:.1f} GB/s"
        out.append(
            Finding(
                "pageable_h2d",
                key,
                proc.name if proc else "",
                share,
                msg,
                "copy from page-locked memory: DataLoader(pin_memory=True) or tensor.pin_memory() in PyTorch, "
                "cudaHostAlloc/cudaHostRegister elsewhere; then the copy can be asynchronous",
                ev,
                _start(proc),
            )
        )
    waits: dict[ProcessKey, dict[str, list[int]]] = {}
    for (key, api), wst in model.sync_view().items():
        a = apis.BY_ID.get(api)
        kind = a.sync.value if a and a.sync else "other"
        w = waits.setdefault(key, {}).setdefault(kind, [0, 0])
        w[0] += wst.calls
        w[1] += wst.duration_ns
    for key, wait_kinds in sorted(waits.items()):
        proc = model.processes.get(key)
        if proc is None:
            continue
        wall = proc.wall_ns(now_ns)
        waited = sum(v[1] for v in wait_kinds.values())
        if wall < th.sync_min_wall_s * 1e9 or waited < th.sync_share * wall:
            continue
        tracker = model.step_trackers.get(key)
        steps = tracker.stats() if tracker is not None else None
        idle = steps.share(steps.gpu_idle_ns) if steps is not None else None
        if idle is None or idle < th.sync_gpu_idle_share:
            continue  # waiting for a busy GPU (or no evidence it idles): healthy
        share = waited / wall
        top = max(wait_kinds.items(), key=lambda kv: kv[1][1])
        out.append(
            Finding(
                "sync_wait",
                key,
                proc.name,
                share,
                f"the process spent {share:.0%} of its wall time ({waited / 1e9:.1f} s of {wall / 1e9:.1f} s) "
                f"waiting for the GPU, most in {top[0]} synchronisation ({top[1][0]:,} waits), "
                f"and the GPU then sat idle {idle:.0%} of each step waiting for the host",
                "let the CPU run ahead: drop per-step .item()/.cpu()/print of GPU values, copy with "
                "non_blocking=True, and synchronise once per step (or on an event) instead of per operation",
                {
                    "wait_seconds": waited / 1e9,
                    "wall_seconds": wall / 1e9,
                    "gpu_idle_share": idle,
                    "by_kind": {k: v[0] for k, v in wait_kinds.items()},
                },
                _start(proc),
            )
        )
    for key, proc in sorted(model.processes.items()):
        g = _growth(proc, th)
        if g is None:
            continue
        grew, span, rising = g
        mem = proc.memory
        out.append(
            Finding(
                "device_memory_growth",
                key,
                proc.name,
                float(grew),
                f"device memory grew by {human_bytes(grew)} over {_duration(span)} after warm-up, "
                f"rising in {rising:.0%} of its 30 s windows ({mem.outstanding:,} allocations outstanding, "
                f"{human_bytes(mem.in_use_bytes)} in use)",
                "look for GPU tensors kept alive across steps (a list of losses without .item(), "
                "a growing cache); torch.cuda.memory_snapshot() shows where they were allocated",
                {"grew_bytes": grew, "seconds": span, "rising_share": rising, "in_use_bytes": mem.in_use_bytes},
                _start(proc),
            )
        )
    if th.overhead_budget is not None:
        for key, proc in sorted(model.processes.items()):
            f = _over_budget(model, key, proc, th.overhead_budget, th.overhead_min_cpu_s)
            if f is not None:
                out.append(f)
    if book is not None:
        out.extend(memory_health(model, book.gpus.values()))
    return out


def _uncorrectable(g: GpuSeries) -> tuple[str, dict[str, Any]] | None:
    """What says this GPU's memory is no longer to be trusted, in words, and the evidence; None: nothing."""
    ecc = g.delta("ecc_uncorrected_volatile")
    rows = g.last.remapped_rows if g.last is not None else None
    said: list[str] = []
    if ecc:
        said.append(f"{ecc:,} uncorrectable ECC error{'s' if ecc > 1 else ''} during the run")
    if rows is not None and rows.uncorrectable:
        said.append(
            f"{rows.uncorrectable:,} row{'s' if rows.uncorrectable > 1 else ''} remapped for uncorrectable errors"
        )
    if rows is not None and rows.pending:
        said.append("a row remapping pending until the GPU is reset")
    if rows is not None and rows.failed:
        said.append("a row remapping that failed (no spare rows left)")
    if not said:
        return None
    evidence: dict[str, Any] = {"gpu_index": g.index, "gpu_uuid": g.uuid, "ecc_uncorrected": ecc}
    if rows is not None:
        evidence.update(remapped_uncorrectable=rows.uncorrectable, remap_pending=rows.pending, remap_failed=rows.failed)
    return f"GPU {g.index} ({g.uuid}) has {', '.join(said)}", evidence


def memory_health(model: Model, gpus: Any) -> list[Finding]:
    """gpu_memory_uncorrectable: for each traced process on a GPU whose memory reported an
    uncorrectable error (`gpus`: the host book's GpuSeries)."""
    out: list[Finding] = []
    by_pid = {key.pid: (key, proc) for key, proc in model.processes.items()}
    for g in sorted(gpus, key=lambda g: g.index):
        bad = _uncorrectable(g)
        if bad is None:
            continue
        summary, evidence = bad
        failed = bool(evidence.get("remap_failed"))
        fix = (
            "drain the node: stop scheduling on it and move its jobs off (checkpoint and restart elsewhere), "
            "then reset the GPU (nvidia-smi -r, or reboot) so the remapping takes effect"
            + ("; a failed remapping means the GPU is out of spare rows: replace it" if failed else "")
        )
        for pid in sorted(g.processes):
            found = by_pid.get(pid)
            if found is None:
                continue
            key, proc = found
            value = float(evidence["ecc_uncorrected"] or 0) + float(evidence.get("remapped_uncorrectable") or 0)
            out.append(Finding("gpu_memory_uncorrectable", key, proc.name, value, summary, fix, evidence, _start(proc)))
    return out


def _over_budget(model: Model, key: ProcessKey, proc: Process, budget: float, min_cpu_s: float) -> Finding | None:
    o = model.overhead(key)
    if o is None or not o.over(budget) or (o.cpu_seconds or 0.0) < min_cpu_s:
        return None
    share = o.share or 0.0  # known: it is over
    launch_share = o.launch_traps * o.cost.entry_seconds / o.traps_seconds if o.traps_seconds else 0.0
    exact_share = (o.traps_seconds - o.launch_traps * o.cost.entry_seconds) / o.cpu_seconds if o.cpu_seconds else 0.0
    fix = "raise the budget (--overhead-budget, MEMTRACE_OVERHEAD_BUDGET) if this cost is acceptable"
    if proc.launch_duty is not None:
        # The budget sampled its launches; what is left is the exact probes and the time before it acted.
        kept = (
            f"its launch probes were sampled (attached {proc.launch_duty:.1%} of the time at the end), but its "
            f"copies, memory calls and waits, never sampled, cost {exact_share:.1%} alone, and the budget acts "
            "after about 0.1 s of CPU"
        )
        if exact_share > budget:
            fix = (
                "fewer, larger copies and fewer waits cost less (a batch of copies as one, a wait per step "
                "rather than per call); or " + fix
            )
    else:
        kept = (
            "its launch probes were not sampled (the kernel has no multi-uprobe links, or the process used "
            "little CPU before the budget could act)"
        )
        if launch_share >= 0.5:
            fix = (
                "most of it is one trap per kernel launch: fewer, larger launches cost less (CUDA graphs replay "
                "many launches as one: torch.cuda.graphs, jax.jit); or " + fix
            )
    return Finding(
        "overhead_budget_exceeded",
        key,
        proc.name,
        share,
        f"memtrace's probes cost this process about {share:.1%} of its CPU time "
        f"({o.traps:,} traps, {launch_share:.0%} of the cost from launches, at "
        f"{o.cost.entry_seconds * 1e6:.1f} us a trap{'' if o.cost.calibrated else ', not calibrated'}), "
        f"over the {budget:.1%} budget: {kept}",
        fix,
        {
            "share_of_cpu": share,
            "budget": budget,
            "traps": o.traps,
            "launch_traps": o.launch_traps,
            "launch_duty": proc.launch_duty,
            "exact_share_of_cpu": exact_share,
            "estimated_seconds": o.seconds,
            "cpu_seconds": o.cpu_seconds,
        },
        _start(proc),
    )


def _growth(proc: Process, th: Thresholds) -> tuple[int, float, float] | None:
    """(bytes grown, seconds, share of rising windows) after warm-up, if the
    growth is sustained; None otherwise."""
    trend = list(proc.memory.trend)
    if not trend:
        return None
    first = trend[0][0]
    after = [(w, v) for w, v in trend if w >= first + th.growth_warmup_windows]
    # The level at the end of warm-up: the last window before it (or its first after).
    before = [v for w, v in trend if w < first + th.growth_warmup_windows]
    base = before[-1] if before else after[0][1] if after else 0
    if not after or after[-1][0] - (first + th.growth_warmup_windows) + 1 < th.growth_min_windows:
        return None
    grew = after[-1][1] - base
    if grew < th.growth_bytes:
        return None
    # Window-to-window changes over the windows spanned (one without calls is flat).
    steps = after[-1][0] - (first + th.growth_warmup_windows) + 1
    rises = 0
    prev = base
    for _, v in after:
        rises += v > prev
        prev = v
    rising = rises / steps
    if rising < th.growth_rising_share:
        return None
    span = steps * TREND_WINDOW_NS / 1e9
    return grew, span, rising
