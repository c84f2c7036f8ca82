"""Timelines: `memtrace run --timeline` (a Perfetto trace, or an HTML page),
the flight recorder of `memtrace push` (a trace on each diagnosis, and on
`memtrace snapshot`), and `memtrace profile`'s timeline.html.

Traces are decoded with Perfetto's own protos (the perfetto package's
perfetto_trace_pb2; its trace_processor needs a binary downloaded at first
use, which this machine cannot fetch), and every slice and counter is
checked against the workload's truth and the JSON summary of the same run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, memtrace_cmd

from memtrace.core.abi import EVENT_DTYPE
from memtrace.core.notices import Events
from memtrace.export.perfetto import encode
from memtrace.export.timeline import Timeline, step_slices
from memtrace.runtime.recorder import Recorder, RecorderOptions

MONOTONIC = 3


# ---- reading a trace back, with Perfetto's protos ----


@dataclass
class Decoded:
    clock: int = 0  # the packets' clock (trace_packet_defaults)
    primary_clock: int = 0
    tracks: dict[int, Any] = field(default_factory=dict)  # uuid -> TrackDescriptor
    slices: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    instants: list[dict[str, Any]] = field(default_factory=list)
    dropped: bool = False

    def thread_of(self, uuid: int) -> tuple[int, int] | None:
        d = self.tracks[uuid]
        return (d.thread.pid, d.thread.tid) if d.HasField("thread") else None

    def counter(self, name: str, pid: int | None = None, group: str | None = None) -> list[tuple[int, float]]:
        """The points of the counter track named `name` (its unit after it), under process `pid` or group."""
        found = []
        for uuid, d in self.tracks.items():
            if not d.HasField("counter") or not d.name.startswith(name + " ("):
                continue
            parent = self.tracks.get(d.parent_uuid)
            is_process = parent is not None and parent.HasField("process")
            if pid is not None and not (is_process and parent.process.pid == pid):
                continue
            if group is not None and not (parent is not None and parent.name == group):
                continue
            found.append(uuid)
        assert len(found) == 1, (name, pid, group, [self.tracks[u].name for u in found])
        return self.counters[found[0]]


def _value(a: Any) -> Any:
    which = a.WhichOneof("value")
    return getattr(a, which) if which else None


def decode(path: Path) -> Decoded:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    out = Decoded()
    open_: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for p in trace.packet:
        if p.HasField("clock_snapshot"):
            out.primary_clock = p.clock_snapshot.primary_trace_clock
        if p.HasField("trace_packet_defaults"):
            out.clock = p.trace_packet_defaults.timestamp_clock_id
        if p.previous_packet_dropped:
            out.dropped = True
        if p.HasField("track_descriptor"):
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        args = {a.name: _value(a) for a in te.debug_annotations}
        if te.type == TrackEvent.TYPE_SLICE_BEGIN:
            frames = [(f.function_name, f.source_file, f.line_number) for f in te.callstack.frames]
            stack = open_[te.track_uuid]
            s = {
                "name": te.name,
                "category": list(te.categories),
                "args": args,
                "ts": p.timestamp,
                "track": te.track_uuid,
                "depth": len(stack),
                "parent": stack[-1] if stack else None,
                "frames": frames,
            }
            stack.append(s)
        elif te.type == TrackEvent.TYPE_SLICE_END:
            s = open_[te.track_uuid].pop()
            s["end"] = p.timestamp
            assert s["end"] >= s["ts"]
            out.slices.append(s)
        elif te.type == TrackEvent.TYPE_COUNTER:
            out.counters[te.track_uuid].append((p.timestamp, te.double_counter_value))
        elif te.type == TrackEvent.TYPE_INSTANT:
            cats = list(te.categories)
            stack = open_[te.track_uuid]  # an instant on a thread track is a zero-length slice there
            out.instants.append(
                {
                    "name": te.name,
                    "category": cats,
                    "args": args,
                    "ts": p.timestamp,
                    "track": te.track_uuid,
                    "depth": len(stack),
                    "parent": stack[-1] if stack else None,
                }
            )
    assert all(not v for v in open_.values()), "a slice was begun and never ended"
    return out


def svg_geometry(br: Any) -> dict[str, float]:
    """The page's timeline as the browser laid it out: its left edge on screen (px), the
    window it draws (t0, t1: ns) and its label column and time axis (px)."""
    return dict(
        json.loads(
            br.eval(
                "(() => {const s = document.getElementById('timeline'); const r = s.getBoundingClientRect();"
                "return JSON.stringify({left: r.left, t0: +s.dataset.startNs, t1: +s.dataset.endNs, "
                "label: +s.dataset.labelPx, width: +s.dataset.widthPx})})()"
            )
        )
    )


# ---- the recorder's bounds (no kernel) ----


def _batch(ts: list[int], pid: int = 100) -> np.ndarray:
    b = np.zeros(len(ts), EVENT_DTYPE)
    b["ts_ns"], b["pid"], b["tid"], b["api"], b["bytes"] = ts, pid, pid, 2, 4096
    return b


def test_the_recorder_drops_the_oldest_batches_first_at_its_memory_bound_and_counts_them() -> None:
    one = _batch([0] * 100).nbytes
    rec = Recorder(RecorderOptions(seconds=math.inf, max_bytes=3 * one))
    now = time.monotonic_ns()
    for k in range(5):
        rec.take([Events(_batch([now + k * 1000 + i for i in range(100)]))])
    assert rec.bytes <= 3 * one and rec.dropped == 200 and rec.held_events() == 300
    with rec._lock:
        firsts = [int(b["ts_ns"][0]) for _, b in rec._events]
    assert firsts == [now + 2000, now + 3000, now + 4000]  # the two oldest went


def test_the_recorder_ages_events_out_but_keeps_those_a_waiting_file_needs() -> None:
    rec = Recorder(RecorderOptions(seconds=1.0, max_bytes=1 << 30, directory=None))
    now = time.monotonic_ns()
    rec.take([Events(_batch([now - 3_000_000_000]))])  # three seconds old: past the one second kept
    assert rec.held_events() == 0 and rec.aged_out == 1
    from memtrace.runtime.recorder import _Pending

    rec._pending.append(_Pending("x", now - 5_000_000_000, now))  # a file wants from five seconds ago
    rec.take([Events(_batch([now - 3_000_000_000]))])
    assert rec.held_events() == 1 and rec.aged_out == 1


def test_the_recorders_directory_keeps_the_newest_traces_under_its_cap(tmp_path: Path) -> None:
    rec = Recorder(RecorderOptions(directory=str(tmp_path), directory_bytes=5000))
    tl = Timeline(events=_batch([1_000, 2_000]), start_ns=0, end_ns=3_000)
    size = len(encode(tl))
    paths = [tmp_path / f"diagnosis-{i}.pftrace" for i in range(5000 // size + 3)]
    for i, p in enumerate(paths):
        rec.write(tl, str(p))
        os.utime(p, ns=(i * 10**9, i * 10**9))  # written one after another
    left = sorted(tmp_path.glob("*.pftrace"))
    assert sum(p.stat().st_size for p in left) <= 5000
    assert left == sorted(paths[-len(left) :]) and paths[-1] in left  # the oldest went first


def test_a_counter_track_says_what_its_latest_reading_is_once_launches_are_sampled() -> None:
    """A process's launch counter began counted and the budget sampled it
    later: the track is marked estimated (its latest reading's note), not
    left saying counted."""
    from memtrace.runtime.recorder import Reading

    rec = Recorder(RecorderOptions(seconds=math.inf, max_bytes=1 << 20))
    rec._point(Reading("launches", "launch rate", "1/s", 10.0, 7, False, "counted"), 1_000)
    rec._point(Reading("launches", "launch rate", "1/s", 12.0, 7, False, "estimated: sampled at 20%"), 2_000)
    (s,) = rec._series.values()
    assert s.track.note == "estimated: sampled at 20%" and list(s.points) == [(1_000, 10.0), (2_000, 12.0)]


def test_steps_of_a_loop_tile_its_waits_and_carry_the_trackers_breakdown() -> None:
    """A synthetic loop: each step's copies and wait nest in the slice the
    replayed tracker closes, which ends at the wait's return; its breakdown adds up to it."""
    rows, t, ends = [], 10**9, []
    for _ in range(30):
        for _ in range(3):
            rows.append((t, 1000, 4096, 2))
            t += 2000
        rows.append((t, 40_000, 0, 80))  # cudaStreamSynchronize
        t += 40_000
        ends.append(t)
        t += 100_000
    b = np.zeros(len(rows), EVENT_DTYPE)
    b["ts_ns"], b["duration_ns"], b["bytes"], b["api"] = zip(*rows, strict=True)
    b["pid"] = b["tid"] = 7
    b["direction"] = 1
    b["stream"] = 5
    steps = step_slices(b, {7: 7})
    assert [(s.start_ns, s.end_ns) for s in steps] == list(zip(ends[:-1], ends[1:], strict=True))
    for s in steps:
        if s.breakdown is not None:
            assert s.breakdown["copy"] == 3000 and s.breakdown["sync_wait"] == 40_000
            parts = s.breakdown["copy"] + s.breakdown["sync_wait"] + s.breakdown["host"]
            assert parts == s.end_ns - s.start_ns
    assert sum(s.breakdown is not None for s in steps) >= len(steps) - 8  # those found late have no breakdown


# ---- memtrace run --timeline, against the workload's truth and its summary ----


def _nvml_env(fakenvml: Path, tmp: Path) -> dict[str, str]:
    from test_nvml import HEALTHY, gpu, script

    path = tmp / "nvml.script"
    path.write_text(script(count=1, **gpu(0, uuid="GPU-timeline", **HEALTHY, clock_sm=1755, clock_mem=2619)))
    return {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(path)}


def _run(fakecuda: Path, tmp: Path, out: str, extra_env: dict[str, str], *flags: str) -> tuple[dict, dict]:
    truth = tmp / "truth.jsonl"
    summary = tmp / "summary.json"
    argv = [sys.executable, str(FIXTURES / "timeline_loop.py"), str(fakecuda / "lib"), "--steps", "60"]
    # The budget off: every launch probed, so each is a slice (a sampled process's are its
    # estimated counter alone: tests/test_timeline_launches.py), whatever this VM's trap costs.
    cmd = [*memtrace_cmd(), "run", "--format", "json", "-o", str(summary), "--overhead-budget", "off"]
    p = subprocess.run(
        [*cmd, *flags, "--timeline", out, "--", *argv],
        env=dict(os.environ, WORKLOAD_TRUTH=str(truth), **extra_env),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr
    (line,) = truth.read_text().splitlines()
    return json.loads(summary.read_text()), json.loads(line)


@pytest.fixture(scope="module")
def traced_loop(fakecuda: Path, fakenvml: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Decoded]:
    tmp = tmp_path_factory.mktemp("timeline")
    doc, truth = _run(fakecuda, tmp, str(tmp / "run.pftrace"), _nvml_env(fakenvml, tmp), "--stacks")
    return doc, truth, decode(tmp / "run.pftrace")


@pytest.mark.bpf
def test_run_timeline_has_one_slice_per_copy_in_order_with_its_bytes_nested_in_its_step(
    traced_loop: tuple[dict, dict, Decoded],
) -> None:
    doc, truth, tr = traced_loop
    assert tr.clock == MONOTONIC and tr.primary_clock == MONOTONIC  # one clock, said
    pid, tid = truth["pid"], truth["tid"]
    mine = [s for s in tr.slices if tr.thread_of(s["track"]) == (pid, tid)]
    copies = sorted((s for s in mine if s["category"] == ["copy"]), key=lambda s: s["ts"])
    want = truth["copies"]
    assert len(copies) == len(want)
    got = [(s["args"]["api"], s["args"]["direction"], s["args"]["bytes"], s["args"]["host_memory"]) for s in copies]
    assert got == [(c["api"], c["direction"], c["bytes"], c["host_memory"]) for c in want]
    # Nesting: a step slice holds exactly one step's copies, steps in order; the first step's
    # copies come before the first wait, which begins the first step memtrace can see.
    steps = sorted((s for s in mine if s["category"] == ["step"]), key=lambda s: s["ts"])
    (row,) = [r for r in doc["steps"] if r["pid"] == pid]
    assert len(steps) == row["steps"] == truth["steps"] - 1
    for s, c in zip(copies, want, strict=True):
        if c["step"] == 0:
            assert s["parent"] is None
        else:
            assert s["parent"] is steps[c["step"] - 1] and s["depth"] == 1, (s, c)
    for s in steps:
        assert s["depth"] == 0
    # Each step ends where its wait returns, and the wait is in it.
    waits = sorted((s for s in mine if s["category"] == ["wait"]), key=lambda s: s["ts"])
    assert len(waits) == truth["steps"] and all(w["name"] == "cudaStreamSynchronize" for w in waits)
    assert [s["end"] for s in steps] == [w["end"] for w in waits[1:]]
    assert [s["ts"] for s in steps] == [w["end"] for w in waits[:-1]]
    # The allocations, and the call site of each copy (--stacks): the fixture's own lines.
    allocs = [s for s in mine if s["category"] == ["memory"]]
    assert sorted(s["name"] for s in allocs) == ["device_alloc", "host_alloc"]
    assert all(any(f[1].endswith("timeline_loop.py") for f in s["frames"]) for s in copies)


@pytest.mark.bpf
def test_run_timeline_has_one_launch_slice_per_launch_timed_inside_the_call_on_its_stream_nested_in_its_step(
    traced_loop: tuple[dict, dict, Decoded],
) -> None:
    """Launches were all probed (the budget off): each is a
    slice on its thread from the driver launch's entry to its return (the
    return probe `run --timeline` adds), with its API, stream and function;
    their number is the workload's own count and the kernel's; among the
    thread's copies and waits they come in the order the loop made them,
    each inside its step and inside no call; and each lies between the
    clock readings the workload took just before and just after its call.
    cuLaunchKernelEx's stream is the one in its CUlaunchConfig."""
    doc, truth, tr = traced_loop
    pid, tid = truth["pid"], truth["tid"]
    want = truth["launch_calls"]
    launches = sorted((s for s in tr.slices if s["category"] == ["launch"]), key=lambda s: s["ts"])
    assert not [i for i in tr.instants if i["category"] == ["launch"]]  # slices, not instants
    assert all(tr.thread_of(s["track"]) == (pid, tid) for s in launches)
    assert len(launches) == len(want) == truth["launches"], (doc["launches"], doc["agent"])
    assert len(launches) == sum(r["launches"] for r in doc["launches"] if r["pid"] == pid)
    # Every record queued became a slice, and none was lost to a full ring (the JSON would say so).
    assert (doc["agent"]["launch_events"], doc["agent"]["launch_events_dropped"]) == (len(launches), 0)
    rows = [r for r in doc["launches"] if r["pid"] == pid]
    assert rows and all(r["estimated"] is False for r in rows)  # counted, not sampled: slices
    assert {w["api"] for w in want} == {"cuLaunchKernel", "cuLaunchKernelEx"}
    for s, w in zip(launches, want, strict=True):
        assert s["name"] == "kernel launch" and s["args"]["api"] == w["api"], (s, w)
        assert (s["args"]["stream"], s["args"]["function"]) == (w["stream"], w["function"]), (s, w)
        assert "error" not in s["args"]
        # The host-side time of the launch: inside the workload's own readings around its call.
        assert w["before"] <= s["ts"] < s["end"] <= w["after"], (s, w)
    # Order: the thread's copies, launches and waits by time are the loop's own sequence.
    mine = [s for s in tr.slices if tr.thread_of(s["track"]) == (pid, tid) and s["category"] in (["copy"], ["wait"])]
    calls = [(s["ts"], s["args"].get("direction", "wait"), s) for s in mine] + [
        (s["ts"], "launch", s) for s in launches
    ]
    calls.sort(key=lambda c: c[0])
    assert [c[1] for c in calls] == truth["sequence"]
    # No two of them overlap: a launch is inside no call, and no call inside a launch.
    for (_, _, a), (_, _, b) in zip(calls, calls[1:], strict=False):
        assert a["end"] <= b["ts"], (a, b)
    # Nesting: a launch made after the loop's k-th wait is in step k, whose slice is
    # steps[k - 1] (the first step, before any wait, has none).
    steps = sorted(
        (s for s in tr.slices if s["category"] == ["step"] and tr.thread_of(s["track"]) == (pid, tid)),
        key=lambda s: s["ts"],
    )
    waits = 0
    for _, what, s in calls:
        if what == "wait":
            waits += 1
        elif what == "launch" and waits == 0:
            assert s["parent"] is None and s["depth"] == 0, s
        elif what == "launch":
            assert s["parent"] is steps[waits - 1] and s["depth"] == 1, s
            assert steps[waits - 1]["ts"] <= s["ts"] and s["end"] <= steps[waits - 1]["end"]


@pytest.mark.bpf
def test_every_counter_track_matches_the_json_summary_of_the_same_run(traced_loop: tuple[dict, dict, Decoded]) -> None:
    doc, truth, tr = traced_loop
    pid = truth["pid"]
    checked = set()

    def last(name: str, **where: Any) -> float:
        checked.add(name)
        pts = tr.counter(name, **where)
        assert [t for t, _ in pts] == sorted(t for t, _ in pts)
        return pts[-1][1]

    (cpu,) = [r for r in doc["host"]["cpu"] if r["pid"] == pid]
    assert last("run queue", pid=pid) == cpu["run_queue_seconds"]
    assert last("off CPU", pid=pid) == cpu["off_cpu_seconds"]
    assert last("on CPU", pid=pid) == cpu["on_cpu_seconds"]
    assert last("run queue share", pid=pid) == cpu["run_queue_share"]
    launches = sum(r["launches"] for r in doc["launches"] if r["pid"] == pid)
    assert last("launches", pid=pid) == launches == truth["launches"]
    rate = tr.counter("launch rate", pid=pid)
    total = tr.counter("launches", pid=pid)
    checked.add("launch rate")
    for (t, v), (t0, n0), (t1, n1) in zip(rate, total, total[1:], strict=False):
        assert t == t1 and v == pytest.approx((n1 - n0) / ((t1 - t0) / 1e9))
    (steps,) = [r for r in doc["steps"] if r["pid"] == pid]
    assert last("steps", pid=pid) == steps["steps"]
    times = tr.counter("step time", pid=pid)
    checked.add("step time")
    q = steps["duration_seconds"]
    assert times and all(q["p50"] / 4 < v < q["max"] * 2 for _, v in times)
    (g,) = doc["host"]["gpus"]
    group = f"GPU {g['index']} ({g['uuid']})"
    for name, key in (
        ("SM utilisation", "sm_utilization_percent"),
        ("memory utilisation", "memory_utilization_percent"),
    ):
        pts = tr.counter(name, group=group)
        checked.add(name)
        assert pts and all(0 <= v <= g[key]["max"] for _, v in pts)
    for name, key, mhz in (("SM clock", "sm_clock_mhz", 1755), ("memory clock", "memory_clock_mhz", 2619)):
        pts = tr.counter(name, group=group)
        checked.add(name)
        assert pts and {v for _, v in pts} == {g[key]["mean"]} == {g[key]["max"]} == {mhz}
    assert all(v == 0 for _, v in tr.counter("throttled", group=group)) and g["throttled_share"] == 0
    assert all(v == 0 for _, v in tr.counter("clock event reasons", group=group)) and g["clock_event_reasons"] == []
    assert all(v == 0 for _, v in tr.counter("lost", group=group)) and g["lost_samples"] == 0
    assert last("PCIe link width", group=group) == g["pcie_link"]["width"]
    temps = tr.counter("temperature", group=group)
    assert temps and max(v for _, v in temps) <= g["temperature_celsius"]["max"]
    checked |= {"throttled", "clock event reasons", "lost", "temperature"}
    for i in doc["host"]["network"]["interfaces"]:
        nic = f"NIC {i['interface']} (netns {i['netns']})"
        assert last("rx", group=nic) == i["rx_bytes"]
        assert last("tx", group=nic) == i["tx_bytes"]
        assert last("drops", group=nic) == i["rx_dropped"] + i["tx_dropped"]
    for q in doc["host"]["network"]["qdiscs"]:
        nic = f"NIC {q['interface']} (netns {q['netns']})"
        name = f"qdisc {q['kind']} {q['handle']}"
        assert last(f"{name} backlog", group=nic) == q["backlog_bytes"]
        assert last(f"{name} drops", group=nic) == q["drops"]
    # Every counter track in the file was checked against the summary (or against another track).
    names = {d.name.split(" (")[0] for d in tr.tracks.values() if d.HasField("counter")}
    assert names <= checked | {"memory limit hits"}, names - checked


@pytest.mark.bpf
@pytest.mark.e2e
def test_the_html_timeline_draws_each_step_copy_and_wait_in_a_real_browser(fakecuda: Path, tmp_path: Path) -> None:
    """run --timeline x.html, opened in headless Chromium: no script error;
    each lane holds as many calls as the truth made, each drawn where its
    time says; a point in the middle of a step's rectangle hits it (it is
    drawn there, on top). Saves a screenshot (tmp_path)."""
    from browser import Browser

    out = tmp_path / "timeline.html"
    doc, truth = _run(fakecuda, tmp_path, str(out), {}, "--no-host")
    text = out.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    pid = truth["pid"]
    with Browser(width=1500, height=900) as b:
        b.open(out)
        assert b.exceptions == []
        lanes = json.loads(
            b.eval(
                "JSON.stringify([...document.querySelectorAll('g.lane')].map(g => ({lane: g.dataset.lane, "
                "pid: +g.dataset.pid, calls: +g.dataset.calls, bytes: +g.dataset.bytes, stream: g.dataset.stream, "
                "mode: g.dataset.mode, rects: [...g.querySelectorAll"
                "('rect')].map(r => ({n: +r.dataset.n, b: +r.dataset.beginNs, e: +r.dataset.endNs, "
                "x: r.getBoundingClientRect().left, w: r.getBoundingClientRect().width, "
                "y: r.getBoundingClientRect().top, h: r.getBoundingClientRect().height}))})))"
            )
        )
        svg = svg_geometry(b)
        by = {(l["pid"], l["lane"]): l for l in lanes}
        h2d = [c for c in truth["copies"] if c["direction"] == "h2d"]
        assert by[(pid, "h2d")]["calls"] == len(h2d) and by[(pid, "h2d")]["bytes"] == sum(c["bytes"] for c in h2d)
        assert by[(pid, "d2h")]["calls"] == truth["steps"]
        assert by[(pid, "waits")]["calls"] == truth["steps"]
        assert by[(pid, "steps")]["calls"] == truth["steps"] - 1 == len(by[(pid, "steps")]["rects"])
        for lane in by.values():
            assert sum(r["n"] for r in lane["rects"]) == lane["calls"]
        # A launch lane per stream (the workload's own streams, cuLaunchKernelEx's from its config), each
        # launch a slice (few of them), every slice drawn where one of that stream's calls was made.
        launch_lanes = {int(l["stream"]): l for l in lanes if l["pid"] == pid and l.get("stream") is not None}
        want: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for w in truth["launch_calls"]:
            want[w["stream"]].append(w)
        assert {k: v["calls"] for k, v in launch_lanes.items()} == {k: len(v) for k, v in want.items()}, doc["launches"]
        assert len(want) == 4 and all(v["mode"] == "slices" for v in launch_lanes.values())
        for stream, ln in launch_lanes.items():
            assert ln["lane"] == f"launches {stream:#x}"
            for r in ln["rects"]:
                assert any(w["before"] <= r["b"] <= w["after"] for w in want[stream]), (stream, r)
        scale = svg["width"] / (svg["t1"] - svg["t0"])
        for lane in by.values():
            for r in lane["rects"]:
                assert abs(r["x"] - (svg["left"] + svg["label"] + (r["b"] - svg["t0"]) * scale)) <= 1.0, r
                assert r["w"] >= max((r["e"] - r["b"]) * scale, 1.0) - 1.01, r  # a hairline between steps
        for r in by[(pid, "steps")]["rects"]:
            hit = b.eval(
                f"(() => {{const e = document.elementFromPoint({r['x'] + r['w'] / 2}, {r['y'] + r['h'] / 2});"
                f"return e && e.dataset.beginNs}})()"
            )
            assert hit is not None and int(hit) == r["b"]
        b.screenshot(tmp_path / "timeline.png")
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["steps"][0]["steps"] == truth["steps"] - 1


@pytest.mark.e2e
def test_the_html_timeline_draws_a_sampled_processs_estimated_launch_rate_in_a_real_browser(tmp_path: Path) -> None:
    """A process whose launches the overhead budget sampled has slices only for those probed:
    its launch rate counter (estimated) is a lane of its own, a bar per interval as high as its
    rate against the highest, where its time says, saying the duty; a process whose launches
    were all counted has none (its slices say it all)."""
    from browser import Browser

    from memtrace.export.timeline import CounterTrack
    from memtrace.export.timeline_html import render

    t0, span = 10**12, 2 * 10**9
    rates = [0.0, 40_000.0, 40_000.0, 10_000.0, 0.0, 5_000.0, 5_000.0, 20_000.0, 20_000.0]
    edges = [t0 + k * span // (len(rates) - 1) for k in range(len(rates))]
    sampled = CounterTrack("launches", "launch rate", "1/s", list(zip(edges, rates, strict=True)), pid=42)
    sampled.note = "estimated: sampled by the overhead budget at 12%"
    counted = CounterTrack("launches", "launch rate", "1/s", list(zip(edges, rates, strict=True)), pid=43)
    counted.note = "counted"
    b = np.zeros(2, EVENT_DTYPE)  # one wait each, so that both processes have a track
    b["ts_ns"], b["duration_ns"], b["pid"], b["tid"] = [t0 + 10, t0 + 20], 1000, [42, 43], [42, 43]
    b["api"] = 90  # cuStreamSynchronize
    tl = Timeline(events=b, processes={42: "sampled", 43: "counted"}, counters=[sampled, counted])
    tl.start_ns, tl.end_ns = t0, t0 + span
    out = tmp_path / "estimated.html"
    out.write_text(render(tl))
    with Browser(width=1500, height=400) as br:
        br.open(out)
        assert br.exceptions == []
        lanes = json.loads(
            br.eval(
                "JSON.stringify([...document.querySelectorAll('g.lane')].map(g => ({lane: g.dataset.lane, "
                "pid: +g.dataset.pid, note: g.dataset.note || '', "
                "rects: [...g.querySelectorAll('rect')].map(r => ({b: +r.dataset.beginNs, e: +r.dataset.endNs, "
                "rate: +r.dataset.rate, x: r.getBoundingClientRect().left, w: r.getBoundingClientRect().width, "
                "h: r.getBoundingClientRect().height}))})))"
            )
        )
        svg = svg_geometry(br)
    (est,) = [ln for ln in lanes if ln["lane"] == "launch rate (estimated)"]
    assert est["pid"] == 42 and "12%" in est["note"]
    want = [(a, b, r) for a, b, r in zip(edges[:-1], edges[1:], rates[1:], strict=True) if r > 0]
    assert [(r["b"], r["e"], r["rate"]) for r in est["rects"]] == want
    full = max(r["h"] for r in est["rects"])
    for r in est["rects"]:
        assert abs(r["h"] - full * r["rate"] / max(rates)) <= 1.0  # as high as its rate, to a pixel
        x0 = svg["left"] + svg["label"] + (r["b"] - t0) / span * svg["width"]
        assert abs(r["x"] - x0) <= 1.0 and abs(r["w"] - (r["e"] - r["b"]) / span * svg["width"]) <= 1.0


def test_the_html_timeline_draws_a_busy_streams_launches_as_their_rate_in_a_real_browser(tmp_path: Path) -> None:
    """A stream with more launches than the page draws one by one is drawn
    as its rate: each bar holds the launches begun in its time, as high as
    their number against the lane's busiest bar, where its time says; a
    quiet stream keeps its slices. Saves a screenshot (tmp_path)."""
    from browser import Browser

    from memtrace.export.timeline_html import LAUNCH_SLICES, render

    t0, span = 10**12, 2 * 10**9
    rng = np.random.default_rng(3)
    # Stream 0x10: a burst at 40k/s for the first quarter, then 5k/s; stream 0x20: a few launches.
    busy = np.sort(np.concatenate([rng.uniform(0, span / 4, 20_000), rng.uniform(span / 4, span, 7_500)]))
    quiet = np.sort(rng.uniform(0, span, LAUNCH_SLICES // 4))
    ts = np.concatenate([busy, quiet]).astype(np.int64) + t0
    b = np.zeros(len(ts), EVENT_DTYPE)
    b["ts_ns"], b["duration_ns"], b["api"], b["pid"], b["tid"] = ts, 3000, 100, 42, 42  # cuLaunchKernel
    b["stream"] = [0x10] * len(busy) + [0x20] * len(quiet)
    order = np.argsort(b["ts_ns"], kind="stable")
    tl = Timeline(events=b[order], processes={42: "launcher"}, start_ns=t0, end_ns=t0 + span)
    out = tmp_path / "launches.html"
    out.write_text(render(tl))
    with Browser(width=1500, height=400) as br:
        br.open(out)
        assert br.exceptions == []
        lanes = json.loads(
            br.eval(
                "JSON.stringify([...document.querySelectorAll('g.lane')].map(g => ({lane: g.dataset.lane, "
                "stream: +g.dataset.stream, mode: g.dataset.mode, calls: +g.dataset.calls, peak: +g.dataset.peak, "
                "rects: [...g.querySelectorAll('rect')].map(r => ({n: +r.dataset.n, b: +r.dataset.beginNs, "
                "e: +r.dataset.endNs, x: r.getBoundingClientRect().left, w: r.getBoundingClientRect().width, "
                "h: r.getBoundingClientRect().height, bottom: r.getBoundingClientRect().bottom}))})))"
            )
        )
        svg = svg_geometry(br)
        br.screenshot(tmp_path / "launches.png")
    by = {ln["stream"]: ln for ln in lanes}
    assert set(by) == {0x10, 0x20}
    rate, few = by[0x10], by[0x20]
    assert (rate["mode"], few["mode"]) == ("rate", "slices")
    assert rate["calls"] == len(busy) and few["calls"] == len(quiet) == sum(r["n"] for r in few["rects"])
    # Each bar: the launches begun in its time, exactly; drawn at its time; as high as its share of the peak.
    begun = np.sort(b["ts_ns"][b["stream"] == 0x10].astype(np.int64))
    assert sum(r["n"] for r in rate["rects"]) == len(busy)
    scale = svg["width"] / span
    full = max(r["h"] for r in rate["rects"])
    assert rate["peak"] == max(r["n"] for r in rate["rects"])
    for r in rate["rects"]:
        inside = np.searchsorted(begun, r["e"]) - np.searchsorted(begun, r["b"])
        assert r["n"] == inside, r
        assert abs(r["x"] - (svg["left"] + svg["label"] + (r["b"] - t0) * scale)) <= 1.0, r
        assert r["h"] == pytest.approx(max(full * r["n"] / rate["peak"], 1.0), abs=0.6), r
    assert len({r["bottom"] for r in rate["rects"]}) == 1  # bars stand on one baseline
    # The burst reads as the burst: the first quarter's bars are taller than the rest's.
    first = [r["h"] for r in rate["rects"] if r["b"] < t0 + span // 4 - span // 100]
    rest = [r["h"] for r in rate["rects"] if r["b"] > t0 + span // 4 + span // 100]
    assert min(first) > max(rest)
    assert (tmp_path / "launches.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the flight recorder in push: a diagnosis's window, and a snapshot on demand ----


@pytest.mark.bpf
@pytest.mark.slow
def test_push_writes_each_diagnosis_window_with_its_onset_the_fault_and_the_slowdown_and_names_the_file(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    """`memtrace push` host-wide, its recorder on (the default): a job whose
    GPU throttles part-way (the test NVML says so, the kernels slow down).
    The diagnosis's OTLP event names a file; that file, written after the
    detection, holds the baseline before the onset, the onset, the fault's
    signal (the GPU's throttled counter rising) and the slower steps. Then
    `memtrace snapshot` writes the last seconds on demand."""
    from backends import OtlpLogSink
    from test_diagnosis_traced import CPU, FAULT_AT, SECONDS, nvml, replace_file, wait_for_job
    from test_push import start_push, stop_push, wait_for

    class Sink(OtlpLogSink):
        """The diagnosis events; the metrics pushes to the same port are answered and dropped."""

        def take(self, path: str, body: bytes) -> bytes:
            return super().take(path, body) if path.endswith("/v1/logs") else b""

    sink = Sink()
    rdir, script, control = tmp_path / "recorder", tmp_path / "nvml.script", tmp_path / "control"
    script.write_text(nvml())
    control.write_text("gpu=1 loader=1\n")
    push = start_push(
        ["--endpoint", sink.endpoint, "--interval", "1", "--recorder-dir", str(rdir)],
        env={"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(script)},
    )
    try:
        job = subprocess.Popen(
            ["taskset", "-c", CPU, str(fakecuda / "trainjob"), "-t", str(SECONDS), "-L", "3000000", "-w", "1500000"],
            env={"TRAINJOB_CONTROL": str(control), "WORKLOAD_TRUTH": "/dev/null"},
        )
        wait_for_job(job.pid)
        time.sleep(FAULT_AT)
        fault = time.monotonic_ns()
        replace_file(script, nvml(reasons=0x20 | 0x40, temp=92))
        control.write_text("gpu=2.5 loader=1\n")
        assert job.wait(timeout=SECONDS * 4 + 60) == 0

        def throttled() -> list[dict[str, Any]]:
            return [
                r
                for r in sink.records
                if r["event_name"] == "memtrace.diagnosis"
                and r["attributes"]["process.pid"] == job.pid
                and r["attributes"]["memtrace.cause"] == "gpu_throttling"
            ]

        assert wait_for(lambda: bool(throttled()), True, timeout=30), [r["attributes"] for r in sink.records]
        path = Path(throttled()[0]["attributes"]["memtrace.timeline.file"])
        assert path.parent == rdir
        assert wait_for(path.exists, True, timeout=40), sorted(os.listdir(rdir))

        snap = subprocess.run(
            [*memtrace_cmd(), "snapshot", "--recorder-dir", str(rdir)], capture_output=True, text=True, timeout=90
        )
        assert snap.returncode == 0, snap.stderr
        snapshot = decode(Path(snap.stdout.strip()))
        rc, _, log = stop_push(push)
        assert rc == 0, log
    finally:
        if push.poll() is None:
            push.kill()
        sink.stop()
    assert not (rdir / "agent.pid").exists()

    tr = decode(path)
    assert tr.clock == MONOTONIC
    proc = next(u for u, d in tr.tracks.items() if d.HasField("process") and d.process.pid == job.pid)
    assert tr.tracks[proc].process.process_name == "trainjob"
    (diag,) = [i for i in tr.instants if i["category"] == ["diagnosis"] and i["track"] == proc]
    assert diag["args"]["cause"] == "gpu_throttling" and diag["args"]["fix"]
    assert "hw_thermal_slowdown" in json.loads(diag["args"]["evidence"])["clock_event_reasons"]
    (onset,) = [i for i in tr.instants if i["category"] == ["onset"] and i["track"] == proc]
    # The onset is the first slow window's start (windows of 0.5 s), at or after the fault's.
    assert fault - 600_000_000 <= onset["ts"] <= diag["ts"] and onset["ts"] == diag["args"]["onset_ns"]
    # The fault's signal: the GPU reads throttled from the fault on, not before.
    (gpu,) = {d.name for d in tr.tracks.values() if d.name.startswith("GPU 0")}
    flags = tr.counter("throttled", group=gpu)
    assert [v for t, v in flags if t < fault] and all(v == 0 for t, v in flags if t < fault)
    assert all(v == 1 for t, v in flags if t > fault + 1_500_000_000)
    # The slowdown: the job's steps before the fault and after it, from the file's own slices.
    job_threads = {u for u, d in tr.tracks.items() if d.HasField("thread") and d.thread.pid == job.pid}
    steps = [s for s in tr.slices if s["category"] == ["step"] and s["track"] in job_threads]
    before = [s["end"] - s["ts"] for s in steps if s["end"] < fault]
    after = [s["end"] - s["ts"] for s in steps if s["ts"] > fault + 1_000_000_000]
    assert len(before) >= 5 and len(after) >= 5
    assert sorted(after)[len(after) // 2] > 1.3 * sorted(before)[len(before) // 2]
    step_time = tr.counter("step time", pid=job.pid)
    assert max(v for t, v in step_time if t > fault + 1_000_000_000) > 1.3 * min(v for t, v in step_time if t < fault)
    # The window: from before the baseline (the job's first copies) to past the detection.
    copies = [s for s in tr.slices if s["category"] == ["copy"] and s["track"] in job_threads]
    assert min(s["ts"] for s in copies) < fault - 3_000_000_000 and max(s["ts"] for s in copies) > diag["ts"]
    # The snapshot holds the job's copies too (its last seconds, within the recorder's 30).
    snap_threads = {u for u, d in snapshot.tracks.items() if d.HasField("thread") and d.thread.pid == job.pid}
    assert any(s["category"] == ["copy"] and s["track"] in snap_threads for s in snapshot.slices)
