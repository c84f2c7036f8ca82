"""Steps found with no code change, against a loop that times its own steps
(tests/fixtures/steploop.c): real BPF, real uprobes, the test libraries with
their fake GPU (a wait sleeps until the launched kernels' time has passed).

What memtrace cannot see, and so the tolerances:
- the count: N iterations make N waits, and memtrace's steps run from one
  wait's return to the next, so it counts N - 1 (exactly);
- the median: memtrace's step is wait-return to wait-return, the loop's is
  start to end of an iteration: the same period at another phase, so each
  of memtrace's steps pairs the host work of one iteration with the GPU part
  of the next. On a loaded 2-core machine the steps vary; the medians of the
  two series stay close but not equal. Add the histogram's resolution (a
  quantile is within half a bucket, 1.1% at scale 5) and the probes' traps
  (microseconds against milliseconds): within 5%.
- the shares: memtrace divides by the time from the first boundary to the
  last, the loop by its wall time (one iteration more of 150 or so), and
  counts launches as host work: within 0.05 of the loop's own shares.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from conftest import run_traced

pytestmark = pytest.mark.bpf


def traced(fakecuda: Path, tmp_path: Path, *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    tmp_path.mkdir(exist_ok=True)
    # Every launch probed: these loops cost more than the default budget (a trap of ~10 us per
    # launch here), and the budget, which weighs a process from its first event, would sample
    # their launches, and a step's GPU idle time would run to its next wait (an upper bound).
    # Step times under the budget: test_diagnosis_traced.py.
    doc, lines, p = run_traced([str(fakecuda / "steploop"), *args], tmp_path, env={"MEMTRACE_OVERHEAD_BUDGET": "off"})
    assert p.returncode == 0, p.stderr
    assert len(lines) == 1, lines
    waits = sum(w["calls"] for w in doc["synchronization"] if w["api"] == "cudaStreamSynchronize")
    assert waits >= lines[0]["steps"], f"memtrace missed the loop's waits (attach failed?): {p.stderr}"
    return doc, lines


def row(doc: dict[str, Any], pid: int) -> dict[str, Any]:
    rows = [r for r in doc["steps"] if r["pid"] == pid]
    assert len(rows) == 1, doc["steps"]
    return rows[0]


@pytest.mark.parametrize("checkpoint", ["-e", "-E"], ids=["device_sync", "same_stream_sync"])
def test_step_count_and_median_match_the_loops_own(fakecuda: Path, tmp_path: Path, checkpoint: str) -> None:
    # a checkpoint every 10 steps: a D2H copy and a device sync (-e) or a
    # second sync of the step's own stream (-E), neither of which is a step
    doc, (truth,) = traced(fakecuda, tmp_path, "-n", "300", "-k", "500", "-w", "500", checkpoint, "10")
    r = row(doc, truth["pid"])
    assert r["process"] == "steploop" and r["tid"] == truth["pid"]
    assert r["steps"] == truth["steps"] - 1 == 299
    median = statistics.median(truth["step_ns"]) / 1e9
    assert r["duration_seconds"]["p50"] == pytest.approx(median, rel=0.05)


def test_a_one_shot_script_reports_no_steps(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "steploop"), "-1", "-c", "8"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert sum(r["calls"] for r in doc["memcpy"]) == 9  # it was traced: 8 H2D copies and a D2H copy
    assert doc["synchronization"] and doc["steps"] == []


def test_breakdown_tells_waiting_for_the_gpu_from_host_work(fakecuda: Path, tmp_path: Path) -> None:
    # waits for the GPU most of a step: 3 kernels of 1 ms, 200 us of host work
    waits, (wt,) = traced(fakecuda, tmp_path / "w", "-n", "150", "-l", "3", "-k", "1000", "-w", "200")
    # computes on the CPU most of a step: 1 kernel of 50 us, 3 ms of host work
    works, (ct,) = traced(fakecuda, tmp_path / "c", "-n", "150", "-l", "1", "-k", "50", "-w", "3000")
    w, c = row(waits, wt["pid"]), row(works, ct["pid"])
    assert w["steps"] == c["steps"] == 149
    for r, t in ((w, wt), (c, ct)):
        b = r["breakdown"]
        assert b["sync_wait"] == pytest.approx(t["wait_ns"] / t["wall_ns"], abs=0.05)
        assert b["host"] == pytest.approx(t["host_ns"] / t["wall_ns"], abs=0.05)
        assert b["collective"] == 0.0
        assert sum(b.values()) == pytest.approx(1.0)
        # the GPU sits idle from each wait's return to the next step's first copy
        assert r["gpu_idle_share"] == pytest.approx(t["idle_ns"] / t["wall_ns"], abs=0.05)
    assert w["breakdown"]["sync_wait"] > 0.5 > c["breakdown"]["sync_wait"]
    assert c["breakdown"]["host"] > 0.5 > w["breakdown"]["host"]


def test_the_gpu_is_not_idle_while_the_host_works_after_launching(fakecuda: Path, tmp_path: Path) -> None:
    """No H2D copies: each step launches two kernels, works 2 ms on the host
    while the GPU runs them, then reads the result back and waits. The GPU
    idles only from the wait's return to the next step's first launch (the
    1 ms of host work after it): the launch probe's first-launch time says
    so; the next copy alone would have put those 2 ms in GPU idle too."""
    doc, (truth,) = traced(
        fakecuda, tmp_path, "-n", "150", "-c", "0", "-l", "2", "-k", "50", "-p", "2000", "-w", "1000"
    )
    r = row(doc, truth["pid"])
    assert r["steps"] == 149
    assert r["gpu_idle_share"] == pytest.approx(truth["idle_ns"] / truth["wall_ns"], abs=0.05)
    assert r["gpu_idle_share"] < 0.5  # the bound without launch times: about 0.97
