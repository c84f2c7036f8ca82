"""Domain enums that are not part of the kernel ABI (those are in abi.py)."""

from __future__ import annotations

import enum


class HostMemory(enum.IntEnum):
    NONE = 0  # the copy touches no host memory (d2d, peer)
    PINNED = 1  # page-locked: cudaHostAlloc, cudaMallocHost, cudaHostRegister and driver twins
    PAGEABLE = 2  # ordinary host memory
    MANAGED = 3  # cudaMallocManaged / cuMemAllocManaged
    UNKNOWN = 4  # not decidable: the process ran before memtrace, or its event was lost

    @property
    def label(self) -> str | None:
        return None if self is HostMemory.NONE else self.name.lower()


class Allocation(enum.IntEnum):
    """What names a live device allocation: its address, or (VMM physical
    memory from cuMemCreate) its handle. The two spaces may collide."""

    ADDRESS = 0
    VMM_HANDLE = 1
