"""memtrace's totals equal the workloads' own ground truth, call for call and
byte for byte: real BPF programs, real uprobes, real test libraries."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import FIXTURES, observed_totals, run_traced, truth_totals

pytestmark = pytest.mark.bpf


def assert_exact(doc: dict, lines: list[dict], nprocs: int = 1) -> None:
    truth = truth_totals(lines)
    assert len({k[0] for k in truth}) == nprocs, lines
    assert observed_totals(doc) == truth
    calls = sum(v[0] for v in truth.values())
    agent = doc["agent"]
    assert agent["events"] == calls and agent["dropped"] == 0
    assert agent["calls_without_event"] == 0


def layers(doc: dict) -> dict[str, str]:
    return {r["api"]: r["layer"] for r in doc["memcpy"]}


def test_dynamic_runtime_and_driver_counted_once_each(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload"), "-n", "1500", "-s", "11"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)
    # Each runtime copy made a nested driver copy, counted once (at the runtime).
    assert doc["agent"]["nested_driver_calls"] > 0
    seen = layers(doc)
    assert seen["cudaMemcpy2D"] == "runtime" and seen["cuMemcpyHtoD_v2"] == "driver"
    libs = {Path(l["path"]).name: l["layer"] for l in doc["agent"]["libraries"]}
    assert libs == {"libcudart.so.13": "runtime", "libcuda.so.1": "driver"}


def test_driver_only_workload_like_jax(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload_driver"), "-n", "1500", "-s", "12"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)
    assert set(layers(doc).values()) == {"driver"}
    assert {"cuMemcpy2D_v2", "cuMemcpyPeerAsync", "cuMemcpy"} <= set(layers(doc))


def test_statically_linked_runtime_inside_the_executable(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload_static"), "-n", "1500", "-s", "13"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)
    assert layers(doc)["cudaMemcpyAsync"] == "runtime"
    libs = {Path(l["path"]).name: l["layer"] for l in doc["agent"]["libraries"]}
    assert libs.get("workload_static") == "runtime"


def test_python_loads_runtime_with_ctypes_after_start(fakecuda: Path, tmp_path: Path) -> None:
    argv = [sys.executable, str(FIXTURES / "ctypes_workload.py"), str(fakecuda / "lib"), "--calls", "1200"]
    doc, lines, p = run_traced(argv, tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)
    # dlopen after start is caught by the hold: the first copy is counted.
    assert doc["agent"]["holds"] >= 1


def test_libraries_deleted_while_attached_keep_counting(fakecuda: Path, tmp_path: Path) -> None:
    argv = [sys.executable, str(FIXTURES / "ctypes_workload.py"), str(fakecuda / "lib"), "--delete", "--calls", "800"]
    doc, lines, p = run_traced(argv, tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)


def test_threads(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload"), "-n", "500", "-t", "6", "-s", "14"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)


def test_fork_children_are_traced_from_their_first_copy(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload"), "-n", "1200", "-t", "2", "-f", "-s", "15"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines, nprocs=2)


def test_children_spawned_through_a_shell(fakecuda: Path, tmp_path: Path) -> None:
    w = fakecuda / "workload_driver"
    script = f"{w} -n 300 -s 1 && {w} -n 300 -s 2 & {fakecuda / 'workload'} -n 300 -s 3; wait"
    doc, lines, p = run_traced(["/bin/sh", "-c", script], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines, nprocs=3)


def test_process_killed_inside_a_copy(fakecuda: Path, tmp_path: Path) -> None:
    doc, lines, p = run_traced([str(fakecuda / "workload"), "-n", "400", "-s", "16", "-k"], tmp_path)
    assert p.returncode == 128 + 9
    # The copies that returned are exact; the one the process died in is
    # counted as abandoned, not as a copy.
    assert observed_totals(doc) == truth_totals(lines)
    assert doc["agent"]["abandoned_calls"] == 1


def test_exit_code_is_the_commands(tmp_path: Path) -> None:
    _, _, p = run_traced(["/bin/sh", "-c", "exit 7"], tmp_path)
    assert p.returncode == 7
    _, _, p = run_traced(["/bin/sh", "-c", "kill -TERM $$"], tmp_path)
    assert p.returncode == 128 + 15


def test_untraced_processes_are_not_counted(fakecuda: Path, tmp_path: Path) -> None:
    import subprocess

    outside = subprocess.Popen([str(fakecuda / "workload"), "-n", "3000", "-e"], env={"WORKLOAD_TRUTH": "/dev/null"})
    try:
        doc, lines, p = run_traced([str(fakecuda / "workload_driver"), "-n", "500", "-s", "17"], tmp_path)
    finally:
        outside.wait()
    assert p.returncode == 0
    assert {r["pid"] for r in doc["memcpy"]} == {lines[0]["pid"]}
    assert_exact(doc, lines)


def test_batch_copies_one_by_one_then_summed_then_counted_past_the_bound(fakecuda: Path, tmp_path: Path) -> None:
    """Batch copies and 3D batch copies (CUDA 12.8+), driver and runtime, at
    counts around the bounds; byte for byte against what the workload made."""
    from memtrace.core.abi import BATCH_EACH, BATCH_MAX

    argv = [sys.executable, str(FIXTURES / "batch_workload.py"), str(fakecuda / "lib")]
    doc, _, p = run_traced(argv, tmp_path)
    assert p.returncode == 0, p.stderr
    calls = json.loads(p.stdout.splitlines()[-1])["calls"]
    pid = {r["pid"] for r in doc["memcpy"]}.pop()
    # The first BATCH_EACH copies of a call are resolved from their own
    # pointers (host memory no CUDA call made: h2h, pageable); the call is
    # counted there (a call of no copies names no pointer: default). The
    # copies up to BATCH_MAX are summed, with no pointers: default. Past
    # that, the call is counted as truncated.
    # A 3D batch's copy to or from a CUDA array moves elements of the array's
    # format, which memtrace does not read: no bytes, counted apart.
    want: dict = defaultdict(lambda: [0, 0, 0])
    truncated = arrays = 0
    for c in calls:
        sizes = c["sizes"]
        want[(pid, c["api"], "h2h" if sizes else "default")][0] += 1
        want[(pid, c["api"], "h2h")][1] += sum(n or 0 for n in sizes[:BATCH_EACH])
        if len(sizes) > BATCH_EACH:
            want[(pid, c["api"], "default")][1] += sum(n or 0 for n in sizes[BATCH_EACH:BATCH_MAX])
        truncated += len(sizes) > BATCH_MAX
        arrays += sum(n is None for n in sizes[:BATCH_MAX])
    want = {k: tuple(v) for k, v in want.items() if any(v)}
    # (A copy to an array in the first BATCH_EACH may leave a row of no calls and no bytes.)
    assert {k: v for k, v in observed_totals(doc).items() if any(v)} == want
    assert {c["api"] for c in calls} >= {"cuMemcpy3DBatchAsync", "cuMemcpy3DBatchAsync_v2", "cudaMemcpy3DBatchAsync"}
    agent = doc["agent"]
    assert agent["batch_truncated_calls"] == truncated == 7
    assert agent["batch_array_copies"] == arrays > 0
    assert agent["events"] == len(calls) and agent["dropped"] == 0 and agent["calls_without_event"] == 0
    host = {(r["api"], r["direction"]): r["host_memory"] for r in doc["memcpy"]}
    assert host[("cuMemcpyBatchAsync_v2", "h2h")] == "pageable"
    assert host[("cuMemcpyBatchAsync_v2", "default")] == "unknown"


def test_call_made_of_probed_calls_of_its_own_layer_counted_once(fakecuda: Path, tmp_path: Path) -> None:
    # `-a 1`: cudaMemcpy only; half of them (cudaMemcpy_ptds in the test
    # runtime) are a cudaMemcpyAsync and a cudaStreamSynchronize of the same
    # library on the same thread. They are the outer call's work: counted
    # once, as the cudaMemcpy the program made, never as what it is made of.
    doc, lines, p = run_traced([str(fakecuda / "workload"), "-n", "400", "-s", "21", "-a", "1"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_exact(doc, lines)
    assert {r["api"] for r in doc["memcpy"]} == {"cudaMemcpy"}
    assert doc["synchronization"] == []
    assert doc["agent"]["nested_same_layer_calls"] > 0
    assert doc["agent"]["unreturned_calls"] == 0
