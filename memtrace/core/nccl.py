"""The NCCL sensor's kernel/user ABI, mirrored from bpf/nccl.h, and NCCL's
own enums (ncclDataType_t) with their sizes.

tests/test_nccl_abi.py compiles a C program against the header and checks
every constant, size and offset here.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass

import numpy as np


class Collective(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    REDUCESCATTER = 2
    BROADCAST = 3
    REDUCE = 4
    SEND = 5
    RECV = 6
    ALLTOALL = 7
    GROUP_START = 8
    GROUP_END = 9

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def is_group(self) -> bool:
        return self in (Collective.GROUP_START, Collective.GROUP_END)


_LABELS = {
    Collective.ALLREDUCE: "all_reduce",
    Collective.ALLGATHER: "all_gather",
    Collective.REDUCESCATTER: "reduce_scatter",
    Collective.BROADCAST: "broadcast",
    Collective.REDUCE: "reduce",
    Collective.SEND: "send",
    Collective.RECV: "recv",
    Collective.ALLTOALL: "all_to_all",
    Collective.GROUP_START: "group_start",
    Collective.GROUP_END: "group_end",
}

COLL_COUNT = 10


class DataType(enum.IntEnum):
    """ncclDataType_t (nccl.h, NCCL 2.x); ncclChar = ncclInt8, ncclInt = ncclInt32,
    ncclHalf = ncclFloat16, ncclFloat = ncclFloat32, ncclDouble = ncclFloat64."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    FLOAT8E4M3 = 10
    FLOAT8E5M2 = 11


DTYPE_COUNT = 12

DTYPE_SIZES: dict[DataType, int] = {
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.INT32: 4,
    DataType.UINT32: 4,
    DataType.INT64: 8,
    DataType.UINT64: 8,
    DataType.FLOAT16: 2,
    DataType.FLOAT32: 4,
    DataType.FLOAT64: 8,
    DataType.BFLOAT16: 2,
    DataType.FLOAT8E4M3: 1,
    DataType.FLOAT8E5M2: 1,
}

F_BYTES_UNKNOWN = 0x1
F_GROUPED = 0x2

CK_COLL_SHIFT = 0
CK_COUNT_SHIFT = 8
CK_DTYPE_SHIFT = 12
CK_PEER_SHIFT = 16
CK_COMM_SHIFT = 20
CK_STREAM_SHIFT = 24


class Stat(enum.IntEnum):
    EVENTS = 0
    DROPPED = 1
    LOST_FULL = 2
    NO_ENTRY = 3
    ABANDONED = 4
    NESTED = 5
    COMMS = 6  # communicator records queued
    COMMS_DROPPED = 7  # communicator records the ring could not take


STAT_COUNT = 8


class TotalsKey(ctypes.Structure):
    """struct nc_totals_key: a process (pid and start) and a collective."""

    _fields_ = [("start_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("coll", ctypes.c_uint32)]


class Totals(ctypes.Structure):
    _fields_ = [
        ("calls", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("bytes_unknown", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
    ]


# struct nc_event, decoded in batches (80 bytes).
EVENT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("duration_ns", "<u8"),
        ("count", "<u8"),
        ("bytes", "<u8"),
        ("stream", "<u8"),
        ("comm", "<u8"),
        ("start_ns", "<u8"),  # the process's start (ProcessKey), taken in BPF at the call
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("ret", "<i4"),
        ("peer", "<i4"),
        ("depth", "<u4"),
        ("coll", "u1"),
        ("dtype", "u1"),
        ("flags", "u1"),
        ("pad", "u1"),
    ]
)


def cookie(coll: Collective, count: int = 0, dtype: int = 0, peer: int = 0, comm: int = 0, stream: int = 0) -> int:
    """The bpf_cookie of a probed symbol: its collective and 1-based argument indices (0: none)."""
    for n in (count, dtype, peer, comm, stream):
        if not 0 <= n <= 8:
            raise ValueError(f"argument index {n} out of range")
    return (
        int(coll) << CK_COLL_SHIFT
        | count << CK_COUNT_SHIFT
        | dtype << CK_DTYPE_SHIFT
        | peer << CK_PEER_SHIFT
        | comm << CK_COMM_SHIFT
        | stream << CK_STREAM_SHIFT
    )


@dataclass
class CallTotals:
    """Calls of one collective by one process, as the sensor counted them."""

    calls: int = 0
    bytes: int = 0  # successful calls with a known datatype
    errors: int = 0
    bytes_unknown: int = 0  # calls whose datatype NCCL did not define: bytes not known
    duration_ns: int = 0


# ---- communicators (nccl.h: enum nc_comm_kind, struct nc_comm_event) ----


class CommKind(enum.IntEnum):
    INIT_RANK = 0
    INIT_RANK_CONFIG = 1
    INIT_ALL = 2
    SPLIT = 3
    COUNT = 4  # ncclCommCount: the communicator's size
    USER_RANK = 5  # ncclCommUserRank: this process's rank in it

    @property
    def makes(self) -> bool:
        """Does the call make a communicator (else it asks about one)?"""
        return self not in (CommKind.COUNT, CommKind.USER_RANK)


COMM_KIND_COUNT = 6
UNIQUE_ID_BYTES = 128
INIT_ALL_MAX = 8  # ncclCommInitAll: handles read per call

# struct nc_comm_event, decoded in batches (192 bytes).
COMM_EVENT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("start_ns", "<u8"),
        ("comm", "<u8"),
        ("parent", "<u8"),
        ("unique_id", "u1", (UNIQUE_ID_BYTES,)),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("ret", "<i4"),
        ("rank", "<i4"),
        ("nranks", "<i4"),
        ("color", "<i4"),
        ("key", "<i4"),
        ("kind", "u1"),
        ("pad", "u1", (3,)),
    ]
)

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes, h: int = _FNV_OFFSET) -> int:
    """64-bit FNV-1a of `data` (from `h`, to continue a hash)."""
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def comm_id_of_unique_id(unique_id: bytes) -> int:
    """A communicator's id: the 64-bit FNV-1a of the 128 bytes of the
    ncclUniqueId every rank passed to ncclCommInitRank(Config). The same in
    every rank on every host; the id's bytes (NCCL's magic and the root's
    address) are not exported."""
    return fnv1a64(bytes(unique_id))


def comm_id_of_split(parent: int, color: int) -> int:
    """ncclCommSplit's child: its parent's id continued with the color
    (32-bit, little-endian), the same in every rank that chose that color."""
    return fnv1a64(color.to_bytes(4, "little", signed=True), fnv1a64(parent.to_bytes(8, "little")))


def comm_id_of_init_all(pid: int, start_ns: int, array: int) -> int:
    """ncclCommInitAll's communicator, one process's alone: its process
    (pid, start) and the array NCCL wrote the handles to."""
    return fnv1a64(
        b"init_all" + pid.to_bytes(4, "little") + start_ns.to_bytes(8, "little") + array.to_bytes(8, "little")
    )


def comm_id_text(comm_id: int) -> str:
    """As exported: 16 hex digits."""
    return f"{comm_id:016x}"
