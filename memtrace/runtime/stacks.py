"""The call stacks of copies and memory calls: taken from the kernel as the
drain meets them, named when a report asks.

The kernel keeps each stack in `stack_frames` under a hash of its addresses
and its process until it is read here; what is read is deleted there (the
same stack comes back under the same key, which this table then has) and
kept here. Addresses mean something only in their process's address space,
so each is placed in its file (file, offset) at once, with the process's
maps: read when the process was stopped on a CUDA library mapping, and
again when an address lies outside what was read, if the process still
runs. The files are kept open (sources/symbols.py), so frames are named
after the process is gone. An address no map of its process covered is
named `[unknown]`, never guessed.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np

from memtrace.core.abi import Stack as RawStack
from memtrace.core.ids import ProcessKey
from memtrace.core.stacks import NO_STACK, NativeFrame, Stack
from memtrace.sources.procfs import is_running
from memtrace.sources.symbols import Mapping, Module, Modules

# A frame placed in its file: (the file, or None when no map covered it; the
# offset in the file, or the address).
_Placed = tuple[Module | None, int]


class _Maps:
    """One process's executable mappings, for placing addresses."""

    def __init__(self, mappings: list[Mapping]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self.starts, end) - 1
        return i >= 0 and self.mappings[i].end > start

    def place(self, ip: int) -> _Placed | None:
        i = bisect.bisect_right(self.starts, ip) - 1
        if i >= 0 and ip < self.mappings[i].end:
            m = self.mappings[i]
            return m.module, ip - m.start + m.pgoff
        return None


class StackTable:
    MAX_STACKS = 65536  # stacks kept; a further new stack is counted, not kept
    MAX_PROCESS_MAPS = 4096  # processes whose maps are kept (the least recently used go)

    def __init__(self, take: Callable[[int], RawStack | None]) -> None:
        self._take = take  # reads (and deletes) a stack from the kernel's map
        self.modules = Modules()
        self._maps: OrderedDict[ProcessKey, _Maps] = OrderedDict()
        self._placed: dict[int, tuple[_Placed, ...]] = {}
        self._named: dict[int, Stack] = {}
        self.not_found = 0  # keys the kernel's map did not have (never expected: counted)
        self.not_kept = 0  # new stacks past MAX_STACKS
        self.unplaced_frames = 0  # addresses no map of their process covered
        # The drain adds, the control thread learns, a report names: one at a time.
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.modules.close()
            self._maps.clear()

    @property
    def distinct(self) -> int:
        return len(self._placed)

    def learn(self, key: ProcessKey) -> None:
        """A process stopped on a library mapping: read its maps while it is."""
        with self._lock:
            self._learn(key)

    def _learn(self, key: ProcessKey) -> _Maps | None:
        if not is_running(key):
            return None
        mappings = self.modules.learn(key.pid)
        if not is_running(key):  # the pid was reused while its maps were read
            return None
        old = self._maps.get(key)
        if old is not None:
            # An exiting process shows no maps: what was read before stays,
            # where nothing mapped since lies over it.
            fresh = _Maps(mappings)
            mappings += [o for o in old.mappings if not fresh.overlaps(o.start, o.end)]
        m = self._maps[key] = _Maps(mappings)
        self._maps.move_to_end(key)
        while len(self._maps) > self.MAX_PROCESS_MAPS:
            self._maps.popitem(last=False)
        return m

    def add(self, batch: np.ndarray) -> None:
        """Take the stacks a batch of events names that this table does not have yet."""
        keys = batch["stack"]
        if not keys.any():
            return
        uniq, first = np.unique(keys, return_index=True)
        pids, starts = batch["pid"][first].tolist(), batch["start_ns"][first].tolist()
        with self._lock:
            for key, pid, start in zip(uniq.tolist(), pids, starts, strict=True):
                if key == NO_STACK or key in self._placed:
                    continue
                self._add(key, ProcessKey(pid, start))

    def _add(self, key: int, proc: ProcessKey) -> None:
        raw = self._take(key)
        if raw is None:
            self.not_found += 1
            return
        if len(self._placed) >= self.MAX_STACKS:
            self.not_kept += 1
            return
        maps = self._maps.get(proc)
        relearnt = False
        placed: list[_Placed] = []
        ips = list(raw.ips[: min(raw.nframes, len(raw.ips))])
        while ips and ips[-1] == 0:  # where a walk without frame pointers ended: no frame
            ips.pop()
        for ip in ips:
            p = maps.place(ip) if maps is not None else None
            if p is None and not relearnt:
                relearnt = True  # a library mapped since: read the maps again, once per stack
                maps = self._learn(proc) or maps
                p = maps.place(ip) if maps is not None else None
            if p is None:
                self.unplaced_frames += 1
                p = (None, ip)
            placed.append(p)
        self._placed[key] = tuple(placed)

    def stack(self, key: int) -> Stack | None:
        """The named frames of a stack, innermost first; None for a call
        without one (or a stack not kept)."""
        named = self._named.get(key)
        if named is not None:
            return named
        placed = self._placed.get(key)
        if placed is None:
            return None
        named = self._named[key] = tuple(self._name(m, off, i) for i, (m, off) in enumerate(placed))
        return named

    def _name(self, m: Module | None, offset: int, depth: int) -> NativeFrame:
        if m is None:
            return NativeFrame("[unknown]", None, offset)
        # A caller's frame holds its return address: the call lies just before it.
        fn = self.modules.symbols(m).function_at(offset - 1 if depth else offset)
        return NativeFrame(m.name, fn, offset, self.modules.build_id(m))

    def stacks(self, keys: Iterable[int]) -> dict[int, Stack]:
        """The named frames of these stacks (those this table has)."""
        out: dict[int, Stack] = {}
        with self._lock:
            for k in keys:
                s = self.stack(k)
                if s is not None:
                    out[k] = s
        return out
