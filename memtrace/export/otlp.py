"""The metrics builder: the model and the host book in, OTLP MetricsData out
(the SDK's metric data model, built with its public constructors); the
exporter in export/transport.py ships it.

Values are not re-recorded through SDK instruments (one Python call per
copy would cost more than the copy's probe): the data points are built
directly from the exact aggregates and the event histograms.

Every metric's name, kind, unit and description is export/catalog.py's;
docs/metrics.md is the reference made from it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from memtrace import __version__
from memtrace.analysis.diagnosis import Diagnosis
from memtrace.analysis.findings import Finding, Thresholds
from memtrace.analysis.findings import compute as compute_findings
from memtrace.core import apis
from memtrace.core.abi import Stat
from memtrace.core.gpu import GpuSample, MigInstance
from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessKey, iso8601_ns
from memtrace.export import catalog as cat
from memtrace.export.catalog import Kind, MetricSpec
from memtrace.export.config import HistogramKind, PushConfig, Temporality
from memtrace.model import Model, describe
from memtrace.model.host import GpuSeries, HostBook
from memtrace.model.memory import PodDeviceMemory, device_memory_views, nvml_used_by_pid
from memtrace.model.process import Process

SCOPE = InstrumentationScope(name="memtrace", version=__version__)
MAX_BUCKETS = 160  # OTel's default exponential bucket budget

# Explicit-bucket option: boundaries that are exponential-bucket boundaries
# too, so counts are exact: 2**(k/4) s from ~1 us to 128 s; 2**k B to 1 TiB.
DURATION_BOUNDS = [2.0 ** (k / 4) for k in range(-80, 29)]
SIZE_BOUNDS = [2.0**k for k in range(0, 41)]

COPY_COUNTERS = (cat.MEMCPY_CALLS, cat.MEMCPY_BYTES, cat.MEMCPY_ERRORS)
SYNC_COUNTERS = (cat.SYNC_CALLS, cat.SYNC_WAIT_TIME)
MEMORY_COUNTERS = (
    cat.MEMORY_ALLOCATIONS,
    cat.MEMORY_ALLOCATED,
    cat.MEMORY_FREES,
    cat.MEMORY_FREED,
    cat.MEMORY_UNKNOWN_FREES,
    cat.MEMORY_FAILED_ALLOCATIONS,
)
CPU_COUNTERS = (cat.RUN_QUEUE_TIME, cat.OFF_CPU_TIME, cat.ON_CPU_TIME, cat.STOLEN_TIME)
NCCL_COUNTERS = (cat.NCCL_CALLS, cat.NCCL_BYTES, cat.NCCL_TIME)
NCCL_WAIT_COUNTERS = (cat.NCCL_WAITS, cat.NCCL_WAIT_TIME)
_NET_DIRECTIONS = (("receive", "rx"), ("transmit", "tx"))
_NET_SUMS = (
    (cat.NETWORK_IO, "bytes"),
    (cat.NETWORK_PACKETS, "packets"),
    (cat.NETWORK_DROPPED, "dropped"),
    (cat.NETWORK_ERRORS, "errors"),
)
_QDISC_SUMS = ((cat.QDISC_BYTES, "bytes"), (cat.QDISC_DROPS, "drops"), (cat.QDISC_OVERLIMITS, "overlimits"))
AGENT_SERIES = "agent"  # the second item of the agent resource's series keys (never a process)


def explicit_counts(h: ExpHistogram, bounds_scale: int, lo_exp: int, n_bounds: int) -> list[int]:
    """Bucket counts for bounds 2**(e / 2**bounds_scale), e = lo_exp .. lo_exp+n-1."""
    d = h.downscaled(bounds_scale) if h.scale > bounds_scale else h
    counts = [0] * (n_bounds + 1)
    counts[0] += d.zero_count
    for i, k in d.counts.items():
        j = i + 1 - lo_exp  # the value is <= 2**((i+1)/2**s): bound e = i+1
        counts[min(max(j, 0), n_bounds)] += k
    return counts


def _gpu_attributes(g: GpuSeries) -> dict[str, Any]:
    """A GPU's attributes on its series (OpenTelemetry's hw.* for a GPU, and its NVML index)."""
    return {"hw.id": g.uuid, "hw.name": g.name, "hw.type": "gpu", "gpu.index": g.index}


_NVLINK_ERRORS = (("crc_errors", "crc"), ("replay_errors", "replay"), ("recovery_errors", "recovery"))


def _gpm_values(last: GpuSample) -> dict[MetricSpec, float | None]:
    """A GPU's GPM activity at its last detailed sample, as shares; whether it has GPM at all."""
    if last.gpm_supported is None:
        return {}
    return {cat.GPU_GPM_SUPPORTED: float(last.gpm_supported), **_gpm_shares(last)}


def _gpm_shares(last: GpuSample | MigInstance) -> dict[MetricSpec, float | None]:
    """A GPU's or MIG instance's GPM activity at its last detailed sample, as shares."""
    out: dict[MetricSpec, float | None] = {}
    for spec, v in (
        (cat.GPU_SM_ACTIVE, last.sm_active_percent),
        (cat.GPU_SM_OCCUPANCY, last.sm_occupancy_percent),
        (cat.GPU_TENSOR_ACTIVE, last.tensor_active_percent),
        (cat.GPU_DRAM_ACTIVE, last.dram_bandwidth_percent),
    ):
        out[spec] = None if v is None else v / 100
    return out


def _number(attrs: dict[str, Any], start: int, now: int, value: float) -> NumberDataPoint:
    return NumberDataPoint(attributes=attrs, start_time_unix_nano=start, time_unix_nano=now, value=value)


def _resource_metrics(resource: Resource, metrics: list[Metric]) -> ResourceMetrics:
    return ResourceMetrics(
        resource=resource,
        scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
        schema_url="",
    )


@dataclass
class _Base:
    """What the last successful delta export covered, per series."""

    totals: dict[Any, tuple[Any, ...]] = field(default_factory=dict)
    durations: dict[Any, ExpHistogram] = field(default_factory=dict)
    sizes: dict[Any, ExpHistogram] = field(default_factory=dict)
    time_ns: dict[Any, int] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)
    health_time_ns: int = 0


@dataclass
class Batch:
    data: MetricsData
    exited: list[ProcessKey]  # processes sent a final time
    commit: Callable[[], None]
    rollback: Callable[[], None]
    # A delta export that reached the collector only in part: advance the
    # base of these processes' series alone (the rest is sent again).
    commit_processes: Callable[[set[ProcessKey]], None]
    # The process of each resource, in order (the agent's own resource, last, has none).
    keys: list[ProcessKey] = field(default_factory=list)
    # The findings of every process, as computed for this export (their text: export/events.py).
    findings: list[Finding] = field(default_factory=list)

    def processes_in(self, resources: int) -> set[ProcessKey]:
        """The processes of the first `resources` resources of this export."""
        return set(self.keys[:resources])


def _printable(s: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in s)


def process_resource(key: ProcessKey, start_ns: int) -> dict[str, Any]:
    """Who a process is, as OTel's semantic conventions name it: its pid, and
    its start (two processes with one pid are two resources)."""
    attrs: dict[str, Any] = {"process.pid": key.pid}
    if start_ns:
        attrs["process.creation.time"] = iso8601_ns(start_ns)
    return attrs


def resource_of(base: dict[str, Any], key: ProcessKey, proc: Process) -> dict[str, Any]:
    """A process's OTLP resource (its metrics' and its profiles'): `base` (the
    configured and host attributes), then what the host said of the process
    (its container, pod, executable's path), then BPF's identity, which
    wins: its name is the one the table, the JSON and the events say."""
    attrs = dict(base)
    attrs.update(proc.attributes)
    attrs.update(process_resource(key, proc.start_ns))
    if proc.name:
        attrs["process.executable.name"] = _printable(proc.name)
    attrs.setdefault("service.name", "memtrace")
    return attrs


class _Points:
    """The points of one process's series in one export."""

    def __init__(
        self,
        builder: MetricsBuilder,
        new_base: _Base,
        windows: list[tuple[ProcessKey | None, ExpHistogram, tuple[float, float]]],
        starting: list[Any],
        now: int,
        first_seen_ns: int,
        series_start: int,
        key: ProcessKey | None,
    ) -> None:
        self.b = builder
        self.key = key
        self.new_base = new_base
        self.windows = windows
        self.starting = starting
        self.now = now
        self.first_seen_ns = first_seen_ns
        self.series_start = series_start
        self.points: dict[MetricSpec, list[Any]] = {}

    def sums(self, key: Any, la: dict[str, Any], specs: tuple[MetricSpec, ...], cur: tuple[Any, ...]) -> int:
        """Counter points for one series; returns its start time."""
        b, now = self.b, self.now
        if b.delta:
            base = b.base.totals.get(key, (0,) * len(cur))
            vals = tuple(c - p for c, p in zip(cur, base, strict=True))
            start = b.base.time_ns.get(key, self.first_seen_ns)
            self.new_base.totals[key] = cur
            self.new_base.time_ns[key] = now
        else:
            vals, start = cur, self.series_start
            if key not in b.started and start < now:
                # A true zero at the start, as Prometheus' created-timestamp
                # zeros do: a short-lived process (one push) still has a rate.
                self.starting.append(key)
                for spec in specs:
                    self.points.setdefault(spec, []).append(_number(la, start, start, 0))
        for spec, v in zip(specs, vals, strict=True):
            self.points.setdefault(spec, []).append(_number(la, start, now, v))
        return start

    def hist(self, key: Any, spec: MetricSpec, la: dict[str, Any], h: ExpHistogram, start: int) -> None:
        b = self.b
        if b.delta:
            cur = h.minus(b.base.durations.get(key) or ExpHistogram(h.scale))
            self.new_base.durations[key] = h.copy()
        else:
            cur = h
        w = h.take_window()
        self.windows.append((self.key, h, w))
        bounds = (DURATION_BOUNDS, 2, -80) if spec.unit == "s" else (SIZE_BOUNDS, 0, 0)
        self.points.setdefault(spec, []).append(b._hist_point(la, cur, w, start, self.now, *bounds))

    def gauge(self, spec: MetricSpec, la: dict[str, Any], v: float) -> None:
        self.points.setdefault(spec, []).append(_number(la, self.series_start, self.now, v))


def own_cause(d: Diagnosis) -> str:
    """A straggler diagnosis's rank's own cause (memtrace.diagnoses' own_cause):
    `waiting` where it waits for a peer (on this host, or across the network),
    else what slowed it (the evidence's own_cause, or unknown); "" for other
    causes, which are its own."""
    if d.cause != "straggler":
        return ""
    if "waits_for_pid" in d.evidence or "waits_for_peer" in d.evidence:
        return "waiting"
    return str(d.evidence.get("own_cause") or "unknown")


def cause_counts(diagnoses: Iterable[Diagnosis]) -> dict[ProcessKey, dict[str | tuple[str, str], int]]:
    """Diagnoses so far per process, by (cause, own cause): memtrace.diagnoses's points."""
    out: dict[ProcessKey, dict[str | tuple[str, str], int]] = {}
    for d in list(diagnoses):
        c = out.setdefault(d.key, {})
        k = (d.cause, own_cause(d))
        c[k] = c.get(k, 0) + 1
    return out


def _by_cause(counts: Mapping[str | tuple[str, str], int]) -> dict[tuple[str, str], int]:
    return {(k, "") if isinstance(k, str) else k: n for k, n in counts.items()}


class MetricsBuilder:
    def __init__(self, cfg: PushConfig, host: dict[str, str], start_ns: int | None = None) -> None:
        self.cfg = cfg
        self.host = host
        self.start_ns = start_ns or time.time_ns()
        self.base = _Base(health_time_ns=self.start_ns)
        self.export_failures = 0
        self.unsent_processes = 0  # exited processes dropped before any push could carry them
        self.started: set[Any] = set()  # series whose zero start point was delivered
        self.thresholds = Thresholds(overhead_budget=cfg.overhead_budget)
        agent_attrs: dict[str, Any] = {"service.name": "memtrace", "service.version": __version__}
        agent_attrs.update(cfg.resource_attributes)
        agent_attrs.update(host)
        self.agent_resource = Resource(attributes=agent_attrs)

    @property
    def delta(self) -> bool:
        return self.cfg.temporality == Temporality.delta

    def _temporality(self) -> AggregationTemporality:
        return AggregationTemporality.DELTA if self.delta else AggregationTemporality.CUMULATIVE

    def _hist_point(
        self,
        attrs: dict[str, str],
        h: ExpHistogram,
        window: tuple[float, float],
        start: int,
        now: int,
        bounds: list[float],
        bounds_scale: int,
        lo_exp: int,
    ) -> Any:
        lo, hi = window if self.delta else (h.min, h.max)
        lo = 0.0 if math.isinf(lo) else lo
        hi = 0.0 if math.isinf(hi) else hi
        if self.cfg.histogram == HistogramKind.explicit:
            return HistogramDataPoint(
                attributes=attrs,
                start_time_unix_nano=start,
                time_unix_nano=now,
                count=h.count,
                sum=h.sum,
                bucket_counts=explicit_counts(h, bounds_scale, lo_exp, len(bounds)),
                explicit_bounds=bounds,
                min=lo,
                max=hi,
            )
        f = h.fit(MAX_BUCKETS)
        return ExponentialHistogramDataPoint(
            attributes=attrs,
            start_time_unix_nano=start,
            time_unix_nano=now,
            count=f.count,
            sum=f.sum,
            scale=f.scale,
            zero_count=f.zero_count,
            positive=Buckets(offset=f.offset, bucket_counts=f.buckets.tolist()),
            negative=Buckets(offset=0, bucket_counts=[]),
            flags=0,
            min=lo,
            max=hi,
        )

    def _metric(self, spec: MetricSpec, points: list[Any]) -> Metric:
        """The metric of `spec` (its catalog name, kind, unit and description) with these points."""
        data: Sum | Gauge | Histogram | ExponentialHistogram
        tmp = self._temporality()
        if spec.kind == Kind.histogram:
            if self.cfg.histogram == HistogramKind.explicit:
                data = Histogram(data_points=points, aggregation_temporality=tmp)
            else:
                data = ExponentialHistogram(data_points=points, aggregation_temporality=tmp)
        elif spec.kind == Kind.gauge:
            data = Gauge(data_points=points)
        else:
            data = Sum(data_points=points, aggregation_temporality=tmp, is_monotonic=True)
        return Metric(name=spec.name, description=spec.description, unit=spec.unit, data=data)

    def _host_process(self, host: HostBook, key: ProcessKey, pp: _Points) -> None:
        """A process's CPU time and collectives, from the host signals."""
        cpu = host.cpu_of(key)
        if cpu is not None:
            times = (cpu.runq_ns, cpu.offcpu_ns, cpu.oncpu_ns, cpu.stolen_ns)
            pp.sums(("cpu", key), {}, CPU_COUNTERS, tuple(ns / 1e9 for ns in times))
            for kind, n in (("voluntary", cpu.voluntary), ("involuntary", cpu.involuntary)):
                pp.sums(("ctx", key, kind), {"process.context_switch_type": kind}, (cat.CONTEXT_SWITCHES,), (n,))
        for coll, t in host.collectives_of(key):
            if t.calls:
                cur = (t.calls, t.bytes, t.duration_ns / 1e9)
                pp.sums(("nccl", key, int(coll)), {"collective": coll.label}, NCCL_COUNTERS, cur)

    def _gpu_metrics(self, host: HostBook, start: int, now: int) -> list[Metric]:
        points: dict[MetricSpec, list[NumberDataPoint]] = {}
        for g in sorted(host.gpus.values(), key=lambda g: g.index):
            la = _gpu_attributes(g)
            latest, last = g.latest, g.last
            values: dict[MetricSpec, float | None] = {cat.GPU_LOST: float(bool(latest and latest.lost))}
            if latest is not None and not latest.lost:
                sm = latest.sm_utilization_percent
                values[cat.GPU_UTILIZATION] = None if sm is None else sm / 100
                values[cat.GPU_THROTTLED] = None if latest.throttled is None else float(latest.throttled)
                values[cat.GPU_SM_CLOCK] = latest.sm_clock_mhz  # the clocks the timeline's tracks draw
                values[cat.GPU_MEMORY_CLOCK] = latest.memory_clock_mhz
            if last is not None:
                values.update(
                    {
                        cat.GPU_MEMORY_USAGE: last.memory_used_bytes,
                        cat.GPU_MEMORY_LIMIT: last.memory_total_bytes,
                        cat.GPU_POWER: None if last.power_milliwatts is None else last.power_milliwatts / 1000,
                        cat.GPU_TEMPERATURE: last.temperature_celsius,
                        cat.GPU_LINK_WIDTH: last.link_width,
                        cat.GPU_LINK_MAX_WIDTH: last.max_link_width,
                        cat.GPU_LINK_GENERATION: last.link_generation,
                        cat.GPU_LINK_MAX_GENERATION: last.max_link_generation,
                        cat.GPU_PCIE_REPLAYS: g.replays_since_start(),
                    }
                )
                values.update(_gpm_values(last))
                rows = last.remapped_rows
                if rows is not None:
                    values[cat.GPU_REMAP_PENDING] = float(rows.pending)
                    values[cat.GPU_REMAP_FAILED] = float(rows.failed)
                    for cause, n in (("correctable", rows.correctable), ("uncorrectable", rows.uncorrectable)):
                        point = _number({**la, "memtrace.remap.cause": cause}, start, now, n)
                        points.setdefault(cat.GPU_REMAPPED_ROWS, []).append(point)
                for m in last.mig_instances:
                    mig = {**la, "memtrace.mig.id": m.uuid}
                    for spec, mv in ((cat.GPU_MIG_MEMORY_USAGE, m.memory_used_bytes),
                                     (cat.GPU_MIG_MEMORY_LIMIT, m.memory_total_bytes),
                                     *_gpm_shares(m).items()):  # fmt: skip
                        if mv is not None:
                            points.setdefault(spec, []).append(_number(mig, start, now, mv))
            for link in g.nvlinks.values():
                up = _number({**la, "memtrace.nvlink": link.link}, start, now, float(link.active))
                points.setdefault(cat.GPU_NVLINK_UP, []).append(up)
            for spec, v in values.items():
                if v is not None:
                    points.setdefault(spec, []).append(_number(la, start, now, v))
        return [self._metric(spec, pts) for spec, pts in points.items()]

    def _pod_memory_metrics(self, pods: list[PodDeviceMemory], start: int, now: int) -> list[Metric]:
        """Each pod's device memory, its processes' summed (model/memory.device_memory_views)."""
        points: dict[MetricSpec, list[NumberDataPoint]] = {}
        for pod in pods:
            la = {"k8s.pod.uid": pod.pod_uid}
            for spec, v in (
                (cat.POD_MEMORY_IN_USE, pod.traced_bytes),
                (cat.POD_MEMORY_NVML_USED, pod.nvml_bytes),
                (cat.POD_MEMORY_UNATTRIBUTED, pod.unattributed_bytes),
            ):
                if v is not None:
                    points.setdefault(spec, []).append(_number(la, start, now, v))
        return [self._metric(spec, pts) for spec, pts in points.items()]

    def _nvlink_sums(self, host: HostBook, pp: _Points) -> None:
        """Each NVLink's bytes and errors since the agent first sampled it, on the agent's resource."""
        for g in sorted(host.gpus.values(), key=lambda g: g.index):
            hw = _gpu_attributes(g)
            for n, link in sorted(g.nvlinks.items()):
                la = {**hw, "memtrace.nvlink": n}
                for direction, count in (("receive", link.rx), ("transmit", link.tx)):
                    if count.seconds:
                        key: tuple[Any, ...] = ("nvlink_io", AGENT_SERIES, g.uuid, n, direction)
                        dla = {**la, "network.io.direction": direction}
                        pp.sums(key, dla, (cat.GPU_NVLINK_IO,), (count.bytes,))
                for name, label in _NVLINK_ERRORS:
                    if name in link.errors:
                        key = ("nvlink_errors", AGENT_SERIES, g.uuid, n, label)
                        pp.sums(key, {**la, "error.type": label}, (cat.GPU_NVLINK_ERRORS,), (link.errors[name],))

    def _host_counter_metrics(self, host: HostBook, pp: _Points) -> list[Metric]:
        """Each GPU's PCIe bytes where the driver counts them, and each interface's and queue's
        counters, since the agent first sampled them; the interfaces' speed, last utilisation and
        backlog; on the agent's resource."""
        for g in sorted(host.gpus.values(), key=lambda g: g.index):
            if not g.pcie_counted:
                continue
            hw = _gpu_attributes(g)
            for direction, count in (("receive", g.pcie_rx_count), ("transmit", g.pcie_tx_count)):
                gpu_key: tuple[Any, ...] = ("gpu_io", AGENT_SERIES, g.uuid, direction)
                pp.sums(gpu_key, {**hw, "network.io.direction": direction}, (cat.GPU_IO,), (count.bytes,))
        self._nvlink_sums(host, pp)
        for link in host.interface_series():
            i = link.last
            la: dict[str, Any] = {
                "network.interface.name": i.name,
                "memtrace.netns": link.netns,
                "memtrace.host_namespace": link.host_namespace,
            }
            for direction, pre in _NET_DIRECTIONS:
                cur = tuple(link.deltas[f"{pre}_{counter}"] for _, counter in _NET_SUMS)
                key = ("net", AGENT_SERIES, link.netns, i.index, i.name, direction)
                pp.sums(key, {**la, "network.io.direction": direction}, tuple(s for s, _ in _NET_SUMS), cur)
            if i.speed_bits_per_s:
                pp.gauge(cat.NETWORK_LINK_SPEED, la, i.speed_bits_per_s)
            if link.utilization is not None:
                pp.gauge(cat.NETWORK_UTILIZATION, la, link.utilization)
        for q in host.qdisc_series():
            b = q.last
            la = {
                "network.interface.name": b.ifname,
                "memtrace.netns": b.netns,
                "memtrace.qdisc.kind": b.kind,
                "memtrace.qdisc.handle": f"{b.handle >> 16:x}:{b.handle & 0xFFFF:x}",
            }
            key = ("qdisc", AGENT_SERIES, b.netns, b.ifindex, b.handle, b.parent)
            pp.sums(key, la, tuple(s for s, _ in _QDISC_SUMS), tuple(q.deltas[counter] for _, counter in _QDISC_SUMS))
            pp.gauge(cat.QDISC_BACKLOG, la, b.backlog_bytes)
        return [self._metric(spec, pts) for spec, pts in pp.points.items()]

    def build(
        self,
        model: Model,
        stats: dict[Stat, int],
        libraries: int,
        now_ns: int | None = None,
        drain_gap_s: float | None = None,
        host: HostBook | None = None,
        diagnoses: Mapping[ProcessKey, Mapping[str | tuple[str, str], int]] | None = None,
    ) -> Batch:
        """One export of the model. `drain_gap_s`: the worst interval between
        the agent's drain starts since the last export (a gauge, when given).
        `host`: the host signals' readings (per-process CPU and collectives,
        the GPUs), taken under their lock by the caller."""
        now = now_ns or time.time_ns()
        findings = compute_findings(model, self.thresholds, now, host)
        found: dict[ProcessKey, list[Finding]] = {}
        for f in findings:
            found.setdefault(f.key, []).append(f)

        by_process, by_pod = device_memory_views(
            model.processes, nvml_used_by_pid(g.processes for g in host.gpus.values()) if host is not None else {}
        )
        nvml_memory = {v.key: v for v in by_process if v.nvml_bytes is not None}
        new_base = _Base(
            dict(self.base.totals), dict(self.base.durations), dict(self.base.sizes), dict(self.base.time_ns)
        )
        windows: list[tuple[ProcessKey | None, ExpHistogram, tuple[float, float]]] = []
        resource_metrics = []
        keys: list[ProcessKey] = []
        exited = []
        starting: list[Any] = []
        for key, proc in sorted(model.processes.items()):
            copies = proc.copy_view()
            syncs = proc.sync_view()
            m = proc.memory
            if not (
                any(st.calls for st in copies.values()) or syncs or proc.launches or m.allocations or m.unknown_frees
            ):
                if proc.exited:  # nothing to send: gone with the others once this export is delivered
                    exited.append(key)
                continue
            if proc.exited:
                exited.append(key)
            keys.append(key)
            attrs = resource_of({**self.cfg.resource_attributes, **self.host}, key, proc)
            # A cumulative series starts when its counters were certainly zero:
            # the process's start, or this agent's if the agent came later.
            pp = _Points(
                self,
                new_base,
                windows,
                starting,
                now,
                proc.first_seen_ns,
                max(proc.start_ns or proc.first_seen_ns, self.start_ns),
                key,
            )
            sums, hist, gauge, points = pp.sums, pp.hist, pp.gauge, pp.points

            for ck in sorted(copies):
                st = copies[ck]
                if not st.calls:
                    continue
                layer, api, direction, sync, host_memory = describe(ck)
                la = {"direction": direction, "api": api, "layer": layer, "mode": "sync" if sync else "async"}
                if host_memory is not None:
                    la["host_memory"] = host_memory
                start = sums(("copy", *ck), la, COPY_COUNTERS, (st.calls, st.bytes, st.errors))
                hist(("copy.d", *ck), cat.MEMCPY_DURATION, la, st.durations, start)
                hist(("copy.s", *ck), cat.MEMCPY_SIZE, la, st.sizes, start)
            waited = 0
            for (_, api_id), sst in sorted(syncs.items()):
                a = apis.BY_ID.get(api_id)
                la = {
                    "api": apis.api_name(api_id),
                    "layer": a.layer.label if a else "driver",
                    "kind": a.sync.value if a and a.sync else "other",
                }
                start = sums(("sync", key, api_id), la, SYNC_COUNTERS, (sst.calls, sst.duration_ns / 1e9))
                hist(("sync.d", key, api_id), cat.SYNC_DURATION, la, sst.durations, start)
                waited += sst.duration_ns
            if waited:
                wall = proc.wall_ns(now, self.start_ns)
                gauge(cat.SYNC_WALL_TIME_SHARE, {}, waited / wall if wall else 0.0)
            sampled = proc.launch_duty is not None
            for (_, api_id), n in sorted(proc.launches.items()):
                a = apis.BY_ID.get(api_id)
                lattrs: dict[str, Any] = {
                    "api": apis.api_name(api_id),
                    "kind": a.launch.value if a and a.launch else "kernel",
                }
                if sampled:  # the budget sampled its launch probes: partly extrapolated (a series of its own)
                    lattrs["estimated"] = True
                sums(("launch", key, api_id, sampled), lattrs, (cat.LAUNCHES,), (n,))
            if m.allocations or m.unknown_frees or m.failed_allocations:
                cur = (m.allocations, m.allocated_bytes, m.frees, m.freed_bytes, m.unknown_frees, m.failed_allocations)
                start = sums(("mem", key), {}, MEMORY_COUNTERS, cur)
                hist(("mem.s", key), cat.MEMORY_ALLOCATION_SIZE, {}, m.sizes, start)
                gauge(cat.MEMORY_IN_USE, {}, m.in_use_bytes)
                gauge(cat.MEMORY_OUTSTANDING, {}, m.outstanding)
            if proc.book.pinned_bytes:
                gauge(cat.MEMORY_PINNED_HOST, {}, proc.book.pinned_bytes)
            mv = nvml_memory.get(key)
            if mv is not None and mv.nvml_bytes is not None and mv.unattributed_bytes is not None:
                gauge(cat.MEMORY_NVML_USED, {}, mv.nvml_bytes)
                gauge(cat.MEMORY_UNATTRIBUTED, {}, mv.unattributed_bytes)
            cost = model.overhead(key)
            if cost is not None:
                sums(("traps", key), {}, (cat.PROBE_TRAPS,), (cost.traps,))
                if cost.share is not None:
                    gauge(cat.OVERHEAD, {"calibrated": cost.cost.calibrated}, cost.share)
            for f in found.get(key, []):
                # The code alone: the summary holds live figures (a new series at every change); the
                # text goes out as the finding's event (export/events.py).
                gauge(cat.FINDING_VALUE, {"finding": f.code}, f.value)
            steps = model.step_trackers.get(key)
            st_steps = steps.stats() if steps is not None else None
            if st_steps is not None:
                start = sums(("steps", key), {}, (cat.STEPS,), (st_steps.steps,))
                hist(("steps.d", key), cat.STEP_DURATION, {}, st_steps.durations, start)
                gauge(cat.STEP_GPU_IDLE_SHARE, {}, st_steps.share(st_steps.gpu_idle_ns))
            if host is not None:
                self._host_process(host, key, pp)
            waits = model.collective_waits.get(key)
            for coll, (n, ns) in sorted((waits.by_collective if waits is not None else {}).items()):
                sums(("nccl.w", key, int(coll)), {"collective": coll.label}, NCCL_WAIT_COUNTERS, (n, ns / 1e9))
            for (cause, own), n in sorted(_by_cause((diagnoses or {}).get(key, {})).items()):
                la = {"cause": cause, "own_cause": own} if own else {"cause": cause}
                sums(("diag", key, cause, own), la, (cat.DIAGNOSES,), (n,))
            metrics = [self._metric(spec, pts) for spec, pts in points.items()]
            resource_metrics.append(_resource_metrics(Resource(attributes=attrs), metrics))

        health_now = {
            cat.AGENT_EVENTS: stats.get(Stat.EVENTS, 0),
            cat.AGENT_DROPPED_EVENTS: stats.get(Stat.DROPPED, 0),
            cat.AGENT_ABANDONED_CALLS: stats.get(Stat.ABANDONED, 0),
            cat.AGENT_UNTRACKED_CALLS: stats.get(Stat.INFLIGHT_FULL, 0)
            + stats.get(Stat.TOTALS_FULL, 0)
            + stats.get(Stat.COUNTS_FULL, 0),
            cat.AGENT_EXPORT_FAILURES: self.export_failures,
            cat.AGENT_UNSENT_PROCESSES: self.unsent_processes,
            cat.AGENT_CPU_SWITCH_GAPS: host.cpu_gaps.get("switch_gaps", 0) if host is not None else 0,
        }
        hstart = self.base.health_time_ns if self.delta else self.start_ns
        hv = {k: v - self.base.health.get(k.name, 0) for k, v in health_now.items()} if self.delta else health_now
        if self.delta:
            new_base.health = {k.name: v for k, v in health_now.items()}
            new_base.health_time_ns = now
        live = sum(1 for p in model.processes.values() if not p.exited)
        gauges: dict[MetricSpec, float] = {cat.AGENT_LIBRARIES: libraries, cat.AGENT_PROCESSES: live}
        if drain_gap_s is not None:
            gauges[cat.AGENT_DRAIN_GAP] = float(drain_gap_s)
        health = [self._metric(spec, [_number({}, hstart, now, int(v))]) for spec, v in hv.items()]
        health += [self._metric(spec, [_number({}, hstart, now, v)]) for spec, v in gauges.items()]
        health.extend(self._pod_memory_metrics(by_pod, hstart, now))
        if host is not None:
            health.extend(self._gpu_metrics(host, hstart, now))
            agent_points = _Points(self, new_base, windows, starting, now, self.start_ns, self.start_ns, None)
            health.extend(self._host_counter_metrics(host, agent_points))
        resource_metrics.append(_resource_metrics(self.agent_resource, health))

        def commit() -> None:
            if self.delta:
                self.base = new_base
            self.started.update(starting)
            for key in exited:
                self.started.difference_update([k for k in self.started if k[1] == key])

        def rollback() -> None:
            for _key, h, w in windows:
                h.restore_window(w)

        def commit_processes(delivered: set[ProcessKey]) -> None:
            if self.delta:
                tables: tuple[tuple[dict[Any, Any], dict[Any, Any]], ...] = (
                    (self.base.totals, new_base.totals),
                    (self.base.durations, new_base.durations),
                    (self.base.sizes, new_base.sizes),
                    (self.base.time_ns, new_base.time_ns),
                )
                for old, new in tables:
                    for k, v in new.items():
                        if k[1] in delivered:
                            old[k] = v
            for key, h, w in windows:
                if key not in delivered:
                    h.restore_window(w)

        return Batch(
            data=MetricsData(resource_metrics=resource_metrics),
            exited=exited,
            commit=commit,
            rollback=rollback,
            commit_processes=commit_processes,
            keys=keys,
            findings=findings,
        )
