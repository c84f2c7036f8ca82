"""The agent: owns the BPF source and the model, drains on a timer, and
runs a traced command from its first instruction.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np

from .abi import Stat
from .bpfsource import Attachment, BpfSource, Options
from .config import PushConfig, Temporality
from .errors import CommandNotFound
from .model import Model, boot_ticks_now
from .otlp import Batch, Exporter, MetricsBuilder
from .resources import host_attributes

log = logging.getLogger("memtrace")

DRAIN_INTERVAL_S = 0.005


class Agent:
    def __init__(self, opts: Options) -> None:
        # `memtrace run` traces a command from its first instruction: every
        # process is seen whole. Otherwise only those that start once the
        # probes are live are (set in start()), and those held at load.
        self.model = Model(complete_after_ticks=None if opts.only_traced else 2**63)
        self.libraries: list[Attachment] = []
        self.source = BpfSource(
            opts, self._on_events, self._on_exit, self.libraries.append, on_held=self.model.mark_complete
        )

    def _on_events(self, batch: np.ndarray) -> None:
        self.model.add_events(batch)

    def _on_exit(self, pid: int) -> None:
        self.model.process_exited(pid)

    def start(self) -> None:
        try:
            self.source.start()
        except BaseException:
            self.source.close()
            raise
        self.model.forked_since_start = self.source.is_fresh
        if self.model.complete_after_ticks is not None:
            # A process that started in a later clock tick started after the probes went live.
            self.model.complete_after_ticks = boot_ticks_now()

    def poll(self) -> int:
        return self.source.poll()

    def sync_totals(self) -> None:
        """Copy what the kernel counts (launches, calls lost from the ring) into the model."""
        for k, v in self.source.lost():
            self.model.set_lost(k.pid, k.api, k.direction, v.calls, v.bytes, v.errors, v.duration_ns)
        for k, n in self.source.counts():
            self.model.set_launches(k.pid, k.api, n)

    def forget(self, pid: int) -> None:
        """Drop a process's state here and in the kernel's totals."""
        self.model.forget(pid)
        self.source.forget_pid(pid)

    def stats(self) -> dict[Stat, int]:
        return self.source.stats()

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Finished:
    exit_code: int
    wall_seconds: float


class GatedChild:
    """A forked child that execs CMD only once released, so the agent can
    start tracing its pid before the first instruction of CMD runs."""

    def __init__(self, argv: list[str]) -> None:
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if exe is None or not os.path.exists(exe):
            raise CommandNotFound(argv[0])
        if not os.access(exe, os.X_OK):
            raise CommandNotFound(f"{argv[0]} (not executable)")
        gate_r, gate_w = os.pipe()
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(gate_w)
                os.close(err_r)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if os.read(gate_r, 1) != b"g":
                    os._exit(125)
                os.close(gate_r)
                os.execv(exe, argv)
            except OSError as e:
                os.write(err_w, str(e).encode())
            os._exit(127)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid
        self._gate = gate_w
        self._err = err_r
        self.started = time.monotonic()

    def release(self) -> None:
        os.write(self._gate, b"g")
        os.close(self._gate)
        msg = os.read(self._err, 4096)  # EOF on a successful exec
        os.close(self._err)
        self.started = time.monotonic()
        if msg:
            raise CommandNotFound(msg.decode(errors="replace"))

    def abort(self) -> None:
        try:
            os.close(self._gate)
        except OSError:
            pass
        os.waitpid(self.pid, 0)

    def poll(self) -> Finished | None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        return Finished(code if code >= 0 else 128 - code, time.monotonic() - self.started)


def run_command(agent: Agent, argv: list[str]) -> Finished:
    """Trace argv and its descendants until it exits."""
    child = GatedChild(argv)
    try:
        agent.source.trace_pid(child.pid)
    except BaseException:
        child.abort()
        raise
    # The terminal's ^C reaches the child too; we wait for it and report.
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def forward(sig: int, _frame: object) -> None:
        os.kill(child.pid, sig)

    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        child.release()
        while True:
            agent.poll()
            done = child.poll()
            if done is not None:
                break
            time.sleep(DRAIN_INTERVAL_S)
        # Every event of the finished process is already in the ring.
        agent.poll()
        agent.sync_totals()
        return done
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def backoff(interval: float, failures: int, cap: float = 30.0) -> float:
    """Time to the next push after `failures` consecutive failures."""
    if failures == 0:
        return interval
    return min(interval * 2 ** min(failures, 10), max(cap, interval))


MAX_UNSENT_EXITED = 2048


def give_back_free_memory() -> None:
    """Hand the memory an export freed back to the system: glibc keeps freed
    heap pages otherwise, and the resident size stays at the export's peak."""
    trim = getattr(_LIBC, "malloc_trim", None)  # glibc only (not musl)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


def push_forever(
    agent: Agent,
    cfg: PushConfig,
    stop: threading.Event,
    exporter: Exporter | None = None,
    final_timeout: float = 5.0,
    max_unsent_exited: int = MAX_UNSENT_EXITED,
) -> int:
    """Trace every CUDA process and push OTLP metrics every interval until
    `stop` is set, then flush a last push. Returns the number of failed pushes.

    Exited processes wait for one successful push; during a long outage at
    most `max_unsent_exited` of them are kept (memory stays bounded), and
    the oldest beyond that are dropped, counted and logged."""
    from concurrent.futures import Future, ThreadPoolExecutor

    builder = MetricsBuilder(cfg, host_attributes())
    exporter = exporter or Exporter(cfg)
    pool = ThreadPoolExecutor(1, thread_name_prefix="memtrace-export")
    inflight: tuple[Future[tuple[bool, str, int]], Batch] | None = None
    failures = 0
    next_at = time.monotonic() + cfg.interval
    log.warning("pushing to %s", cfg.redacted())

    def build() -> Batch:
        # A process already gone has queued all its events: look first, then
        # drain, so its final push carries every call it made.
        gone = [pid for pid, p in agent.model.processes.items() if not p.exited and not os.path.exists(f"/proc/{pid}")]
        agent.poll()
        agent.sync_totals()
        for pid in gone:
            agent.model.process_exited(pid)  # its exit notice was lost: never keep its series forever
        exited = sorted((p.first_seen_ns, pid) for pid, p in agent.model.processes.items() if p.exited)
        if len(exited) > max_unsent_exited:
            drop = [pid for _, pid in exited[: len(exited) - max_unsent_exited]]
            if not builder.unsent_processes:
                log.warning(
                    "more than %d exited processes are waiting for a push: the oldest are dropped "
                    "unsent (counted in memtrace.agent.unsent_processes)",
                    max_unsent_exited,
                )
            for pid in drop:
                agent.forget(pid)
            builder.unsent_processes += len(drop)
        return builder.build(agent.model, agent.stats(), len(agent.libraries))

    def settle(ok: bool, reason: str, delivered: int, batch: Batch) -> None:
        nonlocal failures
        if not ok and delivered and cfg.temporality == Temporality.delta:
            # Part of a delta export arrived: those processes' deltas must not
            # be sent again; the rest is, with the next push.
            done = batch.processes_in(delivered)
            batch.commit_processes(done)
            for pid in set(batch.exited) & done:
                agent.forget(pid)
        elif ok:
            batch.commit()
            for pid in batch.exited:  # sent a final time: drop the series
                agent.forget(pid)
            if failures:
                log.warning(
                    "push to %s works again after %d failed attempts; totals are current", cfg.endpoint, failures
                )
            failures = 0
        else:
            batch.rollback()
        if not ok:
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

    try:
        while not stop.is_set():
            agent.poll()
            if inflight is not None and inflight[0].done():
                ok, reason, delivered = inflight[0].result()
                settle(ok, reason, delivered, inflight[1])
                inflight = None
                give_back_free_memory()
            if inflight is None and time.monotonic() >= next_at:
                batch = build()
                inflight = (pool.submit(exporter.export, batch.data), batch)
                next_at = time.monotonic() + backoff(cfg.interval, failures)
            stop.wait(DRAIN_INTERVAL_S)
        # Flush: whatever was in flight, then one last push with everything.
        deadline = time.monotonic() + final_timeout
        if inflight is not None:
            try:
                ok, reason, delivered = inflight[0].result(timeout=max(0.1, deadline - time.monotonic()))
                settle(ok, reason, delivered, inflight[1])
            except TimeoutError:
                inflight[1].rollback()
        batch = build()
        fut = pool.submit(exporter.export, batch.data)
        try:
            ok, reason, delivered = fut.result(timeout=max(0.5, deadline - time.monotonic()))
            settle(ok, reason, delivered, batch)
            if not ok:
                log.warning("the last push failed: %s", reason)
        except TimeoutError:
            log.warning("the last push did not finish within %.0fs", final_timeout)
        return builder.export_failures
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        exporter.shutdown()
