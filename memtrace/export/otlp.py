"""OTLP export: memtrace's exact aggregates as OTLP metrics, pushed by the
OpenTelemetry SDK's own OTLP exporters (HTTP/protobuf or gRPC).

Values are not re-recorded through SDK instruments (one Python call per
copy would cost more than the copy's probe): the SDK's metric data model is
built directly from the exact aggregates and the event histograms, and the
SDK exporter encodes and sends it, with its TLS, headers, compression and
retries.

Metric reference (README.md and METRICS below): gpu.memcpy.* copies
labelled by direction, api, layer, mode (sync|async) and host_memory;
gpu.sync.* waits; gpu.launches; gpu.memory.* device memory; memtrace.finding;
memtrace.agent.* health.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
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
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from memtrace import __version__
from memtrace.analysis.findings import Finding, Thresholds
from memtrace.analysis.findings import compute as compute_findings
from memtrace.core import apis
from memtrace.core.abi import Stat
from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessKey, iso8601_ns
from memtrace.export.config import HistogramKind, Protocol, PushConfig, Temporality
from memtrace.model import Model, describe
from memtrace.model.host import GpuSeries, HostBook
from memtrace.model.process import Process

log = logging.getLogger("memtrace.otlp")

SCOPE = InstrumentationScope(name="memtrace", version=__version__)
MAX_BUCKETS = 160  # OTel's default exponential bucket budget

# Explicit-bucket option: boundaries that are exponential-bucket boundaries
# too, so counts are exact: 2**(k/4) s from ~1 us to 128 s; 2**k B to 1 TiB.
DURATION_BOUNDS = [2.0 ** (k / 4) for k in range(-80, 29)]
SIZE_BOUNDS = [2.0**k for k in range(0, 41)]

COPY_COUNTERS = ("gpu.memcpy.calls", "gpu.memcpy.bytes", "gpu.memcpy.errors")
SYNC_COUNTERS = ("gpu.sync.calls", "gpu.sync.wait_time")
MEMORY_COUNTERS = (
    "gpu.memory.allocations",
    "gpu.memory.allocated",
    "gpu.memory.frees",
    "gpu.memory.freed",
    "gpu.memory.unknown_frees",
    "gpu.memory.failed_allocations",
)
# name -> (kind, description, unit): the metric reference (README.md)
METRICS: dict[str, tuple[str, str, str]] = {
    "gpu.memcpy.calls": ("sum", "CUDA memory copy calls", "{call}"),
    "gpu.memcpy.bytes": ("sum", "Bytes moved by successful CUDA memory copies", "By"),
    "gpu.memcpy.errors": ("sum", "CUDA memory copy calls that returned an error", "{call}"),
    "gpu.memcpy.duration": ("hist", "Duration of each copy call, entry to return (async: the enqueue time)", "s"),
    "gpu.memcpy.size": ("hist", "Bytes of each successful copy call", "By"),
    "gpu.sync.calls": ("sum", "Synchronisation waits (stream, device, event)", "{call}"),
    "gpu.sync.wait_time": ("sum", "Time spent blocked in synchronisation waits", "s"),
    "gpu.sync.duration": ("hist", "Duration of each synchronisation wait", "s"),
    "gpu.sync.wall_time_share": ("gauge", "Share of the process's wall time spent in synchronisation waits", "1"),
    "gpu.launches": ("sum", "Kernel and graph launches, counted once across runtime and driver", "{launch}"),
    "gpu.memory.allocations": (
        "sum",
        "Device memory allocations (device, pitched, async, managed, VMM)",
        "{allocation}",
    ),
    "gpu.memory.allocated": ("sum", "Bytes of device memory allocated", "By"),
    "gpu.memory.frees": ("sum", "Frees of device memory memtrace saw allocated", "{free}"),
    "gpu.memory.freed": ("sum", "Bytes of device memory freed", "By"),
    "gpu.memory.unknown_frees": ("sum", "Frees of addresses memtrace never saw allocated (not subtracted)", "{free}"),
    "gpu.memory.failed_allocations": ("sum", "Device memory allocations that returned an error", "{allocation}"),
    "gpu.memory.allocation.size": ("hist", "Bytes of each device memory allocation", "By"),
    "gpu.memory.in_use": ("gauge", "Device memory allocated and not yet freed", "By"),
    "gpu.memory.outstanding": ("gauge", "Device memory allocations not yet freed", "{allocation}"),
    "gpu.memory.pinned_host": ("gauge", "Page-locked host memory allocated or registered now", "By"),
    "memtrace.finding": ("gauge", "A finding about the process: its headline number, with summary and fix", "1"),
    "memtrace.steps": ("sum", "Steps (iterations) inferred from the process's call stream", "{step}"),
    "memtrace.probe.traps": (
        "sum",
        "Traps memtrace's probes made the process take (entries, returns, launches)",
        "{trap}",
    ),
    "memtrace.overhead": (
        "gauge",
        "Share of the process's CPU time memtrace's probes cost it (estimated: traps x this host's trap cost)",
        "1",
    ),
    "memtrace.step.duration": ("hist", "Duration of each inferred step", "s"),
    "memtrace.step.gpu_idle_share": (
        "gauge",
        "Share of step time the GPU waited for the host: a wait's return to the next copy, wait or launch",
        "1",
    ),
    "memtrace.process.run_queue.time": ("sum", "Time the process's threads were runnable, waiting for a CPU", "s"),
    "memtrace.process.off_cpu.time": ("sum", "Time the process's threads were blocked (sleeping, I/O, locks)", "s"),
    "memtrace.process.on_cpu.time": ("sum", "Time the process's threads ran", "s"),
    "process.context_switches": ("sum", "Context switches of the process's threads", "{context_switch}"),
    "memtrace.diagnoses": ("sum", "Slowdowns diagnosed in the process, by cause", "{diagnosis}"),
    "memtrace.nccl.calls": ("sum", "NCCL collective calls", "{call}"),
    "memtrace.nccl.bytes": ("sum", "Bytes of successful NCCL collective calls (count x datatype size)", "By"),
    "memtrace.nccl.time": ("sum", "Time inside NCCL collective calls (the enqueue)", "s"),
    "memtrace.nccl.waits": ("sum", "Synchronisations that waited for a collective's work", "{wait}"),
    "memtrace.nccl.wait_time": (
        "sum",
        "Time the process then waited for its collectives' work (long on the ranks that wait for a straggler)",
        "s",
    ),
}

CPU_COUNTERS = ("memtrace.process.run_queue.time", "memtrace.process.off_cpu.time", "memtrace.process.on_cpu.time")
NCCL_COUNTERS = ("memtrace.nccl.calls", "memtrace.nccl.bytes", "memtrace.nccl.time")
NCCL_WAIT_COUNTERS = ("memtrace.nccl.waits", "memtrace.nccl.wait_time")

# Host-level readings (NVML), on the agent's resource, one series per GPU (hw.id: its UUID): the last sample.
GPU_GAUGES: dict[str, tuple[str, str]] = {
    "hw.gpu.utilization": ("Share of time a kernel ran on the GPU (NVML)", "1"),
    "hw.gpu.memory.usage": ("GPU memory used (NVML)", "By"),
    "hw.gpu.memory.limit": ("GPU memory size (NVML)", "By"),
    "hw.power": ("Power drawn by the GPU (NVML)", "W"),
    "memtrace.gpu.temperature": ("GPU temperature (NVML)", "Cel"),
    "memtrace.gpu.pcie.link.width": ("PCIe link width now (lanes)", "{lane}"),
    "memtrace.gpu.pcie.link.max_width": ("PCIe link width the GPU and slot can do", "{lane}"),
    "memtrace.gpu.pcie.link.generation": ("PCIe link generation now", "1"),
    "memtrace.gpu.pcie.link.max_generation": ("PCIe link generation the GPU and slot can do", "1"),
    "memtrace.gpu.pcie.replays": ("PCIe replays since the agent started (NVML)", "{replay}"),
    "memtrace.gpu.throttled": ("1 while power or thermal limits hold the clocks down", "1"),
    "memtrace.gpu.lost": ("1 while the GPU is off the bus", "1"),
}

# Network interfaces of the namespaces the traced processes live in (rtnetlink), on the agent's
# resource: counters since the agent's first sample (OTel semantic conventions' system.network.*),
# one series per (namespace, interface, direction); queueing disciplines as memtrace.qdisc.*.
HOST_COUNTERS: dict[str, tuple[str, str, str]] = {
    "hw.gpu.io": ("sum", "Bytes the GPU received and transmitted over PCIe (the driver's byte counters)", "By"),
    "system.network.io": ("sum", "Bytes received and sent by the interface", "By"),
    "system.network.packet.count": ("sum", "Packets received and sent by the interface", "{packet}"),
    "system.network.packet.dropped": ("sum", "Packets the interface dropped", "{packet}"),
    "system.network.errors": ("sum", "Receive and transmit errors of the interface", "{error}"),
    "memtrace.network.link.speed": ("gauge", "Link speed the driver reports (absent: it does not say)", "bit/s"),
    "memtrace.network.utilization": (
        "gauge",
        "The busier direction's share of the link speed over the last sampling interval",
        "1",
    ),
    "memtrace.qdisc.bytes": ("sum", "Bytes the queueing discipline sent", "By"),
    "memtrace.qdisc.drops": ("sum", "Packets the queueing discipline dropped", "{packet}"),
    "memtrace.qdisc.overlimits": (
        "sum",
        "Times the queueing discipline held a packet back for its rate (the link is saturated)",
        "{event}",
    ),
    "memtrace.qdisc.backlog": ("gauge", "Bytes queued in the queueing discipline now", "By"),
}
_NET_DIRECTIONS = (("receive", "rx"), ("transmit", "tx"))
_NET_SUMS = (
    ("system.network.io", "bytes"),
    ("system.network.packet.count", "packets"),
    ("system.network.packet.dropped", "dropped"),
    ("system.network.errors", "errors"),
)
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

    def processes_in(self, resources: int) -> set[ProcessKey]:
        """The processes of the first `resources` resources of this export."""
        return set(self.keys[:resources])


def _printable(s: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in s)


def grpc_insecure(cfg: PushConfig) -> bool:
    """Plaintext gRPC: asked for, or an http:// endpoint."""
    return cfg.insecure or cfg.endpoint.startswith("http://")


def grpc_credentials(cfg: PushConfig) -> Any:
    """TLS credentials for gRPC from the configured CA and client key and
    certificate (None when plaintext)."""
    import grpc

    if grpc_insecure(cfg):
        return None
    root = open(cfg.certificate, "rb").read() if cfg.certificate else None
    key = open(cfg.client_key, "rb").read() if cfg.client_key else None
    chain = open(cfg.client_certificate, "rb").read() if cfg.client_certificate else None
    return grpc.ssl_channel_credentials(root, key, chain)


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
    (its container, pod), then BPF's identity, which wins; the host's
    executable name is the untruncated one, BPF's comm the fallback."""
    attrs = dict(base)
    attrs.update(proc.attributes)
    attrs.update(process_resource(key, proc.start_ns))
    if proc.name:
        attrs.setdefault("process.executable.name", _printable(proc.name))
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
        self.points: dict[str, list[Any]] = {}

    def sums(self, key: Any, la: dict[str, Any], names: tuple[str, ...], cur: tuple[Any, ...]) -> int:
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
                for name in names:
                    self.points.setdefault(name, []).append(_number(la, start, start, 0))
        for name, v in zip(names, vals, strict=True):
            self.points.setdefault(name, []).append(_number(la, start, now, v))
        return start

    def hist(self, key: Any, name: str, la: dict[str, Any], h: ExpHistogram, start: int, unit: str) -> None:
        b = self.b
        if b.delta:
            cur = h.minus(b.base.durations.get(key) or ExpHistogram(h.scale))
            self.new_base.durations[key] = h.copy()
        else:
            cur = h
        w = h.take_window()
        self.windows.append((self.key, h, w))
        bounds = (DURATION_BOUNDS, 2, -80) if unit == "s" else (SIZE_BOUNDS, 0, 0)
        self.points.setdefault(name, []).append(b._hist_point(la, cur, w, start, self.now, *bounds))

    def gauge(self, name: str, la: dict[str, Any], v: float) -> None:
        self.points.setdefault(name, []).append(_number(la, self.series_start, self.now, v))


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

    def _hist_metric(self, name: str, desc: str, unit: str, points: list[Any]) -> Metric:
        data: Histogram | ExponentialHistogram
        if self.cfg.histogram == HistogramKind.explicit:
            data = Histogram(data_points=points, aggregation_temporality=self._temporality())
        else:
            data = ExponentialHistogram(data_points=points, aggregation_temporality=self._temporality())
        return Metric(name=name, description=desc, unit=unit, data=data)

    def _metric(self, name: str, points: list[Any], tmp: AggregationTemporality) -> Metric:
        kind, desc, unit = METRICS[name]
        if kind == "hist":
            return self._hist_metric(name, desc, unit, points)
        if kind == "gauge":
            return Metric(name=name, description=desc, unit=unit, data=Gauge(data_points=points))
        return Metric(
            name=name,
            description=desc,
            unit=unit,
            data=Sum(data_points=points, aggregation_temporality=tmp, is_monotonic=True),
        )

    def _host_process(self, host: HostBook, key: ProcessKey, pp: _Points) -> None:
        """A process's CPU time and collectives, from the host signals."""
        cpu = host.cpu_of(key)
        if cpu is not None:
            pp.sums(("cpu", key), {}, CPU_COUNTERS, (cpu.runq_ns / 1e9, cpu.offcpu_ns / 1e9, cpu.oncpu_ns / 1e9))
            for kind, n in (("voluntary", cpu.voluntary), ("involuntary", cpu.involuntary)):
                pp.sums(("ctx", key, kind), {"process.context_switch_type": kind}, ("process.context_switches",), (n,))
        for coll, t in host.collectives_of(key):
            if t.calls:
                cur = (t.calls, t.bytes, t.duration_ns / 1e9)
                pp.sums(("nccl", key, int(coll)), {"collective": coll.label}, NCCL_COUNTERS, cur)

    def _gpu_metrics(self, host: HostBook, start: int, now: int) -> list[Metric]:
        points: dict[str, list[NumberDataPoint]] = {}
        for g in sorted(host.gpus.values(), key=lambda g: g.index):
            la = _gpu_attributes(g)
            latest, last = g.latest, g.last
            values: dict[str, float | None] = {"memtrace.gpu.lost": float(bool(latest and latest.lost))}
            if latest is not None and not latest.lost:
                sm = latest.sm_utilization_percent
                values["hw.gpu.utilization"] = None if sm is None else sm / 100
                values["memtrace.gpu.throttled"] = None if latest.throttled is None else float(latest.throttled)
            if last is not None:
                values.update(
                    {
                        "hw.gpu.memory.usage": last.memory_used_bytes,
                        "hw.gpu.memory.limit": last.memory_total_bytes,
                        "hw.power": None if last.power_milliwatts is None else last.power_milliwatts / 1000,
                        "memtrace.gpu.temperature": last.temperature_celsius,
                        "memtrace.gpu.pcie.link.width": last.link_width,
                        "memtrace.gpu.pcie.link.max_width": last.max_link_width,
                        "memtrace.gpu.pcie.link.generation": last.link_generation,
                        "memtrace.gpu.pcie.link.max_generation": last.max_link_generation,
                        "memtrace.gpu.pcie.replays": g.replays_since_start(),
                    }
                )
            for name, v in values.items():
                if v is not None:
                    points.setdefault(name, []).append(_number(la, start, now, v))
        return [
            Metric(name=n, description=GPU_GAUGES[n][0], unit=GPU_GAUGES[n][1], data=Gauge(data_points=pts))
            for n, pts in points.items()
        ]

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
                pp.sums(gpu_key, {**hw, "network.io.direction": direction}, ("hw.gpu.io",), (count.bytes,))
        for link in host.interface_series():
            i = link.last
            la: dict[str, Any] = {
                "network.interface.name": i.name,
                "memtrace.netns": link.netns,
                "memtrace.host_namespace": link.host_namespace,
            }
            for direction, pre in _NET_DIRECTIONS:
                cur = tuple(link.deltas[f"{pre}_{c}"] for _, c in _NET_SUMS)
                key = ("net", AGENT_SERIES, link.netns, i.index, i.name, direction)
                pp.sums(key, {**la, "network.io.direction": direction}, tuple(n for n, _ in _NET_SUMS), cur)
            if i.speed_bits_per_s:
                pp.gauge("memtrace.network.link.speed", la, i.speed_bits_per_s)
            if link.utilization is not None:
                pp.gauge("memtrace.network.utilization", la, link.utilization)
        for q in host.qdisc_series():
            b = q.last
            la = {
                "network.interface.name": b.ifname,
                "memtrace.netns": b.netns,
                "memtrace.qdisc.kind": b.kind,
                "memtrace.qdisc.handle": f"{b.handle >> 16:x}:{b.handle & 0xFFFF:x}",
            }
            key = ("qdisc", AGENT_SERIES, b.netns, b.ifindex, b.handle, b.parent)
            names = ("memtrace.qdisc.bytes", "memtrace.qdisc.drops", "memtrace.qdisc.overlimits")
            pp.sums(key, la, names, (q.deltas["bytes"], q.deltas["drops"], q.deltas["overlimits"]))
            pp.gauge("memtrace.qdisc.backlog", la, b.backlog_bytes)
        tmp = self._temporality()
        out = []
        for name, pts in pp.points.items():
            kind, desc, unit = HOST_COUNTERS[name]
            data: Sum | Gauge
            if kind == "gauge":
                data = Gauge(data_points=pts)
            else:
                data = Sum(data_points=pts, aggregation_temporality=tmp, is_monotonic=True)
            out.append(Metric(name=name, description=desc, unit=unit, data=data))
        return out

    def build(
        self,
        model: Model,
        stats: dict[Stat, int],
        libraries: int,
        now_ns: int | None = None,
        drain_gap_s: float | None = None,
        host: HostBook | None = None,
        diagnoses: dict[ProcessKey, dict[str, int]] | None = None,
    ) -> Batch:
        """One export of the model. `drain_gap_s`: the worst interval between
        the agent's drain starts since the last export (a gauge, when given).
        `host`: the host signals' readings (per-process CPU and collectives,
        the GPUs), taken under their lock by the caller."""
        now = now_ns or time.time_ns()
        tmp = self._temporality()
        found: dict[ProcessKey, list[Finding]] = {}
        for f in compute_findings(model, self.thresholds, now):
            found.setdefault(f.key, []).append(f)

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
                hist(("copy.d", *ck), "gpu.memcpy.duration", la, st.durations, start, "s")
                hist(("copy.s", *ck), "gpu.memcpy.size", la, st.sizes, start, "By")
            waited = 0
            for (_, api_id), sst in sorted(syncs.items()):
                a = apis.BY_ID.get(api_id)
                la = {
                    "api": apis.api_name(api_id),
                    "layer": a.layer.label if a else "driver",
                    "kind": a.sync.value if a and a.sync else "other",
                }
                start = sums(("sync", key, api_id), la, SYNC_COUNTERS, (sst.calls, sst.duration_ns / 1e9))
                hist(("sync.d", key, api_id), "gpu.sync.duration", la, sst.durations, start, "s")
                waited += sst.duration_ns
            if waited:
                wall = proc.wall_ns(now, self.start_ns)
                gauge("gpu.sync.wall_time_share", {}, waited / wall if wall else 0.0)
            sampled = proc.launch_duty is not None
            for (_, api_id), n in sorted(proc.launches.items()):
                a = apis.BY_ID.get(api_id)
                lattrs: dict[str, Any] = {
                    "api": apis.api_name(api_id),
                    "kind": a.launch.value if a and a.launch else "kernel",
                }
                if sampled:  # the budget sampled its launch probes: partly extrapolated (a series of its own)
                    lattrs["estimated"] = True
                sums(("launch", key, api_id, sampled), lattrs, ("gpu.launches",), (n,))
            if m.allocations or m.unknown_frees or m.failed_allocations:
                cur = (m.allocations, m.allocated_bytes, m.frees, m.freed_bytes, m.unknown_frees, m.failed_allocations)
                start = sums(("mem", key), {}, MEMORY_COUNTERS, cur)
                hist(("mem.s", key), "gpu.memory.allocation.size", {}, m.sizes, start, "By")
                gauge("gpu.memory.in_use", {}, m.in_use_bytes)
                gauge("gpu.memory.outstanding", {}, m.outstanding)
            if proc.book.pinned_bytes:
                gauge("gpu.memory.pinned_host", {}, proc.book.pinned_bytes)
            cost = model.overhead(key)
            if cost is not None:
                sums(("traps", key), {}, ("memtrace.probe.traps",), (cost.traps,))
                if cost.share is not None:
                    gauge("memtrace.overhead", {"calibrated": cost.cost.calibrated}, cost.share)
            for f in found.get(key, []):
                gauge("memtrace.finding", {"finding": f.code, "summary": f.summary, "fix": f.fix}, f.value)
            steps = model.step_trackers.get(key)
            st_steps = steps.stats() if steps is not None else None
            if st_steps is not None:
                start = sums(("steps", key), {}, ("memtrace.steps",), (st_steps.steps,))
                hist(("steps.d", key), "memtrace.step.duration", {}, st_steps.durations, start, "s")
                gauge("memtrace.step.gpu_idle_share", {}, st_steps.share(st_steps.gpu_idle_ns))
            if host is not None:
                self._host_process(host, key, pp)
            waits = model.collective_waits.get(key)
            for coll, (n, ns) in sorted((waits.by_collective if waits is not None else {}).items()):
                sums(("nccl.w", key, int(coll)), {"collective": coll.label}, NCCL_WAIT_COUNTERS, (n, ns / 1e9))
            for cause, n in sorted((diagnoses or {}).get(key, {}).items()):
                sums(("diag", key, cause), {"cause": cause}, ("memtrace.diagnoses",), (n,))
            metrics = [self._metric(name, pts, tmp) for name, pts in points.items()]
            resource_metrics.append(_resource_metrics(Resource(attributes=attrs), metrics))

        health_now = {
            "events": stats.get(Stat.EVENTS, 0),
            "dropped": stats.get(Stat.DROPPED, 0),
            "abandoned": stats.get(Stat.ABANDONED, 0),
            "untracked": stats.get(Stat.INFLIGHT_FULL, 0)
            + stats.get(Stat.TOTALS_FULL, 0)
            + stats.get(Stat.COUNTS_FULL, 0),
            "export_failures": self.export_failures,
            "unsent_processes": self.unsent_processes,
            "cpu_switch_gaps": host.cpu_gaps.get("switch_gaps", 0) if host is not None else 0,
        }
        hstart = self.base.health_time_ns if self.delta else self.start_ns
        hv = {k: v - self.base.health.get(k, 0) for k, v in health_now.items()} if self.delta else health_now
        if self.delta:
            new_base.health = health_now
            new_base.health_time_ns = now
        live = sum(1 for p in model.processes.values() if not p.exited)

        def counter(name: str, desc: str, unit: str, key: str) -> Metric:
            return Metric(
                name=name,
                description=desc,
                unit=unit,
                data=Sum(
                    data_points=[_number({}, hstart, now, int(hv[key]))], aggregation_temporality=tmp, is_monotonic=True
                ),
            )

        health = [
            counter("memtrace.agent.events", "Per-call events received from the kernel", "{event}", "events"),
            counter(
                "memtrace.agent.dropped_events", "Events lost to a full ring (totals stay exact)", "{event}", "dropped"
            ),
            counter(
                "memtrace.agent.abandoned_calls", "Calls whose thread exited before returning", "{call}", "abandoned"
            ),
            counter(
                "memtrace.agent.untracked_calls",
                "Calls not measured because a kernel map was full",
                "{call}",
                "untracked",
            ),
            counter("memtrace.agent.export_failures", "Pushes that failed", "{push}", "export_failures"),
            counter(
                "memtrace.agent.unsent_processes",
                "Exited processes dropped unsent during an outage (memory bound)",
                "{process}",
                "unsent_processes",
            ),
            counter(
                "memtrace.agent.cpu_switch_gaps",
                "Times the kernel's sched tracepoints skipped a traced thread's switch (its CPU time stays exact)",
                "{gap}",
                "cpu_switch_gaps",
            ),
            Metric(
                name="memtrace.agent.libraries",
                description="CUDA libraries and executables with probes",
                unit="{library}",
                data=Gauge(data_points=[_number({}, hstart, now, libraries)]),
            ),
            Metric(
                name="memtrace.agent.processes",
                description="CUDA processes traced now",
                unit="{process}",
                data=Gauge(data_points=[_number({}, hstart, now, live)]),
            ),
        ]
        if drain_gap_s is not None:
            health.append(
                Metric(
                    name="memtrace.agent.drain_gap",
                    description="Worst interval between the starts of two ring drains since the previous export",
                    unit="s",
                    data=Gauge(data_points=[_number({}, hstart, now, float(drain_gap_s))]),
                )
            )
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
        )


REQUEST_POINTS = 2000  # data points per request of an export (whole processes each)


def split_by_resource(data: MetricsData, max_points: int) -> list[MetricsData]:
    """The export's resources (a process each) in groups of about max_points
    data points; a resource is never split."""
    parts: list[MetricsData] = []
    group: list[Any] = []
    points = 0
    for rm in data.resource_metrics:
        n = sum(len(m.data.data_points) for sm in rm.scope_metrics for m in sm.metrics)
        if group and points + n > max_points:
            parts.append(MetricsData(resource_metrics=group))
            group, points = [], 0
        group.append(rm)
        points += n
    if group or not parts:
        parts.append(MetricsData(resource_metrics=group))
    return parts


class _Complaints(logging.Handler):
    """Collects what the exporter says during one export instead of letting it
    log each retry; the first specific cause is the reason users need."""

    GENERIC = ("due to timeout, max retries or shutdown", "Failed to export")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a logging handler must not raise
            self.messages.append(str(record.msg))

    @property
    def reason(self) -> str:
        specific = [m for m in self.messages if not any(g in m for g in self.GENERIC)]
        return (specific or self.messages or [""])[0]


BODY_CHARS = 200  # of a refusal's body, in a reason


def _first_line(body: bytes, content_type: str) -> str:
    """What a refusal's body says, in one bounded line: an OTLP collector's
    protobuf google.rpc.Status gives its message; text gives its first line."""
    text = ""
    if "protobuf" in content_type:
        try:
            from google.rpc.status_pb2 import Status

            text = Status.FromString(body).message
        except Exception:  # noqa: BLE001 - a body that is not a Status is said as it is
            text = ""
    if not text:
        text = body.decode("utf-8", errors="replace")
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= BODY_CHARS else line[: BODY_CHARS - 3] + "..."


def _os_cause(e: BaseException) -> OSError | None:
    """The operating system's error under a requests/urllib3 one (refused,
    unreachable, unknown host), found through their chains of causes."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.strerror:
            return x
        nxt = [x.__cause__, x.__context__, getattr(x, "reason", None), *x.args]
        todo.extend(n for n in nxt if isinstance(n, BaseException))
    return None


def _recording_session(pin_ca: bool) -> Any:
    """A requests session (the SDK exporter's public `session=` argument) that
    keeps the first failure of each export: the SDK logs only a generic line.
    With `pin_ca` it also keeps the configured CA: requests otherwise lets
    REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment replace it."""
    import requests

    class RecordingSession(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            self.failure: str = ""
            self.failed_error: BaseException | None = None

        def reset(self) -> None:
            self.failure, self.failed_error = "", None

        def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
            try:
                resp = super().request(method, url, *args, **kwargs)
            except Exception as e:
                # The first failure of an export is its cause; later retries
                # may only fail for lack of time left.
                if not self.failure:
                    self.failure, self.failed_error = "error", e
                raise
            if resp.status_code >= 400 and not self.failure:
                line = _first_line(resp.content or b"", resp.headers.get("content-type", ""))
                self.failure = f"HTTP {resp.status_code}" + (f" {resp.reason}" if resp.reason else "")
                self.failure += f": {line}" if line else ""
            return resp

        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if pin_ca:
                settings["verify"] = self.verify
            return settings

    return RecordingSession()


class Exporter:
    """The SDK's OTLP exporter for the configured protocol; failures become a reason string."""

    def __init__(self, cfg: PushConfig) -> None:
        self.cfg = cfg
        self.complaints = _Complaints()
        for name in (
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            "opentelemetry.exporter.otlp.proto.grpc.exporter",
            "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
            "opentelemetry.exporter.otlp.proto.http",
            "opentelemetry.exporter.otlp.proto.grpc",
        ):
            lg = logging.getLogger(name)
            lg.addHandler(self.complaints)
            lg.propagate = False
        compression: Any = None
        self._session: Any = None  # the HTTP transport's, keeping why a push failed
        if cfg.protocol == Protocol.http:
            from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

            if cfg.compression:
                compression = HttpCompression.Gzip
            else:
                compression = HttpCompression.NoCompression
            self._session = _recording_session(pin_ca=bool(cfg.certificate))
            self._exp: Any = HttpExporter(
                session=self._session,
                endpoint=cfg.endpoint,
                certificate_file=cfg.certificate,
                client_key_file=cfg.client_key,
                client_certificate_file=cfg.client_certificate,
                headers=cfg.headers,
                timeout=cfg.timeout,
                compression=compression,
            )
        else:
            import grpc
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

            if cfg.compression:
                compression = grpc.Compression.Gzip
            self._exp = GrpcExporter(
                endpoint=cfg.endpoint,
                insecure=grpc_insecure(cfg),
                credentials=grpc_credentials(cfg),
                headers=cfg.headers,
                timeout=cfg.timeout,
                compression=compression,
            )

    def _where(self) -> tuple[str, int]:
        import urllib.parse

        u = urllib.parse.urlsplit(self.cfg.endpoint if "://" in self.cfg.endpoint else f"//{self.cfg.endpoint}")
        return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)

    def _transport_failure(self) -> str:
        """Why the HTTP transport failed, as the user can act on it."""
        s = self._session
        if s is None or not s.failure:
            return ""
        if s.failed_error is None:
            return str(s.failure)
        import requests

        host, port = self._where()
        e = s.failed_error
        if isinstance(e, requests.exceptions.SSLError):
            return f"TLS handshake with {host}:{port} failed: {_os_cause(e) or e}"
        if isinstance(e, requests.exceptions.Timeout):
            return f"no answer from {host}:{port} within {self.cfg.timeout:g}s"
        cause = _os_cause(e)
        if isinstance(e, requests.exceptions.ConnectionError) and cause is not None:
            return f"cannot connect to {host}:{port}: {cause.strerror}"
        return f"{type(e).__name__}: {e}"

    def _probe(self) -> str:
        """Name a connection failure ourselves when the exporter did not."""
        import socket

        host, port = self._where()
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError as e:
            return f"cannot connect to {host}:{port}: {e.strerror or e}"
        return ""

    def export(self, data: MetricsData) -> tuple[bool, str, int]:
        """Push one export, in requests of at most REQUEST_POINTS points
        (whole processes each): encoding 25k points at once cost 50 MB of
        resident memory at 1000 processes. Returns success, the reason of a
        failure, and how many resources (from the first) were delivered: a
        delta export delivered in part must advance those processes alone."""
        delivered = 0
        for part in split_by_resource(data, REQUEST_POINTS):
            ok, why = self._export(part)
            if not ok:
                return False, why, delivered
            delivered += len(part.resource_metrics)
        return True, "", delivered

    def _export(self, data: MetricsData) -> tuple[bool, str]:
        self.complaints.messages = []
        if self._session is not None:
            self._session.reset()
        try:
            ok = self._exp.export(data, timeout_millis=self.cfg.timeout * 1000) == MetricExportResult.SUCCESS
        except Exception as e:  # noqa: BLE001 - any exporter failure is an outage, not a crash
            return False, f"{type(e).__name__}: {e}"
        if ok:
            return True, ""
        specific = [m for m in self.complaints.messages if not any(g in m for g in _Complaints.GENERIC)]
        reason = self._transport_failure() or (specific[0] if specific else "") or self._probe()
        return False, reason or self.complaints.reason or "the collector refused the push"

    def shutdown(self) -> None:
        try:
            self._exp.shutdown(timeout_millis=1000)
        except Exception:  # noqa: BLE001
            pass
