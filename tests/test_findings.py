"""Findings from the model: each fires on its evidence, names it and the fix,
and stays quiet below its threshold."""

from __future__ import annotations

import os
import time

import numpy as np

from memtrace.analysis.findings import Thresholds, compute
from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.ids import ProcessKey
from memtrace.model import Model

PID = os.getpid()  # a live process: the model reads its /proc entries
KEY = ProcessKey(PID, 0)  # the events below carry no start time
SYNC, ALLOC, FREE, COPY = 90, 60, 61, 22  # cuStreamSynchronize, cuMemAlloc_v2, cuMemFree_v2, cuMemcpyHtoD_v2
GiB = 1 << 30


def events(rows: list[dict]) -> np.ndarray:
    b = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, r in enumerate(rows):
        b[i]["pid"] = PID
        for k, v in r.items():
            b[i][k] = v
    return b


def test_time_blocked_in_waits_is_a_finding_with_its_share() -> None:
    m = Model()
    m.add_events(events([{"api": SYNC, "duration_ns": 700_000_000}] * 10))  # 7 s blocked
    proc = m.processes[KEY]
    now = proc.start_ns + 10_000_000_000  # watched for 10 s
    proc.first_seen_ns = proc.start_ns
    (f,) = [f for f in compute(m, Thresholds(), now) if f.code == "sync_wait"]
    assert abs(f.value - 0.7) < 1e-9 and "70%" in f.summary and "stream" in f.summary
    assert f.evidence["by_kind"] == {"stream": 10} and "non_blocking" in f.fix
    assert not [f for f in compute(m, Thresholds(sync_share=0.8), now) if f.code == "sync_wait"]


def test_device_memory_growing_without_frees_is_a_finding() -> None:
    m = Model()
    allocs = [{"api": ALLOC, "dst": 0x7000_0000_0000 + i * GiB, "bytes": GiB} for i in range(3)]
    m.add_events(events(allocs))
    proc = m.processes[KEY]
    proc.complete, proc.start_ns = True, time.time_ns() - 600 * 10**9  # ten minutes ago
    (f,) = [f for f in compute(m) if f.code == "device_memory_growth"]
    assert f.value == 3 * GiB and "3.0 GiB" in f.summary and "10 min" in f.summary
    assert f.evidence["in_use_bytes"] == 3 * GiB
    # A free resets the clock: growth is measured from the last time memory went back.
    m.add_events(events([{"api": FREE, "dst": allocs[0]["dst"]}]))
    assert not [f for f in compute(m) if f.code == "device_memory_growth"]
    assert m.processes[KEY].memory.in_use_bytes == 2 * GiB


def test_pageable_copies_are_a_finding_only_past_the_threshold() -> None:
    m = Model()
    # complete: untracked host memory is pageable; one pinned range for the rest
    m.complete_after_ns = None
    pinned = 0x7F00_0000_0000
    m.add_events(events([{"api": 66, "dst": pinned, "bytes": 1 << 30}]))  # cuMemHostAlloc
    copy = {"api": COPY, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}
    m.add_events(events([{**copy, "src": 0x1000}] * 3 + [{**copy, "src": pinned + 4096}]))
    (f,) = [f for f in compute(m) if f.code == "pageable_h2d"]
    assert f.value == 0.75 and f.evidence["pageable_bytes"] == 3 * (64 << 20)
    assert "pinned copies in the same process" in f.summary and "pin_memory=True" in f.fix
    assert not [f for f in compute(m, Thresholds(pageable_share=0.8)) if f.code == "pageable_h2d"]
