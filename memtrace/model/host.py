"""What the host did around the traced processes, over a run: the CPU each
process got (the CPU sensor), the GPUs (NVML), the network interfaces of the
namespaces the processes live in (rtnetlink) and their collectives (the
NCCL sensor). Pure folding of readings the runtime takes on its sampling
timer; export/host.py turns them into the summary's `host` and
`collectives` rows (export/schema.py).

A process is its ProcessKey (pid, start), as on the CUDA side: a pid
reused during the run is two processes, two rows, never one.

Every figure is the sensor's own, or a delta of two of its cumulative
counters: nothing is estimated. A sensor that is off says so and why
(`sensors`), and its section is empty rather than zero. GPU readings that
NVML could not give are left out of the means and maxima, and counted
(`samples`) so a reader can tell a quiet GPU from one never read.

A process's identity follows it (`place`): the network namespace, the
cgroup, the command and the executable it is in at each sample, kept as
spans (`Placement`), a new one whenever one of them changes (`ip netns
exec`, nsenter, a move to another cgroup, an exec). Its cgroups' cumulative
counters (CPU quota throttling, memory limit hits) are charged to it in the
cgroup it is in: a reading in another cgroup than the last starts from
that cgroup's reading, and what the last counted stays counted
(`_Account`), so its totals only grow and a window's difference is what
happened where it was.

Bounded: per GPU a fixed set of running sums; per interface and qdisc the
first and last sample and a few maxima; per process one CpuStats, one row
per collective and at most MAX_PLACEMENTS spans, at most `max_processes`
processes (the oldest first seen are folded out and counted in
`processes_dropped`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memtrace.core.cpu import CpuStats
from memtrace.core.gpu import GpuSample, MigInstance, counter_delta
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import CallTotals, Collective
from memtrace.core.netdev import (
    IFACE_COUNTERS,
    QDISC_COUNTERS,
    InterfaceSample,
    Netns,
    NetSnapshot,
    QdiscSample,
    net_rates,
)

MAX_PROCESSES = 4096
MAX_PLACEMENTS = 16  # spans kept per process: the first and the latest ones (the others counted)

T = TypeVar("T")


@dataclass
class SensorState:
    """One host sensor: on, or off with the reason and the fix."""

    on: bool
    reason: str = ""
    fix: str = ""


@dataclass
class Series:
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

    def mean_max(self) -> tuple[float, float] | None:
        """(mean, maximum); None: no sample had the reading."""
        if not self.n or self.most is None:
            return None
        return self.total / self.n, self.most


@dataclass
class ByteCounter:
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

    def mean_max(self) -> tuple[float, float] | None:
        """(bytes per second over the counted seconds, the busiest interval's); None: never counted."""
        if not self.seconds or self.most is None:
            return None
        return self.bytes / self.seconds, self.most


NVLINK_ERRORS = ("crc_errors", "replay_errors", "recovery_errors")


@dataclass
class MigSeries:
    """A MIG instance over the run, as its own device: its memory, processes and GPM activity."""

    uuid: str
    memory_used: Series = field(default_factory=Series)
    sm_active: Series = field(default_factory=Series)
    sm_occupancy: Series = field(default_factory=Series)
    tensor_active: Series = field(default_factory=Series)
    dram_bandwidth: Series = field(default_factory=Series)
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> its memory there, last sample

    def add(self, m: MigInstance) -> None:
        self.memory_used.add(m.memory_used_bytes)
        self.sm_active.add(m.sm_active_percent)
        self.sm_occupancy.add(m.sm_occupancy_percent)
        self.tensor_active.add(m.tensor_active_percent)
        self.dram_bandwidth.add(m.dram_bandwidth_percent)
        for p in m.processes:
            self.processes[p.pid] = p.used_memory_bytes


@dataclass
class NvLinkSeries:
    """One NVLink over the run: its bytes (exact, from the driver's counters), the increase of each
    error counter, and how often it was down."""

    link: int
    tx: ByteCounter = field(default_factory=ByteCounter)
    rx: ByteCounter = field(default_factory=ByteCounter)
    errors: dict[str, int] = field(default_factory=dict)  # NVLINK_ERRORS -> increase (absent: not counted)
    samples: int = 0
    down_samples: int = 0
    active: bool = True  # at the last detailed sample


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
    sm: Series = field(default_factory=Series)
    mem_util: Series = field(default_factory=Series)
    sm_clock: Series = field(default_factory=Series)  # MHz, at every sample
    memory_clock: Series = field(default_factory=Series)
    memory_used: Series = field(default_factory=Series)
    temperature: Series = field(default_factory=Series)
    power: Series = field(default_factory=Series)
    pcie_tx: Series = field(default_factory=Series)
    pcie_rx: Series = field(default_factory=Series)
    pcie_tx_count: ByteCounter = field(default_factory=ByteCounter)  # where the driver counts PCIe bytes
    pcie_rx_count: ByteCounter = field(default_factory=ByteCounter)
    pcie_counted: bool = False
    throttled_samples: int = 0
    clock_samples: int = 0
    reasons: set[str] = field(default_factory=set)
    degraded_samples: int = 0
    link_samples: int = 0
    narrowest: tuple[int, int] | None = None  # (generation, width) at the lowest width seen
    xids: list[int] = field(default_factory=list)
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> GPU memory at its last sample
    # GPM activity over the detailed samples' intervals (percent); gpm_supported from the last one.
    sm_active: Series = field(default_factory=Series)
    sm_occupancy: Series = field(default_factory=Series)
    tensor_active: Series = field(default_factory=Series)
    dram_bandwidth: Series = field(default_factory=Series)
    gpm_supported: bool | None = None
    nvlinks: dict[int, NvLinkSeries] = field(default_factory=dict)
    mig: dict[int, str] = field(default_factory=dict)  # pid -> the MIG instance it was last seen on
    process_sm: dict[int, Series] = field(default_factory=dict)  # pid -> its SM share (percent)
    mig_instances: dict[str, MigSeries] = field(default_factory=dict)  # by UUID, as first seen

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
        self.sm_clock.add(s.sm_clock_mhz)
        self.memory_clock.add(s.memory_clock_mhz)
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
            if p.mig_uuid is not None:
                self.mig[p.pid] = p.mig_uuid
        if s.gpm_supported is not None:
            self.gpm_supported = s.gpm_supported
        self.sm_active.add(s.sm_active_percent)
        self.sm_occupancy.add(s.sm_occupancy_percent)
        self.tensor_active.add(s.tensor_active_percent)
        self.dram_bandwidth.add(s.dram_bandwidth_percent)
        for u in s.process_utilization:
            self.process_sm.setdefault(u.pid, Series()).add(u.sm_percent)
        for m in s.mig_instances:
            self.mig_instances.setdefault(m.uuid, MigSeries(m.uuid)).add(m)
        self._add_links(prev, s)

    def _add_links(self, prev: GpuSample | None, s: GpuSample) -> None:
        earlier = {link.link: link for link in prev.nvlinks} if prev is not None else {}
        seconds = 0.0 if prev is None else (s.time_ns - prev.time_ns) / 1e9
        for link in s.nvlinks:
            ls = self.nvlinks.get(link.link)
            if ls is None:
                ls = self.nvlinks[link.link] = NvLinkSeries(link.link)
            ls.samples += 1
            ls.down_samples += not link.active
            ls.active = link.active
            b = earlier.get(link.link)
            if b is None:
                continue
            ls.tx.add(b.tx_bytes, link.tx_bytes, seconds)
            ls.rx.add(b.rx_bytes, link.rx_bytes, seconds)
            for name in NVLINK_ERRORS:
                d, _ = counter_delta(getattr(b, name), getattr(link, name))
                if d is not None:
                    ls.errors[name] = ls.errors.get(name, 0) + d

    def delta(self, name: str) -> int | None:
        """A cumulative counter's increase between the first and last detailed samples
        (`pcie_replay_count`, `ecc_corrected_volatile`, ...); None: not read (no detailed sample had it)."""
        if self.first is None or self.last is None:
            return None
        return counter_delta(getattr(self.first, name), getattr(self.last, name))[0]

    def replays_since_start(self) -> int | None:
        return self.delta("pcie_replay_count")


@dataclass
class _Link:
    """One interface (or qdisc) between its first and last sample, with the busiest window."""

    first: Any  # InterfaceSample or QdiscSample
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


@dataclass
class _Account:
    """A cgroup's cumulative counters charged to one process across the
    cgroups it was in: what they counted while it was in those it left
    (`banked`), plus the present one's growth since its first reading
    there. A counter that went down (the cgroup re-created) counts from
    its new value."""

    where: str
    first: tuple[int, ...]
    last: tuple[int, ...]
    banked: tuple[int, ...]

    @classmethod
    def start(cls, where: str, values: tuple[int, ...]) -> _Account:
        return cls(where, values, values, tuple(0 for _ in values))

    def read(self, where: str, values: tuple[int, ...]) -> None:
        if where != self.where or any(v < last for v, last in zip(values, self.last, strict=True)):
            self.banked, self.where, self.first = self.total(), where, values
        self.last = values

    def total(self) -> tuple[int, ...]:
        return tuple(b + max(v - f, 0) for b, f, v in zip(self.banked, self.first, self.last, strict=True))


@dataclass(frozen=True)
class Identity:
    """Where a process is and what it runs, as one sample read it (None or
    "": not read)."""

    netns: int | None = None  # its network namespace's inode
    cgroup: str | None = None  # its CPU's cgroup (the v1 cpu hierarchy's on a hybrid host, else the v2 path)
    cgroup_id: int = 0  # its v2 id (0: not known)
    comm: str = ""
    exe: str = ""


@dataclass
class Placement:
    """One span of a process's run in one network namespace and one cgroup,
    from the first sample that found it there (wall-clock ns) until the
    next span's; its command and executable the last seen in it; its
    cgroup counters as they stood when it began (its own share: the next
    span's, or the totals, less these)."""

    since_ns: int
    identity: Identity
    throttled: tuple[int, int]  # the process's CPU quota throttling so far: ns, periods
    limit_hits: int | None  # its memory cgroups' limit hits so far


@dataclass(frozen=True)
class InterfaceSeries:
    """One interface as the exports read it: its counters since the first sample."""

    netns: int
    host_namespace: bool
    last: InterfaceSample
    deltas: dict[str, int]  # IFACE_COUNTERS
    utilization: float | None  # over the last sampling interval
    seconds: float = 0.0  # between the first and last samples
    peak_utilization: float | None = None  # the busiest window's or fast tick's (None: unknown speed)
    peak_rx_bytes_per_s: float | None = None  # the busiest fast tick's (None: no fast sampler)
    peak_tx_bytes_per_s: float | None = None
    counter_resets: int = 0


@dataclass(frozen=True)
class QdiscSeries:
    last: Any  # QdiscSample (Any: the OTLP export reads it untyped)
    deltas: dict[str, int]  # QDISC_COUNTERS
    peak_backlog_bytes: int = 0


class HostBook:
    """The host readings of one run (or one push interval), folded. Each
    process's readings are kept by its ProcessKey; a reading taken before
    its start was known stands as ProcessKey(pid, 0)."""

    def __init__(self, max_processes: int = MAX_PROCESSES) -> None:
        self.sensors: dict[str, SensorState] = {}
        self.max_processes = max_processes
        self.gpus: dict[str, GpuSeries] = {}
        self.driver_version: str | None = None
        self.cpu: OrderedDict[ProcessKey, CpuStats] = OrderedDict()
        self.names: dict[ProcessKey, str] = {}
        # process -> (cgroup, throttled ns, periods), since its first reading
        self.quota_throttled_ns: dict[ProcessKey, tuple[str, int, int]] = {}
        self.memory_limit_hits: dict[ProcessKey, int] = {}  # its memory cgroups' limit hits so far
        self._quota_acct: dict[ProcessKey, _Account] = {}
        self._hits_acct: dict[ProcessKey, _Account] = {}
        self.placements: dict[ProcessKey, list[Placement]] = {}  # its identity's spans, oldest first
        self.placements_dropped: dict[ProcessKey, int] = {}
        self.collectives: dict[tuple[ProcessKey, Collective], CallTotals] = {}
        self.nccl_libraries: list[str] = []
        self.processes_dropped = 0
        self.cpu_gaps: dict[str, int] = {}  # what the CPU sensor could not keep or was not told, counted
        self._net_prev: NetSnapshot | None = None
        self._ifaces: dict[tuple[int, int, str], _Link] = {}
        self._qdiscs: dict[tuple[int, int, str, int, int], _Link] = {}
        self._namespaces: dict[int, tuple[bool, set[int]]] = {}
        # Each traced pid's namespace at the latest sample: a process may enter
        # another after it starts (`ip netns exec`, nsenter, a CNI plugin).
        self._netns_now: dict[int, int] = {}
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
        if snap.namespaces:
            self._netns_now = {pid: ns.inode for ns in snap.namespaces for pid in ns.pids}
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
                if cap := i.capacity_bits_per_s:
                    pu = max(i.peak_rx_bytes_per_s, i.peak_tx_bytes_per_s) * 8 / cap
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

    def set_cpu(self, stats: dict[ProcessKey, CpuStats], names: dict[ProcessKey, str] | None = None) -> None:
        """The CPU sensor's cumulative readings (a later reading replaces an earlier one)."""
        for key, st in stats.items():
            self.cpu[key] = st
            self.cpu.move_to_end(key)
        self.names.update(names or {})
        while len(self.cpu) > self.max_processes:
            key, _ = self.cpu.popitem(last=False)
            self.names.pop(key, None)
            self.processes_dropped += 1

    def forget(self, key: ProcessKey) -> None:
        """A process the agent no longer traces: its CPU and collectives rows go."""
        self.cpu.pop(key, None)
        self.names.pop(key, None)
        for rows in (
            self.quota_throttled_ns,
            self.memory_limit_hits,
            self._quota_acct,
            self._hits_acct,
            self.placements,
            self.placements_dropped,
        ):
            rows.pop(key, None)
        for k in [k for k in self.collectives if k[0] == key]:
            del self.collectives[k]

    def rename(self, old: ProcessKey, new: ProcessKey) -> None:
        """Readings kept under `old` are `new`'s (a pid's, before its process's start was known):
        they move to it, unless it has its own."""
        if old == new:
            return
        _move(self.cpu, old, new)
        _move(self.names, old, new)
        _move(self.quota_throttled_ns, old, new)
        _move(self.memory_limit_hits, old, new)
        _move(self._quota_acct, old, new)
        _move(self._hits_acct, old, new)
        _move(self.placements, old, new)
        _move(self.placements_dropped, old, new)
        for k in [k for k in self.collectives if k[0] == old]:
            self.collectives.setdefault((new, k[1]), self.collectives.pop(k))

    def set_quota(self, key: ProcessKey, cgroup: str, throttled_ns: int, throttled_periods: int) -> None:
        """The process's CPU quota throttling so far, charged to it (read_quota keeps it so)."""
        self.quota_throttled_ns[key] = (cgroup, throttled_ns, throttled_periods)

    def read_quota(self, key: ProcessKey, cgroup: str, throttled_ns: int, throttled_periods: int) -> None:
        """A reading of the cpu.stat of the quota over the process (`cgroup`,
        cumulative): charged to it from the first reading in that cgroup on."""
        acct = self._quota_acct.get(key)
        if acct is None:
            acct = self._quota_acct[key] = _Account.start(cgroup, (throttled_ns, throttled_periods))
        else:
            acct.read(cgroup, (throttled_ns, throttled_periods))
        ns, periods = acct.total()
        self.set_quota(key, cgroup, ns, periods)

    def read_limit_hits(self, key: ProcessKey, cgroup: str, hits: int) -> None:
        """A reading of the limit hits of the process's memory cgroup `cgroup`
        and those above it (cumulative): charged to it from the first reading
        in that cgroup on."""
        acct = self._hits_acct.get(key)
        if acct is None:
            acct = self._hits_acct[key] = _Account.start(cgroup, (hits,))
        else:
            acct.read(cgroup, (hits,))
        self.memory_limit_hits[key] = acct.total()[0]

    def place(self, key: ProcessKey, identity: Identity, now_ns: int) -> bool:
        """Where the process is and what it runs at this sample (`now_ns`,
        wall clock). Another network namespace or cgroup than the last
        sample's starts a new span; a new command or executable (an exec)
        is its span's from then on. A part this sample did not read (None,
        0 or "") is the last sample's. True: a new span."""
        spans = self.placements.get(key)
        if spans:
            last = spans[-1].identity
            netns = identity.netns if identity.netns is not None else last.netns
            cgroup = identity.cgroup if identity.cgroup is not None else last.cgroup
            same_cgroup = cgroup == last.cgroup
            identity = Identity(
                netns,
                cgroup,
                identity.cgroup_id or (last.cgroup_id if same_cgroup else 0),
                identity.comm or last.comm,
                identity.exe or last.exe,
            )
            if netns == last.netns and same_cgroup:
                spans[-1].identity = identity
                return False
        q = self.quota_throttled_ns.get(key)
        span = Placement(now_ns, identity, (q[1], q[2]) if q else (0, 0), self.memory_limit_hits.get(key))
        if spans is None:
            spans = self.placements[key] = []
        spans.append(span)
        if len(spans) > MAX_PLACEMENTS:
            del spans[1]  # the first and the latest are kept
            self.placements_dropped[key] = self.placements_dropped.get(key, 0) + 1
        return True

    def set_collectives(self, totals: dict[tuple[ProcessKey, Collective], CallTotals], libraries: list[str]) -> None:
        self.collectives = totals
        self.nccl_libraries = libraries

    # ---- what the diagnosis and the exports read ----

    def cpu_of(self, key: ProcessKey) -> CpuStats | None:
        """A process's CPU readings."""
        return self.cpu.get(key)

    def collectives_of(self, key: ProcessKey) -> list[tuple[Collective, CallTotals]]:
        """A process's collectives, by collective."""
        return sorted(((c, t) for (who, c), t in self.collectives.items() if who == key), key=lambda ct: ct[0])

    def latest_interfaces(self) -> list[InterfaceSample]:
        """The last sample of each interface, cumulative counters."""
        return [link.last for link in self._ifaces.values()]

    def latest_qdiscs(self) -> list[QdiscSample]:
        return [q.last for q in self._qdiscs.values()]

    def interfaces(self) -> list[InterfaceSeries]:
        """Every interface sampled, in the order first seen."""
        out = []
        for (netns, _index, _name), link in self._ifaces.items():
            host, _ = self._namespaces.get(netns, (False, set()))
            out.append(
                InterfaceSeries(
                    netns,
                    host,
                    link.last,
                    link.counted(IFACE_COUNTERS),
                    link.last_utilization,
                    seconds=(link.t_last - link.t_first) / 1e9,
                    peak_utilization=link.peak_utilization,
                    peak_rx_bytes_per_s=link.peak_rx,
                    peak_tx_bytes_per_s=link.peak_tx,
                    counter_resets=link.resets,
                )
            )
        return out

    def interface_series(self) -> list[InterfaceSeries]:
        """Every interface, by (netns, index, name)."""
        return sorted(self.interfaces(), key=lambda i: i.last.key)

    def qdiscs(self) -> list[QdiscSeries]:
        """Every queueing discipline sampled, in the order first seen."""
        return [QdiscSeries(q.last, q.counted(QDISC_COUNTERS), q.peak_backlog_bytes) for q in self._qdiscs.values()]

    def qdisc_series(self) -> list[QdiscSeries]:
        """Every queueing discipline, by (netns, ifindex, ifname, handle, parent)."""
        return sorted(self.qdiscs(), key=lambda q: q.last.key)

    def namespaces(self) -> list[Netns]:
        """The network namespaces sampled, by inode, with every traced pid seen in each."""
        return [Netns(ino, tuple(sorted(pids)), host) for ino, (host, pids) in sorted(self._namespaces.items())]

    def identity_of(self, key: ProcessKey) -> Identity | None:
        """Where the process was at the latest sample (None: never placed)."""
        spans = self.placements.get(key)
        return spans[-1].identity if spans else None

    def netns_of(self, pid: int) -> int | None:
        """The network namespace a traced process was in at the latest
        sample (where its traffic goes now), not the first it was seen in."""
        return self._netns_now.get(pid)


def _move(rows: MutableMapping[ProcessKey, T], old: ProcessKey, new: ProcessKey) -> None:
    if old in rows:
        rows.setdefault(new, rows.pop(old))
