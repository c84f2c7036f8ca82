"""What every sensor is to the runtime (Tetragon's sensors): a unit that
measures one thing, with its own programs or handles, its loader and its
readings. The runtime makes and starts each one its own way (loading BPF,
opening NVML, a netlink socket), then polls it on its owner's schedule and
closes it. One that cannot start raises a MemtraceError with the fix; it
is then off, and the output says why (`host.sensors`, `memtrace doctor`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

R_co = TypeVar("R_co", covariant=True)


class Sensor(Protocol[R_co]):
    """`name`: what it measures, as the output names it (cuda, cpu, nccl,
    gpu, network, fast); `poll()`: what it measured since the last poll
    (or its cumulative readings, for a sensor whose counters are
    cumulative); `close()`: everything it holds goes, at once."""

    name: str

    def poll(self) -> R_co: ...

    def close(self) -> None: ...
