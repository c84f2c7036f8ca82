"""A timeline (export/timeline.py) as a Perfetto trace: the protobuf format
ui.perfetto.dev and trace_processor read, written with the `perfetto`
package's protos (no binary needed).

Tracks: a process track per process and a thread track per thread, named
as `top` names them (their comm); on a thread, its calls as slices
(copies, waits, memory calls, collectives), nested in the steps of its
loop; counter tracks under each process (its launch rate, run queue
share, off-CPU time, ...), under each GPU and NIC, and for the host; each
diagnosis, its onset and each finding as instants on the process's track.

One clock: the trace's packets are stamped with CLOCK_MONOTONIC
(`trace_packet_defaults.timestamp_clock_id`), and a clock snapshot ties
it to CLOCK_REALTIME and CLOCK_BOOTTIME, so the UI shows wall-clock time
too. MONOTONIC is the trace's primary clock.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from memtrace.core.abi import Direction, Family
from memtrace.core.apis import api_name
from memtrace.core.enums import HostMemory
from memtrace.core.nccl import Collective
from memtrace.core.stacks import NativeFrame, PythonFrame
from memtrace.export.timeline import FAMILY, MEM_OP, Timeline

MONOTONIC, REALTIME, BOOTTIME = 3, 1, 6  # perfetto's BuiltinClock
SEQUENCE = 1  # every packet is on one sequence: its defaults (the clock) hold for all
_END, _BEGIN, _POINT = 0, 1, 2
_CALL, _COLL, _STEP = 0, 1, 2
_SHIFT = 40  # a slice's reference: kind << _SHIFT | index

CATEGORY = {int(Family.COPY): "copy", int(Family.MEM): "memory", int(Family.SYNC): "wait"}


def _uuid(*parts: int) -> int:
    """A stable track uuid (tracks are named by what they show, so a reader can diff two traces)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & (2**64 - 1))) * 1099511628211) % 2**63
    return h or 1


def _annotate(te: Any, name: str, value: Any) -> None:
    d = te.debug_annotations.add()
    d.name = name
    if isinstance(value, bool):
        d.bool_value = value
    elif isinstance(value, int):
        if value >= 0:
            d.uint_value = value
        else:
            d.int_value = value
    elif isinstance(value, float):
        d.double_value = value
    elif isinstance(value, str):
        d.string_value = value
    else:
        d.string_value = json.dumps(value, sort_keys=True, default=str)


def _frames(te: Any, frames: tuple[Any, ...]) -> None:
    """The call site, outermost frame first (as Perfetto's callstack is read)."""
    cs = te.callstack
    for f in reversed(frames):
        fr = cs.frames.add()
        if isinstance(f, PythonFrame):
            fr.function_name = f.function
            fr.source_file = f.file
            if f.line is not None:
                fr.line_number = f.line
        elif isinstance(f, NativeFrame):
            fr.function_name = f.function or f"{f.module}+{f.offset:#x}"
            fr.source_file = f.module


def encode(tl: Timeline) -> bytes:
    """The trace file's bytes."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    add = trace.packet.add

    snap = add()
    snap.trusted_packet_sequence_id = SEQUENCE
    at = tl.end_ns or tl.start_ns
    for clock, stamp in ((MONOTONIC, at), (REALTIME, at + tl.wall_offset_ns), (BOOTTIME, at + tl.boot_offset_ns)):
        c = snap.clock_snapshot.clocks.add()
        c.clock_id = clock
        c.timestamp = stamp
    snap.clock_snapshot.primary_trace_clock = MONOTONIC
    first = add()
    first.trusted_packet_sequence_id = SEQUENCE
    first.sequence_flags = 1  # SEQ_INCREMENTAL_STATE_CLEARED: the defaults below hold from here
    first.trace_packet_defaults.timestamp_clock_id = MONOTONIC
    if tl.dropped_events:
        first.previous_packet_dropped = 1  # the recorder dropped events before this window

    ev, coll = tl.events, tl.collectives
    calls = tl.calls()
    nbytes = tl.call_bytes()

    # ---- tracks ----
    pids = set(tl.processes) | set(ev["pid"][calls].tolist()) | set(coll["pid"].tolist())
    pids |= {s.pid for s in tl.steps} | {c.pid for c in tl.counters if c.pid is not None}
    pids |= {i.pid for i in tl.instants if i.pid is not None}
    threads = set(zip(ev["pid"][calls].tolist(), ev["tid"][calls].tolist(), strict=True))
    threads |= set(zip(coll["pid"].tolist(), coll["tid"].tolist(), strict=True))
    threads |= {(s.pid, s.tid) for s in tl.steps} | set(tl.threads)

    def descriptor() -> Any:
        p = add()
        p.trusted_packet_sequence_id = SEQUENCE
        return p.track_descriptor

    proc_track: dict[int, int] = {}
    for pid in sorted(pids):
        d = descriptor()
        d.uuid = proc_track[pid] = _uuid(1, pid)
        d.process.pid = pid
        name = tl.processes.get(pid, "")
        if name:
            d.process.process_name = name
    thread_track: dict[tuple[int, int], int] = {}
    for pid, tid in sorted(threads):
        d = descriptor()
        d.uuid = thread_track[(pid, tid)] = _uuid(2, pid, tid)
        d.parent_uuid = proc_track[pid]
        d.thread.pid = pid
        d.thread.tid = tid
        name = tl.threads.get((pid, tid)) or (tl.processes.get(pid, "") if pid == tid else "")
        if name:
            d.thread.thread_name = name
    groups: dict[str, int] = {}
    counter_track: list[int] = []
    for i, c in enumerate(tl.counters):
        if c.pid is None and c.group not in groups:
            d = descriptor()
            d.uuid = groups[c.group] = _uuid(3, *c.group.encode())
            d.name = c.group
        d = descriptor()
        parent = proc_track[c.pid] if c.pid is not None else groups[c.group]
        d.uuid = _uuid(4, parent, i)
        d.parent_uuid = parent
        d.name = f"{c.name} ({c.unit})" + (f" [{c.note}]" if c.note else "")
        d.counter.unit_name = c.unit
        counter_track.append(d.uuid)
    host_track = 0
    if any(i.pid is None or i.pid not in proc_track for i in tl.instants):
        d = descriptor()
        d.uuid = host_track = _uuid(5)
        d.name = "memtrace"

    # ---- what is drawn, in time order ----
    # Slices: per slice (kind, index) its begin and end; at one instant a
    # track's ends come before its begins, inner ends first, outer begins
    # first (a step ends where its last wait returns).
    c_ts = ev["ts_ns"][calls].astype(np.int64)
    c_end = c_ts + ev["duration_ns"][calls].astype(np.int64)
    k_ts = coll["ts_ns"].astype(np.int64)
    k_end = k_ts + coll["duration_ns"].astype(np.int64)
    s_ts = np.array([s.start_ns for s in tl.steps], np.int64)
    s_end = np.array([s.end_ns for s in tl.steps], np.int64)
    begin = np.concatenate([c_ts, k_ts, s_ts])
    end = np.concatenate([c_end, k_end, s_end])
    kind = np.concatenate(
        [np.full(len(c_ts), _CALL, np.int64), np.full(len(k_ts), _COLL, np.int64), np.full(len(s_ts), _STEP, np.int64)]
    )
    index = np.concatenate([calls, np.arange(len(k_ts)), np.arange(len(s_ts))]).astype(np.int64)
    ref = kind << _SHIFT | index
    inner = (kind != _STEP).astype(np.int64)
    n = len(ref)
    ts = np.concatenate([end, begin])
    what = np.concatenate([np.full(n, _END, np.int64), np.full(n, _BEGIN, np.int64)])
    # ends: later-begun first, then calls before steps; begins: later-ending first, steps before calls
    tie1 = np.concatenate([-begin, -end])
    tie2 = np.concatenate([-inner, inner])
    order = np.lexsort((tie2, tie1, what, ts))
    refs = np.concatenate([ref, ref])[order].tolist()
    tss = ts[order].tolist()
    whats = what[order].tolist()

    api = ev["api"].tolist()
    pid_of, tid_of = ev["pid"].tolist(), ev["tid"].tolist()
    stream = ev["stream"].tolist()
    ret = ev["ret"].tolist()
    dst, src = ev["dst"].tolist(), ev["src"].tolist()
    stack = ev["stack"].tolist()
    fam = FAMILY[ev["api"]].tolist()
    direction = tl.directions.tolist() if len(tl.directions) == len(ev) else ev["direction"].tolist()
    host = tl.host_memory.tolist() if len(tl.host_memory) == len(ev) else [0] * len(ev)
    bytes_of = nbytes.tolist()

    slice_begin, slice_end, instant = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_INSTANT

    def call_begin(te: Any, i: int) -> None:
        f = fam[i]
        te.categories.append(CATEGORY.get(f, "call"))
        name = api_name(api[i])
        _annotate(te, "api", name)
        if f == Family.COPY:
            d = Direction(direction[i]).label if direction[i] <= max(Direction) else str(direction[i])
            te.name = f"{d} copy"
            _annotate(te, "direction", d)
            _annotate(te, "bytes", bytes_of[i])
            _annotate(te, "host_memory", HostMemory(host[i]).label or "none")
            _annotate(te, "stream", stream[i])
        elif f == Family.MEM:
            te.name = MEM_OP.get(api[i], "memory")
            _annotate(te, "bytes", bytes_of[i])
            _annotate(te, "address", dst[i] or src[i])
        else:
            te.name = name
            if stream[i]:
                _annotate(te, "stream", stream[i])
        if ret[i]:
            _annotate(te, "error", ret[i])
        frames = tl.stacks.get(stack[i]) if stack[i] else None
        if frames:
            _frames(te, frames)

    c_coll, c_bytes, c_count, c_ret = (coll[f].tolist() for f in ("coll", "bytes", "count", "ret"))
    c_pid, c_tid = coll["pid"].tolist(), coll["tid"].tolist()

    def coll_begin(te: Any, i: int) -> None:
        te.categories.append("collective")
        try:
            te.name = Collective(c_coll[i]).label
        except ValueError:
            te.name = f"collective {c_coll[i]}"
        _annotate(te, "bytes", c_bytes[i])
        _annotate(te, "count", c_count[i])
        if c_ret[i]:
            _annotate(te, "error", c_ret[i])

    def step_begin(te: Any, i: int) -> None:
        s = tl.steps[i]
        te.categories.append("step")
        te.name = "step" if s.steps == 1 else f"{s.steps} steps"
        if s.breakdown is not None:
            span = max(s.end_ns - s.start_ns, 1)
            for k, v in s.breakdown.items():
                _annotate(te, f"{k}_ns", v)
                _annotate(te, f"{k}_share", round(v / span, 4))
        elif s.steps > 1:
            _annotate(te, "why", "the loop was recognised after these steps: their bounds are not known apart")

    def track_of(kind: int, i: int) -> int:
        if kind == _CALL:
            return thread_track[(pid_of[i], tid_of[i])]
        if kind == _COLL:
            return thread_track[(c_pid[i], c_tid[i])]
        s = tl.steps[i]
        return thread_track[(s.pid, s.tid)]

    mask = (1 << _SHIFT) - 1
    for r, t, w in zip(refs, tss, whats, strict=True):
        k, i = r >> _SHIFT, r & mask
        p = add()
        p.trusted_packet_sequence_id = SEQUENCE
        p.timestamp = t
        te = p.track_event
        te.track_uuid = track_of(k, i)
        if w == _END:
            te.type = slice_end
            continue
        te.type = slice_begin
        if k == _CALL:
            call_begin(te, i)
        elif k == _COLL:
            coll_begin(te, i)
        else:
            step_begin(te, i)

    # ---- counters and instants ----
    counter = TrackEvent.TYPE_COUNTER
    for c, uuid in zip(tl.counters, counter_track, strict=True):
        for t, v in c.points:
            p = add()
            p.trusted_packet_sequence_id = SEQUENCE
            p.timestamp = t
            p.track_event.type = counter
            p.track_event.track_uuid = uuid
            p.track_event.double_counter_value = v
    for inst in sorted(tl.instants, key=lambda x: x.ts_ns):
        p = add()
        p.trusted_packet_sequence_id = SEQUENCE
        p.timestamp = inst.ts_ns
        te = p.track_event
        te.type = instant
        te.track_uuid = proc_track[inst.pid] if inst.pid is not None and inst.pid in proc_track else host_track
        te.name = inst.name
        te.categories.append(inst.category)
        for k2, v in inst.args.items():
            _annotate(te, k2, v)
    return bytes(trace.SerializeToString())


def write(tl: Timeline, path: str) -> int:
    """Write the trace to `path` (whole, or not at all: a temporary name, then a rename). Returns its size."""
    import os

    data = encode(tl)
    tmp = f"{path}.part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)
