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


@dataclass(eq=False)  # hashed by identity: the model keeps a set of those with pending sizes
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
    pending_sizes: list[int] = field(default_factory=list)
    # For the leak signal: when memory was last given back, and how much was in use then.
    last_free_ns: int = 0
    in_use_at_last_free: int = 0

    @property
    def outstanding(self) -> int:
        return len(self.live)


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
        end = start + max(size, 1)
        i = bisect.bisect_left(self._starts, start)
        if i > 0 and self.ranges[self._starts[i - 1]][0] > start:
            i -= 1  # the range below reaches into the new one
        while i < len(self._starts) and self._starts[i] < end:
            self._drop(self._starts[i])
        bisect.insort(self._starts, start)
        self.ranges[start] = (end, what)
        if what == _PINNED:
            self.pinned_bytes += end - start
        self._arrays = None

    def remove(self, start: int) -> bool:
        if start not in self.ranges:
            return False
        self._drop(start)
        return True

    def _drop(self, start: int) -> None:
        end, what = self.ranges.pop(start)
        del self._starts[bisect.bisect_left(self._starts, start)]
        if what == _PINNED:
            self.pinned_bytes -= end - start
        self._arrays = None

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
        if self._arrays is None:
            starts = np.array(self._starts, dtype=np.uint64)
            ends = np.array([self.ranges[s][0] for s in self._starts], dtype=np.uint64)
            whats = np.array([self.ranges[s][1] for s in self._starts], dtype=np.uint8)
            self._arrays = (starts, ends, whats)
        starts, ends, whats = self._arrays
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


# host allocation or registration (True) and their undoing (False), by api id
_HOST_OPS = {
    a.id: a.op in (MemOp.HOST_ALLOC, MemOp.HOST_REGISTER)
    for a in apis.APIS
    if a.op in (MemOp.HOST_ALLOC, MemOp.HOST_REGISTER, MemOp.HOST_FREE, MemOp.HOST_UNREGISTER)
}

# what an address book says -> host memory kind, for complete and incomplete processes
_HOST_KIND = {
    c: {
        _UNTRACKED: HostMemory.PAGEABLE if c else HostMemory.UNKNOWN,
        _DEVICE: HostMemory.UNKNOWN,
        _PINNED: HostMemory.PINNED,
        _MANAGED: HostMemory.MANAGED,
    }
    for c in (False, True)
}


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
        self._pending_sizes: set[DeviceMemory] = set()  # allocation sizes not yet in their histograms
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
        direction = batch["direction"].copy()
        host = np.zeros(len(batch), np.uint8)
        if len(mem) == 0:
            if len(copies):
                direction[copies], host[copies] = self._classify(batch[copies])
        else:
            # Memory calls change the address books: the copies between two of
            # them are classified against the books as they stand there.
            seg = np.searchsorted(mem, copies)  # the memory call each copy precedes
            bounds = np.searchsorted(seg, np.arange(len(mem) + 1), side="right")
            lo = 0
            mem_rows = batch[mem].tolist()
            copy_list = copies.tolist()
            cols = None
            one_idx: list[int] = []  # copies classified one at a time, and their results
            one_dir: list[int] = []
            one_host: list[int] = []
            memory_call = self._memory_call
            for k, hi in enumerate(bounds.tolist()):
                if hi - lo > 16:
                    idx = copies[lo:hi]
                    direction[idx], host[idx] = self._classify(batch[idx])
                elif hi > lo:
                    # A few copies between memory calls (JAX allocates and frees a
                    # staging buffer around each transfer): one at a time costs
                    # less than numpy's per-call overhead.
                    if cols is None:
                        cols = [batch[f].tolist() for f in ("pid", "direction", "src", "dst")]
                    pid_c, dir_c, src_c, dst_c = cols
                    for i in copy_list[lo:hi]:
                        d, h = self._classify_one(pid_c[i], dir_c[i], src_c[i], dst_c[i])
                        one_idx.append(i)
                        one_dir.append(d)
                        one_host.append(h)
                lo = hi
                if k < len(mem):
                    memory_call(mem_rows[k])
            if one_idx:
                direction[one_idx] = one_dir
                host[one_idx] = one_host
            for mem_stats in self._pending_sizes:
                mem_stats.sizes.add(np.array(mem_stats.pending_sizes, dtype=np.float64))
                mem_stats.pending_sizes.clear()
            self._pending_sizes.clear()
        if len(copies):
            self._add_copies(batch[copies], direction[copies], host[copies])
        syncs = fam == Family.SYNC
        if syncs.any():
            self._add_syncs(batch[syncs])

    def _classify_one(self, pid: int, d: int, src: int, dst: int) -> tuple[int, int]:
        """_classify for one copy: the same rules, without numpy."""
        proc = self.processes.get(pid) or self._process(pid)
        book, complete = proc.book, proc.complete
        sw, dw = book.lookup_one(src), book.lookup_one(dst)
        sk, dk = _HOST_KIND[complete][sw], _HOST_KIND[complete][dw]
        if src == 0:
            sk = HostMemory.UNKNOWN
        if dst == 0:
            dk = HostMemory.UNKNOWN
        if d == _DEF:
            s_host = sk in (HostMemory.PINNED, HostMemory.PAGEABLE)
            d_host = dk in (HostMemory.PINNED, HostMemory.PAGEABLE)
            s_dev, d_dev = sw == _DEVICE, dw == _DEVICE
            if s_host and d_host:
                d = _H2H
            elif s_dev and d_dev:
                d = _D2D
            elif s_dev and d_host:
                d = _D2H
            elif s_host and d_dev:
                d = _H2D
        if d in (_H2D, _H2H):
            return d, sk
        if d == _D2H:
            return d, dk
        if d == _DEF:
            managed = HostMemory.MANAGED in (sk, dk)
            return d, HostMemory.MANAGED if managed else HostMemory.UNKNOWN
        return d, HostMemory.NONE

    def _classify(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(direction, host memory) of each copy: unified directions resolved
        from the pointers, the host side's kind from the address book."""
        n = len(b)
        pids, src, dst = b["pid"], b["src"], b["dst"]
        src_what = np.zeros(n, np.uint8)
        dst_what = np.zeros(n, np.uint8)
        complete = np.zeros(n, bool)
        uniq = np.unique(pids).tolist()
        for pid in uniq:
            proc = self.processes.get(pid) or self._process(pid)
            if not proc.book.ranges and not proc.complete:
                continue  # nothing tracked, nothing known: all zeros
            sel = pids == pid if len(uniq) > 1 else slice(None)
            complete[sel] = proc.complete
            if proc.book.ranges:
                src_what[sel] = proc.book.lookup(src[sel])
                dst_what[sel] = proc.book.lookup(dst[sel])
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

    def _memory_call(self, ev: tuple) -> None:
        """One memory call, as a row of EVENT_DTYPE (a tuple, in field order)."""
        _ts, _dur, size, aux, addr, _src, pid, _tid, ret, api_id, _d, _layer = ev
        proc = self.processes.get(pid) or self._process(pid)
        fast = _HOST_OPS.get(api_id)
        if fast is not None:  # the common case first (JAX's staging buffers)
            if ret == 0:
                if fast:
                    proc.book.add(addr, size, _PINNED)
                else:
                    proc.book.remove(addr)
            return
        api = apis.BY_ID[api_id]
        op = api.op
        ok = ret == 0
        mem, book = proc.memory, proc.book
        now = time.time_ns()
        if op in (MemOp.DEVICE_ALLOC, MemOp.MANAGED_ALLOC, MemOp.VMM_CREATE):
            if not ok:
                mem.failed_allocations += 1
                return
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
            mem.pending_sizes.append(size)  # into the histogram once per batch
            self._pending_sizes.add(mem)
            if op != MemOp.VMM_CREATE:
                book.add(addr, size, _MANAGED if op == MemOp.MANAGED_ALLOC else _DEVICE)
        elif op in (MemOp.DEVICE_FREE, MemOp.VMM_RELEASE):
            if not ok or (addr == 0 and op == MemOp.DEVICE_FREE):  # cudaFree(NULL) frees nothing
                return
            kind = 1 if op == MemOp.VMM_RELEASE else 0
            size = mem.live.pop((kind, addr), -1)
            if size < 0:
                mem.unknown_frees += 1
                return
            mem.frees += 1
            mem.freed_bytes += size
            mem.in_use_bytes -= size
            mem.last_free_ns = now
            mem.in_use_at_last_free = mem.in_use_bytes
            if op == MemOp.DEVICE_FREE:
                book.remove(addr)
        elif op == MemOp.VMM_MAP:
            if ok:
                book.add(addr, size, _DEVICE)
        elif op == MemOp.VMM_UNMAP:
            if ok:
                book.remove(addr)

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
