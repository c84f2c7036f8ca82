"""The domain model: processes, their copies, device memory, waits and
launches, built from the kernel's event batches.

Every completed call is one event; a call whose event the ring could not
take is counted by the kernel (`lost`) and added here under host memory
"unknown", so totals stay exact. Launches are counted in the kernel.

Host memory and unified directions are decided here, in ring order: each
process has an address book of the ranges its own calls made pinned,
managed or device memory, and a copy's pointers are looked up in it as it
stood when the copy returned. Nothing here knows of ctypes, BPF or OTLP.
"""

from __future__ import annotations

import bisect
import enum
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import apis, resources
from .abi import Direction, Family, Layer
from .apis import MemOp
from .histogram import ExpHistogram, add_grouped


class HostMemory(enum.IntEnum):
    NONE = 0  # the copy touches no host memory (d2d, peer)
    PINNED = 1  # page-locked: cudaHostAlloc, cudaMallocHost, cudaHostRegister and driver twins
    PAGEABLE = 2  # ordinary host memory
    MANAGED = 3  # cudaMallocManaged / cuMemAllocManaged
    UNKNOWN = 4  # not decidable: the process ran before memtrace, or its event was lost

    @property
    def label(self) -> str | None:
        return None if self is HostMemory.NONE else self.name.lower()


_TOP = 2**64 - 1  # the highest address: ranges end there at the latest
# What an address book says of a pointer.
_UNTRACKED, _DEVICE, _PINNED, _MANAGED = 0, 1, 2, 3

CopyKey = tuple[int, int, int, int]  # pid, api id, direction, host memory


@dataclass
class CopyStats:
    calls: int = 0
    bytes: int = 0
    errors: int = 0
    duration_ns: int = 0
    events: int = 0  # calls seen as events (the rest were lost from the ring)
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds, every call seen
    sizes: ExpHistogram = field(default_factory=ExpHistogram)  # bytes, successful calls seen


@dataclass
class SyncStats:
    calls: int = 0
    errors: int = 0
    duration_ns: int = 0
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds


@dataclass
class DeviceMemory:
    """Device memory a process allocated through the calls memtrace sees:
    device, pitched, stream-ordered and managed allocations, and physical
    memory created for VMM mappings."""

    allocations: int = 0
    allocated_bytes: int = 0
    frees: int = 0
    freed_bytes: int = 0
    unknown_frees: int = 0  # frees of addresses or handles memtrace never saw allocated
    failed_allocations: int = 0
    in_use_bytes: int = 0
    peak_bytes: int = 0
    sizes: ExpHistogram = field(default_factory=ExpHistogram)  # bytes per allocation
    live: dict[tuple[int, int], int] = field(default_factory=dict)  # (kind, address or handle) -> bytes
    # For the leak signal: when memory was last given back, and how much was in use then.
    last_free_ns: int = 0
    in_use_at_last_free: int = 0

    @property
    def outstanding(self) -> int:
        return len(self.live)


class BookChanges(NamedTuple):
    """What a batch's memory calls do to address books, one row per change."""

    pid: np.ndarray
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
        u, inv = np.unique(np.concatenate([b_start, op_start[add]]), return_inverse=True)
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

    def lookup_one(self, ptr: int) -> int:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return _UNTRACKED
        end, what = self.ranges[self._starts[i]]
        return what if ptr < end else _UNTRACKED

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


@dataclass
class Process:
    pid: int
    name: str = ""
    exe: str = ""
    first_seen_ns: int = field(default_factory=time.time_ns)
    start_ns: int = 0  # when the process started (0: unknown)
    start_ticks: int = 0  # the same, in clock ticks since boot (exact, for ordering)
    exited: bool = False
    exited_ns: int = 0
    attributes: dict[str, str | int] = field(default_factory=dict)  # OTLP resource
    # Seen from before its first CUDA call: an untracked host pointer is pageable.
    complete: bool = False
    memory: DeviceMemory = field(default_factory=DeviceMemory)
    book: AddressBook = field(default_factory=AddressBook)

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
        p.start_ticks = process_start_ticks(pid)
        p.start_ns = start_ns_of(p.start_ticks)
        return p

    def wall_ns(self, now_ns: int | None = None, since_ns: int = 0) -> int:
        """How long memtrace has watched this process."""
        start = max(self.start_ns or self.first_seen_ns, since_ns)
        end = self.exited_ns or (now_ns if now_ns is not None else time.time_ns())
        return max(end - start, 0)


def process_start_ticks(pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/PID/stat), 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def boot_ticks_now() -> int:
    """Now, in the clock ticks /proc/PID/stat counts process starts in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def start_ns_of(ticks: int) -> int:
    """Wall-clock time of a start in ticks since boot (0 if unknown)."""
    if not ticks:
        return 0
    boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return boot_ns + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def process_start_ns(pid: int) -> int:
    """Wall-clock start of a process, 0 if gone."""
    return start_ns_of(process_start_ticks(pid))


# Per-api lookup tables for vectorised decoding.
_FAMILY = np.full(1 << 16, Family.COPY, np.uint8)  # an id this version does not know: kept as a copy
for _a in apis.APIS:
    _FAMILY[_a.id] = int(_a.family)
_H2H, _H2D, _D2H, _D2D, _DEF = (
    int(d) for d in (Direction.H2H, Direction.H2D, Direction.D2H, Direction.D2D, Direction.DEFAULT)
)


def _exact_sums(v: np.ndarray, starts: np.ndarray) -> list[int]:
    """Per-group sums of u64 values (groups start at `starts`), without wrapping."""
    if len(v) and int(v.max()) >= (1 << 64) // len(v):
        ends = np.append(starts[1:], len(v)).tolist()
        return [sum(v[s:e].tolist()) for s, e in zip(starts.tolist(), ends, strict=True)]
    return np.add.reduceat(v.astype(np.uint64), starts).tolist() if len(v) else []


# What a successful memory call does to its address book, by api id: a host
# allocation or registration adds a pinned range, their undoing drops it; any
# other memory call is decided by _memory_call (device memory, VMM).
_NOTHING, _ADD_RANGE, _DROP_RANGE, _OTHER_CALL = 0, 1, 2, 3
_BOOK_ACTION = np.full(1 << 16, _NOTHING, np.uint8)
for _a in apis.APIS:
    if _a.op in (MemOp.HOST_ALLOC, MemOp.HOST_REGISTER):
        _BOOK_ACTION[_a.id] = _ADD_RANGE
    elif _a.op in (MemOp.HOST_FREE, MemOp.HOST_UNREGISTER):
        _BOOK_ACTION[_a.id] = _DROP_RANGE
    elif _a.family == Family.MEM:
        _BOOK_ACTION[_a.id] = _OTHER_CALL


def _host_kind(what: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """A pointer's host memory kind; device memory where host memory was named is unknown.
    An untracked pointer is pageable in a process seen whole (`complete`), else unknown."""
    out = np.full(len(what), HostMemory.UNKNOWN, np.uint8)
    out[what == _PINNED] = HostMemory.PINNED
    out[what == _MANAGED] = HostMemory.MANAGED
    out[(what == _UNTRACKED) & complete] = HostMemory.PAGEABLE
    return out


class Model:
    def __init__(self, complete_after_ticks: int | None = None) -> None:
        self.copies: dict[CopyKey, CopyStats] = {}
        self.syncs: dict[tuple[int, int], SyncStats] = {}
        self.launches: dict[tuple[int, int], int] = {}  # (pid, api) -> launches, from the kernel
        self.lost: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}  # from the kernel
        self.processes: dict[int, Process] = {}
        self.events = 0
        # A process that started after this (clock ticks since boot) was
        # traced from its first CUDA call; None: every process is (`memtrace run`).
        self.complete_after_ticks = complete_after_ticks
        # Asks the kernel whether a process was forked once the probes were
        # live (exact even when it is gone before its events are decoded).
        self.forked_since_start: Callable[[int], bool] = lambda pid: False

    def _process(self, pid: int) -> Process:
        p = self.processes.get(pid)
        if p is None:
            p = self.processes[pid] = Process.probe(pid)
            after = self.complete_after_ticks
            p.complete = after is None or p.start_ticks > after or self.forked_since_start(pid)
        return p

    def mark_complete(self, pid: int) -> None:
        """The process was held before its CUDA library ran: nothing was missed."""
        self._process(pid).complete = True

    # ---- events ----

    def add_events(self, batch: np.ndarray) -> None:
        """Fold a batch of decoded mt_event records, in ring order."""
        if len(batch) == 0:
            return
        self.events += len(batch)
        fam = _FAMILY[batch["api"]]
        copies = np.flatnonzero(fam == Family.COPY)
        mem = np.flatnonzero(fam == Family.MEM)
        ops = self._memory_calls(batch[mem], mem) if len(mem) else None
        if len(copies) or ops is not None:
            src_what, dst_what = self._what_copies_touch(batch, copies, ops)
        if len(copies):
            b = batch[copies]
            direction, host = self._resolve(b, src_what, dst_what)
        if len(copies):
            self._add_copies(b, direction, host)
        syncs = fam == Family.SYNC
        if syncs.any():
            self._add_syncs(batch[syncs])

    def _what_copies_touch(
        self, batch: np.ndarray, copies: np.ndarray, ops: BookChanges | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """What each copy's source and destination were in its process's
        address book when the copy returned (_UNTRACKED, _DEVICE, _PINNED or
        _MANAGED), applying the batch's memory calls (`ops`) in ring order."""
        n = len(copies)
        src_what, dst_what = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        c_pid = batch["pid"][copies]
        src, dst = batch["src"][copies], batch["dst"][copies]
        op_pids = np.unique(ops.pid) if ops is not None else np.zeros(0, np.uint32)
        pids = np.unique(c_pid).tolist()
        for pid in np.union1d(pids, op_pids).tolist():
            book = (self.processes.get(pid) or self._process(pid)).book
            if len(pids) == 1:  # the common case: no mask
                sel = slice(None) if pid == pids[0] else slice(0)
            else:
                sel = np.flatnonzero(c_pid == pid)
            if pid in op_pids:
                o = ops.pid == pid
                t = copies[sel]
                # A copy's source and destination, looked up as one list in ring order.
                mine = BookChanges(*(f[o] for f in ops))
                what = book.replay(mine, np.concatenate([t, t]), np.concatenate([src[sel], dst[sel]]))
                k = len(what) // 2
                src_what[sel], dst_what[sel] = what[:k], what[k:]
            elif book.ranges and n:
                src_what[sel] = book.lookup(src[sel])
                dst_what[sel] = book.lookup(dst[sel])
        return src_what, dst_what

    def _memory_calls(self, m: np.ndarray, at: np.ndarray) -> BookChanges | None:
        """Account a batch's memory calls (device memory, in ring order) and
        return their effects on the address books, None if none."""
        api, ret = m["api"], m["ret"]
        action = _BOOK_ACTION[api]
        for pid in np.unique(m["pid"]).tolist():
            if pid not in self.processes:
                self._process(pid)
        start, size = m["dst"].copy(), m["bytes"].copy()
        what = np.full(len(m), _PINNED, np.uint8)
        effect = np.where(ret == 0, action, _NOTHING)  # a failed host call changes nothing
        other = np.flatnonzero(action == _OTHER_CALL)
        if len(other):
            allocated: dict[int, list[int]] = {}  # pid -> sizes, into its histogram once per batch
            rows = zip(*(m[f][other].tolist() for f in ("pid", "api", "ret", "dst", "bytes", "stream")), strict=True)
            for k, (pid, api_id, r, addr, nbytes, aux) in zip(other.tolist(), rows, strict=True):
                e = self._memory_call(self.processes[pid], api_id, r, addr, nbytes, aux, allocated)
                if e is None:
                    effect[k] = _NOTHING
                else:
                    effect[k], size[k], what[k] = e
            for pid, sizes in allocated.items():
                self.processes[pid].memory.sizes.add(np.array(sizes, dtype=np.float64))
        keep = effect != _NOTHING
        if not keep.any():
            return None
        return BookChanges(m["pid"][keep], at[keep], effect[keep] == _ADD_RANGE, start[keep], size[keep], what[keep])

    def _resolve(self, b: np.ndarray, src_what: np.ndarray, dst_what: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(direction, host memory) of each copy: unified directions resolved
        from what both pointers are, the host side's kind from what it is."""
        n = len(b)
        pids, src, dst = b["pid"], b["src"], b["dst"]
        uniq = np.unique(pids).tolist()
        if len(uniq) == 1:
            complete = np.full(n, self.processes[uniq[0]].complete)
        else:
            complete = np.zeros(n, bool)
            for pid in uniq:
                if self.processes[pid].complete:
                    complete[pids == pid] = True
        src_kind = _host_kind(src_what, complete)
        dst_kind = _host_kind(dst_what, complete)
        # No address (an array, or a descriptor side left empty): not host memory we can name.
        src_kind[src == 0] = HostMemory.UNKNOWN
        dst_kind[dst == 0] = HostMemory.UNKNOWN
        d = b["direction"].copy()
        # Unified copies: from what both pointers are, or left as default.
        dflt = d == _DEF
        if dflt.any():
            s_dev, d_dev = src_what == _DEVICE, dst_what == _DEVICE
            s_host = (src_kind == HostMemory.PINNED) | (src_kind == HostMemory.PAGEABLE)
            d_host = (dst_kind == HostMemory.PINNED) | (dst_kind == HostMemory.PAGEABLE)
            r = np.full(n, _DEF, np.uint8)
            r[s_host & d_dev] = _H2D
            r[s_dev & d_host] = _D2H
            r[s_dev & d_dev] = _D2D
            r[s_host & d_host] = _H2H
            d = np.where(dflt, r, d)
        h = np.full(n, HostMemory.NONE, np.uint8)
        from_src = (d == _H2D) | (d == _H2H)
        h[from_src] = src_kind[from_src]
        to_dst = d == _D2H
        h[to_dst] = dst_kind[to_dst]
        unresolved = d == _DEF
        if unresolved.any():
            managed = (src_kind == HostMemory.MANAGED) | (dst_kind == HostMemory.MANAGED)
            h[unresolved] = np.where(managed[unresolved], HostMemory.MANAGED, HostMemory.UNKNOWN)
        return d, h

    def _add_copies(self, b: np.ndarray, direction: np.ndarray, host: np.ndarray) -> None:
        keys = (
            b["pid"].astype(np.uint64) << np.uint64(32)
            | b["api"].astype(np.uint64) << np.uint64(16)
            | direction.astype(np.uint64) << np.uint64(8)
            | host.astype(np.uint64)
        )
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        dur_ns = b["duration_ns"][order]
        durations = dur_ns.astype(np.float64) * 1e-9
        ok = b["ret"][order] == 0
        nbytes = b["bytes"][order]
        sizes = nbytes.astype(np.float64)
        uniq, starts = np.unique(keys, return_index=True)
        counts = np.diff(np.append(starts, len(keys)))
        oks = np.add.reduceat(ok.astype(np.int64), starts)
        nbytes_ok = np.where(ok, nbytes, np.uint64(0))
        byte_sums = _exact_sums(nbytes_ok, starts)
        dur_sums = _exact_sums(dur_ns, starts)
        stats = []
        for k, n, nok, nb, dsum in zip(uniq.tolist(), counts.tolist(), oks.tolist(), byte_sums, dur_sums, strict=True):
            key = (k >> 32, (k >> 16) & 0xFFFF, (k >> 8) & 0xFF, k & 0xFF)
            st = self.copies.get(key)
            if st is None:
                st = self.copies[key] = CopyStats()
                self._process(key[0])
            st.calls += n
            st.events += n
            st.errors += n - nok
            st.bytes += nb
            st.duration_ns += dsum
            stats.append(st)
        add_grouped([st.durations for st in stats], starts, durations)
        # sizes of the successful copies only: the same groups, over the ok events
        group = np.repeat(np.arange(len(stats)), counts)[ok]
        add_grouped([st.sizes for st in stats], np.searchsorted(group, np.arange(len(stats))), sizes[ok])

    def _add_syncs(self, b: np.ndarray) -> None:
        keys = b["pid"].astype(np.uint64) << np.uint64(16) | b["api"].astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        keys, dur, ret = keys[order], b["duration_ns"][order], b["ret"][order]
        uniq, starts = np.unique(keys, return_index=True)
        counts = np.diff(np.append(starts, len(keys)))
        errors = np.add.reduceat((ret != 0).astype(np.int64), starts)
        stats = []
        for k, n, err, dsum in zip(
            uniq.tolist(), counts.tolist(), errors.tolist(), _exact_sums(dur, starts), strict=True
        ):
            pid, api = k >> 16, k & 0xFFFF
            st = self.syncs.get((pid, api))
            if st is None:
                st = self.syncs[(pid, api)] = SyncStats()
                self._process(pid)
            st.calls += n
            st.errors += err
            st.duration_ns += dsum
            stats.append(st)
        add_grouped([st.durations for st in stats], starts, dur.astype(np.float64) * 1e-9)

    def _memory_call(
        self, proc: Process, api_id: int, ret: int, addr: int, size: int, aux: int, allocated: dict[int, list[int]]
    ) -> tuple[int, int, int] | None:
        """Account one device memory call (its event's api, ret, dst, bytes
        and aux fields; an allocation's size goes to `allocated` under its
        pid); return its effect on the address book at `addr`:
        (_ADD_RANGE, size, what) or (_DROP_RANGE, 0, 0), or None."""
        api = apis.BY_ID[api_id]
        op = api.op
        ok = ret == 0
        mem = proc.memory
        if op in (MemOp.DEVICE_ALLOC, MemOp.MANAGED_ALLOC, MemOp.VMM_CREATE):
            if not ok:
                mem.failed_allocations += 1
                return None
            if api.mem_flags:  # pitched: pitch x height
                size *= aux
            kind = 1 if op == MemOp.VMM_CREATE else 0
            if (kind, addr) in mem.live:  # its free was lost: do not count it twice
                mem.in_use_bytes -= mem.live.pop((kind, addr))
            mem.live[(kind, addr)] = size
            mem.allocations += 1
            mem.allocated_bytes += size
            mem.in_use_bytes += size
            mem.peak_bytes = max(mem.peak_bytes, mem.in_use_bytes)
            allocated.setdefault(proc.pid, []).append(size)
            if op == MemOp.VMM_CREATE:
                return None  # a handle, not an address
            return _ADD_RANGE, size, _MANAGED if op == MemOp.MANAGED_ALLOC else _DEVICE
        if op in (MemOp.DEVICE_FREE, MemOp.VMM_RELEASE):
            if not ok or (addr == 0 and op == MemOp.DEVICE_FREE):  # cudaFree(NULL) frees nothing
                return None
            kind = 1 if op == MemOp.VMM_RELEASE else 0
            size = mem.live.pop((kind, addr), -1)
            if size < 0:
                mem.unknown_frees += 1
                return None
            mem.frees += 1
            mem.freed_bytes += size
            mem.in_use_bytes -= size
            mem.last_free_ns = time.time_ns()
            mem.in_use_at_last_free = mem.in_use_bytes
            return (_DROP_RANGE, 0, 0) if op == MemOp.DEVICE_FREE else None
        if op == MemOp.VMM_MAP and ok:
            return _ADD_RANGE, size, _DEVICE
        if op == MemOp.VMM_UNMAP and ok:
            return _DROP_RANGE, 0, 0
        return None

    # ---- what the kernel counts ----

    def set_lost(self, pid: int, api: int, direction: int, calls: int, nbytes: int, errors: int, dur: int) -> None:
        self.lost[(pid, api, direction)] = (calls, nbytes, errors, dur)
        self._process(pid)

    def lost_memory_calls(self, pid: int) -> int:
        """Memory calls of a process whose event was lost: its address book may be incomplete."""
        return sum(
            v[0]
            for k, v in self.lost.items()
            if k[0] == pid and k[1] in apis.BY_ID and apis.BY_ID[k[1]].family == Family.MEM
        )

    def set_launches(self, pid: int, api: int, count: int) -> None:
        self.launches[(pid, api)] = count
        self._process(pid)

    # ---- views ----

    def copy_view(self) -> dict[CopyKey, CopyStats]:
        """Every copy key with its exact totals: what the events said, plus the
        calls whose events were lost (host memory unknown, direction as the
        kernel saw it)."""
        out = dict(self.copies)
        for (pid, api, d), (calls, nbytes, errors, dur) in self.lost.items():
            a = apis.BY_ID.get(api)
            if a is None or a.family != Family.COPY or calls == 0:
                continue
            key = (pid, api, d, int(HostMemory.UNKNOWN))
            base = out.get(key) or CopyStats()
            merged = CopyStats(
                base.calls + calls,
                base.bytes + nbytes,
                base.errors + errors,
                base.duration_ns + dur,
                base.events,
                base.durations,
                base.sizes,
            )
            out[key] = merged
        return out

    def sync_view(self) -> dict[tuple[int, int], SyncStats]:
        out = dict(self.syncs)
        for (pid, api, _d), (calls, _b, errors, dur) in self.lost.items():
            a = apis.BY_ID.get(api)
            if a is None or a.family != Family.SYNC or calls == 0:
                continue
            base = out.get((pid, api)) or SyncStats()
            out[(pid, api)] = SyncStats(
                base.calls + calls, base.errors + errors, base.duration_ns + dur, base.durations
            )
        return out

    def process_exited(self, pid: int) -> None:
        if pid in self.processes:
            p = self.processes[pid]
            p.exited = True
            p.exited_ns = p.exited_ns or time.time_ns()

    def forget(self, pid: int) -> None:
        self.processes.pop(pid, None)
        for d in (self.copies, self.syncs, self.launches, self.lost):
            for k in [k for k in d if k[0] == pid]:
                del d[k]


def describe(key: CopyKey) -> tuple[str, str, str, bool, str | None]:
    """(layer, api, direction, synchronous, host memory) labels of a copy key."""
    api = apis.BY_ID.get(key[1])
    layer = api.layer.label if api else Layer.DRIVER.label
    try:
        direction = Direction(key[2]).label
    except ValueError:
        direction = Direction.UNKNOWN.label
    try:
        host = HostMemory(key[3]).label
    except (ValueError, IndexError):
        host = HostMemory.UNKNOWN.label
    return layer, apis.api_name(key[1]), direction, bool(api and api.synchronous), host
