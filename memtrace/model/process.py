"""What the model keeps per process and per call family."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessInfo
from memtrace.model.book import AddressBook

CopyKey = tuple[int, int, int, int]  # pid, api id, direction, host memory


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
    live: dict[tuple[int, int], int] = field(default_factory=dict)  # (kind, address or handle) -> bytes
    # For the leak signal: when memory was last given back, and how much was in use then.
    last_free_ns: int = 0
    in_use_at_last_free: int = 0

    @property
    def outstanding(self) -> int:
        return len(self.live)


@dataclass
class Process:
    pid: int
    name: str = ""
    exe: str = ""
    first_seen_ns: int = field(default_factory=time.time_ns)
    start_ns: int = 0  # when the process started (0: unknown)
    start_ticks: int = 0  # the same, in clock ticks since boot (exact, for ordering)
    exited: bool = False
    exited_ns: int = 0
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource
    # Seen from before its first CUDA call: an untracked host pointer is pageable.
    complete: bool = False
    memory: DeviceMemory = field(default_factory=DeviceMemory)
    book: AddressBook = field(default_factory=AddressBook)

    @classmethod
    def identified(cls, pid: int, info: ProcessInfo) -> Process:
        return cls(
            pid,
            name=info.name,
            exe=info.exe,
            start_ns=info.start_ns,
            start_ticks=info.start_ticks,
            attributes={"process.pid": pid, **info.attributes},
        )

    def wall_ns(self, now_ns: int | None = None, since_ns: int = 0) -> int:
        """How long memtrace has watched this process."""
        start = max(self.start_ns or self.first_seen_ns, since_ns)
        end = self.exited_ns or (now_ns if now_ns is not None else time.time_ns())
        return max(end - start, 0)
