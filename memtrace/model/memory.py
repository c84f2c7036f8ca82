"""Device memory and host registrations, as the model folds them: each
memory call's effect on its process's accounting (allocations, frees,
VMM handles and mappings) and on its address book; and each process's
device memory beside NVML's, rolled up to pods. No I/O.

Two counts of a process's device memory, and why they differ:
memtrace's probes count what the process allocated through the CUDA calls
and has not freed (`DeviceMemory.in_use_bytes`); NVML counts what the
driver holds for the process on each GPU (nvmlDeviceGetComputeRunningProcesses'
usedGpuMemory). NVML's is larger by the CUDA context (its code, stacks and
heaps: hundreds of MiB on a real GPU, before any allocation) and by memory
allocated through calls memtrace does not probe; a caching allocator
(PyTorch's) keeps freed blocks allocated, so both count them and neither
says they are free for the job. `unattributed` is NVML's less memtrace's:
what no probed allocation explains. It can be below zero for a moment:
NVML's figure is from the last detailed sample (about a second old),
memtrace's is now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import Family
from memtrace.core.apis import MemOp
from memtrace.core.enums import Allocation, HostMemory
from memtrace.core.ids import ProcessKey
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


POD_UID = "k8s.pod.uid"  # the resource attribute identity derives from the process's cgroup (sources/procfs)


@dataclass(frozen=True)
class ProcessDeviceMemory:
    """One process's device memory by memtrace's probes and by NVML, side by side."""

    key: ProcessKey
    pod_uid: str | None
    traced_bytes: int  # allocated through the probed calls and not freed, now
    nvml_bytes: int | None  # NVML's usedGpuMemory over the GPUs that list it (None: none gave a figure)

    @property
    def unattributed_bytes(self) -> int | None:
        """NVML's less memtrace's: the CUDA context and memory no probed call allocated."""
        return None if self.nvml_bytes is None else self.nvml_bytes - self.traced_bytes


@dataclass(frozen=True)
class PodDeviceMemory:
    """A pod's processes' device memory, summed: `nvml_bytes` over those NVML gave a figure for."""

    pod_uid: str
    pids: tuple[int, ...]
    traced_bytes: int
    nvml_bytes: int | None
    unattributed_bytes: int | None  # the sum of its processes' (those NVML gave a figure for)


def nvml_used_by_pid(gpus: Iterable[Mapping[int, int | None]]) -> dict[int, int | None]:
    """Each pid's NVML memory over all GPUs (each GPU's pid -> usedGpuMemory at its last sample;
    None where NVML could not say); None for a pid no GPU gave a figure for."""
    out: dict[int, int | None] = {}
    for procs in gpus:
        for pid, used in procs.items():
            before = out.get(pid)
            out[pid] = before if used is None else (before or 0) + used
    return out


def device_memory_views(
    processes: Mapping[ProcessKey, Process], nvml_used: Mapping[int, int | None]
) -> tuple[list[ProcessDeviceMemory], list[PodDeviceMemory]]:
    """Per process (those that allocated, or that NVML lists), memtrace's and NVML's figures; and per
    pod (`k8s.pod.uid`), the sums of its processes'. A pid NVML lists is matched to the newest
    process of that pid the model holds (NVML knows pids, not start times)."""
    newest: dict[int, ProcessKey] = {}
    for key in processes:
        if key.pid not in newest or key.start_ns > newest[key.pid].start_ns:
            newest[key.pid] = key
    rows = []
    for key, p in sorted(processes.items()):
        listed = newest[key.pid] == key and key.pid in nvml_used
        if not (p.memory.allocations or listed):
            continue
        pod = p.attributes.get(POD_UID)
        rows.append(
            ProcessDeviceMemory(
                key=key,
                pod_uid=None if pod is None else str(pod),
                traced_bytes=p.memory.in_use_bytes,
                nvml_bytes=nvml_used.get(key.pid) if listed else None,
            )
        )
    pods: dict[str, list[ProcessDeviceMemory]] = {}
    for r in rows:
        if r.pod_uid is not None:
            pods.setdefault(r.pod_uid, []).append(r)
    out = []
    for uid, members in sorted(pods.items()):
        known = [m for m in members if m.nvml_bytes is not None]
        out.append(
            PodDeviceMemory(
                pod_uid=uid,
                pids=tuple(sorted(m.key.pid for m in members)),
                traced_bytes=sum(m.traced_bytes for m in members),
                nvml_bytes=sum(m.nvml_bytes or 0 for m in known) if known else None,
                unattributed_bytes=sum(m.unattributed_bytes or 0 for m in known) if known else None,
            )
        )
    return rows, out
