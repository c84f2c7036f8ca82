"""The domain model: processes, copy totals and duration histograms.

Totals (calls, bytes, errors) come from the kernel's maps and are exact;
durations come from the events, so a lost event affects a histogram, never
a total. Nothing here knows of ctypes, BPF or OTLP.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import apis, resources
from .abi import Direction, Layer
from .histogram import ExpHistogram

CopyKey = tuple[int, int, int]  # pid, api id, direction


@dataclass
class CopyStats:
    calls: int = 0
    bytes: int = 0
    errors: int = 0
    duration_ns: int = 0
    events: int = 0  # events received for this key (calls - events were dropped)
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds, every call
    sizes: ExpHistogram = field(default_factory=ExpHistogram)  # bytes, successful calls


@dataclass
class Process:
    pid: int
    name: str = ""
    exe: str = ""
    first_seen_ns: int = field(default_factory=time.time_ns)
    start_ns: int = 0  # when the process started (0: unknown)
    exited: bool = False
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource

    @classmethod
    def probe(cls, pid: int) -> Process:
        """Read what identifies the process now: it may be gone by export time."""
        p = cls(pid)
        try:
            p.name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            pass
        try:
            p.exe = str(Path(f"/proc/{pid}/exe").readlink())
        except OSError:
            pass
        p.attributes = resources.process_attributes(pid, p.name, p.exe)
        p.start_ns = process_start_ns(pid)
        return p


_BOOT_NS: int | None = None


def process_start_ns(pid: int) -> int:
    """Wall-clock start of a process (/proc/PID/stat starttime + boot time), 0 if gone."""
    global _BOOT_NS
    try:
        if _BOOT_NS is None:
            btime = next(l for l in Path("/proc/stat").read_text().splitlines() if l.startswith("btime"))
            _BOOT_NS = int(btime.split()[1]) * 1_000_000_000
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return _BOOT_NS + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return 0


class Model:
    def __init__(self) -> None:
        self.copies: dict[CopyKey, CopyStats] = {}
        self.processes: dict[int, Process] = {}
        self.events = 0

    def _process(self, pid: int) -> Process:
        p = self.processes.get(pid)
        if p is None:
            p = self.processes[pid] = Process.probe(pid)
        return p

    def add_events(self, batch: np.ndarray) -> None:
        """Fold a batch of decoded mt_event records into the histograms."""
        if len(batch) == 0:
            return
        self.events += len(batch)
        keys = (
            batch["pid"].astype(np.uint64) << np.uint64(24)
            | batch["api"].astype(np.uint64) << np.uint64(8)
            | batch["direction"].astype(np.uint64)
        )
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        durations = batch["duration_ns"][order].astype(np.float64) * 1e-9
        ok = batch["ret"][order] == 0
        sizes = batch["bytes"][order].astype(np.float64)
        uniq, starts = np.unique(keys, return_index=True)
        ends = np.append(starts[1:], len(keys))
        for k, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist(), strict=True):
            key = (k >> 24, (k >> 8) & 0xFFFF, k & 0xFF)
            st = self.copies.get(key)
            if st is None:
                st = self.copies[key] = CopyStats()
                self._process(key[0])
            st.events += e - s
            st.durations.add(durations[s:e])
            st.sizes.add(sizes[s:e][ok[s:e]])

    def set_totals(self, pid: int, api: int, direction: int, calls: int, nbytes: int, errors: int, dur: int) -> None:
        key = (pid, api, direction)
        st = self.copies.get(key)
        if st is None:
            st = self.copies[key] = CopyStats()
            self._process(pid)
        st.calls, st.bytes, st.errors, st.duration_ns = calls, nbytes, errors, dur

    def process_exited(self, pid: int) -> None:
        if pid in self.processes:
            self.processes[pid].exited = True

    def forget(self, pid: int) -> None:
        self.processes.pop(pid, None)
        for k in [k for k in self.copies if k[0] == pid]:
            del self.copies[k]


def describe(key: CopyKey) -> tuple[str, str, str, bool]:
    """(layer, api, direction, synchronous) labels of a copy key."""
    api = apis.BY_ID.get(key[1])
    layer = api.layer.label if api else Layer.DRIVER.label
    try:
        direction = Direction(key[2]).label
    except ValueError:
        direction = Direction.UNKNOWN.label
    return layer, apis.api_name(key[1]), direction, bool(api and api.synchronous)
