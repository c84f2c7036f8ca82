"""Keeping each process's overhead under its budget.

Every trap memtrace's probes take is paid by the traced process. The
copies, memory calls and waits are what exact accounting needs, so their
probes always stay. Launches are the hottest calls and are only counted,
so a process that would cost more than its budget (a share of its own CPU
time, default 1%) has its launch probes attached for only part of the
time, a duty cycle, and its launch counts extrapolated and marked
estimated:

- Every `DECIDE_S` the budget reads each launching process's CPU time
  (/proc), its exact traps and its launches (the kernel's counts; while
  sampled, the estimate) over the interval, and asks what share of each
  period its launch probes may stay attached:
  duty = (budget x SAFETY - exact traps' share) / every launch's share.
- A process first sampled puts the libraries it launches through in
  per-process mode (sensors/cuda/launches.py): its own pid-filtered link,
  which the budget can detach without blinding any other process.
- A window (probes attached) lasts duty x PERIOD_S, at least MIN_ON_S,
  longer (up to MAX_STRETCH times) until it holds WINDOW_INTERVALS
  complete intervals; the gap after it grows so that the duty holds from
  the first window on: the next window opens once the windows so far and
  it (as long as the last) fit in the duty's share of the time since
  sampling began (_Sampled.next_window_at; a debt from an earlier, higher
  duty is paid a gap at a time). A gap of window x (1/duty - 1) alone let
  the second window end at twice the duty, and a 20 s launch loop paid
  1.4% where its budget was 1% (bench/overhead_budget.py, entries emulated:
  a window stretched 3x for its intervals).
  Launches counted in a window are exact; between windows they are
  extrapolated per exact call (the calls that are never sampled: a loop's
  copies and waits keep their rhythm with its launches, and a probed
  loop's slower pace does not bias it), from the launches BPF counted in
  complete intervals between exact calls inside the windows around the
  gap; or per second of window for a process that makes no other call (a
  floor: the probes slowed the loop while they counted).
- A process whose exact probes alone cost more than the budget keeps them
  (bytes stay exact) at the smallest duty and is reported by the finding
  overhead_budget_exceeded, never silently blinded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import TrapCost
from memtrace.core.threads import thread
from memtrace.sensors.cuda import CudaSensor, LaunchLinks, mapped_libraries
from memtrace.sources.procfs import CpuReader, start_ticks_of

log = logging.getLogger("memtrace")

PERIOD_S = 5.0  # a duty cycle's period (longer when the duty asks for windows under MIN_ON_S)
MIN_ON_S = 0.02  # the shortest window: several times an attach's time (docs/design/evidence.md#launch-links)
MIN_DUTY = 0.005
# A window stays open, up to MAX_STRETCH times its length, until it has seen
# this many complete intervals between exact calls (a loop's copies or waits
# may be far apart). The gap after it grows to match.
WINDOW_INTERVALS = 64
MAX_STRETCH = 4.0
FIRST_DECIDE_S = 0.05  # a new process is weighed this often until it has used MIN_CPU_S
DECIDE_S = 0.5  # then this often
IDLE_DECIDE_S = 1.0  # a process that has not launched yet is looked at again this often
SAFETY = 0.7  # aim this far under the budget: the calibration's error, the windows' edges
MIN_CPU_S = 0.05  # CPU time an interval needs before it is weighed
NEAR = 8  # a gap is extrapolated from up to this many windows on each side of it
MIN_INTERVALS = 1  # complete intervals in those windows for a ratio per exact call (else per second)


@dataclass
class _Window:
    launches: dict[int, int]  # counted in it, by api
    interval_launches: int  # in complete intervals between exact calls (BPF)
    intervals: int
    seconds: float


@dataclass
class _Gap:
    """Time between two windows: its exact calls and its length."""

    after: int  # the number of windows before it
    calls: float  # exact calls (two traps each)
    seconds: float


def _rates(windows: list[_Window]) -> tuple[float, bool, dict[int, float]]:
    """Launches per exact call over these windows' complete intervals
    (True), or per second of window (False); and each api's share."""
    by_api: dict[int, int] = {}
    for w in windows:
        for api, n in w.launches.items():
            by_api[api] = by_api.get(api, 0) + n
    total = sum(by_api.values())
    shares = {api: n / total for api, n in by_api.items()} if total else {}
    intervals = sum(w.intervals for w in windows)
    if intervals >= MIN_INTERVALS:
        return sum(w.interval_launches for w in windows) / intervals, True, shares
    secs = sum(w.seconds for w in windows)
    return (total / secs if secs > 0 else 0.0), False, shares


@dataclass
class _Sampled:
    """A process whose launch probes are duty-cycled, and its estimate.

    Reported launches: those counted before sampling began, those counted
    in windows, and those extrapolated over gaps (the current phase's
    counted if a window, extrapolated if a gap). A gap is extrapolated from
    the windows around it, NEAR on each side: while later windows come, its
    estimate improves (a window's complete intervals hold a whole number of
    exact calls, not a whole number of a loop's steps: a window of a loop
    whose launches come in one lump between four calls can be a few percent
    off alone); once NEAR windows followed it, it is settled. Launches the
    kernel counts outside windows (while a link is being attached or
    removed) are left out: the gaps' extrapolation covers that time."""

    pid: int
    duty: float
    base: dict[int, int]  # launches counted before sampling began (exact)
    on: bool = True
    phase_start: float = 0.0  # the current window's or gap's start (monotonic)
    since: float = 0.0  # when sampling began (monotonic)
    on_seconds: float = 0.0  # the closed windows' time (close_window)
    phase_counts: dict[int, int] = field(default_factory=dict)
    phase_traps: int = 0  # exact traps (two per exact call) at its start
    phase_sample: tuple[int, int] = (0, 0)  # (interval launches, intervals) at its start
    next_toggle: float = 0.0
    counted: dict[int, int] = field(default_factory=dict)  # launches counted in closed windows
    estimated: dict[int, float] = field(default_factory=dict)  # launches extrapolated over settled gaps
    windows: list[_Window] = field(default_factory=list)  # the last 2 x NEAR + 1
    closed: int = 0  # windows closed so far
    gaps: list[_Gap] = field(default_factory=list)  # closed gaps not settled yet
    ended: float | None = None
    per_call: bool = False  # the last extrapolation was per exact call (else per second)

    def retune(self, duty: float, on_s: float) -> None:
        """A new duty from a later weighing. An open window it makes too long
        ends at its new length (at once if it is already past it): a loop
        whose launches begin after its first weighing (a model's set-up, then
        the training loop) would otherwise keep every launch probed for up
        to a whole period. The windows' stretch for complete intervals still
        applies when it closes."""
        self.duty = duty
        if self.on:
            self.next_toggle = min(self.next_toggle, self.phase_start + on_s)

    def next_window_at(self, closed_at: float, window_s: float) -> float:
        """When the window after one `window_s` long that closed at
        `closed_at` (already in on_seconds) may open: once the windows so
        far and one more as long take at most the duty's share of the time
        since sampling began. In a steady rhythm that is a gap of window_s
        x (1/duty - 1); after a higher duty (a cheaper process), sooner,
        down to at once. After a lower one (a set-up's long windows, then
        the loop), no later than one more window's worth of time past that
        gap: the windows that debt would put off are the loop's only count
        of its launches, and the gaps meanwhile are extrapolated from the
        windows around them."""
        credit = self.since + (self.on_seconds + window_s) / self.duty
        return min(credit, closed_at + window_s * (2.0 / self.duty - 1.0))

    def _near(self, after: int) -> list[_Window]:
        """The windows around a gap that followed `after` windows, as far as kept."""
        first = self.closed - len(self.windows)  # index of self.windows[0]
        lo, hi = max(after - NEAR, first), min(after + NEAR, self.closed)
        return self.windows[lo - first : hi - first]

    def _extrapolate(self, gap: _Gap) -> dict[int, float]:
        rate, per_call, shares = _rates(self._near(gap.after))
        self.per_call = per_call
        n = rate * (gap.calls if per_call else gap.seconds)
        return {api: n * sh for api, sh in shares.items()}

    def current_gap(self, traps_now: int, now: float) -> _Gap:
        end = self.ended if self.ended is not None else now
        return _Gap(self.closed, max(traps_now - self.phase_traps, 0) / 2, max(end - self.phase_start, 0.0))

    def close_window(self, w: _Window) -> None:
        self.windows.append(w)
        self.closed += 1
        self.on_seconds += w.seconds
        for a, n in w.launches.items():
            self.counted[a] = self.counted.get(a, 0) + n
        while self.gaps and self.closed - self.gaps[0].after >= NEAR:  # enough windows after it
            for a, est in self._extrapolate(self.gaps.pop(0)).items():
                self.estimated[a] = self.estimated.get(a, 0.0) + est
        keep = 2 * NEAR + 1
        if len(self.windows) > keep:
            del self.windows[:-keep]

    def report(self, counts: dict[int, int], traps_now: int, now: float) -> dict[int, int]:
        totals: dict[int, float] = {}
        parts: list[dict[int, float]] = [{a: float(n) for a, n in self.base.items()}]
        parts += [{a: float(n) for a, n in self.counted.items()}, self.estimated]
        parts += [self._extrapolate(g) for g in self.gaps]
        if self.on:
            parts.append({api: float(n - self.phase_counts.get(api, 0)) for api, n in counts.items()})
        else:
            parts.append(self._extrapolate(self.current_gap(traps_now, now)))
        for part in parts:
            for api, n in part.items():
                totals[api] = totals.get(api, 0.0) + n
        return {api: round(n) for api, n in totals.items()}


@dataclass
class _Reading:
    cpu_ns: int
    launches: float  # reported (estimated while sampled)
    exact: int


class LaunchBudget:
    """Owns the duty cycles. `estimate` is called with the kernel's counts
    by whoever copies them into the model; `exited` and `forget` from the
    drain; everything that attaches or detaches runs on its own thread."""

    def __init__(
        self,
        cuda: CudaSensor,
        budget: float,
        processes: Callable[[], list[ProcessKey]],
        cost: Callable[[], TrapCost | None],
        period_s: float = PERIOD_S,
    ) -> None:
        self.cuda = cuda
        self.budget = budget
        self.processes = processes  # the live processes that launched, as the model has them
        self.cost = cost
        self.period_s = period_s
        self._lock = threading.Lock()
        self._sampled: dict[ProcessKey, _Sampled] = {}
        self._readings: dict[ProcessKey, _Reading] = {}
        self._next: dict[ProcessKey, float] = {}  # when each process is weighed next
        self._exits: list[ProcessKey] = []
        self._cannot: set[ProcessKey] = set()  # over budget, but its launches cannot be sampled
        # Processes the drain met that the model may not hold yet (it learns of them at a fold,
        # up to a second later): weighed from their first event, not from the fold after it.
        self._met: set[ProcessKey] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.enforced = cuda.launch_links is not None
        self.failures = 0
        self._cpu = CpuReader()  # the budget thread's alone

    def _counts(self, key: ProcessKey) -> tuple[dict[int, int], int]:
        maps = self.cuda.maps
        return maps.process_counts(key) if maps is not None else ({}, 0)

    # ---- lifecycle ----

    def start(self) -> None:
        if not self.enforced:
            log.info("overhead budget reported, not kept: this kernel has no multi-uprobe links")
            return
        self._thread = thread(self._loop, "memtrace-budget")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._apply_exits(time.monotonic())
        self._cpu.close()

    # ---- what the model is told ----

    def estimate(self, key: ProcessKey, counts: dict[int, int], exact: int) -> tuple[dict[int, int], float | None]:
        """The launches to report for a process, by api, given the kernel's
        counts and exact traps now, and its duty (None: never sampled, the
        counts are exact)."""
        with self._lock:
            s = self._sampled.get(key)
            if s is None:
                return counts, None
            return s.report(counts, exact, time.monotonic()), s.duty

    def met(self, key: ProcessKey) -> None:
        """A process's first event was read (the drain thread): weigh it now,
        whenever the model folds it in. A launch loop ran every launch probed
        until then: a second of a 20 s loop, 5% of its launches trapped."""
        if not self.enforced:
            return  # no thread weighs anything: kept, it would grow with every process
        with self._lock:
            self._met.add(key)
        self._wake.set()

    def exited(self, key: ProcessKey) -> None:
        if not self.enforced:
            return  # nothing sampled to end, and no thread to take the list
        with self._lock:
            self._exits.append(key)
        self._wake.set()

    def forget(self, key: ProcessKey) -> None:
        with self._lock:
            self._sampled.pop(key, None)
            self._readings.pop(key, None)
            self._next.pop(key, None)
            self._cannot.discard(key)
            self._met.discard(key)

    # ---- the thread ----

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            next_decision = now + FIRST_DECIDE_S
            try:
                self._apply_exits(now)
                next_decision = self._decide(now)
                self._toggle(time.monotonic())
            except Exception:  # noqa: BLE001 - the budget failing must not stop the agent
                self.failures += 1
                if self.failures == 1:
                    log.exception("overhead budget (launches of processes it samples are estimated from then on)")
            with self._lock:
                due = [s.next_toggle for s in self._sampled.values() if s.ended is None]
            wait = min([next_decision, *due]) - time.monotonic()
            self._wake.wait(max(wait, 0.001))
            self._wake.clear()

    def _apply_exits(self, now: float) -> None:
        with self._lock:
            exits, self._exits = self._exits, []
        links = self.cuda.launch_links
        for key in exits:
            with self._lock:
                s = self._sampled.get(key)
                if s is not None and s.ended is None:
                    s.ended = now
                self._readings.pop(key, None)
                self._next.pop(key, None)
                self._met.discard(key)
            self._cpu.forget(key)
            if links is not None:
                links.exited(key.pid, start_ticks_of(key))

    def _decide(self, now: float) -> float:
        """Weigh each process that is due; returns when the next one is."""
        cost = self.cost()
        if cost is None:
            return now + FIRST_DECIDE_S  # not calibrated yet
        soonest = now + IDLE_DECIDE_S
        live = self.processes()
        held = set(live)
        with self._lock:
            self._met -= held  # the model has them now
            met = list(self._met)
        for key in live + met:
            due = self._next.get(key, 0.0)
            if due > now:
                soonest = min(soonest, due)
                continue
            due = self._weigh(key, now, cost)
            with self._lock:
                if not any(k == key for k in self._exits):  # gone meanwhile: forget, not weigh again
                    self._next[key] = due
            soonest = min(soonest, due)
        return soonest

    def _weigh(self, key: ProcessKey, now: float, cost: TrapCost) -> float:
        """Read a process's cost since its last reading and set its duty;
        returns when to weigh it next."""
        counts, exact = self._counts(key)
        if not counts:
            return now + IDLE_DECIDE_S  # no launch yet: nothing to sample
        cpu = self._cpu.cpu_ns(key)
        if cpu is None:
            return now + IDLE_DECIDE_S  # gone: its exit is on its way
        est, _ = self.estimate(key, counts, exact)
        launches = float(sum(est.values()))
        # Before its first reading: nothing (exact for a process that started
        # after the agent; one that ran before is weighed again soon).
        with self._lock:
            prev = self._readings.get(key) or _Reading(0, 0.0, 0)
            dcpu = (cpu - prev.cpu_ns) / 1e9
            if dcpu < MIN_CPU_S:
                return now + FIRST_DECIDE_S
            self._readings[key] = _Reading(cpu, launches, exact)
        self._set_duty(key, now, cost, dcpu, launches - prev.launches, exact - prev.exact)
        return now + DECIDE_S

    def _set_duty(self, key: ProcessKey, now: float, cost: TrapCost, dcpu: float, launches: float, exact: int) -> None:
        """What share of the time its launch probes may stay attached, from
        what its exact traps and all its launches cost over `dcpu` seconds."""
        exact_share = exact * cost.per_trap() / dcpu
        launch_share = launches * cost.entry_seconds / dcpu
        if launch_share <= 0:
            return
        duty = min(max((self.budget * SAFETY - exact_share) / launch_share, MIN_DUTY), 1.0)
        with self._lock:
            s = self._sampled.get(key)
            if s is not None:
                s.retune(duty, self._on_s(duty))
                return
        if duty < 1.0 and key not in self._cannot:
            self._begin(key, duty, now)

    def _begin(self, key: ProcessKey, duty: float, now: float) -> None:
        """Sample a process's launches from now: its libraries to per-process
        mode, then the first window opens with its own links attached."""
        links = self.cuda.launch_links
        assert links is not None
        for cand in mapped_libraries(key.pid):
            self.cuda.launches_per_process(cand.fid)
        if not links.has_own(key.pid) and not links.adopt(key.pid):
            self._cannot.add(key)
            log.info("pid %d is over its overhead budget, but its launch probes cannot be sampled", key.pid)
            return
        links.set_on(key.pid, True)
        counts, traps = self._counts(key)
        t = time.monotonic()
        s = _Sampled(key.pid, duty, dict(counts), phase_start=t, since=t, phase_counts=dict(counts), phase_traps=traps)
        s.phase_sample = links.sample(key.pid)
        s.next_toggle = t + self._on_s(duty)
        with self._lock:
            self._sampled[key] = s
        log.info("pid %d: launch probes sampled (duty %.3f) to keep its overhead budget", key.pid, duty)

    def _on_s(self, duty: float) -> float:
        return max(MIN_ON_S, duty * self.period_s)

    def _toggle(self, now: float) -> None:
        links = self.cuda.launch_links
        assert links is not None
        with self._lock:
            due = [(k, s) for k, s in self._sampled.items() if s.ended is None and now >= s.next_toggle]
        for key, s in due:
            if s.on and s.duty >= 1.0:
                with self._lock:
                    s.next_toggle = now + self.period_s
                continue
            if s.on:
                self._close_window(key, s, links)
            else:
                self._open_window(key, s, links)

    def _close_window(self, key: ProcessKey, s: _Sampled, links: LaunchLinks) -> None:
        """End a window (its counts read before the detach), or stretch it
        while it has too few complete intervals."""
        counts, traps = self._counts(key)
        launches, intervals = links.sample(key.pid)
        t = time.monotonic()
        stretch = (t - s.phase_start) / self._on_s(s.duty)
        if intervals - s.phase_sample[1] < WINDOW_INTERVALS and stretch < MAX_STRETCH:
            with self._lock:
                s.next_toggle = t + self._on_s(s.duty) * 0.25
            return
        links.set_on(s.pid, False)  # the window first: no interval is closed across the detach
        with self._lock:
            w = _Window(
                {a: n - s.phase_counts.get(a, 0) for a, n in counts.items()},
                launches - s.phase_sample[0],
                intervals - s.phase_sample[1],
                t - s.phase_start,
            )
            s.close_window(w)
            s.on, s.phase_start, s.phase_counts, s.phase_traps = False, t, counts, traps
            s.next_toggle = s.next_window_at(t, w.seconds)  # the duty holds for a stretched window too
        log.debug(
            "pid %d: window %.1f ms, %d launches, %d intervals of %d",
            s.pid,
            w.seconds * 1e3,
            sum(w.launches.values()),
            w.intervals,
            w.interval_launches,
        )

    def _open_window(self, key: ProcessKey, s: _Sampled, links: LaunchLinks) -> None:
        """End a gap once the process's own links are attached again."""
        links.set_on(s.pid, True)
        counts, traps = self._counts(key)
        sample = links.sample(key.pid)
        t = time.monotonic()
        with self._lock:
            s.gaps.append(s.current_gap(traps, t))
            s.on, s.phase_start, s.phase_counts, s.phase_traps = True, t, counts, traps
            s.phase_sample = sample
            s.next_toggle = t + self._on_s(s.duty)
