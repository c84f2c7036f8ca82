"""Which NCCL symbols are probed, where each keeps its arguments, and the
probes for one file (from its ELF symbols, as the CUDA sensor plans its own).

Signatures (nccl.h, NCCL 2.x), argument indices 1-based:
  ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)
  ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)
  ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
  ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)
  ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)
  ncclSend(sendbuff, count, datatype, peer, comm, stream)
  ncclRecv(recvbuff, count, datatype, peer, comm, stream)
  ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream)   (NCCL 2.28+)
  ncclGroupStart(), ncclGroupEnd()

Communicators (nc_comm_enter / nc_comm_return, cookie: enum nc_comm_kind):
  ncclCommInitRank(comm*, nranks, ncclUniqueId commId [by value], rank)
  ncclCommInitRankConfig(comm*, nranks, commId, rank, config)
  ncclCommInitAll(comms*, ndev, devlist)
  ncclCommSplit(comm, color, key, newcomm*, config)   (NCCL 2.18+)
  ncclCommCount(comm, count*), ncclCommUserRank(comm, rank*)
Where each argument is, by architecture, is the BPF side's (nccl.h).

ncclBcast (in-place broadcast) is not probed: NCCL implements it by calling
ncclBroadcast, which is, so each broadcast is counted once. The `pncclX`
profiling aliases share their function's code and are not probed either.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace.bpf import elf
from memtrace.core.nccl import Collective, CommKind, cookie

C = Collective

# symbol -> cookie
SYMBOLS: dict[str, int] = {
    "ncclAllReduce": cookie(C.ALLREDUCE, count=3, dtype=4, comm=6, stream=7),
    "ncclAllGather": cookie(C.ALLGATHER, count=3, dtype=4, comm=5, stream=6),
    "ncclReduceScatter": cookie(C.REDUCESCATTER, count=3, dtype=4, comm=6, stream=7),
    "ncclBroadcast": cookie(C.BROADCAST, count=3, dtype=4, peer=5, comm=6, stream=7),
    "ncclReduce": cookie(C.REDUCE, count=3, dtype=4, peer=6, comm=7, stream=8),
    "ncclSend": cookie(C.SEND, count=2, dtype=3, peer=4, comm=5, stream=6),
    "ncclRecv": cookie(C.RECV, count=2, dtype=3, peer=4, comm=5, stream=6),
    "ncclAlltoAll": cookie(C.ALLTOALL, count=3, dtype=4, comm=5, stream=6),
    "ncclAllToAll": cookie(C.ALLTOALL, count=3, dtype=4, comm=5, stream=6),
    "ncclGroupStart": cookie(C.GROUP_START),
    "ncclGroupEnd": cookie(C.GROUP_END),
}

# symbol -> cookie (its kind) of the communicator calls
COMM_SYMBOLS: dict[str, int] = {
    "ncclCommInitRank": CommKind.INIT_RANK,
    "ncclCommInitRankConfig": CommKind.INIT_RANK_CONFIG,
    "ncclCommInitAll": CommKind.INIT_ALL,
    "ncclCommSplit": CommKind.SPLIT,
    "ncclCommCount": CommKind.COUNT,
    "ncclCommUserRank": CommKind.USER_RANK,
}

PROGRAMS = (("nc_enter", False), ("nc_return", True))
COMM_PROGRAMS = (("nc_comm_enter", False), ("nc_comm_return", True))


@dataclass(frozen=True)
class Probe:
    symbol: str
    offset: int  # file offset of the function
    cookie: int
    comm: bool = False  # a communicator call (COMM_PROGRAMS), else a collective (PROGRAMS)

    @property
    def programs(self) -> tuple[tuple[str, bool], ...]:
        return COMM_PROGRAMS if self.comm else PROGRAMS


def probe_plan(path: str) -> list[Probe]:
    """The probes for one file: each NCCL symbol it defines, one per code
    address (two names of one function would count a call twice)."""
    table = {**SYMBOLS, **COMM_SYMBOLS}
    with open(path, "rb") as f:
        offsets = elf.function_offsets(f, table)
    by_offset: dict[int, str] = {}
    for sym in sorted(offsets, key=lambda s: (s in COMM_SYMBOLS, table[s] & 0xFF, s)):
        by_offset.setdefault(offsets[sym], sym)
    return [Probe(sym, off, table[sym], sym in COMM_SYMBOLS) for off, sym in sorted(by_offset.items())]
