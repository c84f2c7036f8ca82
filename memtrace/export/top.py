"""`memtrace top`'s view: one row per CUDA process, rates between refreshes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.analysis.findings import Thresholds, compute
from memtrace.core.abi import Direction
from memtrace.core.cpu import CpuStats
from memtrace.core.enums import HostMemory
from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import DEFAULT_BUDGET
from memtrace.core.units import human_bytes
from memtrace.export.columns import SplitTable
from memtrace.export.text import pageable_share
from memtrace.model import Model
from memtrace.model.host import HostBook


@dataclass
class _Row:
    calls: int = 0
    bytes: int = 0
    errors: int = 0
    h2d: int = 0
    d2h: int = 0
    d2d: int = 0
    pageable_h2d: int = 0
    unknown_h2d: int = 0  # host memory of a kind not known (attached to a running process)


def _pageable(p: _Row) -> str:
    """The pageable share of its H2D bytes: unknown, not 0%, where its memory's kind is."""
    if not p.h2d:
        return ""
    share = pageable_share(p.pageable_h2d, p.unknown_h2d, p.h2d)
    return share if share == "unknown" else f"{share} h2d"


_BY_DIRECTION = {Direction.H2D: "h2d", Direction.D2H: "d2h", Direction.D2D: "d2d"}


class TopView:
    """Renders the model; remembers the last refresh's totals for rates."""

    # Eight columns fit 80: the rest with --detail.
    COLUMNS = ("pid", "process", "copies/s", "bytes/s", "bytes", "pageable", "dev mem", "sync")
    DETAIL = ("h2d", "d2h", "d2d", "errors", "launches/s", "step p50", "gpu idle", "runq p99", "overhead")

    def __init__(self, interval: float, detail: bool = False, overhead_budget: float | None = DEFAULT_BUDGET) -> None:
        self.interval = interval
        self.detail = detail
        self.thresholds = Thresholds(overhead_budget=overhead_budget)
        self._prev: dict[ProcessKey, tuple[int, int, int]] = {}
        self._prev_cpu: dict[ProcessKey, CpuStats] = {}

    def _runq_p99(self, host: HostBook | None, key: ProcessKey) -> str:
        """Run-queue latency p99 since the previous refresh (the host signals' CPU sensor)."""
        cur = host.cpu.get(key) if host is not None else None
        if cur is None:
            return ""
        prev = self._prev_cpu.get(key)
        self._prev_cpu[key] = cur
        window = cur.since(prev) if prev is not None else cur
        p99 = window.runq_quantile_us(0.99)
        return "" if p99 is None else f"{p99 / 1e3:.2g}ms"

    def _overhead(self, model: Model, key: ProcessKey) -> str:
        """What the probes cost the process, a share of its CPU time; `!` over the budget."""
        o = model.overhead(key)
        if o is None or o.share is None:
            return ""
        return f"{o.share:.1%}" + ("!" if o.over(self.thresholds.overhead_budget) else "")

    def render(
        self, model: Model, dt: float, host: HostBook | None = None, diagnoses: Sequence[Diagnosis] = ()
    ) -> Group:
        """The table; `host`: the host signals' readings (CPU waits), taken
        under their lock by the caller; `diagnoses`: the live diagnosis's
        (the last few are shown under the table)."""
        # --detail on a narrow screen: the columns in groups, each led by pid and process.
        t = SplitTable(
            (*self.COLUMNS, *(self.DETAIL if self.detail else ())),
            2,
            left=("process",),
            title=f"memtrace top: CUDA processes (every {self.interval:g}s; q quits)",
        )
        per: dict[ProcessKey, _Row] = {}
        for (key, _api, d, memory), st in model.copy_view().items():
            p = per.setdefault(key, _Row())
            p.calls += st.calls
            p.bytes += st.bytes
            p.errors += st.errors
            field = _BY_DIRECTION.get(d)
            if field is not None:
                setattr(p, field, getattr(p, field) + st.bytes)
            if d == Direction.H2D and memory == HostMemory.PAGEABLE:
                p.pageable_h2d += st.bytes
            elif d == Direction.H2D and memory == HostMemory.UNKNOWN:
                p.unknown_h2d += st.bytes
        waits: dict[ProcessKey, int] = {}
        for (key, _api), sst in model.sync_view().items():
            waits[key] = waits.get(key, 0) + sst.duration_ns
        launches: dict[ProcessKey, int] = {}
        for (key, _api), n in model.launches.items():
            launches[key] = launches.get(key, 0) + n
        empty = _Row()
        shown = set(per) | set(waits) | set(launches)
        shown |= {key for key, pr in model.processes.items() if pr.memory.allocations}
        for key in sorted(shown, key=lambda q: (-per.get(q, empty).bytes, q)):
            p = per.get(key, empty)
            pc, pb, pl = self._prev.get(key, (p.calls, p.bytes, launches.get(key, 0)))
            proc = model.processes.get(key)
            name = (proc.name if proc else "") + (" (exited)" if proc and proc.exited else "")
            wall = proc.wall_ns() if proc else 0
            cells = [
                str(key.pid),
                name,
                f"{(p.calls - pc) / dt:,.0f}",
                human_bytes((p.bytes - pb) / dt) + "/s",
                human_bytes(p.bytes),
                _pageable(p),
                human_bytes(proc.memory.in_use_bytes) if proc and proc.memory.allocations else "",
                f"{waits[key] / wall:.0%}" if key in waits and wall else "",
            ]
            if self.detail:
                cells += [
                    human_bytes(p.h2d),
                    human_bytes(p.d2h),
                    human_bytes(p.d2d),
                    str(p.errors) if p.errors else "",
                    # "~": the budget samples its launch probes, the rate is extrapolated
                    f"{'~' if proc and proc.launch_duty is not None else ''}{(launches.get(key, 0) - pl) / dt:,.0f}"
                    if key in launches
                    else "",
                ]
                tracker = model.step_trackers.get(key)
                steps = tracker.stats() if tracker is not None else None
                p50 = steps.durations.quantile(0.5) if steps is not None else None
                cells += [
                    "" if p50 is None else f"{p50 * 1e3:.3g}ms",
                    "" if steps is None else f"{steps.share(steps.gpu_idle_ns):.0%}",
                    self._runq_p99(host, key),
                    self._overhead(model, key),
                ]
            t.add_row(*cells)
            self._prev[key] = (p.calls, p.bytes, launches.get(key, 0))
        for gone in self._prev_cpu.keys() - shown:  # the CPU readings of processes no longer shown
            del self._prev_cpu[gone]
        notes = [
            f"[bold red]diagnosis[/bold red] ({d.process or d.key.pid} {d.key.pid}): {d.symptom}; "
            f"cause [bold]{d.cause}[/bold]. [bold]fix[/bold]: {d.fix}"
            for d in list(diagnoses)[-3:]
        ]
        notes += [
            f"[bold yellow]finding[/bold yellow] ({f.process or f.pid}): {f.summary}. [bold]fix[/bold]: {f.fix}"
            for f in compute(model, self.thresholds)
        ]
        return Group(t, *notes)
