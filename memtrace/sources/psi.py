"""Pressure stall information (PSI, Linux 4.20+): the time tasks stalled
waiting for memory (reclaim, swap-in, thrashing), from /proc/pressure/memory
or a cgroup's memory.pressure. None where the kernel has no PSI (built
without it, or booted with psi=0)."""

from __future__ import annotations

from pathlib import Path

from memtrace.sources.procfs import KeptFile

PROC = Path("/proc/pressure")


def _some_total(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split():
                if field.startswith("total="):
                    return int(field[6:])
    return None


class Stall:
    """A pressure file read again and again, as the live diagnosis does
    twice a second: kept open, each reading one pread from its start (a
    pressure file is made anew at offset 0), several times cheaper than an
    open, read and close (sources/procfs.KeptFile). A file that fails is opened again at the next reading."""

    def __init__(self, resource: str = "memory", path: Path | None = None) -> None:
        self.path = path or PROC / resource
        self._file = KeptFile(self.path)

    def read_us(self) -> int | None:
        """Cumulative microseconds in which some task stalled; None: no PSI here (now)."""
        data = self._file.read()
        return None if data is None else _some_total(data.decode("ascii", "replace"))

    def close(self) -> None:
        self._file.close()
