"""Who a process is."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcessInfo:
    """What identifies a process, read once when memtrace first meets it:
    it may be gone by the time it is exported."""

    name: str = ""
    exe: str = ""
    start_ticks: int = 0  # clock ticks since boot (exact, for ordering); 0: unknown
    start_ns: int = 0  # the same as wall-clock time
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource
