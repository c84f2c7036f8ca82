"""The traced job is never harmed by the agent: nothing is left stopped
or attached when the agent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.bpf

AGENT = textwrap.dedent(
    """
    import sys, time
    from memtrace.runtime.agent import Agent
    from memtrace.sensors.cuda import Options
    with Agent(Options()) as agent:
        print("ready", flush=True)
        while True:
            agent.poll()
            time.sleep(0.005)
    """
)


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def memtrace_links() -> int:
    out = subprocess.run(["bpftool", "link", "show"], capture_output=True, text=True).stdout
    progs = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    return sum(1 for l in progs.splitlines() if "mt_copy_" in l) + out.count("mt_copy_")


def test_agent_killed_while_holding_a_process_releases_it(fakecuda: Path) -> None:
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
    # A frozen agent cannot answer a hold: the workload stays stopped...
    os.kill(agent.pid, signal.SIGSTOP)
    w = subprocess.Popen([str(fakecuda / "workload_driver"), "-n", "200"], env={"WORKLOAD_TRUTH": "/dev/null"})
    try:
        deadline = time.monotonic() + 10
        while state(w.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state(w.pid) == "T", "the workload was not held"
        # ...until the agent dies: its guardian continues the workload.
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        assert w.wait(timeout=20) == 0
    finally:
        w.kill()
        agent.kill()
    deadline = time.monotonic() + 10
    while memtrace_links() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert memtrace_links() == 0, "probes outlived the agent"


def test_workload_survives_the_agent_being_killed_mid_run(fakecuda: Path, tmp_path: Path) -> None:
    truth_traced, truth_free = tmp_path / "traced.jsonl", tmp_path / "free.jsonl"
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
    w = subprocess.Popen(
        [str(fakecuda / "workload"), "-n", "3000", "-t", "3", "-s", "31"], env={"WORKLOAD_TRUTH": str(truth_traced)}
    )
    time.sleep(0.3)
    agent.kill()
    agent.wait()
    assert w.wait(timeout=120) == 0
    free = subprocess.run(
        [str(fakecuda / "workload"), "-n", "3000", "-t", "3", "-s", "31"], env={"WORKLOAD_TRUTH": str(truth_free)}
    )
    assert free.returncode == 0
    # Same results traced (and cut off) as untraced.
    import json

    a = json.loads(truth_traced.read_text())
    b = json.loads(truth_free.read_text())
    assert a["copies"] == b["copies"]
