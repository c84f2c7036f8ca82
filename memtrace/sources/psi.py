"""Pressure stall information (PSI, Linux 4.20+): the time tasks stalled
waiting for memory (reclaim, swap-in, thrashing), from /proc/pressure/memory
or a cgroup's memory.pressure. None where the kernel has no PSI (built
without it, or booted with psi=0)."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc/pressure")


def stall_us(resource: str = "memory", path: Path | None = None) -> int | None:
    """Cumulative microseconds in which some task stalled on `resource`; None: no PSI here."""
    try:
        text = (path or PROC / resource).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split():
                if field.startswith("total="):
                    return int(field[6:])
    return None
