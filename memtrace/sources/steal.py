"""Steal time: the time a virtual CPU was ready to run and the hypervisor ran
something else (another VM on the same host), per CPU, from /proc/stat's
eighth column. Inside the guest nothing shows it: the task is on its CPU,
no run queue grows, no PSI stall counts; only its work takes longer. On a
cloud VM it is the noisy neighbour the guest cannot see otherwise
(docs/diagnosis.md#cpu_interference)."""

from __future__ import annotations

import os
from pathlib import Path

from memtrace.sources.procfs import KeptFile

STAT = Path("/proc/stat")


def parse(text: str, ns_per_tick: int) -> dict[int, int]:
    """Each CPU's cumulative steal time (ns) from /proc/stat's text; a CPU whose
    line has no steal column (kernels before 2.6.11) is left out."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        f = line.split()
        if len(f) > 8 and f[0][3:].isdigit():
            out[int(f[0][3:])] = int(f[8]) * ns_per_tick
    return out


class Steal:
    """/proc/stat read again and again (twice a second by the live diagnosis): kept open, each
    reading one pread from its start (sources/procfs.KeptFile), as sources/psi.Stall does."""

    def __init__(self, path: Path = STAT) -> None:
        self.path = path
        self.ns_per_tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        self._file = KeptFile(path)

    def read(self) -> dict[int, int] | None:
        """Each CPU's cumulative steal ns; None where /proc/stat cannot be read."""
        data = self._file.read()
        return None if data is None else parse(data.decode("ascii", "replace"), self.ns_per_tick)

    def close(self) -> None:
        self._file.close()


def share(
    before: dict[int, int], after: dict[int, int], cpus: set[int] | frozenset[int], seconds: float
) -> float | None:
    """The share of `seconds` the hypervisor took from the CPUs `cpus`, on average (0..1);
    None where none of them was read both times or no time passed."""
    common = [c for c in cpus if c in before and c in after]
    if not common or seconds <= 0:
        return None
    stolen = sum(max(after[c] - before[c], 0) for c in common)
    return min(stolen / (len(common) * seconds * 1e9), 1.0)
