"""Who a process is."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import NamedTuple


class ProcessKey(NamedTuple):
    """A process: its pid (the host's tgid) and when it started, as the
    kernel counts it (the thread group leader's start_boottime, ns since
    boot). Pids are reused; (pid, start) is not."""

    pid: int
    start_ns: int  # CLOCK_BOOTTIME ns; 0: unknown


def iso8601_ns(unix_ns: int) -> str:
    """A wall-clock time as ISO 8601 in UTC, to the nanosecond (OTel's
    process.creation.time): stable, so a resource keeps one identity."""
    secs, ns = divmod(unix_ns, 1_000_000_000)
    t = datetime.datetime.fromtimestamp(secs, tz=datetime.timezone.utc)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d}Z"


@dataclass(frozen=True)
class ProcessInfo:
    """What the host adds to a process's BPF identity, read once when
    memtrace first meets it (it may be gone by the time it is exported):
    never its name or start, which BPF gives."""

    name: str = ""  # used only when BPF could not say (its notice was lost)
    exe: str = ""
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource: container, pod, executable
    ppid: int = 0  # its parent when memtrace met it (0: not known): a job's ranks share a launcher
