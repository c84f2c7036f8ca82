"""Copies, as the model folds them: what each pointer was in its process's
address book when the copy returned, the direction of unified copies and
the host side's memory kind, and each copy key's exact totals and
histograms. Pure numpy over a batch's copy events; no I/O."""

from __future__ import annotations

import numpy as np

from memtrace.core.abi import EV_MORE, EV_SUM, Direction
from memtrace.core.enums import HostMemory
from memtrace.core.histogram import Grouped
from memtrace.model.book import _DEVICE, _DRIVER, _MANAGED, _PINNED, _UNTRACKED, BookChanges
from memtrace.model.process import CopyKey, CopyStats, Process, SiteKey, SiteStats, direction_of

_H2H, _H2D, _D2H, _D2D, _DEF = (
    int(d) for d in (Direction.H2H, Direction.H2D, Direction.D2H, Direction.D2D, Direction.DEFAULT)
)


def _copy_key(k: int) -> tuple[int, Direction, HostMemory]:
    """(api, direction, host memory) of a packed copy key (add_copies:
    process << 32 | api << 16 | direction << 8 | host memory)."""
    return (k >> 16) & 0xFFFF, direction_of((k >> 8) & 0xFF), HostMemory(k & 0xFF)


def exact_sums(v: np.ndarray, starts: np.ndarray) -> list[int]:
    """Per-group sums of u64 values (groups start at `starts`), without wrapping."""
    if len(v) and int(v.max()) >= (1 << 64) // len(v):
        ends = np.append(starts[1:], len(v)).tolist()
        return [sum(v[s:e].tolist()) for s, e in zip(starts.tolist(), ends, strict=True)]
    return np.add.reduceat(v.astype(np.uint64), starts).tolist() if len(v) else []


def _host_kind(what: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """A pointer's host memory kind; device memory where host memory was named is unknown.
    An untracked pointer is pageable in a process seen whole (`complete`), else unknown."""
    out = np.full(len(what), HostMemory.UNKNOWN, np.uint8)
    out[(what == _PINNED) | (what == _DRIVER)] = HostMemory.PINNED
    out[what == _MANAGED] = HostMemory.MANAGED
    out[(what == _UNTRACKED) & complete] = HostMemory.PAGEABLE
    return out


def what_copies_touch(
    batch: np.ndarray, copies: np.ndarray, ops: BookChanges | None, proc: np.ndarray, procs: list[Process]
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


def resolve(
    b: np.ndarray, src_what: np.ndarray, dst_what: np.ndarray, proc: np.ndarray, procs: list[Process]
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


def add_copies(
    b: np.ndarray,
    direction: np.ndarray,
    host: np.ndarray,
    proc: np.ndarray,
    procs: list[Process],
    values: list[Grouped],
    stacks: bool,
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
    byte_sums = exact_sums(nbytes_ok, starts)
    dur_sums = exact_sums(dur_ns, starts)
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
    if stacks:
        _add_copy_sites(keys, b["stack"][order], call, ok, nbytes_ok, procs)


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
    byte_sums = exact_sums(nbytes_ok[o], starts)
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
