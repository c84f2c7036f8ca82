"""Finding CUDA libraries where users have them: in processes already
running, and inside other mount namespaces (containers)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, observed_totals, run_traced, truth_totals

from memtrace.runtime.agent import Agent
from memtrace.sensors.cuda import Options

pytestmark = pytest.mark.bpf


def wait_ready(p: subprocess.Popen) -> None:
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"


def drain_until_exit(agent: Agent, p: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        agent.poll()
        time.sleep(0.005)
    assert p.returncode == 0
    agent.poll()
    agent.sync_totals()


def in_namespace(build: Path, script: str) -> list[str]:
    """sh -c script inside a new mount namespace where `build` is a private
    tmpfs holding a copy of the test build: its files exist only there."""
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"mount -t tmpfs none {build} && cp -a {build}.src/. {build}/ && {script}",
    ]


def test_process_already_running_in_another_mount_namespace(fakecuda: Path, tmp_path: Path) -> None:
    build = tmp_path / "ns"
    shutil.copytree(fakecuda, str(build) + ".src")
    build.mkdir()
    truth = tmp_path / "truth.jsonl"
    p = subprocess.Popen(
        # Started before memtrace: its unified copies cannot be resolved (the
        # pointers' origins were never seen), so they stay "default".
        in_namespace(build, f"WORKLOAD_RAW_DIRECTIONS=1 WORKLOAD_TRUTH={truth} exec {build}/workload -w -n 800 -s 21"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(p)
        # The libraries are only visible inside the namespace.
        assert not (build / "lib" / "libcuda.so.1").exists()
        with Agent(Options()) as agent:
            agent.cuda.scan()
            names = sorted(Path(a.name).name for a in agent.libraries)
            assert names == ["libcuda.so.1", "libcudart.so.13"]
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            drain_until_exit(agent, p)
            from memtrace.export.report import summary

            doc = summary(agent.model, agent.stats(), agent.libraries)
    finally:
        p.kill()
        p.wait()
    lines = [__import__("json").loads(l) for l in truth.read_text().splitlines()]
    pid = lines[0]["pid"]
    got = {k: v for k, v in observed_totals(doc).items() if k[0] == pid}
    assert got == truth_totals(lines)
    # Nor can its host memory be named: unknown, never guessed.
    assert {r["host_memory"] for r in doc["memcpy"] if r["pid"] == pid and r["direction"] == "h2d"} == {"unknown"}


def test_library_opened_inside_another_mount_namespace(fakecuda: Path, tmp_path: Path) -> None:
    build = tmp_path / "ns"
    shutil.copytree(fakecuda, str(build) + ".src")
    build.mkdir()
    script = f"exec {sys.executable} {FIXTURES / 'ctypes_workload.py'} {build}/lib --calls 600"
    doc, lines, p = run_traced(in_namespace(build, script), tmp_path)
    assert p.returncode == 0, p.stderr
    assert observed_totals(doc) == truth_totals(lines)
    assert {Path(l["path"]).name for l in doc["agent"]["libraries"]} == {"libcudart.so.13", "libcuda.so.1"}


def test_each_file_is_attached_once_however_many_processes_map_it(fakecuda: Path, tmp_path: Path) -> None:
    w = fakecuda / "workload"
    script = " & ".join(f"{w} -n 200 -s {i}" for i in range(4)) + "; wait"
    doc, lines, p = run_traced(["/bin/sh", "-c", script], tmp_path)
    assert p.returncode == 0
    assert observed_totals(doc) == truth_totals(lines)
    assert len(doc["agent"]["libraries"]) == 2


def test_process_started_later_that_dlopens_the_runtime_is_counted_from_its_first_copy(
    fakecuda: Path, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.jsonl"
    with Agent(Options()) as agent:
        agent.cuda.scan()
        p = subprocess.Popen(
            [sys.executable, str(FIXTURES / "ctypes_workload.py"), str(fakecuda / "lib"), "--calls", "700"],
            env={"WORKLOAD_TRUTH": str(truth), "PATH": "/usr/bin:/bin"},
        )
        drain_until_exit(agent, p)
        from memtrace.export.report import summary

        doc = summary(agent.model, agent.stats(), agent.libraries)
    lines = [__import__("json").loads(l) for l in truth.read_text().splitlines()]
    got = {k: v for k, v in observed_totals(doc).items() if k[0] == p.pid}
    assert got == truth_totals(lines)
    assert doc["agent"]["holds"] >= 1
