"""Resource attributes from a process's cgroup, under the common runtimes,
and its job and rank from its launcher's variables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memtrace.sources.procfs import clean, environ, from_cgroup, job_identity, process_attributes

CID = "3f1b2c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"
UID = "8c9a6f5e-1b2c-4d3e-9f8a-7b6c5d4e3f2a"


@pytest.mark.parametrize(
    "cgroup",
    [
        # containerd, systemd driver, cgroup v2
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # CRI-O, systemd driver
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
        f"crio-{CID}.scope\n",
        # cgroupfs driver, cgroup v1 (several hierarchies)
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n",
    ],
)
def test_kubernetes_pod_and_container(cgroup: str) -> None:
    assert from_cgroup(cgroup) == {"container.id": CID, "k8s.pod.uid": UID}


def test_docker_and_bare_hosts() -> None:
    assert from_cgroup(f"0::/system.slice/docker-{CID}.scope\n") == {"container.id": CID}
    assert from_cgroup(f"0::/docker/{CID}\n") == {"container.id": CID}
    assert from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n") == {}
    assert from_cgroup("") == {}


def test_this_process_has_a_pid_and_an_executable_path() -> None:
    a = process_attributes(os.getpid(), "/usr/bin/python3.11")
    assert a["process.pid"] == os.getpid() and a["process.executable.path"] == "/usr/bin/python3.11"
    assert "process.executable.name" not in a  # BPF's name, the table's (otlp.resource_of)


def test_the_otlp_name_of_a_process_is_the_one_the_table_says() -> None:
    """`python3` runs /usr/bin/python3.11: the table, the JSON, the metrics'
    resource and the finding events all say python3; the path keeps the rest."""
    from memtrace.core.ids import ProcessInfo, ProcessKey
    from memtrace.export.config import resolve
    from memtrace.export.otlp import MetricsBuilder
    from memtrace.export.report import summary
    from memtrace.model import Model

    key = ProcessKey(os.getpid(), 0)
    exe = "/usr/bin/python3.11"
    m = Model(identify=lambda k: ProcessInfo(name="python3", exe=exe, attributes=process_attributes(k.pid, exe)))
    m.introduce(key, "python3", 0)
    m.set_launches(key, {100: 1})
    (row,) = summary(m, {}, [])["launches"]
    batch = MetricsBuilder(resolve({}, endpoint="http://x:1"), {}).build(m, {}, 0)
    resources = [dict(r.resource.attributes) for r in batch.data.resource_metrics]
    (res,) = [r for r in resources if "process.pid" in r]
    assert row["process"] == res["process.executable.name"] == "python3"
    assert res["process.executable.path"] == exe


def test_values_are_printable_and_bounded() -> None:
    assert clean("a\nb\x01c") == "a?b?c"
    assert len(clean("x" * 1000)) == 128
    assert clean("") == "?"


# ---- the job and the rank, from the launcher's variables ----

TORCHRUN = {"TORCHELASTIC_RUN_ID": "ft-42", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("env", "want"),
    [
        # torchrun across hosts: its run id names the job; the rank variables torch reads
        (
            {**TORCHRUN, "RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1"},
            {"id": "ft-42", "launcher": "torchelastic", "rank": 9, "world_size": 16, "local_rank": 1},
        ),
        # torchrun under srun: torchrun's own variables win over Slurm's
        (
            {**TORCHRUN, "RANK": "3", "WORLD_SIZE": "8", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0"},
            {"id": "ft-42", "launcher": "torchelastic", "rank": 3, "world_size": 8},
        ),
        # srun alone: the job and its step; the task's rank
        (
            {
                "SLURM_JOB_ID": "77",
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "16",
                "SLURM_LOCALID": "1",
            },
            {"id": "77.0", "launcher": "slurm", "rank": 5, "world_size": 16, "local_rank": 1},
        ),
        # a static rendezvous (torch.distributed's env://) on a shared address
        (
            {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500", "RANK": "2", "WORLD_SIZE": "4"},
            {"id": "10.0.0.7:29500", "launcher": "rendezvous", "rank": 2, "world_size": 4},
        ),
        # torchrun --standalone: run id `none`, a loopback address: one host's job, named with the host
        (
            {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "RANK": "1"},
            {"id": "node-a/127.0.0.1:29400", "launcher": "rendezvous", "rank": 1},
        ),
        # Open MPI and MPICH ranks without a job id
        (
            {"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
            {"launcher": "openmpi", "rank": 4, "world_size": 8, "local_rank": 0},
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, {"launcher": "mpich", "rank": 1, "world_size": 2}),
        # a Kubernetes Indexed Job's pod: its index (the job comes from the collector, by pod)
        ({"JOB_COMPLETION_INDEX": "6"}, {"launcher": "kubernetes-indexed-job", "rank": 6}),
        # no launcher; and values that are not ranks
        ({"PATH": "/usr/bin", "HOME": "/root"}, {}),
        # RANK is no rank: Slurm's task id is; a count not above the rank is no count
        ({"RANK": "-1", "WORLD_SIZE": "x", "SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, {"launcher": "slurm", "rank": 2}),
    ],
)
def test_the_job_and_rank_come_from_the_launchers_variables(env: dict[str, str], want: dict) -> None:
    got = job_identity(env, host="node-a")
    assert got == {f"memtrace.job.{k}": v for k, v in want.items()}


def test_a_running_process_is_read_from_the_environment_it_was_started_with() -> None:
    """A real process: /proc/PID/environ, what its launcher gave it; a
    variable it sets itself afterwards is not its launcher's."""
    env = dict(os.environ, **TORCHRUN, RANK="5", WORLD_SIZE="8", LOCAL_RANK="1")
    script = "import os, sys; os.environ['RANK'] = '0'; print('ok', flush=True); sys.stdin.read()"
    p = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "ok\n"
        a = process_attributes(p.pid)
    finally:
        p.communicate("")
    assert a["memtrace.job.id"] == "ft-42" and a["memtrace.job.launcher"] == "torchelastic"
    assert (a["memtrace.job.rank"], a["memtrace.job.world_size"], a["memtrace.job.local_rank"]) == (5, 8, 1)


def test_environ_is_split_on_nuls_and_keeps_what_follows_the_first_equals() -> None:
    assert environ(b"A=1\0B=x=y\0EMPTY=\0junk\0\0") == {"A": "1", "B": "x=y", "EMPTY": ""}
