"""Resource attributes from a process's cgroup, under the common runtimes."""

from __future__ import annotations

import os

import pytest

from memtrace.sources.procfs import clean, from_cgroup, process_attributes

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
