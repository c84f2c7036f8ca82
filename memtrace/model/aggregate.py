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
from typing import Any

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import EV_MORE, EV_SUM, EVENT_DTYPE, Direction, Family, Layer
from memtrace.core.apis import MemOp
from memtrace.core.enums import Allocation, HostMemory
from memtrace.core.histogram import Grouped, add_grouped_all
from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.nccl import Collective
from memtrace.core.overhead import Overhead, TrapCost
from memtrace.model.book import _DEVICE, _MANAGED, _PINNED, _UNTRACKED, BookChanges
from memtrace.model.collectives import WaitAttributor, sync_scopes
from memtrace.model.process import (
    CopyKey,
    CopyStats,
    LaunchKey,
    LostKey,
    LostTotals,
    Process,
    SiteKey,
    SiteStats,
    SyncKey,
    SyncStats,
    direction_of,
)
from memtrace.model.steps import StepTracker

# Per-api lookup tables for vectorised decoding.
_FAMILY = np.full(1 << 16, Family.COPY, np.uint8)  # an id this version does not know: kept as a copy
for _a in apis.APIS:
    _FAMILY[_a.id] = int(_a.family)
_H2H, _H2D, _D2H, _D2D, _DEF = (
    int(d) for d in (Direction.H2H, Direction.H2D, Direction.D2H, Direction.D2D, Direction.DEFAULT)
)


def _copy_key(k: int) -> tuple[int, Direction, HostMemory]:
    """(api, direction, host memory) of a packed copy key (Model._add_copies:
    process << 32 | api << 16 | direction << 8 | host memory)."""
    return (k >> 16) & 0xFFFF, direction_of((k >> 8) & 0xFF), HostMemory(k & 0xFF)


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


def _processes_of(batch: np.ndarray) -> tuple[list[ProcessKey], np.ndarray]:
    """The distinct processes (pid, start) of a batch, sorted, and each
    event's index into them."""
    pid, start = batch["pid"], batch["start_ns"]
    if (pid == pid[0]).all() and (start == start[0]).all():  # the common case: one process
        return [ProcessKey(int(pid[0]), int(start[0]))], np.zeros(len(batch), np.int64)
    order = np.lexsort((start, pid))
    sp, ss = pid[order], start[order]
    new = np.empty(len(order), bool)
    new[0] = True
    new[1:] = (sp[1:] != sp[:-1]) | (ss[1:] != ss[:-1])
    which = np.empty(len(order), np.int64)
    which[order] = np.cumsum(new) - 1
    firsts = order[new]
    keys = [ProcessKey(p, t) for p, t in zip(pid[firsts].tolist(), start[firsts].tolist(), strict=True)]
    return keys, which


_NO_EVENTS = np.zeros(0, EVENT_DTYPE)  # a CUDA batch of none (collectives alone for a step tracker)


class Model:
    MAX_NCCL_PIDS = 10240  # pids said to map libnccl, kept until the model meets them (BPF's MAX_PROCESSES)

    def __init__(
        self,
        complete_after_ns: int | None = None,
        identify: Callable[[ProcessKey], ProcessInfo] = lambda key: ProcessInfo(),
    ) -> None:
        self.processes: dict[ProcessKey, Process] = {}
        self.events = 0
        # A process that started after this (CLOCK_BOOTTIME ns, as process
        # keys count) was traced from its first CUDA call; None: every
        # process is (`memtrace run`).
        self.complete_after_ns = complete_after_ns
        # Asks the kernel whether a process was forked once the probes were
        # live (exact even when it is gone before its events are decoded).
        self.forked_since_start: Callable[[ProcessKey], bool] = lambda key: False
        # What the host adds to a process's identity (the runtime reads it;
        # the model does no I/O).
        self.identify = identify
        # Process start times are boot-clock ns: their wall-clock time is
        # taken with one offset, so a process's start never moves. The
        # runtime sets the host's own boot time, the same in every agent.
        self.boot_wall_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        # Calls are kept by call site too (Process.sites): the kernel takes stacks.
        self.stacks = False
        self.step_trackers: dict[ProcessKey, StepTracker] = {}  # its steps (model/steps.py)
        # Who waited for its collectives (model/collectives.py), for processes that made any.
        self.collective_waits: dict[ProcessKey, WaitAttributor] = {}
        # Pids said to have libnccl mapped, perhaps before the model met them:
        # their waits are kept from their first event on.
        self._nccl_pids: set[int] = set()
        self.collectives_unmatched = 0  # NCCL events of a pid the model has no live process for
        self._by_pid: dict[int, ProcessKey] = {}  # the latest process of each pid
        self.trap_cost: TrapCost | None = None  # what a probe's trap costs on this host, once measured

    def _process(self, key: ProcessKey) -> Process:
        p = self.processes.get(key)
        if p is None:
            info = self.identify(key)
            p = Process(
                key,
                name=info.name,
                exe=info.exe,
                ppid=info.ppid,
                start_ns=self.boot_wall_ns + key.start_ns if key.start_ns else 0,
                attributes=dict(info.attributes),
            )
            after = self.complete_after_ns
            p.complete = after is None or key.start_ns > after or self.forked_since_start(key)
            self.processes[key] = p
            if key.start_ns >= self._by_pid.get(key.pid, ProcessKey(0, 0)).start_ns:
                self._by_pid[key.pid] = key
            if key.pid in self._nccl_pids:
                self.collective_waits.setdefault(key, WaitAttributor())
        return p

    def introduce(self, key: ProcessKey, name: str, cgroup_id: int) -> None:
        """Who a process is, as BPF saw it at its first event: this name wins over the host's."""
        p = self._process(key)
        if name:
            p.name = name
        p.cgroup_id = cgroup_id

    def mark_complete(self, key: ProcessKey) -> None:
        """The process was held before its CUDA library ran: nothing was missed."""
        self._process(key).complete = True

    # Every process's state, merged (for tests and whole-model views).
    @property
    def copies(self) -> dict[CopyKey, CopyStats]:
        return {k: v for p in self.processes.values() for k, v in p.copies.items()}

    @property
    def syncs(self) -> dict[SyncKey, SyncStats]:
        return {k: v for p in self.processes.values() for k, v in p.syncs.items()}

    @property
    def launches(self) -> dict[LaunchKey, int]:
        return {k: v for p in self.processes.values() for k, v in p.launches.items()}

    @property
    def lost(self) -> dict[LostKey, LostTotals]:
        return {k: v for p in self.processes.values() for k, v in p.lost.items()}

    def mark_incomplete(self, key: ProcessKey) -> None:
        """The process ran CUDA code before its probes were in: its host memory may be unknown."""
        self._process(key).complete = False

    # ---- events ----

    def add_events(self, batch: np.ndarray) -> None:
        """Fold a batch of decoded mt_event records, in ring order."""
        if len(batch) == 0:
            return
        self.events += len(batch)
        keys, proc = _processes_of(batch)
        procs = [self._process(k) for k in keys]
        values: list[Grouped] = []  # what the copies and waits add to their histograms
        fam = _FAMILY[batch["api"]]
        copies = np.flatnonzero(fam == Family.COPY)
        mem = np.flatnonzero(fam == Family.MEM)
        ops = self._memory_calls(batch[mem], mem, proc[mem], procs) if len(mem) else None
        if len(copies) or ops is not None:
            src_what, dst_what = self._what_copies_touch(batch, copies, ops, proc, procs)
        if len(copies):
            b = batch[copies]
            direction, host = self._resolve(b, src_what, dst_what, proc[copies], procs)
        if len(copies):
            self._add_copies(b, direction, host, proc[copies], procs, values)
        syncs = fam == Family.SYNC
        if syncs.any():
            self._add_syncs(batch[syncs], proc[syncs], procs, values)
        add_grouped_all(values)  # the copies' and waits' histograms in one pass
        # Each process's events, in ring order: one sort, not a pass per process.
        order = np.argsort(proc, kind="stable")
        bounds = np.searchsorted(proc[order], np.arange(len(keys) + 1)).tolist()
        for i, key in enumerate(keys):
            t = self.step_trackers.get(key)
            if t is None:
                t = self.step_trackers[key] = StepTracker(key.pid)
            t.add(batch if len(keys) == 1 else batch[order[bounds[i] : bounds[i + 1]]])

    def _what_copies_touch(
        self, batch: np.ndarray, copies: np.ndarray, ops: BookChanges | None, proc: np.ndarray, procs: list[Process]
    ) -> tuple[np.ndarray, np.ndarray]:
        """What each copy's source and destination were in its process's
        address book when the copy returned (_UNTRACKED, _DEVICE, _PINNED or
        _MANAGED), applying the batch's memory calls (`ops`) in ring order."""
        n = len(copies)
        src, dst = batch["src"][copies], batch["dst"][copies]
        if ops is None and len(procs) == 1:  # the common case: one process, no memory call
            book = procs[0].book
            if not (book.ranges and n):
                return np.zeros(n, np.uint8), np.zeros(n, np.uint8)
            what = book.lookup(np.concatenate([src, dst]))  # both sides as one list
            return what[:n], what[n:]
        src_what, dst_what = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        c_proc = proc[copies]
        op_procs = np.unique(ops.proc) if ops is not None else np.zeros(0, np.int64)
        mine = np.unique(c_proc).tolist()
        for i in np.union1d(np.array(mine, np.int64), op_procs).tolist():
            book = procs[i].book
            sel: slice | np.ndarray
            if len(mine) == 1:  # the common case: no mask
                sel = slice(None) if i == mine[0] else slice(0)
            else:
                sel = np.flatnonzero(c_proc == i)
            if i in op_procs:
                assert ops is not None
                o = ops.proc == i
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

    def _memory_calls(
        self, m: np.ndarray, at: np.ndarray, proc: np.ndarray, procs: list[Process]
    ) -> BookChanges | None:
        """Account a batch's memory calls (device memory, in ring order) and
        return their effects on the address books, None if none."""
        api, ret = m["api"], m["ret"]
        action = _BOOK_ACTION[api]
        start, size = m["dst"].copy(), m["bytes"].copy()
        what = np.full(len(m), _PINNED, np.uint8)
        effect = np.where(ret == 0, action, _NOTHING)  # a failed host call changes nothing
        other = np.flatnonzero(action == _OTHER_CALL)
        if len(other):
            allocated: dict[ProcessKey, list[int]] = {}  # sizes, into its histogram once per batch
            rows = zip(
                proc[other].tolist(),
                *(m[f][other].tolist() for f in ("api", "ret", "dst", "bytes", "stream", "ts_ns", "stack")),
                strict=True,
            )
            for k, (i, api_id, r, addr, nbytes, aux, ts, stack) in zip(other.tolist(), rows, strict=True):
                e = self._memory_call(procs[i], api_id, r, addr, nbytes, aux, allocated, stack)
                procs[i].memory.note(ts)
                if e is None:
                    effect[k] = _NOTHING
                else:
                    effect[k], size[k], what[k] = e
            for key, sizes in allocated.items():
                self.processes[key].memory.sizes.add(np.array(sizes, dtype=np.float64))
        keep = effect != _NOTHING
        if not keep.any():
            return None
        return BookChanges(proc[keep], at[keep], effect[keep] == _ADD_RANGE, start[keep], size[keep], what[keep])

    def _resolve(
        self, b: np.ndarray, src_what: np.ndarray, dst_what: np.ndarray, proc: np.ndarray, procs: list[Process]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(direction, host memory) of each copy: unified directions resolved
        from what both pointers are, the host side's kind from what it is."""
        n = len(b)
        src, dst = b["src"], b["dst"]
        uniq = np.unique(proc).tolist()
        if len(uniq) == 1:
            complete = np.full(n, procs[uniq[0]].complete)
        else:
            complete = np.zeros(n, bool)
            for i in uniq:
                if procs[i].complete:
                    complete[proc == i] = True
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

    def _add_copies(
        self,
        b: np.ndarray,
        direction: np.ndarray,
        host: np.ndarray,
        proc: np.ndarray,
        procs: list[Process],
        values: list[Grouped],
    ) -> None:
        """Copies into their stats; their durations and sizes into `values`, for their histograms."""
        keys = (
            proc.astype(np.uint64) << np.uint64(32)
            | b["api"].astype(np.uint64) << np.uint64(16)
            | direction.astype(np.uint64) << np.uint64(8)
            | host.astype(np.uint64)
        )
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        dur_ns = b["duration_ns"][order]
        durations = dur_ns.astype(np.float64) * 1e-9
        ok = b["ret"][order] == 0
        flags = b["layer"][order]
        # A batch copy call's further copies (EV_MORE) add bytes, not calls: the
        # call, its result and its duration are on its first record. A summed
        # record (EV_SUM) is many copies' bytes, not one copy's size.
        call = (flags & EV_MORE) == 0
        one_copy = ok & ((flags & EV_SUM) == 0)
        nbytes = b["bytes"][order]
        sizes = nbytes.astype(np.float64)
        uniq, starts = np.unique(keys, return_index=True)
        counts = np.diff(np.append(starts, len(keys)))
        ncalls = np.add.reduceat(call.astype(np.int64), starts)
        nerrors = np.add.reduceat((call & ~ok).astype(np.int64), starts)
        nbytes_ok = np.where(ok, nbytes, np.uint64(0))
        byte_sums = _exact_sums(nbytes_ok, starts)
        dur_sums = _exact_sums(dur_ns, starts)
        stats = []
        rows = zip(uniq.tolist(), counts.tolist(), ncalls.tolist(), nerrors.tolist(), byte_sums, dur_sums, strict=True)
        for k, n, nc, ne, nb, dsum in rows:
            p = procs[k >> 32]
            key = CopyKey(p.key, *_copy_key(k))
            st = p.copies.get(key)
            if st is None:
                st = p.copies[key] = CopyStats()
            st.calls += nc
            st.events += n
            st.errors += ne
            st.bytes += nb
            st.duration_ns += dsum
            stats.append(st)
        group = np.repeat(np.arange(len(stats)), counts)
        # durations of calls: the same groups, over the calls' records
        at = np.searchsorted(group[call], np.arange(len(stats)))
        values.append(([st.durations for st in stats], at, durations[call]))
        # sizes of the successful copies only: over the ok events of one copy each
        at = np.searchsorted(group[one_copy], np.arange(len(stats)))
        values.append(([st.sizes for st in stats], at, sizes[one_copy]))
        if self.stacks:
            self._add_copy_sites(keys, b["stack"][order], call, ok, nbytes_ok, procs)

    @staticmethod
    def _add_copy_sites(
        keys: np.ndarray,
        stack: np.ndarray,
        call: np.ndarray,
        ok: np.ndarray,
        nbytes_ok: np.ndarray,
        procs: list[Process],
    ) -> None:
        """Copies by call site: calls, bytes and errors per (copy key, stack).
        `keys` are sorted; every other array is in their order."""
        o = np.lexsort((stack, keys))
        k, s = keys[o], stack[o]
        new = np.ones(len(k), bool)
        new[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
        starts = np.flatnonzero(new)
        calls = np.add.reduceat(call[o].astype(np.int64), starts).tolist()
        errors = np.add.reduceat((call & ~ok)[o].astype(np.int64), starts).tolist()
        byte_sums = _exact_sums(nbytes_ok[o], starts)
        rows = zip(k[starts].tolist(), s[starts].tolist(), calls, errors, byte_sums, strict=True)
        for key, stk, nc, ne, nb in rows:
            p = procs[key >> 32]
            sk = SiteKey(stk, "copy", *_copy_key(key))
            st = p.sites.get(sk)
            if st is None:
                st = p.sites[sk] = SiteStats()
            st.calls += nc
            st.errors += ne
            st.bytes += nb

    def add_collectives(self, events: np.ndarray, complete_until_ns: int, users: frozenset[int] = frozenset()) -> None:
        """The NCCL sensor's events (EVENT_DTYPE of memtrace.core.nccl), complete
        up to `complete_until_ns`: each process's collectives join its steps
        (the `collective` share) and the waits that followed are charged to them.
        `users`: processes with libnccl mapped: their waits are kept from now on,
        before their first collective is polled (a poll comes less often than a drain),
        and from its first event for one the model has not met yet (the CUDA
        sensor reports a held libnccl mapping before the process's first call)."""
        self._nccl_pids |= users
        if len(self._nccl_pids) > self.MAX_NCCL_PIDS:  # pids never met, kept too long: the latest word only
            self._nccl_pids = set(users)
        for pid in users:
            key = self._by_pid.get(pid)
            if key is not None and key in self.processes and key not in self.collective_waits:
                self.collective_waits[key] = WaitAttributor()
        if len(events):
            pids, inv = np.unique(events["pid"], return_inverse=True)
            for i, pid in enumerate(pids.tolist()):
                key = self._by_pid.get(pid)
                ev = events[inv == i]
                if key is None or key not in self.processes:
                    self.collectives_unmatched += len(ev)
                    continue
                att = self.collective_waits.get(key)
                if att is None:
                    att = self.collective_waits[key] = WaitAttributor()
                att.add_collectives(ev)
                t = self.step_trackers.get(key)
                if t is None:
                    t = self.step_trackers[key] = StepTracker(key.pid)
                t.add(_NO_EVENTS, ev)
        for att in self.collective_waits.values():
            att.advance(complete_until_ns)

    def _add_syncs(self, b: np.ndarray, proc: np.ndarray, procs: list[Process], values: list[Grouped]) -> None:
        """Waits into their stats; their durations into `values`, for their histograms."""
        if self.collective_waits:  # the waits of processes that made collectives, for their attribution
            for i in np.unique(proc).tolist():
                att = self.collective_waits.get(procs[i].key)
                if att is not None:
                    mine = b[proc == i]
                    att.add_syncs(
                        mine["ts_ns"].astype(np.int64),
                        mine["duration_ns"].astype(np.int64),
                        mine["stream"],
                        sync_scopes(mine["api"]),
                    )
        keys = proc.astype(np.uint64) << np.uint64(16) | b["api"].astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        keys, dur, ret = keys[order], b["duration_ns"][order], b["ret"][order]
        uniq, starts = np.unique(keys, return_index=True)
        counts = np.diff(np.append(starts, len(keys)))
        errors = np.add.reduceat((ret != 0).astype(np.int64), starts)
        stats = []
        for k, n, err, dsum in zip(
            uniq.tolist(), counts.tolist(), errors.tolist(), _exact_sums(dur, starts), strict=True
        ):
            p = procs[k >> 16]
            key = SyncKey(p.key, k & 0xFFFF)
            st = p.syncs.get(key)
            if st is None:
                st = p.syncs[key] = SyncStats()
            st.calls += n
            st.errors += err
            st.duration_ns += dsum
            stats.append(st)
        values.append(([st.durations for st in stats], starts, dur.astype(np.float64) * 1e-9))

    def _memory_call(
        self,
        proc: Process,
        api_id: int,
        ret: int,
        addr: int,
        size: int,
        aux: int,
        allocated: dict[ProcessKey, list[int]],
        stack: int = 0,
    ) -> tuple[int, int, int] | None:
        """Account one device memory call (its event's api, ret, dst, bytes
        and aux fields; an allocation's size goes to `allocated` under its
        process); return its effect on the address book at `addr`:
        (_ADD_RANGE, size, what) or (_DROP_RANGE, 0, 0), or None."""
        api = apis.BY_ID[api_id]
        op = api.op
        ok = ret == 0
        mem = proc.memory
        if op in (MemOp.DEVICE_ALLOC, MemOp.MANAGED_ALLOC, MemOp.VMM_CREATE):
            site = None
            if self.stacks:
                sk = SiteKey(stack, "alloc", api_id, None, HostMemory.NONE)
                site = proc.sites.get(sk)
                if site is None:
                    site = proc.sites[sk] = SiteStats()
                site.calls += 1
            if not ok:
                mem.failed_allocations += 1
                if site is not None:
                    site.errors += 1
                return None
            if api.mem_flags:  # pitched: pitch x height
                size *= aux
            kind = Allocation.VMM_HANDLE if op == MemOp.VMM_CREATE else Allocation.ADDRESS
            if (kind, addr) in mem.live:  # its free was lost: do not count it twice
                mem.in_use_bytes -= mem.live.pop((kind, addr))
            mem.live[(kind, addr)] = size
            if site is not None:
                site.bytes += size
                mem.live_stack[(kind, addr)] = stack
            mem.allocations += 1
            mem.allocated_bytes += size
            mem.in_use_bytes += size
            mem.peak_bytes = max(mem.peak_bytes, mem.in_use_bytes)
            allocated.setdefault(proc.key, []).append(size)
            if op == MemOp.VMM_CREATE:
                return None  # a handle, not an address
            return _ADD_RANGE, size, _MANAGED if op == MemOp.MANAGED_ALLOC else _DEVICE
        if op in (MemOp.DEVICE_FREE, MemOp.VMM_RELEASE):
            if not ok or (addr == 0 and op == MemOp.DEVICE_FREE):  # cudaFree(NULL) frees nothing
                return None
            kind = Allocation.VMM_HANDLE if op == MemOp.VMM_RELEASE else Allocation.ADDRESS
            if op == MemOp.VMM_RELEASE and mem.retained.get(addr, 0) > 0:
                mem.retained[addr] -= 1  # a retained reference given back: the memory stays
                if not mem.retained[addr]:
                    del mem.retained[addr]
                return None
            size = mem.live.pop((kind, addr), -1)
            mem.live_stack.pop((kind, addr), None)
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
            if (Allocation.VMM_HANDLE, aux) in mem.live:  # what a retain may name; gone at unmap
                mem.mapped[addr] = aux
            return _ADD_RANGE, size, _DEVICE
        if op == MemOp.VMM_UNMAP and ok:
            mem.mapped.pop(addr, None)
            return _DROP_RANGE, 0, 0
        if op == MemOp.VMM_RETAIN and ok:
            handle = mem.mapped.get(addr)
            if handle is not None and (Allocation.VMM_HANDLE, handle) in mem.live:
                mem.retained[handle] = mem.retained.get(handle, 0) + 1
        return None

    # ---- what the kernel counts ----

    def set_lost(
        self, key: ProcessKey, api: int, direction: int, calls: int, nbytes: int, errors: int, dur: int
    ) -> None:
        self._process(key).lost[LostKey(key, api, direction_of(direction))] = (calls, nbytes, errors, dur)

    def lost_memory_calls(self, key: ProcessKey) -> int:
        """Memory calls of a process whose event was lost: its address book may be incomplete."""
        p = self.processes.get(key)
        return p.lost_memory_calls() if p else 0

    def set_launches(
        self, key: ProcessKey, counts: dict[int, int], traps: int | None = None, duty: float | None = None
    ) -> None:
        """A process's launches by api. `traps`: the launch traps it took,
        when that is not their sum (the budget sampled them: `duty`, and the
        counts are partly extrapolated)."""
        p = self._process(key)
        for api, n in counts.items():
            p.launches[LaunchKey(key, api)] = n
        p.launch_traps = sum(counts.values()) if traps is None else traps
        if duty is not None:
            p.launch_duty = duty

    def mark_launches_partial(self, key: ProcessKey) -> None:
        """It may have launched before it had launch probes of its own."""
        self._process(key).launches_partial = True

    # ---- views ----

    def copy_view(self) -> dict[CopyKey, CopyStats]:
        """Every copy key of every process with its exact totals (Process.copy_view)."""
        out: dict[CopyKey, CopyStats] = {}
        for p in self.processes.values():
            out.update(p.copy_view())
        return out

    def sync_view(self) -> dict[SyncKey, SyncStats]:
        out: dict[SyncKey, SyncStats] = {}
        for p in self.processes.values():
            out.update(p.sync_view())
        return out

    def steps_view(self) -> list[dict[str, Any]]:
        """One row per process with steps (of its stepping thread): pid,
        start_time_unix_nano, process, tid, steps, duration_seconds,
        breakdown (shares of step time), gpu_idle_share."""
        rows = []
        for key, t in sorted(self.step_trackers.items()):
            st = t.stats()
            if st is not None:
                p = self.processes.get(key)
                who = {"pid": key.pid, "start_time_unix_nano": p.start_ns if p else 0, "process": p.name if p else ""}
                rows.append({**who, **st.row()})
        return rows

    def process_exited(self, key: ProcessKey, cpu_ns: int = 0) -> None:
        """`cpu_ns`: its whole CPU time, as the kernel had it at the exit (0: not said)."""
        p = self.processes.get(key)
        if p is not None:
            p.exited = True
            p.exited_ns = p.exited_ns or time.time_ns()
            if cpu_ns:
                p.cpu_ns, p.cpu_final = cpu_ns, True

    def set_traps(self, key: ProcessKey, traps: int) -> None:
        self._process(key).traps = traps

    def set_cpu(self, key: ProcessKey, cpu_ns: int) -> None:
        """A running process's CPU time so far (never over its final figure)."""
        p = self.processes.get(key)
        if p is not None and not p.cpu_final:
            p.cpu_ns = cpu_ns

    def overhead(self, key: ProcessKey) -> Overhead | None:
        """What the probes cost the process, by the calibrated trap cost
        (`trap_cost`, set by the agent); None if it took no trap or the
        cost is not known yet."""
        p = self.processes.get(key)
        if p is None or self.trap_cost is None:
            return None
        launch_traps = p.launch_traps
        if not p.traps and not launch_traps:
            return None
        cpu = p.cpu_ns / 1e9 if p.cpu_ns is not None else None
        return Overhead(p.traps + launch_traps, launch_traps, self.trap_cost, cpu, p.cpu_final)

    def forget(self, key: ProcessKey) -> None:
        """Drop a process and everything it did (its own state: no scan)."""
        self.processes.pop(key, None)
        self.step_trackers.pop(key, None)
        self.collective_waits.pop(key, None)
        if self._by_pid.get(key.pid) == key:
            del self._by_pid[key.pid]
            self._nccl_pids.discard(key.pid)

    def collective_wait_totals(self) -> dict[tuple[int, Collective], tuple[int, int]]:
        """Per (pid, collective) of the live processes: the waits charged to it, and their total ns."""
        out: dict[tuple[int, Collective], tuple[int, int]] = {}
        for key, att in self.collective_waits.items():
            for c, v in att.by_collective.items():
                out[(key.pid, c)] = v
        return out


def describe(key: CopyKey) -> tuple[str, str, str, bool, str | None]:
    """(layer, api, direction, synchronous, host memory) labels of a copy key."""
    api = apis.BY_ID.get(key.api)
    layer = api.layer.label if api else Layer.DRIVER.label
    return layer, apis.api_name(key.api), key.direction.label, bool(api and api.synchronous), key.host.label
