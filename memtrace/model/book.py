"""Per-process address books: the ranges a process's own calls made
device, pinned or managed memory, applied in ring order."""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np

from memtrace.core.arrays import unique_inverse

_TOP = 2**64 - 1  # the highest address: ranges end there at the latest
# What an address book says of a pointer. _DRIVER: host memory the GPU driver
# had mapped into a process before tracing began (pinned, of unknown allocations).
_UNTRACKED, _DEVICE, _PINNED, _MANAGED, _DRIVER = 0, 1, 2, 3, 4


class BookChanges(NamedTuple):
    """What a batch's memory calls do to address books, one row per change."""

    proc: np.ndarray  # the process, as an index into the batch's processes
    at: np.ndarray  # the call's position in the batch (ring order)
    add: np.ndarray  # True: add the range start..start+size; False: remove the one at start
    start: np.ndarray
    size: np.ndarray
    what: np.ndarray  # _DEVICE, _PINNED or _MANAGED, for an addition


class AddressBook:
    """Ranges a process's own calls made device, pinned or managed memory.

    Ranges never overlap (a new one replaces any it overlaps: the end of the
    old one was lost), so a pointer is in at most one: the one with the
    greatest start at or below it."""

    def __init__(self) -> None:
        self.ranges: dict[int, tuple[int, int]] = {}  # start -> (end, what)
        self._starts: list[int] = []  # sorted
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.pinned_bytes = 0

    def add(self, start: int, size: int, what: int) -> None:
        end = min(start + max(size, 1), _TOP)  # a range never wraps past the address space
        starts, ranges = self._starts, self.ranges
        i = bisect.bisect_left(starts, start)
        if i and ranges[starts[i - 1]][0] > start:
            i -= 1  # the range below reaches into the new one
        while i < len(starts) and starts[i] < end:
            self._drop(starts[i])
        starts.insert(i, start)  # everything below i starts before it, the rest at or past its end
        ranges[start] = (end, what)
        if what == _PINNED:
            self.pinned_bytes += end - start
        self._arrays = None

    def remove(self, start: int) -> bool:
        r = self.ranges.pop(start, None)
        if r is None:
            return False
        self._forget(start, r)
        return True

    def _drop(self, start: int) -> None:
        self._forget(start, self.ranges.pop(start))

    def _forget(self, start: int, r: tuple[int, int]) -> None:
        starts = self._starts
        del starts[bisect.bisect_left(starts, start)]
        if r[1] == _PINNED:
            self.pinned_bytes -= r[0] - start
        self._arrays = None

    def replay(self, ch: BookChanges, q_at: np.ndarray, q_ptr: np.ndarray) -> np.ndarray:
        """Apply a batch's changes to this book in ring order and say what
        each queried pointer was at its ring position q_at."""
        out = self._replay_at_once(ch, q_at, q_ptr)
        if out is not None:
            return out
        # Ranges of the batch overlap ones that start elsewhere: a change may
        # drop its neighbours, so go through the changes one by one.
        out = np.zeros(len(q_ptr), np.uint8)
        order = np.argsort(q_at, kind="stable")
        q_at, q_ptr = q_at[order], q_ptr[order]
        lo = 0
        rows = zip(*(f.tolist() for f in (ch.at, ch.add, ch.start, ch.size, ch.what)), strict=True)
        for at, add, start, size, what in rows:
            hi = int(np.searchsorted(q_at, at))
            if hi > lo:
                out[order[lo:hi]] = self.lookup(q_ptr[lo:hi])
                lo = hi
            if add:
                self.add(start, size, what)
            else:
                self.remove(start)
        if lo < len(q_ptr):
            out[order[lo:]] = self.lookup(q_ptr[lo:])
        return out

    def _replay_at_once(self, ch: BookChanges, q_at: np.ndarray, q_ptr: np.ndarray) -> np.ndarray | None:
        """replay() without a Python step per change, when every range that
        exists at any moment of the batch (the book's and the batch's) ends
        before the next start: then a range is only ever replaced by one at
        the same start, a pointer can only be in the range at the greatest
        start at or below it, and what is there at a moment is what the last
        change of that start before it left (or the book, if none). JAX
        allocates and frees one staging buffer around every transfer; this
        is what makes that cheap. None when ranges of different starts overlap."""
        b_start, b_end, b_what = self._as_arrays()
        op_at, op_add, op_start, op_size, op_what = ch.at, ch.add, ch.start, ch.size, ch.what
        add = op_add.nonzero()[0]
        op_end = op_start + np.minimum(np.maximum(op_size, 1), np.uint64(_TOP) - op_start)  # as add() clamps
        # Every range that exists at some moment: the book's and the batch's.
        u, inv = unique_inverse(np.concatenate([b_start, op_start[add]]))
        if len(u) == 0:
            return np.zeros(len(q_ptr), np.uint8)  # nothing tracked; removals change nothing
        reach = np.zeros(len(u), np.uint64)
        np.maximum.at(reach, inv, np.concatenate([b_end, op_end[add]]))
        if np.any(reach[:-1] > u[1:]):
            return None
        # The states each start goes through: the book's (before the batch,
        # at moment 0), then one per change of the batch (at its position + 1;
        # a removal leaves end 0; a start that never held a range is skipped).
        ui = np.minimum(np.searchsorted(u, op_start), len(u) - 1)
        touched = (u[ui] == op_start).nonzero()[0]
        c_start = np.concatenate([inv[: len(b_start)], ui[touched]])
        c_at = np.concatenate([np.zeros(len(b_start), np.int64), op_at[touched].astype(np.int64) + 1])
        c_end = np.concatenate([b_end, np.where(op_add[touched], op_end[touched], 0)])
        c_what = np.concatenate([b_what, op_what[touched]])
        span = max(int(c_at.max()), int(q_at.max(initial=0)) + 1) + 1
        key = c_start * span + c_at
        order = np.argsort(key, kind="stable")
        # A query: the greatest start at or below it, and that start's last state before it.
        qi = np.searchsorted(u, q_ptr, side="right").astype(np.int64) - 1
        j = np.searchsorted(key[order], np.maximum(qi, 0) * span + q_at.astype(np.int64) + 1, side="right") - 1
        k = order[np.maximum(j, 0)]
        hit = (qi >= 0) & (j >= 0) & (c_start[k] == qi) & (q_ptr < c_end[k])
        out = np.where(hit, c_what[k], _UNTRACKED).astype(np.uint8)
        # What the batch leaves: each start's last state, where the batch changed it.
        by_start = c_start[order]
        for i in order[np.append(by_start[1:] != by_start[:-1], True).nonzero()[0]].tolist():
            if c_at[i] == 0:
                continue  # untouched by the batch
            start, end = int(u[c_start[i]]), int(c_end[i])
            if end:
                self.add(start, end - start, int(c_what[i]))
            else:
                self.remove(start)
        return out

    def _as_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            starts = np.array(self._starts, dtype=np.uint64)
            ends = np.array([self.ranges[s][0] for s in self._starts], dtype=np.uint64)
            whats = np.array([self.ranges[s][1] for s in self._starts], dtype=np.uint8)
            self._arrays = (starts, ends, whats)
        return self._arrays

    def lookup(self, ptrs: np.ndarray) -> np.ndarray:
        """What each pointer is: _UNTRACKED, _DEVICE, _PINNED or _MANAGED."""
        if not self.ranges:
            return np.zeros(len(ptrs), np.uint8)
        starts, ends, whats = self._as_arrays()
        i = np.searchsorted(starts, ptrs, side="right") - 1
        ok = i >= 0
        j = np.where(ok, i, 0)
        inside = ok & (ptrs < ends[j])
        return np.where(inside, whats[j], _UNTRACKED).astype(np.uint8)
