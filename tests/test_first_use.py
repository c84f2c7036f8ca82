"""What a new user meets first, run through the real CLI as a subprocess:
exit codes, errors without tracebacks, output that never mixes with the
traced command's, and tables readable at 80 columns."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, memtrace_cmd

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def memtrace(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*memtrace_cmd(), *args], capture_output=True, text=True, env=dict(os.environ, **(env or {})), **kw
    )


def shell(cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A pipeline as a user types it, memtrace being `$MT`."""
    mt = " ".join(memtrace_cmd())
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + cmd.replace("$MT", mt)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=120,
    )


@pytest.mark.parametrize("size", ["nan", "inf", "-inf", "NaN"])
def test_ring_size_not_a_number_is_a_clear_error(size: str) -> None:
    p = memtrace("run", "--ring-size", size, "--", "true")
    assert p.returncode == 2, p.stderr
    assert "--ring-size" in p.stderr and "fix:" in p.stderr
    assert "Traceback" not in p.stderr


def _python_for_nobody() -> list[str]:
    """An interpreter the nobody user can run, seeing this project's packages.
    The venv's interpreter may live under root's 0700 home."""
    probe = subprocess.run([*NOBODY, sys.executable, "-c", "pass"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable]
    # Same minor version, so the venv's compiled packages still load.
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (shutil.which(ver), f"/usr/bin/{ver}", "/usr/bin/python3"):
        if cand and subprocess.run([*NOBODY, cand, "-c", "pass"], capture_output=True).returncode == 0:
            return [cand]
    pytest.skip("no Python interpreter that the nobody user can run")


@pytest.mark.bpf
def test_doctor_as_non_root_reports_instead_of_crashing(tmp_path: Path) -> None:
    py = _python_for_nobody()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *site.getsitepackages()]))
    p = subprocess.run(
        [*NOBODY, *py, "-m", "memtrace", "doctor"], capture_output=True, text=True, env=env, cwd="/", timeout=120
    )
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL  privileges: uid 65534" in p.stdout
    assert "cannot run here" in p.stdout
