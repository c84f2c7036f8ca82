"""The summary users read: the JSON document (export/schema.py: its
classes, and docs/json.md) and a rich table built from it."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typing_extensions import TypedDict

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.analysis.findings import DEFAULT, Finding, Thresholds, compute
from memtrace.core import apis
from memtrace.core.abi import BATCH_MAX, Direction, Layer, Stat
from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import DEFAULT_BUDGET
from memtrace.core.units import human_bytes, human_seconds
from memtrace.export import schema
from memtrace.export.callsites import name_the_lines, print_call_sites
from memtrace.export.columns import SplitTable
from memtrace.export.schema import SCHEMA_VERSION
from memtrace.export.text import pageable_share
from memtrace.model import Model, describe
from memtrace.model.host import HostBook
from memtrace.model.memory import PodDeviceMemory, ProcessDeviceMemory, device_memory_views, nvml_used_by_pid
from memtrace.model.steps import StepStats

__all__ = ["SCHEMA_VERSION", "Library", "print_table", "say", "summary"]


class Library(Protocol):
    """A file memtrace attached probes to, as the report names it."""

    @property
    def name(self) -> str: ...
    @property
    def layer(self) -> Layer: ...
    @property
    def symbols(self) -> dict[str, int]: ...
    @property
    def link_count(self) -> int: ...
    @property
    def simulated(self) -> bool: ...


class _Stacks(TypedDict, total=False):
    """The summary's `stacks`, where it has them, in their place among its keys."""

    stacks: list[schema.CallSite]


class _Command(TypedDict, total=False):
    """The summary's `command`, where it has one (last)."""

    command: schema.Command


def summary(
    model: Model,
    stats: dict[Stat, int],
    libraries: Sequence[Library],
    command: schema.Command | None = None,
    malformed: int = 0,
    thresholds: Thresholds = DEFAULT,
    drain: schema.Drain | None = None,
    host: schema.Host | None = None,
    collectives: list[schema.CollectiveRow] | None = None,
    diagnoses: Sequence[Diagnosis] | None = None,
    overhead_budget: float | None = DEFAULT_BUDGET,
    stacks: list[schema.CallSite] | None = None,
    stack_counts: schema.StackCounts | None = None,
    book: HostBook | None = None,
) -> schema.Summary:
    """The run's summary; `drain`: the agent's drain statistics, when it has them;
    `host` and `collectives`: the host signals' sections (runtime/hostsignals.py), None when they were off;
    `overhead_budget`: the share of a process's CPU time its probes may cost (replaces the thresholds' own);
    `stacks`: the call sites (export/callsites.py) and `stack_counts` what became of the stacks asked for,
    None with stacks off; `book`: the host signals' book, for the findings about the GPUs' health."""
    thresholds = dataclasses.replace(thresholds, overhead_budget=overhead_budget)
    findings = [finding(f) for f in compute(model, thresholds, book=book)]
    if stacks:
        name_the_lines(findings, stacks)
    agent = schema.Agent(
        events=stats.get(Stat.EVENTS, 0),
        dropped=stats.get(Stat.DROPPED, 0),
        calls_without_event=sum(v[0] for v in model.lost.values()) + stats.get(Stat.TOTALS_FULL, 0),
        abandoned_calls=stats.get(Stat.ABANDONED, 0),
        untracked_calls=stats.get(Stat.INFLIGHT_FULL, 0)
        + stats.get(Stat.TOTALS_FULL, 0)
        + stats.get(Stat.COUNTS_FULL, 0),
        nested_driver_calls=stats.get(Stat.NESTED, 0),
        # Calls made inside a probed call of the same layer: the outer call's work, counted once as it.
        nested_same_layer_calls=stats.get(Stat.NESTED_SAME, 0),
        # Calls whose return was never seen (probes attached mid-call): not counted.
        unreturned_calls=stats.get(Stat.UNRETURNED, 0),
        # Batch copies with more copies than BPF reads: the bytes past the bound are missing.
        batch_truncated_calls=stats.get(Stat.BATCH_TRUNCATED, 0),
        # Copies of 3D batches to or from a CUDA array: counted, their bytes not known.
        batch_array_copies=stats.get(Stat.BATCH_ARRAY_COPIES, 0),
        launch_events=stats.get(Stat.LAUNCH_EVENTS, 0),
        launch_events_dropped=stats.get(Stat.LAUNCH_DROPPED, 0),
        holds=stats.get(Stat.HOLDS, 0),
        hold_missed=stats.get(Stat.HOLD_MISSED, 0),
        malformed_records=malformed,
        # NCCL events of a process that had made no CUDA call yet (not charged), and waits past the bound.
        collective_events_unmatched=model.collectives_unmatched,
        collective_waits_dropped=sum(a.dropped for a in model.collective_waits.values()),
        communicators_dropped=model.communicators.unmet_dropped,
        libraries=[
            schema.LibraryRow(
                path=a.name,
                layer=a.layer.label,
                probes=len(a.symbols),
                links=a.link_count,
                symbols=sorted(a.symbols),
                simulated=a.simulated,
            )
            for a in libraries
        ],
    )
    if drain is not None:
        agent["drain"] = drain
    if stack_counts is not None:
        agent["stacks"] = stack_counts
    copies, totals = memcpy(model)
    memory_views = device_memory_views(
        model.processes, nvml_used_by_pid(g.processes for g in book.gpus.values()) if book is not None else {}
    )
    sites: _Stacks = {} if stacks is None else {"stacks": stacks}
    cmd: _Command = {"command": command} if command else {}
    return schema.Summary(
        schema=SCHEMA_VERSION,
        processes=processes(model),
        # Traced through memtrace's test CUDA library: the calls and bytes are
        # the workload's, the durations (so GB/s) are not a GPU's.
        simulated=any(a.simulated for a in libraries),
        memcpy=copies,
        totals=totals,
        device_memory=device_memory(model, memory_views),
        pods=pods(memory_views[1]),
        synchronization=synchronization(model),
        launches=launches(model),
        overhead=overhead(model, thresholds.overhead_budget),
        steps=steps(model),
        collectives=collectives or [],
        host=host,
        findings=findings,
        diagnoses=[diagnosis(d) for d in diagnoses or ()],
        **sites,
        agent=agent,
        **cmd,
    )


JOB_PREFIX = "memtrace.job."


def job(attributes: dict[str, str | int]) -> schema.Job | None:
    """A process's job and rank from its resource attributes (sources/procfs.job_identity)."""
    j = {k[len(JOB_PREFIX) :]: v for k, v in attributes.items() if k.startswith(JOB_PREFIX)}
    if "launcher" not in j:
        return None
    out = schema.Job(launcher=str(j["launcher"]))
    if "id" in j:
        out["id"] = str(j["id"])
    rank, size, local = j.get("rank"), j.get("world_size"), j.get("local_rank")
    if isinstance(rank, int):
        out["rank"] = rank
    if isinstance(size, int):
        out["world_size"] = size
    if isinstance(local, int):
        out["local_rank"] = local
    if "id.source" in j:
        out["source"] = str(j["id.source"])
    return out


NCCL_PREFIX = "memtrace.nccl."


def nccl(attributes: dict[str, str | int]) -> schema.NcclIdentity | None:
    """A process's NCCL communicator from its resource attributes (model/communicators.py)."""
    comm = attributes.get(NCCL_PREFIX + "comm_id")
    if comm is None:
        return None
    out = schema.NcclIdentity(comm_id=str(comm))
    rank, nranks = attributes.get(NCCL_PREFIX + "rank"), attributes.get(NCCL_PREFIX + "nranks")
    if isinstance(rank, int):
        out["rank"] = rank
    if isinstance(nranks, int):
        out["nranks"] = nranks
    return out


def processes(model: Model) -> list[schema.ProcessRow]:
    out = []
    for key, p in sorted(model.processes.items()):
        cid, pod = p.attributes.get("container.id"), p.attributes.get("k8s.pod.uid")
        row = schema.ProcessRow(
            pid=key.pid,
            start_time_unix_nano=p.start_ns,
            process=p.name,
            executable=p.exe,
            container_id=str(cid) if cid is not None else None,
            pod_uid=str(pod) if pod is not None else None,
            job=job(p.attributes),
            exited=p.exited,
        )
        comm = nccl(p.attributes)
        if comm is not None:
            row["nccl"] = comm
        out.append(row)
    return out


def _who(model: Model, key: ProcessKey) -> tuple[int, str]:
    """A process's start (wall clock) and name as its rows say them; (0, "") for one the model never met."""
    p = model.processes.get(key)
    return (p.start_ns, p.name) if p else (0, "")


def memcpy(model: Model) -> tuple[list[schema.CopyRow], dict[str, schema.DirectionTotals]]:
    """The copy rows, by (process, api, direction, host memory), and their totals by direction."""
    rows = []
    totals: dict[str, schema.DirectionTotals] = {}
    copies = model.copy_view()
    for key in sorted(copies):
        st = copies[key]
        if st.calls == 0:
            continue
        layer, api, direction, sync, host_memory = describe(key)
        start, name = _who(model, key.process)
        h = st.durations
        seconds = st.duration_ns / 1e9
        rows.append(
            schema.CopyRow(
                pid=key.process.pid,
                start_time_unix_nano=start,
                process=name,
                layer=layer,
                api=api,
                direction=direction,
                host_memory=host_memory,
                synchronous=sync,
                calls=st.calls,
                bytes=st.bytes,
                errors=st.errors,
                duration_seconds=schema.CopyDurations(
                    p50=h.quantile(0.50),
                    p95=h.quantile(0.95),
                    p99=h.quantile(0.99),
                    max=h.max if h.count else 0.0,
                    sum=seconds,
                ),
                bandwidth_bytes_per_second=st.bytes / seconds if seconds > 0 else None,
            )
        )
        t = totals.setdefault(direction, schema.DirectionTotals(calls=0, bytes=0, errors=0))
        t["calls"] += st.calls
        t["bytes"] += st.bytes
        t["errors"] += st.errors
    return rows, {d.label: totals[d.label] for d in Direction if d.label in totals}


def finding(f: Finding) -> schema.Finding:
    return schema.Finding(
        code=f.code,
        pid=f.pid,
        start_time_unix_nano=f.start_ns,
        process=f.process,
        value=f.value,
        summary=f.summary,
        fix=f.fix,
        evidence=f.evidence,
    )


def diagnosis(d: Diagnosis) -> schema.Diagnosis:
    return schema.Diagnosis(
        cause=d.cause,
        pid=d.key.pid,
        start_time_unix_nano=d.start_ns,
        process=d.process,
        symptom=d.symptom,
        ratio=d.ratio,
        onset_time_unix_nano=d.onset_ns,
        detected_time_unix_nano=d.detected_ns,
        named_time_unix_nano=d.named_ns,
        evidence=d.evidence,
        fix=d.fix,
    )


def overhead(model: Model, budget: float | None) -> list[schema.OverheadRow]:
    """What memtrace's probes cost each process that took a trap (estimated:
    the kernel's trap counts times this host's calibrated trap cost), beside
    the budget; empty when the cost was not measured."""
    out = []
    for key, p in sorted(model.processes.items()):
        o = model.overhead(key)
        if o is None:
            continue
        out.append(
            schema.OverheadRow(
                pid=key.pid,
                start_time_unix_nano=p.start_ns,
                process=p.name,
                traps=o.traps,
                launch_traps=o.launch_traps,
                estimated_seconds=o.seconds,
                cpu_seconds=o.cpu_seconds,
                cpu_final=o.cpu_final,
                share_of_cpu=o.share,
                trap_seconds=o.cost.entry_seconds,
                pair_seconds=o.cost.pair_seconds,
                trap_entry_kind=o.cost.kind,
                calibrated=o.cost.calibrated,
                bounded=o.bounded,
                estimated=True,
                budget=budget,
                over_budget=o.over(budget),
                # The share of the time its launch probes were attached (None: always, exact).
                launch_duty=p.launch_duty,
            )
        )
    return out


def device_memory(
    model: Model, views: tuple[list[ProcessDeviceMemory], list[PodDeviceMemory]] = ([], [])
) -> list[schema.DeviceMemoryRow]:
    """One row per process that allocated, freed or pinned memory, or that NVML lists on a GPU;
    `views`: memtrace's and NVML's figures side by side (model/memory.device_memory_views)."""
    nvml = {v.key: v for v in views[0] if v.nvml_bytes is not None}
    out = []
    for key, p in sorted(model.processes.items()):
        m = p.memory
        v = nvml.get(key)
        if not (m.allocations or m.frees or m.unknown_frees or m.failed_allocations or p.book.pinned_bytes or v):
            continue
        out.append(
            schema.DeviceMemoryRow(
                pid=key.pid,
                start_time_unix_nano=p.start_ns,
                process=p.name,
                allocations=m.allocations,
                allocated_bytes=m.allocated_bytes,
                frees=m.frees,
                freed_bytes=m.freed_bytes,
                unknown_frees=m.unknown_frees,
                failed_allocations=m.failed_allocations,
                in_use_bytes=m.in_use_bytes,
                peak_bytes=m.peak_bytes,
                outstanding=m.outstanding,
                exited=p.exited,
                allocation_size_bytes=schema.SizeQuantiles(
                    p50=m.sizes.quantile(0.5), max=m.sizes.max if m.sizes.count else 0.0
                ),
                pinned_host_bytes=p.book.pinned_bytes,
                lost_calls=p.lost_memory_calls(),
                traced_from_start=p.complete,
                nvml_used_bytes=None if v is None else v.nvml_bytes,
                unattributed_bytes=None if v is None else v.unattributed_bytes,
            )
        )
    return out


def pods(views: list[PodDeviceMemory]) -> list[schema.PodMemoryRow]:
    return [
        schema.PodMemoryRow(
            pod_uid=v.pod_uid,
            pids=list(v.pids),
            in_use_bytes=v.traced_bytes,
            nvml_used_bytes=v.nvml_bytes,
            unattributed_bytes=v.unattributed_bytes,
        )
        for v in views
    ]


def synchronization(model: Model) -> list[schema.SyncRow]:
    out = []
    syncs = model.sync_view()
    waited: dict[ProcessKey, int] = defaultdict(int)
    for (key, _api), st in syncs.items():
        waited[key] += st.duration_ns
    for (key, api), st in sorted(syncs.items()):
        a = apis.BY_ID.get(api)
        p = model.processes.get(key)
        wall = p.wall_ns() if p else 0
        start, name = _who(model, key)
        h = st.durations
        out.append(
            schema.SyncRow(
                pid=key.pid,
                start_time_unix_nano=start,
                process=name,
                layer=a.layer.label if a else "driver",
                api=apis.api_name(api),
                kind=a.sync.value if a and a.sync else "other",
                calls=st.calls,
                errors=st.errors,
                duration_seconds=schema.WaitDurations(
                    p50=h.quantile(0.50),
                    p99=h.quantile(0.99),
                    max=h.max if h.count else 0.0,
                    sum=st.duration_ns / 1e9,
                ),
                share_of_wall_time=waited[key] / wall if wall else None,
            )
        )
    return out


def _step_durations(h: ExpHistogram) -> schema.StepDurations:
    return schema.StepDurations(
        p50=h.quantile(0.50),
        p95=h.quantile(0.95),
        p99=h.quantile(0.99),
        max=h.max if h.count and not math.isinf(h.max) else 0.0,
    )


def step_row(key: ProcessKey, start_ns: int, name: str, st: StepStats) -> schema.StepRow:
    """A process's steps (model/steps.py), as the summary's `steps` row."""
    return schema.StepRow(
        pid=key.pid,
        start_time_unix_nano=start_ns,
        process=name,
        tid=st.tid,
        steps=st.steps,
        duration_seconds=_step_durations(st.durations),
        breakdown=schema.StepBreakdown(
            copy=st.share(st.copy_ns),
            sync_wait=st.share(st.sync_ns),
            collective=st.share(st.collective_ns),
            host=st.share(st.host_ns),
        ),
        gpu_idle_share=st.share(st.gpu_idle_ns),
        loop=st.loop.value,
        bytes_in=st.bytes_in,
        bytes_out=st.bytes_out,
    )


def steps(model: Model) -> list[schema.StepRow]:
    """Each process's inferred steps (memtrace/model/steps.py)."""
    return [step_row(key, *_who(model, key), st) for key, st in model.steps_view().items()]


def launches(model: Model) -> list[schema.LaunchRow]:
    out = []
    for (key, api), n in sorted(model.launches.items()):
        a = apis.BY_ID.get(api)
        p = model.processes.get(key)
        start, name = _who(model, key)
        row = schema.LaunchRow(
            pid=key.pid,
            start_time_unix_nano=start,
            process=name,
            api=apis.api_name(api),
            kind=a.launch.value if a and a.launch else "kernel",
            launches=n,
            # Sampled by the overhead budget: counted in its windows, extrapolated between them.
            estimated=bool(p and p.launch_duty is not None),
            # Its own launch probes came after it may have launched: a floor.
            partial=bool(p and p.launches_partial),
        )
        if p is not None and p.launch_duty is not None:
            row["error"] = p.launch_error
        out.append(row)
    return out


def say(console: Console, markup: str, highlight: bool = False) -> None:
    """Prose at the console's width (80 when piped): each line of `markup`
    wrapped at words, its continuation lines indented two spaces past it,
    so a wrapped finding or fix still reads as one."""
    del highlight  # a Text is printed as styled, never highlighted
    for para in markup.split("\n"):
        text = Text.from_markup(para)
        hang = len(text.plain) - len(text.plain.lstrip(" ")) + 2
        for i, line in enumerate(text.wrap(console, max(console.width - hang, 20))):
            line.rstrip()
            console.print(Text(" " * hang) + line if i else line, soft_wrap=True)


def fit(console: Console, renderable: RenderableType) -> None:
    """Print without cutting anything: on a terminal, cells fold where the
    screen is too narrow; elsewhere (a file, a pipe) the line is as wide as
    the content needs, never narrower than the console."""
    if console.is_terminal:
        console.print(renderable)
        return
    need = Measurement.get(console, console.options.update(max_width=1 << 16), renderable).maximum
    width = console.width
    console.width = max(width, need)  # print(width=) cannot exceed the console's width
    try:
        console.print(renderable)
    finally:
        console.width = width


def _table(*columns: str, title: str | None = None, left: tuple[str, ...] = ()) -> Table:
    # No box: two spaces between columns leave the room to numbers.
    t = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold underline")
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right", overflow="fold")
    return t


def _bandwidth(rows: list[dict[str, Any]]) -> str:
    seconds = sum(r["duration_seconds"]["sum"] for r in rows)
    if seconds <= 0:
        return "-"
    bw = f"{sum(r['bytes'] for r in rows) / seconds / 1e9:.1f}"
    return bw + "*" if any(not r["synchronous"] for r in rows) else bw


def _host_split(rows: list[dict[str, Any]]) -> str:
    """Where the host side of the bytes lives: one kind, or the pageable share."""
    by: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["host_memory"]:
            by[r["host_memory"]] += r["bytes"]
    if not by:
        return ""
    by = {k: n for k, n in by.items() if n} or by
    if len(by) == 1:
        return next(iter(by))
    total = sum(by.values())
    if not total:
        return "mixed"
    # Bytes of an unknown kind make it a bound, never 0% (processes attached to while running).
    return f"{pageable_share(by.get('pageable', 0), by.get('unknown', 0), total)} pageable"


def _libraries(libs: list[dict[str, Any]]) -> str:
    """One entry per path; a file replaced while traced is attached once per inode."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for l in libs:
        seen.setdefault(l["path"], []).append(l)
    parts = []
    for path, same in seen.items():
        l = same[-1]
        note = f"{l['layer']}, {l['probes']} symbols"
        if len(same) > 1:
            note += f", replaced on disk while traced: {len(same)} versions attached"
        parts.append(f"{path} ({note})")
    return ", ".join(parts)


def _process_name(rows: list[dict[str, Any]], pid: int) -> str:
    return next((r["process"] for r in rows if r["process"]), "")


def print_table(doc: Mapping[str, Any], console: Console, detail: bool = False) -> None:
    """The summary for people: per process and direction (80 columns), or per
    API with ``detail``. Exact byte totals are always shown in full."""
    a = doc["agent"]
    cmd = doc.get("command")
    if not a["libraries"] and not doc["memcpy"] and not doc.get("device_memory"):
        who = f"`{' '.join(cmd['argv'])}`" if cmd else "the traced processes"
        say(
            console,
            f"memtrace: {who} loaded no CUDA library (libcuda.so or libcudart.so, or a CUDA runtime "
            "linked into the program): nothing to report.",
            highlight=False,
        )
        if cmd:
            console.print(f"exit code {cmd['exit_code']}, {human_seconds(cmd['wall_seconds'])}", highlight=False)
        return
    console.print("[bold]memtrace: CUDA memory copies[/bold]")
    if doc.get("simulated"):
        say(
            console,
            "[bold yellow]simulated[/bold yellow]: the CUDA library traced is memtrace's test library, not "
            "CUDA's: the calls and bytes are the workload's, the times, GB/s and findings are not a GPU's.",
        )
    per: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in doc["memcpy"]:
        per[r["pid"]].append(r)
    for pid, rows in sorted(per.items()):
        if detail:
            # Too wide for a terminal: in groups of columns, each led by api, dir and host.
            t: Table | SplitTable = SplitTable(
                ("api", "dir", "host", "calls", "bytes", "err", "p50", "p99", "GB/s"), 3, left=("api", "dir", "host")
            )
            for r in rows:
                d = r["duration_seconds"]
                t.add_row(
                    r["api"],
                    r["direction"],
                    r["host_memory"] or "",
                    f"{r['calls']:,}",
                    f"{r['bytes']:,}",
                    str(r["errors"]) if r["errors"] else "",
                    human_seconds(d["p50"]),
                    human_seconds(d["p99"]),
                    _bandwidth([r]),
                )
        else:
            t = _table(
                "direction", "calls", "bytes", "", "host memory", "errors", "GB/s", left=("direction", "host memory")
            )
            by_dir: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                by_dir[r["direction"]].append(r)
            order = list(doc["totals"])
            for direction, rs in sorted(by_dir.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
                n = sum(r["bytes"] for r in rs)
                errors = sum(r["errors"] for r in rs)
                t.add_row(
                    direction,
                    f"{sum(r['calls'] for r in rs):,}",
                    f"{n:,}",
                    human_bytes(n),
                    _host_split(rs),
                    f"{errors:,}" if errors else "",
                    _bandwidth(rs),
                )
        t.title = f"pid {pid} {_process_name(rows, pid)}".rstrip()
        fit(console, t)
    if len(per) > 1:
        tt = _table("direction", "calls", "bytes", "", "errors", title="all processes", left=("direction",))
        for d, v in doc["totals"].items():
            tt.add_row(d, f"{v['calls']:,}", f"{v['bytes']:,}", human_bytes(v["bytes"]), f"{v['errors']:,}")
        fit(console, tt)
    print_sections(doc, console)
    print_host(doc, console)
    print_call_sites(doc, console)
    for d in doc.get("diagnoses") or []:
        say(
            console,
            f"[bold red]diagnosis[/bold red] ({d['process'] or d['pid']}): {d['symptom']}; "
            f"cause: [bold]{d['cause']}[/bold]. [bold]fix[/bold]: {d['fix']}",
            highlight=False,
        )
    say(console, f"[bold]libraries[/bold]: {_libraries(a['libraries']) or 'none'}", highlight=False)
    line = f"events {a['events']:,}, dropped {a['dropped']:,}"
    if a["abandoned_calls"] or a["untracked_calls"]:
        line += f", abandoned {a['abandoned_calls']}, untracked {a['untracked_calls']}"
    if a.get("unreturned_calls"):
        line += f", unreturned {a['unreturned_calls']}"
    say(console, f"[bold]agent[/bold]: {line}", highlight=False)
    rows = doc.get("overhead") or []
    for o in rows[:3]:
        say(console, _overhead_line(o, doc.get("findings") or []), highlight=False)
    if len(rows) > 3:
        say(console, f"[bold]overhead[/bold]: {len(rows) - 3} more processes: --format json", highlight=False)
    if doc.get("simulated") and any("stepped" in o["trap_entry_kind"] for o in rows[:3]):
        say(
            console,
            "[dim]the test library's entries are single-stepped: a trap there costs about ten times one at "
            "CUDA's entries[/dim]",
        )
    if a.get("batch_truncated_calls"):
        say(
            console,
            f"[yellow]{a['batch_truncated_calls']:,} batch copy calls had more than {BATCH_MAX} copies: "
            f"the bytes of the copies past the first {BATCH_MAX} are not counted.[/yellow]",
        )
    if a.get("batch_array_copies"):
        say(
            console,
            f"[yellow]{a['batch_array_copies']:,} copies of 3D batches went to or from a CUDA array: counted, "
            "but their bytes are not (an array's element size is not read).[/yellow]",
        )
    if any(not r["synchronous"] for r in doc["memcpy"]):
        say(
            console,
            "[dim]* includes asynchronous calls: bytes ÷ call time; a call may return before its transfer ends[/dim]",
        )
    if not detail:
        console.print("[dim]per-API detail: memtrace run --detail[/dim]")
    if a["dropped"]:
        say(
            console,
            f"[yellow]{a['dropped']:,} events were dropped (ring full): totals stay exact, "
            "duration percentiles cover the rest. Raise --ring-size.[/yellow]",
        )


def _overhead_line(o: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> str:
    """What memtrace's probes cost one process: the share of the process's own
    CPU time spent in their traps, and the budget; where it is over the budget
    with no finding, why (the finding waits for DEFAULT.overhead_min_cpu_s of CPU)."""
    share = "an unknown share" if o["share_of_cpu"] is None else f"about {o['share_of_cpu']:.1%}"
    how = f"{o['traps']:,} traps at {o['trap_seconds'] * 1e6:.1f} us, ~{human_seconds(o['estimated_seconds'])}"
    if not o["calibrated"]:
        how += ", not calibrated"
    if o.get("bounded"):
        how += ", capped at its CPU time"
    line = f"[bold]overhead[/bold]: {o['pid']} {o['process']}: memtrace's probes took {share} of its CPU time ({how})"
    if o["over_budget"]:
        line += f"; [yellow]over the {o['budget']:.1%} budget[/yellow]"
        found = any(
            f["code"] == "overhead_budget_exceeded"
            and f["pid"] == o["pid"]
            and f["start_time_unix_nano"] == o["start_time_unix_nano"]
            for f in findings
        )
        least = DEFAULT.overhead_min_cpu_s
        if not found and (o["cpu_seconds"] or 0.0) < least:
            line += f", no finding: it used {o['cpu_seconds'] or 0.0:.2g} s of CPU, a finding waits for {least:g} s"
    return line


def _launch_estimate(who: tuple[int, int, str], sampled: Mapping[tuple[int, int, str], float | None]) -> str:
    """How far a process's sampled launch count may be from the truth, as said."""
    if who not in sampled:
        return ""
    err = sampled[who]
    return " (sampled: error not bounded)" if err is None else f" (sampled: within {err:.1%})"


def print_sections(doc: Mapping[str, Any], console: Console) -> None:
    """Device memory, waits, launches and findings, under the copy table."""
    if doc.get("device_memory"):
        t = _table(
            "process", "allocs", "frees", "in use", "peak", "pinned host", title="device memory", left=("process",)
        )
        unknown: dict[bool, list[str]] = {True: [], False: []}
        for m in doc["device_memory"]:
            t.add_row(
                f"{m['pid']} {m['process']}",
                f"{m['allocations']:,}",
                f"{m['frees']:,}",
                human_bytes(m["in_use_bytes"]),
                human_bytes(m["peak_bytes"]),
                human_bytes(m["pinned_host_bytes"]),
            )
            if m["unknown_frees"]:
                unknown[m.get("traced_from_start", False)].append(f"{m['pid']}: {m['unknown_frees']:,}")
        fit(console, t)
        # Traced from its start, a free memtrace cannot match was never an allocation's (or freed twice).
        for whole, what in (
            (True, "frees of addresses that were not live allocations (never allocated, or already freed)"),
            (False, "frees of memory allocated before tracing began, or not live allocations"),
        ):
            if unknown[whole]:
                say(console, f"{what}: {', '.join(unknown[whole])}", highlight=False)
    if doc.get("synchronization"):
        t = _table(
            "process", "api", "calls", "p99", "total", "of wall", title="synchronisation waits", left=("process", "api")
        )
        for w in doc["synchronization"]:
            d = w["duration_seconds"]
            share = w["share_of_wall_time"]
            t.add_row(
                f"{w['pid']} {w['process']}",
                w["api"],
                f"{w['calls']:,}",
                human_seconds(d["p99"]),
                human_seconds(d["sum"]),
                "-" if share is None else f"{share:.0%}",
            )
        fit(console, t)
    if doc.get("launches"):
        per: dict[tuple[int, int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        sampled: dict[tuple[int, int, str], float | None] = {}  # estimated: the error bound (None: unbounded)
        for l in doc["launches"]:
            who = (l["pid"], l.get("start_time_unix_nano", 0), l["process"])
            per[who][l["kind"]] += l["launches"]
            if l.get("estimated"):
                sampled[who] = l.get("error")
        line = "; ".join(
            f"{who[2] or who[0]}: "
            + ", ".join(f"{'~' if who in sampled else ''}{n:,} {k}" for k, n in sorted(kinds.items()))
            + _launch_estimate(who, sampled)
            for who, kinds in sorted(per.items())
        )
        say(console, f"[bold]launches[/bold]: {line}")
    for f in doc.get("findings", []):
        say(
            console,
            f"[bold yellow]finding[/bold yellow] ({f['process'] or f['pid']}): {f['summary']}.\n"
            f"  [bold]fix[/bold]: {f['fix']}",
        )


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.0%}"


def _preemptor(p: Mapping[str, Any]) -> str:
    """A preemptor's cgroup, the root one named as such, and the process that took the CPU most:
    memtrace's own threads said to be memtrace's."""
    cgroup = p["cgroup"]
    who = "the root cgroup" if cgroup == "/" else cgroup or f"cgroup {p['cgroup_id']}"
    name = "memtrace's own threads" if p.get("memtrace") else p["process"]
    return f"{who} ({name})" if name else who


def print_host(doc: Mapping[str, Any], console: Console) -> None:
    """The host signals in a few lines: CPU waits, collectives, GPUs, busy links, sensors that were off."""
    host = doc.get("host")
    for c in doc.get("collectives") or []:
        since = "" if c.get("counted_from", "start") == "start" else " (since NCCL was attached)"
        waited = f", then {c['wait_seconds']:.3g} s waiting for it" if c.get("waits_attributed") else ""
        say(
            console,
            f"[bold]collective[/bold] pid {c['pid']} {c['collective']}: {c['calls']:,} calls, "
            f"{human_bytes(c['bytes'])}, {c['seconds']:.3g} s in the calls{waited}{since}",
            highlight=False,
        )
    if not host:
        return
    for r in host["cpu"]:
        lat = r["run_queue_latency_us"]
        p99 = "" if lat is None else f", run-queue p99 {lat['p99'] / 1e3:.3g} ms"
        line = (
            f"[bold]cpu[/bold] pid {r['pid']} {r['process'] or ''}: on CPU {r['on_cpu_seconds']:.3g} s, "
            f"waited for a CPU {_pct(r['run_queue_share'])} of its time{p99}"
        )
        top = [p for p in r["preempted_by"] if p["switches"]]
        if top:
            line += f"; preempted most by {_preemptor(top[0])}"
        q = r["cpu_quota"]
        if q and q["throttled_periods"]:
            line += f"; its CPU quota throttled it {q['throttled_seconds']:.3g} s"
        say(console, line, highlight=False)
    gaps = host.get("cpu_sensor") or {}
    if gaps.get("switch_gaps"):
        say(
            console,
            f"[yellow]the kernel's sched tracepoints skipped {gaps['switch_gaps']:,} switches of the traced "
            "threads: on-CPU time and switch counts stay exact; the waits across them are in the totals, "
            "not the histograms.[/yellow]",
            highlight=False,
        )
    lost = {k: gaps.get(k, 0) for k in ("processes_not_kept", "threads_not_kept", "preemptions_not_attributed")}
    if any(lost.values()):
        said = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in lost.items() if n)
        say(console, f"[yellow]the CPU sensor's maps were full: {said}.[/yellow]", highlight=False)
    for g in host["gpus"]:
        sm, temp, power = g["sm_utilization_percent"], g["temperature_celsius"], g["power_watts"]
        parts = [f"[bold]gpu {g['index']}[/bold] {g['name']}:"]
        if g["lost_samples"]:
            parts.append(f"[red]lost in {g['lost_samples']} of {g['samples']} samples[/red]")
        if sm:
            parts.append(f"SM {sm['mean']:.0f}% mean")
        act = g["activity"]
        if act and act["sm_active_percent"]:
            busy = f"SMs active {act['sm_active_percent']['mean']:.0f}%"
            if act["tensor_active_percent"]:
                busy += f", tensor {act['tensor_active_percent']['mean']:.0f}%"
            if act["dram_bandwidth_percent"]:
                busy += f", DRAM bandwidth {act['dram_bandwidth_percent']['mean']:.0f}%"
            parts.append(busy)
        elif g["gpm"] is False:
            parts.append("[dim](no GPM: SM activity not measured)[/dim]")
        if temp:
            parts.append(f"{temp['max']:.0f} C max")
        if power:
            parts.append(f"{power['max']:.0f} W max")
        link = g["pcie_link"]
        if link and link["width"] is not None:
            can = f"gen{link['max_generation']} x{link['max_width']}"
            parts.append(f"PCIe gen{link['generation']} x{link['width']} (can do {can})")
        if g["throttled_share"]:
            parts.append(
                f"[yellow]throttled {_pct(g['throttled_share'])} ({', '.join(g['clock_event_reasons'])})[/yellow]"
            )
        if g["pcie_replays"]:
            parts.append(f"[yellow]{g['pcie_replays']:,} PCIe replays[/yellow]")
        if g["xids"]:
            parts.append(f"[red]XID {', '.join(map(str, g['xids']))}[/red]")
        down = [str(link["link"]) for link in g["nvlinks"] if not link["active"]]
        if down:
            parts.append(f"[red]NVLink {', '.join(down)} down[/red]")
        nv_errors = sum((link["crc_errors"] or 0) + (link["replay_errors"] or 0) for link in g["nvlinks"])
        if nv_errors:
            parts.append(f"[yellow]{nv_errors:,} NVLink CRC/replay errors[/yellow]")
        rows = g["remapped_rows"]
        if rows and (rows["uncorrectable"] or rows["pending"] or rows["failed"]):
            parts.append(f"[red]{rows['uncorrectable']} rows remapped for uncorrectable errors[/red]")
        say(console, " ".join(parts), highlight=False)
    for i in host["network"]["interfaces"]:
        moved = i["rx_bytes"] + i["tx_bytes"]
        if not moved or i["interface"] == "lo":
            continue
        line = f"[bold]net[/bold] {i['interface']}: rx {human_bytes(i['rx_bytes'])}, tx {human_bytes(i['tx_bytes'])}"
        if i["peak_utilization"] is not None:
            line += f", busiest {_pct(i['peak_utilization'])} of the link"
        drops = i["rx_dropped"] + i["tx_dropped"]
        if drops:
            line += f", [yellow]{drops:,} dropped[/yellow]"
        say(console, line, highlight=False)
    off = [f"{k} ({v['reason'].split(':')[0]})" for k, v in host["sensors"].items() if v["state"] == "off"]
    if off:
        say(console, f"[dim]host signals off: {'; '.join(off)}[/dim]", highlight=False)
