"""The TCP source (memtrace/sources/tcp.py) against the kernel's own tcp_info,
over a real veth pair with a tbf shaper (tests/test_netdev.py's pair): a
client in one namespace waits for a sink's reply in the other, as a rank
waits for its peer's. Healthy, its round trip stays near its least; with a
bulk flow filling the sink's side of the link, the replies queue behind it
and the round trip the source reads is many times its least. Stopped, every
field the source reads is the one the client's own getsockopt(TCP_INFO)
gives."""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import time
from pathlib import Path

import pytest
from peers import ACK_SINK, DRAIN
from test_netdev import Pair, pair  # noqa: F401 - the fixture

from memtrace.sources.tcp import TcpSource

PORT, BULK_PORT = 5311, 5312
REQUEST = 128 << 10

# In namespace b: requests until told (a line on stdin) to stop, then its own TCP_INFO, then waits.
CLIENT = f"""
import select, socket, struct, sys, time
c = socket.create_connection((sys.argv[1], {PORT}))
print("port", c.getsockname()[1], flush=True)
b = bytes({REQUEST})
while not select.select([sys.stdin], [], [], 0)[0]:
    c.sendall(b)
    assert c.recv(1) == b"k"
    time.sleep(0.02)
sys.stdin.readline()
i = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
u32 = lambda o: struct.unpack_from("=I", i, o)[0]
u64 = lambda o: struct.unpack_from("=Q", i, o)[0]
print({{"srtt": u32(68), "min": u32(148), "acked": u64(120), "received": u64(128), "retrans": u32(100)}}, flush=True)
sys.stdin.read()
"""

# In namespace a: four bulk flows out through its shaper.
BULK = f"""
import socket, sys, threading
def send():
    s = socket.create_connection((sys.argv[1], {BULK_PORT}))
    b = bytes(1 << 20)
    while True:
        s.sendall(b)
for _ in range(4):
    threading.Thread(target=send, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _own_info(sock: socket.socket) -> tuple[int, int, int, int]:
    """srtt, min_rtt, bytes_acked, bytes_received from the socket's own TCP_INFO."""
    i = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return (
        struct.unpack_from("=I", i, 68)[0],
        struct.unpack_from("=I", i, 148)[0],
        struct.unpack_from("=Q", i, 120)[0],
        struct.unpack_from("=Q", i, 128)[0],
    )


def test_each_connection_dumped_or_looked_up_is_the_kernels_own_tcp_info() -> None:
    """The test's own connections, IPv4, IPv6 and IPv4 on an IPv6 socket: the dump (paths) and
    the one-by-one lookups of a baseline read (paths_of, fresh=False) give each connection's
    fields as its own getsockopt(TCP_INFO) does; a connection closed since is gone from the
    lookups, not an error."""
    made: list[socket.socket] = []

    def connect(family: int, host: str) -> tuple[socket.socket, socket.socket]:
        srv = socket.socket(family)
        srv.bind((host, 0))
        srv.listen(1)
        c = socket.create_connection((host if family == socket.AF_INET else "::1", srv.getsockname()[1]))
        a, _ = srv.accept()
        made.extend((srv, c, a))
        for _ in range(20):
            c.sendall(b"x" * 5000)
            got = 0
            while got < 5000:
                got += len(a.recv(5000 - got))
            a.sendall(b"y")
            c.recv(1)
        return c, a

    try:
        pairs = [connect(socket.AF_INET, "127.0.0.1"), connect(socket.AF_INET6, "::1")]
        mapped = socket.socket(socket.AF_INET6)
        mapped.bind(("::", 0))
        mapped.listen(1)
        made.append(mapped)
        c4 = socket.create_connection(("127.0.0.1", mapped.getsockname()[1]))
        a6, _ = mapped.accept()
        made.extend((c4, a6))
        c4.sendall(b"z")
        a6.recv(1)
        ends = [x for p in pairs for x in p] + [c4, a6]
        source = TcpSource()
        dumped = {p.inode: p for p in source.paths(os.getpid()) or ()}
        looked = {p.inode: p for p in source.paths_of([os.getpid()], fresh=False)[os.getpid()] or ()}
        for end in ends:
            ino = os.fstat(end.fileno()).st_ino
            want = _own_info(end)
            for got in (dumped[ino], looked[ino]):
                assert (got.srtt_us, got.min_rtt_us, got.bytes_acked, got.bytes_received) == want
                assert got.local.rsplit(":", 1)[1] == str(end.getsockname()[1])
        assert a6.getpeername()[0] == "::ffff:127.0.0.1" and dumped[os.fstat(a6.fileno()).st_ino].peer.startswith(
            "127.0.0.1:"
        )
        assert len(looked) == len(dumped) == len(ends)
        gone = os.fstat(c4.fileno()).st_ino
        c4.close()
        a6.close()
        looked = {p.inode: p for p in source.paths_of([os.getpid()], fresh=False)[os.getpid()] or ()}
        assert gone not in looked and len(looked) == len(ends) - 2 and source.failures == 0
    finally:
        for x in made:
            x.close()


def test_a_process_of_many_files_is_scanned_less_often(tmp_path: Path) -> None:
    """A baseline read reuses a process's last scan of its files for RESCAN_S (10 s), and for
    longer where its files are many (at most SCAN_SHARE of a core on its scans): a process of
    20,000 files (a loader's open shards) every 2 minutes, not every 10 s. A fresh read always
    scans. A pruning read (the runtime's baseline read of every process that steps) lets go of
    the scans of processes not among its pids; another read keeps them. Its files are a /proc
    of this test's making; its namespace is the test's own."""
    now = [1000.0]

    def proc_of(pid: int, files: int) -> None:
        fd = tmp_path / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n in range(files):
            (fd / str(n)).symlink_to(f"socket:[{900000 + n}]" if n < 3 else f"/data/shard-{n}")
        (tmp_path / str(pid) / "ns").mkdir()
        (tmp_path / str(pid) / "ns" / "net").symlink_to("/proc/self/ns/net")

    (tmp_path / "self").symlink_to(f"/proc/{os.getpid()}")
    proc_of(10, 200)
    proc_of(11, 20_000)
    source = TcpSource(proc=str(tmp_path), clock=lambda: now[0])
    assert source.rescan_s(200) == source.RESCAN_S == 10.0 and source.rescan_s(20_000) == pytest.approx(120.0)
    for pid, files in ((10, 200), (11, 20_000)):
        source.scans = 0
        assert source.paths_of([pid], fresh=False) == {pid: ()}  # sockets, none of them TCP
        for step in (5.0, 10.1, 60.0, 121.0):
            now[0] += step
            source.paths_of([pid], fresh=False)
        # 200 files: rescanned after 10.1 s, 60 s and 121 s; 20,000: after 121 s (196 s since) only.
        assert source.scans == (4 if files == 200 else 2), (pid, source.scans)
        source.paths(pid)
        assert source.scans == (5 if files == 200 else 3)
    source.paths(10)
    source.scans = 0
    source.paths_of([11], fresh=False)  # pid 10's scan (just made) kept
    source.paths_of([10], fresh=False)
    assert source.scans == 0
    source.paths_of([11], fresh=False, prune=True)  # pid 10's let go: scanned again
    source.paths_of([10], fresh=False)
    assert source.scans == 1 and source.failures == 0


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make network namespaces")
def test_a_clients_round_trip_is_the_kernels_and_rises_when_its_peers_replies_queue(pair: Pair) -> None:  # noqa: F811
    procs = []
    source = TcpSource()
    try:
        sink = pair.run(pair.a, ACK_SINK, "0.0.0.0", str(PORT), str(REQUEST))  # one byte for each request
        drain = pair.run(pair.b, DRAIN, "0.0.0.0", str(BULK_PORT))  # what the bulk flows send
        procs += [sink, drain]
        for p in (sink, drain):
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        client = pair.run(pair.b, CLIENT, pair.ip_a)
        procs.append(client)
        assert client.stdout is not None
        port = int(client.stdout.readline().split()[1])
        # Healthy: one connection, the client's, to the sink, read five times as the runtime
        # reads it (every second): the baseline its round trips are judged against.
        healthy = []
        for _ in range(5):
            time.sleep(0.5)
            (path,) = source.paths_of([client.pid], fresh=False)[client.pid] or ()
            assert (path.local, path.peer) == (f"{pair.ip_b}:{port}", f"{pair.ip_a}:{PORT}")
            assert path.min_rtt_us > 0 and min(path.last_send_ms, path.last_recv_ms) < 1000
            healthy.append(path.srtt_us)
        typical, highest = sorted(healthy)[2], max(healthy)
        # Several processes at once (one dump per namespace): the sink's end is the client's, mirrored.
        got = source.paths_of([client.pid, sink.pid])
        ((mine,), (theirs,)) = got[client.pid] or (), got[sink.pid] or ()
        assert (mine.local, mine.peer) == (theirs.peer, theirs.local) and mine.inode != theirs.inode
        assert not path.queued(typical, highest, 2000, 2.0, 2000), (path, healthy)
        # The sink's side of the link filled by bulk flows: its replies queue in its shaper.
        bulk = pair.run(pair.a, BULK, pair.ip_b)
        procs.append(bulk)
        assert bulk.stdout is not None and bulk.stdout.readline().strip() == "ready"
        queued = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not queued:
            time.sleep(0.25)
            queued = [p for p in source.paths(client.pid) or () if p.queued(typical, highest, 2000, 2.0, 2000)]
        assert queued, (source.paths(client.pid), healthy)
        assert queued[0].srtt_us >= 2 * typical and queued[0].srtt_us >= highest + 2000
        # Stopped: each field is the client's own TCP_INFO.
        assert client.stdin is not None
        client.stdin.write("stop\n")
        client.stdin.flush()
        own = json.loads(client.stdout.readline().replace("'", '"'))
        (path,) = source.paths(client.pid) or ()
        assert (path.srtt_us, path.min_rtt_us, path.bytes_acked, path.bytes_received, path.retransmits) == (
            own["srtt"],
            own["min"],
            own["acked"],
            own["received"],
            own["retrans"],
        )
        # Every request acknowledged (and the SYN: one more) and answered with its one byte.
        assert (path.bytes_acked - 1) % REQUEST == 0 and path.bytes_received == (path.bytes_acked - 1) // REQUEST
        assert source.failures == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # Gone: None, counted and said.
    assert source.paths(client.pid) is None
    assert source.failures == 1 and str(client.pid) in source.last_error and source.last_errno == errno.ENOENT
