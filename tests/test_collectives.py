"""Collectives per process and the waits that follow them (memtrace.model.collectives):
synthetic event arrays with an exact expected attribution, then end to end
through real uprobes on the test libnccl.so.2 and the test CUDA runtime."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from memtrace.core import abi
from memtrace.core.abi import Layer
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import EVENT_DTYPE, F_BYTES_UNKNOWN, F_GROUPED, Collective
from memtrace.model.collectives import (
    NOT_ISSUED,
    CollectiveStats,
    SyncScope,
    WaitAttributor,
    attribute_waits,
    issue_times,
    sync_scopes,
)

C = Collective
A, B, S = 0xA0, 0xB0, 0x50  # streams
SYNC_DTYPE = np.dtype([("ts_ns", "<u8"), ("duration_ns", "<u8"), ("stream", "<u8"), ("tid", "<u4")])


def nccl_events(*rows: tuple[int, ...]) -> np.ndarray:
    """rows: (coll, ts, dur, stream, ret, flags, depth, tid, bytes)."""
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, (coll, ts, dur, stream, ret, flags, depth, tid, nbytes) in enumerate(rows):
        ev[i] = (ts, dur, nbytes, nbytes, stream, 1, 0, 7, tid, ret, -1, depth, coll, 7, flags, 0)
    return ev


def syncs(*rows: tuple[int, int, int]) -> np.ndarray:
    """rows: (ts, dur, stream)."""
    return np.array([(ts, dur, stream, 7) for ts, dur, stream in rows], SYNC_DTYPE)


def coll(c: Collective, ts: int, stream: int, ret: int = 0, grouped: bool = False, tid: int = 7) -> tuple[int, ...]:
    return (c, ts, 10, stream, ret, F_GROUPED if grouped else 0, 1 if grouped else 0, tid, 64)


def group(c: Collective, ts: int, depth: int, tid: int = 7) -> tuple[int, ...]:
    return (c, ts, 10, 0, 0, 0, depth, tid, 0)


def test_issue_time_is_the_return_or_the_outermost_group_end_on_the_same_thread() -> None:
    ev = nccl_events(
        coll(C.ALLREDUCE, 100, A),  # 0: returns at 110
        coll(C.ALLREDUCE, 120, A, ret=4),  # 1: failed: never issued
        group(C.GROUP_START, 200, 0),  # 2
        group(C.GROUP_START, 210, 1),  # 3: nested
        coll(C.SEND, 220, S, grouped=True),  # 4
        group(C.GROUP_END, 240, 2),  # 5: inner end: issues nothing
        coll(C.RECV, 260, S, grouped=True),  # 6
        group(C.GROUP_END, 300, 1),  # 7: outermost end returns at 310
        group(C.GROUP_END, 230, 1, tid=8),  # 8: another thread's group, ended first
        coll(C.ALLGATHER, 400, B, grouped=True),  # 9: its group never ends
    )
    no = NOT_ISSUED
    assert issue_times(ev).tolist() == [110, no, no, no, 310, no, 310, no, no, no]


def test_each_wait_is_charged_to_the_collective_it_waited_for() -> None:
    ev = nccl_events(
        coll(C.ALLREDUCE, 100, A),  # 0: issued 110
        coll(C.ALLGATHER, 200, B),  # 1: issued 210
        coll(C.REDUCESCATTER, 600, A),  # 2: issued 610
        coll(C.BROADCAST, 620, A),  # 3: issued 630: the later of two pending on A
        coll(C.SEND, 700, S),  # 4: issued 710
        coll(C.RECV, 720, B),  # 5: issued 730
        coll(C.REDUCE, 900, A),  # 6: issued 910, after every wait
    )
    sy = syncs(
        (105, 1000, A),  # starts before #0 returns: waits for something else
        (300, 50, A),  # #0
        (400, 70, B),  # #1
        (500, 5, A),  # nothing pending on A any more
        (800, 40, A),  # #3 (and covers #2, charged nothing)
        (850, 90, 0),  # device wait: the latest pending (#5), covers #4 too
        (880, 3, S),  # #4 already covered
    )
    scopes = np.array([SyncScope.STREAM] * 5 + [SyncScope.DEVICE, SyncScope.STREAM], np.uint8)
    w = attribute_waits(ev, sy, scopes)
    assert w.wait_ns.tolist() == [50, 70, 0, 40, 0, 90, 0]
    assert w.sync_index.tolist() == [1, 2, -1, 4, -1, 5, -1]
    assert w.by_collective == {C.ALLREDUCE: (1, 50), C.ALLGATHER: (1, 70), C.BROADCAST: (1, 40), C.RECV: (1, 90)}
    assert w.total_ns(C.REDUCE) == 0


def test_grouped_work_is_waited_for_only_after_the_group_ends() -> None:
    ev = nccl_events(
        group(C.GROUP_START, 100, 0),
        coll(C.SEND, 110, S, grouped=True),
        coll(C.RECV, 130, S, grouped=True),
        group(C.GROUP_END, 400, 1),  # issued at 410
    )
    sy = syncs((200, 20, S), (500, 60, S))  # the first wait starts before the group ends
    w = attribute_waits(ev, sy)
    assert w.wait_ns.tolist() == [0, 0, 60, 0]  # the later call of the group takes the wait
    assert w.by_collective == {C.RECV: (1, 60)}


def test_an_event_wait_covers_every_stream() -> None:
    ev = nccl_events(coll(C.ALLREDUCE, 100, A), coll(C.ALLGATHER, 150, B))
    sy = syncs((300, 25, 0xE0E0), (400, 9, A))
    w = attribute_waits(ev, sy, np.array([SyncScope.EVENT, SyncScope.STREAM], np.uint8))
    assert w.wait_ns.tolist() == [0, 25]


def test_no_collectives_or_no_waits_attribute_nothing() -> None:
    assert attribute_waits(nccl_events(), syncs((1, 2, A))).by_collective == {}
    w = attribute_waits(nccl_events(coll(C.ALLREDUCE, 1, A)), syncs())
    assert w.wait_ns.tolist() == [0] and w.by_collective == {}


def test_fed_as_the_sensors_deliver_the_waits_are_charged_as_all_at_once() -> None:
    """The live attributor gets collectives a poll at a time (each call once
    it returned, a group's calls before their group ends) and waits ahead of
    them (the CUDA sensor drains more often): judged up to each poll, it
    charges exactly what attribute_waits charges over the whole run."""
    rng = np.random.default_rng(5)
    charged = eager_wrong = 0
    for trial in range(30):
        rows: list[tuple[int, ...]] = []
        t = 0
        for _ in range(60):
            t += int(rng.integers(5, 50))
            if rng.random() < 0.2:  # a group of two or three calls
                rows.append(group(C.GROUP_START, t, 1))
                for _ in range(int(rng.integers(2, 4))):
                    t += int(rng.integers(1, 20))
                    rows.append(coll(C(int(rng.integers(1, 8))), t, int(rng.choice([A, B, S])), grouped=True))
                t += int(rng.integers(1, 20))
                rows.append(group(C.GROUP_END, t, 1))
            else:
                ret = 0 if rng.random() < 0.9 else 5
                rows.append(coll(C(int(rng.integers(1, 8))), t, int(rng.choice([A, B, S])), ret=ret))
        ev = nccl_events(*rows)
        starts = np.sort(rng.integers(0, t + 100, 80))
        sy = syncs(*[(int(x), int(rng.integers(1, 40)), int(rng.choice([A, B, S]))) for x in starts])
        scopes = rng.choice([SyncScope.STREAM, SyncScope.DEVICE, SyncScope.EVENT], len(sy), p=[0.7, 0.2, 0.1])
        want = attribute_waits(ev, sy, scopes.astype(np.uint8)).by_collective

        live, eager = WaitAttributor(), WaitAttributor()  # eager: judges waits before their collectives are in
        returned = (ev["ts_ns"] + ev["duration_ns"]).astype(np.int64)
        fed_c = fed_s = 0
        for poll in [*np.sort(rng.integers(0, t + 100, 12)).tolist(), t + 1000]:
            upto = int(np.searchsorted(returned, poll, side="right"))  # in the ring once returned
            live.add_collectives(ev[fed_c:upto])
            eager.add_collectives(ev[fed_c:upto])
            fed_c = max(fed_c, upto)
            ahead = int(np.searchsorted(sy["ts_ns"], poll + int(rng.integers(0, 200)), side="right"))
            if ahead > fed_s:
                part = slice(fed_s, ahead)
                for a in (live, eager):
                    a.add_syncs(
                        sy["ts_ns"][part].astype(np.int64),
                        sy["duration_ns"][part].astype(np.int64),
                        sy["stream"][part],
                        scopes[part].astype(np.uint8),
                    )
                fed_s = ahead
            live.advance(poll)
            eager.advance(2**62)
        assert fed_c == len(ev) and fed_s == len(sy)
        assert live.by_collective == want, trial
        assert live.dropped == 0
        charged += sum(n for n, _ in want.values())
        eager_wrong += eager.by_collective != want
    assert charged > 300 and eager_wrong > 0  # waits were charged, and the watermark mattered


def test_a_process_said_to_map_libnccl_before_its_first_call_has_every_wait_kept() -> None:
    """The CUDA sensor says a held process mapped libnccl before the model
    has met it (its first CUDA call comes later): its waits are kept from its
    first event, so the first poll's all_reduce takes the wait that followed
    it, whatever the order of the host sample and the process's introduction."""
    from memtrace.model.aggregate import Model

    m = Model()
    pid = 10**7 + 9
    m.add_collectives(np.zeros(0, EVENT_DTYPE), 0, frozenset({ProcessKey(pid, 0)}))  # held at the mapping
    ev = np.zeros(1, abi.EVENT_DTYPE)  # its first CUDA call: the wait
    ev["pid"] = ev["tid"] = pid
    ev["api"], ev["stream"], ev["ts_ns"], ev["duration_ns"] = 80, A, 2_000, 777_000
    m.add_events(ev)
    nc = nccl_events(coll(C.ALLREDUCE, 1_000, A))
    nc["pid"] = nc["tid"] = pid
    m.add_collectives(nc, 10_000, frozenset())  # the first poll: before the sample lists it as a user
    assert m.collective_wait_totals() == {(ProcessKey(pid, 0), C.ALLREDUCE): (1, 777_000)}
    key = next(iter(m.processes))
    m.forget(key)
    m.add_events(ev)  # the same pid again, never said to map libnccl: nothing kept
    assert m.collective_waits == {}


def test_two_processes_of_one_pid_keep_their_own_collective_waits() -> None:
    """A pid reused: the waits charged to each process's collectives stay
    its own in the totals the summary's rows are made from, the second's
    never in place of the first's."""
    from memtrace.model.aggregate import Model

    m = Model()
    pid = 10**7 + 11
    first, second = ProcessKey(pid, 5_000), ProcessKey(pid, 9_000)
    for key, wait_ns, t in ((first, 777_000, 0), (second, 333_000, 100_000)):
        ev = np.zeros(1, abi.EVENT_DTYPE)  # its CUDA call: the wait
        ev["pid"] = ev["tid"] = pid
        ev["start_ns"] = key.start_ns
        ev["api"], ev["stream"], ev["ts_ns"], ev["duration_ns"] = 80, A, t + 2_000, wait_ns
        m.add_collectives(np.zeros(0, EVENT_DTYPE), 0, frozenset({key}))
        m.add_events(ev)
        nc = nccl_events(coll(C.ALLREDUCE, t + 1_000, A))
        nc["pid"] = nc["tid"] = pid
        m.add_collectives(nc, t + 10_000, frozenset({key}))
        m.process_exited(key)
    assert m.collective_wait_totals() == {
        (first, C.ALLREDUCE): (1, 777_000),
        (second, C.ALLREDUCE): (1, 333_000),
    }


def test_sync_scopes_follow_the_cuda_api_table() -> None:
    ids = np.array([80, 81, 82, 90, 91, 92], np.uint16)
    assert sync_scopes(ids).tolist() == [0, 1, 2, 0, 1, 2]


def test_collective_stats_per_process_and_collective() -> None:
    ev = nccl_events(
        coll(C.ALLREDUCE, 0, A),
        coll(C.ALLREDUCE, 0, A, ret=4),
        (C.ALLREDUCE, 0, 30, A, 0, F_BYTES_UNKNOWN, 0, 7, 0),
        coll(C.SEND, 0, S, grouped=True),
    )
    ev["pid"][3] = 8
    st = CollectiveStats()
    st.add(ev)
    st.add_lost(7, C.ALLREDUCE, 2, 128, 0, 20)
    ar = st.by_key[(7, C.ALLREDUCE)]
    assert (ar.calls, ar.bytes, ar.errors, ar.bytes_unknown, ar.grouped, ar.duration_ns) == (5, 192, 1, 1, 0, 70)
    assert ar.durations.count == 3  # lost calls have no duration of their own
    sd = st.by_key[(8, C.SEND)]
    assert (sd.calls, sd.bytes, sd.grouped) == (1, 64, 1)
    assert set(st.by_key) == {(7, C.ALLREDUCE), (8, C.SEND)}


@pytest.mark.bpf
def test_end_to_end_waits_after_real_collectives(fakecuda: Path, tmp_path: Path) -> None:
    from memtrace.core.notices import Events, Notice
    from memtrace.core.procfiles import Candidate, FileId
    from memtrace.sensors.cuda import CudaSensor, Hooks, Options
    from memtrace.sensors.nccl import NcclSensor

    rounds = 40
    cudart = str(fakecuda / "lib" / "libcudart.so.13")
    cuda_batches: list[np.ndarray] = []

    def take(notices: list[Notice]) -> None:
        cuda_batches.extend(n.batch for n in notices if isinstance(n, Events))

    src = CudaSensor(Options(hold_libraries=False), Hooks(notices=take))
    nc = NcclSensor()
    try:
        src.start()
        nc.start()
        src.attach(Candidate(os.getpid(), cudart, cudart, Layer.RUNTIME, FileId.of(os.stat(cudart))))
        nc.attach(str(fakecuda / "nccl" / "libnccl.so.2"))
        truth = tmp_path / "truth.jsonl"
        env = dict(
            os.environ,
            WORKLOAD_TRUTH=str(truth),
            NCCL_CUDART=cudart,
            LD_LIBRARY_PATH=str(fakecuda / "lib"),
        )
        p = subprocess.Popen(
            [str(fakecuda / "nccl_workload"), str(fakecuda / "nccl" / "libnccl.so.2"), str(rounds)], env=env
        )
        nccl_batches = []
        while p.poll() is None:
            nccl_batches.append(nc.poll())
            src.poll()
            try:
                p.wait(0.01)
            except subprocess.TimeoutExpired:
                pass
        nccl_batches.append(nc.poll())
        src.poll()
    finally:
        nc.close()
        src.close()
    doc = json.loads(truth.read_text())
    assert doc["syncs"] == 2 * rounds
    ev = np.concatenate(nccl_batches)
    ev = ev[ev["pid"] == doc["pid"]]
    cu = np.concatenate(cuda_batches) if cuda_batches else np.zeros(0, abi.EVENT_DTYPE)
    sy = cu[(cu["pid"] == doc["pid"]) & np.isin(cu["api"], [80, 81])]
    assert len(sy) == 2 * rounds
    w = attribute_waits(ev, sy, sync_scopes(sy["api"]))
    stream_waits = sy[sy["api"] == 80]["duration_ns"]
    device_waits = sy[sy["api"] == 81]["duration_ns"]
    # Each round: the stream wait follows the all_reduce issued at the round's
    # last group end; the device wait then takes the latest work still
    # pending, the all_gather issued at that same group end.
    assert w.by_collective == {
        C.ALLREDUCE: (rounds, int(stream_waits.sum())),
        C.ALLGATHER: (rounds, int(device_waits.sum())),
    }
    charged = ev[w.sync_index >= 0]
    assert (charged["flags"] & F_GROUPED != 0).all()


@pytest.mark.bpf
def test_memtrace_run_says_how_long_each_collective_was_waited_for(fakecuda: Path, tmp_path: Path) -> None:
    """`memtrace run` on the NCCL workload: every round's stream wait goes to
    its all_reduce and its device wait to its all_gather (see above), so the
    JSON's waits per collective equal the command's own synchronisations,
    call for call and to the nanosecond; the steps (one per round) carry the
    time inside the collectives; the table says it in a line."""
    from conftest import memtrace_cmd

    rounds = 60
    cudart = str(fakecuda / "lib" / "libcudart.so.13")
    out = tmp_path / "summary.json"
    env = dict(
        os.environ,
        WORKLOAD_TRUTH=str(tmp_path / "truth.json"),
        NCCL_CUDART=cudart,
        LD_LIBRARY_PATH=str(fakecuda / "lib"),
    )
    cmd = [str(fakecuda / "nccl_workload"), str(fakecuda / "nccl" / "libnccl.so.2"), str(rounds)]
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--host-interval", "0.05", "--format", "json", "-o", str(out), "--", *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    truth = json.loads((tmp_path / "truth.json").read_text().splitlines()[0])
    assert truth["syncs"] == 2 * rounds
    rows = {r["collective"]: r for r in doc["collectives"] if r["pid"] == truth["pid"]}
    # Every call seen, with no pause in the workload: the command was stopped as it
    # mapped libnccl and continued once the probes were in.
    for t in truth["collectives"]:
        if t["calls"] and t["collective"] in rows:
            assert rows[t["collective"]]["calls"] == t["calls"], t
    assert {r["counted_from"] for r in rows.values()} == {"start"}
    assert rows["all_reduce"]["calls"] == 4 * rounds  # three in a round, one more in the nested group
    sync = {r["api"]: r for r in doc["synchronization"] if r["pid"] == truth["pid"]}
    stream, device = sync["cudaStreamSynchronize"], sync["cudaDeviceSynchronize"]
    assert stream["calls"] == device["calls"] == rounds
    assert rows["all_reduce"]["waits_attributed"] == rounds
    assert rows["all_reduce"]["wait_seconds"] == pytest.approx(stream["duration_seconds"]["sum"], abs=1e-9)
    assert rows["all_gather"]["waits_attributed"] == rounds
    assert rows["all_gather"]["wait_seconds"] == pytest.approx(device["duration_seconds"]["sum"], abs=1e-9)
    for other in ("reduce_scatter", "broadcast", "reduce", "send", "recv", "all_to_all"):
        assert rows[other]["waits_attributed"] == 0 and rows[other]["wait_seconds"] == 0
    assert doc["agent"]["collective_events_unmatched"] == 0 and doc["agent"]["collective_waits_dropped"] == 0
    (st,) = [s for s in doc["steps"] if s["pid"] == truth["pid"]]
    assert st["steps"] >= rounds - 2 and st["breakdown"]["collective"] > 0

    table = subprocess.run(
        [*memtrace_cmd(), "run", "--host-interval", "0.05", "--", *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.returncode == 0, table.stderr
    line = " ".join(
        table.stderr.split()
    )  # the summary goes to stderr (stdout is the command's); it folds at 80 columns
    assert re.search(r"all_reduce: [^.]*calls, .* s in the calls, then [0-9.e-]+ s waiting for it", line), line


@pytest.mark.bpf
def test_push_sends_the_collectives_of_its_last_host_sample(fakecuda: Path, tmp_path: Path) -> None:
    """Collectives made after push's last periodic host sample (here: the
    only periodic one is an hour away) reach the collector with its last push."""
    import http.server
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from memtrace.export.config import resolve
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.push import push_forever

    got: dict[tuple[int, str, str], float] = {}

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            req = ExportMetricsServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
            for rm in req.resource_metrics:
                pid = next((a.value.int_value for a in rm.resource.attributes if a.key == "process.pid"), 0)
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name in ("memtrace.nccl.calls", "memtrace.nccl.bytes"):
                            for dp in m.sum.data_points:
                                coll = next(a.value.string_value for a in dp.attributes if a.key == "collective")
                                got[(pid, m.name, coll)] = dp.as_int or dp.as_double  # cumulative: the last is all
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    rounds = 20
    truth = tmp_path / "truth.jsonl"
    env = dict(
        os.environ,
        WORKLOAD_TRUTH=str(truth),
        NCCL_CUDART=str(fakecuda / "lib" / "libcudart.so.13"),
        NCCL_HANDSHAKE="1",
        LD_LIBRARY_PATH=str(fakecuda / "lib"),
    )
    w = subprocess.Popen(
        [str(fakecuda / "nccl_workload"), str(fakecuda / "nccl" / "libnccl.so.2"), str(rounds)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    serving: threading.Thread | None = None
    try:
        assert w.stdout is not None and w.stdin is not None and w.stdout.readline().strip() == "ready"
        endpoint = f"http://127.0.0.1:{srv.server_port}"
        cfg = resolve({}, endpoint=endpoint, protocol="http/protobuf", timeout=5, interval=3600.0)
        stop = threading.Event()
        host = HostOptions(cpu=False, gpu=False, network=False, interval_s=3600.0)
        opts = PipelineOptions(Options(), host, measure_overhead=False, diagnose=False)
        # The agent forks its guardian: before this process has other threads.
        with Pipeline(opts) as pipe:
            serving = threading.Thread(target=srv.serve_forever, daemon=True)
            serving.start()
            assert pipe.host is not None
            pipe.host.start([w.pid])  # its first sample finds libnccl mapped and attaches
            pusher = threading.Thread(target=push_forever, args=(pipe, cfg, stop))
            pusher.start()
            try:
                w.stdin.write("go\n")
                w.stdin.flush()
                assert w.wait(timeout=60) == 0
            finally:
                stop.set()
                pusher.join(timeout=60)
            assert not pusher.is_alive()
    finally:
        if w.poll() is None:
            w.kill()
        if serving is not None:
            srv.shutdown()  # waits for serve_forever: only once it ran
        srv.server_close()
    doc = json.loads(truth.read_text().splitlines()[0])
    want = {(doc["pid"], "memtrace.nccl.calls", t["collective"]): t["calls"] for t in doc["collectives"] if t["calls"]}
    want |= {(doc["pid"], "memtrace.nccl.bytes", t["collective"]): t["bytes"] for t in doc["collectives"] if t["calls"]}
    assert want and {k: got.get(k) for k in want} == want
