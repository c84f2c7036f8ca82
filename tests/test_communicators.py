"""A process's NCCL communicator on its signals (model/communicators.py),
from communicator records as the NCCL sensor writes them: its OTLP resource
(metrics and profiles), the attributes its diagnosis logs carry, and which
of the launcher and the communicator names the job."""

from __future__ import annotations

import numpy as np

from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.nccl import (
    COMM_EVENT_DTYPE,
    EVENT_DTYPE,
    CommKind,
    comm_id_of_split,
    comm_id_of_unique_id,
    comm_id_text,
)
from memtrace.core.notices import Collectives
from memtrace.export.otlp import resource_of
from memtrace.export.report import processes
from memtrace.model.aggregate import Model

KEY = ProcessKey(4242, 123_456_789)
UID = bytes(range(7, 135))


def record(kind: CommKind, comm: int, rank: int = -1, nranks: int = -1, **kw: int) -> np.ndarray:
    r = np.zeros(1, COMM_EVENT_DTYPE)
    r["pid"], r["start_ns"], r["kind"], r["comm"] = KEY.pid, KEY.start_ns, kind, comm
    r["rank"], r["nranks"], r["color"], r["key"] = rank, nranks, -1, -1
    if kind in (CommKind.INIT_RANK, CommKind.INIT_RANK_CONFIG):
        r["unique_id"][0] = np.frombuffer(UID, np.uint8)
    for k, v in kw.items():
        r[k] = v
    return r


def model_with(launcher: dict[str, str | int]) -> Model:
    m = Model(identify=lambda key: ProcessInfo(exe="/usr/bin/python3", attributes=dict(launcher)))
    m.introduce(KEY, "python3", 0)
    return m


def fold(m: Model, *records: np.ndarray) -> None:
    m.take([Collectives(np.zeros(0, EVENT_DTYPE), 0, frozenset(), np.concatenate(records))])


WORLD = comm_id_text(comm_id_of_unique_id(UID))


def test_the_communicator_names_the_job_where_no_launcher_did() -> None:
    m = model_with({})
    fold(m, record(CommKind.INIT_RANK, 0xA000, rank=3, nranks=16))
    attrs = resource_of({"host.name": "h1"}, KEY, m.processes[KEY])
    assert attrs["memtrace.nccl.comm_id"] == WORLD
    assert (attrs["memtrace.nccl.rank"], attrs["memtrace.nccl.nranks"]) == (3, 16)
    assert attrs["memtrace.job.id"] == f"nccl-{WORLD}" and attrs["memtrace.job.id.source"] == "nccl"
    assert (attrs["memtrace.job.rank"], attrs["memtrace.job.world_size"]) == (3, 16)
    (row,) = processes(m)
    assert row.get("nccl") == {"comm_id": WORLD, "rank": 3, "nranks": 16}


def test_the_launcher_names_the_job_where_it_did() -> None:
    launcher: dict[str, str | int] = {
        "memtrace.job.id": "run-9",
        "memtrace.job.launcher": "torchelastic",
        "memtrace.job.rank": 5,
    }
    m = model_with(launcher)
    fold(m, record(CommKind.INIT_RANK, 0xA000, rank=3, nranks=16))
    attrs = m.processes[KEY].attributes
    assert attrs["memtrace.job.id"] == "run-9" and attrs["memtrace.job.id.source"] == "launcher"
    assert attrs["memtrace.job.rank"] == 5 and "memtrace.job.world_size" not in attrs
    assert attrs["memtrace.nccl.rank"] == 3


def test_the_widest_communicator_is_the_process_s_and_a_split_is_not() -> None:
    m = model_with({})
    # a smaller group first (a tensor-parallel group), then the world, then a split of it
    small = bytes(128)
    r = record(CommKind.INIT_RANK, 0xB000, rank=1, nranks=4)
    r["unique_id"][0] = np.frombuffer(small, np.uint8)
    fold(m, r)
    assert m.processes[KEY].attributes["memtrace.nccl.comm_id"] == comm_id_text(comm_id_of_unique_id(small))
    fold(
        m,
        record(CommKind.INIT_RANK, 0xA000, rank=3, nranks=16),
        record(CommKind.SPLIT, 0xC000, parent=0xA000, color=1, key=3),
        record(CommKind.USER_RANK, 0xC000, rank=1),
        record(CommKind.COUNT, 0xC000, nranks=8),
    )
    attrs = m.processes[KEY].attributes
    assert attrs["memtrace.nccl.comm_id"] == WORLD and attrs["memtrace.job.id"] == f"nccl-{WORLD}"
    assert attrs["memtrace.job.rank"] == 3  # the earlier group's rank is gone with it
    child = m.communicators.of(KEY)[0xC000]
    assert child.id == comm_id_of_split(comm_id_of_unique_id(UID), 1) and (child.rank, child.nranks) == (1, 8)


def test_a_process_met_after_its_communicator_is_named_when_met() -> None:
    m = Model(identify=lambda key: ProcessInfo(exe="/x"))
    fold(m, record(CommKind.INIT_RANK, 0xA000, rank=0, nranks=2))
    assert KEY not in m.processes
    m.introduce(KEY, "x", 0)
    assert m.processes[KEY].attributes["memtrace.nccl.comm_id"] == WORLD


def test_communicators_of_processes_never_met_are_bounded_and_the_forgotten_counted() -> None:
    """Past Communicators.MAX_UNMET processes that made communicators and
    were never met, the oldest are forgotten and counted; a process met is
    never forgotten, and a process still waiting is named when met."""
    m = Model(identify=lambda key: ProcessInfo(exe="/x"))
    m.introduce(KEY, "x", 0)
    fold(m, record(CommKind.INIT_RANK, 0xA000, rank=0, nranks=2))
    most = m.communicators.MAX_UNMET
    unmet = [ProcessKey(10_000 + i, 1) for i in range(most + 3)]
    for k in unmet:
        r = record(CommKind.INIT_RANK, 0xB000, rank=1, nranks=2, pid=k.pid, start_ns=k.start_ns)
        fold(m, r)
    assert m.communicators.unmet_dropped == 3
    assert [k for k in unmet if not m.communicators.of(k)] == unmet[:3]
    assert m.processes[KEY].attributes["memtrace.nccl.comm_id"] == WORLD
    m.introduce(unmet[-1], "y", 0)
    assert m.processes[unmet[-1]].attributes["memtrace.nccl.rank"] == 1
    assert len(m.communicators.by_process) == most + 1


def test_failed_calls_and_splits_of_unknown_parents_name_nothing() -> None:
    m = model_with({})
    fold(
        m,
        record(CommKind.INIT_RANK, 0xA000, rank=0, nranks=2, ret=4),
        record(CommKind.SPLIT, 0xC000, parent=0xD000, color=0, key=0),
    )
    assert not any(k.startswith("memtrace.nccl.") for k in m.processes[KEY].attributes)
    assert "memtrace.job.id" not in m.processes[KEY].attributes
