"""NCCL communicator identity against a real kernel: real uprobes on the
test libnccl.so.2, whose ncclCommInitRank takes the 128-byte ncclUniqueId by
value as NCCL's does (on the caller's stack on x86-64), ranks that share
one id file as real ranks share their root's id, and memtrace's
communicator id, rank and size compared with the ranks' own truth."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import libnccl, memtrace_cmd

from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import CommKind, Stat, comm_id_of_split, comm_id_of_unique_id, comm_id_text
from memtrace.model.communicators import Communicators
from memtrace.sensors.nccl import NcclSensor

pytestmark = pytest.mark.bpf


def unique_id(tmp_path: Path, name: str = "id") -> tuple[Path, bytes]:
    raw = os.urandom(128)
    path = tmp_path / name
    path.write_bytes(raw)
    return path, raw


def run_ranks(
    s: NcclSensor, fakecuda: Path, tmp_path: Path, idfile: Path, ranks: list[int], nranks: int, *extra: str
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """The ranks run at once, to their end; the rings drained as the agent
    drains them. Returns (truth per rank, communicator records, collectives)."""
    truth = tmp_path / "truth.jsonl"
    truth.unlink(missing_ok=True)
    procs = [
        subprocess.Popen(
            [str(fakecuda / "nccl_comm"), libnccl(fakecuda), str(idfile), str(r), str(nranks), *extra],
            env=dict(os.environ, WORKLOAD_TRUTH=str(truth)),
        )
        for r in ranks
    ]
    comms, events = [], []
    while any(p.poll() is None for p in procs):
        comms.append(s.poll_comms())
        events.append(s.poll())
    assert [p.wait() for p in procs] == [0] * len(procs)
    comms.append(s.poll_comms())
    events.append(s.poll())
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    return sorted(lines, key=lambda t: t["rank"]), np.concatenate(comms), np.concatenate(events)


def key_of(records: np.ndarray, pid: int) -> ProcessKey:
    (start,) = set(records[records["pid"] == pid]["start_ns"].tolist())
    return ProcessKey(pid, start)


@pytest.mark.parametrize("how", ["init_rank", "init_rank_config"])
def test_two_ranks_of_one_communicator_get_its_id_and_their_own_ranks(
    nccl_sensor: NcclSensor, fakecuda: Path, tmp_path: Path, how: str
) -> None:
    att = nccl_sensor.attach(libnccl(fakecuda))
    assert att is not None and {"ncclCommInitRank", "ncclCommSplit", "ncclCommUserRank"} <= set(att.symbols)
    idfile, raw = unique_id(tmp_path)
    extra = ("config",) if how == "init_rank_config" else ()
    truth, records, events = run_ranks(nccl_sensor, fakecuda, tmp_path, idfile, [0, 1], 2, *extra)
    model = Communicators()
    model.add(records)
    model.count_calls(events)
    want = comm_id_of_unique_id(raw)
    for t in truth:
        key = key_of(records, t["pid"])
        comms = model.of(key)
        main = model.main(key)
        assert main is not None
        # The communicator from the id every rank was given: one id, each its own rank.
        assert comms[t["comm"]] == main
        assert (main.id, main.rank, main.nranks) == (want, t["rank"], 2)
        made = CommKind.INIT_RANK_CONFIG if extra else CommKind.INIT_RANK
        assert main.kind is made
        # The split: a child of its own, its rank and size as NCCL answered them.
        sub = comms[t["sub"]]
        assert sub.id == comm_id_of_split(want, t["color"]) != want
        assert (sub.rank, sub.nranks) == (t["sub_rank"], t["sub_nranks"])
        # ncclCommInitAll's two, the failed init and the split with no color make no more.
        all0, all1 = comms[t["all"][0]], comms[t["all"][1]]
        assert (all0.rank, all1.rank, all0.nranks) == (0, 1, 2) and all0.id == all1.id != want
        assert len(comms) == 4
        # Later collectives carry the communicator: counted by handle.
        assert (main.calls, sub.calls, all0.calls, all1.calls) == (3, 2, 0, 1)
    (a, b) = [model.main(key_of(records, t["pid"])) for t in truth]
    assert a is not None and b is not None and a.id == b.id and (a.rank, b.rank) == (0, 1)
    # Ranks with another color are in another child.
    subs = {t["color"]: model.of(key_of(records, t["pid"]))[t["sub"]].id for t in truth}
    assert len(subs) == 2 and len(set(subs.values())) == 2
    st = nccl_sensor.stats()
    assert st[Stat.COMMS] == len(records) and st[Stat.COMMS_DROPPED] == 0
    # Each rank: two inits (one failed), two splits, two InitAll handles, two answers.
    assert len(records) == 2 * 8


def test_another_unique_id_is_another_communicator(nccl_sensor: NcclSensor, fakecuda: Path, tmp_path: Path) -> None:
    nccl_sensor.attach(libnccl(fakecuda))
    ids = [unique_id(tmp_path, f"id{i}") for i in range(2)]
    model = Communicators()
    got = []
    for path, _raw in ids:
        (t,), records, _ = run_ranks(nccl_sensor, fakecuda, tmp_path, path, [0], 4)
        model.add(records)
        main = model.main(key_of(records, t["pid"]))
        assert main is not None
        got.append(main.id)
    assert got == [comm_id_of_unique_id(raw) for _, raw in ids] and got[0] != got[1]


@pytest.mark.parametrize("cuda_delay_ms", [0, 400])
def test_memtrace_run_names_each_rank_by_its_communicator(fakecuda: Path, tmp_path: Path, cuda_delay_ms: int) -> None:
    """`memtrace run` on two ranks with no launcher's variables: each
    process's JSON row and its resource say the communicator, its own rank
    and the size; the communicator is its job. With a delay, each rank makes
    its communicators 400 ms (eight host samples) before its first CUDA call,
    so the agent meets it after they were read: they are kept until it does
    (they were dropped, one CI run in about fifteen, when a rank's first
    call was drained just after a sample had begun)."""
    idfile, raw = unique_id(tmp_path)
    out = tmp_path / "summary.json"
    truth = tmp_path / "truth.jsonl"
    env = dict(
        os.environ,
        WORKLOAD_TRUTH=str(truth),
        NCCL_CUDART=str(fakecuda / "lib" / "libcudart.so.13"),
        LD_LIBRARY_PATH=str(fakecuda / "lib"),
        NCCL_CUDA_DELAY_MS=str(cuda_delay_ms),
    )
    for v in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(v, None)
    rank = f"{fakecuda}/nccl_comm {libnccl(fakecuda)} {idfile}"
    p = subprocess.run(
        [
            *memtrace_cmd(),
            "run",
            "--host-interval",
            "0.05",
            "--format",
            "json",
            "-o",
            str(out),
            "--",
            "sh",
            "-c",
            f"{rank} 0 2 & {rank} 1 2; wait",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = {r["pid"]: r for r in doc["processes"]}
    want = comm_id_text(comm_id_of_unique_id(raw))
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    assert len(lines) == 2
    assert doc["agent"]["communicators_dropped"] == 0
    for t in lines:
        row = rows[t["pid"]]
        assert row["nccl"] == {"comm_id": want, "rank": t["rank"], "nranks": 2}
        assert row["job"] == {
            "id": f"nccl-{want}",
            "launcher": "nccl",
            "source": "nccl",
            "rank": t["rank"],
            "world_size": 2,
        }
