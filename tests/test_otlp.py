"""The OTLP data memtrace builds from its aggregates: exact counters, exact
histogram counts, delta that neither loses nor repeats across failed pushes."""

from __future__ import annotations

import dataclasses
import os
from http import HTTPStatus

import numpy as np
import pytest

from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.ids import ProcessKey
from memtrace.export.config import resolve
from memtrace.export.otlp import DURATION_BOUNDS, SIZE_BOUNDS, MetricsBuilder
from memtrace.model import Model
from memtrace.sources.procfs import read_process

PID = os.getpid()  # a live process: its identity is read from /proc, as the agent does
API = 2  # cudaMemcpyAsync
GIB = 1 << 30


def events(n: int, rng: np.random.Generator) -> np.ndarray:
    b = np.zeros(n, dtype=EVENT_DTYPE)
    b["pid"] = PID
    b["api"] = API
    b["direction"] = Direction.H2D
    b["duration_ns"] = rng.integers(1, 10_000_000, n)
    b["bytes"] = rng.integers(0, 1 << 33, n)
    b["ret"] = np.where(rng.random(n) < 0.1, 700, 0)
    return b


def metric(batch, name: str):  # type: ignore[no-untyped-def]
    for rm in batch.data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name and rm.resource.attributes.get("process.pid") == PID:
                    return m
    raise KeyError(name)


def feed(model: Model, ev: np.ndarray, calls: int, nbytes: int, errors: int) -> None:
    model.add_events(ev)
    (st,) = (v for k, v in model.copies.items() if k.process.pid == PID)
    assert (st.calls, st.bytes, st.errors) == (calls, nbytes, errors)


def test_cumulative_counters_start_with_a_true_zero_and_carry_totals() -> None:
    m = Model(identify=read_process)
    ev = events(1000, np.random.default_rng(1))
    ok = ev["ret"] == 0
    feed(m, ev, 1000, int(ev["bytes"][ok].sum()), int((~ok).sum()))
    b = MetricsBuilder(resolve({}, endpoint="http://x:1"), {"host.name": "h"})
    batch = b.build(m, {}, 2)
    pts = metric(batch, "gpu.memcpy.bytes").data.data_points
    assert [p.value for p in pts] == [0, int(ev["bytes"][ok].sum())]
    assert pts[0].time_unix_nano == pts[0].start_time_unix_nano < pts[1].time_unix_nano
    batch.commit()
    pts = metric(b.build(m, {}, 2), "gpu.memcpy.bytes").data.data_points
    assert len(pts) == 1  # the zero is sent once per series
    dur = metric(batch, "gpu.memcpy.duration").data.data_points[0]
    assert dur.count == 1000 and abs(dur.sum - ev["duration_ns"].sum() * 1e-9) < 1e-9
    assert sum(dur.positive.bucket_counts) + dur.zero_count == 1000
    size = metric(batch, "gpu.memcpy.size").data.data_points[0]
    assert size.count == int(ok.sum())  # sizes of successful copies only


def test_delta_neither_loses_nor_repeats_across_a_failed_push() -> None:
    rng = np.random.default_rng(2)
    m = Model(identify=read_process)
    b = MetricsBuilder(resolve({}, endpoint="http://x:1", temporality="delta"), {})
    e1, e2, e3 = events(100, rng), events(200, rng), events(300, rng)
    e2["duration_ns"][0] = 1  # the failed push's window holds the smallest duration
    e3["duration_ns"] = np.maximum(e3["duration_ns"], 2)
    ok = [e["ret"] == 0 for e in (e1, e2, e3)]
    feed(m, e1, 100, int(e1["bytes"][ok[0]].sum()), int((~ok[0]).sum()))
    first = b.build(m, {}, 0)
    first.commit()
    assert [p.value for p in metric(first, "gpu.memcpy.calls").data.data_points] == [100]
    feed(
        m,
        np.concatenate([e2]),
        300,
        *(int(x) for x in (e1["bytes"][ok[0]].sum() + e2["bytes"][ok[1]].sum(), (~ok[0]).sum() + (~ok[1]).sum())),
    )
    failed = b.build(m, {}, 0)
    assert [p.value for p in metric(failed, "gpu.memcpy.calls").data.data_points] == [200]
    failed.rollback()  # the push failed: its increments must come again
    feed(
        m,
        e3,
        600,
        *(
            int(x)
            for x in (
                sum(e["bytes"][k].sum() for e, k in zip((e1, e2, e3), ok, strict=True)),
                sum((~k).sum() for k in ok),
            )
        ),
    )
    third = b.build(m, {}, 0)
    assert [p.value for p in metric(third, "gpu.memcpy.calls").data.data_points] == [500]
    later = int(e2["bytes"][ok[1]].sum() + e3["bytes"][ok[2]].sum())
    assert [p.value for p in metric(third, "gpu.memcpy.bytes").data.data_points] == [later]
    assert [p.value for p in metric(third, "gpu.memcpy.errors").data.data_points] == [
        int((~ok[1]).sum() + (~ok[2]).sum())
    ]
    d = metric(third, "gpu.memcpy.duration").data.data_points[0]
    assert d.count == 500
    assert d.min == 1e-9  # the failed push's window came back with the rollback
    third.commit()
    assert [p.value for p in metric(b.build(m, {}, 0), "gpu.memcpy.calls").data.data_points] == [0]


def test_explicit_buckets_are_exact() -> None:
    rng = np.random.default_rng(3)
    m = Model(identify=read_process)
    ev = events(5000, rng)
    ok = ev["ret"] == 0
    feed(m, ev, 5000, int(ev["bytes"][ok].sum()), int((~ok).sum()))
    batch = MetricsBuilder(resolve({}, endpoint="http://x:1", histogram="explicit"), {}).build(m, {}, 0)
    for name, values, bounds in (
        ("gpu.memcpy.duration", ev["duration_ns"] * 1e-9, DURATION_BOUNDS),
        ("gpu.memcpy.size", ev["bytes"][ok].astype(float), SIZE_BOUNDS),
    ):
        p = metric(batch, name).data.data_points[0]
        assert list(p.explicit_bounds) == bounds
        want = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
        assert list(p.bucket_counts) == want.tolist(), name


def test_a_cumulative_export_is_split_by_process_and_loses_no_point() -> None:
    # 40 processes: requests of at most REQUEST_POINTS-ish points, each
    # process whole in one of them, every point in exactly one request.
    from memtrace.export.transport import split_by_resource

    m = Model(identify=read_process)
    b = np.zeros(40 * 3, dtype=EVENT_DTYPE)
    b["pid"] = np.repeat(np.arange(10**7, 10**7 + 40), 3)
    b["api"], b["direction"], b["bytes"], b["duration_ns"] = 22, Direction.H2D, 4096, 1000
    m.add_events(b)
    data = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"}).build(m, {}, 1).data

    def points(rm) -> int:  # type: ignore[no-untyped-def]
        return sum(len(x.data.data_points) for sm in rm.scope_metrics for x in sm.metrics)

    per_process = max(points(rm) for rm in data.resource_metrics)
    parts = split_by_resource(data, 5 * per_process)
    assert len(parts) > 1
    assert [rm for p in parts for rm in p.resource_metrics] == list(data.resource_metrics)
    for p in parts:
        assert sum(points(rm) for rm in p.resource_metrics) <= 5 * per_process
    # A resource larger than the limit still goes, alone.
    assert [len(p.resource_metrics) for p in split_by_resource(data, 1)] == [1] * len(data.resource_metrics)


def test_a_delta_export_delivered_in_part_resends_only_what_did_not_arrive() -> None:
    # Two processes; the request with the first arrives, the one with the
    # second fails: the first's calls must not be sent again, the second's must.
    other = os.getppid()  # a second live process
    m = Model(identify=read_process)
    b = MetricsBuilder(resolve({}, endpoint="http://x:1", temporality="delta"), {})

    def copies(pid: int, n: int) -> np.ndarray:
        e = np.zeros(n, dtype=EVENT_DTYPE)
        e["pid"], e["api"], e["direction"], e["bytes"], e["duration_ns"] = pid, API, Direction.H2D, 8, 1000
        return e

    def calls(batch) -> dict[int, int]:  # type: ignore[no-untyped-def]
        out = {}
        for rm in batch.data.resource_metrics:
            for sm in rm.scope_metrics:
                for x in sm.metrics:
                    if x.name == "gpu.memcpy.calls":
                        out[rm.resource.attributes["process.pid"]] = sum(p.value for p in x.data.data_points)
        return out

    m.add_events(np.concatenate([copies(PID, 10), copies(other, 20)]))
    first = b.build(m, {}, 0)
    assert calls(first) == {PID: 10, other: 20}
    delivered = [
        i for i, rm in enumerate(first.data.resource_metrics) if rm.resource.attributes.get("process.pid") == PID
    ]
    assert {k.pid for k in first.processes_in(delivered[0] + 1)} >= {PID}
    first.commit_processes({ProcessKey(PID, 0)})  # only PID's request arrived
    m.add_events(np.concatenate([copies(PID, 1), copies(other, 2)]))
    second = b.build(m, {}, 0)
    assert calls(second) == {PID: 1, other: 22}
    second.commit()
    assert calls(b.build(m, {}, 0)) == {PID: 0, other: 0}


def test_an_export_in_requests_says_how_much_arrived(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A real HTTP endpoint that takes the first request and refuses the rest:
    # the exporter must say which resources arrived, so that a delta export
    # advances those alone (the test above) and sends the rest again.
    import http.server
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from memtrace.export import transport

    got: list[set[int]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            req = ExportMetricsServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
            pids = {
                a.value.int_value
                for rm in req.resource_metrics
                for a in rm.resource.attributes
                if a.key == "process.pid"
            }
            got.append(pids)
            self.send_response(200 if len(got) == 1 else 400)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        m = Model(identify=read_process)
        e = np.zeros(2, dtype=EVENT_DTYPE)
        e["pid"], e["api"], e["direction"], e["bytes"] = [PID, os.getppid()], API, Direction.H2D, 8
        m.add_events(e)
        cfg = resolve({}, endpoint=f"http://127.0.0.1:{srv.server_port}", protocol="http/protobuf", timeout=5)
        batch = MetricsBuilder(cfg, {}).build(m, {}, 0)
        monkeypatch.setattr(transport, "REQUEST_POINTS", 1)  # one process a request
        ok, why, delivered = transport.MetricsExporter(cfg).export(batch.data)
        assert not ok and why
        assert delivered == 1 and len(got) == 2  # the first arrived, the second was refused, no third was tried
        assert {k.pid for k in batch.processes_in(delivered)} == got[0] and len(got[0]) == 1
    finally:
        srv.shutdown()


# ---- why a push failed, as a user can act on it (real servers on 127.0.0.1) ----


class _Answers:
    """A tiny HTTP server on 127.0.0.1 that answers every push with one status and body."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_port
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _push_once(endpoint: str) -> tuple[bool, str, int]:
    from memtrace.export.transport import MetricsExporter

    cfg = resolve({}, endpoint=endpoint, protocol="http/protobuf", timeout=5)
    data = MetricsBuilder(cfg, {}).build(Model(identify=read_process), {}, 0).data
    exporter = MetricsExporter(cfg)
    try:
        return exporter.export(data)
    finally:
        exporter.shutdown()


def test_nothing_listening_is_said_as_cannot_connect_to_host_and_port() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago, closed now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _push_once(f"http://127.0.0.1:{port}") == (
        False,
        f"cannot connect to 127.0.0.1:{port}: Connection refused",
        0,
    )


@pytest.mark.parametrize(
    "status, body, content_type, want",
    [
        (404, b"404 page not found\nsecond line\n", "text/plain", "HTTP 404 Not Found: 404 page not found"),
        (404, b"", "text/plain", "HTTP 404 Not Found"),
        # The reason is the test server's own: Python 3.13 renamed 413's phrase.
        (413, b"\n  " + b"x" * 5000, "text/plain", f"HTTP 413 {HTTPStatus(413).phrase}: " + "x" * 197 + "..."),
        # An OTLP collector's refusal: a google.rpc.Status in protobuf.
        (400, "status", "application/x-protobuf", "HTTP 400 Bad Request: data refused: no resource"),
    ],
    ids=["404-text", "404-empty", "413-long", "400-otlp-status"],
)
def test_a_refusal_gives_status_reason_and_the_first_line_of_its_body(
    status: int, body: bytes | str, content_type: str, want: str
) -> None:
    if body == "status":
        from google.rpc.status_pb2 import Status

        body = Status(code=3, message="data refused: no resource\ndetail").SerializeToString()
    assert isinstance(body, bytes)
    srv = _Answers(status, body, content_type)
    try:
        assert _push_once(f"http://127.0.0.1:{srv.port}") == (False, want, 0)
    finally:
        srv.close()


def test_exports_and_forgetting_processes_make_no_cyclic_garbage() -> None:
    """`memtrace push` freezes what lives on after each export out of the
    cyclic collector (memtrace.runtime.memory: its full passes stalled the
    drain thread for up to 500 ms at 1000 processes). That leaks nothing only
    if the model, the host book and an export's build make no reference
    cycles: here processes copy, allocate, free, wait and step, are exported,
    exit and are forgotten, with the collector off, and it then finds no
    garbage. (A first round runs with it on: the modules those paths import
    on first use make some once, as importing numpy.ma or a dataclass does.)"""
    import gc

    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from memtrace.model.host import HostBook

    def churn(rounds: range) -> None:
        m = Model(identify=read_process)
        b = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"})
        host = HostBook()
        n = 12  # per process: copies, an allocation and its free, and stream waits
        for r in rounds:
            pids = np.arange(10**7, 10**7 + 30) + 100 * r
            ev = np.zeros(len(pids) * n, dtype=EVENT_DTYPE)
            ev["pid"] = ev["tid"] = np.repeat(pids, n)
            ev["ts_ns"] = np.tile(np.arange(n) * 1_000_000, len(pids)) + 1
            ev["duration_ns"] = 1000
            ev["api"] = np.tile([API, API, 80, API, 40, 41, 80, API, 80, API, 80, 80], len(pids))
            ev["direction"] = Direction.H2D
            ev["bytes"] = 4096
            ev["dst"] = np.tile([0, 0, 0, 0, 0x7000, 0x7000, 0, 0, 0, 0, 0, 0], len(pids))
            m.add_events(ev)
            batch = b.build(m, {}, 1, host=host)
            assert len(encode_metrics(batch.data).SerializeToString()) > 0
            batch.commit()
            assert {k.pid for k in m.processes} == set(pids.tolist())
            for key in list(m.processes):
                m.process_exited(key)
                m.forget(key)
        assert not m.processes

    churn(range(1))
    gc.collect()
    gc.disable()
    try:
        churn(range(1, 5))
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_cpu_sensors_switch_gaps_are_counted_in_the_agents_health() -> None:
    """A gap in the sched tracepoints' switches (host.cpu_sensor.switch_gaps
    in `run`'s JSON) reaches a pushing agent's health counters too."""
    from memtrace.model.host import HostBook

    b = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"})
    host = HostBook()

    def gaps() -> int:
        batch = b.build(Model(), {}, 1, host=host)
        batch.commit()
        (point,) = [
            p.value
            for rm in batch.data.resource_metrics
            for sm in rm.scope_metrics
            for x in sm.metrics
            if x.name == "memtrace.agent.cpu_switch_gaps"
            for p in x.data.data_points
        ]
        return int(point)

    assert gaps() == 0
    host.cpu_gaps = {"switch_gaps": 3, "processes_not_kept": 0, "threads_not_kept": 0, "preemptions_not_attributed": 0}
    assert gaps() == 3
    host.cpu_gaps = {**host.cpu_gaps, "switch_gaps": 5}
    assert gaps() == 5  # cumulative, the default temporality


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_a_gpus_pcie_bytes_are_exported_where_the_driver_counts_them(temporality: str) -> None:
    """hw.gpu.io (the OpenTelemetry GPU convention: bytes, by network.io.direction) carries the
    exact bytes between the first sample and the last, or since the last push that arrived; a GPU
    whose driver has no byte counters (NVML's 20 ms estimate only) has none, since an estimate of a
    rate is not a count of bytes. The summary's rows say which each GPU had."""
    from memtrace.core.gpu import GpuSample
    from memtrace.export.host import gpu_row
    from memtrace.model.host import HostBook

    b = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1", temporality=temporality), {"host.name": "t"})
    host = HostBook()

    def add(t_s: int, tx: int, rx: int, estimate: int = 5000) -> None:
        kw = dict(name="G", bus_id="", time_ns=t_s * 10**9)
        host.add_gpus(
            [
                GpuSample(index=0, uuid="GPU-c", **kw, pcie_tx_bytes=tx, pcie_rx_bytes=rx),
                GpuSample(index=1, uuid="GPU-s", **kw, pcie_tx_bytes_per_s=estimate, pcie_rx_bytes_per_s=estimate),
            ]
        )

    def push() -> dict[tuple[str, str], float]:
        batch = b.build(Model(), {}, 1, host=host)
        batch.commit()
        return {
            (p.attributes["hw.id"], p.attributes["network.io.direction"]): p.value
            for rm in batch.data.resource_metrics
            for sm in rm.scope_metrics
            for x in sm.metrics
            if x.name == "hw.gpu.io"
            for p in x.data.data_points
            if p.time_unix_nano != p.start_time_unix_nano
        }

    add(1, 10**12, 0)
    add(2, 10**12 + 3 * GIB, 100)
    assert push() == {("GPU-c", "transmit"): 3 * GIB, ("GPU-c", "receive"): 100}
    add(4, 10**12 + 3 * GIB + 6, 100 + 2 * GIB, estimate=7000)
    second = {("GPU-c", "transmit"): 6, ("GPU-c", "receive"): 2 * GIB}
    if temporality == "cumulative":
        second = {("GPU-c", "transmit"): 3 * GIB + 6, ("GPU-c", "receive"): 100 + 2 * GIB}
    assert push() == second
    rows = {g.uuid: gpu_row(g, None) for g in host.gpus.values()}
    c, s = rows["GPU-c"], rows["GPU-s"]
    assert c["pcie_throughput_from"] == "byte_counters" and c["pcie_counter_resets"] == 0
    assert (c["pcie_tx_bytes"], c["pcie_rx_bytes"]) == (3 * GIB + 6, 100 + 2 * GIB)
    assert c["pcie_tx_bytes_per_second"] == {"mean": (3 * GIB + 6) / 3, "max": 3 * GIB}
    assert c["pcie_rx_bytes_per_second"] == {"mean": (100 + 2 * GIB) / 3, "max": GIB}
    assert s["pcie_throughput_from"] == "20ms_samples" and s["pcie_tx_bytes"] is None
    assert s["pcie_tx_bytes_per_second"] == {"mean": 17000 / 3, "max": 7000}


def test_gpm_nvlink_remapped_rows_and_mig_are_exported_and_summarised() -> None:
    """A Hopper GPU with GPM and two NVLinks (link 1 goes down, link 0's counters are reset once) and
    an older GPU without GPM: the activity gauges are the last interval's shares, and the older GPU
    says it has no GPM (memtrace.gpu.gpm.supported 0, `gpm` false) instead of reading 0. NVLink bytes
    and errors are the sums of the counters' increases, a reset counted from zero."""
    from memtrace.core.gpu import GpuSample, MigInstance, NvLink, RemappedRows
    from memtrace.export.host import gpu_row
    from memtrace.model.host import HostBook

    b = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"})
    host = HostBook()
    kib = 1024
    readings = [  # (link 0 tx, rx, crc), link 1 active, SM active %
        ((1000 * kib, 10 * kib, 5), True, None),
        ((3000 * kib, 10 * kib, 7), True, 90.0),
        ((500 * kib, 30 * kib, 1), False, 30.0),  # link 0's counters reset; link 1 down
    ]
    for t, ((tx, rx, crc), up, sm) in enumerate(readings, 1):
        links = (NvLink(0, True, tx, rx, crc, 0, 0), NvLink(1, up, 0, 0, 0, 0, 0))
        host.add_gpus(
            [
                GpuSample(index=0, uuid="GPU-h", name="H", bus_id="", time_ns=t * 10**9, gpm_supported=True,
                          sm_active_percent=sm, tensor_active_percent=sm, nvlinks=links,
                          remapped_rows=RemappedRows(4, 1, True, False), mig_enabled=True,
                          mig_instances=(MigInstance(2, "MIG-x", 3, 0, 5 * GIB, 20 * GIB),)),
                GpuSample(index=1, uuid="GPU-a", name="A", bus_id="", time_ns=t * 10**9, gpm_supported=False),
            ]
        )  # fmt: skip
    batch = b.build(Model(), {}, 1, host=host)
    points: dict[tuple[str, ...], float] = {}
    keys = ("memtrace.nvlink", "network.io.direction", "error.type", "memtrace.remap.cause", "memtrace.mig.id")
    for rm in batch.data.resource_metrics:
        for scope in rm.scope_metrics:
            for x in scope.metrics:
                for p in x.data.data_points:
                    a = p.attributes
                    if "hw.id" not in a or (x.name.endswith(".io") and p.time_unix_nano == p.start_time_unix_nano):
                        continue  # not a GPU's, or a counter's zero start point
                    points[(x.name, a["hw.id"], *(str(a[k]) for k in keys if k in a))] = p.value
    assert points[("memtrace.gpu.gpm.supported", "GPU-h")] == 1
    assert points[("memtrace.gpu.gpm.supported", "GPU-a")] == 0
    assert points[("memtrace.gpu.sm.active", "GPU-h")] == pytest.approx(0.30)
    assert points[("memtrace.gpu.tensor.active", "GPU-h")] == pytest.approx(0.30)
    assert not any(k[0] == "memtrace.gpu.sm.active" and k[1] == "GPU-a" for k in points)  # never a 0
    assert points[("memtrace.gpu.nvlink.io", "GPU-h", "0", "transmit")] == 2000 * kib + 500 * kib
    assert points[("memtrace.gpu.nvlink.io", "GPU-h", "0", "receive")] == 20 * kib  # rx was not reset
    assert points[("memtrace.gpu.nvlink.errors", "GPU-h", "0", "crc")] == 2 + 1
    assert (points[("memtrace.gpu.nvlink.up", "GPU-h", "0")], points[("memtrace.gpu.nvlink.up", "GPU-h", "1")]) == (
        1,
        0,
    )
    assert points[("memtrace.gpu.memory.remapped_rows", "GPU-h", "uncorrectable")] == 1
    assert points[("memtrace.gpu.memory.remap_pending", "GPU-h")] == 1
    assert points[("memtrace.gpu.mig.memory.usage", "GPU-h", "MIG-x")] == 5 * GIB
    rows = {g.uuid: gpu_row(g, None) for g in host.gpus.values()}
    h, a = rows["GPU-h"], rows["GPU-a"]
    assert (h["gpm"], a["gpm"], a["activity"]) == (True, False, None)
    assert h["activity"] is not None and h["activity"]["sm_active_percent"] == {"mean": 60.0, "max": 90.0}
    link0, link1 = h["nvlinks"]
    assert (link0["tx_bytes"], link0["rx_bytes"], link0["crc_errors"], link0["counter_resets"]) == (
        2500 * kib, 20 * kib, 3, 1)  # fmt: skip
    assert (link1["active"], link1["down_share"]) == (False, 1 / 3)
    assert h["remapped_rows"] == {"correctable": 4, "uncorrectable": 1, "pending": True, "failed": False}
    assert h["mig_instances"][0]["uuid"] == "MIG-x" and h["mig_instances"][0]["memory_used_bytes"] == 5 * GIB


def test_the_wait_after_a_collective_is_exported_per_collective() -> None:
    """memtrace.nccl.waits / memtrace.nccl.wait_time: a process's stream wait,
    folded before the NCCL poll that brings the all_reduce it waited for, is
    charged to it once the poll says every collective up to the wait is in."""
    from memtrace.core.nccl import EVENT_DTYPE as NCCL_DTYPE
    from memtrace.core.nccl import Collective

    m = Model()
    pid, stream = 10**7 + 5, 0xA0
    ev = np.zeros(2, dtype=EVENT_DTYPE)
    ev["pid"] = ev["tid"] = pid
    ev["api"] = 80  # cudaStreamSynchronize, on the collective's stream, then one on another
    ev["stream"] = [stream, 0xB0]
    ev["ts_ns"] = [2_000, 3_000]
    ev["duration_ns"] = [777_000, 5_000]
    first = np.zeros(1, dtype=EVENT_DTYPE)
    first["pid"] = first["tid"] = pid
    first["api"], first["ts_ns"], first["duration_ns"] = API, 100, 10  # the process's first CUDA call
    m.add_events(first)
    # libnccl seen mapped: nothing polled yet
    m.add_collectives(np.zeros(0, NCCL_DTYPE), 0, frozenset({ProcessKey(pid, 0)}))
    m.add_events(ev)
    nc = np.zeros(1, NCCL_DTYPE)
    nc["pid"] = nc["tid"] = pid
    nc["coll"] = Collective.ALLREDUCE
    nc["stream"] = stream
    nc["ts_ns"], nc["duration_ns"] = 1_000, 500  # issued at 1,500: before the wait began
    m.add_collectives(nc, 1_999, frozenset({ProcessKey(pid, 0)}))
    assert m.collective_wait_totals() == {}  # the wait began at 2,000: not judged yet
    m.add_collectives(np.zeros(0, NCCL_DTYPE), 10_000, frozenset({ProcessKey(pid, 0)}))
    assert m.collective_wait_totals() == {(ProcessKey(pid, 0), Collective.ALLREDUCE): (1, 777_000)}
    batch = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"}).build(m, {}, 1)
    (rm,) = [r for r in batch.data.resource_metrics if r.resource.attributes.get("process.pid") == pid]
    got = {
        (x.name, p.attributes["collective"]): p.value
        for sm in rm.scope_metrics
        for x in sm.metrics
        if x.name.startswith("memtrace.nccl.wait")
        for p in x.data.data_points
        if p.time_unix_nano != p.start_time_unix_nano
    }
    assert got == {("memtrace.nccl.waits", "all_reduce"): 1, ("memtrace.nccl.wait_time", "all_reduce"): 777e-6}


def test_an_exited_process_with_nothing_to_send_is_let_go_with_the_export() -> None:
    """A process the agent met (its identity from BPF) but whose calls it
    never folded (none returned before it died) has no series: once it has
    exited, the export lets it go with the others, or push would keep it
    forever (tests/test_reliability.py's churn caught one such)."""
    m = Model()
    key = ProcessKey(10**7 + 9, 123)
    m.introduce(key, "workload", 0)
    m.process_exited(key)
    batch = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "t"}).build(m, {}, 1)
    assert batch.exited == [key] and key not in batch.keys
    assert all(rm.resource.attributes.get("process.pid") != key.pid for rm in batch.data.resource_metrics)


def test_what_the_probes_cost_a_process_is_exported_with_its_finding() -> None:
    """memtrace.probe.traps (the kernel's count, launches included) and
    memtrace.overhead (their estimated cost, a share of the process's CPU
    time); over the budget, the finding too; with no budget, no finding."""
    from memtrace.core.abi import TRAPS_API
    from memtrace.core.overhead import TrapCost

    m = Model(identify=read_process)
    m.add_events(events(10, np.random.default_rng(3)))
    (key,) = (k for k in m.processes if k.pid == PID)
    m.set_traps(key, 20)  # ten copies' entries and returns
    m.set_launches(key, {100: 1000})
    m.process_exited(key, cpu_ns=150_000_000)
    m.trap_cost = TrapCost(2e-6, 4e-6)
    assert TRAPS_API != 100
    cost = 1000 * 2e-6 + 10 * 4e-6
    b = MetricsBuilder(resolve({}, endpoint="http://x:1"), {"host.name": "h"})
    batch = b.build(m, {}, 2)
    assert [p.value for p in metric(batch, "memtrace.probe.traps").data.data_points][-1] == 1020
    (share,) = metric(batch, "memtrace.overhead").data.data_points
    assert share.value == pytest.approx(cost / 0.15)
    findings = [p for p in metric(batch, "memtrace.finding").data.data_points]
    assert [p.attributes["finding"] for p in findings] == ["overhead_budget_exceeded"]
    assert findings[0].value == pytest.approx(cost / 0.15)
    cfg = dataclasses.replace(resolve({}, endpoint="http://x:1"), overhead_budget=None)
    batch = MetricsBuilder(cfg, {"host.name": "h"}).build(m, {}, 2)
    with pytest.raises(KeyError):
        metric(batch, "memtrace.finding")
    assert metric(batch, "memtrace.overhead").data.data_points[0].value == pytest.approx(cost / 0.15)


def test_sampled_launches_are_a_series_marked_estimated() -> None:
    """A process whose launch probes the budget sampled: gpu.launches carries
    `estimated`, as a series of its own (with its own zero point: it never
    continues the exact series), and the traps are those taken, not the
    launches."""
    from memtrace.core.overhead import TrapCost

    m = Model(identify=read_process)
    m.add_events(events(10, np.random.default_rng(3)))
    (key,) = (k for k in m.processes if k.pid == PID)
    m.trap_cost = TrapCost(2e-6, 4e-6)
    m.set_traps(key, 20)
    m.set_launches(key, {100: 1000})
    b = MetricsBuilder(resolve({}, endpoint="http://x:1"), {"host.name": "h"})
    # A new series' first point is its zero at its start, then its value.
    *_, exact = metric(b.build(m, {}, 2), "gpu.launches").data.data_points
    assert exact.value == 1000 and "estimated" not in exact.attributes
    m.set_launches(key, {100: 50_000}, traps=1_200, duty=0.02)
    points = metric(b.build(m, {}, 3), "gpu.launches").data.data_points
    assert all(p.attributes["estimated"] is True for p in points)
    assert [p.value for p in points] == [0, 50_000]  # its own true zero first
    assert [p.value for p in metric(b.build(m, {}, 4), "memtrace.probe.traps").data.data_points][-1] == 1_220


def test_profiles_carry_deltas_since_the_last_push_that_arrived() -> None:
    """Each push's profiles hold the calls and bytes since the last push
    that arrived: one that failed is sent again whole with the next, never
    counted twice; a batch built before another arrived is never sent;
    the bytes in use are the current figure, not a delta."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest,
    )

    from memtrace.export.otlp_profiles import ProfilesBuilder

    def sites(calls: int, nbytes: int, in_use: int) -> list[dict]:
        py = [{"function": "upload", "file": "/app/train.py", "line": 42}]
        native = [{"module": "/usr/lib/libcudart.so.13", "offset": 4096, "function": "cudaMemcpy"}]
        return [
            {"pid": 7, "process": "train", "kind": "copy", "api": "cudaMemcpy", "direction": "h2d",
             "host_memory": "pinned", "calls": calls, "bytes": nbytes, "frames": native + py},
            {"pid": 7, "process": "train", "kind": "alloc", "api": "cudaMalloc", "direction": None,
             "host_memory": "unknown", "calls": 1, "bytes": 4096, "in_use_bytes": in_use, "frames": py},
        ]  # fmt: skip

    def values(req: ExportProfilesServiceRequest) -> dict[str, int]:
        st = req.dictionary.string_table
        (rp,) = req.resource_profiles
        assert {a.key: a.value.int_value for a in rp.resource.attributes}["process.pid"] == 7
        return {
            st[p.sample_type.type_strindex]: sum(v for s in p.samples for v in s.values)
            for sp in rp.scope_profiles
            for p in sp.profiles
        }

    b = ProfilesBuilder({"host.name": "h"})
    procs = {7: {"process.pid": 7}}
    first = b.build(sites(10, 1000, 4096), procs)
    assert first.request is not None
    assert values(first.request) == {
        "copies": 10, "copy_bytes": 1000, "allocations": 1, "allocated_bytes": 4096, "in_use_bytes": 4096,
    }  # fmt: skip
    # It did not arrive: the next carries everything since the start.
    second = b.build(sites(15, 1500, 4096), procs)
    assert second.request is not None and values(second.request)["copies"] == 15
    b.commit(second)
    assert not b.current(first)  # built before the second arrived: never sent now
    third = b.build(sites(18, 1800, 0), procs)
    assert third.request is not None
    assert values(third.request) == {"copies": 3, "copy_bytes": 300}  # nothing in use, no new allocation
    # Frames: the CUDA call's caller first, Python frames with their line.
    d = third.request.dictionary
    (stack,) = {s.stack_index for rp in third.request.resource_profiles for sp in rp.scope_profiles
                for p in sp.profiles for s in p.samples}  # fmt: skip
    locs = [d.location_table[i] for i in d.stack_table[stack].location_indices]
    names = [d.string_table[d.function_table[loc.lines[0].function_index].name_strindex] for loc in locs]
    assert names == ["cudaMemcpy", "upload"] and locs[1].lines[0].line == 42 and locs[0].address == 4096


# ---- the catalog (memtrace/export/catalog.py) against what the builder emits ----


def _rows(pid: int, spec: list[dict]) -> np.ndarray:
    b = np.zeros(len(spec), dtype=EVENT_DTYPE)
    for i, r in enumerate(spec):
        b[i]["pid"] = b[i]["tid"] = pid
        for k, v in r.items():
            b[i][k] = v
    return b


def rich_build(cfg_kw: dict | None = None):  # type: ignore[no-untyped-def]
    """A build with every kind of series: a stepping process that copies from
    pageable and pinned memory (a finding), allocates, frees and fails, and
    was diagnosed; a second whose launches the budget sampled, with its
    probes over budget (a finding); a third that waited for an all_reduce
    and called NCCL; the CPU sensor's readings; a GPU whose driver counts
    PCIe bytes; an interface with a speed and a tbf queue. Returns the
    builder and the batch."""
    from test_steps import events as step_events
    from test_steps import loop

    from memtrace.core.cpu import CpuStats
    from memtrace.core.gpu import GpuProcess, GpuSample, MigInstance, NvLink, RemappedRows
    from memtrace.core.nccl import EVENT_DTYPE as NCCL_DTYPE
    from memtrace.core.nccl import CallTotals, Collective
    from memtrace.core.netdev import InterfaceSample, Netns, NetSnapshot, QdiscSample
    from memtrace.core.overhead import TrapCost
    from memtrace.model.host import HostBook

    a, b, c = PID, os.getppid(), 10**7 + 5
    m = Model(identify=read_process)
    m.complete_after_ns = None  # untracked host memory is pageable
    m.add_events(step_events(loop(40), pid=a))
    pinned = 0x7F00_0000_0000
    copy = {"api": 22, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}
    alloc, free = {"api": 60, "bytes": 4096}, {"api": 61}
    m.add_events(
        _rows(
            a,
            [{"api": 66, "dst": pinned, "bytes": GIB}, *[{**copy, "src": 0x1000}] * 3, {**copy, "src": pinned}]
            + [{**copy, "src": 0x1000, "ret": 700}, {**alloc, "dst": 0x5000_0000}, {**free, "dst": 0x5000_0000}]
            + [{**free, "dst": 0x6000_0000}, {**alloc, "ret": 2}, {**alloc, "dst": 0x5100_0000}],
        )
    )
    m.add_events(_rows(b, [{"api": 22, "direction": Direction.D2D, "bytes": 4096, "duration_ns": 1000}]))
    ka = next(k for k in m.processes if k.pid == a)
    kb = next(k for k in m.processes if k.pid == b)
    m.processes[ka].attributes["k8s.pod.uid"] = "0b8e8f2a-1c1d-4e5f-9a0b-123456789abc"  # in a pod
    m.trap_cost = TrapCost(2e-6, 4e-6)
    m.set_traps(ka, 20)
    m.set_launches(ka, {100: 1000})
    m.set_traps(kb, 20)
    m.set_launches(kb, {100: 50_000}, traps=1_200, duty=0.02)
    m.process_exited(kb, cpu_ns=150_000_000)
    # The third process: a wait on the all_reduce's stream (as in the collectives test above).
    ev = _rows(c, [{"api": API, "ts_ns": 100, "duration_ns": 10}])
    m.add_events(ev)
    m.add_collectives(np.zeros(0, NCCL_DTYPE), 0, frozenset({ProcessKey(c, 0)}))
    m.add_events(_rows(c, [{"api": 80, "stream": 0xA0, "ts_ns": 2_000, "duration_ns": 777_000}]))
    nc = np.zeros(1, NCCL_DTYPE)
    nc["pid"] = nc["tid"] = c
    nc["coll"], nc["stream"], nc["ts_ns"], nc["duration_ns"] = Collective.ALLREDUCE, 0xA0, 1_000, 500
    m.add_collectives(nc, 1_999, frozenset({ProcessKey(c, 0)}))
    m.add_collectives(np.zeros(0, NCCL_DTYPE), 10_000, frozenset({ProcessKey(c, 0)}))

    host = HostBook()
    host.set_cpu({ka: CpuStats(a, ka.start_ns, (), (), 10, 20, 30, 4, 5, 0)})
    kc = next(k for k in m.processes if k.pid == c)
    host.set_collectives({(kc, Collective.ALLREDUCE): CallTotals(calls=3, bytes=4096, duration_ns=1000)}, [])

    def gpu(t: int, tx: int, rx: int) -> GpuSample:
        # GPM, two NVLinks (one down at the end), remapped rows, a MIG instance.
        links = (NvLink(0, True, tx, rx, 2 * t, t, 0), NvLink(1, t < 2, 0, 0, 0, 0, 0))
        mig = MigInstance(0, "MIG-a", 1, 0, GIB, 10 * GIB, (), 55.0, 20.0, 30.0, 10.0)
        return GpuSample(
            index=0, uuid="GPU-a", name="G", bus_id="", time_ns=t * 10**9, pcie_tx_bytes=tx, pcie_rx_bytes=rx,
            pcie_replay_count=7, link_generation=5, link_width=16, max_link_generation=5, max_link_width=16,
            sm_utilization_percent=97, memory_used_bytes=20 * GIB, memory_total_bytes=80 * GIB,
            temperature_celsius=64, power_milliwatts=412345, clock_event_mask=0, sm_clock_mhz=1755,
            memory_clock_mhz=2619, gpm_supported=True, sm_active_percent=80.0, sm_occupancy_percent=40.0,
            tensor_active_percent=60.0,
            dram_bandwidth_percent=30.0, nvlinks=links, remapped_rows=RemappedRows(2, 1, True, False),
            mig_enabled=True, mig_instances=(mig,), processes=(GpuProcess(a, 0, "GPU-a", 300 << 20),),
        )  # fmt: skip

    def net(t: int, k: int) -> NetSnapshot:
        i = InterfaceSample(7, 3, "eth0", "up", 10**10, 1000 * k, 2000 * k, 10 * k, 20 * k, k, k, k, k)
        q = QdiscSample(7, 3, "eth0", "tbf", 0x10000, 0xFFFFFFFF, 500 * k, 5 * k, k, 2 * k, 0, 100, 1)
        return NetSnapshot(t * 10**9, (Netns(7, (a,), True),), (i,), (q,))

    host.add_gpus([gpu(1, 10**12, 0)])
    host.add_gpus([gpu(2, 10**12 + GIB, 100)])
    host.add_net(net(1, 1))
    host.add_net(net(2, 3))
    builder = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1", **(cfg_kw or {})), {"host.name": "h"})
    batch = builder.build(m, {}, 2, host=host, drain_gap_s=0.01, diagnoses={ka: {("straggler", "cpu_interference"): 1}})
    return builder, batch


def emitted(batch) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """Each metric of a batch by name: (the metric, whether on a process's resource) per resource."""
    out: dict[str, list] = {}
    for rm in batch.data.resource_metrics:
        for sm in rm.scope_metrics:
            for x in sm.metrics:
                out.setdefault(x.name, []).append((x, "process.pid" in rm.resource.attributes))
    return out


@pytest.mark.parametrize("histogram", ["exponential", "explicit"])
def test_a_rich_build_emits_exactly_the_catalogs_metrics_kinds_units_and_attributes(histogram: str) -> None:
    from opentelemetry.sdk.metrics.export import ExponentialHistogram, Gauge, Histogram, Sum

    from memtrace.export.catalog import BY_NAME, METRICS, Kind, On

    _, batch = rich_build({"histogram": histogram})
    got = emitted(batch)
    assert set(got) == set(BY_NAME), set(got) ^ set(BY_NAME)  # every metric the catalog has, and no other
    assert len(BY_NAME) == len(METRICS)  # no name twice
    data = {Kind.sum: (Sum,), Kind.gauge: (Gauge,), Kind.histogram: (Histogram, ExponentialHistogram)}
    for name, metrics in got.items():
        spec = BY_NAME[name]
        seen: set[str] = set()
        for x, on_process in metrics:
            assert (x.unit, x.description) == (spec.unit, spec.description), name
            assert isinstance(x.data, data[spec.kind]), name
            assert on_process == (spec.on == On.process), name
            for p in x.data.data_points:
                assert set(p.attributes) <= spec.attribute_names, (name, set(p.attributes) - spec.attribute_names)
                seen.update(p.attributes)
        assert seen == spec.attribute_names, (name, spec.attribute_names - seen)  # each one emitted somewhere


def test_the_catalogs_semantic_conventions_are_opentelemetrys() -> None:
    """Where the reference says a metric follows an OpenTelemetry semantic
    convention, the installed conventions have that metric with that unit
    and the same instrument, or the reference says what differs; attributes
    marked as conventions are conventions' attribute names."""
    import importlib
    import pkgutil

    import opentelemetry.semconv._incubating.attributes as attrs_pkg
    import opentelemetry.semconv._incubating.metrics as metrics_pkg

    from memtrace.export.catalog import METRICS, PROCESS_RESOURCE, Kind

    class Recorder:  # a Meter that only notes what was asked of it
        def __getattr__(self, method: str):  # type: ignore[no-untyped-def]
            return lambda **kw: (method.removeprefix("create_"), kw["unit"])

    conventions: dict[str, tuple[str, str]] = {}
    names: set[str] = set()
    for pkg in (metrics_pkg, attrs_pkg):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for const, value in vars(mod).items():
                if not (const.isupper() and isinstance(value, str)):
                    continue
                names.add(value)
                make = getattr(mod, f"create_{const.lower()}", None)
                if make is not None:
                    try:
                        conventions[value] = make(Recorder())
                    except TypeError:  # an observable instrument: it wants its callbacks too
                        conventions[value] = make(Recorder(), [])
    instrument = {
        Kind.sum: {"counter", "observable_counter"},
        Kind.gauge: {"gauge", "observable_gauge"},
        Kind.histogram: {"histogram"},
    }
    marked = [m for m in METRICS if m.semconv is not None]
    assert len(marked) >= 9
    for m in marked:
        assert m.name in conventions, m.name
        kind, unit = conventions[m.name]
        assert unit == m.unit, m.name
        assert kind in instrument[m.kind] or m.semconv.differs, (m.name, kind)
    for m in METRICS:
        if m.semconv is None:
            assert m.name not in conventions or m.name.startswith("memtrace."), m.name
        for a in m.attributes:
            assert a.semconv == (a.name in names), a.name
    # Semantic-convention attributes are OpenTelemetry's; memtrace's own (memtrace.job.*) are not in them.
    assert all((a.name in names) == a.semconv for a in PROCESS_RESOURCE), [
        a.name for a in PROCESS_RESOURCE if (a.name in names) != a.semconv
    ]
    assert all(a.semconv or a.name.startswith("memtrace.") for a in PROCESS_RESOURCE)


# ---- events: the logs transport says why they did not arrive ----


TRAIN = ProcessKey(7, 1)


def test_a_log_collector_that_refuses_is_said_once_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    """The events' transport names the refusal as the metrics' does (status,
    reason, the body's first line), once, not at every batch."""
    from memtrace.analysis.diagnosis import Diagnosis
    from memtrace.export.events import Events

    def diagnosis(cause: str) -> Diagnosis:
        return Diagnosis(cause, TRAIN, "train", "steps 2x slower", 2.0, 10**18, 10**18, {}, "fix it")

    srv = _Answers(404, b"no logs here\nsecond line\n", "text/plain")
    try:
        events = Events(resolve({}, endpoint=f"http://127.0.0.1:{srv.port}"), {"service.name": "memtrace"})
        events.diagnosis(diagnosis("straggler"))
        events.provider.force_flush()
        events.diagnosis(diagnosis("gpu_throttling"))
        events.shutdown()
    finally:
        srv.close()
    said = [r.getMessage() for r in caplog.records if "events to" in r.getMessage()]
    assert said == [f"events to http://127.0.0.1:{srv.port}/v1/logs not sent: HTTP 404 Not Found: no logs here"]


# ---- findings: their number in a bounded metric, their text in events ----


def _finding(value: float, summary: str, fix: str = "pin it", key: ProcessKey = TRAIN):  # type: ignore[no-untyped-def]
    from memtrace.analysis.findings import Finding

    return Finding("pageable_h2d", key, "train", value, summary, fix, {"h2d_bytes": 1}, 10**18)


def test_a_finding_is_said_when_it_appears_and_again_only_when_its_text_changes_materially() -> None:
    from memtrace.export.events import FindingNotes

    notes = FindingNotes(max_records=4)

    def due(*found) -> list[float]:  # type: ignore[no-untyped-def]
        return [f.value for f in notes.due(found)]

    text = "{:.0%} of H2D bytes ({} of 256.0 MiB) came from pageable memory at {} GB/s"
    assert due(_finding(0.30, text.format(0.30, "76.8 MiB", "1.2"))) == [0.30]  # it appears
    # New figures, same words, a number that has not doubled: nothing new to say.
    assert due(_finding(0.45, text.format(0.45, "115.2 MiB", "1.4"))) == []
    assert due(_finding(0.59, text.format(0.59, "1.1 GiB", "9.9"))) == []  # units are figures too
    # Doubled since the last record (0.30): said again, and 0.60 is the new reference.
    assert due(_finding(0.60, text.format(0.60, "1.2 GiB", "1.0"))) == [0.60]
    assert due(_finding(0.31, text.format(0.31, "1.2 GiB", "1.0"))) == []  # not yet halved
    assert due(_finding(0.30, text.format(0.30, "1.2 GiB", "1.0"))) == [0.30]  # halved
    # Other words or another fix: said again.
    assert due(_finding(0.30, text.format(0.30, "1.2 GiB", "1.0") + "; pinned copies reach 5.0 GB/s")) == [0.30]
    # Bounded: four records for this finding of this process, whatever comes next.
    assert due(_finding(0.30, "something else entirely", fix="another fix")) == []
    # Another process has its own; a process forgotten starts again.
    other = ProcessKey(8, 1)
    assert due(_finding(0.30, "x", key=other)) == [0.30]
    notes.forget([TRAIN])
    assert due(_finding(0.30, "x"), _finding(0.30, "x", key=other)) == [0.30]
    assert set(notes.notes) == {(TRAIN, "pageable_h2d"), (other, "pageable_h2d")}


def test_what_is_remembered_of_findings_is_bounded() -> None:
    from memtrace.export.events import FindingNotes

    notes = FindingNotes(max_noted=3)
    for pid in range(10):
        assert len(notes.due([_finding(0.5, "s", key=ProcessKey(pid, 1))])) == 1
    assert [k[0].pid for k in notes.notes] == [7, 8, 9]  # the newest three


def test_a_builds_findings_carry_their_text_and_its_metric_only_their_code() -> None:
    """The finding gauge's only attribute is the code: the summary (live
    figures) and the fix would make a new series at every change."""
    _, batch = rich_build()
    points = [p for x, _ in emitted(batch)["memtrace.finding"] for p in x.data.data_points]
    # The GPU's uncorrectable remapped row is found on the process NVML lists on it.
    codes = ["gpu_memory_uncorrectable", "overhead_budget_exceeded", "pageable_h2d"]
    assert sorted(p.attributes["finding"] for p in points) == codes
    assert all(set(p.attributes) == {"finding"} for p in points)
    assert sorted(f.code for f in batch.findings) == codes
    assert all(f.summary and f.fix for f in batch.findings)


def test_finding_events_reach_an_otlp_collector_once_per_material_change() -> None:
    """Through the real SDK log exporter to an OTLP/HTTP receiver: the
    finding's record (its summary, code, value, fix, process and evidence)
    when it appears, none for pushes that only move its figures."""
    from backends import OtlpLogSink

    from memtrace.export.events import Events

    sink = OtlpLogSink()
    try:
        events = Events(resolve({}, endpoint=sink.endpoint), {"service.name": "memtrace", "host.name": "h"})
        first = _finding(0.30, "30% of H2D bytes (76.8 MiB of 256.0 MiB) came from pageable memory")
        events.findings([first])
        events.findings([_finding(0.35, "35% of H2D bytes (89.6 MiB of 256.0 MiB) came from pageable memory")])
        events.shutdown()  # flushes
    finally:
        sink.stop()
    (r,) = sink.records
    assert r["event_name"] == "memtrace.finding" and r["severity"] == "INFO" and r["body"] == first.summary
    assert r["resource"] == {"service.name": "memtrace", "host.name": "h"}
    assert r["attributes"] == {
        "memtrace.finding": "pageable_h2d",
        "memtrace.value": 0.30,
        "memtrace.fix": "pin it",
        "process.pid": 7,
        "process.creation.time": "2001-09-09T01:46:40.000000000Z",
        "process.executable.name": "train",
        "memtrace.evidence.h2d_bytes": 1,
    }
