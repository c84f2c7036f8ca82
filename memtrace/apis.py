"""Which CUDA symbols memtrace probes, and where each keeps its arguments.

Ids are part of the output (they name the api) and must never be reused.
The table is encoded into each probe's bpf_cookie (bpf/memtrace.h), so one
generic BPF program serves every symbol.
"""

from __future__ import annotations

from dataclasses import dataclass

from .abi import (
    CK_API_SHIFT,
    CK_BYTES_SHIFT,
    CK_DIRARG_SHIFT,
    CK_DIRSRC_SHIFT,
    CK_LAYER_SHIFT,
    CK_MUL_SHIFT,
    CK_STREAM_SHIFT,
    Direction,
    DirSrc,
    Layer,
)


@dataclass(frozen=True)
class CopyApi:
    id: int
    name: str  # the API as users know it; the exported symbols are its variants
    layer: Layer
    bytes_arg: int
    dirsrc: DirSrc
    dirval: int  # a Direction (FIXED) or a 1-based argument index
    mul_arg: int = 0
    stream_arg: int = 0
    variants: tuple[str, ...] = ()

    @property
    def synchronous(self) -> bool:
        return self.stream_arg == 0

    @property
    def symbols(self) -> tuple[str, ...]:
        return (self.name, *self.variants)

    def cookie(self) -> int:
        for v in (self.bytes_arg, self.mul_arg, self.dirval, self.stream_arg):
            assert 0 <= v <= 0xF
        return (
            self.id << CK_API_SHIFT
            | self.bytes_arg << CK_BYTES_SHIFT
            | self.mul_arg << CK_MUL_SHIFT
            | int(self.dirsrc) << CK_DIRSRC_SHIFT
            | self.dirval << CK_DIRARG_SHIFT
            | self.stream_arg << CK_STREAM_SHIFT
            | int(self.layer) << CK_LAYER_SHIFT
        )


R, D = Layer.RUNTIME, Layer.DRIVER
KIND, FIXED, DESC = DirSrc.KIND, DirSrc.FIXED, DirSrc.DESC2D
H2D, D2H, D2D, PEER, DEFAULT = Direction.H2D, Direction.D2H, Direction.D2D, Direction.PEER, Direction.DEFAULT

COPY_APIS: tuple[CopyApi, ...] = (
    # libcudart: cudaMemcpy(dst, src, count, kind)
    CopyApi(1, "cudaMemcpy", R, 3, KIND, 4, variants=("cudaMemcpy_ptds",)),
    # cudaMemcpyAsync(dst, src, count, kind, stream)
    CopyApi(2, "cudaMemcpyAsync", R, 3, KIND, 4, stream_arg=5, variants=("cudaMemcpyAsync_ptsz",)),
    # cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind): kind is the 7th
    CopyApi(3, "cudaMemcpy2D", R, 5, KIND, 7, mul_arg=6, variants=("cudaMemcpy2D_ptds",)),
    CopyApi(4, "cudaMemcpy2DAsync", R, 5, KIND, 7, mul_arg=6, stream_arg=8, variants=("cudaMemcpy2DAsync_ptsz",)),
    # cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count)
    CopyApi(5, "cudaMemcpyPeer", R, 5, FIXED, PEER, variants=("cudaMemcpyPeer_ptds",)),
    CopyApi(6, "cudaMemcpyPeerAsync", R, 5, FIXED, PEER, stream_arg=6, variants=("cudaMemcpyPeerAsync_ptsz",)),
    # libcuda: cuMemcpy(dst, src, ByteCount): unified addressing
    CopyApi(20, "cuMemcpy", D, 3, FIXED, DEFAULT, variants=("cuMemcpy_ptds",)),
    CopyApi(21, "cuMemcpyAsync", D, 3, FIXED, DEFAULT, stream_arg=4, variants=("cuMemcpyAsync_ptsz",)),
    CopyApi(22, "cuMemcpyHtoD_v2", D, 3, FIXED, H2D, variants=("cuMemcpyHtoD_v2_ptds",)),
    CopyApi(23, "cuMemcpyDtoH_v2", D, 3, FIXED, D2H, variants=("cuMemcpyDtoH_v2_ptds",)),
    CopyApi(24, "cuMemcpyDtoD_v2", D, 3, FIXED, D2D, variants=("cuMemcpyDtoD_v2_ptds",)),
    CopyApi(25, "cuMemcpyHtoDAsync_v2", D, 3, FIXED, H2D, stream_arg=4, variants=("cuMemcpyHtoDAsync_v2_ptsz",)),
    CopyApi(26, "cuMemcpyDtoHAsync_v2", D, 3, FIXED, D2H, stream_arg=4, variants=("cuMemcpyDtoHAsync_v2_ptsz",)),
    CopyApi(27, "cuMemcpyDtoDAsync_v2", D, 3, FIXED, D2D, stream_arg=4, variants=("cuMemcpyDtoDAsync_v2_ptsz",)),
    # cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount)
    CopyApi(28, "cuMemcpyPeer", D, 5, FIXED, PEER, variants=("cuMemcpyPeer_ptds",)),
    CopyApi(29, "cuMemcpyPeerAsync", D, 5, FIXED, PEER, stream_arg=6, variants=("cuMemcpyPeerAsync_ptsz",)),
    # cuMemcpy2D_v2(const CUDA_MEMCPY2D *): bytes and direction from the descriptor
    CopyApi(30, "cuMemcpy2D_v2", D, 0, DESC, 1, variants=("cuMemcpy2D_v2_ptds",)),
    CopyApi(31, "cuMemcpy2DAsync_v2", D, 0, DESC, 1, stream_arg=2, variants=("cuMemcpy2DAsync_v2_ptsz",)),
    CopyApi(32, "cuMemcpy2DUnaligned_v2", D, 0, DESC, 1, variants=("cuMemcpy2DUnaligned_v2_ptds",)),
)

BY_ID: dict[int, CopyApi] = {a.id: a for a in COPY_APIS}


def apis_for(layer: Layer) -> dict[str, CopyApi]:
    """Symbol name -> API, for every symbol of one layer."""
    return {sym: a for a in COPY_APIS if a.layer == layer for sym in a.symbols}


def api_name(api_id: int) -> str:
    a = BY_ID.get(api_id)
    return a.name if a else f"api{api_id}"
