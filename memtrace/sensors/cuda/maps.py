"""What the CUDA sensor's maps hold, read as typed values: the kernel's
totals per process (calls the ring could not take, launches, traps), its
health counters, the processes it traces, and the stacks and Python code
objects it took."""

from __future__ import annotations

import ctypes
import logging

from memtrace.bpf.libbpf import BpfObject, Libbpf, Map
from memtrace.core import apis
from memtrace.core.abi import (
    STAT_COUNT,
    TRAPS_API,
    Family,
    PyCode,
    PyCodeKey,
    PyProc,
    Stack,
    Stat,
    Totals,
    TotalsKey,
)
from memtrace.core.ids import ProcessKey
from memtrace.sensors.cuda.holds import HELD_MAP

log = logging.getLogger("memtrace")

LAUNCH_APIS = tuple(a.id for a in apis.APIS if a.family == Family.LAUNCH)
MAP_NAMES = (
    "lost", "counts", "stats", "traced", "attached", HELD_MAP, "inflight", "fresh", "stack_frames",
    "py_procs", "py_codes", "launch_own", "launch_linked", "launch_window", "launch_sampling", "slots",
)  # fmt: skip


class KernelMaps:
    """The loaded object's maps, by name, and their typed readers."""

    def __init__(self, obj: BpfObject) -> None:
        self.by_name: dict[str, Map] = {n: obj.map(n) for n in MAP_NAMES}
        # The kernel's `lost` and `counts` keys of each process, as read by
        # lost() and counts(): forgetting a process deletes these alone.
        self._kernel_keys: dict[ProcessKey, set[tuple[str, bytes]]] = {}

    def __getitem__(self, name: str) -> Map:
        return self.by_name[name]

    # ---- the processes traced ----

    def trace_pid(self, pid: int) -> None:
        """Trace this process and the children it forks from now on (`memtrace run`'s scope)."""
        self.by_name["traced"].update(ctypes.c_uint32(pid), ctypes.c_uint8(1))

    def traced_pids(self) -> list[int]:
        return [k.value for k in self.by_name["traced"].keys(ctypes.c_uint32)]

    def is_fresh(self, key: ProcessKey) -> bool:
        """Was the process forked after the programs were attached?"""
        return self.by_name["fresh"].lookup(ctypes.c_uint32(key.pid), ctypes.c_uint8())

    # ---- the kernel's totals ----

    def _index(self, name: str, k: TotalsKey) -> None:
        self._kernel_keys.setdefault(ProcessKey(k.pid, k.start_ns), set()).add((name, bytes(k)))

    def lost(self) -> list[tuple[TotalsKey, Totals]]:
        """Calls the events ring could not take, counted by the kernel."""
        m = self.by_name["lost"]
        out = []
        for k in m.keys(TotalsKey):
            v = Totals()
            if m.lookup(k, v):
                out.append((k, v))
                self._index("lost", k)
        return out

    def counts(self) -> list[tuple[TotalsKey, int]]:
        """Launches per (process, api), counted by the kernel; under api
        TRAPS_API, the entry and return traps each process took."""
        m = self.by_name["counts"]
        out = []
        for k in m.keys(TotalsKey):
            v = ctypes.c_uint64()
            if m.lookup(k, v):
                out.append((k, v.value))
                self._index("counts", k)
        return out

    def process_counts(self, key: ProcessKey) -> tuple[dict[int, int], int]:
        """One process's launch counts by api and its entry and return traps,
        read key by key (never a walk of the map): what the budget reads
        at each window's edge."""
        m = self.by_name["counts"]
        v = ctypes.c_uint64()
        launches = {}
        for api in LAUNCH_APIS:
            if m.lookup(TotalsKey(key.start_ns, key.pid, api, 0, 0), v):
                launches[api] = v.value
        traps = v.value if m.lookup(TotalsKey(key.start_ns, key.pid, TRAPS_API, 0, 0), v) else 0
        return launches, traps

    def forget_process(self, key: ProcessKey) -> None:
        """Delete a process's kernel totals: the keys lost() and counts() read
        for it (it has exited, and they were read after that), one syscall
        each, never a walk of the whole maps."""
        self.by_name["fresh"].delete(ctypes.c_uint32(key.pid))
        for name, raw in self._kernel_keys.pop(key, set()):
            self.by_name[name].delete(TotalsKey.from_buffer_copy(raw))

    def stats(self) -> dict[Stat, int]:
        ncpu = Libbpf.get().lib.libbpf_num_possible_cpus()
        vals = (ctypes.c_uint64 * ncpu)()
        out = {}
        for s in Stat:
            out[s] = sum(vals) if self.by_name["stats"].lookup(ctypes.c_uint32(s), vals) else 0
        assert len(Stat) == STAT_COUNT
        return out

    def inflight_count(self) -> int:
        """Calls in flight now: claimed slots, plus entries in the overflow hash."""
        slots = self.by_name["slots"]
        # The slot's owner word, then its call: sized by the map itself (struct mt_slot).
        value = (ctypes.c_uint64 * (slots.value_size // 8))()
        busy = sum(1 for i in range(slots.max_entries) if slots.lookup(ctypes.c_uint32(i), value) and value[0])
        return busy + sum(1 for _ in self.by_name["inflight"].keys(ctypes.c_uint64))

    # ---- stacks and Python frames ----

    def tell_python(self, key: ProcessKey, config: PyProc | None) -> None:
        """Where a process's interpreter keeps its state, for BPF's walk of
        its Python frames (None: walk it no more; a process that reused the
        pid since keeps its own). A full map leaves the process without
        Python frames, which its stacks say."""
        pid = ctypes.c_uint32(key.pid)
        procs = self.by_name["py_procs"]
        if config is None:
            cur = PyProc()
            if procs.lookup(pid, cur) and cur.start_ns == key.start_ns:
                procs.delete(pid)
            return
        try:
            procs.update(pid, config)
        except OSError as e:
            log.warning("pid %d: Python frames not taken: %s", key.pid, e)

    def take_py_codes(self) -> list[tuple[PyCodeKey, PyCode]]:
        """What the code objects of new stacks said (memtrace.h), deleted there once read."""
        m = self.by_name["py_codes"]
        out: list[tuple[PyCodeKey, PyCode]] = []
        for k in list(m.keys(PyCodeKey)):
            v = PyCode()
            if m.lookup(k, v):
                out.append((k, v))
            m.delete(k)
        return out

    def take_stack(self, key: int) -> Stack | None:
        """A stack from `stack_frames`, deleted there once read (memtrace.h); None if absent."""
        k = ctypes.c_uint64(key)
        v = Stack()
        if not self.by_name["stack_frames"].lookup(k, v):
            return None
        self.by_name["stack_frames"].delete(k)
        return v
