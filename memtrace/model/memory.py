"""Device memory and host registrations, as the model folds them: each
memory call's effect on its process's accounting (allocations, frees,
VMM handles and mappings) and on its address book. No I/O."""

from __future__ import annotations

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import Family
from memtrace.core.apis import MemOp
from memtrace.core.enums import Allocation, HostMemory
from memtrace.model.book import _DEVICE, _MANAGED, _PINNED, BookChanges
from memtrace.model.process import Process, SiteKey, SiteStats

# What a successful memory call does to its address book, by api id: a host
# allocation or registration adds a pinned range, their undoing drops it; any
# other memory call is decided by memory_call (device memory, VMM).
_NOTHING, _ADD_RANGE, _DROP_RANGE, _OTHER_CALL = 0, 1, 2, 3
_BOOK_ACTION = np.full(1 << 16, _NOTHING, np.uint8)
for _a in apis.APIS:
    if _a.op in (MemOp.HOST_ALLOC, MemOp.HOST_REGISTER):
        _BOOK_ACTION[_a.id] = _ADD_RANGE
    elif _a.op in (MemOp.HOST_FREE, MemOp.HOST_UNREGISTER):
        _BOOK_ACTION[_a.id] = _DROP_RANGE
    elif _a.family == Family.MEM:
        _BOOK_ACTION[_a.id] = _OTHER_CALL


def memory_calls(
    m: np.ndarray, at: np.ndarray, proc: np.ndarray, procs: list[Process], stacks: bool
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
        allocated: dict[int, list[int]] = {}  # sizes by process index, into its histogram once per batch
        rows = zip(
            proc[other].tolist(),
            *(m[f][other].tolist() for f in ("api", "ret", "dst", "bytes", "stream", "ts_ns", "stack")),
            strict=True,
        )
        for k, (i, api_id, r, addr, nbytes, aux, ts, stack) in zip(other.tolist(), rows, strict=True):
            e = memory_call(i, procs[i], api_id, r, addr, nbytes, aux, allocated, stacks, stack)
            procs[i].memory.note(ts)
            if e is None:
                effect[k] = _NOTHING
            else:
                effect[k], size[k], what[k] = e
        for i, sizes in allocated.items():
            procs[i].memory.sizes.add(np.array(sizes, dtype=np.float64))
    keep = effect != _NOTHING
    if not keep.any():
        return None
    return BookChanges(proc[keep], at[keep], effect[keep] == _ADD_RANGE, start[keep], size[keep], what[keep])


def memory_call(
    i: int,
    proc: Process,
    api_id: int,
    ret: int,
    addr: int,
    size: int,
    aux: int,
    allocated: dict[int, list[int]],
    stacks: bool,
    stack: int = 0,
) -> tuple[int, int, int] | None:
    """Account one device memory call (its event's api, ret, dst, bytes
    and aux fields; an allocation's size goes to `allocated` under the
    process's index `i`); return its effect on the address book at `addr`:
    (_ADD_RANGE, size, what) or (_DROP_RANGE, 0, 0), or None."""
    api = apis.BY_ID[api_id]
    op = api.op
    ok = ret == 0
    mem = proc.memory
    if op in (MemOp.DEVICE_ALLOC, MemOp.MANAGED_ALLOC, MemOp.VMM_CREATE):
        site = None
        if stacks:
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
        allocated.setdefault(i, []).append(size)
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
