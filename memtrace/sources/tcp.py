"""A process's established TCP connections and their round trips, through sock_diag.

Read every few windows for the training loops that step (their round trips
while healthy: a baseline), and when the diagnosis asks (a process slowed
while waiting off the GPU, memtrace.analysis.diagnosis). Its sockets are
found in its open files (/proc/PID/fd); their tcp_info (INET_DIAG_INFO)
comes from a dump of its network namespace's established TCP sockets, or
from a lookup of each known one. A namespace other than the agent's is read
from a sock_diag socket made inside it (sources/netdev.sockets_in: a short
thread's setns), kept while a process there is read, so nothing pins a
namespace for long. Parsed with struct: the few fields memtrace needs, as
`ss -ti` reads them. A kernel whose tcp_info lacks tcpi_min_rtt (before
4.6) gives no connections.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from memtrace.core.tcp import TcpPath
from memtrace.sources.netdev import NLM_F_DUMP, ask, attrs, sockets_in

# linux/sock_diag.h, linux/inet_diag.h, linux/tcp.h
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
TCPF_ESTABLISHED = 1 << 1
_SOCKID = 48
_REQ = struct.Struct("=BBBxI48x")  # inet_diag_req_v2: family, protocol, extensions, states, sockid
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport (big-endian), src, dst (16 bytes
# each), interface, cookie; expires, rqueue, wqueue, uid, inode.
_MSG = struct.Struct("=BBBB2H16s16sI8xIIIII")
# struct tcp_info, the fields read (offsets from linux/tcp.h, stable since 4.10 for the last of them):
# tcpi_last_data_sent 44, tcpi_last_data_recv 52, tcpi_rtt 68, tcpi_total_retrans 100,
# tcpi_bytes_acked 120, tcpi_bytes_received 128, tcpi_min_rtt 148.
_LAST_SENT, _LAST_RECV, _RTT, _RETRANS, _ACKED, _RECEIVED, _MIN_RTT = 44, 52, 68, 100, 120, 128, 148
_TCP_INFO_MIN = 152
_U32, _U64 = struct.Struct("=I"), struct.Struct("=Q")


def _socket_inodes(pid: int, proc: str) -> tuple[set[int], int]:
    """The inodes of the sockets the process holds open, and how many files it holds."""
    out: set[int] = set()
    fds = f"{proc}/{pid}/fd"
    files = os.listdir(fds)
    for fd in files:
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out, len(files)


def _address(family: int, raw: bytes, port: int) -> str:
    if family == socket.AF_INET:
        return f"{ipaddress.IPv4Address(raw[:4])}:{port}"
    addr = ipaddress.IPv6Address(raw)
    if addr.ipv4_mapped is not None:
        return f"{addr.ipv4_mapped}:{port}"
    return f"[{addr}]:{port}"


def _ask(
    sock: socket.socket, family: int, inodes: AbstractSet[int], sockid: bytes | None = None
) -> list[tuple[TcpPath, int, bytes]]:
    """The established TCP sockets of one family among `inodes`, each with its inet_diag_sockid
    (to ask for it alone later): all of the namespace's dumped (the kernel walks its whole
    connection table: about 0.2 ms a family here), or, given a sockid, that one socket looked
    up (a hash lookup: about 7 us); [] where it is gone."""
    seq = family + (0x100 if sockid is not None else 0)
    body = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), TCPF_ESTABLISHED)
    if sockid is not None:
        body = body[: _REQ.size - len(sockid)] + sockid
    out: list[tuple[TcpPath, int, bytes]] = []
    try:
        for buf, body_at, end in ask(sock, SOCK_DIAG_BY_FAMILY, NLM_F_DUMP if sockid is None else 0, seq, body):
            fam, _state, _timer, _retrans, sport, dport, src, dst, _if, _exp, _rq, _wq, _uid, inode = _MSG.unpack_from(
                buf, body_at
            )
            if inode not in inodes:
                continue
            for kind, at, at_end in attrs(buf, body_at + _MSG.size, end):
                if kind == INET_DIAG_INFO and at_end - at >= _TCP_INFO_MIN:
                    path = _path(buf, at, fam, src, dst, sport, dport, inode)
                    out.append((path, fam, bytes(buf[body_at + 4 : body_at + 4 + _SOCKID])))
    except OSError as e:
        if e.errno != errno.ENOENT or sockid is None:
            raise
        return []  # the one looked up closed since
    return out


def _path(buf: bytes, i: int, fam: int, src: bytes, dst: bytes, sport: int, dport: int, inode: int) -> TcpPath:
    """A TcpPath from the struct tcp_info at buf[i:]."""
    (last_sent,) = _U32.unpack_from(buf, i + _LAST_SENT)
    (last_recv,) = _U32.unpack_from(buf, i + _LAST_RECV)
    (rtt,) = _U32.unpack_from(buf, i + _RTT)
    (retrans,) = _U32.unpack_from(buf, i + _RETRANS)
    (acked,) = _U64.unpack_from(buf, i + _ACKED)
    (received,) = _U64.unpack_from(buf, i + _RECEIVED)
    (min_rtt,) = _U32.unpack_from(buf, i + _MIN_RTT)
    return TcpPath(
        local=_address(fam, src, socket.ntohs(sport)),
        peer=_address(fam, dst, socket.ntohs(dport)),
        srtt_us=int(rtt),
        min_rtt_us=0 if min_rtt == 0xFFFFFFFF else int(min_rtt),  # ~0: none measured yet
        last_send_ms=int(last_sent),
        last_recv_ms=int(last_recv),
        bytes_acked=int(acked),
        bytes_received=int(received),
        retransmits=int(retrans),
        inode=inode,
    )


@dataclass
class _Scan:
    """A process's sockets as its files were last read, and its TCP connections' sockids as
    the dump after that scan found them (None: not dumped since the scan)."""

    at: float
    ns: int
    inodes: frozenset[int]
    files: int
    ids: tuple[tuple[int, bytes], ...] | None = None


class TcpSource:
    """Reads processes' TCP connections on demand. Counts what it could not read.

    A process's open sockets are found by reading its fd table (a readlink per file: about 6
    us each here, so 5 ms for four processes of 200 files) and its connections in a dump of
    its namespace's (0.5 ms, the kernel's walk of its table). A read with fresh=False
    takes both from the last scan while it is younger than RESCAN_S and looks each connection
    up alone (7 us), and keeps each namespace's sock_diag socket open between reads (one made
    in another namespace costs a thread's setns). A connection made since is missed until the
    next scan: it has no baseline then. A process of many files is scanned less often: at most
    SCAN_SHARE of a core's time goes to its scans (one of 10,000 files, every minute)."""

    name = "tcp"
    RESCAN_S = 10.0
    SCAN_S_PER_FILE = 6e-6  # a readlink of /proc/PID/fd/N, from Python, on the development VM
    SCAN_SHARE = 0.001

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.clock = clock
        self.scans = 0  # fd tables read
        self.failures = 0
        self.last_error = ""
        self.last_errno = 0  # of the last failure (ENOENT: the process had exited)
        self._own = os.stat(f"{proc}/self/ns/net").st_ino
        self._scans: dict[int, _Scan] = {}  # pid -> its last scan
        self._sockets: dict[int, socket.socket] = {}  # netns inode -> its sock_diag socket

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()

    def paths(self, pid: int) -> tuple[TcpPath, ...] | None:
        """Its established TCP connections (IPv4 and IPv6), its files scanned now; None where
        they could not be read (the process is gone, no privilege to enter its namespace, no
        sock_diag), counted."""
        return self.paths_of([pid])[pid]

    def paths_of(
        self, pids: list[int], fresh: bool = True, prune: bool = False
    ) -> dict[int, tuple[TcpPath, ...] | None]:
        """paths() of each pid, with one dump per network namespace they share. With fresh=False,
        a scan of their files younger than rescan_s() is reused and its connections are looked
        up one by one, not dumped. With prune (a baseline's read of every process that steps),
        what is kept of processes and namespaces not among pids goes."""
        out: dict[int, tuple[TcpPath, ...] | None] = {}
        by_ns: dict[int, dict[int, _Scan]] = {}  # netns inode -> pid -> its scan
        now = self.clock()
        for pid in pids:
            try:
                scan = self._scans.get(pid)
                if fresh or scan is None or now - scan.at > self.rescan_s(scan.files):
                    found, files = _socket_inodes(pid, self.proc)
                    self.scans += 1
                    ns = os.stat(f"{self.proc}/{pid}/ns/net").st_ino if found else 0
                    scan = self._scans[pid] = _Scan(now, ns, frozenset(found), files)
                if not scan.inodes:
                    out[pid] = ()
                    continue
                by_ns.setdefault(scan.ns, {})[pid] = scan
            except OSError as e:
                self._scans.pop(pid, None)
                self._failed(pid, e)
                out[pid] = None
        for ns, mine in by_ns.items():
            pid = next(iter(mine))
            try:
                sock = self._socket(ns, pid)
                if all(x.ids is not None for x in mine.values()):
                    for p, x in mine.items():  # known connections, each looked up
                        got = [g for fam, sid in x.ids or () for g in _ask(sock, fam, x.inodes, sid)]
                        out[p] = tuple(path for path, _fam, _sid in got)
                    continue
                every = frozenset().union(*(x.inodes for x in mine.values()))
                got = _ask(sock, socket.AF_INET, every) + _ask(sock, socket.AF_INET6, every)
                for p, x in mine.items():
                    x.ids = tuple((fam, sid) for path, fam, sid in got if path.inode in x.inodes)
                    out[p] = tuple(path for path, _fam, _sid in got if path.inode in x.inodes)
            except OSError as e:
                self._drop(ns)
                for p in mine:
                    self._scans.pop(p, None)
                self._failed(pid, e)
                out.update(dict.fromkeys(mine))
        if prune:
            for pid in self._scans.keys() - set(pids):
                del self._scans[pid]
            for ns in self._sockets.keys() - by_ns.keys():
                self._drop(ns)  # a socket pins its namespace: none kept where no process is read
        return out

    def rescan_s(self, files: int) -> float:
        """How long a baseline read reuses the scan of a process of this many files."""
        return max(self.RESCAN_S, files * self.SCAN_S_PER_FILE / self.SCAN_SHARE)

    def _socket(self, ns: int, pid: int) -> socket.socket:
        """The sock_diag socket of the namespace (its inode) pid is in."""
        sock = self._sockets.get(ns)
        if sock is not None:
            return sock
        if ns == self._own:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        else:
            fd = os.open(f"{self.proc}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                (sock,) = sockets_in(fd, (socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG))
            finally:
                os.close(fd)
        self._sockets[ns] = sock
        return sock

    def _drop(self, ns: int) -> None:
        sock = self._sockets.pop(ns, None)
        if sock is not None:
            sock.close()

    def _failed(self, pid: int, e: OSError) -> None:
        self.failures += 1
        self.last_error = f"pid {pid}: {e.strerror or e}"
        self.last_errno = e.errno or 0
