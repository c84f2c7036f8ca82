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

import time
from collections.abc import Callable

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import Direction, Family, Layer
from memtrace.core.apis import MemOp
from memtrace.core.enums import HostMemory
from memtrace.core.histogram import add_grouped
from memtrace.core.ids import ProcessInfo
from memtrace.model.book import _DEVICE, _MANAGED, _PINNED, _UNTRACKED, BookChanges
from memtrace.model.process import CopyKey, CopyStats, Process, SyncStats

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
    def __init__(
        self,
        complete_after_ticks: int | None = None,
        identify: Callable[[int], ProcessInfo] = lambda pid: ProcessInfo(),
    ) -> None:
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
        # Who a pid is (the runtime reads it from the host; the model does no I/O).
        self.identify = identify

    def _process(self, pid: int) -> Process:
        p = self.processes.get(pid)
        if p is None:
            p = self.processes[pid] = Process.identified(pid, self.identify(pid))
            after = self.complete_after_ticks
            p.complete = after is None or p.start_ticks > after or self.forked_since_start(pid)
        return p

    def mark_complete(self, pid: int) -> None:
        """The process was held before its CUDA library ran: nothing was missed."""
        self._process(pid).complete = True

    def mark_incomplete(self, pid: int) -> None:
        """The process ran CUDA code before its probes were in: its host memory may be unknown."""
        self._process(pid).complete = False

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
