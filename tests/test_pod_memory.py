"""Device memory per process and per pod: memtrace's own accounting (the CUDA alloc/free probes)
beside NVML's per-process figure, against traced processes in cgroups named as kubelet names a pod's,
and the test NVML told what each holds (tests/fixtures/pod_memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, memtrace_cmd
from test_nvml import HEALTHY, gpu, script

from memtrace.sources.cgroup import cgroup2_root

MIB = 1 << 20
POD_A = "0b8e8f2a-1c1d-4e5f-9a0b-123456789abc"
POD_B = "7d6c5b4a-3e2f-4a1b-8c9d-abcdef012345"


@pytest.fixture
def pod_cgroups() -> Iterator[dict[str, Path]]:
    """Two pods' cgroups, in the systemd driver's naming (underscores in the uid)."""
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy")
    base = root / "memtrace-test-kubepods.slice"
    dirs = {uid: base / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice" for uid in (POD_A, POD_B)}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    yield dirs
    for d in dirs.values():
        d.rmdir()
    base.rmdir()


@pytest.mark.bpf
def test_each_process_and_pod_has_memtraces_bytes_beside_nvmls(
    fakecuda: Path, fakenvml: Path, tmp_path: Path, pod_cgroups: dict[str, Path]
) -> None:
    """Two processes of pod A and one of pod B allocate and free; the test NVML lists each with what
    it still holds plus a context. Each device_memory row has the process's own bytes exactly, NVML's
    figure as told, and their difference; each pod sums its own processes and no other's."""
    spec = [
        {
            "cgroup": str(pod_cgroups[POD_A]),
            "allocate": [3 * MIB + 1, 5 * MIB + 7, 4096],
            "free": [1],
            "context": 300 * MIB,
        },
        {"cgroup": str(pod_cgroups[POD_A]), "allocate": [7 * MIB + 3], "free": [], "context": 290 * MIB + 5},
        {"cgroup": str(pod_cgroups[POD_B]), "allocate": [2 * MIB, MIB + 9], "free": [0], "context": 310 * MIB},
    ]
    nvml_script = tmp_path / "nvml.script"
    nvml_script.write_text(script(count=1, **gpu(0, uuid="GPU-pods", **HEALTHY)))
    truth_file, out = tmp_path / "truth.jsonl", tmp_path / "summary.json"
    argv = [sys.executable, str(FIXTURES / "pod_memory.py"), str(fakecuda / "lib"), str(nvml_script), json.dumps(spec)]
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(fakenvml),
        FAKE_NVML_SCRIPT=str(nvml_script),
        WORKLOAD_TRUTH=str(truth_file),
    )
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--format", "json", "-o", str(out), "--", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    truth = json.loads(truth_file.read_text())
    want_in_use = [sum(n for i, n in enumerate(e["allocate"]) if i not in e["free"]) for e in spec]
    assert [t["in_use"] for t in truth] == want_in_use

    rows = {r["pid"]: r for r in doc["device_memory"]}
    pods = {r["pid"]: r["pod_uid"] for r in doc["processes"]}
    for t, e in zip(truth, spec, strict=True):
        r = rows[t["pid"]]
        assert r["in_use_bytes"] == t["in_use"]  # the probes' count, byte for byte
        assert r["allocated_bytes"] == sum(e["allocate"])
        assert r["nvml_used_bytes"] == t["nvml"]  # what the test NVML was told
        assert r["unattributed_bytes"] == e["context"]
    assert [pods[t["pid"]] for t in truth] == [POD_A, POD_A, POD_B]

    by_pod = {r["pod_uid"]: r for r in doc["pods"]}
    assert set(by_pod) == {POD_A, POD_B}
    for uid, members in ((POD_A, truth[:2]), (POD_B, truth[2:])):
        r = by_pod[uid]
        assert r["pids"] == sorted(t["pid"] for t in members)
        assert r["in_use_bytes"] == sum(t["in_use"] for t in members)
        assert r["nvml_used_bytes"] == sum(t["nvml"] for t in members)
        assert r["unattributed_bytes"] == r["nvml_used_bytes"] - r["in_use_bytes"]
    # The parent, in no pod and listed by no GPU, has no pod row and no NVML figure.
    assert all(r["nvml_used_bytes"] is None for pid, r in rows.items() if pid not in {t["pid"] for t in truth})


def test_push_sends_each_process_and_pods_memory_by_memtrace_and_nvml() -> None:
    """The rich build's stepping process is in a pod and NVML lists it with 300 MiB: its process
    gauges and its pod's (on the agent) carry memtrace's bytes, NVML's and the difference."""
    from test_otlp import emitted, rich_build

    _, batch = rich_build()
    got = emitted(batch)

    def values(name: str) -> list[tuple[dict[str, Any], float, bool]]:
        return [(dict(p.attributes), p.value, on) for x, on in got[name] for p in x.data.data_points]

    in_use = 4096  # its allocation not freed
    assert ({}, in_use, True) in values("gpu.memory.in_use")
    assert values("gpu.memory.nvml_used") == [({}, 300 * MIB, True)]
    assert values("gpu.memory.unattributed") == [({}, 300 * MIB - in_use, True)]
    pod = {"k8s.pod.uid": POD_A}
    assert values("memtrace.pod.gpu.memory.in_use") == [(pod, in_use, False)]
    assert values("memtrace.pod.gpu.memory.nvml_used") == [(pod, 300 * MIB, False)]
    assert values("memtrace.pod.gpu.memory.unattributed") == [(pod, 300 * MIB - in_use, False)]
