"""Every benchmark at least starts: it is run by hand, not in CI, so one
that breaks (probe_cost.py stopped at import once an event field was
added, unseen for days) would otherwise wait for the next person who
needs its figure. `--help` runs each script's imports and module-level
code and its argument parser, and measures nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

BENCHES = sorted(p for p in (REPO / "bench").glob("*.py") if p.name != "common.py")
BENCHES.append(REPO / "bench" / "diagnose" / "run.py")


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: str(p.relative_to(REPO / "bench")))
def test_the_benchmark_starts(bench: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(bench), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage:" in p.stdout, p.stdout[-500:]
