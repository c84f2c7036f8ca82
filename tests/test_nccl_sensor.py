"""The NCCL sensor against a real kernel: real uprobes on the test
libnccl.so.2 (NCCL's real signatures), a workload that writes its own
truth, and memtrace's calls and bytes per collective compared exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, libnccl

from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import F_GROUPED, Collective, Stat
from memtrace.sensors.nccl import NcclSensor
from memtrace.sources.procfs import process_start_ticks, start_ticks_of

pytestmark = pytest.mark.bpf

LABELS = {c.label: c for c in Collective}
COMM = 0x12340000


def run_workload(
    s: NcclSensor, fakecuda: Path, tmp_path: Path, rounds: int, *extra: str
) -> tuple[dict[str, Any], np.ndarray]:
    """Run the workload to its end, draining the ring as the agent does (on a
    timer: the ring is written without wakeups); returns (truth, events)."""
    truth = tmp_path / "truth.jsonl"
    p = subprocess.Popen(
        [str(fakecuda / "nccl_workload"), libnccl(fakecuda), str(rounds), *extra],
        env=dict(os.environ, WORKLOAD_TRUTH=str(truth)),
    )
    batches = []
    while p.poll() is None:
        batches.append(s.poll())
        try:
            p.wait(0.01)
        except subprocess.TimeoutExpired:
            pass
    assert p.returncode == 0
    batches.append(s.poll())
    events = np.concatenate(batches)
    (line,) = truth.read_text().splitlines()
    return json.loads(line), events[events["pid"] == json.loads(line)["pid"]]


def observed(s: NcclSensor, pid: int) -> dict[Collective, tuple[int, int, int, int]]:
    return {c: (t.calls, t.bytes, t.errors, t.bytes_unknown) for (k, c), t in s.totals().items() if k.pid == pid}


def expected(truth: dict[str, Any]) -> dict[Collective, tuple[int, int, int, int]]:
    return {
        LABELS[r["collective"]]: (r["calls"], r["bytes"], r["errors"], r["bytes_unknown"])
        for r in truth["collectives"]
        if r["calls"]
    }


def test_calls_and_bytes_per_collective_match_the_workload_exactly(
    nccl_sensor: NcclSensor, fakecuda: Path, tmp_path: Path
) -> None:
    att = nccl_sensor.attach(libnccl(fakecuda))
    assert att is not None and "ncclAllReduce" in att.symbols and "ncclBcast" not in att.symbols
    # the same file by another name: one inode, probes attached once (else every call would count twice)
    (tmp_path / "libnccl.so.2").symlink_to(libnccl(fakecuda))
    assert nccl_sensor.attach(str(tmp_path / "libnccl.so.2")) is att
    truth, events = run_workload(nccl_sensor, fakecuda, tmp_path, 300)
    assert observed(nccl_sensor, truth["pid"]) == expected(truth)
    # Every collective of the test library, grouped calls and group ends included.
    assert set(expected(truth)) == set(Collective)
    st = nccl_sensor.stats()
    assert st[Stat.EVENTS] >= len(events) and st[Stat.DROPPED] == 0 and st[Stat.NO_ENTRY] == 0
    # each all_to_all of the test library is a group of two sends and two receives: counted once, as the outer call
    assert st[Stat.NESTED] == 6 * 300


def test_each_event_carries_its_stream_communicator_peer_and_group(
    nccl_sensor: NcclSensor, fakecuda: Path, tmp_path: Path
) -> None:
    nccl_sensor.attach(libnccl(fakecuda))
    truth, ev = run_workload(nccl_sensor, fakecuda, tmp_path, 20)
    rows = {LABELS[r["collective"]]: r for r in truth["collectives"]}
    for c, r in rows.items():
        mine = ev[ev["coll"] == c]
        assert len(mine) == r["calls"], c
        if c.is_group:
            continue
        # the stream: the 7th argument (on the stack on x86-64) for all_reduce,
        # reduce_scatter and broadcast, the 8th for reduce
        assert set(mine["stream"].tolist()) == {r["stream"]}, c
        assert int((mine["flags"] & F_GROUPED != 0).sum()) == r["grouped"], c
    ok = ev[(ev["coll"] < Collective.GROUP_START) & (ev["ret"] == 0)]
    assert set(ok["comm"].tolist()) == {COMM}  # the 7th argument of reduce, on the stack
    assert set(ev[ev["coll"] == Collective.REDUCE]["peer"].tolist()) == {1}  # root, 6th
    assert set(ev[ev["coll"] == Collective.BROADCAST]["peer"].tolist()) == {3}
    assert set(ev[ev["coll"] == Collective.SEND]["peer"].tolist()) == {1}
    assert set(ev[ev["coll"] == Collective.ALLREDUCE]["peer"].tolist()) == {-1}
    # group ends: one outermost (depth 1) per group, one nested (depth 2) per round
    gend = ev[ev["coll"] == Collective.GROUP_END]
    assert sorted(np.unique(gend["depth"], return_counts=True)[1].tolist()) == [20, 40]
    # the failed call (NULL communicator) returned NCCL's error, and moved no bytes
    failed = ev[ev["ret"] != 0]
    assert set(failed["ret"].tolist()) == {4} and len(failed) == rows[Collective.ALLREDUCE]["errors"]


def test_library_unloaded_and_loaded_again_mid_run(nccl_sensor: NcclSensor, fakecuda: Path, tmp_path: Path) -> None:
    nccl_sensor.attach(libnccl(fakecuda))
    truth, _ = run_workload(nccl_sensor, fakecuda, tmp_path, 200, "reload")
    assert truth["unloaded"] == 1  # dlclose really unmapped it
    assert observed(nccl_sensor, truth["pid"]) == expected(truth)


def test_scan_finds_libnccl_in_a_running_process_and_traces_only_it(fakecuda: Path, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    env = dict(os.environ, WORKLOAD_TRUTH=str(truth), NCCL_HANDSHAKE="1")
    cmd = [str(fakecuda / "nccl_workload"), libnccl(fakecuda), "50"]
    traced = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    s = NcclSensor()
    try:
        for p in (traced, other):
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        ticks = process_start_ticks(traced.pid)
        s.start([ProcessKey(traced.pid, 0)])  # its start not known: the first process seen with its pid
        assert s.scan([traced.pid]) == 1
        assert s.scan([traced.pid, other.pid]) == 0  # one inode, attached once
        batches = []
        for p in (traced, other):
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.close()
        for p in (traced, other):
            while p.poll() is None:
                batches.append(s.poll())
                try:
                    p.wait(0.01)
                except subprocess.TimeoutExpired:
                    pass
        batches.append(s.poll())
        lines = {json.loads(line)["pid"]: json.loads(line) for line in truth.read_text().splitlines()}
        assert observed(s, traced.pid) == expected(lines[traced.pid])
        assert observed(s, other.pid) == {}  # not in the pid filter
        assert not any((b["pid"] == other.pid).any() for b in batches)
        # Every call of the traced process carries its start, as the kernel has it.
        ev = np.concatenate(batches)
        (start,) = set(ev["start_ns"].tolist())
        assert start_ticks_of(ProcessKey(traced.pid, start)) == ticks
        assert {k for k, _ in s.totals()} == {ProcessKey(traced.pid, start)}
    finally:
        for p in (traced, other):
            p.kill()
            p.wait()
        s.close()


def test_a_host_without_nccl_leaves_the_sensor_idle(nccl_sensor: NcclSensor, fakecuda: Path) -> None:
    assert nccl_sensor.scan([os.getpid()]) == 0
    # a library that defines none of NCCL's symbols: nothing to attach, no error
    assert nccl_sensor.attach(str(fakecuda / "lib" / "libcuda.so.1")) is None
    assert nccl_sensor.attach(str(fakecuda / "no-such-libnccl.so.2")) is None
    subprocess.run([str(fakecuda / "workload"), "10"], check=True, capture_output=True)
    assert len(nccl_sensor.poll()) == 0
    assert nccl_sensor.totals() == {}
    assert nccl_sensor.attachments == {}


def test_calls_the_ring_cannot_take_are_counted_in_the_kernel(fakecuda: Path, tmp_path: Path) -> None:
    s = NcclSensor(ring_bytes=4096)  # room for about fifty events, drained only at the end
    s.start()
    try:
        s.attach(libnccl(fakecuda))
        truth = tmp_path / "truth.jsonl"
        subprocess.run(
            [str(fakecuda / "nccl_workload"), libnccl(fakecuda), "100"],
            env=dict(os.environ, WORKLOAD_TRUTH=str(truth)),
            check=True,
        )
        doc = json.loads(truth.read_text())
        got = s.poll()
        assert 0 < len(got[got["pid"] == doc["pid"]]) < 100
        assert s.stats()[Stat.DROPPED] > 0
        assert observed(s, doc["pid"]) == expected(doc)
    finally:
        s.close()


def test_a_pid_reused_by_a_new_process_is_another_process(fakecuda: Path, tmp_path: Path) -> None:
    """Two runs of the workload one after the other under one pid (forced,
    tests/fixtures/reuse_pid.py): two processes, each with its own calls,
    exactly, not one pid's sum."""
    s = NcclSensor()
    s.start()  # every process: the pid filter plays no part
    try:
        s.attach(libnccl(fakecuda))
        truth, pids = tmp_path / "truth.jsonl", tmp_path / "pids.json"
        cmd = [str(fakecuda / "nccl_workload"), libnccl(fakecuda)]
        subprocess.run(
            [sys.executable, str(FIXTURES / "reuse_pid.py"), str(pids), "--", *cmd, "20", "--", *cmd, "30"],
            env=dict(os.environ, WORKLOAD_TRUTH=str(truth)),
            check=True,
        )
        events = s.poll()
        first, second = json.loads(pids.read_text())["pids"]
        assert first == second, "the second run did not get the first one's pid"
        lines = [json.loads(line) for line in truth.read_text().splitlines()]
        starts = sorted({k.start_ns for k, _ in s.totals() if k.pid == first})
        assert len(starts) == 2, "one pid, two processes"
        for start, line in zip(starts, lines, strict=True):
            key = ProcessKey(first, start)
            got = {c: (t.calls, t.bytes, t.errors, t.bytes_unknown) for (k, c), t in s.totals().items() if k == key}
            assert got == expected(line)
            assert len(events[(events["pid"] == first) & (events["start_ns"] == start)]) == sum(
                r["calls"] for r in line["collectives"]
            )
    finally:
        s.close()


def test_a_traced_key_is_that_process_only(fakecuda: Path, tmp_path: Path) -> None:
    """trace(key) traces the process that started then: a process holding the
    pid with another start (as one reusing it would) is not traced."""
    env = dict(os.environ, WORKLOAD_TRUTH=str(tmp_path / "truth.jsonl"), NCCL_HANDSHAKE="1")
    cmd = [str(fakecuda / "nccl_workload"), libnccl(fakecuda), "10"]
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    s = NcclSensor()
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        s.start([ProcessKey(p.pid, 1)])  # its pid, another process's start
        s.attach(libnccl(fakecuda))
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.close()
        assert p.wait() == 0
        assert len(s.poll()) == 0
        assert s.totals() == {}
    finally:
        p.kill()
        p.wait()
        s.close()
