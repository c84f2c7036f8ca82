"""A timeline (export/timeline.py) as a Perfetto trace: the protobuf format
ui.perfetto.dev and trace_processor read, written with the `perfetto`
package's protos (no binary needed).

Tracks: a process track per process and a thread track per thread, named
as `top` names them (their comm); on a thread, its calls as slices
(copies, waits, memory calls, collectives), nested in the steps of its
loop, and its launches where they were probed (slices from the launch's
entry to its return: the host-side time the driver took to queue it, with
its stream, function or graph, and API; a sampled process's launches are
its launch rate counter, marked so, and no slices);
counter tracks under each process (its launch rate, run queue share,
off-CPU time, ...), under each GPU and NIC, and for the host; each
diagnosis, its onset and each finding as instants on the process's track.

One clock: the trace's packets are stamped with CLOCK_MONOTONIC
(`trace_packet_defaults.timestamp_clock_id`), and a clock snapshot ties
it to CLOCK_REALTIME and CLOCK_BOOTTIME, so the UI shows wall-clock time
too. MONOTONIC is the trace's primary clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from memtrace.core.abi import Direction, Family
from memtrace.core.apis import BY_ID, LaunchKind, api_name
from memtrace.core.enums import HostMemory
from memtrace.core.nccl import Collective
from memtrace.core.stacks import NativeFrame, PythonFrame
from memtrace.export.timeline import FAMILY, MEM_OP, Timeline

MONOTONIC, REALTIME, BOOTTIME = 3, 1, 6  # perfetto's BuiltinClock
SHARE = 65536  # slice packets encoded (and written) at a time
SEQUENCE = 1  # every packet is on one sequence: its defaults (the clock) hold for all
_END, _BEGIN = 0, 1
_CALL, _COLL, _STEP, _LAUNCH = 0, 1, 2, 3
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


def _small_varint(n: int) -> bytes:
    return bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))


_SMALL = [_small_varint(n) for n in range(1 << 14)]  # lengths, tags and small values: looked up


def _varint(n: int) -> bytes:
    if 0 <= n < 1 << 14:
        return _SMALL[n]
    n &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf does
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


def _len(num: int, data: bytes) -> bytes:
    return _tag(num, 2) + _varint(len(data)) + data


class _Wire:
    """The slices' packets written field by field (they are most of a trace:
    through the generated classes a slice cost about 18 us, by hand a few),
    with the field numbers read from perfetto's own descriptors. The tests
    decode them with those protos."""

    def __init__(self) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import DebugAnnotation, TracePacket, TrackEvent

        def num(m: Any, name: str) -> int:
            return int(m.DESCRIPTOR.fields_by_name[name].number)

        self.ts = _tag(num(TracePacket, "timestamp"), 0)
        self.seq = _tag(num(TracePacket, "trusted_packet_sequence_id"), 0) + _varint(SEQUENCE)
        self.event = _tag(num(TracePacket, "track_event"), 2)
        self.type = _tag(num(TrackEvent, "type"), 0)
        self.track = _tag(num(TrackEvent, "track_uuid"), 0)
        self.name = num(TrackEvent, "name")
        self.category = num(TrackEvent, "categories")
        self.annotation = num(TrackEvent, "debug_annotations")
        self.annotation_tag = _tag(self.annotation, 2)
        self.callstack = num(TrackEvent, "callstack")
        self.a_name = num(DebugAnnotation, "name")
        self.a_uint = _tag(num(DebugAnnotation, "uint_value"), 0)
        self.a_int = _tag(num(DebugAnnotation, "int_value"), 0)
        self.a_str = num(DebugAnnotation, "string_value")
        self.begin = self.type + _varint(TrackEvent.TYPE_SLICE_BEGIN)
        self.end = self.type + _varint(TrackEvent.TYPE_SLICE_END)
        self._names: dict[str, bytes] = {}
        self._strings: dict[tuple[str, str], bytes] = {}

    def packet(self, ts: int, event: bytes) -> bytes:
        body = b"".join((self.ts, _varint(ts), self.seq, self.event, _varint(len(event)), event))
        return b"".join((b"\x0a", _varint(len(body)), body))  # Trace.packet (field 1, length-delimited)

    def uint(self, name: str, v: int) -> bytes:
        head = self._names.get(name)
        if head is None:
            head = self._names[name] = _len(self.a_name, name.encode())
        inner = b"".join((head, self.a_uint if v >= 0 else self.a_int, _varint(v)))
        return b"".join((self.annotation_tag, _varint(len(inner)), inner))

    def string(self, name: str, v: str) -> bytes:
        out = self._strings.get((name, v))
        if out is None:
            inner = _len(self.a_name, name.encode()) + _len(self.a_str, v.encode())
            out = self._strings[(name, v)] = _len(self.annotation, inner)
        return out

    def text(self, num: int, v: str) -> bytes:
        out = self._strings.get(("", str(num) + v))
        if out is None:
            out = self._strings[("", str(num) + v)] = _len(num, v.encode())
        return out


def encode(tl: Timeline) -> bytes:
    """The trace file's bytes."""
    return b"".join(packets(tl))


def packets(tl: Timeline) -> Iterator[bytes]:
    """The trace file's bytes, a share of its packets at a time (a file is
    written as they come: a window of a million calls is never held whole)."""
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
    launches = tl.launches()
    nbytes = tl.call_bytes()

    # ---- tracks ----
    pids = set(tl.processes) | set(ev["pid"][calls].tolist()) | set(coll["pid"].tolist())
    pids |= set(ev["pid"][launches].tolist())
    pids |= {s.pid for s in tl.steps} | {c.pid for c in tl.counters if c.pid is not None}
    pids |= {i.pid for i in tl.instants if i.pid is not None}
    threads = set(zip(ev["pid"][calls].tolist(), ev["tid"][calls].tolist(), strict=True))
    threads |= set(zip(coll["pid"].tolist(), coll["tid"].tolist(), strict=True))
    threads |= set(zip(ev["pid"][launches].tolist(), ev["tid"][launches].tolist(), strict=True))
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
    # first (a step ends where its last wait returns). Launches are slices
    # like calls (entry to return, on their thread).
    c_ts = ev["ts_ns"][calls].astype(np.int64)
    c_end = c_ts + ev["duration_ns"][calls].astype(np.int64)
    k_ts = coll["ts_ns"].astype(np.int64)
    k_end = k_ts + coll["duration_ns"].astype(np.int64)
    s_ts = np.array([s.start_ns for s in tl.steps], np.int64)
    s_end = np.array([s.end_ns for s in tl.steps], np.int64)
    l_ts = ev["ts_ns"][launches].astype(np.int64)
    l_end = l_ts + ev["duration_ns"][launches].astype(np.int64)
    begin = np.concatenate([c_ts, k_ts, s_ts, l_ts])
    end = np.concatenate([c_end, k_end, s_end, l_end])
    kind = np.concatenate(
        [
            np.full(len(c_ts), _CALL, np.int64),
            np.full(len(k_ts), _COLL, np.int64),
            np.full(len(s_ts), _STEP, np.int64),
            np.full(len(l_ts), _LAUNCH, np.int64),
        ]
    )
    index = np.concatenate([calls, np.arange(len(k_ts)), np.arange(len(s_ts)), launches]).astype(np.int64)
    ref = kind << _SHIFT | index
    inner = (kind != _STEP).astype(np.int64)
    n = len(ref)
    ts = np.concatenate([end, begin])
    what = np.concatenate([np.full(n, _END, np.int64), np.full(n, _BEGIN, np.int64)])
    # ends: later-begun first, then calls before steps; begins: later-ending first, steps before calls
    tie1 = np.concatenate([-begin, -end])
    tie2 = np.concatenate([-inner, inner])
    order = np.lexsort((tie2, tie1, what, ts))
    refs_all = np.concatenate([ref, ref])[order]
    tss_all = ts[order]
    whats_all = what[order]

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

    instant = TrackEvent.TYPE_INSTANT
    w = _Wire()
    stack_bytes: dict[int, bytes] = {}

    def frames_of(key: int) -> bytes:
        out = stack_bytes.get(key)
        if out is None:
            frames = tl.stacks.get(key)
            out = b""
            if frames:
                holder = TrackEvent()
                _frames(holder, frames)
                out = _len(w.callstack, holder.callstack.SerializeToString())
            stack_bytes[key] = out
        return out

    def call_begin(i: int) -> bytes:
        f = fam[i]
        name = api_name(api[i])
        parts = [w.text(w.category, CATEGORY.get(f, "call")), w.string("api", name)]
        if f == Family.COPY:
            d = Direction(direction[i]).label if direction[i] <= max(Direction) else str(direction[i])
            parts += [
                w.text(w.name, f"{d} copy"),
                w.string("direction", d),
                w.uint("bytes", bytes_of[i]),
                w.string("host_memory", HostMemory(host[i]).label or "none"),
                w.uint("stream", stream[i]),
            ]
        elif f == Family.MEM:
            parts += [w.text(w.name, MEM_OP.get(api[i], "memory")), w.uint("bytes", bytes_of[i])]
            parts.append(w.uint("address", dst[i] or src[i]))
        else:
            parts.append(w.text(w.name, name))
            if stream[i]:
                parts.append(w.uint("stream", stream[i]))
        if ret[i]:
            parts.append(w.uint("error", ret[i]))
        if stack[i]:
            parts.append(frames_of(stack[i]))
        return b"".join(parts)

    c_coll, c_bytes, c_count, c_ret = (coll[f].tolist() for f in ("coll", "bytes", "count", "ret"))
    c_pid, c_tid = coll["pid"].tolist(), coll["tid"].tolist()

    def coll_begin(i: int) -> bytes:
        try:
            name = Collective(c_coll[i]).label
        except ValueError:
            name = f"collective {c_coll[i]}"
        parts = [w.text(w.category, "collective"), w.text(w.name, name)]
        parts += [w.uint("bytes", c_bytes[i]), w.uint("count", c_count[i])]
        if c_ret[i]:
            parts.append(w.uint("error", c_ret[i]))
        return b"".join(parts)

    def step_begin(i: int) -> bytes:
        s = tl.steps[i]
        holder = TrackEvent()
        holder.categories.append("step")
        holder.name = "step" if s.steps == 1 else f"{s.steps} steps"
        if s.breakdown is not None:
            span = max(s.end_ns - s.start_ns, 1)
            for k, v in s.breakdown.items():
                _annotate(holder, f"{k}_ns", v)
                _annotate(holder, f"{k}_share", round(v / span, 4))
        elif s.steps > 1:
            _annotate(holder, "why", "the loop was recognised after these steps: their bounds are not known apart")
        return bytes(holder.SerializeToString())

    def launch_begin(i: int) -> bytes:
        a = BY_ID.get(api[i])
        graph = a is not None and a.launch == LaunchKind.GRAPH
        parts = [w.text(w.category, "launch"), w.text(w.name, "graph launch" if graph else "kernel launch")]
        parts += [w.string("api", api_name(api[i])), w.uint("stream", stream[i])]  # 0: the default stream
        if dst[i]:
            parts.append(w.uint("graph" if graph else "function", dst[i]))
        if ret[i]:
            parts.append(w.uint("error", ret[i]))
        return b"".join(parts)

    def track_of(kind: int, i: int) -> int:
        if kind == _CALL or kind == _LAUNCH:
            return thread_track[(pid_of[i], tid_of[i])]
        if kind == _COLL:
            return thread_track[(c_pid[i], c_tid[i])]
        s = tl.steps[i]
        return thread_track[(s.pid, s.tid)]

    mask = (1 << _SHIFT) - 1
    track_bytes: dict[int, bytes] = {}
    yield bytes(trace.SerializeToString())  # the clock, the defaults and the tracks
    del trace.packet[:]
    for lo in range(0, len(refs_all), SHARE):
        refs = refs_all[lo : lo + SHARE].tolist()
        tss = tss_all[lo : lo + SHARE].tolist()
        whats = whats_all[lo : lo + SHARE].tolist()
        chunks: list[bytes] = []
        for r, t, what_ in zip(refs, tss, whats, strict=True):
            k, i = r >> _SHIFT, r & mask
            uuid = track_of(k, i)
            tb = track_bytes.get(uuid)
            if tb is None:
                tb = track_bytes[uuid] = w.track + _varint(uuid)
            if what_ == _END:
                chunks.append(w.packet(t, w.end + tb))
                continue
            if k == _CALL:
                body = call_begin(i)
            elif k == _LAUNCH:
                body = launch_begin(i)
            else:
                body = coll_begin(i) if k == _COLL else step_begin(i)
            chunks.append(w.packet(t, w.begin + tb + body))
        yield b"".join(chunks)

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
    yield bytes(trace.SerializeToString())


def write(tl: Timeline, path: str) -> int:
    """Write the trace to `path` (whole, or not at all: a temporary name, then a rename). Returns its size."""
    import os

    size = 0
    tmp = f"{path}.part"
    with open(tmp, "wb") as f:
        for chunk in packets(tl):
            f.write(chunk)
            size += len(chunk)
    os.replace(tmp, path)
    return size
