"""`memtrace push`: trace every CUDA process and push OTLP to a collector."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any, cast

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.errors import BadOption
from memtrace.export.callsites import call_sites
from memtrace.export.config import PushConfig, Temporality
from memtrace.export.events import Events
from memtrace.export.otlp import Batch, MetricsBuilder, cause_counts, resource_of
from memtrace.export.otlp_profiles import ProfileBatch, ProfilesBuilder, ProfilesSender
from memtrace.export.transport import MetricsExporter
from memtrace.runtime.agent import DRAIN_INTERVAL_S, Agent
from memtrace.runtime.memory import freeze_long_lived, give_back_free_memory, no_cyclic_gc
from memtrace.runtime.pipeline import Pipeline, PipelineOptions
from memtrace.runtime.recorder import Recorder
from memtrace.sources.procfs import host_attributes, is_running

log = logging.getLogger("memtrace")


def is_running_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def backoff(interval: float, failures: int, cap: float = 30.0) -> float:
    """Time to the next push after `failures` consecutive failures."""
    if failures == 0:
        return interval
    return float(min(interval * 2 ** min(failures, 10), max(cap, interval)))


class Profiles:
    """`push --stacks`: each push's call sites as OTLP profiles, sent after
    its metrics on the export thread (export/otlp_profiles.py)."""

    def __init__(self, cfg: PushConfig) -> None:
        from memtrace import __version__

        self.base = {**cfg.resource_attributes, **host_attributes()}  # as the metrics' resources start
        self.builder = ProfilesBuilder({"service.name": "memtrace", **self.base}, __version__)
        self.sender = ProfilesSender(cfg)
        self.failures = 0

    def build(self, agent: Agent) -> ProfileBatch:
        """Under the model lock. Each process's resource is its metrics' (its
        container and pod included, for the collector's k8sattributes)."""
        model = agent.model
        resources = {key.pid: resource_of(self.base, key, p) for key, p in model.processes.items()}
        # The builder reads the rows as plain mappings (it names them list[dict]).
        sites = cast(list[dict[str, Any]], call_sites(model, agent.stack_frames()))
        return self.builder.build(sites, resources)

    def send(self, batch: ProfileBatch) -> None:
        """On the export thread: a batch that arrived is the next one's base;
        one that did not is sent again, whole, with the next."""
        if not self.builder.current(batch):
            return  # built before the last one arrived: the next batch carries its calls
        why = self.sender.send(batch.request) if batch.request is not None else ""
        if not why:
            self.builder.commit(batch)
            if self.failures:
                log.warning("profiles push to %s works again", self.sender.url)
            self.failures = 0
            return
        self.failures += 1
        if self.failures == 1:
            log.warning("profiles push to %s failed: %s; sent again with the next push", self.sender.url, why)


TRIM_INTERVAL_S = 0.5  # the bound on exited processes is kept at least this often
MAX_UNSENT_EXITED = 2048
SETTLE_POLL_S = 0.02  # how often a push in flight is looked at


RECORDER_CLOSE_S = 30.0  # at the stop, files still waiting for their window are written within this


def push(
    opts: PipelineOptions,
    cfg: PushConfig,
    stop: threading.Event,
    recorder: Recorder | None = None,
    pids: Sequence[int] = (),
) -> int:
    """`memtrace push`: the pipeline built from `opts`, its diagnoses sent as
    OTLP events (log records) to the same collector, and push_forever
    until `stop`. With a flight `recorder`, each diagnosis's event names
    the file it writes (memtrace.timeline.file). With `pids` (and
    Options.only_traced) only those processes and the ones they start from
    now on are traced. Returns the number of failed pushes."""
    resource = {"service.name": "memtrace", **cfg.resource_attributes, **host_attributes()}
    events: Events  # made below, once the pipeline (not yet started) has its agent

    def diagnosed(d: Diagnosis) -> None:
        path = recorder.file_of(d) if recorder is not None else None
        events.diagnosis(d, d.start_ns, {"memtrace.timeline.file": path} if path else None)

    pipe = Pipeline(opts, on_diagnosis=diagnosed, recorder=recorder)
    events = Events(cfg, resource, pipe.agent.job_of)  # the diagnoses, and the findings' text
    try:
        with pipe:
            for pid in pids:
                if not is_running_pid(pid):
                    raise BadOption(
                        f"no process {pid}", "give --pid a running process (as this pid namespace names it)"
                    )
                pipe.agent.cuda.trace_pid(pid)
            if pids:
                pipe.agent.scan(list(pids))
            try:
                return push_forever(pipe, cfg, stop, events=events, pinned=pids)
            finally:
                if recorder is not None:
                    recorder.close(RECORDER_CLOSE_S)  # while the agent can still be read
    finally:
        events.shutdown()


def push_forever(
    pipe: Pipeline,
    cfg: PushConfig,
    stop: threading.Event,
    exporter: MetricsExporter | None = None,
    final_timeout: float = 5.0,
    max_unsent_exited: int = MAX_UNSENT_EXITED,
    builder: MetricsBuilder | None = None,
    drain_interval: float = DRAIN_INTERVAL_S,
    events: Events | None = None,
    pinned: Sequence[int] = (),
) -> int:
    """Trace every CUDA process and push OTLP metrics every interval until
    `stop` is set, then flush a last push. Returns the number of failed pushes.

    The agent drains on its own thread meanwhile (every `drain_interval`),
    and the host signals, where the pipeline has them, sample on theirs, the
    live diagnosis's counts going out with each push (memtrace.diagnoses):
    building an export holds the model lock for as long as it takes, and
    sending it runs on another thread, but neither delays a drain.

    Exited processes wait for one successful push; during a long outage at
    most `max_unsent_exited` of them are kept (memory stays bounded), and
    the oldest beyond that are dropped, counted and logged."""
    agent, host, diagnosis = pipe.agent, pipe.host, pipe.diagnosis
    builder = builder or MetricsBuilder(cfg, host_attributes())
    exporter = exporter or MetricsExporter(cfg)
    own_events = events is None  # findings' text goes out as events (export/events.py)
    events = events or Events(
        cfg, {"service.name": "memtrace", **cfg.resource_attributes, **host_attributes()}, agent.job_of
    )
    profiles = Profiles(cfg) if agent.stacks is not None else None
    pending_profiles: list[ProfileBatch] = []  # built with the metrics batch in flight
    pool = ThreadPoolExecutor(1, thread_name_prefix="memtrace-export")
    inflight: tuple[Future[tuple[bool, str, int]], Batch] | None = None
    failures = 0
    next_at = time.monotonic() + cfg.interval
    log.warning("pushing to %s", cfg.redacted())

    def trim_exited() -> None:
        """At most `max_unsent_exited` exited processes wait for a push: the
        oldest beyond are dropped and counted. Under the model lock."""
        with agent.lock:
            model = agent.model
            exited = sorted((p.first_seen_ns, key) for key, p in model.processes.items() if p.exited)
            if len(exited) <= max_unsent_exited:
                return
            drop = [key for _, key in exited[: len(exited) - max_unsent_exited]]
            if not builder.unsent_processes:
                log.warning(
                    "more than %d exited processes are waiting for a push: the oldest are dropped "
                    "unsent (counted in memtrace.agent.unsent_processes)",
                    max_unsent_exited,
                )
            agent.forget_unread(drop)
            builder.unsent_processes += len(drop)

    def build() -> Batch:
        with agent.lock, no_cyclic_gc():
            # A process already gone has queued all its events: look first, then
            # drain, so its final push carries every call it made.
            model = agent.model
            gone = [key for key, p in model.processes.items() if not p.exited and not is_running(key)]
            agent.poll()
            agent.sync_totals()
            for key in gone:
                model.process_exited(key)  # its exit notice was lost: never keep its series forever
            trim_exited()
            gap = agent.take_drain_gap_window()
            if profiles is not None:
                pending_profiles.append(profiles.build(agent))
            if host is None:
                return builder.build(model, agent.stats(), len(agent.libraries), drain_gap_s=gap)
            counts = cause_counts(diagnosis.diagnoses) if diagnosis is not None else None
            with host.lock:
                return builder.build(
                    model, agent.stats(), len(agent.libraries), drain_gap_s=gap, host=host.book, diagnoses=counts
                )

    def settle(ok: bool, reason: str, delivered: int, batch: Batch) -> None:
        nonlocal failures
        with agent.lock:  # commit and rollback touch the model's histograms
            if not ok and delivered and cfg.temporality == Temporality.delta:
                # Part of a delta export arrived: those processes' deltas must not
                # be sent again; the rest is, with the next push.
                done = batch.processes_in(delivered)
                batch.commit_processes(done)
                for key in set(batch.exited) & done:
                    agent.forget(key)
                events.forget(set(batch.exited) & done)
            elif ok:
                batch.commit()
                events.findings(batch.findings)
                events.forget(batch.exited)
                for key in batch.exited:  # sent a final time: drop the series
                    agent.forget(key)
                if profiles is not None:
                    profiles.builder.forget({key.pid for key in batch.exited})
            else:
                batch.rollback()
        if ok:
            if failures:
                log.warning(
                    "push to %s works again after %d failed attempts; totals are current", cfg.endpoint, failures
                )
            failures = 0
        else:
            builder.export_failures += 1
            failures += 1
            if failures == 1:
                log.warning(
                    "push to %s failed: %s. Tracing goes on; retrying with backoff, and the "
                    "next successful push carries the full totals",
                    cfg.endpoint,
                    reason,
                )
            else:
                log.debug("push failed again (%d): %s", failures, reason)

    def export(data: Any) -> tuple[bool, str, int]:
        """On the export thread: the metrics, then the profiles built with them."""
        result = exporter.export(data)
        if profiles is not None and pending_profiles:
            latest = pending_profiles[-1]
            del pending_profiles[:]  # older ones are superseded by the latest, built since
            profiles.send(latest)
        return result

    def submit(batch: Batch) -> tuple[Future[tuple[bool, str, int]], Batch]:
        return pool.submit(export, batch.data), batch

    freeze_long_lived()  # the libraries, the BPF objects and the model so far
    try:
        with pipe.running(pinned, drain_interval=drain_interval):
            while not stop.is_set():
                if inflight is not None and inflight[0].done():
                    ok, reason, delivered = inflight[0].result()
                    settle(ok, reason, delivered, inflight[1])
                    inflight = None
                    give_back_free_memory()
                if inflight is None and time.monotonic() >= next_at:
                    # No local keeps the batch: once settled, its points (a whole
                    # export's objects: tens of MB at 1000 processes) are freed
                    # and given back, not held until the next push is built.
                    inflight = submit(build())
                    next_at = time.monotonic() + backoff(cfg.interval, failures)
                # Exits are folded by the drain thread between pushes, and a push
                # may be backed off for long: keep the bound meanwhile too.
                trim_exited()
                # Wake for a finished push, the next one, the stop, or the next trim.
                wait = SETTLE_POLL_S if inflight is not None else max(next_at - time.monotonic(), 0.0)
                stop.wait(min(wait, TRIM_INTERVAL_S))
            # Flush: whatever was in flight, then one last push with everything.
            deadline = time.monotonic() + final_timeout
            if inflight is not None:
                try:
                    ok, reason, delivered = inflight[0].result(timeout=max(0.1, deadline - time.monotonic()))
                    settle(ok, reason, delivered, inflight[1])
                except FuturesTimeout:  # not the builtin TimeoutError before Python 3.11
                    with agent.lock:
                        inflight[1].rollback()
            if host is not None:
                # Its last sample (the NCCL calls since the previous one, the
                # final GPU and NIC readings) goes out with the last push.
                host.finish()
            refused = exporter.transport.refused() if failures else ""
            if refused:  # the SDK would retry until the timeout: stop at once, and say what is not sent
                with agent.lock:
                    unsent = len(agent.model.processes)
                log.warning("the last push was not sent (%s): %d processes' last figures are lost", refused, unsent)
                return builder.export_failures + 1
            batch = build()
            fut = pool.submit(export, batch.data)
            try:
                ok, reason, delivered = fut.result(timeout=max(0.5, deadline - time.monotonic()))
                settle(ok, reason, delivered, batch)
                if not ok:
                    log.warning("the last push failed: %s", reason)
            except FuturesTimeout:
                log.warning("the last push did not finish within %.0fs", final_timeout)
            return builder.export_failures
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        exporter.shutdown()
        if own_events:
            events.shutdown()
