"""Which CUDA symbols memtrace probes, and where each keeps its arguments.

Ids are part of the output (they name the api) and must never be reused.
Each entry is encoded into its probes' bpf_cookie (bpf/memtrace.h), so one
pair of generic BPF programs serves every symbol.

Four families:
- copies (both layers, entry and return): bytes, direction, pointers;
- memory calls (both layers, entry and return): allocations, frees, host
  allocations and registrations, VMM create/release/map/unmap;
- synchronisation waits (both layers, entry and return): their duration;
- launches (driver only, entry only): counted in the kernel. Every runtime
  launch reaches the driver's launch (the recorded traces show one
  cuLaunchKernel inside each cudaLaunchKernel), so the driver probe counts
  each launch once, and a launch costs one trap instead of four.

A runtime call's nested driver twin is dropped in the kernel for the first
three families, so each call is counted once, at the layer the program used.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from memtrace.core.abi import (
    CK_API_SHIFT,
    CK_BYTES_SHIFT,
    CK_DIRARG_SHIFT,
    CK_DIRSRC_SHIFT,
    CK_DST_SHIFT,
    CK_FAMILY_SHIFT,
    CK_LAYER_SHIFT,
    CK_MUL_SHIFT,
    CK_SRC_SHIFT,
    CK_STREAM_SHIFT,
    LAUNCH_STREAM_IN_CONFIG,
    MEM_AUX_DEREF,
    Direction,
    DirSrc,
    Family,
    Layer,
)


class MemOp(enum.Enum):
    """What a memory call does to the process's address space."""

    DEVICE_ALLOC = "device_alloc"  # device memory at a new address
    MANAGED_ALLOC = "managed_alloc"  # managed memory: device memory reachable from the host
    DEVICE_FREE = "device_free"  # any of the above, by address
    HOST_ALLOC = "host_alloc"  # page-locked host memory at a new address
    HOST_FREE = "host_free"
    HOST_REGISTER = "host_register"  # existing host memory page-locked in place
    HOST_UNREGISTER = "host_unregister"
    VMM_CREATE = "vmm_create"  # physical memory behind a handle
    VMM_RELEASE = "vmm_release"
    VMM_MAP = "vmm_map"  # a virtual range mapped onto a handle
    VMM_UNMAP = "vmm_unmap"
    VMM_RETAIN = "vmm_retain"  # one more reference to the handle behind a mapped address


class SyncKind(enum.Enum):
    STREAM = "stream"
    DEVICE = "device"
    EVENT = "event"


class LaunchKind(enum.Enum):
    KERNEL = "kernel"
    GRAPH = "graph"


@dataclass(frozen=True)
class Api:
    id: int
    name: str  # the API as users know it; the exported symbols are its variants
    layer: Layer
    family: Family
    bytes_arg: int = 0
    dirsrc: DirSrc = DirSrc.FIXED
    dirval: int = 0  # copies: a Direction (FIXED) or a 1-based argument index
    mul_arg: int = 0
    stream_arg: int = 0  # copies and waits: the stream/event; memory calls: the auxiliary argument
    dst_arg: int = 0  # copies: destination; memory calls: the pointer or handle argument
    src_arg: int = 0
    out_arg: int = 0  # memory calls: where the call writes the new address or handle
    mem_flags: int = 0
    op: MemOp | None = None
    sync: SyncKind | None = None
    launch: LaunchKind | None = None
    launch_flags: int = 0  # LAUNCH_STREAM_IN_CONFIG: stream_arg points to a CUlaunchConfig
    variants: tuple[str, ...] = ()

    @property
    def synchronous(self) -> bool:
        return self.stream_arg == 0

    @property
    def symbols(self) -> tuple[str, ...]:
        return (self.name, *self.variants)

    @property
    def needs_return(self) -> bool:
        return self.family != Family.LAUNCH

    def cookie(self) -> int:
        mem = self.family == Family.MEM
        dirsrc = self.mem_flags if mem else self.launch_flags if self.family == LAUNCH else int(self.dirsrc)
        dirval = self.out_arg if mem else self.dirval
        for v in (self.bytes_arg, self.mul_arg, dirsrc, dirval, self.stream_arg, self.dst_arg, self.src_arg):
            assert 0 <= v <= 0xF
        return (
            self.id << CK_API_SHIFT
            | self.bytes_arg << CK_BYTES_SHIFT
            | self.mul_arg << CK_MUL_SHIFT
            | dirsrc << CK_DIRSRC_SHIFT
            | dirval << CK_DIRARG_SHIFT
            | self.stream_arg << CK_STREAM_SHIFT
            | int(self.layer) << CK_LAYER_SHIFT
            | int(self.family) << CK_FAMILY_SHIFT
            | self.dst_arg << CK_DST_SHIFT
            | self.src_arg << CK_SRC_SHIFT
        )


R, D = Layer.RUNTIME, Layer.DRIVER
COPY, MEM, SYNC, LAUNCH = Family.COPY, Family.MEM, Family.SYNC, Family.LAUNCH
KIND, FIXED, DESC, DESC3, PARMS3 = DirSrc.KIND, DirSrc.FIXED, DirSrc.DESC2D, DirSrc.DESC3D, DirSrc.PARMS3D
BATCH, BATCH3D = DirSrc.BATCH, DirSrc.BATCH3D
H2D, D2H, D2D, PEER, DEFAULT = Direction.H2D, Direction.D2H, Direction.D2D, Direction.PEER, Direction.DEFAULT


def _copy(
    id: int, name: str, layer: Layer, nbytes: int, dirsrc: DirSrc, dirval: int, dst: int, src: int, **kw: Any
) -> Api:
    return Api(id, name, layer, COPY, nbytes, dirsrc, dirval, dst_arg=dst, src_arg=src, **kw)


def _mem(id: int, name: str, layer: Layer, op: MemOp, **kw: Any) -> Api:
    return Api(id, name, layer, MEM, op=op, **kw)


def _sync(id: int, name: str, layer: Layer, kind: SyncKind, arg: int, **kw: Any) -> Api:
    return Api(id, name, layer, SYNC, stream_arg=arg, sync=kind, **kw)


PT = "_ptds"  # per-thread default stream variant of a synchronous call
PZ = "_ptsz"  # ... of a call taking a stream

APIS: tuple[Api, ...] = (
    # ---- copies: libcudart ----
    # cudaMemcpy(dst, src, count, kind)
    _copy(1, "cudaMemcpy", R, 3, KIND, 4, 1, 2, variants=("cudaMemcpy" + PT,)),
    _copy(2, "cudaMemcpyAsync", R, 3, KIND, 4, 1, 2, stream_arg=5, variants=("cudaMemcpyAsync" + PZ,)),
    # cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind): kind is the 7th
    _copy(3, "cudaMemcpy2D", R, 5, KIND, 7, 1, 3, mul_arg=6, variants=("cudaMemcpy2D" + PT,)),
    _copy(4, "cudaMemcpy2DAsync", R, 5, KIND, 7, 1, 3, mul_arg=6, stream_arg=8, variants=("cudaMemcpy2DAsync" + PZ,)),
    # cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count)
    _copy(5, "cudaMemcpyPeer", R, 5, FIXED, PEER, 1, 3, variants=("cudaMemcpyPeer" + PT,)),
    _copy(6, "cudaMemcpyPeerAsync", R, 5, FIXED, PEER, 1, 3, stream_arg=6, variants=("cudaMemcpyPeerAsync" + PZ,)),
    # cudaMemcpy3D(const cudaMemcpy3DParms *): extent, kind and pointers from the parameters
    _copy(7, "cudaMemcpy3D", R, 0, PARMS3, 1, 0, 0, variants=("cudaMemcpy3D" + PT,)),
    _copy(8, "cudaMemcpy3DAsync", R, 0, PARMS3, 1, 0, 0, stream_arg=2, variants=("cudaMemcpy3DAsync" + PZ,)),
    # Batch copies (CUDA 12.8+): arrays of dsts (1), srcs (2) and sizes (3), the count (4); each copy's
    # direction from its pointers. cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs,
    # numAttrs, stream) as in CUDA 13 (libcudart.so.13); 12.8's had size_t *failIdx before the stream,
    # so with a libcudart.so.12 the event's stream field holds failIdx (bytes and pointers are the same).
    _copy(9, "cudaMemcpyBatchAsync", R, 3, BATCH, 4, 1, 2, stream_arg=8, variants=("cudaMemcpyBatchAsync" + PZ,)),
    # cudaMemcpy3DBatchAsync(numOps, opList, flags, stream) as in CUDA 13 (12.8's had size_t *failIdx
    # before the flags: with a libcudart.so.12 the stream field holds the flags); each operation's
    # extent and operands from the list (memtrace.h, MT_DIRSRC_BATCH3D)
    _copy(
        10, "cudaMemcpy3DBatchAsync", R, 2, BATCH3D, 1, 0, 0, stream_arg=4, variants=("cudaMemcpy3DBatchAsync" + PZ,)
    ),
    # ---- copies: libcuda ----
    # cuMemcpy(dst, src, ByteCount): unified addressing, direction from the pointers
    _copy(20, "cuMemcpy", D, 3, FIXED, DEFAULT, 1, 2, variants=("cuMemcpy" + PT,)),
    _copy(21, "cuMemcpyAsync", D, 3, FIXED, DEFAULT, 1, 2, stream_arg=4, variants=("cuMemcpyAsync" + PZ,)),
    _copy(22, "cuMemcpyHtoD_v2", D, 3, FIXED, H2D, 1, 2, variants=("cuMemcpyHtoD_v2" + PT,)),
    _copy(23, "cuMemcpyDtoH_v2", D, 3, FIXED, D2H, 1, 2, variants=("cuMemcpyDtoH_v2" + PT,)),
    _copy(24, "cuMemcpyDtoD_v2", D, 3, FIXED, D2D, 1, 2, variants=("cuMemcpyDtoD_v2" + PT,)),
    _copy(25, "cuMemcpyHtoDAsync_v2", D, 3, FIXED, H2D, 1, 2, stream_arg=4, variants=("cuMemcpyHtoDAsync_v2" + PZ,)),
    _copy(26, "cuMemcpyDtoHAsync_v2", D, 3, FIXED, D2H, 1, 2, stream_arg=4, variants=("cuMemcpyDtoHAsync_v2" + PZ,)),
    _copy(27, "cuMemcpyDtoDAsync_v2", D, 3, FIXED, D2D, 1, 2, stream_arg=4, variants=("cuMemcpyDtoDAsync_v2" + PZ,)),
    # cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount)
    _copy(28, "cuMemcpyPeer", D, 5, FIXED, PEER, 1, 3, variants=("cuMemcpyPeer" + PT,)),
    _copy(29, "cuMemcpyPeerAsync", D, 5, FIXED, PEER, 1, 3, stream_arg=6, variants=("cuMemcpyPeerAsync" + PZ,)),
    # cuMemcpy2D_v2(const CUDA_MEMCPY2D *): bytes, direction and pointers from the descriptor
    _copy(30, "cuMemcpy2D_v2", D, 0, DESC, 1, 0, 0, variants=("cuMemcpy2D_v2" + PT,)),
    _copy(31, "cuMemcpy2DAsync_v2", D, 0, DESC, 1, 0, 0, stream_arg=2, variants=("cuMemcpy2DAsync_v2" + PZ,)),
    _copy(32, "cuMemcpy2DUnaligned_v2", D, 0, DESC, 1, 0, 0, variants=("cuMemcpy2DUnaligned_v2" + PT,)),
    _copy(33, "cuMemcpy3D_v2", D, 0, DESC3, 1, 0, 0, variants=("cuMemcpy3D_v2" + PT,)),
    _copy(34, "cuMemcpy3DAsync_v2", D, 0, DESC3, 1, 0, 0, stream_arg=2, variants=("cuMemcpy3DAsync_v2" + PZ,)),
    # cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, size_t *failIdx, hStream):
    # CUDA 12.8's, the stream 9th (on the stack on x86-64 and arm64)
    _copy(35, "cuMemcpyBatchAsync", D, 3, BATCH, 4, 1, 2, stream_arg=9, variants=("cuMemcpyBatchAsync" + PZ,)),
    # cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream): CUDA 13's
    _copy(36, "cuMemcpyBatchAsync_v2", D, 3, BATCH, 4, 1, 2, stream_arg=8, variants=("cuMemcpyBatchAsync_v2" + PZ,)),
    # cuMemcpy3DBatchAsync(numOps, opList, size_t *failIdx, flags, hStream): CUDA 12.8's
    _copy(37, "cuMemcpy3DBatchAsync", D, 2, BATCH3D, 1, 0, 0, stream_arg=5, variants=("cuMemcpy3DBatchAsync" + PZ,)),
    # cuMemcpy3DBatchAsync_v2(numOps, opList, flags, hStream): CUDA 13's
    _copy(
        38, "cuMemcpy3DBatchAsync_v2", D, 2, BATCH3D, 1, 0, 0, stream_arg=4, variants=("cuMemcpy3DBatchAsync_v2" + PZ,)
    ),
    # ---- memory: libcudart ----
    _mem(40, "cudaMalloc", R, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=2),  # (void **devPtr, size)
    _mem(41, "cudaFree", R, MemOp.DEVICE_FREE, dst_arg=1),
    # cudaMallocPitch(void **devPtr, size_t *pitch, width, height): size = pitch * height
    _mem(42, "cudaMallocPitch", R, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=4, stream_arg=2, mem_flags=MEM_AUX_DEREF),
    _mem(43, "cudaMallocAsync", R, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=2, variants=("cudaMallocAsync" + PZ,)),
    _mem(44, "cudaFreeAsync", R, MemOp.DEVICE_FREE, dst_arg=1, variants=("cudaFreeAsync" + PZ,)),
    _mem(45, "cudaMallocManaged", R, MemOp.MANAGED_ALLOC, out_arg=1, bytes_arg=2),
    _mem(46, "cudaHostAlloc", R, MemOp.HOST_ALLOC, out_arg=1, bytes_arg=2),  # (void **pHost, size, flags)
    _mem(47, "cudaMallocHost", R, MemOp.HOST_ALLOC, out_arg=1, bytes_arg=2),
    _mem(48, "cudaFreeHost", R, MemOp.HOST_FREE, dst_arg=1),
    _mem(49, "cudaHostRegister", R, MemOp.HOST_REGISTER, dst_arg=1, bytes_arg=2),  # (void *ptr, size, flags)
    _mem(50, "cudaHostUnregister", R, MemOp.HOST_UNREGISTER, dst_arg=1),
    # cudaMallocFromPoolAsync(void **ptr, size, pool, stream)
    _mem(
        51,
        "cudaMallocFromPoolAsync",
        R,
        MemOp.DEVICE_ALLOC,
        out_arg=1,
        bytes_arg=2,
        variants=("cudaMallocFromPoolAsync" + PZ,),
    ),
    # ---- memory: libcuda ----
    _mem(60, "cuMemAlloc_v2", D, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=2),  # (CUdeviceptr *, size)
    _mem(61, "cuMemFree_v2", D, MemOp.DEVICE_FREE, dst_arg=1),
    # cuMemAllocPitch_v2(CUdeviceptr *, size_t *pPitch, WidthInBytes, Height, ElementSizeBytes)
    _mem(
        62, "cuMemAllocPitch_v2", D, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=4, stream_arg=2, mem_flags=MEM_AUX_DEREF
    ),
    _mem(63, "cuMemAllocAsync", D, MemOp.DEVICE_ALLOC, out_arg=1, bytes_arg=2, variants=("cuMemAllocAsync" + PZ,)),
    _mem(64, "cuMemFreeAsync", D, MemOp.DEVICE_FREE, dst_arg=1, variants=("cuMemFreeAsync" + PZ,)),
    _mem(65, "cuMemAllocManaged", D, MemOp.MANAGED_ALLOC, out_arg=1, bytes_arg=2),
    _mem(66, "cuMemHostAlloc", D, MemOp.HOST_ALLOC, out_arg=1, bytes_arg=2),  # (void **pp, size, Flags)
    _mem(67, "cuMemAllocHost_v2", D, MemOp.HOST_ALLOC, out_arg=1, bytes_arg=2),
    _mem(68, "cuMemFreeHost", D, MemOp.HOST_FREE, dst_arg=1),
    _mem(69, "cuMemHostRegister_v2", D, MemOp.HOST_REGISTER, dst_arg=1, bytes_arg=2),
    _mem(70, "cuMemHostUnregister", D, MemOp.HOST_UNREGISTER, dst_arg=1),
    # cuMemCreate(CUmemGenericAllocationHandle *handle, size, prop, flags)
    _mem(71, "cuMemCreate", D, MemOp.VMM_CREATE, out_arg=1, bytes_arg=2),
    _mem(72, "cuMemRelease", D, MemOp.VMM_RELEASE, dst_arg=1),  # (handle)
    # cuMemMap(CUdeviceptr ptr, size, offset, handle, flags)
    _mem(73, "cuMemMap", D, MemOp.VMM_MAP, dst_arg=1, bytes_arg=2, stream_arg=4),
    _mem(74, "cuMemUnmap", D, MemOp.VMM_UNMAP, dst_arg=1, bytes_arg=2),  # (ptr, size)
    # cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr): NCCL's
    # cuMem free retains the handle from the address and releases it before the original.
    _mem(76, "cuMemRetainAllocationHandle", D, MemOp.VMM_RETAIN, dst_arg=2),
    # cuMemAllocFromPoolAsync(CUdeviceptr *, size, pool, stream)
    _mem(
        75,
        "cuMemAllocFromPoolAsync",
        D,
        MemOp.DEVICE_ALLOC,
        out_arg=1,
        bytes_arg=2,
        variants=("cuMemAllocFromPoolAsync" + PZ,),
    ),
    # ---- synchronisation waits ----
    _sync(80, "cudaStreamSynchronize", R, SyncKind.STREAM, 1, variants=("cudaStreamSynchronize" + PZ,)),
    _sync(81, "cudaDeviceSynchronize", R, SyncKind.DEVICE, 0),
    _sync(82, "cudaEventSynchronize", R, SyncKind.EVENT, 1),
    _sync(90, "cuStreamSynchronize", D, SyncKind.STREAM, 1, variants=("cuStreamSynchronize" + PZ,)),
    _sync(91, "cuCtxSynchronize", D, SyncKind.DEVICE, 0),
    _sync(92, "cuEventSynchronize", D, SyncKind.EVENT, 1),
    # ---- launches: driver only, entry only ----
    # stream and dst: read only for a launch's record (a timeline is recorded): the
    # stream, and the function or graph; cuLaunchKernelEx keeps its stream in its config (hStream).
    Api(
        100,
        "cuLaunchKernel",
        D,
        LAUNCH,
        stream_arg=9,
        dst_arg=1,
        launch=LaunchKind.KERNEL,
        variants=("cuLaunchKernel" + PZ,),
    ),
    Api(
        101,
        "cuLaunchKernelEx",
        D,
        LAUNCH,
        stream_arg=1,
        dst_arg=2,
        launch=LaunchKind.KERNEL,
        launch_flags=LAUNCH_STREAM_IN_CONFIG,
        variants=("cuLaunchKernelEx" + PZ,),
    ),
    Api(
        102,
        "cuGraphLaunch",
        D,
        LAUNCH,
        stream_arg=2,
        dst_arg=1,
        launch=LaunchKind.GRAPH,
        variants=("cuGraphLaunch" + PZ,),
    ),
)

COPY_APIS: tuple[Api, ...] = tuple(a for a in APIS if a.family == COPY)
BY_ID: dict[int, Api] = {a.id: a for a in APIS}


def apis_for(layer: Layer) -> dict[str, Api]:
    """Symbol name -> API, for every probed symbol of one layer."""
    return {sym: a for a in APIS if a.layer == layer for sym in a.symbols}


def api_name(api_id: int) -> str:
    a = BY_ID.get(api_id)
    return a.name if a else f"api{api_id}"
