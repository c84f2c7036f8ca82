"""What `memtrace run` says of how its command ended: an exit code, or the
signal that ended it, and whether ^C or SIGTERM reached it through memtrace."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import memtrace_cmd

pytestmark = pytest.mark.bpf


def _run(tmp_path: Path, script: str, term_after: float | None = None) -> tuple[dict, int]:
    out = tmp_path / "summary.json"
    p = subprocess.Popen(
        [*memtrace_cmd(), "run", "--no-host", "--format", "json", "-o", str(out), "--", "sh", "-c", script]
    )
    if term_after is not None:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(term_after)
        p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=120)
    return json.loads(out.read_text())["command"], code


def test_a_command_that_exits_says_its_code_and_no_signal(tmp_path: Path) -> None:
    command, code = _run(tmp_path, "exit 3")
    assert code == 3 and command["exit_code"] == 3
    assert "signal" not in command and "interrupted" not in command


def test_a_command_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    command, code = _run(tmp_path, "kill -KILL $$")
    assert code == 137 and command["exit_code"] == 137
    assert command["signal"] == "SIGKILL" and "interrupted" not in command


def test_sigterm_to_memtrace_reaches_the_command_and_is_said(tmp_path: Path) -> None:
    command, code = _run(tmp_path, f"touch {tmp_path / 'started'}; exec sleep 60", term_after=0.2)
    assert code == 143 and command["signal"] == "SIGTERM" and command["interrupted"] is True
