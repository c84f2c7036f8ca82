"""bench/targets/fleet_scale.py replays one node's recorded pushes as many
nodes': each request rewritten in place (host name, job, every point's
times). The requests it sends must stay valid OTLP, each node's series its
own, and its points stamped with the time of sending, or the collector and
backend it measures are measured on something else. No BPF, no backend."""

from __future__ import annotations

import sys

from conftest import REPO
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

sys.path.insert(0, str(REPO / "bench" / "targets"))
import fleet_scale as fs  # noqa: E402

HOST = "fleet-4242-h0"


def recorded() -> bytes:
    """A push as an agent on HOST sends it: a counter with two points, a histogram with one."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (
        ("host.name", HOST),
        ("memtrace.job.id", fs.JOB),
        ("process.pid", "1234"),
        ("container.cgroup", f"/memtrace-{HOST}"),
    ):
        rm.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    sm = rm.scope_metrics.add()
    calls = sm.metrics.add(name="gpu.memcpy.calls")
    for direction, n in (("h2d", 7), ("d2h", 9)):
        p = calls.sum.data_points.add(start_time_unix_nano=1_000, time_unix_nano=2_000, as_int=n)
        p.attributes.append(KeyValue(key="direction", value=AnyValue(string_value=direction)))
    calls.sum.is_monotonic = True
    calls.sum.aggregation_temporality = 2
    h = sm.metrics.add(name="gpu.memcpy.duration")
    h.exponential_histogram.data_points.add(start_time_unix_nano=1_000, time_unix_nano=2_000, count=3, scale=2)
    h.exponential_histogram.aggregation_temporality = 2
    return req.SerializeToString()


def test_a_replayed_push_is_the_nodes_own_and_stamped_now() -> None:
    (tpl,) = fs.templates([recorded()])
    now, start = 1_800_000_000_123_456_789, 1_799_999_000_000_000_000
    bodies = {i: fs.as_node(tpl, HOST, i, now, start) for i in (0, 9, 999)}
    names = set()
    for i, body in bodies.items():
        req = ExportMetricsServiceRequest.FromString(body)
        res = {a.key: a.value.string_value for a in req.resource_metrics[0].resource.attributes}
        assert res["host.name"] == fs.node_name(i, HOST) and len(res["host.name"]) == len(HOST)
        assert res["container.cgroup"] == f"/memtrace-{fs.node_name(i, HOST)}"
        assert res["memtrace.job.id"] == fs.job_name(i)
        assert res["process.pid"] == "1234"
        pts = fs.points(req)
        assert [n for n, _ in pts] == ["gpu.memcpy.calls", "gpu.memcpy.calls", "gpu.memcpy.duration"]
        assert {p.time_unix_nano for _, p in pts} == {now}
        assert {p.start_time_unix_nano for _, p in pts} == {start}
        assert [p.as_int for _, p in pts[:2]] == [7, 9] and pts[2][1].count == 3
        names.add(res["host.name"])
    assert len(names) == 3
    # Nodes of one job share its id; the next job's differs.
    assert fs.job_name(0) == fs.job_name(fs.NODES_PER_JOB - 1) != fs.job_name(fs.NODES_PER_JOB)


def test_labels_that_could_grow_without_bound_are_named() -> None:
    req = ExportMetricsServiceRequest.FromString(recorded())
    seen = fs.labels([req])
    assert seen["direction"] == {"h2d", "d2h"}
    flagged = fs.unbounded({**seen, "memtrace.note": {"the loader was slow today"}})
    assert [f.split(":")[0] for f in flagged] == ["memtrace.note", "process.pid"]
    assert fs.unbounded({"memtrace.netns": {"4026531833"}, "direction": {"h2d"}})[0].startswith("memtrace.netns:")
