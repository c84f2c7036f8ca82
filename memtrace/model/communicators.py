"""Which NCCL communicators a process is in, and its rank in each. No I/O.

Built from the NCCL sensor's communicator records (core/nccl.COMM_EVENT_DTYPE):

- ncclCommInitRank / ncclCommInitRankConfig: the communicator's id is a
  hash of the ncclUniqueId every rank passed (core/nccl.comm_id_of_unique_id),
  so the ranks of one communicator on every host agree on it with no word
  from the job; the rank and the count of ranks are the call's arguments.
- ncclCommSplit: the child's id is its parent's continued with the color
  (comm_id_of_split): ranks that chose one color agree. Its rank and size
  are the agreement NCCL makes among the ranks, not arguments: they are
  known where the process asks NCCL (ncclCommCount, ncclCommUserRank),
  else not. A split whose parent memtrace never saw made has no id.
- ncclCommInitAll: one process's communicator over its devices, one handle
  per rank.

The handle NCCL wrote (ncclComm_t) ties later calls to the communicator:
collectives carry it as their `comm` argument.

A process's communicator, as exported (`memtrace.nccl.*`): the one with
the most ranks (the job's world, where a job also makes groups of fewer),
the first made among equals. Where no launcher named the job, that
communicator is its job (`memtrace.job.id.source` says which won).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

import numpy as np

from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import (
    CommKind,
    comm_id_of_init_all,
    comm_id_of_split,
    comm_id_of_unique_id,
    comm_id_text,
)

# The attributes a process's communicator gives every signal of it.
COMM_ID = "memtrace.nccl.comm_id"
RANK = "memtrace.nccl.rank"
NRANKS = "memtrace.nccl.nranks"
JOB_ID = "memtrace.job.id"
JOB_SOURCE = "memtrace.job.id.source"


@dataclass
class Communicator:
    id: int  # 64-bit (core/nccl.comm_id_*)
    kind: CommKind  # the call that made it
    rank: int = -1  # -1: not known (a split's, until NCCL is asked)
    nranks: int = -1
    order: int = 0  # made n-th in its process
    calls: int = 0  # collectives made on it since (their `comm` argument is its handle)

    @property
    def id_text(self) -> str:
        return comm_id_text(self.id)


class Communicators:
    """Every process's communicators, by the handle NCCL gave each."""

    MAX_PER_PROCESS = 256  # a process that makes communicators without end keeps its first ones
    MAX_UNMET = 1024  # processes whose communicators wait for the model to meet them

    def __init__(self) -> None:
        self.by_process: dict[ProcessKey, dict[int, Communicator]] = {}
        self.unmet_dropped = 0  # processes never met whose communicators were forgotten past MAX_UNMET

    def add(self, records: np.ndarray) -> set[ProcessKey]:
        """Fold a batch of communicator records, in ring order; returns the
        processes whose communicators changed."""
        changed: set[ProcessKey] = set()
        for r in records:
            if int(r["ret"]) != 0:
                continue
            key = ProcessKey(int(r["pid"]), int(r["start_ns"]))
            comms = self.by_process.setdefault(key, {})
            handle, kind = int(r["comm"]), CommKind(int(r["kind"]))
            if not handle:
                continue  # a split with no color makes no communicator
            if kind.makes:
                cid = self._id_of(key, comms, r, kind)
                if cid is None or (handle not in comms and len(comms) >= self.MAX_PER_PROCESS):
                    continue
                rank, nranks = int(r["rank"]), int(r["nranks"])
                comms[handle] = Communicator(cid, kind, rank, nranks, len(comms))
            else:
                c = comms.get(handle)
                if c is None:
                    continue
                if kind is CommKind.COUNT:
                    c.nranks = int(r["nranks"])
                else:
                    c.rank = int(r["rank"])
            changed.add(key)
        return changed

    @staticmethod
    def _id_of(key: ProcessKey, comms: dict[int, Communicator], r: np.void, kind: CommKind) -> int | None:
        if kind in (CommKind.INIT_RANK, CommKind.INIT_RANK_CONFIG):
            return comm_id_of_unique_id(r["unique_id"].tobytes())
        if kind is CommKind.INIT_ALL:
            return comm_id_of_init_all(key.pid, key.start_ns, int(r["parent"]))
        parent = comms.get(int(r["parent"]))
        return comm_id_of_split(parent.id, int(r["color"])) if parent is not None else None

    def count_calls(self, events: np.ndarray) -> None:
        """Collectives (core/nccl.EVENT_DTYPE) to the communicators they name."""
        if not self.by_process:
            return
        by_pid: dict[int, dict[int, Communicator]] = {}
        for key, comms in self.by_process.items():
            by_pid.setdefault(key.pid, {}).update(comms)  # the latest process of a pid last (insertion order)
        pairs, counts = np.unique(
            np.stack([events["pid"].astype(np.uint64), events["comm"]], axis=1), axis=0, return_counts=True
        )
        for (pid, handle), n in zip(pairs.tolist(), counts.tolist(), strict=True):
            c = by_pid.get(pid, {}).get(handle)
            if c is not None:
                c.calls += n

    def prune(self, met: Container[ProcessKey]) -> None:
        """Keep the communicators of at most MAX_UNMET processes not `met`
        (made before their first CUDA call, or by a process that makes none):
        the oldest go first, counted in `unmet_dropped`."""
        unmet = [k for k in self.by_process if k not in met]  # insertion order: the oldest first
        for key in unmet[: max(0, len(unmet) - self.MAX_UNMET)]:
            del self.by_process[key]
            self.unmet_dropped += 1

    def of(self, key: ProcessKey) -> dict[int, Communicator]:
        return self.by_process.get(key, {})

    def main(self, key: ProcessKey) -> Communicator | None:
        """The process's communicator: the most ranks, the first made among equals."""
        comms = self.of(key)
        if not comms:
            return None
        return min(comms.values(), key=lambda c: (-c.nranks, c.order))

    def forget(self, key: ProcessKey) -> None:
        self.by_process.pop(key, None)


def attributes(main: Communicator, launcher: dict[str, str | int]) -> dict[str, str | int]:
    """The attributes a process's communicator gives it, beside those its
    launcher gave (`launcher`, the memtrace.job.* read from its environment):
    the communicator's id, rank and size; and where no launcher named the
    job, the communicator is the job (its rank and size the job's, where the
    launcher gave none)."""
    out: dict[str, str | int] = {COMM_ID: main.id_text}
    if main.rank >= 0:
        out[RANK] = main.rank
    if main.nranks > 0:
        out[NRANKS] = main.nranks
    if JOB_ID in launcher:
        out[JOB_SOURCE] = "launcher"
        return out
    out[JOB_ID] = f"nccl-{main.id_text}"
    out[JOB_SOURCE] = "nccl"
    if "memtrace.job.launcher" not in launcher:
        out["memtrace.job.launcher"] = "nccl"
    if "memtrace.job.rank" not in launcher and main.rank >= 0:
        out["memtrace.job.rank"] = main.rank
    if "memtrace.job.world_size" not in launcher and main.nranks > 0:
        out["memtrace.job.world_size"] = main.nranks
    return out
