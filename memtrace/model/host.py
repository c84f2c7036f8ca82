"""What the host did around the traced processes, over a run: the CPU each
process got (the CPU sensor), the GPUs (NVML), the network interfaces of the
namespaces the processes live in (rtnetlink) and their collectives (the
NCCL sensor). Pure folding of readings the runtime takes on its sampling
timer; the report turns `view()` into the summary's `host` and
`collectives` (README, "JSON summary").

Every figure is the sensor's own, or a delta of two of its cumulative
counters: nothing is estimated. A sensor that is off says so and why
(`sensors`), and its section is empty rather than zero. GPU readings that
NVML could not give are left out of the means and maxima, and counted
(`samples`) so a reader can tell a quiet GPU from one never read.

Bounded: per GPU a fixed set of running sums; per interface and qdisc the
first and last sample and a few maxima; per process one CpuStats and one
row per collective, at most `max_processes` processes (the oldest first
seen are folded out and counted in `processes_dropped`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from memtrace.core.cpu import CpuStats
from memtrace.core.gpu import GpuSample, counter_delta
from memtrace.core.nccl import CallTotals, Collective
from memtrace.core.netdev import IFACE_COUNTERS, QDISC_COUNTERS, NetSnapshot, net_rates

MAX_PROCESSES = 4096
TOP_PREEMPTORS = 5


@dataclass
class SensorState:
    """One host sensor: on, or off with the reason and the fix."""

    on: bool
    reason: str = ""
    fix: str = ""

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": "on" if self.on else "off"}
        if not self.on:
            out.update(reason=self.reason, fix=self.fix)
        return out


@dataclass
class _Series:
    """Mean and maximum of one reading over the samples that had it."""

    n: int = 0
    total: float = 0.0
    most: float | None = None

    def add(self, v: float | None, n: int = 1, most: float | None = None) -> None:
        """One reading, or the mean `v` of n readings whose maximum was `most`."""
        if v is None or n <= 0:
            return
        self.n += n
        self.total += v * n
        m = v if most is None else most
        self.most = m if self.most is None else max(self.most, m)

    def row(self, scale: float = 1.0) -> dict[str, float] | None:
        if not self.n or self.most is None:
            return None
        return {"mean": self.total / self.n * scale, "max": self.most * scale}


@dataclass
class _ByteCounter:
    """A cumulative byte counter, between the first and last samples that had it: exact bytes over
    exact seconds, and the busiest interval between two samples."""

    bytes: int = 0
    seconds: float = 0.0
    most: float | None = None
    resets: int = 0  # went down (the driver reloaded): counted from zero

    def add(self, before: int | None, after: int | None, seconds: float) -> None:
        delta, reset = counter_delta(before, after)
        if delta is None or seconds <= 0:
            return
        self.bytes += delta
        self.seconds += seconds
        self.resets += reset
        rate = delta / seconds
        self.most = rate if self.most is None else max(self.most, rate)

    def row(self) -> dict[str, float] | None:
        if not self.seconds or self.most is None:
            return None
        return {"mean": self.bytes / self.seconds, "max": self.most}


@dataclass
class GpuSeries:
    index: int
    uuid: str
    name: str
    bus_id: str
    first: GpuSample | None = None  # the first and last detailed samples: cumulative counters
    last: GpuSample | None = None
    latest: GpuSample | None = None  # the last sample, detailed or not
    samples: int = 0
    lost_samples: int = 0
    sm: _Series = field(default_factory=_Series)
    mem_util: _Series = field(default_factory=_Series)
    memory_used: _Series = field(default_factory=_Series)
    temperature: _Series = field(default_factory=_Series)
    power: _Series = field(default_factory=_Series)
    pcie_tx: _Series = field(default_factory=_Series)
    pcie_rx: _Series = field(default_factory=_Series)
    pcie_tx_count: _ByteCounter = field(default_factory=_ByteCounter)  # where the driver counts PCIe bytes
    pcie_rx_count: _ByteCounter = field(default_factory=_ByteCounter)
    pcie_counted: bool = False
    throttled_samples: int = 0
    clock_samples: int = 0
    reasons: set[str] = field(default_factory=set)
    degraded_samples: int = 0
    link_samples: int = 0
    narrowest: tuple[int, int] | None = None  # (generation, width) at the lowest width seen
    xids: list[int] = field(default_factory=list)
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> GPU memory at its last sample

    def add(self, s: GpuSample) -> None:
        self.samples += 1
        self.latest = s
        if s.lost:
            self.lost_samples += 1
            self.xids.extend(s.xids)
            return
        n = s.utilization_readings if s.utilization_readings is not None else 1
        self.sm.add(s.sm_utilization_percent, n, s.sm_utilization_max)
        self.mem_util.add(s.memory_utilization_percent, n, s.memory_utilization_max)
        self.xids.extend(s.xids)
        if s.clock_event_mask is not None:
            self.reasons.update(s.clock_event_reasons or ())
            if s.clock_readings is not None and s.throttled_readings is not None:
                self.clock_samples += s.clock_readings
                self.throttled_samples += s.throttled_readings
            else:
                self.clock_samples += 1
                self.throttled_samples += bool(s.throttled)
        if not s.detail:
            return
        if self.first is None:
            self.first = s
        prev, self.last = self.last, s
        if s.pcie_tx_bytes is not None or s.pcie_rx_bytes is not None:
            self.pcie_counted = True
            if prev is not None:
                seconds = (s.time_ns - prev.time_ns) / 1e9
                self.pcie_tx_count.add(prev.pcie_tx_bytes, s.pcie_tx_bytes, seconds)
                self.pcie_rx_count.add(prev.pcie_rx_bytes, s.pcie_rx_bytes, seconds)
        self.memory_used.add(s.memory_used_bytes)
        self.temperature.add(s.temperature_celsius)
        self.power.add(s.power_milliwatts)
        self.pcie_tx.add(s.pcie_tx_bytes_per_s)
        self.pcie_rx.add(s.pcie_rx_bytes_per_s)
        degraded = s.link_degraded
        if degraded is not None:
            self.link_samples += 1
            self.degraded_samples += degraded
        if s.link_width is not None and s.link_generation is not None:
            if self.narrowest is None or (s.link_width, s.link_generation) < (self.narrowest[1], self.narrowest[0]):
                self.narrowest = (s.link_generation, s.link_width)
        for p in s.processes:
            self.processes[p.pid] = p.used_memory_bytes

    def _delta(self, name: str) -> int | None:
        if self.first is None or self.last is None:
            return None
        return counter_delta(getattr(self.first, name), getattr(self.last, name))[0]

    def _pcie_rows(self) -> dict[str, Any]:
        """PCIe throughput: exact from the driver's byte counters, or NVML's 20 ms estimates."""
        if self.pcie_counted:
            tx, rx = self.pcie_tx_count, self.pcie_rx_count
            return {
                "pcie_throughput_from": "byte_counters",
                "pcie_tx_bytes_per_second": tx.row(),
                "pcie_rx_bytes_per_second": rx.row(),
                "pcie_tx_bytes": tx.bytes if tx.seconds else None,
                "pcie_rx_bytes": rx.bytes if rx.seconds else None,
                "pcie_counter_resets": tx.resets + rx.resets,
            }
        sampled = bool(self.pcie_tx.n or self.pcie_rx.n)
        return {
            "pcie_throughput_from": "20ms_samples" if sampled else None,
            "pcie_tx_bytes_per_second": self.pcie_tx.row(),
            "pcie_rx_bytes_per_second": self.pcie_rx.row(),
            "pcie_tx_bytes": None,
            "pcie_rx_bytes": None,
            "pcie_counter_resets": 0,
        }

    def replays_since_start(self) -> int | None:
        return self._delta("pcie_replay_count")

    def row(self, pids: set[int] | None) -> dict[str, Any]:
        last = self.last
        link = None
        if last is not None and last.max_link_width is not None:
            link = {
                "generation": last.link_generation,
                "width": last.link_width,
                "max_generation": last.max_link_generation,
                "max_width": last.max_link_width,
                "lowest_seen": None
                if self.narrowest is None
                else {"generation": self.narrowest[0], "width": self.narrowest[1]},
                "degraded_share": self.degraded_samples / self.link_samples if self.link_samples else None,
            }
        power = self.power.row(1e-3)
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "bus_id": self.bus_id,
            "samples": self.samples,
            "lost_samples": self.lost_samples,
            "sm_utilization_percent": self.sm.row(),
            "memory_utilization_percent": self.mem_util.row(),
            "memory_used_bytes": self.memory_used.row(),
            "memory_total_bytes": None if last is None else last.memory_total_bytes,
            "temperature_celsius": self.temperature.row(),
            "power_watts": power,
            **self._pcie_rows(),
            "pcie_link": link,
            "pcie_replays": self._delta("pcie_replay_count"),
            "ecc_corrected_errors": self._delta("ecc_corrected_volatile"),
            "ecc_uncorrected_errors": self._delta("ecc_uncorrected_volatile"),
            "clock_event_reasons": sorted(self.reasons),
            "throttled_share": self.throttled_samples / self.clock_samples if self.clock_samples else None,
            "xids": list(self.xids),
            "processes": [
                {"pid": pid, "used_memory_bytes": used}
                for pid, used in sorted(self.processes.items())
                if pids is None or pid in pids
            ],
        }


@dataclass
class _Link:
    """One interface (or qdisc) between its first and last sample, with the busiest window."""

    first: Any
    last: Any
    t_first: int  # CLOCK_MONOTONIC ns of the samples
    t_last: int
    windows: int = 0
    peak_utilization: float | None = None
    last_utilization: float | None = None
    peak_rx: float | None = None  # the busiest fast-sampler tick's rates, bytes per second
    peak_tx: float | None = None
    peak_backlog_bytes: int = 0
    resets: int = 0
    totals: dict[str, int] = field(default_factory=dict)  # increase of each counter, window by window

    def counted(self, names: tuple[str, ...]) -> dict[str, int]:
        """Each counter's increase since the first sample: the sum of the
        windows' increases, so a reset (the interface re-created) neither
        goes negative nor loses what came before it."""
        return {n: self.totals.get(n, 0) for n in names}

    def fold(self, deltas: dict[str, int]) -> None:
        for n, v in deltas.items():
            self.totals[n] = self.totals.get(n, 0) + v


@dataclass(frozen=True)
class InterfaceSeries:
    """One interface as the export reads it: its counters since the first sample."""

    netns: int
    host_namespace: bool
    last: Any  # InterfaceSample
    deltas: dict[str, int]  # IFACE_COUNTERS
    utilization: float | None  # over the last sampling interval


@dataclass(frozen=True)
class QdiscSeries:
    last: Any  # QdiscSample
    deltas: dict[str, int]  # QDISC_COUNTERS


class HostBook:
    """The host readings of one run (or one push interval), folded."""

    def __init__(self, max_processes: int = MAX_PROCESSES) -> None:
        self.sensors: dict[str, SensorState] = {}
        self.max_processes = max_processes
        self.gpus: dict[str, GpuSeries] = {}
        self.driver_version: str | None = None
        self.cpu: OrderedDict[int, CpuStats] = OrderedDict()
        self.names: dict[int, str] = {}
        self.quota_throttled_ns: dict[int, tuple[str, int, int]] = {}  # pid -> (cgroup, throttled ns, periods)
        self.memory_limit_hits: dict[int, int] = {}  # pid -> its memory cgroups' limit hits so far
        self.collectives: dict[tuple[int, Collective], CallTotals] = {}
        self.nccl_libraries: list[str] = []
        self.processes_dropped = 0
        self.cpu_gaps: dict[str, int] = {}  # what the CPU sensor could not keep or was not told, counted
        self._net_prev: NetSnapshot | None = None
        self._ifaces: dict[tuple[int, int, str], _Link] = {}
        self._qdiscs: dict[tuple[int, int, str, int, int], _Link] = {}
        self._namespaces: dict[int, tuple[bool, set[int]]] = {}
        self.net_errors: set[str] = set()
        self.net_samples = 0

    # ---- folding ----

    def set_sensor(self, name: str, state: SensorState) -> None:
        self.sensors[name] = state

    def add_gpus(self, samples: list[GpuSample]) -> None:
        for s in samples:
            g = self.gpus.get(s.uuid)
            if g is None:
                g = self.gpus[s.uuid] = GpuSeries(s.index, s.uuid, s.name, s.bus_id)
            g.add(s)

    def add_net(self, snap: NetSnapshot) -> None:
        self.net_samples += 1
        self.net_errors.update(snap.errors)
        for ns in snap.namespaces:
            host, pids = self._namespaces.setdefault(ns.inode, (ns.host, set()))
            pids.update(ns.pids)
        for i in snap.interfaces:
            link = self._ifaces.get(i.key)
            if link is None:
                link = self._ifaces[i.key] = _Link(i, i, snap.time_ns, snap.time_ns)
            else:
                link.last, link.t_last = i, snap.time_ns
            if i.peak_rx_bytes_per_s is not None and i.peak_tx_bytes_per_s is not None:
                # Rates over each fast tick (10 ms at 100 Hz): a burst a longer interval averages away.
                link.peak_rx = max(link.peak_rx or 0.0, i.peak_rx_bytes_per_s)
                link.peak_tx = max(link.peak_tx or 0.0, i.peak_tx_bytes_per_s)
                if i.speed_bits_per_s:
                    pu = max(i.peak_rx_bytes_per_s, i.peak_tx_bytes_per_s) * 8 / i.speed_bits_per_s
                    link.peak_utilization = pu if link.peak_utilization is None else max(link.peak_utilization, pu)
        for q in snap.qdiscs or ():
            ql = self._qdiscs.get(q.key)
            if ql is None:
                ql = self._qdiscs[q.key] = _Link(q, q, snap.time_ns, snap.time_ns)
            elif ql.last.kind != q.kind:
                ql.first, ql.t_first = q, snap.time_ns  # a new qdisc at the same handle: count from it
                ql.totals.clear()
            ql.last, ql.t_last = q, snap.time_ns
            ql.peak_backlog_bytes = max(ql.peak_backlog_bytes, q.backlog_bytes)
        if self._net_prev is not None:
            rates = net_rates(self._net_prev, snap)
            if rates is not None:
                for r in rates.interfaces:
                    link = self._ifaces[(r.netns, r.index, r.name)]
                    link.windows += 1
                    link.resets += r.counter_resets
                    link.fold(r.deltas)
                    u = link.last_utilization = r.utilization
                    if u is not None:
                        link.peak_utilization = u if link.peak_utilization is None else max(link.peak_utilization, u)
                for qr in rates.qdiscs:
                    ql = self._qdiscs.get((qr.netns, qr.ifindex, qr.ifname, qr.handle, qr.parent))
                    if ql is not None and ql.last.kind == qr.kind:
                        ql.fold(qr.deltas)
        if snap.qdiscs is not None or self._net_prev is None:
            self._net_prev = snap
        else:
            # keep the last snapshot that read queues, with this one's interfaces
            self._net_prev = NetSnapshot(
                snap.time_ns, snap.namespaces, snap.interfaces, self._net_prev.qdiscs, snap.gone_namespaces
            )

    def set_cpu(self, stats: dict[int, CpuStats], names: dict[int, str] | None = None) -> None:
        """The CPU sensor's cumulative readings (a later reading replaces an earlier one)."""
        for pid, st in stats.items():
            self.cpu[pid] = st
            self.cpu.move_to_end(pid)
        self.names.update(names or {})
        while len(self.cpu) > self.max_processes:
            pid, _ = self.cpu.popitem(last=False)
            self.names.pop(pid, None)
            self.processes_dropped += 1

    def forget(self, pid: int) -> None:
        """A process the agent no longer traces: its CPU and collectives rows go."""
        self.cpu.pop(pid, None)
        self.names.pop(pid, None)
        self.quota_throttled_ns.pop(pid, None)
        self.memory_limit_hits.pop(pid, None)
        for k in [k for k in self.collectives if k[0] == pid]:
            del self.collectives[k]

    def set_quota(self, pid: int, cgroup: str, throttled_ns: int, throttled_periods: int) -> None:
        self.quota_throttled_ns[pid] = (cgroup, throttled_ns, throttled_periods)

    def set_collectives(self, totals: dict[tuple[int, Collective], CallTotals], libraries: list[str]) -> None:
        self.collectives = totals
        self.nccl_libraries = libraries

    # ---- what the diagnosis reads (live) ----

    def latest_interfaces(self) -> list[Any]:
        """The last sample of each interface (InterfaceSample), cumulative counters."""
        return [link.last for link in self._ifaces.values()]

    def latest_qdiscs(self) -> list[Any]:
        return [q.last for q in self._qdiscs.values()]

    def interface_series(self) -> list[InterfaceSeries]:
        out = []
        for (netns, _index, _name), link in sorted(self._ifaces.items(), key=lambda kv: kv[0]):
            host, _ = self._namespaces.get(netns, (False, set()))
            out.append(InterfaceSeries(netns, host, link.last, link.counted(IFACE_COUNTERS), link.last_utilization))
        return out

    def qdisc_series(self) -> list[QdiscSeries]:
        return [QdiscSeries(q.last, q.counted(QDISC_COUNTERS)) for _k, q in sorted(self._qdiscs.items())]

    def netns_of(self, pid: int) -> int | None:
        for ino, (_host, pids) in self._namespaces.items():
            if pid in pids:
                return ino
        return None

    # ---- views ----

    def _cpu_rows(self, cgroup_name: dict[int, str]) -> list[dict[str, Any]]:
        rows = []
        for pid, st in self.cpu.items():
            alive = st.oncpu_ns + st.offcpu_ns + st.runq_ns
            q = self.quota_throttled_ns.get(pid)
            rows.append(
                {
                    "pid": pid,
                    "process": self.names.get(pid, ""),
                    "on_cpu_seconds": st.oncpu_ns / 1e9,
                    "off_cpu_seconds": st.offcpu_ns / 1e9,
                    "run_queue_seconds": st.runq_ns / 1e9,
                    "run_queue_share": st.runq_ns / alive if alive else 0.0,
                    "run_queue_latency_us": _quantiles(st.runq_quantile_us, sum(st.runq_hist)),
                    "off_cpu_us": _quantiles(st.offcpu_quantile_us, sum(st.offcpu_hist)),
                    "voluntary_switches": st.voluntary,
                    "involuntary_switches": st.involuntary,
                    "cgroup_id": st.cgroup_id,
                    "cgroup": cgroup_name.get(st.cgroup_id),
                    "cpu_quota": None
                    if q is None
                    else {"cgroup": q[0], "throttled_seconds": q[1] / 1e9, "throttled_periods": q[2]},
                    "preempted_by": [
                        {
                            "cgroup_id": p.cgroup_id,
                            "cgroup": "(idle: own CPU quota)" if p.cgroup_id == 0 else cgroup_name.get(p.cgroup_id),
                            "switches": p.count,
                            "run_queue_seconds": p.wait_ns / 1e9,
                            "last_pid": p.last_pid,
                            "last_process": p.last_comm,
                        }
                        for p in st.preemptors[:TOP_PREEMPTORS]
                    ],
                }
            )
        return rows

    def _net_view(self) -> dict[str, Any]:
        ifaces = []
        for (netns, _index, name), link in sorted(self._ifaces.items(), key=lambda kv: (kv[0][0], kv[0][2])):
            interval = (link.t_last - link.t_first) / 1e9
            deltas = link.counted(IFACE_COUNTERS)
            b = link.last
            host, _ = self._namespaces.get(netns, (False, set()))
            ifaces.append(
                {
                    "netns": netns,
                    "host_namespace": host,
                    "interface": name,
                    "operstate": b.operstate,
                    "speed_bits_per_second": b.speed_bits_per_s,
                    **deltas,
                    "seconds": interval,
                    "rx_bytes_per_second": deltas["rx_bytes"] / interval if interval else None,
                    "tx_bytes_per_second": deltas["tx_bytes"] / interval if interval else None,
                    "peak_utilization": link.peak_utilization,
                    "peak_rx_bytes_per_second": link.peak_rx,
                    "peak_tx_bytes_per_second": link.peak_tx,
                    "counter_resets": link.resets,
                }
            )
        qdiscs = []
        for (netns, _ifindex, ifname, handle, parent), ql in sorted(
            self._qdiscs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3])
        ):
            deltas = ql.counted(QDISC_COUNTERS)
            b = ql.last
            qdiscs.append(
                {
                    "netns": netns,
                    "interface": ifname,
                    "kind": b.kind,
                    "handle": f"{handle >> 16:x}:{handle & 0xFFFF:x}",
                    "root": parent == 0xFFFFFFFF,
                    **deltas,
                    "backlog_bytes": b.backlog_bytes,
                    "peak_backlog_bytes": ql.peak_backlog_bytes,
                }
            )
        return {
            "samples": self.net_samples,
            "namespaces": [
                {"netns": ino, "host_namespace": host, "pids": sorted(pids)}
                for ino, (host, pids) in sorted(self._namespaces.items())
            ],
            "interfaces": ifaces,
            "qdiscs": qdiscs,
            "errors": sorted(self.net_errors),
        }

    def view(self, cgroup_name: dict[int, str] | None = None, pids: set[int] | None = None) -> dict[str, Any]:
        """The summary's `host` section."""
        names = cgroup_name or {}
        return {
            "sensors": {k: v.row() for k, v in sorted(self.sensors.items())},
            "cpu": self._cpu_rows(names),
            "gpus": [g.row(pids) for g in sorted(self.gpus.values(), key=lambda g: g.index)],
            "nvidia_driver": self.driver_version,
            "network": self._net_view(),
            "processes_dropped": self.processes_dropped,
            "cpu_sensor": dict(self.cpu_gaps) if "cpu" in self.sensors and self.sensors["cpu"].on else None,
        }

    def collectives_view(self) -> list[dict[str, Any]]:
        """The summary's `collectives`: per process and collective, calls and bytes."""
        return [
            {
                "pid": pid,
                "collective": coll.label,
                "calls": t.calls,
                "bytes": t.bytes,
                "bytes_unknown_calls": t.bytes_unknown,
                "errors": t.errors,
                "seconds": t.duration_ns / 1e9,
            }
            for (pid, coll), t in sorted(self.collectives.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        ]


def _quantiles(fn: Any, n: int) -> dict[str, float] | None:
    if not n:
        return None
    return {"count": n, "p50": fn(0.5), "p99": fn(0.99)}
