"""The real PyTorch and JAX traces recorded on an H100, replayed through the
test libraries with their threads, layer nesting and pointer patterns:
memtrace reports exactly what the trace implies, and tells pinned DataLoader
batches and JAX staging buffers from pageable memory."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import FIXTURES, run_traced

sys.path.insert(0, str(FIXTURES))
import traces  # noqa: E402

pytestmark = pytest.mark.bpf

MiB = 1 << 20


def replay(name: str, fakecuda: Path, tmp_path: Path) -> tuple[list[dict], dict]:
    recs = list(traces.records(name))
    path = tmp_path / "replay.txt"
    n = traces.write_replay(recs, path)
    lib = fakecuda / "lib"
    doc, _, p = run_traced(
        [str(fakecuda / "replay"), str(lib / "libcudart.so.13"), str(lib / "libcuda.so.1"), str(path)],
        tmp_path,
        # Every launch counted: a replay makes its calls back to back, far over the default budget,
        # which would sample its launches (estimated, as tests/test_overhead.py checks).
        env={"FAKE_LIBCUDA": str(lib / "libcuda.so.1"), "MEMTRACE_OVERHEAD_BUDGET": "off"},
    )
    assert p.returncode == 0, p.stderr
    assert f"replayed {n} skipped 0" in p.stdout
    return recs, doc


def h2d_by_host(doc: dict) -> dict[str | None, int]:
    out: dict[str | None, int] = defaultdict(int)
    for r in doc["memcpy"]:
        if r["direction"] == "h2d":
            out[r["host_memory"]] += r["calls"]
    return dict(out)


@pytest.mark.parametrize("name", traces.ALL)
def test_replayed_trace_totals_match_the_trace(name: str, fakecuda: Path, tmp_path: Path) -> None:
    recs, doc = replay(name, fakecuda, tmp_path)
    got: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in doc["memcpy"]:
        t = got[(r["api"], r["direction"])]
        t[0] += r["calls"]
        t[1] += r["bytes"]
        t[2] += r["errors"]
    assert {k: tuple(v) for k, v in got.items()} == traces.expected(recs)
    assert doc["agent"]["events"] == traces.replayed_events(recs) and doc["agent"]["dropped"] == 0
    # PyTorch's runtime calls each made a driver twin, seen and not counted.
    nested = sum(
        1
        for r in recs
        if r["depth"] >= 1
        and r["layer"] == "driver"
        and r["sym"] in traces._SYMS
        and not r["sym"].startswith("cuLaunch")
    )
    assert doc["agent"]["nested_driver_calls"] == nested
    # Launches: each counted once, at the driver, runtime launches included.
    kinds: dict[str, int] = defaultdict(int)
    for l in doc["launches"]:
        kinds[l["kind"]] += l["launches"]
    assert dict(kinds) == traces.launches(recs)
    assert {w["api"]: w["calls"] for w in doc["synchronization"]} == traces.waits(recs)


def test_dataloader_batches_with_pin_memory_come_out_pinned(fakecuda: Path, tmp_path: Path) -> None:
    _, doc = replay("torch_train_pinned", fakecuda, tmp_path)
    # 300 image batches and 300 label batches from the pinned buffers; the
    # model's 6 initial parameter copies come from ordinary memory.
    assert h2d_by_host(doc) == {"pinned": 600, "pageable": 6}
    assert not [f for f in doc["findings"] if f["code"] == "pageable_h2d"]


def test_dataloader_batches_without_pin_memory_come_out_pageable(fakecuda: Path, tmp_path: Path) -> None:
    _, doc = replay("torch_train_pageable", fakecuda, tmp_path)
    assert h2d_by_host(doc) == {"pageable": 606}
    (f,) = [f for f in doc["findings"] if f["code"] == "pageable_h2d"]
    assert f["value"] == 1.0 and "pin_memory=True" in f["fix"]
    assert f["evidence"]["pageable_bytes"] == sum(r["bytes"] for r in doc["memcpy"] if r["direction"] == "h2d")


def test_jax_staging_copies_come_out_pinned(fakecuda: Path, tmp_path: Path) -> None:
    recs, doc = replay("jax_train", fakecuda, tmp_path)
    # The staging buffer is the 2 MiB host allocation; the trace frees it by address at the end.
    (free,) = [r for r in recs if r["sym"] == "cuMemFreeHost" and r["args"][0] < 0x7F0000000000]
    base = free["args"][0]
    staged = sum(
        1
        for r in recs
        if r["sym"] == "cuMemcpyHtoDAsync_v2" and base <= r["args"][1] < base + 2 * MiB and r["depth"] == 0
    )
    h2d = sum(1 for r in recs if r["sym"] == "cuMemcpyHtoDAsync_v2")
    assert staged > h2d // 2  # most transfers go through staging, some from inside the buffer
    assert h2d_by_host(doc) == {"pinned": staged, "pageable": h2d - staged}
    # Its device memory: a VMM reservation created and mapped once, plus plain allocations.
    mem = {m["pid"]: m for m in doc["device_memory"]}
    (m,) = mem.values()
    creates = [r for r in recs if r["sym"] == "cuMemCreate"]
    allocs = [r for r in recs if r["sym"] == "cuMemAlloc_v2" and r["ret"] == 0]
    assert m["allocations"] == len(creates) + len(allocs)
    assert m["allocated_bytes"] == sum(r["args"][1] for r in creates + allocs)
