"""What the model keeps per process and per call family."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from memtrace.core import apis
from memtrace.core.abi import Direction, Family
from memtrace.core.enums import Allocation, HostMemory
from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessKey
from memtrace.model.book import AddressBook


class CopyKey(NamedTuple):
    process: ProcessKey
    api: int  # api id (memtrace/core/apis.py)
    direction: Direction
    host: HostMemory


class ApiKey(NamedTuple):
    """A process's waits or launches through one api."""

    process: ProcessKey
    api: int


SyncKey = ApiKey
LaunchKey = ApiKey


class LostKey(NamedTuple):
    """Calls the kernel counted because the ring could not take their events."""

    process: ProcessKey
    api: int
    direction: Direction


LostTotals = tuple[int, int, int, int]  # calls, bytes, errors, duration ns


class SiteKey(NamedTuple):
    """Calls made from one call stack (core/stacks.py; 0: calls without
    one): copies, by direction and host memory, or device allocations."""

    stack: int
    kind: str  # "copy" or "alloc"
    api: int
    direction: Direction | None  # None for an allocation
    host: HostMemory


@dataclass
class SiteStats:
    calls: int = 0
    bytes: int = 0  # of successful calls
    errors: int = 0


_DIRECTIONS = {int(d): d for d in Direction}


def direction_of(value: int) -> Direction:
    """A kernel direction value as a Direction (a value this version does not know: unknown)."""
    return _DIRECTIONS.get(value, Direction.UNKNOWN)


@dataclass
class CopyStats:
    calls: int = 0
    bytes: int = 0
    errors: int = 0
    duration_ns: int = 0
    events: int = 0  # calls seen as events (the rest were lost from the ring)
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds, every call seen
    sizes: ExpHistogram = field(default_factory=ExpHistogram)  # bytes, successful calls seen


@dataclass
class SyncStats:
    calls: int = 0
    errors: int = 0
    duration_ns: int = 0
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds


TREND_WINDOW_NS = 30 * 10**9
TREND_WINDOWS = 128  # an hour of windows


@dataclass
class DeviceMemory:
    """Device memory a process allocated through the calls memtrace sees:
    device, pitched, stream-ordered and managed allocations, and physical
    memory created for VMM mappings."""

    allocations: int = 0
    allocated_bytes: int = 0
    frees: int = 0
    freed_bytes: int = 0
    unknown_frees: int = 0  # frees of addresses or handles memtrace never saw allocated
    failed_allocations: int = 0
    in_use_bytes: int = 0
    peak_bytes: int = 0
    sizes: ExpHistogram = field(default_factory=ExpHistogram)  # bytes per allocation
    live: dict[tuple[Allocation, int], int] = field(default_factory=dict)  # (kind, address or handle) -> bytes
    # The allocating call's stack of each live allocation, with stacks on (core/stacks.py).
    live_stack: dict[tuple[Allocation, int], int] = field(default_factory=dict)
    # VMM: the handle mapped at each address, and the references retained to a
    # live handle (cuMemRetainAllocationHandle) that a release gives back first.
    mapped: dict[int, int] = field(default_factory=dict)
    retained: dict[int, int] = field(default_factory=dict)
    # For the growth signal: the bytes in use at the end of each TREND_WINDOW_NS window
    # (CLOCK_MONOTONIC, from the calls' own times) that had an allocation or a free.
    trend: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=TREND_WINDOWS))

    @property
    def outstanding(self) -> int:
        return len(self.live)

    def note(self, ts_ns: int) -> None:
        """After an allocation or a free at ts_ns: the window's in-use bytes."""
        w = ts_ns // TREND_WINDOW_NS
        if self.trend and self.trend[-1][0] >= w:
            self.trend[-1] = (self.trend[-1][0], self.in_use_bytes)
        else:
            self.trend.append((w, self.in_use_bytes))


@dataclass
class Process:
    key: ProcessKey
    name: str = ""  # the command name, from BPF at its first event
    exe: str = ""
    ppid: int = 0  # its parent when memtrace met it (0: not known)
    cgroup_id: int = 0  # from BPF at its first event (0: not said)
    first_seen_ns: int = field(default_factory=time.time_ns)
    start_ns: int = 0  # when the process started, wall clock (0: unknown)
    exited: bool = False
    exited_ns: int = 0
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource
    # Seen from before its first CUDA call: an untracked host pointer is pageable.
    complete: bool = False
    memory: DeviceMemory = field(default_factory=DeviceMemory)
    book: AddressBook = field(default_factory=AddressBook)
    # What this process did, each keyed with the process itself: forgetting
    # it or exporting it never scans another process's state.
    copies: dict[CopyKey, CopyStats] = field(default_factory=dict)
    syncs: dict[SyncKey, SyncStats] = field(default_factory=dict)
    launches: dict[LaunchKey, int] = field(default_factory=dict)  # from the kernel
    lost: dict[LostKey, LostTotals] = field(default_factory=dict)  # from the kernel
    sites: dict[SiteKey, SiteStats] = field(default_factory=dict)  # with stacks on
    # What memtrace's probes cost it (core/overhead.py): traps from the kernel,
    # CPU time from /proc while it runs and from the kernel at its exit.
    traps: int = 0  # entry and return traps
    launch_traps: int = 0  # launch traps taken: its launches, or those counted while sampled
    # Its launches' return traps while a timeline was recorded: each a record (cuda
    # Options.launch_events), counted as the records come (those the ring could not take
    # are counted host-wide, launch_events_dropped).
    launch_returns: int = 0
    # The overhead budget's duty cycle for its launch probes (None: never
    # sampled: `launches` are exact; otherwise they are partly extrapolated).
    launch_duty: float | None = None
    # How far its sampled launches may be off, relative (0.0: counted; None:
    # it cannot be bounded, a gap seen by one window only: runtime/budget.py).
    launch_error: float | None = 0.0
    # It got its own launch link only after it may have launched (a child
    # forked from a process that had mapped the library): launches before are missing.
    launches_partial: bool = False
    cpu_ns: int | None = None
    cpu_final: bool = False

    @property
    def pid(self) -> int:
        return self.key.pid

    def copy_view(self) -> dict[CopyKey, CopyStats]:
        """Every copy key with its exact totals: what the events said, plus the
        calls whose events were lost (host memory unknown, direction as the
        kernel saw it)."""
        out = dict(self.copies)
        for lk, (calls, nbytes, errors, dur) in self.lost.items():
            a = apis.BY_ID.get(lk.api)
            if a is None or a.family != Family.COPY or calls == 0:
                continue
            key = CopyKey(lk.process, lk.api, lk.direction, HostMemory.UNKNOWN)
            base = out.get(key) or CopyStats()
            out[key] = CopyStats(
                base.calls + calls,
                base.bytes + nbytes,
                base.errors + errors,
                base.duration_ns + dur,
                base.events,
                base.durations,
                base.sizes,
            )
        return out

    def sync_view(self) -> dict[SyncKey, SyncStats]:
        out = dict(self.syncs)
        for lk, (calls, _b, errors, dur) in self.lost.items():
            a = apis.BY_ID.get(lk.api)
            if a is None or a.family != Family.SYNC or calls == 0:
                continue
            key = SyncKey(lk.process, lk.api)
            base = out.get(key) or SyncStats()
            out[key] = SyncStats(base.calls + calls, base.errors + errors, base.duration_ns + dur, base.durations)
        return out

    def in_use_by_stack(self) -> dict[int, int]:
        """Device memory still allocated, by the stack that allocated it."""
        out: dict[int, int] = {}
        live = self.memory.live
        for k, stack in self.memory.live_stack.items():
            if k in live:
                out[stack] = out.get(stack, 0) + live[k]
        return out

    def lost_memory_calls(self) -> int:
        """Memory calls whose event was lost: the address book may be incomplete."""
        return sum(v[0] for k, v in self.lost.items() if k.api in apis.BY_ID and apis.BY_ID[k.api].family == Family.MEM)

    def wall_ns(self, now_ns: int | None = None, since_ns: int = 0) -> int:
        """How long memtrace has watched this process."""
        start = max(self.start_ns or self.first_seen_ns, since_ns)
        end = self.exited_ns or (now_ns if now_ns is not None else time.time_ns())
        return max(end - start, 0)
