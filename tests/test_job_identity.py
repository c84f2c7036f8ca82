"""A job's ranks named with no change to the job: `memtrace run` over a
launcher that starts ranks with torchrun's variables (and one process it
starts without) says each process's job and rank, as the launcher gave them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_traced

pytestmark = pytest.mark.bpf


def test_run_names_each_rank_of_its_job_as_the_launcher_started_it(fakecuda: Path, tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    workload = fakecuda / "workload"
    # Three ranks of one job, each told its rank as torchrun tells it; one helper process told nothing.
    launcher = (
        "for r in 0 1 2; do "
        f"RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 TORCHELASTIC_RUN_ID=job-7 MASTER_ADDR=10.9.0.1 MASTER_PORT=29500 "
        f'{workload} -n 40 -s $((20 + r)) & echo "$! $r" >> {ranks}; done; '
        f'{workload} -n 10 -s 30 & echo "$! -" >> {ranks}; wait'
    )
    doc, truth, p = run_traced(["sh", "-c", launcher], tmp_path, env={"RANK": "", "TORCHELASTIC_RUN_ID": ""})
    assert p.returncode == 0, p.stderr[-2000:]
    told = dict(line.split() for line in ranks.read_text().splitlines())
    assert len(truth) == 4 and {str(t["pid"]) for t in truth} == set(told)
    rows = {str(r["pid"]): r for r in doc["processes"]}
    for pid, rank in told.items():
        job = rows[pid]["job"]
        if rank == "-":
            assert job is None
            continue
        assert job == {
            "id": "job-7",
            "launcher": "torchelastic",
            "rank": int(rank),
            "world_size": 3,
            "local_rank": int(rank),
        }
        assert rows[pid]["executable"].endswith("/workload") and rows[pid]["exited"] is True
