"""The netdev source against real traffic through a veth pair between two network namespaces the test makes.

The test sets up with `ip` and `tc` (memtrace itself never runs them): two
namespaces, a veth pair, addresses inside them only, IPv6 off (so that no
router solicitation adds packets of its own), and a `tbf` qdisc as the link
rate on the sending end. Traffic never leaves these namespaces. memtrace's
figures are checked against the kernel's own counters, read independently
(/sys/class/net inside the namespace, `tc -s -j`), and against what was sent.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conftest import python_as_nobody

from memtrace.core.netdev import IFACE_COUNTERS, InterfaceSample, NetSnapshot, net_rates
from memtrace.sources.fastsample import FastSampler
from memtrace.sources.netdev import NetdevSource

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make network namespaces")

SERVER = """
import socket, sys
proto, port = sys.argv[1], int(sys.argv[2])
if proto == "tcp":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); n = 0
    while True:
        b = c.recv(1 << 16)
        if not b: break
        n += len(b)
    c.close(); print(n, flush=True)
    sys.stdin.read()  # stay (a process living in this namespace) until the test closes stdin
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port)); print("ready", flush=True)
    sys.stdin.read()
"""

CLIENT = """
import socket, sys
proto, host, port, total, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
chunk = b"x" * size
if proto == "tcp":
    c = socket.create_connection((host, port))
    sent = 0
    while sent < total:
        sent += c.send(chunk[: min(size, total - sent)])
    c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
else:
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # A send buffer larger than the tbf queue (SO_SNDBUFFORCE, as root): the qdisc, not the socket, must give.
    c.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)
    for _ in range(total):
        c.sendto(chunk, (host, port))
print("done", flush=True)
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


@dataclass
class Pair:
    a: str  # namespace names
    b: str
    va: str  # veth ends
    vb: str
    ip_a: str
    ip_b: str

    def sysfs(self, ns: str, dev: str) -> dict[str, int]:
        out = sh("ip", "netns", "exec", ns, "sh", "-c", f"cd /sys/class/net/{dev}/statistics && grep . *")
        return {k: int(v) for k, v in (line.split(":") for line in out.split())}

    def tc(self, ns: str, dev: str) -> dict[str, int]:
        (q,) = [
            q for q in json.loads(sh("tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev)) if q["kind"] == "tbf"
        ]
        return {k: q[k] for k in ("bytes", "packets", "drops", "overlimits", "requeues", "backlog", "qlen")}

    def run(self, ns: str, code: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:8]
    p = Pair(f"mta{tag}", f"mtb{tag}", f"va{tag}", f"vb{tag}", "10.231.7.1", "10.231.7.2")
    try:
        for ns in (p.a, p.b):
            sh("ip", "netns", "add", ns)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", p.va, "netns", p.a, "type", "veth", "peer", "name", p.vb, "netns", p.b)
        sh("ip", "-n", p.a, "addr", "add", f"{p.ip_a}/24", "dev", p.va)
        sh("ip", "-n", p.b, "addr", "add", f"{p.ip_b}/24", "dev", p.vb)
        sh(
            "tc",
            "-n",
            p.a,
            "qdisc",
            "add",
            "dev",
            p.va,
            "root",
            "tbf",
            "rate",
            "50mbit",
            "burst",
            "32kb",
            "latency",
            "50ms",
        )
        sh("ip", "-n", p.a, "link", "set", p.va, "up")
        sh("ip", "-n", p.b, "link", "set", p.vb, "up")
        yield p
    finally:
        for ns in (p.a, p.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def ns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def iface(snap: NetSnapshot, netns: int, name: str) -> InterfaceSample:
    (i,) = [i for i in snap.interfaces if i.netns == netns and i.name == name]
    return i


def quiet_sample(
    source: NetdevSource,
    pair: Pair,
    pids: list[int],
    reads: list[tuple[str, str]],
    fast: FastSampler | None = None,
    seen: list[NetSnapshot] | None = None,
) -> tuple[NetSnapshot, list[dict[str, int]]]:
    """A snapshot taken while the kernel's own counters stood still (read before and after it). With
    `fast`, the snapshot's counters are the fast sampler's last tick's: the tick must have come after
    the traffic too, so the snapshot must also hold the counters read after it."""
    for _ in range(20):
        before = [pair.sysfs(ns, dev) for ns, dev in reads]
        snap = source.poll(pids, fast=fast.poll() if fast is not None else None)
        if seen is not None:
            seen.append(snap)
        after = [pair.sysfs(ns, dev) for ns, dev in reads]
        held = [next(i for i in snap.interfaces if i.name == dev) for _ns, dev in reads]
        if before == after and all(i.tx_bytes == k["tx_bytes"] for i, k in zip(held, after, strict=True)):
            return snap, after
    raise AssertionError("the links never went quiet")


@pytest.mark.parametrize("with_fast", [False, True], ids=["python", "fast"])
def test_counters_are_the_kernels_and_both_ends_agree(pair: Pair, with_fast: bool) -> None:
    """With the fast sampler (memtrace's C thread at 200 Hz here) the counters are its own, read
    through sockets it was handed for each namespace: the same figures, and each tick's rates."""
    server = pair.run(pair.b, SERVER, "tcp", "5001")
    idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    fast = FastSampler(200) if with_fast else None
    source = NetdevSource(fast=fast)
    try:
        if fast is not None:
            fast.start()
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        pids = [server.pid, idle.pid]
        ends = [(pair.a, pair.va), (pair.b, pair.vb)]
        first, _ = quiet_sample(source, pair, pids, ends, fast)
        payload = 3_000_000
        client = pair.run(pair.a, CLIENT, "tcp", pair.ip_b, "5001", str(payload), "65536")
        assert client.communicate(timeout=60)[0].strip() == "done"
        assert server.stdout.readline().strip() == str(payload)
        seen: list[NetSnapshot] = []
        last, (kernel_a, kernel_b) = quiet_sample(source, pair, pids, ends, fast, seen)
    finally:
        source.close()
        if fast is not None:
            fast.close()
        for p in (server, idle):
            p.communicate(timeout=30)
    ns_a, ns_b = ns_inode_of(last, idle.pid), ns_inode_of(last, server.pid)
    a, b = iface(last, ns_a, pair.va), iface(last, ns_b, pair.vb)
    for name in IFACE_COUNTERS:
        assert getattr(a, name) == kernel_a[name], name
        assert getattr(b, name) == kernel_b[name], name
    rates = net_rates(first, last)
    assert rates is not None
    (ra,) = [r for r in rates.interfaces if (r.netns, r.name) == (ns_a, pair.va)]
    (rb,) = [r for r in rates.interfaces if (r.netns, r.name) == (ns_b, pair.vb)]
    # A veth delivers what one end sends to the other, packet for packet.
    assert ra.deltas["tx_bytes"] == rb.deltas["rx_bytes"] and ra.deltas["tx_packets"] == rb.deltas["rx_packets"]
    assert ra.deltas["rx_bytes"] == rb.deltas["tx_bytes"]
    # The payload plus TCP/IP/Ethernet headers (66 bytes a segment at most with timestamps, ARP and the
    # handshake): never less than what was sent, and at most the headers of one segment per packet more.
    assert payload < ra.deltas["tx_bytes"] <= payload + 100 * ra.deltas["tx_packets"]
    assert ra.counter_resets == 0 and rates.counter_resets == 0
    assert ra.per_second("tx_bytes") == ra.deltas["tx_bytes"] / rates.interval_s
    assert a.speed_bits_per_s == 10_000_000_000  # what veth reports through ethtool
    assert ra.utilization is not None and 0 < ra.utilization < 1
    if with_fast:
        assert a.fast_ticks >= 1 and b.fast_ticks >= 1
        # The snapshots are stamped with their last tick, and the ticks between two snapshots cover
        # the time between them: their busiest is at least as busy as the mean over it (1% for the
        # microseconds between reading one namespace and the next).
        peak_tx = max(iface(s, ns_a, pair.va).peak_tx_bytes_per_s or 0.0 for s in seen)
        peak_rx = max(iface(s, ns_b, pair.vb).peak_rx_bytes_per_s or 0.0 for s in seen)
        mean_tx, mean_rx = ra.per_second("tx_bytes"), rb.per_second("rx_bytes")
        assert peak_tx >= 0.99 * mean_tx > 0 and peak_rx >= 0.99 * mean_rx > 0, (peak_tx, mean_tx, peak_rx, mean_rx)
        # ...and a tick sees the link's rate, not the mean over a sample: the tbf (50 Mbit/s) ran
        # flat out for the transfer, far longer than a tick (5 ms), while the samples straddle it.
        assert peak_tx > mean_tx, (peak_tx, mean_tx)
    else:
        assert a.fast_ticks == 0 and a.peak_tx_bytes_per_s is None


def ns_inode_of(snap: NetSnapshot, pid: int) -> int:
    inode = snap.namespace_of(pid)
    assert inode is not None
    return inode


FORKS: list[int] = []
os.register_at_fork(before=lambda: FORKS.append(threading.get_native_id()))


def test_namespace_of_a_traced_process_is_found_and_shared_once(pair: Pair) -> None:
    """Entering the namespaces forks nothing (a fork of the multithreaded agent
    can deadlock its child) and leaves every thread of this process where it was."""
    procs = [
        pair.run(ns, "import sys; print('ready', flush=True); sys.stdin.read()") for ns in (pair.a, pair.a, pair.b)
    ]
    source = NetdevSource()
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        here = threading.get_native_id()
        forked = len([t for t in FORKS if t == here])
        snap = source.poll([p.pid for p in procs])
        assert len([t for t in FORKS if t == here]) == forked, "sampling a namespace forked"
        own = os.stat("/proc/self/ns/net").st_ino
        # Every live thread stays home (the one that entered a namespace has ended: Python's join
        # returns as it ends, before the kernel's task is gone, so /proc may list it a moment longer).
        live = {t.native_id for t in threading.enumerate()}
        assert {os.stat(f"/proc/self/task/{t}/ns/net").st_ino for t in live} == {own}
        inodes = [ns_inode(p.pid) for p in procs]  # read by the test, not by memtrace
    finally:
        source.close()
        for p in procs:
            p.communicate(timeout=30)
    a, a2, b = procs
    assert snap.namespace_of(a.pid) == inodes[0] == snap.namespace_of(a2.pid) == inodes[1]
    assert snap.namespace_of(b.pid) == inodes[2] != inodes[0]
    host = os.stat("/proc/self/ns/net").st_ino
    assert [(ns.inode, ns.pids, ns.host) for ns in snap.namespaces] == [
        (host, (), True),
        (inodes[0], tuple(sorted((a.pid, a2.pid))), False),  # two processes, one namespace, sampled once
        (inodes[2], (b.pid,), False),
    ]
    names_a = sorted(i.name for i in snap.interfaces if i.netns == inodes[0])
    assert names_a == sorted(["lo", pair.va])
    assert [q.kind for q in snap.qdiscs or () if q.netns == inodes[0] and q.ifname == pair.va] == ["tbf"]
    assert snap.errors == ()


def test_saturated_tbf_shows_backlog_overlimits_and_drops(pair: Pair) -> None:
    server = pair.run(pair.b, SERVER, "udp", "5002")
    idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    source = NetdevSource()
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        pids = [server.pid, idle.pid]
        first = source.poll(pids)
        kernel_first = pair.tc(pair.a, pair.va)
        # 4000 datagrams of 1400 bytes as fast as Python sends them: far above 50 Mbit/s for the bucket.
        datagrams = 4000
        client = pair.run(pair.a, CLIENT, "udp", pair.ip_b, "5002", str(datagrams), "1400")
        backlog_seen = 0
        while client.poll() is None:
            s = source.poll([*pids, client.pid])
            for q in s.qdiscs or ():
                if q.ifname == pair.va and q.kind == "tbf":
                    backlog_seen = max(backlog_seen, q.backlog_bytes)
        assert client.communicate(timeout=60)[0].strip() == "done"
        for _ in range(50):  # let the bucket drain
            last = source.poll(pids)
            kernel_last = pair.tc(pair.a, pair.va)
            if kernel_last["backlog"] == 0 and source.poll(pids).qdiscs == last.qdiscs:
                break
            time.sleep(0.1)
    finally:
        source.close()
        for p in (server, idle):
            p.communicate(timeout=30)
    (q,) = [q for q in last.qdiscs or () if q.ifname == pair.va and q.kind == "tbf"]
    assert q.netns == last.namespace_of(idle.pid) != last.namespace_of(server.pid)
    for k in ("bytes", "packets", "drops", "overlimits", "requeues"):
        assert getattr(q, k) == kernel_last[k], k
    assert (q.backlog_bytes, q.qlen) == (kernel_last["backlog"], kernel_last["qlen"]) == (0, 0)
    rates = net_rates(first, last)
    assert rates is not None
    (qr,) = [r for r in rates.qdiscs if r.ifname == pair.va and r.kind == "tbf"]
    assert qr.deltas["overlimits"] > 0 and qr.deltas["drops"] > 0
    assert qr.deltas["drops"] == kernel_last["drops"] - kernel_first["drops"]
    # Every datagram was either sent on or dropped by the qdisc (plus an ARP exchange at most).
    assert datagrams <= qr.deltas["packets"] + qr.deltas["drops"] <= datagrams + 2
    assert backlog_seen > 0  # the queue stood while the bucket was empty


def test_a_shaped_links_capacity_is_its_shapers_rate(pair: Pair) -> None:
    """A veth says 10 Gbit/s; the tbf on it lets 50 Mbit/s through. What the
    link can carry, and so its utilization, is the shaper's rate, read from
    the qdisc (its TCA_TBF_PARMS, or TCA_TBF_RATE64 above 32 bits of bytes a
    second), followed when it changes, and dropped when the shaper goes."""
    server = pair.run(pair.b, SERVER, "udp", "5003")
    idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    source = NetdevSource()
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        pids = [server.pid, idle.pid]
        source.poll(pids)  # the qdiscs read: the shaper known from the next sample on
        first = source.poll(pids)
        client = pair.run(pair.a, CLIENT, "udp", pair.ip_b, "5003", "500", "1400")
        assert client.communicate(timeout=60)[0].strip() == "done"
        last = source.poll(pids)
        netns = last.namespace_of(idle.pid)
        assert netns is not None
        va = iface(last, netns, pair.va)
        assert (va.speed_bits_per_s, va.shaped_bits_per_s) == (10_000_000_000, 50_000_000)
        assert va.capacity_bits_per_s == 50_000_000
        (q,) = [q for q in last.qdiscs or () if q.ifname == pair.va and q.kind == "tbf"]
        assert q.rate_bits_per_s == 50_000_000
        assert iface(last, last.namespace_of(server.pid) or 0, pair.vb).shaped_bits_per_s is None  # no shaper there
        rates = net_rates(first, last)
        assert rates is not None
        (r,) = [r for r in rates.interfaces if r.name == pair.va]
        assert r.deltas["tx_bytes"] > 0  # what the shaper let through (it dropped the rest)
        busiest = max(r.deltas["rx_bytes"], r.deltas["tx_bytes"]) * 8 / r.interval_s
        assert r.utilization == busiest / 50_000_000
        # A shaper faster than 32 bits of bytes a second: its rate in TCA_TBF_RATE64; the veth's speed is lower.
        sh("tc", "-n", pair.a, "qdisc", "change", "dev", pair.va, "root", "tbf", "rate", "40gbit", "burst", "32mb",
           "latency", "50ms")  # fmt: skip
        source.poll(pids)
        fast = iface(source.poll(pids), netns, pair.va)
        assert (fast.shaped_bits_per_s, fast.capacity_bits_per_s) == (40_000_000_000, 10_000_000_000)
        sh("tc", "-n", pair.a, "qdisc", "del", "dev", pair.va, "root")
        source.poll(pids)
        gone = iface(source.poll(pids), netns, pair.va)
        assert (gone.shaped_bits_per_s, gone.capacity_bits_per_s) == (None, 10_000_000_000)
    finally:
        source.close()
        for p in (server, idle):
            p.communicate(timeout=30)


def test_otlp_carries_each_interfaces_and_queues_counters_exactly(pair: Pair) -> None:
    """`memtrace push`'s network metrics, from real traffic through a tbf
    qdisc that drops: the veth's bytes and packets (system.network.*) and the
    queue's drops and overlimits (memtrace.qdisc.*) over the samples equal the
    kernel's own increase (sysfs and tc) exactly, and the queue's backlog is
    the one it last had."""
    from memtrace.export.config import resolve
    from memtrace.export.otlp import MetricsBuilder
    from memtrace.model import Model
    from memtrace.model.host import HostBook

    server = pair.run(pair.b, SERVER, "udp", "5003")
    idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    source = NetdevSource()
    book = HostBook()
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        pids = [server.pid, idle.pid]
        first, (sys_first,) = quiet_sample(source, pair, pids, [(pair.a, pair.va)])
        tc_first = pair.tc(pair.a, pair.va)
        book.add_net(first)
        client = pair.run(pair.a, CLIENT, "udp", pair.ip_b, "5003", "3000", "1400")
        while client.poll() is None:
            book.add_net(source.poll([*pids, client.pid]))
        assert client.communicate(timeout=60)[0].strip() == "done"
        for _ in range(50):  # the bucket drains
            if pair.tc(pair.a, pair.va)["backlog"] == 0:
                break
            time.sleep(0.1)
        last, (sys_last,) = quiet_sample(source, pair, pids, [(pair.a, pair.va)])
        tc_last = pair.tc(pair.a, pair.va)
        book.add_net(last)
    finally:
        source.close()
        for p in (server, idle):
            p.communicate(timeout=30)
    batch = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"}).build(
        Model(), {}, 0, host=book
    )
    (agent,) = [rm for rm in batch.data.resource_metrics if "process.pid" not in rm.resource.attributes]
    metrics = {m.name: m for sm in agent.scope_metrics for m in sm.metrics}

    def value(name: str, **attrs: object) -> float:
        (v,) = [
            p.value
            for p in metrics[name].data.data_points
            if p.time_unix_nano != p.start_time_unix_nano  # not the series' starting zero
            and all(p.attributes.get(k) == a for k, a in attrs.items())
        ]
        return v

    va = {"network.interface.name": pair.va, "memtrace.netns": first.namespace_of(idle.pid)}
    assert value("system.network.io", **va, **{"network.io.direction": "transmit"}) == (
        sys_last["tx_bytes"] - sys_first["tx_bytes"]
    )
    assert value("system.network.io", **va, **{"network.io.direction": "receive"}) == (
        sys_last["rx_bytes"] - sys_first["rx_bytes"]
    )
    assert value("system.network.packet.count", **va, **{"network.io.direction": "transmit"}) == (
        sys_last["tx_packets"] - sys_first["tx_packets"]
    )
    assert value("system.network.packet.dropped", **va, **{"network.io.direction": "transmit"}) == (
        sys_last["tx_dropped"] - sys_first["tx_dropped"]
    )
    q = {"network.interface.name": pair.va, "memtrace.qdisc.kind": "tbf"}
    drops = value("memtrace.qdisc.drops", **q)
    assert drops == tc_last["drops"] - tc_first["drops"] and drops > 0
    assert value("memtrace.qdisc.overlimits", **q) == tc_last["overlimits"] - tc_first["overlimits"]
    assert value("memtrace.qdisc.bytes", **q) == tc_last["bytes"] - tc_first["bytes"]
    assert value("memtrace.qdisc.backlog", **q) == tc_last["backlog"] == 0
    assert sys_last["tx_bytes"] - sys_first["tx_bytes"] > 100 * 1400  # the traffic really went (the rest dropped)


def test_a_process_that_enters_a_namespace_after_it_starts_is_followed_there(pair: Pair) -> None:
    """As `ip netns exec`, nsenter, a container runtime or a CNI plugin do
    after a process starts: the host's book names the namespace it is in
    now (where its traffic goes, and what the diagnosis reads), not the one
    it was first seen in."""
    from memtrace.model.host import HostBook

    enter = (
        "import ctypes, os, sys; print('home', flush=True); sys.stdin.readline(); "
        f"fd = os.open('/run/netns/{pair.a}', os.O_RDONLY); "
        "assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0; "  # CLONE_NEWNET
        "print('moved', flush=True); sys.stdin.read()"
    )
    p = subprocess.Popen([sys.executable, "-c", enter], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    source, book = NetdevSource(), HostBook()
    try:
        assert p.stdout is not None and p.stdin is not None and p.stdout.readline() == "home\n"
        home = ns_inode(p.pid)
        book.add_net(source.poll([p.pid]))
        assert book.netns_of(p.pid) == home == os.stat("/proc/self/ns/net").st_ino
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "moved\n"
        book.add_net(source.poll([p.pid]))
        assert book.netns_of(p.pid) == ns_inode(p.pid) != home
        assert {i.last.name for i in book.interfaces() if i.netns == book.netns_of(p.pid)} >= {pair.va}
    finally:
        source.close()
        p.communicate("", timeout=30)


@pytest.mark.parametrize("with_fast", [False, True], ids=["python", "fast"])
def test_a_vanished_interface_and_namespace_are_reported_not_raised(pair: Pair, with_fast: bool) -> None:
    proc = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    fast = FastSampler(200) if with_fast else None
    # Names read once: a vanished interface must leave the counters' reading itself, at once.
    source = NetdevSource(link_every=1000, fast=fast)

    def sample() -> NetSnapshot:
        if fast is None:
            return source.poll([proc.pid])
        t = fast.ticks()
        while fast.ticks() < t + 2:  # a whole dump since the last change
            time.sleep(0.002)
        return source.poll([proc.pid], fast=fast.poll())

    try:
        if fast is not None:
            fast.start()
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        source.poll([proc.pid])  # the namespace is met (and handed to the fast sampler)
        first = sample()
        inode = first.namespace_of(proc.pid)
        assert inode is not None and pair.va in {i.name for i in first.interfaces if i.netns == inode}
        assert all(i.fast_ticks > 0 for i in first.interfaces) is with_fast
        sh("ip", "-n", pair.a, "link", "del", pair.va)  # takes its peer with it
        second = sample()
        proc.communicate(timeout=30)
        third = sample()
    finally:
        source.close()
        if fast is not None:
            fast.close()
        if proc.poll() is None:
            proc.kill()
    rates = net_rates(first, second)
    assert rates is not None
    assert [k for k in rates.disappeared if k[0] == inode] == [(inode, 2, pair.va)]
    assert pair.va not in {i.name for i in second.interfaces}
    assert second.gone_namespaces == () and second.errors == ()
    # The last process of the namespace left: memtrace lets go of it (its sockets would keep it alive) and says so.
    assert third.gone_namespaces == (inode,)
    assert third.errors == (f"pid {proc.pid}: network namespace not readable (No such file or directory)",)
    assert [ns.inode for ns in third.namespaces] == [os.stat("/proc/self/ns/net").st_ino]


def test_an_interface_created_between_link_reads_is_named_at_once(pair: Pair) -> None:
    proc = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    source = NetdevSource(link_every=1_000_000)  # names read once, then only when an unknown index shows up
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        first = source.poll([proc.pid])
        sh("ip", "-n", pair.a, "link", "add", "xa" + pair.va[2:], "type", "veth", "peer", "name", "xb" + pair.va[2:])
        second = source.poll([proc.pid])
        kernel = pair.sysfs(pair.a, "xa" + pair.va[2:])
        inode = second.namespace_of(proc.pid)
    finally:
        source.close()
        proc.communicate(timeout=30)
    before = {i.name for i in first.interfaces if i.netns == inode}
    after = {i.name: i for i in second.interfaces if i.netns == inode}
    assert set(after) - before == {"xa" + pair.va[2:], "xb" + pair.va[2:]}
    new = after["xa" + pair.va[2:]]
    assert (new.rx_packets, new.tx_packets, new.operstate) == (kernel["rx_packets"], kernel["tx_packets"], "down")


def test_a_counter_that_goes_down_is_a_reset_not_a_negative_rate() -> None:
    base = InterfaceSample(7, 3, "eth0", "up", None, 1000, 2000, 10, 20, 0, 0, 0, 0)
    before = NetSnapshot(1_000_000_000, (), (base,), None)
    after = NetSnapshot(2_000_000_000, (), (replace(base, rx_bytes=300, tx_bytes=2500),), None)
    rates = net_rates(before, after)
    assert rates is not None
    (r,) = rates.interfaces
    assert r.deltas["rx_bytes"] == 300 and r.deltas["tx_bytes"] == 500 and r.counter_resets == 1
    assert all(v >= 0 for v in r.deltas.values()) and rates.counter_resets == 1
    assert net_rates(after, before) is None  # out of order: no rate at all


def test_doctor_checks_netlink() -> None:
    from memtrace.runtime.doctor import CHECKS, check_netlink

    c = check_netlink()
    assert check_netlink in CHECKS
    n = len(NetdevSource().poll().interfaces)
    assert c.ok and not c.warn and c.detail.startswith(f"{n} interface")


def test_source_opens_without_privileges_to_enter_namespaces(tmp_path: Path) -> None:
    """As an unprivileged user: its own namespace is sampled; another's is an error in words, not a crash."""
    code = (
        "from memtrace.sources.netdev import NetdevSource\n"
        "s = NetdevSource(); snap = s.poll([1]); s.close()\n"
        "print(len(snap.interfaces) > 0, snap.errors)\n"
    )
    p = subprocess.run(
        [*python_as_nobody(), "-c", code],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), *site.getsitepackages()])),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("True ('pid 1: network namespace not readable (Permission denied)',)"), p.stdout


def _schedstat_ns(tid: int) -> int:
    """A thread's time on a CPU so far, in ns (the scheduler's own sum)."""
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])


def test_the_fast_samplers_cpu_time_is_its_threads_when_taken() -> None:
    """The C thread's CPU time is read when a window is taken (not at every
    tick: a CPU-clock read is a system call), so a take carries the thread's
    time up to that moment as the kernel counts it: no less than the
    scheduler's sum read just before, no more than the sum just after
    (plus 1 ms: the sum is brought up to date when the thread sleeps, and it
    may be inside a tick when read)."""
    import time

    fast = FastSampler(1000)
    try:
        fast.start()
        deadline = time.monotonic() + 30
        while fast.poll().ticks < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        tid = next(int(t) for t in os.listdir("/proc/self/task") if _comm(int(t)) == "memtrace-fast")
        before = _schedstat_ns(tid)
        w = fast.poll()
        after = _schedstat_ns(tid)
        assert w.ticks >= 50
        assert 0 < before <= w.cpu_ns <= after + 1_000_000, (before, w.cpu_ns, after)
    finally:
        fast.close()


def test_the_fast_sampler_reads_the_interfaces_at_its_read_rate_and_watches_at_its_tick_rate() -> None:
    """An idle agent's sampler ticks at 20 Hz (its rings watched each tick) and reads the
    interfaces at 2 Hz: here 200 Hz and 20 Hz, every tenth tick. The interface's reads in a
    window are the window's ticks whose number is a multiple of ten (one either way: a take may
    fall inside a tick); set back to read each tick, each tick reads it."""
    import socket

    fast = FastSampler(200)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    inode = os.stat("/proc/self/ns/net").st_ino

    def window(ticks: int) -> tuple[int, int]:
        """(ticks, reads of lo) over a window of `ticks` ticks or more."""
        start = fast.poll().ticks
        deadline = time.monotonic() + 30
        while fast.ticks() - start < ticks and time.monotonic() < deadline:
            time.sleep(0.02)
        w = fast.poll()
        lo = [i for i in w.interfaces.values() if i.netns == inode and i.index == 1]
        return w.ticks - start, lo[0].ticks if lo else 0

    try:
        fast.add_netns(inode, sock)
        fast.start()
        assert fast.set_rate(200, read_hz=20) == pytest.approx(200) and fast.read_hz == pytest.approx(20)
        ticks, reads = window(200)
        assert ticks >= 200 and abs(reads - ticks / 10) <= 1, (ticks, reads)
        fast.set_rate(200)
        assert fast.read_hz == pytest.approx(200)
        ticks, reads = window(100)
        assert ticks >= 100 and abs(reads - ticks) <= 1, (ticks, reads)
        with pytest.raises(ValueError, match="reading rate"):
            fast.set_rate(20, read_hz=40)
    finally:
        fast.close()
        sock.close()


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_closed_fast_sampler_refuses_calls_and_the_source_reads_on_its_own(pair: Pair) -> None:
    """A fast sampler that could not start is closed: a call on it is an OSError, never a NULL handed
    to C, and the netdev source it was given reads every counter itself from then on."""
    import socket

    fast = FastSampler(100)
    source = NetdevSource(fast=fast)
    try:
        fast.close()
        with pytest.raises(OSError, match="closed"):
            fast.poll()
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s, pytest.raises(OSError):
            fast.add_netns(1, s)
        source.stop_fast()
        idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        snap = source.poll([idle.pid])
        a = iface(snap, ns_inode(idle.pid), pair.va)
        assert a.fast_ticks == 0 and a.peak_tx_bytes_per_s is None
        assert a.tx_bytes == pair.sysfs(pair.a, pair.va)["tx_bytes"] and snap.errors == ()
        idle.communicate(timeout=30)
    finally:
        source.close()


def test_a_namespace_whose_counters_take_many_replies_is_read_whole_by_the_fast_sampler(pair: Pair) -> None:
    """The fast sampler reads a dump into an 8 KiB buffer (the kernel sizes
    its replies from it): 150 interfaces' counters take several replies, and
    every interface is in its window, read by it (its ticks), with none of
    its reads failing; the veth's counters are the kernel's, exactly."""
    extra = [f"{end}{i}" for i in range(75) for end in "xy"]  # 75 veth pairs inside the namespace
    subprocess.run(
        ["ip", "-n", pair.a, "-batch", "-"],
        input="".join(f"link add x{i} type veth peer name y{i}\nlink set x{i} up\n" for i in range(75)),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    idle = pair.run(pair.a, "import sys; print('ready', flush=True); sys.stdin.read()")
    fast = FastSampler(200)
    source = NetdevSource(fast=fast)
    try:
        fast.start()
        assert idle.stdout is not None and idle.stdout.readline().strip() == "ready"
        source.poll([idle.pid])  # the namespace is found, and handed to the fast sampler
        deadline = time.monotonic() + 30
        while not fast.poll().of_namespace(ns_inode(idle.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)  # its first tick in it
        while True:
            # A snapshot whose window holds a tick of the namespace: a window that began just
            # after the last tick holds none (on a loaded machine a tick of 152 interfaces can
            # take longer than the time between two polls), and every interface is then read
            # by Python, its ticks 0, which says nothing about the fast sampler's dumps.
            snap, (kernel,) = quiet_sample(source, pair, [idle.pid], [(pair.a, pair.va)], fast)
            ticked = [i for i in snap.interfaces if i.netns == ns_inode(idle.pid) and i.fast_ticks]
            if ticked or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        window = fast.poll()
    finally:
        source.close()
        fast.close()
        idle.communicate(timeout=30)
    ns = ns_inode_of(snap, idle.pid)
    names = {link["ifname"] for link in json.loads(sh("ip", "-n", pair.a, "-j", "link", "show"))}
    mine = {i.name: i for i in snap.interfaces if i.netns == ns}
    assert set(mine) == names == {"lo", pair.va, *extra}
    assert all(i.fast_ticks >= 1 for i in mine.values()), [n for n, i in mine.items() if i.fast_ticks < 1]
    assert window.net_errors == 0
    for name in IFACE_COUNTERS:
        assert getattr(mine[pair.va], name) == kernel[name], name
