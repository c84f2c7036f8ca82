"""Draining never waits for an export: the rings are read and held processes
continued on the agent's own drain thread, whatever building or sending an
export costs. Real probes, a real slow collector on 127.0.0.1, the real
MetricsBuilder (made slow where a test needs a build that takes seconds)."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, observed_totals, truth_totals

from memtrace.core.abi import Stat
from memtrace.export.config import resolve
from memtrace.export.otlp import Batch, MetricsBuilder
from memtrace.export.report import summary
from memtrace.model import Model
from memtrace.runtime.agent import Agent
from memtrace.runtime.drain import DrainGaps
from memtrace.runtime.pipeline import Pipeline, PipelineOptions
from memtrace.runtime.push import push_forever
from memtrace.sensors.cuda import Options

pytestmark = pytest.mark.bpf


class SlowCollector:
    """An OTLP/HTTP collector on 127.0.0.1 that answers 200 after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests += 1
                time.sleep(delay)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingBuilder(MetricsBuilder):
    """The real builder; each build first records the totals the model holds
    then (under the model lock, as push calls it), then waits `pause()`."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.builds = 0
        self.building = threading.Event()
        self.totals: list[dict[Any, tuple[int, int, int]]] = []

    def pause(self) -> None:
        pass

    def build(self, model: Model, stats: dict[Stat, int], libraries: int, **kw: Any) -> Batch:
        self.totals.append(observed_totals(summary(model, stats, [])))
        self.building.set()
        self.pause()
        batch = super().build(model, stats, libraries, **kw)
        self.builds += 1
        return batch


@contextlib.contextmanager
def waiting_driver(fakecuda: Path, truth: Path | str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """workload_driver -w ARGS, started and waiting for go(): its libraries
    are mapped, so an agent attaches them before the copies begin. Killed on exit."""
    w = subprocess.Popen(
        [str(fakecuda / "workload_driver"), "-w", *args],
        env={"WORKLOAD_TRUTH": str(truth)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        yield w
    finally:
        w.kill()
        w.wait()


def go(w: subprocess.Popen[str]) -> None:
    assert w.stdin is not None
    w.stdin.write("go\n")
    w.stdin.flush()


def test_an_export_that_takes_seconds_never_delays_a_drain(fakecuda: Path, tmp_path: Path) -> None:
    """Each build takes a second (made slow) and each push another 1.5 s
    (a slow collector); a workload copies throughout. The agent's own
    drain-gap statistic: no drain started more than two periods after the
    one before. And the drains' events, kept pending while builds held the
    model, all reached it: the last export's totals are the workload's."""
    period = 0.1
    col = SlowCollector(1.5)

    class SlowBuilder(RecordingBuilder):
        def pause(self) -> None:
            time.sleep(1.0)

    builder = SlowBuilder(resolve({}, endpoint=col.endpoint), {"host.name": "test"})
    cfg = resolve({}, endpoint=col.endpoint, interval=0.2)
    stop = threading.Event()
    truth = tmp_path / "truth.jsonl"
    # Started first, waiting for a go: its libraries are attached before the
    # drains are timed (attaching is a drain's work too, and it can wait
    # behind other agents' probe removals in the kernel for seconds). Only
    # it is traced: other processes on the host are none of this test's.
    try:
        with (
            waiting_driver(fakecuda, truth, "-n", "300", "-p", "10000", "-s", "7") as w,
            Pipeline(PipelineOptions(Options(only_traced=True), None, measure_overhead=False, from_exec=True)) as pipe,
        ):
            agent = pipe.agent
            agent.cuda.trace_pid(w.pid)
            agent.scan([w.pid])
            pusher = threading.Thread(
                target=push_forever,
                args=(pipe, cfg, stop),
                kwargs={"builder": builder, "final_timeout": 10.0, "drain_interval": period},
            )
            pusher.start()
            go(w)
            assert w.wait(timeout=120) == 0
            after_exit = len(builder.totals)  # the next build starts after the workload's exit
            deadline = time.monotonic() + 60
            while (len(builder.totals) <= after_exit or col.requests < 1) and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            pusher.join(timeout=60)
            assert not pusher.is_alive()
            stats = agent.drain_stats()
    finally:
        stop.set()
        col.stop()
    assert builder.builds >= 2 and col.requests >= 2  # during the run, and the last
    assert stats.drains > 0
    assert stats.gap_max_seconds <= 2 * period, stats
    assert stats.folds_deferred > 0, "no drain ever ran during a build: the test proved nothing"
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    pid = lines[0]["pid"]
    # (A later push may have dropped the exited process's series once sent.)
    got = {k: v for k, v in builder.totals[after_exit].items() if k[0] == pid}
    assert got == truth_totals(lines)


def test_a_process_held_while_an_export_is_built_is_continued_at_once(fakecuda: Path, tmp_path: Path) -> None:
    """A build is stuck (it holds the model lock until the test lets it go);
    meanwhile a process dlopens a CUDA library nobody has probed yet, and is
    held while its probes are attached. The drain thread attaches them and
    continues it: the process runs to its end while the build is still
    stuck. Its calls, drained while the model was busy, are exact."""
    col = SlowCollector(0.0)
    go_on = threading.Event()

    class StuckBuilder(RecordingBuilder):
        def pause(self) -> None:
            go_on.wait(600)

    builder = StuckBuilder(resolve({}, endpoint=col.endpoint), {"host.name": "test"})
    cfg = resolve({}, endpoint=col.endpoint, interval=0.1)
    stop = threading.Event()
    truth = tmp_path / "truth.jsonl"
    try:
        with Pipeline(PipelineOptions(Options(only_traced=True), None, measure_overhead=False, from_exec=True)) as pipe:
            agent = pipe.agent
            holds = agent.stats()[Stat.HOLDS]
            pusher = threading.Thread(target=push_forever, args=(pipe, cfg, stop), kwargs={"builder": builder})
            pusher.start()
            assert builder.building.wait(30)
            # Traced from before its first instruction (only it: other
            # processes on the host are none of this test's), then let go.
            workload = f"{sys.executable} {FIXTURES / 'ctypes_workload.py'} {fakecuda / 'lib'} --calls 400"
            p = subprocess.Popen(
                ["/bin/sh", "-c", f"read go && exec {workload}"],
                env={"WORKLOAD_TRUTH": str(truth), "PATH": "/usr/bin:/bin"},
                stdin=subprocess.PIPE,
                text=True,
            )
            agent.cuda.trace_pid(p.pid)
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            try:
                # A drain that waited for the build would leave it stopped (state T) until go_on.
                # (Generous: attaching waits behind other agents' probe removals in the kernel.)
                assert p.wait(timeout=240) == 0
            finally:
                p.kill()
            assert not go_on.is_set() and builder.builds == 0  # all of it while the first build was stuck
            assert agent.stats()[Stat.HOLDS] > holds, "the process was never held: the test proved nothing"
            go_on.set()
            stop.set()
            pusher.join(timeout=60)
            assert not pusher.is_alive()
    finally:
        go_on.set()
        stop.set()
        col.stop()
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    got = {k: v for k, v in builder.totals[1].items() if k[0] == p.pid}  # the first build after its exit
    assert got == truth_totals(lines)


def test_a_collector_slower_than_the_final_timeout_ends_push_with_a_warning(
    fakecuda: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At shutdown a push in flight and the last push both outlast the final
    timeout: push gives up on them with a warning, never a traceback (on
    Python 3.10, concurrent.futures.TimeoutError is not the builtin one)."""
    col = SlowCollector(4.0)
    cfg = resolve({}, endpoint=col.endpoint, interval=0.1)
    stop = threading.Event()
    try:
        with Pipeline(PipelineOptions(Options(), None, measure_overhead=False)) as pipe:
            # Stop once the first push is in flight (the collector has it).
            def stop_when_sent() -> None:
                while col.requests < 1:
                    time.sleep(0.02)
                stop.set()

            threading.Thread(target=stop_when_sent, daemon=True).start()
            with caplog.at_level(logging.WARNING, logger="memtrace"):
                failures = push_forever(pipe, cfg, stop, final_timeout=0.5)
    finally:
        stop.set()
        col.stop()
    assert failures == 0
    assert "the last push did not finish within" in caplog.text


def test_the_fold_thread_takes_shares_in_ring_order_and_splits_a_large_batch() -> None:
    """What the drains queued is folded FOLD_SHARE_EVENTS at a time (the
    model lock is held for one share, not for everything an export left
    behind): a share ends inside a large batch, whose rest is folded first
    next time, so ring order holds and every event arrives once."""
    import numpy as np

    from memtrace.core.abi import EVENT_DTYPE
    from memtrace.core.notices import Events
    from memtrace.runtime.agent import FOLD_SHARE_EVENTS

    agent = Agent(Options())
    sizes = [FOLD_SHARE_EVENTS - 100, 50, 3 * FOLD_SHARE_EVENTS]
    seq = 0
    for n in sizes:
        b = np.zeros(n, dtype=EVENT_DTYPE)
        b["pid"] = b["tid"] = 4_000_000
        b["api"] = 2  # cudaMemcpyAsync
        b["ts_ns"] = np.arange(seq, seq + n) + 1  # ring order, checked below
        b["bytes"] = 1
        seq += n
        agent._take([Events(b)])
    folded_order: list[np.ndarray] = []
    add = agent.model.add_events
    agent.model.add_events = lambda b: (folded_order.append(b["ts_ns"].copy()), add(b))  # type: ignore[method-assign]
    with agent.lock:
        assert agent._fold(FOLD_SHARE_EVENTS) == FOLD_SHARE_EVENTS
    assert agent.model.events == FOLD_SHARE_EVENTS
    assert agent._pending_events == sum(sizes) - FOLD_SHARE_EVENTS
    with agent.lock:
        while agent._pending:
            agent._fold(FOLD_SHARE_EVENTS)
    ts = np.concatenate(folded_order)
    assert agent.model.events == sum(sizes) and agent._pending_events == 0
    assert (ts == np.arange(1, sum(sizes) + 1)).all()  # each once, in ring order
    assert max(len(x) for x in folded_order) <= FOLD_SHARE_EVENTS


def test_a_drain_put_off_on_purpose_is_not_a_gap_but_lateness_still_is() -> None:
    """While the ring is quiet the drain thread puts drains off (up to a few
    periods): the gap statistic counts only what came later than that."""
    g = DrainGaps()
    g.started(10.0)
    g.started(10.005)  # on time: 5 ms
    g.started(10.025, put_off=0.015)  # put off 15 ms on purpose, 5 ms late
    assert g.count == 3 and g.max == pytest.approx(0.005)
    g.started(10.065, put_off=0.015)  # 25 ms later than its stretched time
    assert g.max == pytest.approx(0.025) and g.take_window_max() == pytest.approx(0.025)
    g.started(10.066, put_off=0.015)  # a reader's drain soon after: never a negative gap
    assert g.quantile(0.0) >= 0 and g.max == pytest.approx(0.025)


def _wait_for(cond: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_burst_after_a_long_quiet_sleep_is_read_in_time_when_the_c_sampler_guards_the_ring(
    fakecuda: Path, tmp_path: Path
) -> None:
    """With the C sampler watching the events ring (Agent.guard_ring), a
    quiet ring's drains sleep up to GUARDED_QUIET_S, not 40 ms. A burst then
    starts: 20,000 copies (about 0.3 s of them on the 2-vCPU VM) into a ring
    of 13,107 records. The sampler sees the ring fill within a tick and
    wakes the drain thread, so nothing is dropped and every copy is counted
    exactly. (Without the watch, the drain asleep for its second let the
    ring overflow: 40,639 dropped, checked by making watch_ring do nothing.)"""
    from memtrace.runtime.agent import GUARDED_QUIET_S
    from memtrace.sources.fastsample import FastSampler

    truth = tmp_path / "truth.jsonl"
    with waiting_driver(fakecuda, truth, "-e", "-n", "20000", "-s", "3") as w:
        with Agent(Options(only_traced=True, ring_bytes=1 << 20)) as agent, FastSampler(100) as sampler:
            agent.cuda.trace_pid(w.pid)
            agent.scan([w.pid])
            sampler.start()
            agent.guard_ring(sampler)
            with agent.draining():
                # Quiet until the drain thread sleeps its longest.
                _wait_for(lambda: agent._put_off >= GUARDED_QUIET_S / 2, 30, "the drains never slept long")
                go(w)
                assert w.wait(timeout=120) == 0
            agent.poll()
            stats = agent.stats()
            doc = summary(agent.model, stats, agent.libraries, {})
            wakes = sampler.poll().ring_wakes
    assert wakes > 0, "the sampler never woke the drain thread: the test proved nothing"
    assert stats[Stat.DROPPED] == 0
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    assert observed_totals(doc) == truth_totals(lines)


def test_a_process_notice_is_read_when_the_c_sampler_sees_it_not_after_the_control_threads_sleep(
    fakecuda: Path,
) -> None:
    """A process's first call sends a notice (who it is) on the control
    ring without a wakeup; the control thread used to look every 100 ms.
    Guarded, it sleeps (here: an hour) and the C sampler wakes it once a
    record waits, so the notice is read all the same. (Without the control
    ring's watch, nothing reads it for the hour: checked by leaving that
    watch out.)"""
    from memtrace.core.notices import Notice, ProcessMet
    from memtrace.sources.fastsample import FastSampler

    with waiting_driver(fakecuda, "/dev/null", "-e", "-n", "10", "-s", "3") as w:
        with Agent(Options(only_traced=True)) as agent, FastSampler(100) as sampler:
            src = agent.cuda
            notices: list[Notice] = []
            notice = src._notice
            src._notice = lambda n: (notices.append(n), notice(n))  # type: ignore[method-assign]
            src.trace_pid(w.pid)
            agent.scan([w.pid])
            sampler.start()
            agent.guard_ring(sampler)
            src.set_control_quiet(3600.0)
            go(w)
            met = ProcessMet  # the notice of a process's first call
            _wait_for(
                lambda: any(isinstance(n, met) and n.key.pid == w.pid for n in notices),
                30,
                f"no notice of the workload was read: {notices}",
            )
            assert w.wait(timeout=60) == 0


def test_the_sampler_stops_reading_the_ring_before_the_agent_unmaps_it() -> None:
    """The sampler reads the ring's positions every tick; the agent unmaps
    the ring when it closes. close() stops the watch first, so a sampler that
    runs on after the agent (as the host signals may) never reads unmapped
    memory: run in a child, where such a read would kill it with SIGSEGV."""
    script = """
import sys
from memtrace.runtime.agent import Agent
from memtrace.sensors.cuda import Options
from memtrace.sources.fastsample import FastSampler
with FastSampler(1000) as sampler:
    sampler.start()
    with Agent(Options(only_traced=True)) as agent:
        agent.guard_ring(sampler)
        t = sampler.ticks()
        while sampler.ticks() < t + 20:
            pass
    t = sampler.ticks()
    while sampler.ticks() < t + 200:  # the ring is gone: 200 more ticks
        pass
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])
