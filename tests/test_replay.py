"""The real PyTorch and JAX traces recorded on an H100, replayed through the
test libraries with their threads, layer nesting and pointer patterns:
memtrace reports exactly what the trace implies."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, run_traced

sys.path.insert(0, str(FIXTURES))
import traces  # noqa: E402

pytestmark = [
    pytest.mark.bpf,
    pytest.mark.skipif(
        traces.TRACES is None and not os.environ.get("CI"),
        reason="shared/traces is not beside this checkout (set MEMTRACE_TRACES)",
    ),
]


@pytest.mark.parametrize("name", traces.ALL)
def test_replayed_trace_totals_match_the_trace(name: str, fakecuda: Path, tmp_path: Path) -> None:
    recs = list(traces.records(name))
    replay = tmp_path / "replay.txt"
    n = traces.write_replay(recs, replay)
    want = traces.expected(recs)
    assert n == sum(v[0] for v in want.values()) > 0

    lib = fakecuda / "lib"
    doc, _, p = run_traced(
        [str(fakecuda / "replay"), str(lib / "libcudart.so.13"), str(lib / "libcuda.so.1"), str(replay)],
        tmp_path,
        env={"FAKE_LIBCUDA": str(lib / "libcuda.so.1")},
    )
    assert p.returncode == 0, p.stderr
    assert f"replayed {n} skipped 0" in p.stdout
    got: dict[tuple[str, str], tuple[int, int, int]] = {}
    for r in doc["memcpy"]:
        got[(r["api"], r["direction"])] = (r["calls"], r["bytes"], r["errors"])
    assert got == want
    assert doc["agent"]["events"] == n and doc["agent"]["dropped"] == 0
    # PyTorch's runtime copies each made a driver copy, seen and not counted.
    nested = sum(1 for r in recs if r["depth"] == 1 and r["sym"].startswith("cuMemcpy"))
    if nested:
        assert doc["agent"]["nested_driver_calls"] == nested
