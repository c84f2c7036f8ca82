"""The agent: owns the CUDA sensor and the model, and keeps them in step.

Draining runs on its own thread (`start_draining`), so that nothing an
export, a report or the model itself costs can delay it; folding what it
reads into the model runs on another. Two locks keep the threads apart:

- the drain lock: one drain at a time (the rings have a single reader). A
  drain holds it while it reads the rings and acts on control events:
  attaching new libraries and continuing held processes. It never touches
  the model: what it decodes (event batches, exits, holds) is queued, in
  ring order, as pending model updates; the fold thread is woken once a
  share of them waits, and folds every FOLD_LATENCY_S otherwise.
- `Agent.lock`, the model's: whoever reads or changes the model holds it
  (an export's build, a report, top's refresh, the fold thread). The fold
  thread folds the pending updates FOLD_SHARE_EVENTS at a time, taking the
  lock for each share, so a reader waits for one share at most; a reader
  folds whatever is still pending first (`locked()`), so it sees a current
  model. Folding was the drain's cost at 1000 processes (tens of ms for a
  few hundred events, most of a 5 ms period), and after an export a drain
  that folded what piled up meanwhile came a second late; on its own thread
  it delays no drain (bench/footprint.py, the worst drain gap).

The order is always model lock, then drain lock, never the reverse while
waiting, so the two cannot deadlock, and a drain waits for nobody: holds
are released and the ring is read every period whatever the export costs.

Pending updates are bounded: once `max_pending_events` events are waiting
for the model, drains stop reading the events ring (control events are
still handled and holds still released) and the events stay in the
kernel's ring; if that fills too, the kernel counts the calls it could not
queue exactly (the `lost` totals and the dropped-events stat), as it does
for any full ring. Such drains are counted (`reads_deferred`). An
incremental export was the alternative; it would have left every reader
(the report, top, findings) to be made incremental too, where a lock and a
queue keep them as they are.

A quiet ring is drained less often (IDLE_STRETCH): uprobes submit events
without a wakeup (a wakeup there loses later hits:
docs/design/evidence.md#ring-wakeups), so a drain
that sleeps long is a drain that might let a burst fill the ring. When the
host signals' C sampler runs (its thread wakes 100 times a second anyway),
it watches the ring's fill for the drain thread (`guard_ring`): the drain
thread then sleeps up to GUARDED_QUIET_S while the ring is quiet and is
woken within a tick once a share of the ring waits; the fold thread, whose
work the live diagnosis's tick does every 0.5 s, sleeps as long; and the
control thread, which read process notices (also submitted without a
wakeup) every CONTROL_QUIET_S, is woken within a tick of one arriving.
Wakes were most of the agent's cost (docs/design/evidence.md#wake-cost).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from memtrace.core.abi import EVENT_DTYPE, TRAPS_API, PyCode, PyCodeKey, PyProc, Stat
from memtrace.core.abi import Stack as RawStack
from memtrace.core.ids import ProcessKey
from memtrace.core.notices import Collectives, Events, Execed, Exited, Notice, ProcessMet
from memtrace.core.overhead import TrapCosts
from memtrace.core.procfiles import Candidate
from memtrace.core.sensor import Sensor
from memtrace.core.stacks import Stack
from memtrace.core.threads import thread
from memtrace.export.schema import StackCounts
from memtrace.model import Model
from memtrace.runtime.budget import LaunchBudget
from memtrace.runtime.drain import DrainGaps, DrainStats
from memtrace.runtime.overhead import Calibration
from memtrace.runtime.stacks import StackTable
from memtrace.sensors.cuda import CONTROL_QUIET_S, Attachment, CudaSensor, Hooks, KernelMaps, Options
from memtrace.sources.procfs import boot_wall_ns, driver_mapped, process_cpu_ns, read_process

__all__ = ["DRAIN_INTERVAL_S", "Agent", "DrainStats", "Options"]

log = logging.getLogger("memtrace")

DRAIN_INTERVAL_S = 0.005
# While the events ring is quiet (a drain reads under 1/QUIET_SHARE of what
# it holds, and no more than that waits for the model), the next drain is
# put off, doubling up to this many base periods: an idle agent wakes 25
# times a second, not 200 (docs/design/evidence.md#wake-cost). The ring
# (16 MiB of 72-byte events) still holds what a burst of 5 million events a
# second brings in the longest interval (40 ms); the first drain that reads
# more goes back to the base period.
IDLE_STRETCH = 8
QUIET_SHARE = 64
# The drain thread's niceness: on a host whose CPUs the traced jobs keep
# busy, a drain waits for a CPU as much as for the interpreter
# (docs/design/evidence.md#drain-nice). It needs little CPU and holds no
# lock others wait on for long. Set only where the agent may
# (CAP_SYS_NICE); never fatal.
DRAIN_NICE = -10
FOLD_SHARE_EVENTS = 4096  # events the fold thread folds per hold of the model lock, at most
# The fold thread folds when a share is waiting, else at this age: a fold
# costs about the same for 10 events as for 1000 (numpy per call:
# docs/design/evidence.md#wake-cost). Readers never see the delay: they
# fold what is pending first (the live diagnosis every 0.5 s, top, an
# export), and a share waiting wakes the thread at once, so memory stays
# bounded.
FOLD_LATENCY_S = 0.5
# With a guard on the ring (guard_ring), the longest a quiet ring waits for a
# drain, and what is drained waits for a fold (a reader folds first anyway).
GUARDED_QUIET_S = 1.0
_EVENTS_SLOT, _CONTROL_SLOT = 0, 1  # the guard's two watches
IDLE_TOTALS_S = 10.0  # sync_totals walks the kernel's maps this often while the model holds no process


class RingGuard(Protocol):
    """A thread that watches the agent's rings for their readers
    (sources/fastsample.FastSampler): in each slot, a ring's positions and
    an eventfd it writes once that ring holds the given bytes unread."""

    def watch_ring(self, slot: int, cons: int, prod: int, nbytes: int, eventfd: int) -> None: ...

    def unwatch_ring(self, slot: int) -> None: ...


class Agent:
    def __init__(
        self,
        opts: Options,
        measure_overhead: bool = False,
        budget: float | None = None,
        *,
        other_library: Callable[[ProcessKey, Candidate, bool], bool] | None = None,
        from_exec: bool | None = None,
        recorder: Callable[[list[Notice]], None] | None = None,
    ) -> None:
        """`measure_overhead`: time a probe's trap at start (runtime/overhead.py),
        so that each process's overhead can be told (Model.overhead).
        `budget` (with it): keep each process's overhead under this share of
        its CPU time by sampling its launch probes (runtime/budget.py).
        `other_library`: another sensor's library a process was stopped for
        (libnccl: HostSignals.nccl_mapped), called on the control thread.
        `from_exec`: every process it meets is traced from its first
        instruction (`memtrace run`'s command and its children; by default
        with Options.only_traced). Otherwise only those that start once the
        probes are live are (set in start()), and those held at load; a
        process met mid-run has its untracked host memory unknown, not
        pageable, but for what its GPU driver mapped (pinned).
        `recorder`: shown every notice as it is taken, on the polling thread
        (the flight recorder, runtime/recorder.py); None costs nothing."""
        whole = opts.only_traced if from_exec is None else from_exec
        self.model = Model(
            complete_after_ns=None if whole else 2**63,
            identify=read_process,
            boot_wall_ns=boot_wall_ns(),
            stacks=opts.stacks,
            forked_since_start=self._forked_since_start,
            driver_mapped=driver_mapped,
        )
        self.lock = threading.RLock()  # the model's
        self._drain_lock = threading.Lock()  # the rings'
        self._pending_lock = threading.Lock()  # the queue's, held for an append or a swap only
        self._pending: list[Notice] = []  # the one queue: every notice for the model, in order
        self._pending_events = 0
        # One ring's worth of events may wait in memory for the model, then the ring itself.
        self.max_pending_events = max(opts.ring_bytes // EVENT_DTYPE.itemsize, 1)
        # The fold thread is woken at a share of events, or at half the bound
        # (a small ring): never left asleep while drains stop reading.
        self._fold_wake = max(min(FOLD_SHARE_EVENTS, self.max_pending_events // 2), 1)
        self._gaps = DrainGaps()
        self._folds_deferred = 0
        self._reads_deferred = 0
        self._pending_max = 0
        # The CPU its folds took, every thread's (the model's share of the agent's cost: bench/targets/agent_cpu.py).
        self.fold_cpu_ns = 0
        self.folds = 0  # the folds that took something: a fold's cost is mostly fixed, so how often matters
        self._interval = 0.0
        self._put_off = 0.0  # how much later than its period the drain thread will start the next drain
        self.drain_nice = DRAIN_NICE  # 0: the drain thread keeps the process's priority
        self._thread: threading.Thread | None = None  # drains
        self._folder: threading.Thread | None = None  # folds
        self._fold_wanted = threading.Event()
        self._stop = threading.Event()
        # Wakes the drain thread early: a guard's signal (a share of the ring waits), or stop.
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._guard: RingGuard | None = None
        self._failure: BaseException | None = None
        self.libraries: list[Attachment] = []
        self._measure_overhead = measure_overhead
        self._budget_share = budget if measure_overhead else None
        self.budget: LaunchBudget | None = None
        self.calibration: Calibration | None = None
        self._trap_costs: TrapCosts | None = None
        self.stacks: StackTable | None = None
        self._record = recorder
        self._totals_walked = -IDLE_TOTALS_S  # when sync_totals last walked the kernel's maps (monotonic)
        # Told each process the drains meet (the host signals' nudge: sampled at their rate from then).
        self.on_met: Callable[[ProcessKey], None] | None = None
        self.cuda = CudaSensor(
            opts,
            Hooks(
                notices=self._take,
                library_attached=self._library_attached,
                # A process not held (its libraries known) is looked at when it first
                # calls: its Python frames are taken from then on. The budget watches
                # it from then (or from its hold) for its first launches.
                process_seen=self._seen if opts.stacks or (measure_overhead and budget is not None) else None,
                other_library=other_library,
                identify=read_process,
            ),
        )
        if opts.stacks:
            self.stacks = StackTable(self._take_stack, self._tell_python, self._take_py_codes)

    # ---- what a drain decodes: queued in ring order, folded under the model lock ----

    def _take(self, notices: list[Notice]) -> None:
        """A poll's notices, on the polling thread: what must happen while the
        processes live happens now, and the rest waits in the queue for the model."""
        if self._record is not None:
            self._record(notices)
        events = 0
        for n in notices:
            if isinstance(n, Events):
                events += n.count
                if self.stacks is not None:
                    self.stacks.add(n.batch)  # while the processes live: their frames are placed in their files
            elif isinstance(n, ProcessMet):
                if self.budget is not None:
                    self.budget.met(n.key)  # weighed from now, not from the fold that introduces it
                if self.on_met is not None:
                    self.on_met(n.key)
            elif isinstance(n, Exited):
                if self.stacks is not None:
                    self.stacks.forget(n.key)
                if self.budget is not None:
                    self.budget.exited(n.key, n.cpu_ns)
        with self._pending_lock:
            self._pending += notices
            self._pending_events += events
            self._pending_max = max(self._pending_max, self._pending_events)

    def _seen(self, key: ProcessKey) -> None:
        """A process stopped at a CUDA library, or at its first traced call (the control thread)."""
        if self.stacks is not None:
            self.stacks.learn(key)
        if self.budget is not None:
            self.budget.met(key)  # its first launches looked for from now, not from the drain's notice

    def _take_stack(self, key: int) -> RawStack | None:
        return self.cuda.maps.take_stack(key) if self.cuda.maps is not None else None

    def _tell_python(self, key: ProcessKey, config: PyProc | None) -> None:
        if self.cuda.maps is not None:
            self.cuda.maps.tell_python(key, config)

    def _take_py_codes(self) -> list[tuple[PyCodeKey, PyCode]]:
        return self.cuda.maps.take_py_codes() if self.cuda.maps is not None else []

    def execed(self, notice: Execed) -> None:
        """A traced process exec'd (the host signals read it): folded in turn
        with the CUDA events. From any thread that holds neither lock."""
        self._take([notice])

    def add_collectives(self, notice: Collectives) -> None:
        """The NCCL sensor's events (the host signals poll it), folded into
        the model in turn with the CUDA events: every collective that
        returned by `complete_until_ns` (CLOCK_MONOTONIC) is in them or
        came before. From any thread that holds neither the model lock nor
        the drain lock.

        With events, or a time they are complete to, the CUDA rings are
        drained first: a process's CUDA calls (the first of which introduces
        it to the model, and its waits) come before its collectives, and a
        drain put off while the ring was quiet would queue them after the
        poll's collectives, which the model would then find no process for
        (`collectives_unmatched`) and no wait could be charged to
        (tests/test_collectives.py). With no collective in a poll, the model
        still judges every wait up to `complete_until_ns`: a wait drained
        after that would come too late to be charged, and a quiet ring's
        drains may be put off up to GUARDED_QUIET_S."""
        if len(notice.events) or notice.complete_until_ns:
            self._drain(wait=False)
        self._take([notice])

    def fold(self) -> None:
        """Fold everything pending into the model now (after the drain and
        the host signals have stopped: their last readings)."""
        with self.lock:
            self._fold()

    def _fold(self, most: int | None = None) -> int:
        """Apply the pending notices to the model, in order: all of them, or
        the oldest, up to `most` events (a batch may be split); the rest
        wait for the next fold. Holds self.lock. Returns the events folded."""
        with self._pending_lock:
            if most is None:
                pending, self._pending = self._pending, []
                events, self._pending_events = self._pending_events, 0
            else:
                take = events = 0
                for n in self._pending:
                    if events >= most:
                        break
                    take += 1
                    if isinstance(n, Events):
                        events += n.count
                pending, self._pending = self._pending[:take], self._pending[take:]
                last = pending[-1] if pending else None
                if events > most and isinstance(last, Events):  # the last batch is split: its rest stays first
                    keep = last.count - (events - most)
                    pending[-1] = Events(last.batch[:keep])
                    self._pending.insert(0, Events(last.batch[keep:]))
                    events = most
                self._pending_events -= events
        if not pending:
            return 0
        self.folds += 1
        t = time.thread_time_ns()
        self.model.take(pending)
        self.fold_cpu_ns += time.thread_time_ns() - t
        return events

    # ---- lifecycle ----

    def start(self) -> None:
        try:
            self.cuda.start()
        except BaseException:
            self.cuda.close()
            raise
        if self._measure_overhead and self.cuda.obj is not None:
            self.calibration = Calibration(self.cuda.obj, self._calibrated)
            self.calibration.start()
            if self._budget_share is not None:
                self.budget = LaunchBudget(self.cuda, self._budget_share, self._live, lambda: self.model.trap_cost)
                self.budget.start()
        # A process that started after now (its start as BPF reads it) started after the probes went live.
        self.model.tracing_from(time.clock_gettime_ns(time.CLOCK_BOOTTIME))

    def _forked_since_start(self, key: ProcessKey) -> bool:
        return self.cuda.maps is not None and self.cuda.maps.is_fresh(key)

    def _live(self) -> list[ProcessKey]:
        """The processes the model has met that have not exited (a copy: no lock)."""
        return [k for k, p in list(self.model.processes.items()) if not p.exited]

    def _calibrated(self, costs: TrapCosts) -> None:
        self._trap_costs = costs
        self._charge_traps()

    def _library_attached(self, att: Attachment) -> None:
        self.libraries.append(att)
        self._charge_traps()

    def _charge_traps(self) -> None:
        """What a trap is charged: the calibrated cost of the dearest entry
        kind among the probes attached so far (core/overhead.py, TrapCosts).
        One assignment, no lock: attaching may run under the drain's locks."""
        costs = self._trap_costs
        if costs is not None:
            self.model.trap_cost = costs.applied(*self.cuda.entry_kinds())

    def _maps(self) -> KernelMaps:
        assert self.cuda.maps is not None, "the agent is not started"
        return self.cuda.maps

    def wait_calibrated(self, timeout: float | None = None) -> bool:
        """Wait until a trap's cost is known (the overhead can be told)."""
        return self.calibration is not None and self.calibration.result(timeout) is not None

    def scan(self, pids: list[int] | None = None) -> None:
        """Attach to the CUDA libraries already mapped by running processes (or by `pids`)."""
        with self._drain_lock:
            self.cuda.scan(pids)

    # ---- draining ----

    def _drain(self, wait: bool) -> int:
        """Read the rings and act on control events. With `wait`, then fold
        everything pending into the model (waiting for its lock); without
        (the drain thread), leave that to the fold thread. Returns the events read."""
        read = 0
        # With `wait`: read, then fold what was pending and what was read in
        # one go (a fold's cost is mostly fixed: the live diagnosis's tick
        # folded twice, before and after its read, and that was a third of
        # the host thread's CPU). Where the pending updates had no room for
        # the ring's events, fold and read again: a last drain before a
        # report must leave nothing in the ring.
        for _ in range(2 if wait else 1):
            with self._drain_lock:
                # What the drain thread put off on purpose (a quiet ring) is not lateness.
                self._gaps.started(time.monotonic(), self._put_off)
                room = self._pending_events < self.max_pending_events
                if not room:
                    self._reads_deferred += 1
                read += self.cuda.poll(events=room)
            if not wait:
                if self._pending_events >= self._fold_wake:
                    self._fold_wanted.set()
                break
            with self.lock:
                self._fold()
            if room:
                break
        return read

    def poll(self) -> int:
        """Drain now and fold everything into the model (waiting for the
        model lock). Returns the events read. For callers that drain
        themselves, and for a last drain before a final report or push."""
        return self._drain(wait=True)

    def _drain_forever(self, interval: float) -> None:
        if self.drain_nice:
            try:  # this thread alone: a Linux thread has its own niceness
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.drain_nice)
            except OSError as e:
                log.debug("drain thread keeps its priority: %s", e)
        next_at = time.monotonic()
        now = interval  # the period the next drain is scheduled at
        quiet = max(self.max_pending_events // QUIET_SHARE, 1)
        try:
            while not self._stop.is_set():
                woken, _, _ = select.select([self._wake], [], [], max(next_at - time.monotonic(), 0.0))
                if self._stop.is_set():
                    break
                if woken:  # early, by the guard (or a new schedule): not late, whatever it put off
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                read = self._drain(wait=False)
                # Busy: a drain that read much, or a model behind (reads deferred, the ring filling).
                busy = woken or read >= quiet or self._pending_events >= quiet
                longest = GUARDED_QUIET_S if self._guard is not None else interval * IDLE_STRETCH
                now = interval if busy else min(now * 2, max(longest, interval))
                self._put_off = now - interval
                # A fixed rate: a late drain is followed by the next at once, not a period later.
                next_at = max(next_at + now, time.monotonic() - now)
        except BaseException as e:  # noqa: BLE001 - handed to the owner, who re-raises it
            self._failure = e
            log.error("draining stopped: %s", e)

    def _fold_forever(self) -> None:
        """Fold what the drains queued, a bounded share at a time, releasing
        the model lock between shares so that readers wait for one at most."""
        try:
            while not self._stop.is_set():
                self._fold_wanted.wait(GUARDED_QUIET_S if self._guard is not None else FOLD_LATENCY_S)
                self._fold_wanted.clear()
                while self._pending and not self._stop.is_set():
                    if not self.lock.acquire(blocking=False):
                        self._folds_deferred += 1  # an export or a report holds the model: wait for it
                        self.lock.acquire()
                    try:
                        self._fold(FOLD_SHARE_EVENTS)
                    finally:
                        self.lock.release()
        except BaseException as e:  # noqa: BLE001 - handed to the owner, who re-raises it
            self._failure = e
            log.error("folding stopped: %s", e)

    def start_draining(self, interval: float = DRAIN_INTERVAL_S) -> None:
        """Drain every `interval` seconds on a thread of its own, and fold
        into the model on another, until `stop_draining`."""
        if self._thread is not None:
            return
        self._interval = interval
        self._stop.clear()
        self._thread = thread(self._drain_forever, "memtrace-drain", (interval,))
        self._folder = thread(self._fold_forever, "memtrace-fold")
        self._thread.start()
        self._folder.start()

    def stop_draining(self) -> None:
        """Stop the drain and fold threads; re-raise what stopped one, if it failed."""
        t, self._thread = self._thread, None
        f, self._folder = self._folder, None
        if t is not None:
            self._stop.set()
            self._fold_wanted.set()
            os.eventfd_write(self._wake, 1)
            t.join()
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake)
        if f is not None:
            f.join()
        self._put_off = 0.0
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    @contextlib.contextmanager
    def draining(self, interval: float = DRAIN_INTERVAL_S) -> Iterator[Agent]:
        """Drain on a thread for the duration of the block (a no-op if one already drains)."""
        if self._thread is not None:
            yield self
            return
        self.start_draining(interval)
        try:
            yield self
        finally:
            self.stop_draining()

    @contextlib.contextmanager
    def locked(self, drain: bool = True) -> Iterator[Model]:
        """Hold the model lock, with everything drained so far folded in (and,
        with `drain`, the rings read once more): a current model to read."""
        with self.lock:
            if self._failure is not None:
                self.stop_draining()
            if drain:
                self._drain(wait=True)
            else:
                self._fold()
            yield self.model

    def drain_stats(self) -> DrainStats:
        with self._drain_lock:
            g = self._gaps
            return DrainStats(
                interval_seconds=self._interval,
                drains=g.count,
                gap_max_seconds=g.max,
                gap_p99_seconds=g.quantile(0.99),
                folds_deferred=self._folds_deferred,
                reads_deferred=self._reads_deferred,
                pending_events_max=self._pending_max,
            )

    def reset_drain_stats(self) -> None:
        """Start the drain statistics afresh (a benchmark's phases)."""
        with self._drain_lock:
            self._gaps = DrainGaps()
            self._folds_deferred = self._reads_deferred = self._pending_max = 0

    def take_drain_gap_window(self) -> float:
        """The worst interval between drain starts since the previous call (the OTLP gauge)."""
        with self._drain_lock:
            return self._gaps.take_window_max()

    def guard_ring(self, guard: RingGuard) -> None:
        """Let `guard` watch the events ring and the control ring (see the
        module's docstring): quiet drains then come every GUARDED_QUIET_S,
        not every IDLE_STRETCH periods, and the control thread reads
        notices when the guard sees one waiting, not every
        CONTROL_QUIET_S. Until unguard_ring(), which close() calls before
        the rings go."""
        ring, ctl = self.cuda.events, self.cuda.control_watch()
        if ring is None or ctl is None:
            return
        cons, prod = ring.positions()
        # The share a drain calls busy (QUIET_SHARE), in bytes: past it the drain thread is woken.
        guard.watch_ring(_EVENTS_SLOT, cons, prod, max(ring.size // QUIET_SHARE, 1), self._wake)
        guard.watch_ring(_CONTROL_SLOT, ctl[0], ctl[1], 1, ctl[2])  # any record waiting
        self._guard = guard
        os.eventfd_write(self._wake, 1)  # a sleeping drain thread takes the new schedule now
        self.cuda.set_control_quiet(GUARDED_QUIET_S)

    def unguard_ring(self) -> None:
        """Stop the guard watching (it reads the rings no more on return); drains keep their own schedule again."""
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.unwatch_ring(_EVENTS_SLOT)
            guard.unwatch_ring(_CONTROL_SLOT)
            os.eventfd_write(self._wake, 1)  # off the guarded sleep now
            self.cuda.set_control_quiet(CONTROL_QUIET_S)

    # ---- the kernel's totals ----

    def sync_totals(self) -> None:
        """Copy what the kernel counts (launches, traps, calls lost from the
        ring) into the model, with the CPU time of the processes still running.
        While the model holds no process the maps are walked every
        IDLE_TOTALS_S only: a walk of an empty hash map reads every bucket
        (about 0.1 ms a map here, half an idle agent's recorder tick), and
        the kernel's totals of a process not met yet are copied at a sync
        after it has been (they are totals), or within IDLE_TOTALS_S where
        its notice never came."""
        now = time.monotonic()
        if not self.model.processes and now - self._totals_walked < IDLE_TOTALS_S:
            return
        self._totals_walked = now
        cpu = {}
        # Their CPU time is only read to tell their overhead (/proc, before taking the lock).
        for key, p in list(self.model.processes.items()) if self.calibration is not None else ():
            if not p.exited:
                ns = process_cpu_ns(key)
                if ns is not None:
                    cpu[key] = ns
        with self.lock:
            for k, v in self._maps().lost():
                key = ProcessKey(k.pid, k.start_ns)
                self.model.set_lost(key, k.api, k.direction, v.calls, v.bytes, v.errors, v.duration_ns)
            per: dict[ProcessKey, tuple[dict[int, int], list[int]]] = {}
            for k, n in self._maps().counts():
                launches, traps = per.setdefault(ProcessKey(k.pid, k.start_ns), ({}, [0]))
                if k.api == TRAPS_API:
                    traps[0] = n
                else:
                    launches[k.api] = n
            for key, (launches, traps) in per.items():
                self.model.set_traps(key, traps[0])
                if launches:
                    if self.budget is None:
                        self.model.set_launches(key, launches)
                        continue
                    est = self.budget.estimate(key, launches, traps[0])
                    self.model.set_launches(key, est.launches, sum(launches.values()), est.duty, est.error)
            for key, ns in cpu.items():
                self.model.set_cpu(key, ns)

    def forget(self, key: ProcessKey) -> None:
        """Drop a process's state here and in the kernel's totals."""
        with self.lock:
            self.model.forget(key)
            self._maps().forget_process(key)
        if self.budget is not None:
            self.budget.forget(key)

    def forget_unread(self, keys: list[ProcessKey]) -> None:
        """Forget processes whose kernel totals may not have been read since
        they last ran (exited between pushes): read the kernel's keys once
        first, so that forgetting deletes every one they left (their launch
        and trap counts, lost calls), not only those read before."""
        with self.lock:
            self._maps().lost()
            self._maps().counts()
            for key in keys:
                self.forget(key)

    def stats(self) -> dict[Stat, int]:
        return self._maps().stats()

    def stack_frames(self) -> dict[int, Stack]:
        """The named frames of every stack the model's call sites name (none with stacks off)."""
        if self.stacks is None:
            return {}
        with self.lock:
            keys = {k.stack for p in self.model.processes.values() for k in p.sites}
        return self.stacks.stacks(keys)

    def stack_counts(self) -> StackCounts | None:
        """What became of the stacks asked for (None with stacks off)."""
        if self.stacks is None:
            return None
        st = self.stats()
        return StackCounts(
            taken=st.get(Stat.STACKS, 0),
            not_taken=st.get(Stat.STACK_FAILED, 0),
            not_kept=st.get(Stat.STACKS_FULL, 0) + self.stacks.not_kept + self.stacks.not_found,
            distinct=self.stacks.distinct,
            frames_unplaced=self.stacks.unplaced_frames,
            python_frames_unnamed=self.stacks.python_unnamed,
            python_frames_walked=st.get(Stat.PY_FRAMES, 0),
            python_frame_reads=st.get(Stat.PY_READS, 0),
            python_thread_reads=st.get(Stat.PY_THREAD_READS, 0),
            python_unsupported=dict(self.stacks.unsupported),
        )

    def job_of(self, key: ProcessKey) -> dict[str, str | int]:
        """A process's job and rank (memtrace.job.*, read from its launcher's
        variables when memtrace met it, or from its NCCL communicator) and its
        communicator (memtrace.nccl.*); empty if none or not met. Lock-free:
        a process's attributes are set before it enters the model, and a
        communicator's are swapped in whole (model/aggregate.py)."""
        p = self.model.processes.get(key)
        return {k: v for k, v in p.attributes.items() if k.startswith(("memtrace.job.", "memtrace.nccl."))} if p else {}

    def processes(self) -> set[ProcessKey]:
        """The processes the model has met (for the host signals; no lock:
        a copy of the keys is taken at once)."""
        return set(list(self.model.processes))

    def names(self) -> dict[ProcessKey, str]:
        """Each process's command name, as the model knows it."""
        return {k: p.name for k, p in list(self.model.processes.items()) if p.name}

    def close(self) -> None:
        self.unguard_ring()  # before the ring is unmapped: the guard reads its positions
        try:
            self.stop_draining()
        except Exception as e:  # noqa: BLE001 - already logged by the drain thread; closing goes on
            log.debug("drain thread had failed: %s", e)
        if self.budget is not None:
            self.budget.close()  # its links use the BPF object
        if self.calibration is not None:
            self.calibration.close()  # its probes use the BPF object
            self.calibration = None
        cuda: Sensor[int] = self.cuda  # a sensor like the host's (core/sensor.py)
        cuda.close()
        if self.stacks is not None:
            self.stacks.close()
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
