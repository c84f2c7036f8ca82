"""The flight recorder: the last seconds of everything, kept in memory, written
as a timeline (export/timeline.py) when something goes wrong or when asked.

What it keeps: every notice the agent takes (its CUDA event batches and
NCCL collectives, as they are drained, and the processes' names), the host
signals' readings at each tick (GPU, NIC and per-process counters, read
from the HostBook through the accessors below), each process's launch
rate and step time, and the diagnoses. Bounded twice: events older than
`seconds` go, and past `max_bytes` the oldest go first, whatever their
age; both are counted (`aged_out`, `dropped`), and a written file whose
window lost events to the bound says so (its first packet's
previous_packet_dropped, and an instant).

When it writes:
- `memtrace push`: on each diagnosis, the window from `before_s` before
  the onset to `after_s` after the detection, written once that time has
  come (on a thread of its own), into `directory`, whose files are kept
  under `directory_bytes` (the oldest removed first). While a window waits
  to be written, the events it needs are not aged out (the memory bound
  still holds). On SIGUSR1 (`memtrace snapshot`), the last `seconds`.
- `memtrace run --timeline FILE`: the whole run, at its end (`seconds`
  unbounded; `max_bytes` still holds).

Cost: `take` runs on the drain thread for every poll and only keeps a
reference to each batch (no copy, no per-event work); a tick reads the
book and the model's totals once; the work is in writing a file, on the
thread that writes it. bench/experiments/recorder_cost.py measures both, and
docs/timeline.md gives the figures and how to turn the recorder off.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.abi import EVENT_DTYPE, Family
from memtrace.core.enums import HostMemory
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import EVENT_DTYPE as NCCL_EVENT_DTYPE
from memtrace.core.notices import Collectives, Events, Launches, Notice, ProcessMet
from memtrace.export.timeline import FAMILY, CounterTrack, Instant, Timeline, step_slices
from memtrace.model.host import HostBook

if TYPE_CHECKING:
    from memtrace.model import Model
    from memtrace.runtime.agent import Agent
    from memtrace.runtime.hostsignals import HostSignals

log = logging.getLogger("memtrace")

DEFAULT_SECONDS = 30.0
DEFAULT_BYTES = 64 << 20
DEFAULT_DIRECTORY = "/var/lib/memtrace/timelines"
DEFAULT_DIRECTORY_BYTES = 1 << 30
BEFORE_S = 20.0  # a diagnosis's file starts this long before its onset
AFTER_S = 10.0  # ... and ends this long after its detection
PIDFILE = "agent.pid"  # in the directory: whom `memtrace snapshot` signals


@dataclass(frozen=True)
class RecorderOptions:
    seconds: float = DEFAULT_SECONDS  # math.inf: keep everything (run --timeline), max_bytes permitting
    max_bytes: int = DEFAULT_BYTES
    directory: str | None = None  # where diagnoses' and snapshots' files go (push); None: none written
    directory_bytes: int = DEFAULT_DIRECTORY_BYTES
    before_s: float = BEFORE_S
    after_s: float = AFTER_S


# ---- the host signals' book, read in one place (its per-process maps are keyed by pid today) ----


@dataclass(frozen=True)
class Reading:
    """One counter's value now: which track it belongs to, and the value."""

    group: str
    name: str
    unit: str
    value: float
    pid: int | None = None
    cumulative: bool = False
    note: str = ""


def book_cpu(book: HostBook) -> dict[int, Any]:
    """pid -> its process's CpuStats (cumulative: runq_ns, oncpu_ns, offcpu_ns):
    a timeline's tracks are by pid; of a reused pid, its latest process."""
    return {key.pid: st for key, st in sorted(book.cpu.items())}


def book_memory_limit_hits(book: HostBook) -> dict[int, int]:
    return {key.pid: hits for key, hits in sorted(book.memory_limit_hits.items())}


def book_readings(book: HostBook) -> list[Reading]:
    """Every counter the book holds now. Cumulative ones are the totals the
    JSON summary reports (host.cpu, host.gpus, host.network), so the last
    point of a run's track is its summary's figure."""
    out: list[Reading] = []
    for pid, st in book_cpu(book).items():
        alive = st.oncpu_ns + st.offcpu_ns + st.runq_ns
        out += [
            Reading("cpu", "run queue", "s", st.runq_ns / 1e9, pid, True),
            Reading("cpu", "off CPU", "s", st.offcpu_ns / 1e9, pid, True),
            Reading("cpu", "on CPU", "s", st.oncpu_ns / 1e9, pid, True),
            Reading("cpu", "run queue share", "share", st.runq_ns / alive if alive else 0.0, pid, True, "since start"),
        ]
    for pid, hits in book_memory_limit_hits(book).items():
        out.append(Reading("memory", "memory limit hits", "count", hits, pid, True))
    for g in sorted(book.gpus.values(), key=lambda g: g.index):
        group = f"GPU {g.index} ({g.uuid})"
        s = g.latest
        if s is None:
            continue
        out.append(Reading(group, "lost", "bool", 1.0 if s.lost else 0.0))
        if s.lost:
            continue
        if s.sm_utilization_percent is not None:
            out.append(Reading(group, "SM utilisation", "%", s.sm_utilization_percent))
        if s.memory_utilization_percent is not None:
            out.append(Reading(group, "memory utilisation", "%", s.memory_utilization_percent))
        if s.sm_clock_mhz is not None:
            out.append(Reading(group, "SM clock", "MHz", s.sm_clock_mhz))
        if s.memory_clock_mhz is not None:
            out.append(Reading(group, "memory clock", "MHz", s.memory_clock_mhz))
        if s.clock_event_mask is not None:
            out.append(Reading(group, "throttled", "bool", 1.0 if s.throttled else 0.0))
            out.append(Reading(group, "clock event reasons", "mask", float(s.clock_event_mask)))
        if g.pcie_counted:
            out.append(Reading(group, "PCIe tx", "bytes", g.pcie_tx_count.bytes, None, True, "driver's counters"))
            out.append(Reading(group, "PCIe rx", "bytes", g.pcie_rx_count.bytes, None, True, "driver's counters"))
        last = g.last
        if last is not None and last.link_width is not None:
            out.append(Reading(group, "PCIe link width", "lanes", last.link_width))
        if last is not None and last.temperature_celsius is not None:
            out.append(Reading(group, "temperature", "C", last.temperature_celsius))
    for i in book.interface_series():
        group = f"NIC {i.last.name} (netns {i.netns})"
        out.append(Reading(group, "rx", "bytes", i.deltas["rx_bytes"], None, True))
        out.append(Reading(group, "tx", "bytes", i.deltas["tx_bytes"], None, True))
        drops = i.deltas.get("rx_dropped", 0) + i.deltas.get("tx_dropped", 0)
        out.append(Reading(group, "drops", "count", drops, None, True))
    for q in book.qdisc_series():
        b = q.last
        group = f"NIC {b.ifname} (netns {b.netns})"
        qname = f"qdisc {b.kind} {b.handle >> 16:x}:{b.handle & 0xFFFF:x}"
        out.append(Reading(group, f"{qname} backlog", "bytes", b.backlog_bytes))
        out.append(Reading(group, f"{qname} drops", "count", q.deltas["drops"], None, True))
    return out


# ---- what the model resolves, per event (read in one place too) ----


def copy_kinds(model: Model, ev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each copy's direction (unified copies resolved from its pointers) and
    host memory kind, as the process's address book has them now (when the
    file is written): a buffer freed and reused since may be named by what
    it is now. Events of a process the model no longer holds: as BPF
    reported them, host memory unknown."""
    from memtrace.model.copies import resolve, what_copies_touch

    direction = ev["direction"].copy()
    host = np.full(len(ev), int(HostMemory.NONE), np.uint8)
    copies = np.flatnonzero(FAMILY[ev["api"]] == int(Family.COPY))
    if not len(copies):
        return direction, host
    host[copies] = int(HostMemory.UNKNOWN)
    pairs = np.unique(np.stack([ev["pid"][copies].astype(np.int64), ev["start_ns"][copies].astype(np.int64)]), axis=1)
    for pid, start in pairs.T.tolist():
        p = model.processes.get(ProcessKey(pid, start))
        if p is None:
            continue
        sel = copies[(ev["pid"][copies] == pid) & (ev["start_ns"][copies] == start)]
        b = ev[sel]
        zero = np.zeros(len(b), np.int64)
        src_what, dst_what = what_copies_touch(b, np.arange(len(b)), None, zero, [p])
        d, h = resolve(b, src_what, dst_what, zero, [p])
        direction[sel], host[sel] = d, h
    return direction, host


def _stepping(model: Model) -> dict[int, int]:
    """pid -> the thread whose steps the model counts."""
    out = {}
    for key, tracker in list(model.step_trackers.items()):
        st = tracker.stats()
        if st is not None:
            out[key.pid] = st.tid
    return out


def _thread_name(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass
class _Pending:
    """A file to write once its window has come."""

    path: str
    start_ns: int
    end_ns: int
    diagnosis: Diagnosis | None = None


@dataclass
class _Series:
    track: CounterTrack
    points: deque[tuple[int, float]] = field(default_factory=deque)


class Recorder:
    """See the module's docstring. `take` is the agent's tap (Agent(recorder=)),
    `tick` the host thread's (Pipeline), `diagnosed` the live diagnosis's."""

    def __init__(self, opts: RecorderOptions) -> None:
        self.opts = opts
        self._lock = threading.Lock()
        self._events: deque[tuple[int, np.ndarray]] = deque()  # (latest ts in it, batch), ring order
        self._collectives: deque[tuple[int, np.ndarray]] = deque()
        self._bytes = 0
        self.dropped = 0  # events dropped at the memory bound
        self.aged_out = 0  # events older than `seconds`
        self.names: dict[int, str] = {}
        self.threads: dict[tuple[int, int], str] = {}
        self._agent: Agent | None = None
        self._host: HostSignals | None = None
        self._series: dict[tuple[str, str, int | None], _Series] = {}
        self._instants: deque[Instant] = deque()
        self._diagnoses: list[tuple[int, Diagnosis]] = []  # (monotonic detection, diagnosis)
        self._pending: list[_Pending] = []
        self._written: set[int] = set()  # id() of the diagnoses whose file is asked for
        self._files: dict[int, str] = {}
        self._steps_prev: dict[int, tuple[int, int]] = {}
        # pid -> its stepping thread, as the model said while it ran: a file written after the
        # process exited and was forgotten (push forgets what it has pushed) still draws its steps.
        self._stepping: dict[int, int] = {}
        self._launches_prev: dict[int, tuple[int, int]] = {}
        self._reasons: dict[str, int] = {}
        self._writers: list[threading.Thread] = []
        self._closed = False
        self.files_written = 0
        self.write_failures = 0

    # ---- the drain thread's tap ----

    def take(self, notices: list[Notice]) -> None:
        """A poll's notices: batches kept by reference, names noted. No per-event work."""
        for n in notices:
            if isinstance(n, (Events, Launches)):  # a launch's record goes with the calls: one bound, one order
                b = n.batch
                if len(b):
                    with self._lock:
                        self._events.append((int(b["ts_ns"][-1]), b))
                        self._bytes += b.nbytes
            elif isinstance(n, Collectives):
                if len(n.events):
                    with self._lock:
                        self._collectives.append((int(n.events["ts_ns"].max()), n.events))
                        self._bytes += n.events.nbytes
            elif isinstance(n, ProcessMet) and n.comm:
                self.names[n.key.pid] = n.comm
        self._trim(time.monotonic_ns())

    def _trim(self, now_ns: int) -> None:
        with self._lock:
            keep_from = now_ns - int(self.opts.seconds * 1e9) if math.isfinite(self.opts.seconds) else -(2**62)
            if self._pending:
                keep_from = min(keep_from, min(p.start_ns for p in self._pending))
            for q in (self._events, self._collectives):
                while q and q[0][0] < keep_from:
                    _, b = q.popleft()
                    self._bytes -= b.nbytes
                    self.aged_out += len(b)
            while self._bytes > self.opts.max_bytes and (self._events or self._collectives):
                older = self._events if self._events else self._collectives
                if self._events and self._collectives and self._collectives[0][0] < self._events[0][0]:
                    older = self._collectives
                _, b = older.popleft()
                self._bytes -= b.nbytes
                self.dropped += len(b)

    @property
    def bytes(self) -> int:
        return self._bytes

    def held_events(self) -> int:
        with self._lock:
            return sum(len(b) for _, b in self._events)

    # ---- the host thread's tick ----

    def tick(self, agent: Agent, host: HostSignals | None) -> None:
        """Read the counters now: the book's, and the model's launches and steps. Never raises."""
        try:
            self._tick(agent, host)
        except Exception as e:  # noqa: BLE001 - the recorder must never stop the sampling or the traced run
            log.debug("flight recorder tick failed: %s", e)

    def _point(self, r: Reading, now: int) -> None:
        key = (r.group, r.name, r.pid)
        s = self._series.get(key)
        if s is None:
            track = CounterTrack(r.group, r.name, r.unit, pid=r.pid, cumulative=r.cumulative, note=r.note)
            s = self._series[key] = _Series(track)
        elif r.note and r.note != s.track.note:
            s.track.note = r.note  # the latest says what it is now (launches once sampled: estimated)
        s.points.append((now, r.value))

    def _tick(self, agent: Agent, host: HostSignals | None) -> None:
        now = time.monotonic_ns()
        readings: list[Reading] = []
        agent.sync_totals()  # the kernel's launch counts, into the model
        with agent.lock:
            model = agent.model
            for key, p in list(model.processes.items()):
                if p.name and key.pid not in self.names:
                    self.names[key.pid] = p.name
                launches = sum(p.launches.values())
                prev = self._launches_prev.get(key.pid)
                self._launches_prev[key.pid] = (now, launches)
                sampled = p.launch_duty is not None
                note = f"estimated: sampled by the overhead budget at {p.launch_duty:.0%}" if sampled else "counted"
                readings.append(Reading("launches", "launches", "count", launches, key.pid, True, note))
                if prev is not None and now > prev[0]:
                    rate = (launches - prev[1]) / ((now - prev[0]) / 1e9)
                    readings.append(Reading("launches", "launch rate", "1/s", rate, key.pid, False, note))
                tracker = model.step_trackers.get(key)
                st = tracker.stats() if tracker is not None else None
                if st is not None:
                    self._stepping[key.pid] = st.tid
                    readings.append(Reading("steps", "steps", "count", st.steps, key.pid, True))
                    sp = self._steps_prev.get(key.pid)
                    self._steps_prev[key.pid] = (st.steps, st.step_ns)
                    if sp is not None and st.steps > sp[0]:
                        mean = (st.step_ns - sp[1]) / (st.steps - sp[0]) / 1e9
                        readings.append(
                            Reading("steps", "step time", "s", mean, key.pid, False, "mean since last sample")
                        )
        if host is not None:
            with host.lock:
                readings += book_readings(host.book)
                reasons = {
                    f"GPU {g.index} ({g.uuid})": g.latest.clock_event_mask
                    for g in host.book.gpus.values()
                    if g.latest is not None and g.latest.clock_event_mask is not None
                }
                names = {
                    f"GPU {g.index} ({g.uuid})": tuple(g.latest.clock_event_reasons or ())
                    for g in host.book.gpus.values()
                    if g.latest is not None
                }
        else:
            reasons, names = {}, {}
        with self._lock:
            for r in readings:
                self._point(r, now)
            for group, mask in reasons.items():
                if self._reasons.get(group) != mask:
                    self._reasons[group] = mask
                    self._instants.append(
                        Instant(now, f"{group} clock events: {', '.join(names[group]) or 'none'}", "gpu", None)
                    )
        self._learn_threads()
        self._trim_series(now)
        self._trim(now)

    def _learn_threads(self) -> None:
        """The names of threads first seen since the last tick (their comm, as top shows it)."""
        with self._lock:
            batches = [b for _, b in self._events]
        new = batches[-64:]  # the ring may have moved on: the latest are enough to meet each thread
        if not new:
            return
        ids = np.unique(np.concatenate([b["pid"].astype(np.uint64) << np.uint64(32) | b["tid"] for b in new]))
        seen = {(int(i >> 32), int(i & 0xFFFFFFFF)) for i in ids.tolist()}
        for k in seen - set(self.threads):
            name = _thread_name(*k)
            if name is not None:
                self.threads[k] = name

    def _trim_series(self, now: int) -> None:
        if not math.isfinite(self.opts.seconds):
            return
        keep_from = now - int(self.opts.seconds * 1e9)
        with self._lock:
            if self._pending:
                keep_from = min(keep_from, min(p.start_ns for p in self._pending))
            for s in self._series.values():
                while s.points and s.points[0][0] < keep_from:
                    s.points.popleft()
            while self._instants and self._instants[0].ts_ns < keep_from:
                self._instants.popleft()

    # ---- diagnoses and files ----

    def diagnosed(self, d: Diagnosis) -> str | None:
        """A diagnosis (made or re-named): noted, and its file asked for once
        (with a directory). Returns the file's path: it is written at
        `after_s` past the detection."""
        mono = time.monotonic_ns()
        offset = time.time_ns() - mono
        with self._lock:
            if id(d) in self._written:
                return self._files.get(id(d))
            self._written.add(id(d))
            self._diagnoses.append((d.detected_ns - offset, d))
        if self.opts.directory is None:
            return None
        onset = d.onset_ns - offset
        stamp = datetime.datetime.fromtimestamp(d.detected_ns / 1e9, tz=datetime.timezone.utc)
        path = os.path.join(self.opts.directory, f"diagnosis-{stamp:%Y%m%dT%H%M%S}-pid{d.key.pid}.pftrace")
        job = _Pending(
            path, onset - int(self.opts.before_s * 1e9), d.detected_ns - offset + int(self.opts.after_s * 1e9), d
        )
        with self._lock:
            self._files[id(d)] = path
            self._pending.append(job)
        self._start_writer(job)
        return path

    def file_of(self, d: Diagnosis) -> str | None:
        return self._files.get(id(d))

    def bind(self, agent: Agent, host: HostSignals | None) -> None:
        """Whose model and book the files read (the pipeline binds its own when built)."""
        self._agent = agent
        self._host = host

    def snapshot(self, seconds: float | None = None) -> str | None:
        """Write the last `seconds` (the ring's length by default) now, on a thread; returns the path."""
        if self.opts.directory is None:
            return None
        now = time.monotonic_ns()
        span = seconds if seconds is not None else self.opts.seconds
        stamp = datetime.datetime.now(tz=datetime.timezone.utc)
        path = os.path.join(self.opts.directory, f"snapshot-{stamp:%Y%m%dT%H%M%S.%f}.pftrace")
        job = _Pending(path, now - int(span * 1e9) if math.isfinite(span) else 0, now)
        with self._lock:
            self._pending.append(job)
        self._start_writer(job)
        return path

    def _start_writer(self, job: _Pending) -> None:
        t = threading.Thread(target=self._write_when_due, args=(job,), name="memtrace-recorder", daemon=True)
        self._writers = [w for w in self._writers if w.is_alive()] + [t]
        t.start()

    def _write_when_due(self, job: _Pending) -> None:
        with contextlib.suppress(OSError):  # low priority: a file waits, a drain does not
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while not self._closed:
            left = (job.end_ns - time.monotonic_ns()) / 1e9
            if left <= 0:
                break
            time.sleep(min(left, 0.25))
        try:
            if self._agent is None:
                raise RuntimeError("the recorder is not bound to an agent")
            tl = self.timeline(self._agent, self._host, job.start_ns, job.end_ns)
            self.write(tl, job.path)
            log.warning("flight recorder: wrote %s", job.path)
        except Exception as e:  # noqa: BLE001 - a file that cannot be written is logged, never raised
            self.write_failures += 1
            log.warning("flight recorder: could not write %s: %s", job.path, e)
        finally:
            with self._lock:
                if job in self._pending:
                    self._pending.remove(job)

    def write(self, tl: Timeline, path: str) -> int:
        """Write a timeline where `path` says: .html the picture, else the Perfetto trace; the directory's cap kept."""
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        if path.endswith(".html"):
            from memtrace.export.timeline_html import render

            data = render(tl).encode()
            tmp = f"{path}.part"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            size = len(data)
        else:
            from memtrace.export.perfetto import write

            size = write(tl, path)
        self.files_written += 1
        if self.opts.directory is not None and os.path.abspath(directory) == os.path.abspath(self.opts.directory):
            self._cap_directory(path)
        return size

    def _cap_directory(self, keep: str) -> None:
        """The oldest files go until the directory's traces fit under directory_bytes (the newest always stays)."""
        d = self.opts.directory
        assert d is not None
        files = []
        for name in os.listdir(d):
            if name.endswith((".pftrace", ".html")):
                p = os.path.join(d, name)
                with contextlib.suppress(OSError):
                    st = os.stat(p)
                    files.append((st.st_mtime_ns, p, st.st_size))
        files.sort()
        total = sum(f[2] for f in files)
        for _, p, size in files:
            if total <= self.opts.directory_bytes:
                break
            if os.path.abspath(p) == os.path.abspath(keep):
                continue
            with contextlib.suppress(OSError):
                os.unlink(p)
                total -= size
                log.info("flight recorder: removed %s (the directory is over %d bytes)", p, self.opts.directory_bytes)

    # ---- a window as a timeline ----

    def timeline(
        self,
        agent: Agent | None,
        host: HostSignals | None,
        start_ns: int,
        end_ns: int,
        findings: list[dict[str, Any]] | None = None,
    ) -> Timeline:
        """What the recorder holds between start_ns and end_ns (CLOCK_MONOTONIC).
        Without an agent (a benchmark), copies keep BPF's direction and no
        host memory kind, and there are no steps or stacks."""
        with self._lock:
            batches = [b for last, b in self._events if last >= start_ns]
            colls = [b for last, b in self._collectives if last >= start_ns]
            series = [(s.track, list(s.points)) for s in self._series.values()]
            instants = list(self._instants)
            diagnoses = list(self._diagnoses)
            dropped = self.dropped
        ev = np.concatenate(batches) if batches else np.zeros(0, EVENT_DTYPE)
        ev = ev[(ev["ts_ns"] + ev["duration_ns"] >= start_ns) & (ev["ts_ns"] <= end_ns)]
        coll = np.concatenate(colls) if colls else np.zeros(0, NCCL_EVENT_DTYPE)
        coll = coll[(coll["ts_ns"] + coll["duration_ns"] >= start_ns) & (coll["ts_ns"] <= end_ns)]
        direction, hostmem = ev["direction"], np.zeros(len(ev), np.uint8)
        stepping = dict(self._stepping)
        names: dict[int, str] = {}
        if agent is not None:
            with agent.lock:
                direction, hostmem = copy_kinds(agent.model, ev)
                stepping.update(_stepping(agent.model))
                names = {k.pid: p.name for k, p in agent.model.processes.items() if p.name}
        names.update(self.names)
        stacks: dict[int, Any] = {}
        if agent is not None and agent.stacks is not None and len(ev):
            ids = np.unique(ev["stack"][ev["stack"] != 0]).tolist()
            stacks = {k: s.frames for k, s in agent.stacks.stacks(ids).items()}
        mono = time.monotonic_ns()
        wall_offset = time.time_ns() - mono
        boot_offset = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - mono
        counters = []
        for track, points in series:
            inside = [(t, v) for t, v in points if start_ns <= t <= end_ns]
            if inside:
                counters.append(
                    CounterTrack(track.group, track.name, track.unit, inside, track.pid, track.cumulative, track.note)
                )
        marks = [i for i in instants if start_ns <= i.ts_ns <= end_ns]
        for det, d in diagnoses:
            onset = d.onset_ns - wall_offset
            if not (start_ns <= det <= end_ns or start_ns <= onset <= end_ns):
                continue
            args: dict[str, Any] = {
                "cause": d.cause,
                "symptom": d.symptom,
                "ratio": round(d.ratio, 3),
                "onset_ns": onset,
                "fix": d.fix,
                "evidence": d.evidence,
            }
            marks.append(Instant(det, f"diagnosis: {d.cause}", "diagnosis", d.key.pid, args))
            marks.append(Instant(onset, f"onset: {d.symptom}", "onset", d.key.pid, {"cause": d.cause}))
        for f in findings or []:
            marks.append(Instant(end_ns, f"finding: {f.get('code', '')}", "finding", f.get("pid"), dict(f)))
        if dropped:
            marks.append(
                Instant(start_ns, f"flight recorder: {dropped} events dropped at its memory bound", "recorder")
            )
        return Timeline(
            events=ev,
            directions=direction,
            host_memory=hostmem,
            collectives=coll,
            processes=names,
            threads=dict(self.threads),
            steps=step_slices(ev, stepping),
            counters=counters,
            instants=marks,
            stacks=stacks,
            start_ns=start_ns,
            end_ns=end_ns,
            wall_offset_ns=wall_offset,
            boot_offset_ns=boot_offset,
            dropped_events=dropped,
        )

    def close(self, wait: float = 0.0) -> None:
        """Stop: files whose window has not come are written now with what there is (within `wait` seconds)."""
        self._closed = True
        deadline = time.monotonic() + wait
        for t in list(self._writers):
            t.join(max(deadline - time.monotonic(), 0.0))
