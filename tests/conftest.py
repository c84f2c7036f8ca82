"""Shared test fixtures: the test CUDA libraries, built once per session,
and helpers to run memtrace and compare its totals with a workload's truth."""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from memtrace.sensors.nccl import NcclSensor


FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent

Key = tuple[int, str, str]  # pid, api, direction


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("CI must run as root: the BPF tests may not be skipped there")
    skip = pytest.mark.skip(reason="needs root to load BPF programs")
    for item in items:
        if "bpf" in item.keywords:
            item.add_marker(skip)
        elif "root" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs root (a cgroup, a namespace)"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import sys

    mod = sys.modules.get("test_kernels")
    for line in getattr(mod, "BOOTED", []):
        terminalreporter.write_line(f"memtrace objects proven on {line}")


@pytest.fixture(scope="session")
def fakecuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the test CUDA libraries and workloads; return the build dir."""
    out = tmp_path_factory.mktemp("fakecuda")
    subprocess.run(["make", "-s", "-C", str(FIXTURES), f"OUT={out}"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def fakenvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding the test libnvidia-ml.so.1, and nothing else."""
    out = tmp_path_factory.mktemp("fakenvml")
    subprocess.run(
        ["make", "-s", "-C", str(FIXTURES), f"OUT={out}", f"{out}/nvml/libnvidia-ml.so.1"],
        check=True,
        capture_output=True,
    )
    return out / "nvml"


def memtrace_cmd() -> list[str]:
    return [sys.executable, "-m", "memtrace"]


def run_traced(
    argv: list[str], tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 180
) -> tuple[dict, list[dict], subprocess.CompletedProcess]:
    """`memtrace run --format json` around argv; returns (summary, truth lines, process)."""
    truth = tmp_path / "truth.jsonl"
    out = tmp_path / "summary.json"
    e = dict(os.environ, WORKLOAD_TRUTH=str(truth), **(env or {}))
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--format", "json", "-o", str(out), "--", *argv],
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    doc = json.loads(out.read_text()) if out.exists() else {}
    lines = [json.loads(l) for l in truth.read_text().splitlines()] if truth.exists() else []
    return doc, lines, p


def truth_totals(lines: list[dict]) -> dict[Key, tuple[int, int, int]]:
    out: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0])
    for line in lines:
        for c in line["copies"]:
            t = out[(line["pid"], c["api"], c["direction"])]
            t[0] += c["calls"]
            t[1] += c["bytes"]
            t[2] += c["errors"]
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


def observed_totals(doc: dict) -> dict[Key, tuple[int, int, int]]:
    out: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in doc["memcpy"]:
        t = out[(r["pid"], r["api"], r["direction"])]
        t[0] += r["calls"]
        t[1] += r["bytes"]
        t[2] += r["errors"]
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def python_as_nobody() -> list[str]:
    """The command that runs an interpreter of this Python's version as the
    nobody user; give it this environment's packages through PYTHONPATH
    (site.getsitepackages()). This one where nobody may run it, else the
    system's of the same minor (compiled packages load). pyenv's, built
    --enable-shared under root's 0700 home, cannot even find its libpython
    there: then nobody runs it holding CAP_DAC_READ_SEARCH alone (files read,
    nothing else: not one of the capabilities memtrace needs, which doctor
    names), so the unprivileged paths are tested under every Python."""
    # Each is tried as the tests run it: from /, importing memtrace and its
    # dependencies through PYTHONPATH (a clone under a folder nobody may
    # enter, as `mktemp -d` makes, starts the interpreter and fails there).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *site.getsitepackages()]))

    def works(argv: list[str]) -> bool:
        probe = [*argv, "-c", "import memtrace.cli, pyroute2"]
        return subprocess.run(probe, capture_output=True, env=env, cwd="/").returncode == 0

    if works([*NOBODY, sys.executable]):
        return [*NOBODY, sys.executable]
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (shutil.which(ver), f"/usr/bin/{ver}"):
        if cand and works([*NOBODY, cand]):
            return [*NOBODY, cand]
    reader = [*NOBODY, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", sys.executable]
    if works(reader):
        return reader
    pytest.skip(f"no {ver} that the nobody user can run (this one is under a private home)")


def top_once_attached(
    fakecuda: Path, columns: int, refreshes: int = 3, extra: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """`memtrace top` started and past attaching the test runtime library
    (its `-v` log says so): a workload released now is traced from its
    first call, however long the agent took to start."""
    top = subprocess.Popen(
        [*memtrace_cmd(), "top", "-v", "-n", str(refreshes), "-i", "1", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS=str(columns)),
    )
    assert top.stderr is not None
    lib = str(fakecuda / "lib" / "libcudart")
    for line in top.stderr:
        if "attached" in line and lib in line:
            return top
    raise AssertionError(f"memtrace top exited ({top.wait()}) without attaching {lib}")


def top_over_a_released_workload(fakecuda: Path, columns: int) -> tuple[int, str]:
    """A test workload waiting before its first call, then `memtrace top` at
    this width past attaching, then the workload let go: (its pid, what top
    printed over three refreshes)."""
    w = subprocess.Popen(
        [str(fakecuda / "workload"), "-w", "-n", "2000", "-e"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"WORKLOAD_TRUTH": "/dev/null"},
    )
    assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    top = top_once_attached(fakecuda, columns)
    assert w.stdin is not None
    w.stdin.write("go\n")
    w.stdin.flush()
    out, _ = top.communicate(timeout=60)
    w.wait()
    assert top.returncode == 0
    return w.pid, out


def limited_cgroup(controller: str, v2: dict[str, str], v1: dict[str, str]) -> Path:
    """A new cgroup of `controller` with its limits written (cgroups.py);
    skipped where this host has no such controller. remove_cgroup() when done."""
    from cgroups import make_limited

    d = make_limited(controller, v2, v1, f"memtrace-test-{controller}-{os.getpid()}")
    if d is None:
        pytest.skip(f"no {controller} cgroup controller")
    return d


def remove_cgroup(d: Path) -> None:
    """Kill what is left in a test's cgroup, then remove it."""
    deadline = time.monotonic() + 10
    while (pids := (d / "cgroup.procs").read_text().split()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    d.rmdir()


@pytest.fixture(params=["multi", "single"])
def nccl_sensor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[NcclSensor]:
    """The NCCL sensor (tests/test_nccl_sensor.py, test_nccl_comms.py), attached with a
    multi-uprobe link per program (this kernel has them),
    and one link per probe (older kernels, MEMTRACE_UPROBE_MULTI=0)."""
    from memtrace.sensors.nccl import NcclSensor  # here: conftest is imported by every test run

    if request.param == "single":
        monkeypatch.setenv("MEMTRACE_UPROBE_MULTI", "0")
    s = NcclSensor()
    s.start()
    assert s.multi == (request.param == "multi")
    try:
        yield s
    finally:
        s.close()


def libnccl(fakecuda: Path) -> str:
    """The test libnccl.so.2 (NCCL's real signatures)."""
    return str(fakecuda / "nccl" / "libnccl.so.2")
