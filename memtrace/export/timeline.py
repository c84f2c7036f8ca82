"""A timeline: what happened when, in the traced processes and on the host,
as the Perfetto trace (export/perfetto.py) and the HTML picture
(export/timeline_html.py) draw it. Pure data and numpy; no I/O.

One clock: every time here is CLOCK_MONOTONIC in ns, the clock BPF stamps
the events with (bpf_ktime_get_ns), the host signals sample on and the
sched sensor counts in. Wall-clock times (a diagnosis's onset) are turned
into it with the offset read when the timeline was taken (`wall_offset_ns`).

The calls (copies, waits, memory calls) are the sensor's own events, one
slice each, in ring order. Launches are records too where they were
probed while a timeline was recorded (cuda Options.launch_events): from
entry to return (a return probe on the launch symbols then, and only
then), with their stream and function; never given to the step tracker.
A process whose launches the overhead budget samples has none: its launch
rate counter says "estimated". Steps are found as the model finds them: the
stepping thread's events are replayed through a fresh StepTracker
(model/steps.py), cut after each wait, and a step ends where the tracker
counts one more; its breakdown is the tracker's own, step by step. Where
the tracker recognises its loop late and closes several steps at once
(the first few, while it looks for the loop), they are split at the
closing wait's symbol when that gives exactly their number, and are one
slice saying how many otherwise: never made-up boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import EV_MORE, EVENT_DTYPE, Family
from memtrace.core.nccl import EVENT_DTYPE as NCCL_EVENT_DTYPE
from memtrace.core.stacks import Frame
from memtrace.model.steps import StepTracker

# Per api id: its family (255: not probed), and whether the calling thread waits in it.
FAMILY = np.full(1 << 16, 255, np.uint8)
WAITS = np.zeros(1 << 16, bool)
for _a in apis.APIS:
    FAMILY[_a.id] = int(_a.family)
    WAITS[_a.id] = _a.family == Family.SYNC or (_a.family == Family.COPY and _a.synchronous)
MEM_OP = {a.id: a.op.value for a in apis.APIS if a.op is not None}


@dataclass(frozen=True)
class Step:
    """One step of a process's stepping thread (or `steps` of them, in one slice, where they could not be split)."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    steps: int = 1
    breakdown: dict[str, int] | None = None  # copy, sync_wait, collective, host, gpu_idle (ns)


@dataclass
class CounterTrack:
    """One counter over time. `group`: where it is drawn ("gpu 0 ...", "nic
    eth0 ...", "host"); `pid`: a process's counter, under its track instead.
    `cumulative`: the value is a total since the first sample (bytes, seconds)."""

    group: str
    name: str
    unit: str
    points: list[tuple[int, float]] = field(default_factory=list)
    pid: int | None = None
    cumulative: bool = False
    note: str = ""

    def add(self, ts_ns: int, value: float | None) -> None:
        if value is not None:
            self.points.append((ts_ns, float(value)))


@dataclass(frozen=True)
class Instant:
    """A moment: a diagnosis (at its detection, with its onset), a slowdown's onset, a finding."""

    ts_ns: int
    name: str
    category: str  # "diagnosis", "onset", "finding", "recorder"
    pid: int | None = None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timeline:
    """Everything one trace file draws."""

    events: np.ndarray = field(default_factory=lambda: np.zeros(0, EVENT_DTYPE))  # ring order
    # Per event (copies): the direction and host memory kind as the model resolves them (core enums).
    directions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    host_memory: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    collectives: np.ndarray = field(default_factory=lambda: np.zeros(0, NCCL_EVENT_DTYPE))
    processes: dict[int, str] = field(default_factory=dict)  # pid -> command name
    threads: dict[tuple[int, int], str] = field(default_factory=dict)  # (pid, tid) -> thread name
    steps: list[Step] = field(default_factory=list)
    counters: list[CounterTrack] = field(default_factory=list)
    instants: list[Instant] = field(default_factory=list)
    stacks: dict[int, tuple[Frame, ...]] = field(default_factory=dict)  # an event's `stack` -> frames
    start_ns: int = 0  # the window, CLOCK_MONOTONIC
    end_ns: int = 0
    wall_offset_ns: int = 0  # CLOCK_REALTIME - CLOCK_MONOTONIC when taken
    boot_offset_ns: int = 0  # CLOCK_BOOTTIME - CLOCK_MONOTONIC when taken
    dropped_events: int = 0  # the recorder's oldest, dropped before this window was written
    title: str = ""

    def calls(self) -> np.ndarray:
        """Indices of the events that are calls (a batch copy's further records folded into its first)."""
        more = (self.events["layer"] & EV_MORE) != 0
        return np.flatnonzero(~more & (FAMILY[self.events["api"]] != int(Family.LAUNCH)))

    def launches(self) -> np.ndarray:
        """Indices of the launch records (made while a timeline is recorded: entry time, host-side duration)."""
        return np.flatnonzero(FAMILY[self.events["api"]] == int(Family.LAUNCH))

    def call_bytes(self) -> np.ndarray:
        """Each event's bytes, a batch copy's further records added to its first record (per event index)."""
        b: np.ndarray = self.events["bytes"].astype(np.uint64)
        more = (self.events["layer"] & EV_MORE) != 0
        if not more.any():
            return b
        out: np.ndarray = b.copy()
        # A further record belongs to the last call record before it of the same thread.
        tid = self.events["tid"]
        last: dict[int, int] = {}
        for i in range(len(self.events)):
            t = int(tid[i])
            if more[i]:
                j = last.get(t)
                if j is not None:
                    out[j] += b[i]
            else:
                last[t] = i
        return out


def _stats(st: Any) -> tuple[int, int, int, int, int, int, int]:
    return (st.steps, st.step_ns, st.copy_ns, st.sync_ns, st.collective_ns, st.host_ns, st.gpu_idle_ns)


def step_slices(events: np.ndarray, stepping: dict[int, int]) -> list[Step]:
    """The steps of each process's stepping thread (`stepping`: pid -> tid,
    as the model names it), from that thread's events (ring order): see the
    module's docstring."""
    out: list[Step] = []
    for pid, tid in sorted(stepping.items()):
        mine = events[
            (events["pid"] == pid)
            & (events["tid"] == tid)
            & ((events["layer"] & EV_MORE) == 0)
            & (FAMILY[events["api"]] != int(Family.LAUNCH))  # launch records: the model never sees them
        ]
        if not len(mine):
            continue
        waits = np.flatnonzero(WAITS[mine["api"]])
        ret = (mine["ts_ns"] + mine["duration_ns"]).astype(np.int64)
        tracker = StepTracker(pid)
        prev = (0, 0, 0, 0, 0, 0, 0)
        lo = 0
        for w in waits.tolist():
            tracker.add(mine[lo : w + 1])
            lo = w + 1
            st = tracker.stats()
            if st is None:
                continue
            cur = _stats(st)
            k = cur[0] - prev[0]
            if k <= 0:
                continue
            end = int(ret[w])
            start = end - (cur[1] - prev[1])
            d = [c - p for c, p in zip(cur, prev, strict=True)]
            prev = cur
            if k == 1:
                names = ("copy", "sync_wait", "collective", "host", "gpu_idle")
                out.append(Step(pid, tid, start, end, 1, dict(zip(names, d[2:], strict=True))))
                continue
            # Several at once: split at the earlier returns of the closing wait's symbol, if they number k - 1.
            same = waits[
                (mine["api"][waits] == mine["api"][w])
                & (mine["stream"][waits] == mine["stream"][w])
                & (ret[waits] > start)
                & (ret[waits] < end)
            ]
            if len(same) == k - 1:
                bounds = [start, *ret[same].tolist(), end]
                out += [Step(pid, tid, a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            else:
                out.append(Step(pid, tid, start, end, k))
    return out
