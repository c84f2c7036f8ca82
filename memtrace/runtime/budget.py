"""Keeping each process's overhead under its budget, from its first launch.

Every trap memtrace's probes take is paid by the traced process. The
copies, memory calls and waits are what exact accounting needs, so their
probes always stay. Launches are the hottest calls and are only counted,
so a process whose traps would cost more than its budget (a share of its
own CPU time, default 1%) has its launch probes attached for only part of
the time, a duty cycle, and its launch counts extrapolated and marked
estimated. The budget holds over any second of the process's life, its
first included, and over the whole of it.

Weighing. A process is watched from the moment the agent meets it
(stopped at a CUDA library's mapping, or at its first traced call): the
kernel's counts of its launches and exact traps are read every WATCH_S
until it launches, then with its CPU time (its CPU clock: every thread,
to the ns) every WATCH_S for its first HORIZON_S of launching and every
QUICK_S after. Over the readings of the last HORIZON_S of its life (since
it was met for a new one, the time before its first launch included: the
budget is over any second, and a burst of launches after a second of
set-up costs its traps over that second, not over the burst alone; once
MIN_WEIGH_CPU_S of CPU time) its traps cost, at the calibrated costs
(runtime/overhead.py),

    launch share = launches x entry cost / CPU time
    exact share  = exact calls x pair cost / CPU time

and once they exceed the budget x SAFETY it is sampled, at

    duty = (budget x SAFETY - exact share) / launch share

(at least MIN_DUTY), weighed again every DECIDE_S (a lower duty scales
the probed time so far by the new over the old: the windows before are
paid at what their traps cost, see `_Sampled.retune`). Until the calibration
is ready the costs are PROVISIONAL (the dearest kind seen), so the first
weighing never waits for it. A launch loop runs fully probed for the time
to see its first launches, two readings and the switch: tens of ms, not
the second or more of the model's notices and a first window.

The duty cycle. A process sampled puts the libraries it launches through
in per-process mode (sensors/cuda/launches.py) with its own links
detached: it starts in a gap, and the fully probed time before counts as
its first window. A window (its own links attached) counts launches for
duty x its period from its first reading, at least MIN_ON_S: the period
is YOUNG_PERIOD_S for the first YOUNG_S of its probed time (a job of a
second is seen by several windows spread over it, so its gaps are seen
from both sides and bounded) and HORIZON_S after. The time from its
attach to that reading (up to a tick, for an up-to-date CPU time) is
probed too, and charged. A window of a loop that makes exact calls stays
open, up to MAX_ON_S, until it holds MIN_INTERVALS complete intervals:
one that holds fewer has no launches per call of its own, and launches
per call counted whole over a call or two are off by a call's worth. The
next opens once both hold: one window a period (w / duty apart where the
last window's probed time w, lead and stretch included, is longer than
duty x the period), so no second holds more than (1 + period) x the
duty's share of probed time, under the budget with SAFETY (but for a
window stretched longer than the one before it); and the windows so far
with the next take at most the duty's share of the time since its probed
time began, so a short job's fully probed start is paid from the rest of
it (a debt no more than one period at a time: after a set-up's long
windows the loop is never left unwatched).

Estimates. Launches are counted in windows, and before sampling began.
A gap's are extrapolated from the NEAR windows on each side of it (those
before it, while it is the last), each window a span between two readings
(the kernel's counts, exact traps and CPU time at its edges, and BPF's
complete intervals: the launches between two consecutive exact calls made
inside the window), by one of two clocks that run on unprobed:
- per exact call, where those windows hold MIN_INTERVALS complete
  intervals (the calls are never sampled): launches per complete interval,
  times the calls in the gap. Nothing the probes cost enters it, and a
  window's edges never cut an interval it counts; a window short against
  a loop's steps sees their short intervals more often than their long
  ones, which a step's lumps of launches would bias (not in the bound).
- per exact call counted whole, where they hold fewer complete intervals
  but MIN_CALLS calls or more: the windows' launches per call (a window's
  edges cut an interval each, a call's worth at most). Its spread is the
  pooled ratio's, over every window, those that saw no call included: a
  window shorter than the calls' period holds one call or none.
- per CPU second otherwise (a loop whose calls are rare or absent, a job
  too short for a second window): the launches per CPU second the windows
  spent outside their traps (their CPU time less their launches and calls
  at the calibrated costs), times the gap's CPU time less its own traps
  (the launches the kernel counted while links came and went). It leans on
  the trap cost, which in a traced process is not the agent's timing of
  it: 0.5-2x (docs/design/overhead.md). A cost off by CAL_ERROR of itself
  moves the estimate by CAL_ERROR x the launch traps' share of the
  windows' unprobed CPU: a few % where a trap is emulated (as CUDA's
  entries are), tens of % where it is single-stepped on a VM.
Where both clocks give a bound, the gap goes by the tighter, in launches.
A per-call guess with no spread of its own goes by the per-CPU one where
it lies outside that one's bound.
A side whose nearest window ran apart from its farther ones (`_apart`)
goes by its nearest: the loop changed on that side, the farther windows
saw another loop than the gap's.
Where the windows on a gap's two sides ran at different rates (a loop whose
rate or shape changed in the gap: launches per unprobed CPU second, or
exact calls per CPU second, further apart than their bounds allow and by
APART or more, or a split bounded tighter than the pooled guess where they
are not), the gap is split
between them by its two clocks: its unprobed CPU time T and its exact
calls C are known, and each side's loop makes its own exact calls per CPU
second k (from the gaps between that side's windows, where no launch trap
is taken; else its windows); the share f of T that ran at the left's rate solves
f k_L T + (1 - f) k_R T = C, and the gap's launches are f T x the left's
launches per CPU second plus (1 - f) T x the right's (a per-call side's
being its launches per call times its k). Pooled over both sides, a gap
across a change is priced at one side's rate: launches per call of the
faster loop times calls that were mostly the slower one's. A side's rate
must lie within twice the range of its windows' own (else no split: a side
across a change itself). A gap still open, with windows before it only,
goes by the nearest window where that one ran apart from those before it.
A gap not split whose own exact calls per CPU second (C / T) are further
from its windows' than a call either side allows, and by APART, has no
bound: the loop changed inside it and no window saw what it changed to.
Further than a call either side allows by less than APART, its bound takes
in the ratio of the two (at its furthest, a call either side): a loop whose
launches per call held ran that much faster or slower per CPU second. The
windows' calls per CPU second are from the time between them, the gap's own
left out. A window that saw nothing run (no launch, no call, no CPU: it fell
in a bursty loop's idle) is no window to go by: a gap's NEAR windows on each
side are those that ran.
Each process's estimate carries a relative error bound: per gap, the
half-width of a 95% interval of its windows' mean rate (Student's t times
their standard error: two windows warrant a wide one), with a gap's edges
for a per-call clock, and per CPU second the calibration's part. A per-call
guess whose windows give no spread (every complete interval in one window)
is bounded by the per-CPU guess where that one is: the truth lies within
the per-CPU bound, so within that and the distance between the two.
A split gap's bound is its sides' own, and the spread of its launches
with each side's k and its C a call off (the edges) and the trap cost off
by CAL_ERROR; a side whose rate has no bound leaves it without one.
A gap with fewer than two windows to go by (a job shorter than its
second window) has no bound, and the estimate says so (error None),
never guessed. A gap is settled (its estimate fixed, the windows before
it let go) once NEAR windows followed it and the trap cost is the
calibrated one.

A process whose exact probes alone cost more than the budget keeps them
(bytes stay exact) at the smallest duty and is reported by the finding
overhead_budget_exceeded, never silently blinded.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import PROVISIONAL, TrapCost
from memtrace.core.threads import thread
from memtrace.sensors.cuda import CudaSensor, mapped_libraries
from memtrace.sources.procfs import is_running, start_ticks_of

log = logging.getLogger("memtrace")

HORIZON_S = 1.0  # the budget holds over any window this long
# A sampled process's first YOUNG_S of probed time: a window every YOUNG_PERIOD_S (duty x it
# long), so that a job of a second is seen by several windows spread over it, not one at its
# start (a gap seen from one side, unbounded); after it, one a HORIZON_S.
YOUNG_S = 2.0
YOUNG_PERIOD_S = 0.25
MIN_ON_S = 0.005  # the shortest window (counts are exact at any length; each is an attach in the agent's time)
# A window of a loop that makes exact calls is held open (read every STRETCH_S) until it
# holds MIN_INTERVALS complete intervals, up to MAX_ON_S (see the module's doc).
MAX_ON_S = 0.025
STRETCH_S = 0.001
MIN_DUTY = 0.005  # MIN_ON_S a HORIZON_S
SAFETY = 0.7  # aim this far under the budget: the calibration's error, the windows' edges
WATCH_S = 0.005  # a process met and not launching yet, or launching for its first HORIZON_S: read this often
WATCH_FOR_S = 2.0  # ... for this long after it was met; then every SLOW_WATCH_S, and after
SLOW_WATCH_FOR_S = 30.0  # this long every IDLE_DECIDE_S
SLOW_WATCH_S = 0.05
QUICK_S = 0.025  # a launching process not sampled: read this often (at most READS_PER_S in all)
READS_PER_S = 400.0
DECIDE_S = 0.5  # a sampled process's duty is weighed again this often
IDLE_DECIDE_S = 1.0
MIN_WEIGH_CPU_S = 0.005  # CPU time readings must span to weigh a process
NEAR = 2  # a gap is extrapolated from up to this many windows on each side of it
KEEP = 4 * NEAR  # windows kept for the gaps not settled yet
# Complete intervals those windows need for an extrapolation per call (else per CPU second,
# which leans on the trap cost: tens of % off where entries are single-stepped).
MIN_INTERVALS = 2
# Else exact calls those windows need for launches per call counted whole (their edges
# cut an interval each: within a call of the truth per window), before per CPU second.
MIN_CALLS = 4
MIN_RATE_CPU_S = 0.001  # a window's CPU time for a rate of its own (the error's spread)
FRESH_WAIT_S = 0.0045  # a tick at 250 Hz and more: how long a window's edge waits for an up-to-date CPU time
FRESH_POLL_S = 0.0002
# How far a trap's cost in a traced process can be from the agent's timing
# of it, as a share of the cost (measured: docs/design/overhead.md).
CAL_ERROR = 1.0

PER_CALL = "per_call"
PER_CPU = "per_cpu"
COUNTED = "counted"
SPLIT = "split"
# Two sides of a gap whose rates differ by this share or more (and more than their bounds)
# are taken for two rates, the gap split between them, where neither bounds it.
APART = 0.25


@dataclass(frozen=True)
class LaunchEstimate:
    """The launches to report for a process, by api, and how far to trust them.

    `duty`: the share of time its launch probes were attached (None: never
    sampled, every launch counted). `error`: a relative bound on the total
    (0.0: counted; None: it cannot be bounded, a gap seen by one window
    only). `basis`: how the gaps were extrapolated ("counted", "per_call",
    "per_cpu", "split", or more joined by "+")."""

    launches: dict[int, int]
    duty: float | None = None
    error: float | None = 0.0
    basis: str = COUNTED


def _cpu_clock(pid: int) -> int:
    """clock_getcpuclockid(pid): the process's CPU clock, every thread's time."""
    return ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


class ProcessClock:
    """Processes' CPU time in ns, one system call a reading (/proc's is in
    ticks of 10 ms). The kernel brings a running thread's time up to date
    at its CPU's scheduler tick (or a switch), not when another process
    reads it: a reading may be a tick (4 ms at 250 Hz) behind, which a
    window of 20 ms cannot take. `fresh` waits (up to FRESH_WAIT_S) for the
    value to move, when it is that of now, for a window's edges. A key is
    checked against the process's start once; a pid reused after its exit
    and before `forget` would be misread, for that moment."""

    def __init__(self) -> None:
        self._checked: set[ProcessKey] = set()

    def cpu_ns(self, key: ProcessKey, fresh: bool = False) -> int | None:
        if key not in self._checked:
            if not is_running(key):
                return None
            self._checked.add(key)
        clock = _cpu_clock(key.pid)
        try:
            v = time.clock_gettime_ns(clock)
            if fresh and _running(key.pid):
                deadline = time.monotonic() + FRESH_WAIT_S
                while time.monotonic() < deadline:
                    time.sleep(FRESH_POLL_S)
                    now = time.clock_gettime_ns(clock)
                    if now != v:
                        return now
            return v  # not running: up to date
        except OSError:
            return None

    def forget(self, key: ProcessKey) -> None:
        self._checked.discard(key)


def _running(pid: int) -> bool:
    """Its main thread is on a CPU or waiting for one (state R)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"R"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class _Reading:
    """One process at one moment: the kernel's launch counts (by api) and
    exact traps, its CPU time, and BPF's complete intervals so far
    (launches in them, and how many: struct mt_launch_sample)."""

    t: float  # monotonic
    cpu_ns: int
    counts: Mapping[int, int]
    traps: int
    sample: tuple[int, int] = (0, 0)

    @property
    def launches(self) -> int:
        return sum(self.counts.values())

    def raw(self) -> str:
        """The reading as a Python literal (the debug log's: a run's windows replayed offline)."""
        return repr((self.t, self.cpu_ns, dict(self.counts), self.traps, tuple(self.sample)))


def _launch_trap_s(cost: TrapCost, returns: bool) -> float:
    """What a probed launch's traps cost: its entry, and its return where a timeline
    records its slice (priced as an exact call's return)."""
    return cost.entry_seconds + (cost.per_trap() if returns else 0.0)


@dataclass(frozen=True)
class _Span:
    """The time between two readings: a window (launch probes attached
    all along: every launch counted) or a gap."""

    start: _Reading
    end: _Reading
    returns: bool = False  # each launch took a return trap too (a timeline's: CudaSensor.launches_timed)

    @property
    def launches(self) -> dict[int, int]:
        return {a: n - self.start.counts.get(a, 0) for a, n in self.end.counts.items()}

    @property
    def total(self) -> int:
        return self.end.launches - self.start.launches

    @property
    def calls(self) -> float:
        return max(self.end.traps - self.start.traps, 0) / 2

    @property
    def cpu_s(self) -> float:
        return max(self.end.cpu_ns - self.start.cpu_ns, 0) / 1e9

    @property
    def seconds(self) -> float:
        return self.end.t - self.start.t

    @property
    def intervals(self) -> int:
        return max(self.end.sample[1] - self.start.sample[1], 0)

    @property
    def interval_launches(self) -> int:
        return max(self.end.sample[0] - self.start.sample[0], 0)

    def traps_s(self, cost: TrapCost, scale: float = 1.0) -> float:
        """Its traps at `scale` x `cost`: launches' (with their returns where a timeline
        had them), and exact calls' pairs."""
        return scale * (self.total * _launch_trap_s(cost, self.returns) + self.calls * cost.pair_seconds)

    def unprobed_s(self, cost: TrapCost) -> float:
        """Its CPU time less its traps at `cost`."""
        return self.cpu_s - self.traps_s(cost)


@dataclass(frozen=True)
class _Guess:
    """A gap's launches, by api, the relative error bound (None: none), the clock."""

    launches: dict[int, float]
    error: float | None
    basis: str

    @property
    def total(self) -> float:
        return sum(self.launches.values())


# Student's t at 97.5% by degrees of freedom (1..9; 2.0 from 10 up, about the normal's 1.96):
# a bound from a handful of windows' rates is as wide as that handful warrants.
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26)


def _spread(rates: list[float], mean: float) -> float | None:
    """The half-width of a 95% interval of the windows' mean rate (Student's
    t times its standard error), relative to `mean` (None: fewer than two
    rates, nothing to say how far a gap's may be)."""
    if len(rates) < 2 or mean <= 0:
        return None
    m = sum(rates) / len(rates)
    sd = math.sqrt(sum((r - m) ** 2 for r in rates) / (len(rates) - 1))
    t = _T975[len(rates) - 2] if len(rates) - 2 < len(_T975) else 2.0
    return t * sd / math.sqrt(len(rates)) / mean


def _ratio_spread(pairs: list[tuple[float, float]], rate: float) -> float | None:
    """The same for a ratio pooled over windows (sum of launches over sum of
    calls): the windows' residuals from it, every window's (one that saw no
    call included: a window shorter than the calls' period holds one call or
    none, and its launches say as much as its calls), relative to `rate`."""
    if len(pairs) < 2 or rate <= 0:
        return None
    den = sum(d for _, d in pairs)
    if den <= 0:
        return None
    sd = math.sqrt(sum((n - rate * d) ** 2 for n, d in pairs) / (len(pairs) - 1))
    t = _T975[len(pairs) - 2] if len(pairs) - 2 < len(_T975) else 2.0
    return t * sd * math.sqrt(len(pairs)) / den / rate


def _with_edges(err: float | None, calls: float) -> float | None:
    """A per-call estimate's bound, with its edges: a gap begins and ends
    between two exact calls, so its launches may be off by about one
    interval's worth however even the loop (1/calls of the gap's)."""
    if err is None or calls <= 0:
        return err
    return err + 1.0 / calls


def _ran(w: _Span) -> bool:
    """Whether a window saw the process run: a launch, an exact call, or CPU
    time enough for a rate. One that fell wholly in an idle (a bursty loop's
    sleep) saw neither the loop nor its rate."""
    return w.total > 0 or w.calls > 0 or w.cpu_s >= MIN_RATE_CPU_S


def extrapolate(gap: _Span, near: list[_Span], cost: TrapCost, before: int | None = None) -> _Guess:
    """A gap's launches from the windows around it (`before` of them before
    it: None, all). Pooled over them (`_pooled`), or, where the windows on
    its two sides ran at different rates (`_apart`), the gap split between
    the two (`_split`); where they did not, the split only if its bound is
    the tighter. A gap with windows before it only (still open) whose
    nearest window ran at another rate than those before goes by that one:
    the loop changed (its bound then none). A window that saw nothing run
    is no window to go by: taken for a side's nearest, its rate of nothing
    set that side apart and its loop unseen, and the gap went by the other
    side's windows alone, under their bound (a gap across the bursty loop's
    change priced at its first half's rate: 33% low under a bound of 22%,
    recorded): `_Sampled._near` takes NEAR windows that ran on each side,
    where kept, and those that did not are left out here. A side left
    without a window is no side: the gap is priced from the other, as one
    still open is."""
    if not all(_ran(w) for w in near):
        ran = [_ran(w) for w in near]
        if before is not None:
            before = sum(ran[:before])
        near = [w for w, r in zip(near, ran, strict=True) if r]
    if before == len(near) and len(near) > 1 and gap.unprobed_s(cost) >= MIN_RATE_CPU_S:
        # Windows on one side only (the gap still open): where the nearest ran at
        # another rate than those before it, the loop changed; it goes by the nearest.
        if _apart(gap, near[:-1], near[-1:], cost):
            return _unless_changed(gap, near[-1:], _pooled(gap, near[-1:], cost), cost)
    guess = _extrapolate(gap, near, cost, before)
    return guess if guess.basis == SPLIT else _unless_changed(gap, near, guess, cost)


def _unless_changed(gap: _Span, near: list[_Span], guess: _Guess, cost: TrapCost) -> _Guess:
    """`guess`, unbounded where the gap's own exact calls per CPU second are
    further from its windows' than a call either side allows, and by APART:
    the loop changed inside it, and no window saw what it changed to (a
    window that fell past the change would have split it). Further than a
    call either side allows but by less than APART, the loop changed too,
    and its windows' bound says nothing of by how much: a loop whose
    launches per call held launches as much faster per CPU second as it
    makes calls (the bursty loop's second half, twice as fast, all of it in
    a gap still open priced at its first half's rate: 25% low under a bound
    of 5%; a call per CPU second or whole launches per call, its readings
    cannot tell which held). The bound then takes in the ratio of the two
    rates of calls, at its furthest a call either side. The windows' rate
    of calls is from the time between them, the gap's own left out (within
    them, it pulled theirs towards its own)."""
    t = gap.unprobed_s(cost)
    if guess.error is None or t < MIN_RATE_CPU_S or not near:
        return guess
    k, edge = _call_rate(near, cost, without=gap)
    if not math.isfinite(k + edge):
        return guess
    own = gap.calls / t
    edges = 1.0 / t + edge
    if abs(own - k) <= edges:
        return guess
    if abs(own - k) > edges + APART * max(own, k) or k <= edge:
        return _Guess(guess.launches, None, guess.basis)
    hi = (own + 1.0 / t) / (k - edge)  # the gap's rate over the windows', at its furthest
    lo = max(own - 1.0 / t, 0.0) / (k + edge)
    e = guess.error
    return _Guess(guess.launches, max((1.0 + e) * hi - 1.0, 1.0 - (1.0 - e) * lo), guess.basis)


def _extrapolate(gap: _Span, near: list[_Span], cost: TrapCost, before: int | None) -> _Guess:
    if before is not None and 0 < before < len(near) and gap.unprobed_s(cost) >= MIN_RATE_CPU_S:
        # A side whose nearest window ran apart from its farther ones goes by its nearest:
        # the loop changed on that side, and the farther windows saw another loop than the
        # gap's (a gap after a change, pooled with windows before it: 13-27% off, seen).
        left, right = near[:before], near[before:]
        if len(left) > 1 and _apart(gap, left[:-1], left[-1:], cost):
            left = left[-1:]
        if len(right) > 1 and _apart(gap, right[:1], right[1:], cost):
            right = right[:1]
        near, before = left + right, len(left)
    pooled = _pooled(gap, near, cost)
    if before is None or not 0 < before < len(near) or gap.unprobed_s(cost) < MIN_RATE_CPU_S:
        return pooled
    split = _split(gap, near[:before], near[before:], cost)
    if split is None:
        return pooled
    if _apart(gap, near[:before], near[before:], cost):
        return split
    tighter = split.error is not None and (pooled.error is None or split.error < pooled.error)
    return split if tighter else pooled


def _apart(gap: _Span, left: list[_Span], right: list[_Span], cost: TrapCost) -> bool:
    """Whether the two sides' loops ran at rates (launches per unprobed CPU
    second) further apart than their own bounds allow (a side without one
    taken at its word), and by APART of the faster or more. A side's
    per-call rate is turned into one per CPU second at its exact calls per
    CPU second, known to a call either side: that is part of its bound (a
    window of three copies in 24 ms read 123 a second for a steady loop's
    83, and set a steady loop's sides 56% apart, recorded)."""
    rates, ks = [], []
    for side in (left, right):
        g = _pooled(gap, side, cost)
        k, edge = _call_rate(side, cost)
        t = gap.unprobed_s(cost)
        if g.basis == PER_CALL and gap.calls > 0:
            r = g.total / gap.calls * k
            e = (g.error or 0.0) + (edge / k if k > 0 else math.inf)
        else:
            r, e = g.total / t, g.error or 0.0
        rates.append((r, e))
        ks.append((k, edge))
    (rl, el), (rr, er) = rates
    if abs(rl - rr) > el * rl + er * rr + APART * max(rl, rr):
        return True
    # Or their shapes: exact calls per CPU second further apart than a call either side
    # allows (a loop of 2,000 launches a copy, then 300: their launches per CPU second
    # may be close, their copies never are).
    (kl, dl), (kr, dr) = ks
    return math.isfinite(kl + kr + dl + dr) and abs(kl - kr) > dl + dr + APART * max(kl, kr)


def _call_rate(
    side: list[_Span], cost: TrapCost, scale: float = 1.0, without: _Span | None = None
) -> tuple[float, float]:
    """Exact calls per unprobed CPU second of the loop on one side of a gap,
    and how far off that may be: the gaps between the side's windows (no
    launch trap in them; `without`, a gap among them, left out), else its
    windows (launch traps taken out at `scale` x the cost). Each span the
    calls are counted over begins and ends between two calls: its count is
    a call either side of its rate's, so the rate is off by up to as many
    calls as there are spans over their CPU time (two windows of 9 and
    21 ms holding one copy of a loop's 2.3 read 34 a second for its 78,
    one call either side allowing 0 to 68, and took a steady loop's gap for
    a change, recorded). Not finite where no CPU time is left to go by."""
    whole = _Span(side[0].start, side[-1].end)
    calls = whole.calls - sum(w.calls for w in side)
    cpu = whole.cpu_s - sum(w.cpu_s for w in side)
    spans = len(side) - 1
    if without is not None and whole.start.t <= without.start.t and without.end.t <= whole.end.t:
        calls, cpu, spans = calls - without.calls, cpu - without.cpu_s, spans - 1
    cpu -= calls * cost.pair_seconds
    if spans > 0 and cpu >= MIN_RATE_CPU_S:
        return calls / cpu, spans / cpu
    calls = sum(w.calls for w in side)
    cpu = sum(w.cpu_s - w.traps_s(cost, scale) for w in side)
    return (calls / cpu, len(side) / cpu) if cpu > 0 else (math.inf, math.inf)


def _split(gap: _Span, left: list[_Span], right: list[_Span], cost: TrapCost) -> _Guess | None:
    """A gap between windows at two rates (a loop whose rate changed in it):
    its unprobed CPU time T and exact calls C are known, and each side's
    loop has its own exact calls per CPU second k; so the share f of T
    that ran at the left's rate solves f k_L T + (1 - f) k_R T = C, and the
    gap's launches are f x the left side's guess for the whole gap plus
    (1 - f) x the right's (a per-call guess first turned into launches per
    CPU second, its launches per call times k). The bound: each side's
    own, and the spread of the launches over k and C each one call off
    (the edges) and the trap cost off by CAL_ERROR; none where a side has
    none. No split (None) where the sides' calls per CPU second cannot
    tell them apart."""
    t = gap.unprobed_s(cost)
    sides = [_pooled(gap, side, cost) for side in (left, right)]
    if any(g.total <= 0 for g in sides):
        return None
    unbounded = any(g.error is None for g in sides)

    def rates(kl: float, kr: float) -> list[float]:
        """Each side's launches per unprobed CPU second."""
        return [
            g.total / gap.calls * k if g.basis == PER_CALL and gap.calls > 0 else g.total / t
            for g, k in zip(sides, (kl, kr), strict=True)
        ]

    def launches(kl: float, kr: float, calls: float) -> tuple[float, float]:
        """f, and the gap's launches, for these calls per CPU second and gap calls."""
        if not math.isfinite(kl) or not math.isfinite(kr) or abs(kr - kl) * t < 1.0:
            return math.nan, math.nan
        f = min(max((kr * t - calls) / ((kr - kl) * t), 0.0), 1.0)
        r = rates(kl, kr)
        return f, (f * r[0] + (1 - f) * r[1]) * t

    kl, kr = _call_rate(left, cost)[0], _call_rate(right, cost)[0]
    f, n = launches(kl, kr, gap.calls)
    if not math.isfinite(n) or n <= 0:
        return None
    # Each side's rate within twice the range of its windows' own rates per CPU second: a
    # side whose launches per call and calls per CPU second came from two loops (a side
    # across a change itself) turns into a rate no window ran at (a 2.5x estimate, seen).
    seen = [w.total / w.unprobed_s(cost) for w in left + right if w.unprobed_s(cost) >= MIN_RATE_CPU_S]
    if not seen or any(not min(seen) / 2 <= x <= max(seen) * 2 for x in rates(kl, kr)):
        return None
    worst = 0.0
    for scale in (1.0 - CAL_ERROR, 1.0, 1.0 + CAL_ERROR):
        (kl2, el2), (kr2, er2) = _call_rate(left, cost, scale), _call_rate(right, cost, scale)
        for dl in (-1.0, 1.0):
            for dr in (-1.0, 1.0):
                for dc in (-1.0, 1.0):
                    kl3 = max(kl2 + dl * el2, 0.0) if math.isfinite(el2) else math.inf
                    kr3 = max(kr2 + dr * er2, 0.0) if math.isfinite(er2) else math.inf
                    _, m = launches(kl3, kr3, max(gap.calls + dc, 0.0))
                    if not math.isfinite(m):
                        return None
                    worst = max(worst, abs(m - n))
    r = rates(kl, kr)
    own = 0.0 if unbounded else (f * (sides[0].error or 0.0) * r[0] + (1 - f) * (sides[1].error or 0.0) * r[1]) * t
    by_api: dict[int, float] = {}
    for g, share in zip(sides, (f, 1 - f), strict=True):
        for a, c in g.launches.items():
            by_api[a] = by_api.get(a, 0.0) + share * c / g.total * n
    return _Guess(by_api, None if unbounded else (worst + own) / n, SPLIT)


def _pooled(gap: _Span, near: list[_Span], cost: TrapCost) -> _Guess:
    """A gap's launches from the windows around it (see the module's doc).
    A per-call guess whose windows give no spread (its intervals all in one
    window) is bounded by the per-CPU guess where that one is: the truth is
    within the per-CPU bound of it, so within that bound and the distance
    between the two of the per-call one; where it lies outside the per-CPU
    bound, the per-CPU guess stands. Both bounded: the tighter, in launches."""
    launched = sum(w.total for w in near)
    by_api: dict[int, int] = {}
    for w in near:
        for a, c in w.launches.items():
            by_api[a] = by_api.get(a, 0) + c
    shares = {a: c / launched for a, c in by_api.items() if c} if launched > 0 else {}
    guess = _per_call(gap, near, launched, shares)
    cpu = _per_cpu(gap, near, launched, shares, cost)
    if guess is None:
        return cpu
    n, m = guess.total, cpu.total
    if n <= 0 and gap.calls <= 0:
        # No call in it: per call, nothing, bounded by nothing; but a gap between two calls
        # holds up to an interval's launches (a loop's last ones after its last copy, seen),
        # and per CPU second says how many.
        return cpu
    if cpu.error is None or n <= 0:
        return guess
    if gap.unprobed_s(cost) < MIN_RATE_CPU_S:
        # Its CPU time too short to measure (a process gone before its last reading): per
        # CPU second says nothing ran, its calls say otherwise; they stand.
        if guess.error is not None:
            return guess
        return _Guess(guess.launches, (abs(n - m) + cpu.error * m) / n, guess.basis)
    if guess.error is None:
        # No spread of its own: within the per-CPU bound of the truth, it stands, bounded
        # by that and the distance; outside it (launches per call of one window of several,
        # another loop's), the per-CPU guess does.
        if abs(n - m) > cpu.error * m:
            return cpu
        return _Guess(guess.launches, (abs(n - m) + cpu.error * m) / n, guess.basis)
    # Both bounded: the tighter, in launches (per call counted whole from windows shorter
    # than the calls' period is loose; per CPU second where a trap is dear is too).
    return cpu if cpu.error * m < guess.error * n else guess


def _per_call(gap: _Span, near: list[_Span], launched: int, shares: dict[int, float]) -> _Guess | None:
    intervals = sum(w.intervals for w in near)
    if intervals >= MIN_INTERVALS:
        rate = sum(w.interval_launches for w in near) / intervals
        n = rate * gap.calls
        err = _spread([w.interval_launches / w.intervals for w in near if w.intervals], rate) if n > 0 else 0.0
        return _Guess({a: n * s for a, s in shares.items()}, _with_edges(err, gap.calls), PER_CALL)
    calls = sum(w.calls for w in near)
    if calls >= MIN_CALLS and launched > 0:
        rate = launched / calls
        n = rate * gap.calls
        err = _ratio_spread([(w.total, w.calls) for w in near], rate) if n > 0 else 0.0
        return _Guess({a: n * s for a, s in shares.items()}, _with_edges(err, gap.calls), PER_CALL)
    return None


def _per_cpu(gap: _Span, near: list[_Span], launched: int, shares: dict[int, float], cost: TrapCost) -> _Guess:
    gap_s = max(gap.unprobed_s(cost), 0.0)
    unprobed = sum(max(w.unprobed_s(cost), 0.0) for w in near)
    if gap_s < MIN_RATE_CPU_S:  # it hardly ran: whatever it launched is within the others' errors
        rate = launched / unprobed if unprobed > 0 else 0.0
        return _Guess({a: rate * gap_s * s for a, s in shares.items()}, 0.0, PER_CPU)
    if unprobed <= 0:
        return _Guess({}, None, PER_CPU)  # no window ran (or the cost is above what they took)
    rate = launched / unprobed
    n = rate * gap_s
    spread = _spread([w.total / w.unprobed_s(cost) for w in near if w.unprobed_s(cost) >= MIN_RATE_CPU_S], rate)
    calibration = CAL_ERROR * launched * cost.entry_seconds / unprobed
    return _Guess({a: n * s for a, s in shares.items()}, None if spread is None else spread + calibration, PER_CPU)


@dataclass
class _Sampled:
    """A process whose launch probes are duty-cycled, and its estimate.

    Reported launches: those counted before its first gap began (`base`:
    its first window's among them), those counted in the windows since,
    and those extrapolated over the gaps (the current phase's counted if a
    window, extrapolated if a gap). Launches the kernel counts in a gap
    (while a link is being attached or removed) are left out: the gap's
    extrapolation covers that time, their traps taken out of its CPU time."""

    pid: int
    duty: float
    base: dict[int, int]  # counted before its first gap (exact)
    phase: _Reading  # the current window's or gap's start
    since: float  # when its probed time began (its first launches, estimated)
    on_seconds: float  # the windows' time, the fully probed time before its first gap included
    on: bool = False
    next_toggle: float = 0.0
    lead: float = 0.0  # the open window's time from its attach to its first reading
    last_on: float = 0.0  # the last window's probed time, lead and stretch included
    windows: list[_Span] = field(default_factory=list)  # the last KEEP
    closed: int = 0  # windows closed so far
    counted: dict[int, int] = field(default_factory=dict)  # launches in windows since the first gap
    settled: dict[int, float] = field(default_factory=dict)  # extrapolated over settled gaps
    settled_error: float = 0.0  # their error bound, in launches
    unbounded: bool = False  # a settled gap had no bound
    bases: set[str] = field(default_factory=set)  # the clocks that extrapolated its gaps
    gaps: list[tuple[int, _Span]] = field(default_factory=list)  # (windows before it, the gap), not settled
    decided: _Reading | None = None  # its last weighing's reading
    decided_launches: float = 0.0  # the launches reported then
    ended: float | None = None
    end_cpu_ns: int | None = None
    # An open gap's guess, by (the gap, the windows closed up to its last
    # near one, the cost): the gap and its near windows never change once
    # there, so report() (twice a second, per sampled process) guesses a
    # gap again only when a window closes beside it or the cost changes.
    guessed: dict[tuple[int, int, TrapCost], _Guess] = field(default_factory=dict)

    def young(self, t: float) -> bool:
        return t - self.since < YOUNG_S

    def on_s(self, t: float | None = None) -> float:
        """A window's length opening at `t` (default: its current phase's
        start): duty x YOUNG_PERIOD_S while young, duty x HORIZON_S after."""
        young = self.young(self.phase.t if t is None else t)
        return max(MIN_ON_S, self.duty * (YOUNG_PERIOD_S if young else HORIZON_S))

    def next_window_at(self, closed_at: float) -> float:
        """When the window after one that closed at `closed_at` may open (see
        the module's doc): one a period at most (YOUNG_PERIOD_S while young,
        HORIZON_S after, the first old one a HORIZON_S after the last young
        one closed: no second holds more than (1 + YOUNG_PERIOD_S) x the
        duty's share); and no sooner than the windows so far and the next
        take at most the duty's share of the time since its probed time
        began, though a debt puts it off by at most one period more."""
        for young in (True, False):
            window_s = max(MIN_ON_S, self.duty * (YOUNG_PERIOD_S if young else HORIZON_S), self.last_on)
            period = max(YOUNG_PERIOD_S if young else HORIZON_S, window_s / self.duty)
            steady = closed_at + period - window_s
            credit = self.since + (self.on_seconds + window_s) / self.duty
            t = max(steady, min(credit, steady + period))
            if not young or self.young(t):
                break
        return t

    def retune(self, duty: float) -> None:
        """A new duty from a later weighing. An open window it makes too long
        ends at its new length (at once if already past it); a gap's end is
        set again (a set-up weighed at a high duty, then the loop). A lower
        duty (a loop launching more per CPU second) scales the probed time so
        far by the new over the old: what those windows cost in traps, a share
        of the time at the old duty, is that of this much probed time at the
        new one. Unscaled, a bursty loop's windows at duty 0.27 in its first
        phase were a debt that left its second phase, at 0.13, unseen for its
        last 3.5 s (a gap extrapolated from the first phase's loop: 4.8x)."""
        if 0 < duty < self.duty:
            self.on_seconds *= duty / self.duty
            self.last_on *= duty / self.duty
        self.duty = duty
        if self.on:
            if duty < 1.0:
                self.next_toggle = min(self.next_toggle, self.phase.t + self.on_s(self.phase.t))
        else:
            self.next_toggle = self.next_window_at(self.phase.t)

    def _span_of_near(self, after: int, later: bool = True) -> tuple[int, int]:
        """The indices [lo, hi) of the windows around a gap that followed
        `after` windows: NEAR that ran (`_ran`) on each side, those between
        that did not (a window that fell in an idle) with them, as far as
        kept and closed (`later` False: none after it)."""
        first = self.closed - len(self.windows)  # index of self.windows[0]
        lo = hi = min(max(after, first), self.closed)
        ran = 0
        while lo > first and ran < NEAR:
            lo -= 1
            ran += _ran(self.windows[lo - first])
        ran = 0
        while later and hi < self.closed and ran < NEAR:
            ran += _ran(self.windows[hi - first])
            hi += 1
        return lo, hi

    def _near(self, after: int, later: bool = True) -> tuple[list[_Span], int]:
        """The windows around a gap that followed `after` windows (see
        `_span_of_near`), and how many of them came before it."""
        first = self.closed - len(self.windows)
        lo, hi = self._span_of_near(after, later)
        return self.windows[lo - first : hi - first], max(min(after, hi) - lo, 0)

    def _guess(self, gap: _Span, after: int, cost: TrapCost, later: bool = True) -> _Guess:
        """A gap's launches that followed `after` windows (see extrapolate)."""
        near, before = self._near(after, later)
        return extrapolate(gap, near, cost, before)

    def _gap_guess(self, gap: _Span, after: int, cost: TrapCost) -> _Guess:
        """An open gap's guess (see `guessed`), made again only when it can differ."""
        key = (id(gap), self._span_of_near(after)[1], cost)
        g = self.guessed.get(key)
        if g is None:
            g = self.guessed[key] = self._guess(gap, after, cost)
        return g

    def open_window(self, gap_end: _Reading, attached_at: float | None = None) -> None:
        """Its links went in at `attached_at`, the window's reading was taken
        at `gap_end` (up to a tick later: an up-to-date CPU time): that time
        was probed too, so it counts against the duty (and puts the next
        window off), but the window counts launches from its reading on,
        for its whole length: a lead of a few ms must not leave a 5 ms
        window a sliver of the loop."""
        if attached_at is None:
            attached_at = gap_end.t
        self.gaps.append((self.closed, _Span(self.phase, gap_end)))
        self.on, self.phase = True, gap_end
        self.lead = max(gap_end.t - attached_at, 0.0)
        self.on_seconds += self.lead
        self.next_toggle = gap_end.t + self.on_s(gap_end.t)

    def close_window(self, end: _Reading, cost: TrapCost, final: bool) -> _Span:
        w = _Span(self.phase, end)
        self.windows.append(w)
        self.closed += 1
        self.on_seconds += w.seconds
        self.last_on, self.lead = self.lead + w.seconds, 0.0
        for a, c in w.launches.items():
            self.counted[a] = self.counted.get(a, 0) + c
        self.on, self.phase = False, end
        self.next_toggle = self.next_window_at(end.t)
        # A gap with NEAR windows after it is settled, once the cost is the calibrated one.
        while final and self.gaps and self.closed - self.gaps[0][0] >= NEAR:
            after, gap = self.gaps.pop(0)
            g = self._gap_guess(gap, after, cost)
            log.debug(
                "pid %d: gap after window %d settled: %.0f launches (%s, error %s)",
                self.pid,
                after,
                g.total,
                g.basis,
                g.error,
            )
            for a, n in g.launches.items():
                self.settled[a] = self.settled.get(a, 0.0) + n
            self.bases.add(g.basis)
            if g.error is None:
                self.unbounded = True
            else:
                self.settled_error += g.total * g.error
        # The windows of the gaps not settled are kept: from the first near the oldest.
        keep = max(KEEP, self.closed - self._span_of_near(self.gaps[0][0])[0] if self.gaps else 0)
        if len(self.windows) > keep:
            del self.windows[:-keep]
        near_closed = {id(gap): self._span_of_near(after)[1] for after, gap in self.gaps}
        self.guessed = {k: g for k, g in self.guessed.items() if near_closed.get(k[0]) == k[1]}
        return w

    def report(self, now: _Reading, cost: TrapCost) -> LaunchEstimate:
        """What to report given the kernel's counts and the CPU time `now`."""
        totals: dict[int, float] = {}
        for part in (self.base, self.counted, self.settled):
            for a, n in part.items():
                totals[a] = totals.get(a, 0.0) + n
        guesses = [self._gap_guess(g, after, cost) for after, g in self.gaps]
        if self.on:
            for a, n in now.counts.items():
                totals[a] = totals.get(a, 0.0) + n - self.phase.counts.get(a, 0)
        else:
            guesses.append(self._guess(_Span(self.phase, now), self.closed, cost, later=False))
        err_launches, unbounded, bases = self.settled_error, self.unbounded, set(self.bases)
        for g in guesses:
            for a, n in g.launches.items():
                totals[a] = totals.get(a, 0.0) + n
            bases.add(g.basis)
            if g.error is None:
                unbounded = True
            else:
                err_launches += g.total * g.error
        total = sum(totals.values())
        error = None if unbounded else (err_launches / total if total > 0 else 0.0)
        basis = "+".join(sorted(bases)) or COUNTED
        return LaunchEstimate({a: round(n) for a, n in totals.items()}, self.duty, error, basis)


@dataclass
class _Watched:
    """A process met and not sampled (or sampled: `next` is its next weighing)."""

    seen: float  # when met
    next: float = 0.0
    launching: float | None = None  # when its first launches were seen
    first: _Reading | None = None  # the reading then (read again at once, fresh)
    readings: list[_Reading] = field(default_factory=list)  # the last HORIZON_S, before it launched too


class LaunchBudget:
    """Owns the duty cycles. `estimate` is called with the kernel's counts
    by whoever copies them into the model; `met`, `exited` and `forget`
    from the agent's threads; everything that attaches or detaches runs on
    its own thread."""

    def __init__(
        self,
        cuda: CudaSensor,
        budget: float,
        processes: Callable[[], list[ProcessKey]],
        cost: Callable[[], TrapCost | None],
    ) -> None:
        self.cuda = cuda
        self.budget = budget
        self.processes = processes  # the live processes that launched, as the model has them
        self.cost = cost  # None until calibrated
        self._lock = threading.Lock()
        self._sampled: dict[ProcessKey, _Sampled] = {}
        self._watched: dict[ProcessKey, _Watched] = {}
        self._met: set[ProcessKey] = set()
        self._exits: list[ProcessKey] = []
        self._cannot: set[ProcessKey] = set()  # over budget, but its launches cannot be sampled
        self._next_live = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.enforced = cuda.launch_links is not None
        self.failures = 0
        self._clock = ProcessClock()  # the budget thread's, and estimate's: no state but a set

    def _costs(self) -> tuple[TrapCost, bool]:
        """The cost to weigh with, and whether it is the calibrated one."""
        cost = self.cost()
        return (cost, True) if cost is not None else (PROVISIONAL, False)

    def _read(self, key: ProcessKey, fresh: bool = False) -> _Reading | None:
        """The kernel's counts and the process's CPU time now (`fresh`: up
        to date, a window's edge; the counts read right after it)."""
        maps, links = self.cuda.maps, self.cuda.launch_links
        if maps is None or links is None:
            return None
        cpu = self._clock.cpu_ns(key, fresh)
        if cpu is None:
            return None
        t = time.monotonic()
        counts, traps = maps.process_counts(key)
        return _Reading(t, cpu, counts, traps, links.sample(key.pid))

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
        self._apply_exits()

    # ---- what the model is told ----

    def estimate(self, key: ProcessKey, counts: dict[int, int], exact: int) -> LaunchEstimate:
        """The launches to report for a process, by api, given the kernel's
        counts and exact traps now."""
        with self._lock:
            s = self._sampled.get(key)
            if s is None:
                return LaunchEstimate(dict(counts))
            ended, cpu = s.ended, s.end_cpu_ns
        if cpu is None:
            cpu = self._clock.cpu_ns(key) if ended is None else None
        cost, _ = self._costs()
        with self._lock:
            if cpu is None:  # gone, its exit not heard yet: nothing past its last reading
                cpu = s.phase.cpu_ns
            now = _Reading(ended if ended is not None else time.monotonic(), cpu, counts, exact)
            est = s.report(now, cost)
        if ended is not None:
            log.debug(
                "pid %d: %d launches reported (%s, error %s), %d windows, %d gaps open, cost %.2f us",
                key.pid,
                sum(est.launches.values()),
                est.basis,
                est.error,
                s.closed,
                len(s.gaps),
                cost.entry_seconds * 1e6,
            )
        return est

    def met(self, key: ProcessKey) -> None:
        """A process was stopped at a CUDA library, or made its first traced
        call (the control thread, or the drain): watch it from now, whenever
        the model folds it in."""
        if not self.enforced:
            return  # no thread weighs anything: kept, it would grow with every process
        with self._lock:
            if key in self._watched or key in self._sampled:
                return
            self._met.add(key)
        self._wake.set()

    def exited(self, key: ProcessKey, cpu_ns: int | None = None) -> None:
        """The process is gone, having run `cpu_ns` (the kernel's, at its exit)."""
        if not self.enforced:
            return  # nothing sampled to end, and no thread to take the list
        with self._lock:
            s = self._sampled.get(key)
            if s is not None and s.ended is None:
                s.ended = time.monotonic()
                s.end_cpu_ns = cpu_ns if cpu_ns else None
            self._exits.append(key)
        self._wake.set()

    def forget(self, key: ProcessKey) -> None:
        with self._lock:
            self._sampled.pop(key, None)
            self._watched.pop(key, None)
            self._cannot.discard(key)
            self._met.discard(key)
        self._clock.forget(key)

    # ---- the thread ----

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            soonest = now + WATCH_S
            try:
                self._apply_exits()
                soonest = self._look(now)
                self._toggle(time.monotonic())
            except Exception:  # noqa: BLE001 - the budget failing must not stop the agent
                self.failures += 1
                if self.failures == 1:
                    log.exception("overhead budget (launches of processes it samples are estimated from then on)")
            with self._lock:
                due = [s.next_toggle for s in self._sampled.values() if s.ended is None]
            wait = min([soonest, *due]) - time.monotonic()
            self._wake.wait(max(wait, 0.001))
            self._wake.clear()

    def _apply_exits(self) -> None:
        with self._lock:
            exits, self._exits = self._exits, []
            for key in exits:
                self._watched.pop(key, None)
                self._met.discard(key)
        links = self.cuda.launch_links
        for key in exits:
            self._clock.forget(key)
            if links is not None:
                links.exited(key.pid, start_ticks_of(key))

    def _look(self, now: float) -> float:
        """Read and weigh each process that is due; returns when the next one is."""
        with self._lock:
            met, self._met = self._met, set()
        fresh = list(met)
        if now >= self._next_live:  # the model's, for one met before the budget started
            fresh += self.processes()
            self._next_live = now + IDLE_DECIDE_S
        with self._lock:
            for key in fresh:
                if key not in self._watched and key not in self._sampled:
                    self._watched[key] = _Watched(seen=now, next=now)
            due = [(k, w) for k, w in self._watched.items() if w.next <= now]
            later = [w.next for w in self._watched.values() if w.next > now]
            launching = sum(1 for w in self._watched.values() if w.launching is not None)
        cost, final = self._costs()
        quick = max(QUICK_S, launching / READS_PER_S)
        for key, w in due:
            if key in self._sampled:
                w.next = self._retune(key, now, cost)
            else:
                w.next = self._weigh(key, w, now, cost, quick)
            later.append(w.next)
        return min([now + IDLE_DECIDE_S, *later])

    def _watch_every(self, w: _Watched, now: float) -> float:
        age = now - w.seen
        if age < WATCH_FOR_S:
            return WATCH_S
        return SLOW_WATCH_S if age < SLOW_WATCH_FOR_S else IDLE_DECIDE_S

    def _weigh(self, key: ProcessKey, w: _Watched, now: float, cost: TrapCost, quick: float) -> float:
        """Read a process not sampled; sample it once its traps over the last
        HORIZON_S cost more than the budget allows. Returns when to read it next."""
        r = self._read(key)
        if r is None:
            return now + IDLE_DECIDE_S  # gone: its exit is on its way
        if r.launches == 0:
            self._keep(w, r)  # its CPU time before it launched is in the second it is weighed over
            return now + self._watch_every(w, now)
        if w.launching is None:
            w.launching = now
            r = self._read(key, fresh=True) or r  # the first window's start
            w.first = r
        self._keep(w, r)
        # Over the last HORIZON_S of its life, the time before its first launch included
        # (since it was met): a burst of launches after a second of set-up (PyTorch's first
        # kernels after its imports and copies) costs its traps over that second, not over
        # the burst alone, and is sampled only where that second goes over the budget.
        span = _Span(w.readings[0], r)
        young = now - w.launching < HORIZON_S
        if key in self._cannot:
            return now + DECIDE_S
        # Its first window (fully probed, its launches counted) runs from its first launching
        # reading, or the horizon's start where that is later; it too spans MIN_WEIGH_CPU_S.
        first = w.first if w.first is not None and w.first.t >= span.start.t else span.start
        if span.cpu_s >= MIN_WEIGH_CPU_S and (r.cpu_ns - first.cpu_ns) / 1e9 >= MIN_WEIGH_CPU_S:
            returns = self.cuda.launches_timed(key.pid)
            duty = self._duty(cost, span.cpu_s, span.total, span.calls, returns)
            if duty < 1.0:
                self._begin(key, duty, first, cost, returns)
                return now + DECIDE_S
        return now + (WATCH_S if young else quick)

    @staticmethod
    def _keep(w: _Watched, r: _Reading) -> None:
        """A reading of a process not sampled, those of the last HORIZON_S kept: never an
        older one, so that a span from the first is at most HORIZON_S (a process read once a
        second before it launched must not have a launching second weighed over two)."""
        w.readings.append(r)
        while len(w.readings) > 1 and w.readings[0].t < r.t - HORIZON_S:
            w.readings.pop(0)

    def _duty(self, cost: TrapCost, cpu_s: float, launches: float, calls: float, returns: bool = False) -> float:
        """The share of time a process's launch probes may stay attached, from
        what its exact calls and all its launches cost over `cpu_s` seconds
        (`returns`: each launch took a return trap too, a timeline's; sampled,
        it takes none: its launches have no slice)."""
        exact_share = calls * cost.pair_seconds / cpu_s
        launch_share = launches * _launch_trap_s(cost, returns) / cpu_s
        if launch_share <= 0:
            return 1.0
        return min(max((self.budget * SAFETY - exact_share) / launch_share, MIN_DUTY), 1.0)

    def _retune(self, key: ProcessKey, now: float, cost: TrapCost) -> float:
        """Weigh a sampled process again, on the launches reported since its last weighing."""
        with self._lock:
            s = self._sampled.get(key)
            if s is None or s.ended is not None:
                return now + IDLE_DECIDE_S
            prev, prev_launches = s.decided, s.decided_launches
        r = self._read(key)
        if r is None or prev is None:
            return now + IDLE_DECIDE_S
        with self._lock:
            launches = float(sum(s.report(r, cost).launches.values()))
        span = _Span(prev, r)
        if span.cpu_s < MIN_WEIGH_CPU_S:
            return now + DECIDE_S
        if launches > prev_launches:
            duty = self._duty(cost, span.cpu_s, launches - prev_launches, span.calls)
        else:  # an estimate revised down (a gap's clock changed): nothing to weigh, not a loop that stopped
            duty = s.duty
        with self._lock:
            s.decided, s.decided_launches = r, launches
            s.retune(duty)
        return now + DECIDE_S

    def _begin(self, key: ProcessKey, duty: float, first: _Reading, cost: TrapCost, returns: bool = False) -> None:
        """Sample a process's launches from now: its libraries to per-process
        mode with its own links detached (or its links detached, where it had
        them): it starts in a gap, and the time since `first`, fully probed,
        is its first window (`returns`: its launches took a timeline's return
        trap in it, as none do once sampled)."""
        links = self.cuda.launch_links
        assert links is not None
        start = self._read(key, fresh=True)  # every launch before it counted: the first gap begins here
        if start is None:
            return
        links.link_off(key.pid, True)
        for cand in mapped_libraries(key.pid):
            self.cuda.launches_per_process(cand.fid)
        if not links.has_own(key.pid) and not links.adopt(key.pid):
            links.link_off(key.pid, False)
            self._cannot.add(key)
            log.info("pid %d is over its overhead budget, but its launch probes cannot be sampled", key.pid)
            return
        links.set_on(key.pid, False)
        first_window = _Span(first, start, returns)
        # Its probed time began before `first`, with its first launch: as long again as
        # `first`'s launches took at the first window's pace.
        pace = first_window.seconds / first_window.total if first_window.total else 0.0
        probed = first_window.seconds + first.launches * pace
        s = _Sampled(key.pid, duty, dict(start.counts), start, since=start.t - probed, on_seconds=probed)
        s.windows, s.closed = [first_window], 1
        s.decided, s.decided_launches = start, float(start.launches)
        s.next_toggle = s.next_window_at(start.t)
        with self._lock:
            self._sampled[key] = s
        log.info(
            "pid %d: launch probes sampled (duty %.3f) to keep its overhead budget, %.1f ms fully probed"
            " (%d launches, %.2f us of CPU a launch)",
            key.pid,
            duty,
            probed * 1e3,
            first_window.total,
            first_window.cpu_s / first_window.total * 1e6 if first_window.total else 0.0,
        )
        log.debug("pid %d: first window readings %s %s", key.pid, first.raw(), start.raw())

    def _held_open(self, key: ProcessKey, s: _Sampled, now: float) -> bool:
        """Keep a window due to close open a little longer (STRETCH_S) while
        it holds fewer than MIN_INTERVALS complete intervals, the loop makes
        exact calls (this window or one before saw one) and it is younger
        than MAX_ON_S. Its time is charged at its close, putting the next
        window off as far."""
        if now - s.phase.t >= MAX_ON_S:
            return False
        r = self._read(key)
        if r is None or r.sample[1] - s.phase.sample[1] >= MIN_INTERVALS:
            return False
        if r.traps <= s.phase.traps and not any(w.calls >= 1 for w in s.windows):
            return False  # a loop with no exact call: a longer window would see none either
        with self._lock:
            s.next_toggle = min(now + STRETCH_S, s.phase.t + MAX_ON_S)
        return True

    def _toggle(self, now: float) -> None:
        links = self.cuda.launch_links
        assert links is not None
        with self._lock:
            due = [(k, s) for k, s in self._sampled.items() if s.ended is None and now >= s.next_toggle]
        cost, final = self._costs()
        for key, s in due:
            if s.on and s.duty >= 1.0:
                with self._lock:
                    s.next_toggle = now + DECIDE_S
                continue
            if s.on and self._held_open(key, s, now):
                continue
            r = self._read(key, fresh=True) if s.on else None
            if s.on and r is not None:
                links.set_on(s.pid, False)  # the window first: counts read before the detach
                with self._lock:
                    w = s.close_window(r, cost, final)
                log.debug(
                    "pid %d: window %.1f ms, %d launches, %.0f calls, %.2f us of CPU a launch; readings %s %s",
                    s.pid,
                    w.seconds * 1e3,
                    w.total,
                    w.calls,
                    w.cpu_s / w.total * 1e6 if w.total else 0.0,
                    w.start.raw(),
                    w.end.raw(),
                )
                continue
            attached_at = time.monotonic()
            if not s.on and links.set_on(s.pid, True):
                r = self._read(key, fresh=True)  # the window begins once its links are in
                if r is not None:
                    with self._lock:
                        s.open_window(r, attached_at)
                    continue
            with self._lock:  # gone: its exit is on its way
                s.next_toggle = now + IDLE_DECIDE_S
