"""Launch records: each launch is one record on the events ring only while a
timeline is recorded (cuda Options.launch_events, set by `run --timeline`),
made at its return by a return probe attached only then; otherwise a
launch is an entry trap and a kernel counter, no return probe is attached,
and no launch record ever reaches the ring. The records go to the timeline (Launches notices);
the model counts them only as the return traps their processes paid: its launches come from
the kernel's counters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memtrace.core.abi import Stat
from memtrace.core.notices import Events, Launches, Notice
from memtrace.runtime.agent import Agent
from memtrace.sensors.cuda import Options

pytestmark = pytest.mark.bpf

LAUNCHES, COPY_EVERY = 2000, 7
# Waits for a line on stdin, then becomes the launch loop (same pid: traced before it maps libcuda).
EXEC_WHEN_TOLD = "import os, sys; sys.stdin.readline(); os.execv(sys.argv[1], sys.argv[1:])"


def _traced_loop(
    fakecuda: Path, launch_events: bool
) -> tuple[list[Notice], dict[Stat, int], int, dict[str, int], list[bool]]:
    seen: list[Notice] = []
    argv = [str(fakecuda / "launchloop"), str(fakecuda / "lib" / "libcuda.so.1"), str(LAUNCHES), "10", str(COPY_EVERY)]
    w = subprocess.Popen(
        [sys.executable, "-c", EXEC_WHEN_TOLD, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        with Agent(Options(only_traced=True, launch_events=launch_events), recorder=seen.extend) as agent:
            agent.cuda.trace_pid(w.pid)
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
            out, _ = w.communicate(timeout=120)
            assert w.returncode == 0
            agent.poll()
            stats = agent.stats()
            # Per library with launch probes: whether its launches' return probe is attached.
            timed = [a.launch_return_link is not None for a in agent.cuda.attachments.values() if a.launch_kinds]
            agent.sync_totals()  # the kernel's launch counts, into the model
            with agent.lock:
                agent._fold()
                launches = sum(sum(p.launches.values()) for p in agent.model.processes.values())
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    words = out.split()
    truth = {k: int(words[words.index(k) + 1]) for k in ("launches", "copies")}
    return seen, stats, launches, truth, timed


def _count(seen: list[Notice], kind: type) -> int:
    return sum(len(n.batch) for n in seen if isinstance(n, kind))


def test_without_a_timeline_no_launch_record_reaches_the_ring(fakecuda: Path) -> None:
    seen, stats, launches, truth, timed = _traced_loop(fakecuda, launch_events=False)
    assert truth["launches"] == LAUNCHES and truth["copies"] > 0
    assert timed == [False]  # no return probe on launches: the always-on cost is the entry trap
    assert launches == LAUNCHES  # counted in the kernel, as ever
    assert stats.get(Stat.LAUNCH_EVENTS, 0) == 0 and stats.get(Stat.LAUNCH_DROPPED, 0) == 0
    # What the ring delivered is the copies, one record each: nothing else.
    assert _count(seen, Events) == stats[Stat.EVENTS] == truth["copies"]
    assert _count(seen, Launches) == 0


def test_with_a_timeline_every_launch_is_one_record_and_the_model_still_counts_from_the_kernel(
    fakecuda: Path,
) -> None:
    seen, stats, launches, truth, timed = _traced_loop(fakecuda, launch_events=True)
    assert timed == [True]  # the launches' return probe, for their durations
    assert stats[Stat.LAUNCH_EVENTS] == truth["launches"] == LAUNCHES
    assert stats.get(Stat.LAUNCH_DROPPED, 0) == 0
    assert _count(seen, Launches) == LAUNCHES
    # The model's events are the copies alone; its launches are the kernel's count, not doubled.
    assert _count(seen, Events) == stats[Stat.EVENTS] == truth["copies"]
    assert launches == LAUNCHES
    recs = np.concatenate([n.batch for n in seen if isinstance(n, Launches)])
    # Each from its entry to its return (the return probe's record): a duration, no bytes, no error.
    assert (recs["duration_ns"] > 0).all() and (recs["bytes"] == 0).all() and (recs["ret"] == 0).all()
    ends = recs["ts_ns"].astype(np.int64) + recs["duration_ns"].astype(np.int64)
    assert (ends[:-1] <= recs["ts_ns"][1:].astype(np.int64)).all()  # one thread: each returned before the next
    assert (np.diff(recs["ts_ns"].astype(np.int64)) >= 0).all()  # one thread: in call order
    assert len(set(recs["tid"].tolist())) == 1


def test_a_sampled_processs_launches_are_its_estimated_rate_counter_not_slices(fakecuda: Path, tmp_path: Path) -> None:
    """`run --timeline` on a launch loop the overhead budget samples from its
    first launches (test_overhead's short steady loop): its launches are
    counted by estimate, and the trace says so on its launch counters; the
    launch slices are only those made before the budget took its probes
    (every one of them queued and drawn), far fewer than the loop made."""
    from test_overhead import launch_loop, loop_truth, one_row, traced
    from test_timeline import decode

    argv = launch_loop(fakecuda, tmp_path, 40_000, 10_000, 1000, libs="pushfirst")
    trace = tmp_path / "run.pftrace"
    doc = traced(argv, tmp_path, "--timeline", str(trace))
    truth = loop_truth(doc)
    (row,) = doc["launches"]
    assert row["estimated"] is True and 0 < one_row(doc)["launch_duty"] < 1
    tr = decode(trace)
    slices = [s for s in tr.slices if s["category"] == ["launch"]]
    assert len(slices) == doc["agent"]["launch_events"] and doc["agent"]["launch_events_dropped"] == 0
    assert len(slices) < truth["launches"] // 2
    # The slices' return traps were the process's to pay, and are weighed as its: those made
    # before the budget took its probes, each with its launch's entry.
    o = one_row(doc)
    assert o["traps"] == o["launch_traps"] + doc["agent"]["launch_events"] + 2 * truth["copies"]
    pid = row["pid"]
    counters = {
        d.name
        for d in tr.tracks.values()
        if d.HasField("counter") and tr.tracks[d.parent_uuid].process.pid == pid and d.name.startswith("launch")
    }
    assert counters and all("[estimated: sampled by the overhead budget at " in n for n in counters), counters
