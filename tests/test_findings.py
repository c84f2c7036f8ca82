"""Findings from the model: each fires on its evidence, names it and the fix,
and stays quiet below its threshold."""

from __future__ import annotations

import os

import numpy as np
import pytest

from memtrace.analysis.findings import Thresholds, compute
from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.enums import HostMemory
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


def stepping(host_ns: int, sync_ns: int, n: int = 200) -> tuple[Model, int]:
    """A model fed a stepping loop (tests/test_steps.py's: four 100 us copies,
    a wait of sync_ns, then host_ns of host work per step) by this process;
    returns it and a `now` that makes the wall time the loop's span."""
    from test_steps import events as step_events
    from test_steps import loop

    m = Model()
    rows = loop(n, host_ns, sync_ns)
    m.add_events(step_events(rows, pid=PID))
    proc = m.processes[KEY]
    span = rows[-1][0] + rows[-1][1] - rows[0][0]
    proc.first_seen_ns = proc.start_ns
    return m, proc.start_ns + span


def test_waiting_while_the_gpu_idles_for_the_host_is_a_finding() -> None:
    # 10 ms waits, then 5 ms of host work in which the GPU has nothing to do.
    m, now = stepping(host_ns=5_000_000, sync_ns=10_000_000)
    (f,) = [f for f in compute(m, Thresholds(), now) if f.code == "sync_wait"]
    assert f.value == pytest.approx(10 / 15.4, rel=0.01)  # the waits' share of the wall time
    assert f.evidence["gpu_idle_share"] == pytest.approx(5 / 15.4, abs=0.01)
    assert "idle" in f.summary and "stream" in f.summary and "non_blocking" in f.fix
    assert f.evidence["by_kind"] == {"stream": 200}
    assert not [f for f in compute(m, Thresholds(sync_gpu_idle_share=0.5), now) if f.code == "sync_wait"]


def test_a_gpu_bound_loop_waiting_for_its_busy_gpu_has_no_finding() -> None:
    # Negative control: 20 ms waits for the GPU, 0.2 ms of host work: the GPU is never idle long.
    m, now = stepping(host_ns=200_000, sync_ns=20_000_000)
    assert m.processes[KEY].memory.allocations == 0
    share = sum(w.duration_ns for w in m.sync_view().values()) / m.processes[KEY].wall_ns(now)
    assert share > 0.9  # it does wait, nearly all the time
    assert not compute(m, Thresholds(), now)


def test_waits_without_steps_are_no_evidence() -> None:
    # A one-shot script: five long waits, too few to recur as steps; nothing says the GPU idles.
    m = Model()
    m.add_events(events([{"api": SYNC, "duration_ns": 1_400_000_000, "ts_ns": i * 2 * 10**9} for i in range(5)]))
    proc = m.processes[KEY]
    proc.first_seen_ns = proc.start_ns
    assert not [f for f in compute(m, Thresholds(), proc.start_ns + 10**10) if f.code == "sync_wait"]


S = 10**9
W = 30 * S  # a growth window


def allocations(m: Model, times_sizes: list[tuple[int, int]], base: int = 0x7000_0000_0000) -> list[int]:
    rows = [
        {"api": ALLOC, "dst": base + i * (1 << 32), "bytes": size, "ts_ns": t}
        for i, (t, size) in enumerate(times_sizes)
    ]
    m.add_events(events(rows))
    return [r["dst"] for r in rows]


def test_device_memory_rising_after_warm_up_is_a_finding() -> None:
    m = Model()
    # Warm-up: 4 GiB in the first seconds; then 256 MiB more every 30 s for 10 minutes.
    allocations(m, [(k * S, GiB) for k in range(4)])
    allocations(m, [(2 * W + k * W, 256 << 20) for k in range(20)], base=0x7100_0000_0000)
    (f,) = [f for f in compute(m) if f.code == "device_memory_growth"]
    assert f.value == 20 * (256 << 20) - 0 and f.evidence["rising_share"] == 1.0
    assert "5.0 GiB" in f.summary and "10 min" in f.summary and "after warm-up" in f.summary
    assert f.evidence["in_use_bytes"] == 4 * GiB + 5 * GiB


def test_a_caching_allocator_that_fills_up_then_holds_has_no_finding() -> None:
    # Negative control: PyTorch's caching allocator grabs 12 GiB while warming up and never frees
    # it; for the next hour it reuses its blocks, asking the driver for a new one only three times
    # (fragmentation). Memory held with no frees for an hour, yet no growth.
    m = Model()
    allocations(m, [(k * 2 * S, GiB) for k in range(12)])
    allocations(m, [(t * W, 512 << 20) for t in (17, 55, 98)], base=0x7200_0000_0000)
    mem = m.processes[KEY].memory
    assert mem.in_use_bytes == 13.5 * GiB and mem.frees == 0
    assert not [f for f in compute(m) if f.code == "device_memory_growth"]


def test_a_one_off_step_after_warm_up_is_not_growth() -> None:
    # An evaluation allocates 3 GiB once, 5 minutes in, and keeps it: a step, not a trend.
    m = Model()
    allocations(m, [(0, GiB), (10 * W, 3 * GiB)])
    allocations(m, [(W * (11 + k), 0) for k in range(10)], base=0x7300_0000_0000)  # calls go on, flat
    assert not [f for f in compute(m) if f.code == "device_memory_growth"]


def test_pageable_copies_are_a_finding_only_past_the_threshold() -> None:
    m = Model(complete_after_ns=None)  # complete: untracked host memory is pageable; one pinned range for the rest
    pinned = 0x7F00_0000_0000
    m.add_events(events([{"api": 66, "dst": pinned, "bytes": 1 << 30}]))  # cuMemHostAlloc
    copy = {"api": COPY, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}
    m.add_events(events([{**copy, "src": 0x1000}] * 3 + [{**copy, "src": pinned + 4096}]))
    (f,) = [f for f in compute(m) if f.code == "pageable_h2d"]
    assert f.value == 0.75 and f.evidence["pageable_bytes"] == 3 * (64 << 20)
    assert "pinned copies in the same process" in f.summary and "pin_memory=True" in f.fix
    assert not [f for f in compute(m, Thresholds(pageable_share=0.8)) if f.code == "pageable_h2d"]


def test_an_asynchronous_pinned_copy_gives_no_bandwidth_to_compare_with() -> None:
    """cudaMemcpyAsync from pinned memory returns once queued: bytes over its
    call time is no bandwidth (PyTorch's pinned copies came to 719.6 GB/s
    that way on the H200, whose link moved them at 53.7 GB/s). Pageable
    copies are timed either way: the driver stages them before returning."""
    m = Model(complete_after_ns=None)
    pinned = 0x7F00_0000_0000
    m.add_events(events([{"api": 66, "dst": pinned, "bytes": 1 << 30}]))  # cuMemHostAlloc
    async_copy = {"api": 25, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}  # HtoDAsync
    rows = [{**async_copy, "src": 0x1000}] * 3 + [{**async_copy, "src": pinned, "duration_ns": 90_000}]
    m.add_events(events(rows))
    (f,) = [f for f in compute(m) if f.code == "pageable_h2d"]
    assert f.evidence["pageable_bytes_per_second"] == pytest.approx(3 * (64 << 20) / 15e-3)
    assert "pinned_bytes_per_second" not in f.evidence and "pinned copies" not in f.summary


def test_a_process_met_mid_run_has_its_untracked_memory_unknown_but_what_its_driver_mapped_pinned() -> None:
    """Attached to a running process (profile --pid, top, push): a pointer
    memtrace never saw allocated is unknown, never pageable, so no "pin it"
    finding is made on a guess; where the process's mappings show its GPU
    driver mapped the memory (/dev/nvidia*), it is pinned."""
    driver_lo = 0x7E00_0000_0000
    m = Model(complete_after_ns=0, driver_mapped=lambda key: [(driver_lo, driver_lo + (64 << 20))])
    copy = {"api": COPY, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000}
    m.add_events(events([{**copy, "src": 0x1000}] * 3 + [{**copy, "src": driver_lo + 4096}]))
    kinds = {k.host: st.calls for k, st in m.copy_view().items()}
    assert kinds == {HostMemory.UNKNOWN: 3, HostMemory.PINNED: 1}
    assert not [f for f in compute(m) if f.code == "pageable_h2d"]
    assert m.processes[KEY].book.pinned_bytes == 0  # the driver's ranges are no allocation of its own


def test_the_driver_s_mappings_are_read_from_the_maps_text() -> None:
    from memtrace.sources.procfs import driver_ranges

    maps = (
        "55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0          [heap]\n"
        "7f0000000000-7f0000200000 rw-s 00000000 00:05 611        /dev/nvidiactl\n"
        "7f0000200000-7f0000400000 rw-s 00000000 00:05 612        /dev/nvidia0\n"
        "7f1000000000-7f1000001000 r-xp 00000000 08:01 99         /usr/lib/libcuda.so.1\n"
        "7f2000000000-7f2000001000 rw-p 00000000 00:00 0\n"
    )
    assert driver_ranges(maps) == [(0x7F0000000000, 0x7F0000200000), (0x7F0000200000, 0x7F0000400000)]


def test_an_uncorrectable_memory_error_tells_the_operator_to_drain_the_node() -> None:
    """gpu_memory_uncorrectable: from the host signals' GPU readings, for the traced process on that
    GPU. An uncorrectable ECC error during the run, or rows remapped for uncorrectable errors, fires;
    correctable errors and correctable remappings alone (the row remapper doing its job) do not, and
    a process on another GPU gets nothing."""
    from memtrace.core.gpu import GpuProcess, GpuSample, RemappedRows
    from memtrace.model.host import HostBook

    m = Model()
    m.add_events(events([{"api": ALLOC, "bytes": 4096, "dst": 0x5000_0000}]))

    def book(ecc: tuple[int, int], rows: RemappedRows, on: int = 0) -> HostBook:
        b = HostBook()
        for t, uncorrected in enumerate(ecc, 1):
            proc = (GpuProcess(PID, on, f"GPU-{on}", GiB),)
            kw = dict(name="H", bus_id="", time_ns=t * 10**9)
            bad = GpuSample(0, "GPU-0", **kw, ecc_corrected_volatile=50 * t, ecc_uncorrected_volatile=uncorrected,
                            remapped_rows=rows, processes=proc if on == 0 else ())  # fmt: skip
            b.add_gpus([bad, GpuSample(1, "GPU-1", **kw, processes=proc if on == 1 else ())])
        return b

    healthy = RemappedRows(correctable=12, uncorrectable=0, pending=False, failed=False)
    assert [f.code for f in compute(m, book=book((0, 0), healthy))] == []
    (f,) = compute(m, book=book((0, 2), healthy))
    assert (f.code, f.key.pid, f.value) == ("gpu_memory_uncorrectable", PID, 2.0)
    assert "GPU 0 (GPU-0) has 2 uncorrectable ECC errors during the run" in f.summary
    assert f.fix.startswith("drain the node") and "replace it" not in f.fix
    (f,) = compute(m, book=book((0, 0), RemappedRows(12, 1, True, False)))
    assert "1 row remapped for uncorrectable errors, a row remapping pending until the GPU is reset" in f.summary
    assert f.evidence["remap_pending"] is True
    (f,) = compute(m, book=book((0, 0), RemappedRows(12, 3, False, True)))
    assert "no spare rows left" in f.summary and "replace it" in f.fix
    # The bad GPU is GPU 0; the process runs on GPU 1: not its finding.
    assert compute(m, book=book((0, 2), RemappedRows(12, 1, True, False), on=1)) == []
    assert compute(m) == []  # no host signals: no GPU finding
