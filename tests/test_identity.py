"""A process is (pid, start time), end to end: a pid reused while memtrace
runs gives two processes, each with its own exact totals, never one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, memtrace_cmd, run_traced

from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.cpu import CpuStats
from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.nccl import CallTotals, Collective
from memtrace.export.config import resolve
from memtrace.export.host import collective_rows, cpu_rows
from memtrace.export.otlp import MetricsBuilder
from memtrace.export.report import summary
from memtrace.model import Model
from memtrace.model.host import HostBook
from memtrace.sources.procfs import CpuReader, process_cpu_ns, process_start_ticks, read_process

PID = 4242
API, ALLOC = 22, 60  # cuMemcpyHtoD_v2, cuMemAlloc_v2
OLD, NEW = ProcessKey(PID, 5_000_000_000), ProcessKey(PID, 9_000_000_000)


def _events(rows: list[tuple[ProcessKey, int, int]]) -> np.ndarray:
    """(process, api, bytes) rows: copies H2D, or allocations at distinct addresses."""
    b = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, (key, api, nbytes) in enumerate(rows):
        b[i]["pid"], b[i]["start_ns"], b[i]["api"], b[i]["bytes"] = key.pid, key.start_ns, api, nbytes
        b[i]["direction"], b[i]["duration_ns"] = Direction.H2D, 1000
        b[i]["dst"] = 0x7000_0000_0000 + i * (1 << 30)
    return b


def test_the_model_keeps_two_processes_with_one_pid_apart() -> None:
    m = Model()
    # Interleaved in one batch, as a ring would hold them around a pid's reuse.
    m.add_events(_events([(OLD, API, 10), (NEW, API, 1000), (OLD, API, 20), (NEW, ALLOC, 1 << 20), (OLD, ALLOC, 7)]))
    m.introduce(OLD, "trainer", 11)
    m.introduce(NEW, "server", 12)
    assert set(m.processes) == {OLD, NEW}
    old, new = m.processes[OLD], m.processes[NEW]
    assert [(k.process, st.calls, st.bytes) for k, st in old.copy_view().items()] == [(OLD, 2, 30)]
    assert [(k.process, st.calls, st.bytes) for k, st in new.copy_view().items()] == [(NEW, 1, 1000)]
    assert (old.memory.allocations, old.memory.in_use_bytes) == (1, 7)
    assert (new.memory.allocations, new.memory.in_use_bytes) == (1, 1 << 20)
    assert (old.name, old.cgroup_id, new.name, new.cgroup_id) == ("trainer", 11, "server", 12)
    assert old.start_ns < new.start_ns

    # Two JSON rows and two OTLP resources with the same pid, told apart by their start.
    rows = summary(m, {}, [])["memcpy"]
    assert [(r["pid"], r["process"], r["calls"], r["bytes"]) for r in rows] == [
        (PID, "trainer", 2, 30),
        (PID, "server", 1, 1000),
    ]
    assert rows[0]["start_time_unix_nano"] == old.start_ns != rows[1]["start_time_unix_nano"] == new.start_ns
    mem = summary(m, {}, [])["device_memory"]
    assert [(r["pid"], r["start_time_unix_nano"], r["in_use_bytes"]) for r in mem] == [
        (PID, old.start_ns, 7),
        (PID, new.start_ns, 1 << 20),
    ]
    batch = MetricsBuilder(resolve({}, endpoint="http://x:1"), {}).build(m, {}, 0)
    res = [
        dict(rm.resource.attributes) for rm in batch.data.resource_metrics if "process.pid" in rm.resource.attributes
    ]
    assert [r["process.pid"] for r in res] == [PID, PID]
    assert res[0]["process.creation.time"] < res[1]["process.creation.time"]  # ISO 8601, to the nanosecond
    assert [r["process.executable.name"] for r in res] == ["trainer", "server"]
    assert batch.keys == [OLD, NEW]

    # Forgetting the old one leaves the new one whole.
    m.process_exited(OLD)
    m.forget(OLD)
    assert set(m.processes) == {NEW} and m.processes[NEW].copy_view() and not m.processes[NEW].exited


def test_the_host_rows_keep_two_processes_with_one_pid_apart() -> None:
    """The host signals' rows (host.cpu, collectives) name a process as the
    CUDA rows do: two processes of one pid are two rows, each with its start
    and its own figures, neither replacing nor added to the other's."""
    boot = 1_700_000_000 * 10**9
    hist = (0,) * 26
    book = HostBook()
    book.set_cpu({OLD: CpuStats(PID, OLD.start_ns, hist, hist, 1, 2, 3 * 10**9, 4, 5, 11)}, {OLD: "trainer"})
    book.set_cpu(
        {NEW: CpuStats(PID, NEW.start_ns, hist, hist, 1, 2, 5 * 10**8, 6, 7, 12)}, {NEW: "server"}
    )  # the pid's next
    ar = Collective.ALLREDUCE
    book.set_collectives({(OLD, ar): CallTotals(3, 30, 0, 0, 10), (NEW, ar): CallTotals(5, 50, 0, 0, 10)}, [])
    rows = cpu_rows(book, {}, boot)
    assert [(r["pid"], r["start_time_unix_nano"], r["process"], r["on_cpu_seconds"]) for r in rows] == [
        (PID, boot + OLD.start_ns, "trainer", 3.0),
        (PID, boot + NEW.start_ns, "server", 0.5),
    ]
    coll = collective_rows(book, boot_wall_ns=boot, attached={}, waits={(OLD, ar): (2, 10**9)})
    assert [(r["pid"], r["start_time_unix_nano"], r["calls"], r["waits_attributed"]) for r in coll] == [
        (PID, boot + OLD.start_ns, 3, 2),
        (PID, boot + NEW.start_ns, 5, 0),
    ]
    book.forget(OLD)
    assert [r["start_time_unix_nano"] for r in cpu_rows(book, {}, boot)] == [boot + NEW.start_ns]
    assert [r["calls"] for r in collective_rows(book, boot_wall_ns=boot, attached={}, waits={})] == [5]


def test_the_bpf_name_wins_and_a_reused_pid_is_not_read_from_proc() -> None:
    me = os.getpid()
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    mine = ProcessKey(me, process_start_ticks(me) * tick_ns)
    assert read_process(mine).exe == os.path.realpath(sys.executable)
    assert read_process(mine).ppid == os.getppid()  # a job's ranks are told apart by their launcher
    # The same pid with another start: another process, gone; /proc says nothing of it.
    assert read_process(ProcessKey(me, mine.start_ns + 5 * tick_ns)) == ProcessInfo()
    m = Model(identify=lambda key: ProcessInfo(name="from-proc", exe="/bin/x", ppid=77))
    m.introduce(mine, "from-bpf", 3)
    assert m.processes[mine].name == "from-bpf" and m.processes[mine].exe == "/bin/x"
    assert m.processes[mine].ppid == 77


def test_cpu_time_is_read_from_a_kept_file_of_that_process_only() -> None:
    """The overhead budget's CPU reader (one /proc/PID/stat kept open per
    process) reads what a fresh read does, keeps one descriptor a process,
    refuses a key whose start is another process's, and lets go of the file
    of a process that has exited."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        key = ProcessKey(spin.pid, process_start_ticks(spin.pid) * tick_ns)
        r = CpuReader()
        before = fds()
        readings = []
        for _ in range(5):
            fresh_before = process_cpu_ns(key)
            mine = r.cpu_ns(key)
            fresh_after = process_cpu_ns(key)
            assert fresh_before is not None and mine is not None and fresh_after is not None
            assert fresh_before <= mine <= fresh_after
            readings.append(mine)
            subprocess.run(["sleep", "0.05"], check=True)
        assert readings[-1] > readings[0]  # it spins: its time grows, and the kept file says so
        assert fds() == before + 1
        # The same pid with another start is another process: nothing read, nothing kept.
        assert r.cpu_ns(ProcessKey(spin.pid, key.start_ns + 5 * tick_ns)) is None
        assert fds() == before + 1
        spin.kill()
        spin.wait()
        assert r.cpu_ns(key) is None and fds() == before
        r.close()
    finally:
        spin.kill()
        spin.wait()


def _by_start(rows: list[dict], pid: int) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        if r["pid"] == pid:
            out[r["start_time_unix_nano"]].append(r)
    return dict(sorted(out.items()))


def _copies(rows: list[dict]) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    out: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        t = out[(r["api"], r["direction"], r["host_memory"] or "")]
        t[0] += r["calls"]
        t[1] += r["bytes"]
        t[2] += r["errors"]
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


@pytest.mark.bpf
def test_a_pid_reused_mid_run_is_two_processes_each_exact(fakecuda: Path, tmp_path: Path) -> None:
    # The reuse is forced in this pid namespace: run it in the host's, where BPF's pids are.
    pids_out = tmp_path / "pids.json"
    exe = str(fakecuda / "memwork")
    argv = [sys.executable, str(FIXTURES / "reuse_pid.py"), str(pids_out), "--", exe, "-r", "2", "--", exe, "-r", "4"]
    doc, lines, p = run_traced(argv, tmp_path)
    assert p.returncode == 0, p.stderr
    first, second = json.loads(pids_out.read_text())["pids"]
    assert first == second, "the second run did not get the first one's pid"
    assert [t["pid"] for t in lines] == [first, first]

    # Two processes with that pid, in start order, each exactly its own truth.
    copies = _by_start(doc["memcpy"], first)
    assert len(copies) == 2, list(copies)
    for rows, truth in zip(copies.values(), lines, strict=True):
        want = {
            (c["api"], c["direction"], c["host_memory"]): (c["calls"], c["bytes"], c["errors"]) for c in truth["copies"]
        }
        assert _copies(rows) == want
        assert {r["process"] for r in rows} == {"memwork"}  # the name BPF took at the event
    memory = _by_start(doc["device_memory"], first)
    assert list(memory) == list(copies)
    for (mem,), truth in zip(memory.values(), lines, strict=True):
        for k, v in truth["device_memory"].items():
            assert (mem["outstanding"] if k == "outstanding" else mem[k]) == v, k
        assert mem["exited"]
    launches = _by_start(doc["launches"], first)
    assert list(launches) == list(copies)
    for rows, truth in zip(launches.values(), lines, strict=True):
        kinds: dict[str, int] = defaultdict(int)
        for r in rows:
            kinds[r["kind"]] += r["launches"]
        assert dict(kinds) == truth["launches"]
    waits = _by_start(doc["synchronization"], first)
    for rows, truth in zip(waits.values(), lines, strict=True):
        assert {w["api"]: w["calls"] for w in rows} == truth["sync"]
    assert doc["agent"]["dropped"] == 0 and doc["agent"]["calls_without_event"] == 0


@pytest.mark.bpf
def test_a_pid_reused_mid_run_is_two_processes_in_the_host_rows_too(fakecuda: Path, tmp_path: Path) -> None:
    """The CPU sensor's rows (host.cpu) tell the two processes of a reused
    pid apart as the CUDA rows do: a row each, with its own start, and the
    second's figures its own, never the first's added in (the sensor counts
    by pid): the first spins on the CPU for seconds, the second sleeps."""
    pids_out = tmp_path / "pids.json"
    loop = str(fakecuda / "steploop")
    busy = [loop, "-n", "400", "-k", "1000", "-w", "5000"]  # 5 ms of every 8 on the CPU, 3 s
    idle = [loop, "-n", "100", "-l", "1", "-k", "10000", "-w", "0"]  # asleep in its waits, 1 s
    argv = [sys.executable, str(FIXTURES / "reuse_pid.py"), str(pids_out), "--", *busy, "--", *idle]
    out = tmp_path / "summary.json"
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--host-interval", "0.05", "--format", "json", "-o", str(out), "--", *argv],
        env=dict(os.environ, WORKLOAD_TRUTH=str(tmp_path / "truth.jsonl")),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    first, second = json.loads(pids_out.read_text())["pids"]
    assert first == second, "the second run did not get the first one's pid"
    doc = json.loads(out.read_text())
    starts = list(_by_start(doc["memcpy"], first))
    assert len(starts) == 2, starts
    cpu = _by_start(doc["host"]["cpu"], first)
    assert list(cpu) == starts  # a row each, with the start the CUDA rows give it
    (spun,), (slept,) = cpu.values()
    assert slept["on_cpu_seconds"] < spun["on_cpu_seconds"], (spun, slept)
