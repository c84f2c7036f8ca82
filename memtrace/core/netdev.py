"""What memtrace knows about network interfaces and their queues at one instant, and the rates between two.

Pure data: the netdev source (memtrace.sources.netdev) fills these from
netlink; the model and the diagnosis read them. Interfaces are told apart by
network namespace (its inode), index and name, since a pod's `eth0` is not
the host's. Counters that go down were reset (the interface was re-created):
the rate counts from zero, never negative, and the reset is counted.
"""

from __future__ import annotations

from dataclasses import dataclass

IFACE_COUNTERS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
)
QDISC_COUNTERS = ("bytes", "packets", "drops", "overlimits", "requeues")


@dataclass(frozen=True)
class InterfaceSample:
    """IFLA_STATS64 of one interface, cumulative since it was created."""

    netns: int  # inode of its network namespace
    index: int
    name: str
    operstate: str | None
    speed_bits_per_s: int | None  # None: the driver does not say (lo, tunnels, a link that is down)
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int
    # The busiest tick's rates since the previous sample, when the fast sampler read the counters
    # (fast_ticks times); None when it did not (the counters were read once, at the sample).
    peak_rx_bytes_per_s: float | None = None
    peak_tx_bytes_per_s: float | None = None
    fast_ticks: int = 0
    # The rate its root shaper (a tbf qdisc) holds it to, as of the last qdisc read; None: none.
    shaped_bits_per_s: int | None = None

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.netns, self.index, self.name)

    @property
    def capacity_bits_per_s(self) -> int | None:
        """What the link can carry: its speed, or its shaper's rate where one holds it lower (a veth
        says 10 Gbit/s; a tbf on it at 80 Mbit/s is what its traffic gets). None: neither is known."""
        return min((x for x in (self.speed_bits_per_s, self.shaped_bits_per_s) if x), default=None)


@dataclass(frozen=True)
class QdiscSample:
    """TCA_STATS2 of one queueing discipline: cumulative counters and the queue as it stands."""

    netns: int
    ifindex: int
    ifname: str
    kind: str
    handle: int
    parent: int
    bytes: int
    packets: int
    drops: int
    overlimits: int  # times the qdisc held a packet back for its rate (tbf, htb): the link is saturated
    requeues: int
    backlog_bytes: int  # gauges
    qlen: int
    rate_bits_per_s: int | None = None  # a shaper's rate (tbf); None: not a shaper, or not said

    @property
    def key(self) -> tuple[int, int, str, int, int]:
        return (self.netns, self.ifindex, self.ifname, self.handle, self.parent)


@dataclass(frozen=True)
class Netns:
    """A network namespace memtrace samples, and the traced pids that live in it."""

    inode: int
    pids: tuple[int, ...]
    host: bool  # memtrace's own namespace


@dataclass(frozen=True)
class NetSnapshot:
    time_ns: int  # CLOCK_MONOTONIC
    namespaces: tuple[Netns, ...]
    interfaces: tuple[InterfaceSample, ...]
    qdiscs: tuple[QdiscSample, ...] | None  # None: not read in this sample (read every Nth)
    gone_namespaces: tuple[int, ...] = ()  # sampled before, no longer reachable (their last process left)
    errors: tuple[str, ...] = ()  # what could not be read, in words

    def namespace_of(self, pid: int) -> int | None:
        for ns in self.namespaces:
            if pid in ns.pids:
                return ns.inode
        return None


@dataclass(frozen=True)
class InterfaceRates:
    netns: int
    index: int
    name: str
    interval_s: float
    deltas: dict[str, int]  # IFACE_COUNTERS -> increase over the interval
    capacity_bits_per_s: int | None  # InterfaceSample.capacity_bits_per_s: its speed, or its shaper's rate
    counter_resets: int

    def per_second(self, counter: str) -> float:
        return self.deltas[counter] / self.interval_s

    @property
    def utilization(self) -> float | None:
        """The busier direction's share of what the link can carry (its speed, or its shaper's rate),
        0..1 (can exceed 1 on a bad speed report, or a shaper's burst)."""
        if not self.capacity_bits_per_s:
            return None
        busiest = max(self.deltas["rx_bytes"], self.deltas["tx_bytes"]) * 8 / self.interval_s
        return busiest / self.capacity_bits_per_s


@dataclass(frozen=True)
class QdiscRates:
    netns: int
    ifindex: int
    ifname: str
    kind: str
    handle: int
    parent: int
    interval_s: float
    deltas: dict[str, int]  # QDISC_COUNTERS -> increase over the interval
    backlog_bytes: int  # at the end of the interval
    qlen: int
    counter_resets: int


@dataclass(frozen=True)
class NetRates:
    interval_s: float
    interfaces: tuple[InterfaceRates, ...]
    qdiscs: tuple[QdiscRates, ...]
    appeared: tuple[tuple[int, int, str], ...]  # interface keys new in the later snapshot
    disappeared: tuple[tuple[int, int, str], ...]  # interface keys gone from it
    counter_resets: int


def counter_deltas(before: object, after: object, names: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """Increase of each cumulative counter, and how many went down (a reset: counted from zero)."""
    out: dict[str, int] = {}
    resets = 0
    for n in names:
        b, a = getattr(before, n), getattr(after, n)
        if a < b:
            out[n] = a  # reset: what was counted since
            resets += 1
        else:
            out[n] = a - b
    return out, resets


def net_rates(before: NetSnapshot, after: NetSnapshot) -> NetRates | None:
    """Rates between two snapshots; None if they are not in time order."""
    if after.time_ns <= before.time_ns:
        return None
    interval = (after.time_ns - before.time_ns) / 1e9
    prev = {i.key: i for i in before.interfaces}
    cur = {i.key: i for i in after.interfaces}
    ifaces = []
    resets = 0
    for key, a in cur.items():
        b = prev.get(key)
        if b is None:
            continue
        d, r = counter_deltas(b, a, IFACE_COUNTERS)
        resets += r
        ifaces.append(InterfaceRates(a.netns, a.index, a.name, interval, d, a.capacity_bits_per_s, r))
    qdiscs = []
    if before.qdiscs is not None and after.qdiscs is not None:
        qprev = {q.key: q for q in before.qdiscs}
        for q in after.qdiscs:
            qb = qprev.get(q.key)
            if qb is None or qb.kind != q.kind:
                continue
            d, r = counter_deltas(qb, q, QDISC_COUNTERS)
            resets += r
            qdiscs.append(
                QdiscRates(
                    q.netns, q.ifindex, q.ifname, q.kind, q.handle, q.parent, interval, d, q.backlog_bytes, q.qlen, r
                )
            )
    return NetRates(
        interval_s=interval,
        interfaces=tuple(ifaces),
        qdiscs=tuple(qdiscs),
        appeared=tuple(k for k in cur if k not in prev),
        disappeared=tuple(k for k in prev if k not in cur),
        counter_resets=resets,
    )
