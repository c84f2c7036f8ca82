"""NICs and their queues through rtnetlink: 64-bit counters per interface, TCA_STATS2 per qdisc, link speed.

memtrace's own network namespace is always sampled; so are the namespaces of
the pids the runtime passes to `poll()` (a pod's interfaces), deduplicated by
the namespace's inode. pyroute2 opens the sockets inside another namespace
(`sockets_in`: a short-lived thread of the agent's enters the namespace with
pyroute2's setns, makes them and ends), so the agent's other threads never
change namespace, nothing forks, and nothing runs `ip` or `tc`.

The per-sample dumps are parsed here, with struct, rather than by pyroute2's
IPRoute: its message objects cost about 1 ms of CPU per link dump and 0.5 ms
per qdisc dump (bench/host_sampling.py), 15% of a core at 100 Hz, and memtrace
needs a few fields of one attribute. Counters come from RTM_GETSTATS
(rtnl_link_stats64, the same counters as IFLA_STATS64, without the rest of
each link's description). A socket pins its namespace, so the sockets of a namespace
are closed as soon as no traced pid lives in it any more (reported in
`gone_namespaces`); an interface that disappears simply is not in the next
snapshot (`net_rates` reports it).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from memtrace.core.errors import MemtraceError
from memtrace.core.netdev import InterfaceSample, Netns, NetSnapshot, QdiscSample
from memtrace.core.threads import thread
from memtrace.sources.fastsample import FastSampler, FastWindow, IfWindow

# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/gen_stats.h)
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
RTM_NEWSTATS, RTM_GETSTATS = 92, 94
IFLA_STATS_LINK_64 = 1
IFLA_IFNAME, IFLA_OPERSTATE, IFLA_STATS64 = 3, 16, 23
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4  # linux/pkt_sched.h
TC_H_ROOT = 0xFFFFFFFF
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
_NLMSGHDR = struct.Struct("=IHHII")
_RTATTR = struct.Struct("=HH")
_IFINFOMSG = struct.Struct("=BxHiII")
_TCMSG = struct.Struct("=BxxxiIII")
_IF_STATS_MSG = struct.Struct("=BxxxiI")  # family, ifindex, filter_mask
_STATS64 = struct.Struct("=8Q")  # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped
_BASIC = struct.Struct("=QI")
_QUEUE = struct.Struct("=5I")  # qlen, backlog, drops, requeues, overlimits
# struct tc_tbf_qopt begins with its rate, a struct tc_ratespec: cell_log, linklayer, overhead,
# cell_align, mpu, then the rate in bytes a second (~0U: too fast for 32 bits, in TCA_TBF_RATE64).
_RATESPEC = struct.Struct("=BBHhHI")
# ethtool (linux/ethtool.h): ETHTOOL_GSET answers from the driver's get_link_ksettings.
SIOCETHTOOL, ETHTOOL_GSET = 0x8946, 0x1
SPEED_UNKNOWN = 0xFFFFFFFF
RECV_BYTES = 1 << 16


def _tbf_rate(buf: bytes | memoryview, start: int, end: int) -> int | None:
    """A tbf qdisc's rate in bits a second, from its TCA_OPTIONS (None: not there)."""
    rate: int | None = None
    for t, a, b in attrs(buf, start, end):
        if t == TCA_TBF_PARMS and b - a >= _RATESPEC.size and rate is None:
            rate = _RATESPEC.unpack_from(buf, a)[5]
            if rate == 0xFFFFFFFF:
                rate = None  # in TCA_TBF_RATE64
        elif t == TCA_TBF_RATE64 and b - a >= 8:
            (rate,) = struct.unpack_from("=Q", buf, a)
    return rate * 8 if rate else None


class NetlinkUnavailable(MemtraceError):
    """No rtnetlink socket: NIC signals are off."""


def attrs(buf: bytes | memoryview, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each rtattr in buf[start:end]."""
    while start + 4 <= end:
        length, kind = _RTATTR.unpack_from(buf, start)
        if length < 4:
            return
        yield kind & 0x3FFF, start + 4, start + length
        start += (length + 3) & ~3


def ask(sock: socket.socket, kind: int, flags: int, seq: int, body: bytes) -> Iterator[tuple[bytes, int, int]]:
    """Send a netlink request and yield (buffer, message body start, message end) of each
    answer to it: every message of a dump (flags NLM_F_DUMP) up to its NLMSG_DONE, or the one
    answer of a request without it. An error the kernel answers is raised (OSError)."""
    sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body)
    while True:
        buf = sock.recv(RECV_BYTES)
        off = 0
        while off + _NLMSGHDR.size <= len(buf):
            length, mtype, _flags, got, _pid = _NLMSGHDR.unpack_from(buf, off)
            if length < _NLMSGHDR.size:
                raise OSError(errno.EPROTO, "malformed netlink message")
            if got == seq:
                if mtype == NLMSG_DONE:
                    return
                if mtype == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", buf, off + _NLMSGHDR.size)
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return
                yield buf, off + _NLMSGHDR.size, off + length
                if not flags & NLM_F_DUMP:
                    return  # one answer, no NLMSG_DONE after it
            off += (length + 3) & ~3


@dataclass
class _Namespace:
    inode: int
    rtnl: socket.socket
    inet: socket.socket  # for ethtool ioctls inside the namespace
    host: bool
    pids: set[int] = field(default_factory=set)
    speeds: dict[tuple[int, str], tuple[str | None, int | None]] = field(default_factory=dict)  # -> state, speed
    links: dict[int, tuple[str, str | None, int | None]] = field(default_factory=dict)  # index -> name, state, speed
    links_read: int = -1  # the sample count when links were last read
    # index -> the rate its root shaper (tbf) holds it to, bits a second, as of the last qdisc read:
    # the link's real capacity where a shaper sets it (Kubernetes' bandwidth plugin, tc on a veth).
    shaped: dict[int, int] = field(default_factory=dict)
    seq: int = 0

    def close(self) -> None:
        self.rtnl.close()
        self.inet.close()


NETLINK = (socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
INET = (socket.AF_INET, socket.SOCK_DGRAM, 0)


def _open_host() -> tuple[socket.socket, socket.socket]:
    return socket.socket(*NETLINK), socket.socket(*INET)


def sockets_in(fd: int, *kinds: tuple[int, int, int]) -> list[socket.socket]:
    """Sockets of these (family, type, proto) inside the network namespace
    held by fd, made on a thread of the agent's that enters it and ends there
    (a thread's network namespace is its own; a socket keeps the namespace
    it was made in). pyroute2's create_socket forks a child for this, and a
    fork of the multithreaded agent can deadlock the child on a lock another
    thread held (Python 3.12+ warns of it); no fork here, the same setns."""
    from pyroute2 import netns

    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter() -> None:
        try:
            netns.setns(fd)  # an open fd: this thread alone moves
            for k in kinds:
                made.append(socket.socket(*k))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, below
            failed.append(e)

    t = thread(enter, "memtrace-netns")
    t.start()
    t.join()
    if failed:
        for s in made:
            s.close()
        raise failed[0]
    return made


def _open_in(fd: int) -> tuple[socket.socket, socket.socket]:
    rtnl, inet = sockets_in(fd, NETLINK, INET)
    return rtnl, inet


class NetdevSource:
    """Samples the host's interfaces and those of traced processes' namespaces. One sampling thread."""

    name = "network"

    def __init__(
        self, qdisc_every: int = 1, link_every: int = 1, proc: str = "/proc", fast: FastSampler | None = None
    ) -> None:
        self._proc = proc
        # With the fast sampler, the counters come from its C thread (100 Hz, with each tick's rates);
        # it reads each namespace through a socket of its own, opened here beside ours.
        self._fast = fast
        # Counters are read at every sample (RTM_GETSTATS: one small message per interface). Names, states
        # and speeds (RTM_GETLINK: about 1.5 kB per interface) every link_every-th sample, and whenever an
        # interface appears; queues (RTM_GETQDISC) every qdisc_every-th.
        self.qdisc_every = max(1, qdisc_every)
        self.link_every = max(1, link_every)
        self._lock = threading.Lock()
        self._count = 0
        self._closed = False
        self.host_inode = os.stat(f"{proc}/self/ns/net").st_ino
        rtnl, inet = _open_host()
        self._ns: dict[int, _Namespace] = {self.host_inode: _Namespace(self.host_inode, rtnl, inet, host=True)}
        self._opener: Callable[[int], tuple[socket.socket, socket.socket]] = _open_in
        if fast is not None:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as own:
                fast.add_netns(self.host_inode, own)

    @classmethod
    def open(
        cls,
        qdisc_every: int = 1,
        link_every: int = 1,
        report: Callable[[NetlinkUnavailable], None] | None = None,
    ) -> NetdevSource | None:
        try:
            return cls(qdisc_every, link_every)
        except OSError as e:
            if report is not None:
                report(
                    NetlinkUnavailable(
                        f"no rtnetlink socket ({e}): NIC signals are off",
                        "run memtrace in the host network namespace (hostNetwork: true in Kubernetes)",
                    )
                )
            return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for ns in self._ns.values():
                ns.close()
            self._ns.clear()

    def __enter__(self) -> NetdevSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- namespaces ----------------------------------------------------------

    def _namespaces(self, pids: Iterable[int], errors: list[str]) -> tuple[int, ...]:
        """Bring the set of sampled namespaces up to date; returns the inodes dropped."""
        wanted: dict[int, set[int]] = {self.host_inode: set()}
        for pid in pids:
            path = f"{self._proc}/{pid}/ns/net"
            try:
                inode = os.stat(path).st_ino
            except OSError as e:
                errors.append(f"pid {pid}: network namespace not readable ({e.strerror})")
                continue
            if inode not in wanted and inode not in self._ns:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    errors.append(f"pid {pid}: network namespace not readable ({e.strerror})")
                    continue
                try:
                    inode = os.fstat(fd).st_ino  # the namespace we hold, even if the pid moved meanwhile
                    rtnl, inet = self._opener(fd)
                    if self._fast is not None:
                        self._give_fast(inode, fd, errors)
                except OSError as e:
                    errors.append(f"pid {pid}: could not enter its network namespace ({e})")
                    continue
                finally:
                    os.close(fd)
                self._ns[inode] = _Namespace(inode, rtnl, inet, host=False)
            wanted.setdefault(inode, set()).add(pid)
        gone = []
        for inode in list(self._ns):
            if inode not in wanted:
                self._ns.pop(inode).close()
                if self._fast is not None:
                    self._fast.remove_netns(inode)
                gone.append(inode)
            else:
                self._ns[inode].pids = wanted[inode]
        return tuple(gone)

    def stop_fast(self) -> None:
        """The fast sampler is gone (it could not start): read every counter here from now on."""
        with self._lock:
            self._fast = None

    def _give_fast(self, inode: int, fd: int, errors: list[str]) -> None:
        """A socket of the fast sampler's own inside the namespace held by fd; without it, Python reads its counters."""
        try:
            (own,) = sockets_in(fd, NETLINK)
            with own:
                self._fast.add_netns(inode, own)  # type: ignore[union-attr]
        except OSError as e:
            errors.append(f"netns {inode}: read at the host interval, not by the fast sampler ({e})")

    # --- sampling ------------------------------------------------------------

    def poll(self, pids: Iterable[int] = (), fast: FastWindow | None = None, fresh: bool = False) -> NetSnapshot:
        """Counters of every interface (and every qdisc, each qdisc_every-th call) in the sampled namespaces.

        With `fast` (the fast sampler's window, taken by the caller), the counters of the namespaces it
        reads are its own, as they stood at its last tick, with the busiest tick's rates; `fresh` reads
        the counters now all the same (a run's last sample: what came after the last tick counts too)."""
        with self._lock:
            errors: list[str] = []
            if self._closed:
                return NetSnapshot(time.monotonic_ns(), (), (), None, errors=("closed",))
            gone = self._namespaces(pids, errors)
            read_qdiscs = self._count % self.qdisc_every == 0
            read_links = self._count % self.link_every == 0
            self._count += 1
            now = time.monotonic_ns()
            ifaces: list[InterfaceSample] = []
            qdiscs: list[QdiscSample] = []
            ticked: list[int] = []  # the fast sampler's reading times, if it read every namespace
            for ns in self._ns.values():
                rows = fast.of_namespace(ns.inode) if fast is not None else {}
                if rows and not fresh:
                    ticked.extend(r.time_ns for r in rows.values())
                else:
                    ticked.append(-1)  # read here, now
                try:
                    links = self._interfaces(ns, read_links, rows, fresh)
                    ifaces.extend(links)
                    if read_qdiscs:
                        names = {i.index: i.name for i in links}
                        qdiscs.extend(self._qdiscs(ns, names))
                except OSError as e:
                    errors.append(f"netns {ns.inode}: netlink dump failed ({e})")
            if ticked and min(ticked) >= 0:
                now = max(ticked)  # the counters are as they stood at the last tick
            return NetSnapshot(
                time_ns=now,
                namespaces=tuple(Netns(ns.inode, tuple(sorted(ns.pids)), ns.host) for ns in self._ns.values()),
                interfaces=tuple(ifaces),
                qdiscs=tuple(qdiscs) if read_qdiscs else None,
                gone_namespaces=gone,
                errors=tuple(errors),
            )

    def _dump(self, ns: _Namespace, kind: int, body: bytes) -> Iterator[tuple[bytes, int, int]]:
        """(buffer, message body start, message end) of each answer to a dump request."""
        ns.seq += 1
        return ask(ns.rtnl, kind, NLM_F_DUMP, ns.seq, body)

    def _interfaces(
        self, ns: _Namespace, read_links: bool, fast: dict[int, IfWindow], fresh: bool = False
    ) -> list[InterfaceSample]:
        if read_links or ns.links_read < 0:
            self._links(ns)
        stats = {i: w.counters for i, w in fast.items()} if fast and not fresh else self._stats(ns)
        if any(index not in ns.links for index in stats):
            self._links(ns)  # an interface appeared since the last read: name it now
        out = []
        for index, (rx_p, tx_p, rx_b, tx_b, rx_e, tx_e, rx_d, tx_d) in stats.items():
            w = fast.get(index)
            link = ns.links.get(index)
            if link is None:
                continue  # created and deleted between the two dumps
            name, oper, speed = link
            out.append(
                InterfaceSample(
                    netns=ns.inode,
                    index=index,
                    name=name,
                    operstate=oper,
                    speed_bits_per_s=speed,
                    shaped_bits_per_s=ns.shaped.get(index),
                    rx_bytes=rx_b,
                    tx_bytes=tx_b,
                    rx_packets=rx_p,
                    tx_packets=tx_p,
                    rx_errors=rx_e,
                    tx_errors=tx_e,
                    rx_dropped=rx_d,
                    tx_dropped=tx_d,
                    peak_rx_bytes_per_s=w.peak_rx_bytes_per_s if w is not None and w.ticks >= 1 else None,
                    peak_tx_bytes_per_s=w.peak_tx_bytes_per_s if w is not None and w.ticks >= 1 else None,
                    fast_ticks=w.ticks if w is not None else 0,
                )
            )
        for index in [i for i in ns.links if i not in stats]:
            del ns.links[index]  # gone
        return out

    def _stats(self, ns: _Namespace) -> dict[int, tuple[int, ...]]:
        """index -> the first eight counters of rtnl_link_stats64, for every interface (RTM_GETSTATS)."""
        out: dict[int, tuple[int, ...]] = {}
        body = _IF_STATS_MSG.pack(socket.AF_UNSPEC, 0, 1 << (IFLA_STATS_LINK_64 - 1))
        for buf, start, end in self._dump(ns, RTM_GETSTATS, body):
            _family, index, _mask = _IF_STATS_MSG.unpack_from(buf, start)
            for kind, a, b in attrs(buf, start + _IF_STATS_MSG.size, end):
                if kind == IFLA_STATS_LINK_64 and b - a >= _STATS64.size:
                    out[index] = _STATS64.unpack_from(buf, a)
        return out

    def _links(self, ns: _Namespace) -> None:
        """Names, operational states and speeds of the namespace's interfaces (RTM_GETLINK)."""
        links: dict[int, tuple[str, str | None, int | None]] = {}
        for buf, start, end in self._dump(ns, RTM_GETLINK, _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
            _family, _type, index, _flags, _change = _IFINFOMSG.unpack_from(buf, start)
            name = ""
            oper: str | None = None
            for kind, a, b in attrs(buf, start + _IFINFOMSG.size, end):
                if kind == IFLA_IFNAME:
                    name = buf[a:b].split(b"\0", 1)[0].decode(errors="replace")
                elif kind == IFLA_OPERSTATE:
                    state = buf[a]
                    oper = OPERSTATES[state] if state < len(OPERSTATES) else str(state)
            links[index] = (name, oper, self._speed(ns, index, name, oper))
        for key in [k for k in ns.speeds if links.get(k[0], ("",))[0] != k[1]]:
            del ns.speeds[key]
        ns.links = links
        ns.links_read = self._count

    def _speed(self, ns: _Namespace, index: int, name: str, oper: str | None) -> int | None:
        """Link speed by ethtool ioctl, asked once per interface and again when its state changes."""
        cached = ns.speeds.get((index, name))
        if cached is not None and cached[0] == oper:
            return cached[1]
        # struct ethtool_cmd (44 bytes): speed at 12, speed_hi at 28, in Mb/s; struct ifreq: name, then a pointer.
        cmd = ctypes.create_string_buffer(struct.pack("=I", ETHTOOL_GSET) + bytes(40))
        ifreq = bytearray(struct.pack("=16sQ", name.encode()[:15], ctypes.addressof(cmd)) + bytes(16))
        speed: int | None = None
        try:
            fcntl.ioctl(ns.inet.fileno(), SIOCETHTOOL, ifreq)
            (lo,) = struct.unpack_from("=H", cmd.raw, 12)
            (hi,) = struct.unpack_from("=H", cmd.raw, 28)
            mbps = lo | (hi << 16)
            if mbps not in (0, SPEED_UNKNOWN, 0xFFFF):
                speed = mbps * 1_000_000
        except OSError:
            pass  # no ethtool support (lo, tunnels): unknown speed
        ns.speeds[(index, name)] = (oper, speed)
        return speed

    def _qdiscs(self, ns: _Namespace, names: dict[int, str]) -> list[QdiscSample]:
        out = []
        roots: dict[int, int | None] = {}
        for buf, start, end in self._dump(ns, RTM_GETQDISC, _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
            _family, ifindex, handle, parent, _info = _TCMSG.unpack_from(buf, start)
            kind = ""
            basic = (0, 0)
            queue = (0, 0, 0, 0, 0)
            options: tuple[int, int] | None = None
            for t, a, b in attrs(buf, start + _TCMSG.size, end):
                if t == TCA_KIND:
                    kind = buf[a:b].split(b"\0", 1)[0].decode(errors="replace")
                elif t == TCA_OPTIONS:
                    options = (a, b)
                elif t == TCA_STATS2:
                    for t2, a2, b2 in attrs(buf, a, b):
                        if t2 == TCA_STATS_BASIC and b2 - a2 >= _BASIC.size:
                            basic = _BASIC.unpack_from(buf, a2)
                        elif t2 == TCA_STATS_QUEUE and b2 - a2 >= _QUEUE.size:
                            queue = _QUEUE.unpack_from(buf, a2)
            qlen, backlog, drops, requeues, overlimits = queue
            rate = _tbf_rate(buf, *options) if kind == "tbf" and options is not None else None
            if parent == TC_H_ROOT:
                roots[ifindex] = rate
            out.append(
                QdiscSample(
                    netns=ns.inode,
                    ifindex=ifindex,
                    ifname=names.get(ifindex, ""),
                    kind=kind,
                    handle=handle,
                    parent=parent,
                    bytes=basic[0],
                    packets=basic[1],
                    drops=drops,
                    overlimits=overlimits,
                    requeues=requeues,
                    backlog_bytes=backlog,
                    qlen=qlen,
                    rate_bits_per_s=rate,
                )
            )
        ns.shaped = {i: r for i, r in roots.items() if r}
        return out
