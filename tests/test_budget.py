"""The overhead budget's duty cycle and estimates (runtime/budget.py), on
numbers whose truth is known: readings of a sampled process (the kernel's
counts and exact traps, its CPU time) as a loop of known shape would give
them. The real duty cycle on real uprobes is in test_overhead.py and
test_detach.py."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from memtrace.core.errors import AttachError
from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import TrapCost
from memtrace.core.procfiles import FileId
from memtrace.runtime import budget as bud
from memtrace.runtime.budget import (
    CAL_ERROR,
    HORIZON_S,
    MIN_WEIGH_CPU_S,
    NEAR,
    LaunchBudget,
    _Reading,
    _Sampled,
    _Span,
    extrapolate,
)
from memtrace.sensors.cuda.launches import LaunchLinks, LaunchTarget, _Own
from memtrace.sources.procfs import process_start_ticks

API = 100  # cuLaunchKernel
COST = TrapCost(entry_seconds=10e-6, pair_seconds=20e-6)


@dataclass
class Loop:
    """A launch loop's readings: each launch takes `work_s` of the process's
    own CPU, and (probed) one trap at `trap_s`; an exact call (two traps,
    `pair_s`) every `every` launches. Time is its CPU time (CPU-bound).
    Probed launches between two exact calls made while probed are BPF's
    complete intervals (bpf/launches.bpf.h, launch_interval), once `own`."""

    work_s: float = 20e-6
    trap_s: float = 10e-6
    pair_s: float = 20e-6
    every: int = 0
    t: float = 0.0
    cpu_ns: int = 0
    launched: int = 0  # the truth
    counted: int = 0  # what the kernel counted (launches probed)
    traps: int = 0
    own: bool = False  # in launch_own: BPF keeps its complete intervals
    pending: int = 0
    primed: bool = False
    sample: tuple[int, int] = (0, 0)

    def reading(self) -> _Reading:
        return _Reading(self.t, self.cpu_ns, {API: self.counted}, self.traps, self.sample)

    def run(self, launches: int, probed: bool) -> _Reading:
        for _ in range(launches):
            self.launched += 1
            cpu = self.work_s
            if probed:
                self.counted += 1
                cpu += self.trap_s
                self.pending += 1
            if self.every and self.launched % self.every == 0:
                self.traps += 2
                cpu += self.pair_s
                if self.own and probed and self.primed:
                    self.sample = (self.sample[0] + self.pending, self.sample[1] + 1)
                self.primed, self.pending = probed, 0
            self.cpu_ns += round(cpu * 1e9)
            self.t += cpu
        return self.reading()


def sampled(loop: Loop, duty: float, first: int) -> _Sampled:
    """A process sampled after `first` launches, all probed (its first window)."""
    r0 = loop.reading()
    start = loop.run(first, probed=True)
    loop.own = True  # BPF's sample begins with its per-process links
    s = _Sampled(1, duty, dict(start.counts), start, since=r0.t, on_seconds=start.t - r0.t)
    s.windows, s.closed = [_Span(r0, start)], 1
    return s


def cycle(s: _Sampled, loop: Loop, gap: int, window: int, cost: TrapCost = COST) -> None:
    """A gap of `gap` launches, then a window of `window`."""
    s.open_window(loop.run(gap, probed=False))
    s.close_window(loop.run(window, probed=True), cost, final=True)


def test_a_gap_is_extrapolated_per_exact_call_where_the_windows_saw_enough_calls() -> None:
    """A loop that copies every 50 launches: windows holding MIN_INTERVALS
    complete intervals or more give launches per call, times the gap's
    calls, whatever the probes cost (the trap here costs twice what it is
    charged)."""
    loop = Loop(every=50, trap_s=20e-6)
    s = sampled(loop, 0.1, first=2_000)  # 40 calls
    cycle(s, loop, gap=10_000, window=2_000)
    cycle(s, loop, gap=10_000, window=2_000)
    assert sum(w.intervals for w in s.windows) >= bud.MIN_INTERVALS
    est = s.report(loop.run(5_000, probed=False), COST)
    assert est.basis == "per_call"
    assert est.launches[API] == loop.launched
    # Every window saw 50 launches a call: no spread, but each of the three gaps
    # may be off by an interval's worth at its edges (a real loop's gaps begin
    # and end between calls), and the bound says so.
    assert est.error == pytest.approx(3 * 50 / loop.launched, rel=1e-6)


def test_a_gap_is_extrapolated_per_call_counted_whole_where_bpf_saw_too_few_intervals() -> None:
    """A short job's one window, fully probed before BPF kept intervals for
    it, held 10 copies: launches per call from its counts (its edges are
    calls here), not per CPU second at a trap cost half the true one. One
    window: no bound, and said so."""
    loop = Loop(every=100, trap_s=20e-6)
    s = sampled(loop, 0.1, first=1_000)
    est = s.report(loop.run(20_000, probed=False), COST)
    assert est.basis == "per_call"
    assert est.launches[API] == loop.launched
    assert est.error is None


def test_a_gap_is_extrapolated_per_cpu_second_less_the_traps() -> None:
    """A loop with no exact call: the windows' CPU time less their traps at
    the calibrated cost gives launches per unprobed CPU second, times the
    gap's CPU time. Charged at the right cost, exact; at a cost 20% too
    high, 10% over (half the windows' CPU is traps) and the bound says
    more than that."""
    loop = Loop(work_s=10e-6, trap_s=10e-6)
    s = sampled(loop, 0.1, first=1_000)
    cycle(s, loop, gap=9_000, window=1_000)
    now = loop.run(9_000, probed=False)
    est = s.report(now, COST)
    assert est.basis == "per_cpu"
    assert est.launches[API] == loop.launched
    dear = s.report(now, TrapCost(12e-6, 20e-6))
    off = dear.launches[API] / loop.launched - 1
    assert off == pytest.approx(0.9 * 0.25, rel=0.01)  # the gaps, 90% of launches, at 10/8 the rate
    assert dear.error is not None and dear.error >= off
    gaps = dear.launches[API] - 2_000  # all but the two windows' launches
    # The windows agree: the calibration's part alone, a cost off by CAL_ERROR over windows half traps.
    assert dear.error == pytest.approx(gaps / dear.launches[API] * CAL_ERROR * 12 / 8, rel=1e-6)


def test_a_gap_takes_out_the_traps_of_launches_counted_while_links_came_and_went() -> None:
    """Launches the kernel counted in a gap (its links still attached for a
    moment) are not reported as counted: the gap's extrapolation covers
    them, its CPU time less their traps."""
    loop = Loop(work_s=10e-6, trap_s=10e-6)
    s = sampled(loop, 0.1, first=1_000)
    loop.run(100, probed=True)  # the detach's tail
    s.open_window(loop.run(5_000, probed=False))
    s.close_window(loop.run(1_000, probed=True), COST, final=True)
    assert s.report(loop.reading(), COST).launches[API] == loop.launched


def test_a_gap_seen_by_one_window_only_cannot_be_bounded() -> None:
    """A short job's: sampled after its first launches, it ended before its
    second window. Extrapolated from the one window, and said so."""
    loop = Loop()
    s = sampled(loop, 0.02, first=800)
    est = s.report(loop.run(50_000, probed=False), COST)
    assert est.launches[API] == loop.launched
    assert est.error is None and est.basis == "per_cpu"


def test_the_bound_grows_with_the_windows_disagreement() -> None:
    """Windows that saw the loop at different paces (its work per launch
    changed) bound the gaps between them by how much they differ."""
    free = TrapCost(0.0, 0.0)
    loop = Loop(work_s=10e-6, trap_s=0.0)
    s = sampled(loop, 0.1, first=1_000)
    cycle(s, loop, gap=9_000, window=1_000, cost=free)
    loop.work_s = 30e-6
    cycle(s, loop, gap=3_000, window=1_000, cost=free)
    est = s.report(loop.reading(), free)
    assert est.error is not None and est.error > 0.2
    assert abs(est.launches[API] - loop.launched) <= est.error * loop.launched


def test_a_gap_across_a_change_of_rate_is_split_by_its_cpu_time_and_its_calls() -> None:
    """A loop of 1,000 launches a copy at 20 us each changes, inside a gap,
    to 200 a copy at 8 us (the bursty shape's change), two windows on each
    side. Pooled, the gap is priced at the windows' launches per copy over
    both loops, times copies that were mostly the faster loop's (13% high
    here, with a bound of 200%). Split by its unprobed CPU time and its
    copies (each side's copies per CPU second say how much of it ran at
    each rate), it is within the bound it states, which is far tighter;
    also where a trap costs twice what it is charged."""
    for trap_s in (1e-6, 2e-6):
        cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
        loop = Loop(every=1000, work_s=20e-6, trap_s=trap_s, pair_s=2e-6, own=True)
        a = loop.reading()
        b = loop.run(3_000, probed=True)
        c = loop.run(9_000, probed=False)
        d = loop.run(3_000, probed=True)
        before = loop.launched
        loop.run(6_000, probed=False)
        loop.work_s, loop.every = 8e-6, 200
        e = loop.run(8_000, probed=False)
        truth = loop.launched - before
        f = loop.run(2_000, probed=True)
        g = loop.run(8_000, probed=False)
        h = loop.run(2_000, probed=True)
        near = [_Span(a, b), _Span(c, d), _Span(e, f), _Span(g, h)]
        gap = _Span(d, e)
        split = extrapolate(gap, near, cost, before=2)
        pooled = extrapolate(gap, near, cost)  # the windows' sides not told: one rate
        assert split.basis == "split" and pooled.basis in ("per_call", "per_cpu")  # the tighter of the two
        assert split.error is not None and pooled.error is not None
        assert abs(split.total - truth) <= split.error * truth, (split, truth)
        assert split.error < pooled.error / 10
        assert abs(pooled.total - truth) > 0.1 * truth  # what the split is for


def test_a_steady_loops_gap_is_not_split() -> None:
    """The same loop at one rate all along: the sides agree, and the gap is
    extrapolated from all four windows pooled, as before."""
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=200, work_s=8e-6, trap_s=1e-6, pair_s=2e-6, own=True)
    spans = []
    for launches, probed in ((2_000, True), (8_000, False), (2_000, True), (14_000, False), (2_000, True)):
        start = loop.reading()
        spans.append(_Span(start, loop.run(launches, probed)))
    spans.append(_Span(loop.reading(), loop.run(2_000, True)))
    near = [spans[0], spans[2], spans[4], spans[5]]
    guess = extrapolate(spans[3], near, cost, before=2)
    assert guess.basis == "per_call"
    assert abs(guess.total - 14_000) <= (guess.error or 0.0) * 14_000 + 1


def bursty_run(seed: int) -> tuple[int, bud.LaunchEstimate]:
    """The bursty shape's two loops (2,000 launches a copy at 20 us, then
    300 at 8 us after 60,000 launches; 180,000 in all), its gaps and windows
    of random lengths (seeded), sampled from its first launches; a trap
    costs 0.6-1.5 us, charged 1 us. The truth, and what is reported."""
    rnd = random.Random(seed)
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=2000, work_s=20e-6, trap_s=rnd.choice([0.6e-6, 1e-6, 1.5e-6]), pair_s=2e-6)
    s = sampled(loop, 0.1, first=rnd.randint(200, 1500))
    while loop.launched < 180_000:
        gap, window = rnd.randint(2_000, 30_000), rnd.randint(300, 8_000)
        for n, probed in ((gap, False), (window, True)):
            if loop.every == 2000 and loop.launched + n > 60_000:
                n -= 60_000 - loop.launched
                loop.run(60_000 - loop.launched, probed)
                loop.work_s, loop.every = 8e-6, 300
            r = loop.run(min(n, 180_000 - loop.launched), probed)
            if probed:
                s.close_window(r, cost, final=True)
            else:
                s.open_window(r)
    return loop.launched, s.report(loop.reading(), cost)


@pytest.mark.parametrize("seed", [6, 84, 99, 115, 284, 385])
def test_a_loop_that_changes_is_estimated_within_the_bound_it_states(seed: int) -> None:
    """Windows at random places on a loop whose rate and shape change (the
    seeds where a split chosen for its tighter bound, over sides apart, or
    windows pooled across the change, broke the bound they stated): the
    estimate is within its bound, or states none."""
    truth, est = bursty_run(seed)
    reported = sum(est.launches.values())
    assert est.error is None or abs(reported - truth) <= est.error * truth, (reported, truth, est.error)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_report_is_what_guessing_every_gap_afresh_gives(seed: int) -> None:
    """report() keeps an open gap's guess until a window closes beside it or
    the cost changes (it runs twice a second per sampled process): at every
    reading of a loop whose rate changes, windows opening and closing, the
    cost changing and the gaps left unsettled a while (cost not calibrated),
    it reports exactly what guessing every gap afresh reports."""
    rnd = random.Random(seed)
    costs = [TrapCost(entry_seconds=1e-6, pair_seconds=2e-6), TrapCost(entry_seconds=1.4e-6, pair_seconds=2.5e-6)]
    loop = Loop(every=2000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=rnd.randint(200, 1500))
    reports = 0
    while loop.launched < 120_000:
        if loop.launched > 50_000:
            loop.work_s, loop.every = 8e-6, 300
        probed = s.on
        r = loop.run(rnd.randint(300, 8_000) if probed else rnd.randint(2_000, 30_000), probed)
        cost = rnd.choice(costs)
        if probed:
            s.close_window(r, cost, final=loop.launched > 40_000)
        else:
            s.open_window(r)
        for _ in range(rnd.randint(1, 3)):
            now = loop.run(rnd.randint(0, 500), s.on)
            cost = rnd.choice(costs)
            kept = s.report(now, cost)
            assert kept == dataclasses.replace(s, guessed={}).report(now, cost)
            reports += 1
    assert reports > 20 and len(s.guessed) <= len(s.gaps) * len(costs)


@dataclass
class Bursts:
    """The burst loop (tests/fixtures/burstloop.c) in wall time: phases of
    (launches, CPU a launch, burst, idle); a copy (two traps) at each
    burst's end, then the idle asleep (wall time, no CPU). Probed, a launch
    takes a trap too, and BPF keeps the complete intervals (as `Loop`)."""

    phases: list[tuple[int, float, int, float]]
    trap_s: float = 0.69e-6  # an emulated entry's, as the VM's agent timed it
    pair_s: float = 1.15e-6
    t: float = 0.0
    cpu_ns: int = 0
    launched: int = 0
    counted: int = 0
    traps: int = 0
    own: bool = False
    pending: int = 0
    primed: bool = False
    sample: tuple[int, int] = (0, 0)

    @property
    def done(self) -> bool:
        return self.launched >= sum(p[0] for p in self.phases)

    def phase(self) -> tuple[int, float, int, float]:
        n = 0
        for p in self.phases:
            n += p[0]
            if self.launched < n:
                return p
        return self.phases[-1]

    def reading(self) -> _Reading:
        return _Reading(self.t, self.cpu_ns, {API: self.counted}, self.traps, self.sample)

    def run_until(self, t_end: float, probed: bool) -> _Reading:
        while self.t < t_end and not self.done:
            _, work_s, burst, idle_s = self.phase()
            self.launched += 1
            cpu = work_s
            if probed:
                self.counted += 1
                cpu += self.trap_s
                self.pending += 1
            end = sum(p[0] for p in self.phases[: self.phases.index(self.phase()) + 1])
            start = end - self.phase()[0]
            if (self.launched - start) % burst == 0 or self.launched == end:
                self.traps += 2
                cpu += self.pair_s
                if self.own and probed and self.primed:
                    self.sample = (self.sample[0] + self.pending, self.sample[1] + 1)
                self.primed, self.pending = probed, 0
                self.t += idle_s
            self.cpu_ns += round(cpu * 1e9)
            self.t += cpu
        return self.reading()


def bursts_sampled(us_a_launch: float) -> tuple[Bursts, bud.LaunchEstimate, int]:
    """The rate-and-shape test's loop (tests/test_overhead.py: 60,000 launches in bursts of
    2,000 with 30 ms idle, then 120,000 of 0.4x the CPU in bursts of 300 with 5 ms idle) at
    `us_a_launch` of CPU a launch in its first phase, sampled as the budget thread would:
    its first 15 ms fully probed, windows opened and closed when `_Sampled` says, its duty
    weighed again every DECIDE_S at what its current phase's traps cost (the budget at
    SAFETY over a trap's share). The loop, what is reported, and its windows in phase 2."""
    w = us_a_launch * 1e-6
    loop = Bursts([(60_000, w, 2_000, 0.030), (120_000, 0.4 * w, 300, 0.005)])
    cost = TrapCost(loop.trap_s, loop.pair_s)

    def duty() -> float:
        return min(0.01 * bud.SAFETY / (loop.trap_s / loop.phase()[1]), 1.0)

    r0 = loop.reading()
    start = loop.run_until(0.015, probed=True)
    loop.own = True
    s = _Sampled(1, duty(), dict(start.counts), start, since=r0.t, on_seconds=start.t - r0.t)
    s.windows, s.closed = [_Span(r0, start)], 1
    s.next_toggle = s.next_window_at(start.t)
    decide, late = start.t + bud.DECIDE_S, 0
    while True:
        r = loop.run_until(min(s.next_toggle, decide), probed=s.on)
        if loop.done:
            break
        if r.t >= decide:
            s.retune(duty())
            decide = r.t + bud.DECIDE_S
        if r.t < s.next_toggle:
            continue
        if s.on:
            s.close_window(r, cost, final=True)
            late += loop.launched > 60_000
        else:
            s.open_window(r)
    return loop, s.report(loop.reading(), cost), late


@pytest.mark.parametrize("us_a_launch", [20.0, 34.0])
def test_a_loop_whose_rate_changes_is_seen_after_the_change_on_a_slow_machine(us_a_launch: float) -> None:
    """The rate-and-shape loop at the ~20 us a launch it was designed for, and at the ~34 us
    this VM runs it at (its first phase longer than designed, past the young windows). Its
    duty falls at the change (0.34 to 0.14 at 34 us): the first phase's windows are paid at
    what their traps cost, not as a debt of probed time at the new duty, which left the
    second phase unseen for its last 3.5 s (one gap priced at the first loop's launches a
    copy: 4.8x the truth). Windows see the second phase, a gap next to a window that
    straddles the change goes by its nearest windows, and the estimate is within the
    issue's 5% for bursty loads, within the bound it states if it states one."""
    loop, est, late = bursts_sampled(us_a_launch)
    truth, reported = loop.launched, sum(est.launches.values())
    assert truth == 180_000
    assert reported == pytest.approx(truth, rel=0.05), (reported, est)
    assert est.error is None or abs(reported - truth) <= est.error * truth, (reported, est)
    assert late >= 2, late  # windows after the change


def shorter_windows_than_copies(seed: int) -> tuple[int, bud.LaunchEstimate]:
    """A steady loop with a copy every 2,000 launches of 20 us, its windows (300-1,800
    launches) shorter than the copies' period, at random places (seeded): a window holds
    one copy or none, and no complete interval. A trap costs 0.6-1.5 us, charged 1 us."""
    rnd = random.Random(seed)
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=2000, work_s=20e-6, trap_s=rnd.choice([0.6e-6, 1e-6, 1.5e-6]), pair_s=2e-6)
    s = sampled(loop, 0.1, first=rnd.randint(200, 1500))
    while loop.launched < 100_000:
        s.open_window(loop.run(rnd.randint(3_000, 12_000), probed=False))
        s.close_window(loop.run(rnd.randint(300, 1_800), probed=True), cost, final=True)
    s.open_window(loop.run(rnd.randint(3_000, 12_000), probed=False))
    s.close_window(loop.run(rnd.randint(300, 1_800), probed=True), cost, final=True)
    now = loop.run(2_000, probed=False)
    return loop.launched, s.report(now, cost)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_windows_shorter_than_the_copies_period_state_a_bound_that_holds(seed: int) -> None:
    """Launches per copy counted whole over windows that hold one copy or none: their
    spread taken over each window's launches against the pooled rate times its copies,
    those without a copy included (per window over those with one only, seed 0 was 13.1%
    low under a bound of 12.6%), and the per-CPU guess where its bound is the tighter:
    within the issue's 5% for this steady loop, and within the bound it states."""
    truth, est = shorter_windows_than_copies(seed)
    reported = sum(est.launches.values())
    assert est.error is not None
    assert abs(reported - truth) <= est.error * truth, (reported, truth, est)
    assert reported == pytest.approx(truth, rel=0.05)


def recorded(name: str) -> tuple[int, bud.LaunchEstimate]:
    """A `memtrace run` of the rate-and-shape loop on the 2-vCPU VM (34 us a launch in its
    first phase), its windows' readings as the budget's debug log gave them
    (tests/fixtures/burstloop_windows.json), estimated again: the truth and the report."""
    doc = json.loads((Path(__file__).parent / "fixtures" / "burstloop_windows.json").read_text())[name]
    cost = TrapCost(doc["entry_seconds"], doc["pair_seconds"])

    def reading(r: list[Any]) -> _Reading:
        return _Reading(r[0], r[1], {API: r[2]}, r[3], tuple(r[4]))

    (a, b), *rest = doc["windows"]
    first = _Span(reading(a), reading(b))
    s = _Sampled(1, 0.1, dict(first.end.counts), first.end, since=first.start.t, on_seconds=first.seconds)
    s.windows, s.closed = [first], 1
    for a, b in rest:
        s.open_window(reading(a))
        s.close_window(reading(b), cost, final=True)
    return doc["truth"], s.report(reading(doc["end"]), cost)


def test_a_gap_next_to_a_window_across_the_change_goes_by_its_nearest_windows() -> None:
    """Recorded on the VM: the change fell inside a window, which held the first loop's
    last burst (2,000 launches a copy) and the second's first (300 a copy). Pooled with
    it, the gap before it was priced at the second loop's launches a copy, the gap after
    it at a mix of both (164,676 reported: 8.5% low). A side whose nearest window ran
    apart from its farther one goes by its nearest: within the issue's 5%."""
    truth, est = recorded("straddled_change")
    reported = sum(est.launches.values())
    assert reported == pytest.approx(truth, rel=0.05), (reported, est)
    assert est.error is None or abs(reported - truth) <= est.error * truth, (reported, est)


def test_a_gap_whose_own_calls_say_the_loop_changed_states_no_bound() -> None:
    """Recorded on the VM before the scheduling fix: no window after the change, the loop's
    last 3.8 s one gap priced at the first loop's rate (per CPU second: 37.7% low), under
    a bound of 3.7%. Its own copies per CPU second (the second loop's: 300 launches a
    copy, 5 ms idle) are ten times its windows': the loop changed inside it, no window saw
    what it changed to, and the estimate says it cannot be bounded."""
    truth, est = recorded("unseen_second_phase")
    reported = sum(est.launches.values())
    assert abs(reported - truth) > 0.3 * truth  # nothing saw the second loop: not estimable
    assert est.error is None or abs(reported - truth) <= est.error * truth, (reported, est)


def test_a_gap_with_no_cpu_time_past_its_last_reading_goes_by_its_calls() -> None:
    """A process gone before its exit was heard: its last gap has no CPU time past the
    last reading (estimate's), but the kernel's exact traps went on. Per CPU second says
    nothing ran, under a bound of 0; its calls say otherwise, and they stand (the tighter
    of the two clocks took the per-CPU guess: 92,826 reported for 300,000)."""
    loop = Loop(every=100, work_s=10e-6, trap_s=10e-6, own=True)
    s = sampled(loop, 0.1, first=2_000)
    for _ in range(3):
        cycle(s, loop, gap=10_000, window=2_000)
    now = loop.run(20_000, probed=False)
    gone = _Reading(now.t, s.phase.cpu_ns, now.counts, now.traps, now.sample)
    est = s.report(gone, COST)
    assert est.basis == "per_call"
    assert est.launches[API] == pytest.approx(loop.launched, rel=0.02)


def test_a_gap_still_open_after_a_change_goes_by_the_nearest_window() -> None:
    """Two windows of the first loop (2,000 launches a copy), then one of
    the second (300 a copy), and a gap still open: pooled, the three would
    price it at (2,000 + 300 x 14) / 15 launches a copy; the nearest window
    ran apart from those before it, and the gap goes by it."""
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=2000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=4_500)
    cycle(s, loop, gap=20_000, window=4_500, cost=cost)
    loop.work_s, loop.every = 8e-6, 300
    cycle(s, loop, gap=20_000, window=4_500, cost=cost)
    before = loop.launched
    now = loop.run(30_000, probed=False)
    open_gap = s._guess(_Span(s.phase, now), s.closed, cost, later=False)
    assert open_gap.total == pytest.approx(loop.launched - before, rel=0.01)
    assert open_gap.error is None  # one window to go by


def launch_loop_halves(first: int, gap: int, window: int) -> tuple[Loop, _Sampled]:
    """tests/test_overhead.py's bursty launch loop (a copy every 1,000 launches, 40,000 in
    all, its second half twice as fast a launch) as its CPU clock sees it (the idles take
    none): its first `first` launches fully probed, a gap of `gap`, a window of `window`
    (a window holds one copy or none: too few for launches per call), both in the first
    half; the rest of the loop, across its change, a gap still open. A trap is charged at
    what it costs. The loop, and the process sampled."""
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=1000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=first)
    cycle(s, loop, gap=gap, window=window, cost=cost)
    loop.run(20_000 - loop.launched, probed=False)
    loop.work_s = 10e-6  # the second half: as many launches a copy, half the CPU each
    loop.run(20_000, probed=False)
    return loop, s


@pytest.mark.parametrize(("first", "gap", "window"), [(900, 9_000, 600), (900, 4_000, 600), (700, 3_000, 500)])
def test_a_gap_across_a_change_its_calls_tell_states_a_bound_that_holds(first: int, gap: int, window: int) -> None:
    """The fresh-clone CI failure of the bursty loop (29,115 launches for 40,000 under a
    bound of 8.3%): its last gap, still open, holds the end of its first half and all of
    its second, priced per CPU second at the first half's rate by the two windows before
    it, whose rates agree (a bound of a few %). Its own copies per CPU second are 1.4-1.5x
    theirs: apart by more than a copy either side allows, though by less than APART, so
    it was kept bounded (25% low under 4.8%). The bound takes in how far its calls say
    its rate may be from theirs, and holds the truth."""
    loop, s = launch_loop_halves(first, gap, window)
    est = s.report(loop.reading(), TrapCost(entry_seconds=1e-6, pair_seconds=2e-6))
    reported = sum(est.launches.values())
    assert loop.launched == 40_000
    assert reported < 0.8 * loop.launched  # the second half at the first's rate: the guess is off
    assert est.error is None or abs(reported - loop.launched) <= est.error * reported, (reported, est)


def test_a_steady_gap_whose_calls_agree_keeps_its_windows_bound() -> None:
    """The same loop with no change (its second half as its first): the gap's copies per
    CPU second are its windows', within a copy either side, and its bound is theirs,
    no wider (the calibration's part: 5%)."""
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=1000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=900)
    cycle(s, loop, gap=9_000, window=600, cost=cost)
    est = s.report(loop.run(40_000 - loop.launched, probed=False), cost)
    reported = sum(est.launches.values())
    assert est.error is not None and est.error < 0.06, est
    assert abs(reported - loop.launched) <= est.error * reported, (reported, est)


def test_a_window_that_fell_in_an_idle_is_no_side_to_go_by() -> None:
    """Recorded on the VM (the bursty loop, 2x slower than designed): a gap across the
    loop's change ended at a window that fell wholly in an idle (no launch, no copy, no
    CPU). Taken for its right side's nearest (apart from the window after it), its rate of
    nothing set the sides apart, no split could use it, and the gap went by its left side
    alone, the first half's rate, under their bound (7,260 for 10,924: 33% low under 22%).
    Here: two windows of the first half, a gap across the change, an empty window, then
    windows of the second half. The window that saw nothing run is left out, the next that
    did stands for its side, and the estimate is within the bound it states, or states
    none."""
    cost = TrapCost(entry_seconds=1e-6, pair_seconds=2e-6)
    loop = Loop(every=1000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=900)
    cycle(s, loop, gap=9_000, window=600, cost=cost)
    cycle(s, loop, gap=4_000, window=600, cost=cost)
    loop.run(20_000 - loop.launched, probed=False)
    loop.work_s = 10e-6
    s.open_window(loop.run(9_000, probed=False))
    s.close_window(loop.reading(), cost, final=True)  # the idle: nothing ran
    cycle(s, loop, gap=6_000, window=600, cost=cost)
    cycle(s, loop, gap=2_000, window=600, cost=cost)
    est = s.report(loop.run(40_000 - loop.launched, probed=False), cost)
    reported = sum(est.launches.values())
    assert loop.launched == 40_000
    assert est.error is None or abs(reported - loop.launched) <= est.error * reported, (reported, est)
    # The gap across the change, its right side the window after the idle: not the first
    # half's rate alone under the first half's bound.
    assert s.windows[-3].total == 0 and len(s.windows) == s.closed == 6
    across = _Span(s.windows[-4].end, s.windows[-3].start)  # after 3 windows
    guess = s._guess(across, 3, cost)
    truth = 20_000 - 15_100 + 9_000
    assert guess.error is None or abs(guess.total - truth) <= guess.error * guess.total, guess


def test_a_steady_loops_open_gap_is_not_taken_for_a_change_by_a_windows_few_calls() -> None:
    """Recorded on the VM (CI's short steady loop, a copy every 1,000 launches, ~12 us a
    launch): a first window of 785 launches and one copy, a gap of 39 copies, a window of
    2,066 launches and three copies (two complete intervals: a per-call clock), then the
    loop's last 20,000 launches, a gap still open. The nearest window's launches per call
    times its copies per CPU second (three copies in 24 ms: 123 a second, the loop's 83
    within a copy either side) set it apart from the first window by 56%, the loop taken
    for changed, and the gap went by the nearest window alone, with no bound (the report:
    "error not bounded", 1 run in 30). A per-call rate's copies per CPU second are known to
    a copy either side: within that, a steady loop is no change, and its gap states a bound
    that holds."""
    cost = TrapCost(entry_seconds=1.77e-6, pair_seconds=2.65e-6)
    loop = Loop(every=1000, work_s=12e-6, trap_s=1.77e-6, pair_s=2.65e-6)
    loop.run(300, probed=False)  # the process's start, before it was sampled
    s = sampled(loop, 0.05, first=785)
    assert s.windows[0].calls == 1
    cycle(s, loop, gap=39_865, window=2_066, cost=cost)
    assert [w.calls for w in s.windows] == [1, 3] and s.windows[-1].intervals == 2
    start = loop.launched
    now = loop.run(64_000 - start, probed=False)
    tail = s._guess(_Span(s.phase, now), s.closed, cost, later=False)
    truth = loop.launched - start
    assert tail.error is not None, tail
    assert abs(tail.total - truth) <= tail.error * tail.total, (truth, tail)
    est = s.report(now, cost)
    reported = sum(est.launches.values())
    assert est.error is not None and abs(reported - loop.launched) <= est.error * reported, (reported, est)


def test_windows_of_one_copy_between_them_do_not_make_a_steady_loops_gap_a_change() -> None:
    """Recorded on the VM under load (CI's short steady loop, its text run): a first window of
    598 launches and no copy, a gap of 34 copies, a window of 1,632 launches and one. The
    windows' copies per CPU second, 1 in 30 ms (34 a second for the loop's 78), were taken to
    be a copy either side of their rate, 0 to 68, below the gap's 79: the loop changed in it,
    and the estimate had no bound. Each window is a copy either side of its own: two windows,
    two copies, 0 to 102, and the gap is the loop's, under its windows' bound."""
    cost = TrapCost(entry_seconds=1.43e-6, pair_seconds=2.46e-6)
    loop = Loop(every=1000, work_s=12.8e-6, trap_s=1.43e-6, pair_s=2.46e-6)
    loop.run(100, probed=False)
    s = sampled(loop, 0.06, first=598)
    cycle(s, loop, gap=34_100 - loop.launched, window=1_632, cost=cost)
    assert [w.calls for w in s.windows] == [0, 1] and s.gaps[0][1].calls == 34
    after, gap = s.gaps[0]
    guess = s._guess(gap, after, cost)
    truth = 34_100 - 698  # the launches the gap held
    assert guess.error is not None, guess
    assert abs(guess.total - truth) <= guess.error * guess.total, (truth, guess)


def test_a_launch_with_a_timelines_return_trap_is_weighed_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a timeline is recorded, a launch not sampled takes its entry trap and its return
    (its slice's record), priced as an exact call's return (half a pair): at this cost (10 us
    an entry, 20 us a pair), 2,000 such launches a second weigh what 4,000 without returns
    do, and leave the same duty."""
    b = budget_on(FakeCuda(FakeMaps(per_read=1)), monkeypatch)
    assert b._duty(COST, 1.0, 2_000, 3, returns=True) == pytest.approx(b._duty(COST, 1.0, 4_000, 3))
    assert b._duty(COST, 1.0, 2_000, 3, returns=True) < b._duty(COST, 1.0, 2_000, 3) < 1.0


def test_a_first_window_whose_launches_took_returns_prices_its_loop_without_them() -> None:
    """A process sampled while a timeline is recorded: its first window (fully probed) had a
    return trap at each launch (10 us more each, at COST), its later windows none (a sampled
    launch has no slice). Taken for entries only, the first window reads 30 us of work a
    launch for 20, and a gap priced over it and a later window comes out a fifth low;
    flagged (returns), it is priced within 1%."""
    loop = Loop(work_s=20e-6, trap_s=20e-6)  # the entry and the return
    r0 = loop.reading()
    start = loop.run(5_000, probed=True)
    loop.trap_s = 10e-6  # sampled: the entry alone
    gap = _Span(start, loop.run(20_000, probed=False))
    window = _Span(gap.end, loop.run(5_000, probed=True))
    unflagged = extrapolate(gap, [_Span(r0, start), window], COST, before=1)
    flagged = extrapolate(gap, [_Span(r0, start, returns=True), window], COST, before=1)
    assert unflagged.total < 0.9 * 20_000, unflagged
    assert flagged.total == pytest.approx(20_000, rel=0.01), flagged


def test_a_gap_with_no_call_is_not_priced_at_nothing_per_call() -> None:
    """Recorded on the VM: the bursty loop's last 501 launches, after its last copy, a gap
    of 7.3 ms of CPU and no call, priced per call at 0 launches under a bound of 0. A gap
    holds up to an interval's launches between two calls: with none in it, it goes per
    CPU second, within the bound that states."""
    loop = Loop(every=1000, work_s=20e-6, trap_s=1e-6, pair_s=2e-6)
    s = sampled(loop, 0.1, first=2_500)
    for _ in range(3):
        cycle(s, loop, gap=7_000, window=2_500, cost=COST)
    assert sum(w.intervals for w in s.windows) >= bud.MIN_INTERVALS  # a per-call clock
    start = loop.launched
    now = loop.run(1_000 - start % 1_000 - 1, probed=False)  # up to, not past, the next copy
    tail = s._guess(_Span(s.phase, now), s.closed, COST, later=False)
    truth = loop.launched - start
    assert truth > 0 and now.traps == s.phase.traps
    assert tail.error is None or abs(tail.total - truth) <= tail.error * tail.total + 1, (truth, tail)


def test_launches_split_by_api_as_the_windows_saw_them() -> None:
    """Kernel and graph launches are extrapolated in the mix the windows counted."""
    w0 = _Reading(0.0, 0, {100: 0, 102: 0}, 0)
    w1 = _Reading(0.01, 10_000_000, {100: 300, 102: 100}, 0)
    g1 = _Reading(0.11, 110_000_000, {100: 300, 102: 100}, 0)
    guess = extrapolate(_Span(w1, g1), [_Span(w0, w1)], TrapCost(0.0, 0.0))
    assert guess.launches == {100: pytest.approx(3_000), 102: pytest.approx(1_000)}


def test_a_gap_is_settled_once_near_windows_followed_and_the_cost_is_calibrated() -> None:
    """Until then a gap keeps the windows it is extrapolated from: a cost
    calibrated later corrects it."""
    loop = Loop()
    s = sampled(loop, 0.1, first=1_000)
    for _ in range(NEAR + 2):
        s.open_window(loop.run(9_000, probed=False))
        s.close_window(loop.run(1_000, probed=True), COST, final=False)
    assert len(s.gaps) == NEAR + 2 and not s.settled
    cycle(s, loop, gap=9_000, window=1_000)
    assert s.settled and len(s.gaps) == NEAR - 1  # all but those fewer than NEAR windows followed
    assert s.report(loop.reading(), COST).launches[API] == loop.launched


def test_one_window_a_period_and_never_more_than_the_duty_since_the_first_launch() -> None:
    """Duty 0.02. In its first YOUNG_S a window comes every YOUNG_PERIOD_S
    (5 ms windows, MIN_ON_S), then one a HORIZON_S (20 ms): no second holds
    more than (1 + period) x the duty's share of probed time. A start fully
    probed for 10 ms counts as a window: the next waits until the duty's
    share of the time since the first launch pays for it, but never more
    than a period past the steady rhythm."""
    s = _Sampled(1, 0.02, base={}, phase=_Reading(0.01, 0, {}, 0), since=0.0, on_seconds=0.01)
    w = s.on_s()
    assert w == pytest.approx(max(bud.MIN_ON_S, 0.02 * bud.YOUNG_PERIOD_S))
    first = s.next_window_at(0.01)
    period = max(bud.YOUNG_PERIOD_S, w / 0.02)
    steady = 0.01 + period - w
    assert first == pytest.approx(min((0.01 + w) / 0.02, steady + period))  # the debt, a period at most
    assert first > steady
    # Steady: each window closes, the next opens a period after the last opened.
    s = _Sampled(1, 0.02, base={}, phase=_Reading(0.0, 0, {}, 0), since=0.0, on_seconds=0.0)
    opened, on = [], []
    t = s.next_window_at(0.0)
    for _ in range(20):
        w = s.on_s(t)
        opened.append(t)
        s.on_seconds += w
        on.append((t, t + w))
        t = s.next_window_at(t + w)
    assert any(a < bud.YOUNG_S for a in opened) and any(a > bud.YOUNG_S + HORIZON_S for a in opened)
    for a, b in zip(opened, opened[1:], strict=False):
        assert b - a >= (bud.YOUNG_PERIOD_S if a < bud.YOUNG_S else HORIZON_S) - 1e-9
    for start, _ in on:  # any second holds (1 + period) x the duty's share at most
        held = sum(max(0.0, min(e, start + HORIZON_S) - max(b, start)) for b, e in on)
        assert held <= 0.02 * (HORIZON_S + bud.YOUNG_PERIOD_S) + 1e-9
    for start, _ in on:  # and, once old, one window's worth
        if start > bud.YOUNG_S + HORIZON_S:
            held = sum(max(0.0, min(e, start + HORIZON_S) - max(b, start)) for b, e in on)
            assert held <= 0.02 * HORIZON_S + 1e-9
    # A debt (a set-up's long windows at a higher duty) is paid a period at a time.
    s = _Sampled(1, 0.02, base={}, phase=_Reading(10.0, 0, {}, 0), since=0.0, on_seconds=3.0)
    w = s.on_s()
    assert s.next_window_at(10.0) == pytest.approx(10.0 + HORIZON_S - w + HORIZON_S)


def test_a_windows_attach_before_its_reading_counts_as_probed() -> None:
    """Links attached at t=1.000, the window's up-to-date reading at 1.004:
    those 4 ms were probed, so they count against the duty, but the window
    counts launches for its whole length from its reading (a lead of 4 ms
    left 5 ms windows of a loop under load 1-2 ms long: a copy or none in
    them, launches per call off by 13-23%). The next window is put off by
    all of its probed time: a period is its lead and length over the duty."""
    s = _Sampled(1, 0.02, base={}, phase=_Reading(0.5, 0, {}, 0), since=0.0, on_seconds=0.0)
    s.open_window(_Reading(1.004, 0, {}, 0), attached_at=1.0)
    assert s.on_seconds == pytest.approx(0.004)
    w = s.on_s(1.004)
    assert s.next_toggle == pytest.approx(1.004 + w)
    s.close_window(_Reading(1.004 + w, 0, {}, 0), COST, final=True)
    probed = 0.004 + w
    assert s.on_seconds == pytest.approx(probed) and probed / 0.02 > bud.YOUNG_PERIOD_S
    # Young, no debt: the next opens a period after this one's attach, its
    # probed time over the duty (not w / duty: the lead would go unpaid).
    assert s.next_window_at(1.004 + w) == pytest.approx(1.0 + probed / 0.02)


def test_a_per_call_guess_without_a_spread_is_bounded_by_the_per_cpu_one() -> None:
    """Every complete interval in one window (no spread between windows),
    two windows with CPU time: the per-call guess stands, bounded by the
    per-CPU guess's bound and the distance between the two."""
    w0 = _Reading(0.0, 0, {API: 0}, 0, (0, 0))
    w1 = _Reading(0.02, 20_000_000, {API: 1_000}, 6, (600, 2))  # 3 calls, 2 complete intervals of 300
    g = _Reading(0.5, 500_000_000, {API: 1_000}, 6 + 2 * 80, (600, 2))  # 80 calls unprobed
    w2 = _Reading(0.52, 522_000_000, {API: 2_000}, 6 + 2 * 83, (600, 2))  # 1,000 launches, no interval
    free = TrapCost(0.0, 0.0)
    guess = extrapolate(_Span(w1, g), [_Span(w0, w1), _Span(g, w2)], free)
    assert guess.basis == "per_call" and guess.total == pytest.approx(300 * 80)
    cpu = bud._per_cpu(_Span(w1, g), [_Span(w0, w1), _Span(g, w2)], 2_000, {API: 1.0}, free)
    assert cpu.error is not None
    assert guess.error == pytest.approx((abs(guess.total - cpu.total) + cpu.error * cpu.total) / guess.total)


def test_a_lower_duty_ends_an_open_window_at_its_new_length() -> None:
    """Weighed during set-up at duty 0.7, then the loop drops it to 0.05:
    the window that opened at t=10 ends at 10.05 (already past: at once). A
    higher duty never lengthens a window; a gap's end is set again."""
    s = _Sampled(1, 0.7, base={}, phase=_Reading(10.0, 0, {}, 0), since=0.0, on_seconds=0.0, on=True)
    s.next_toggle = 10.7
    s.retune(0.05)
    assert s.next_toggle == pytest.approx(10.05)
    s.retune(0.9)
    assert s.next_toggle == pytest.approx(10.05)
    gap = _Sampled(1, 0.5, base={}, phase=_Reading(10.0, 0, {}, 0), since=9.0, on_seconds=0.5, on=False)
    gap.next_toggle = 10.5
    gap.retune(0.01)
    assert gap.next_toggle == pytest.approx(gap.next_window_at(10.0))


# ---- the first weighing, on a real process's CPU clock and made-up counts ----


@dataclass
class FakeLinks:
    own: dict[int, bool] = field(default_factory=dict)
    off: set[int] = field(default_factory=set)
    intervals: int = 0  # BPF's complete intervals so far (100 launches each)

    def link_off(self, pid: int, off: bool) -> None:
        (self.off.add if off else self.off.discard)(pid)

    def has_own(self, pid: int) -> bool:
        return pid in self.own

    def adopt(self, pid: int) -> bool:
        self.own[pid] = pid not in self.off
        return True

    def set_on(self, pid: int, on: bool) -> bool:
        self.own[pid] = on
        return True

    def exited(self, pid: int, ticks: int) -> None:
        self.own.pop(pid, None)

    def sample(self, pid: int) -> tuple[int, int]:
        return 100 * self.intervals, self.intervals


@dataclass
class FakeMaps:
    """Each reading finds `per_read` more launches: a loop as fast as the reads."""

    per_read: int
    launches: int = 0
    reads: int = 0
    traps: int = 0
    setup: int = 3  # set-up first: no launch in its first readings
    burst: int = 1 << 62  # then this many readings find launches, and none after

    def process_counts(self, key: ProcessKey) -> tuple[dict[int, int], int]:
        self.reads += 1
        if self.setup < self.reads <= self.setup + self.burst:
            self.launches += self.per_read
        return ({API: self.launches} if self.launches else {}), self.traps


@dataclass
class FakeCuda:
    maps: FakeMaps
    launch_links: FakeLinks = field(default_factory=FakeLinks)
    timed: bool = False  # a timeline's launch return probes attached

    def launches_per_process(self, fid: Any) -> int:
        return 0

    def launches_timed(self, pid: int) -> bool:
        return self.timed


@pytest.fixture
def spinner() -> Any:
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield p
    p.kill()
    p.wait()


def budget_on(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> LaunchBudget:
    monkeypatch.setattr(bud, "mapped_libraries", lambda pid: [])
    return LaunchBudget(cuda, 0.01, lambda: [], lambda: COST)  # type: ignore[arg-type]


def weigh_until(b: LaunchBudget, key: ProcessKey, reads: int) -> int:
    """Look at the process as the thread would, as often as it asks; the reads it took."""
    b.met(key)
    now = time.monotonic()
    for n in range(1, reads + 1):
        b._look(now)
        if key in b._sampled:
            return n
        now = max(b._watched[key].next, now)
        time.sleep(max(now - time.monotonic(), 0))
    return -1


def test_a_new_process_is_sampled_from_its_first_launches(spinner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Met (stopped at its library) before it launches: read every WATCH_S
    until launches appear, then sampled as soon as two readings span
    MIN_WEIGH_CPU_S of its CPU time and cost more than the budget (40
    launches a reading at 10 us a trap: far over 1% of a few ms). It starts
    in a gap, its own links detached, the readings before as its first
    window; nothing waits for the model or the calibration."""
    key = ProcessKey(spinner.pid, process_start_ticks(spinner.pid) * (1_000_000_000 // os.sysconf("SC_CLK_TCK")))
    cuda = FakeCuda(FakeMaps(per_read=40))
    b = budget_on(cuda, monkeypatch)
    reads = weigh_until(b, key, 200)
    assert reads > 0, "never sampled"
    s = b._sampled[key]
    assert cuda.launch_links.own == {spinner.pid: False}  # linked with its links detached
    assert s.on is False and s.closed == 1
    first = s.windows[0]
    assert first.start.launches == 80  # the first reading that found launches (40), read again at once, fresh
    assert first.cpu_s >= MIN_WEIGH_CPU_S
    assert 0 < s.duty < 1
    assert s.base == dict(first.end.counts)  # every launch until its first gap counted
    est = b.estimate(key, {API: cuda.maps.launches}, 0)
    assert est.duty == s.duty and est.launches[API] >= s.base[API] and est.basis == "per_cpu"


def test_a_burst_after_a_second_of_set_up_is_weighed_over_that_second(
    spinner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's first kernels come after a second or more of imports and copies: on an H200,
    torch_truth.py's 1,843 launches in 56 ms were sampled at once (3.4% of those 56 ms), and
    its estimate, extrapolated over seconds of launch-free CPU after, was 11,089 for 2,011.
    Over the second it is weighed over, its set-up included, the burst is far under the
    budget (200 launches at 10 us: 2 ms of traps in about 0.5 s of CPU), so every launch
    stays probed and counted. The same burst at its start is sampled (the test above)."""
    key = ProcessKey(spinner.pid, process_start_ticks(spinner.pid) * (1_000_000_000 // os.sysconf("SC_CLK_TCK")))
    cuda = FakeCuda(FakeMaps(per_read=40, setup=100, burst=5))
    b = budget_on(cuda, monkeypatch)
    assert weigh_until(b, key, 150) == -1
    assert cuda.maps.reads >= 150 and cuda.maps.launches == 200
    assert cuda.launch_links.own == {} and key not in b._sampled
    est = b.estimate(key, {API: 200}, 0)
    assert est.launches == {API: 200} and est.duty is None and est.basis == "counted"


def test_a_loop_after_a_second_of_set_up_is_sampled_once_its_second_goes_over(
    spinner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set-up's CPU time delays sampling only as long as the last second stays under the
    budget: a loop that goes on launching (40 launches a reading, 10 us a trap) is sampled."""
    key = ProcessKey(spinner.pid, process_start_ticks(spinner.pid) * (1_000_000_000 // os.sysconf("SC_CLK_TCK")))
    cuda = FakeCuda(FakeMaps(per_read=40, setup=100))
    b = budget_on(cuda, monkeypatch)
    reads = weigh_until(b, key, 400)
    assert reads > 100, "never sampled"
    s = b._sampled[key]
    first = s.windows[0]
    assert first.start.launches == 80  # its first window starts at its first launches, as before
    assert 0 < s.duty < 1


def test_a_process_is_never_weighed_over_more_than_a_second() -> None:
    """Read once a second before it launched (met long before), then every few ms: the
    readings kept never reach back past HORIZON_S, so a launching second is never weighed
    against the CPU time of two (its traps' share halved, the budget overrun)."""
    w = bud._Watched(seen=0.0)
    for t in (0.0, 1.0, 2.0, 3.02, 3.03, 3.04):  # the last three launching
        LaunchBudget._keep(w, _Reading(t, int(t * 1e9), {API: 40 * max(0, round((t - 3.0) * 100))}, 0))
        assert w.readings[-1].t - w.readings[0].t <= HORIZON_S
    assert [r.t for r in w.readings] == [3.02, 3.03, 3.04]
    for k in range(1, 120):  # a launching second and more, read every 10 ms
        t = 3.04 + k * 0.01
        LaunchBudget._keep(w, _Reading(t, int(t * 1e9), {API: 4000 + 40 * k}, 0))
        span = w.readings[-1].t - w.readings[0].t
        assert span <= HORIZON_S
        if t - 3.02 >= HORIZON_S:  # a second of readings kept: within a reading of the whole second
            assert span >= HORIZON_S - 0.011


def test_a_light_process_keeps_every_launch_probed(spinner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One launch a reading (a few ms of CPU each): a trap is far under 1%:
    never sampled, read again and again."""
    key = ProcessKey(spinner.pid, process_start_ticks(spinner.pid) * (1_000_000_000 // os.sysconf("SC_CLK_TCK")))
    cuda = FakeCuda(FakeMaps(per_read=1))
    b = budget_on(cuda, monkeypatch)
    assert weigh_until(b, key, 40) == -1
    assert cuda.launch_links.own == {} and key not in b._sampled
    est = b.estimate(key, {API: 7}, 0)
    assert est.launches == {API: 7} and est.duty is None and est.error == 0.0 and est.basis == "counted"


def test_a_window_is_held_open_until_it_holds_two_complete_intervals(
    spinner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window due to close of a loop that makes exact calls is held open,
    STRETCH_S at a time, while BPF has fewer than MIN_INTERVALS complete
    intervals in it, up to MAX_ON_S: a window with one copy or none gives
    no launches per call of its own. A loop that makes no exact call is
    closed at its length: a longer window would see none either."""
    key = ProcessKey(spinner.pid, process_start_ticks(spinner.pid) * (1_000_000_000 // os.sysconf("SC_CLK_TCK")))
    cuda = FakeCuda(FakeMaps(per_read=0, traps=8))
    b = budget_on(cuda, monkeypatch)
    now = time.monotonic()
    first = _Span(_Reading(now - 0.1, 0, {API: 0}, 0), _Reading(now - 0.08, 0, {API: 400}, 8))  # 4 copies
    s = _Sampled(spinner.pid, 0.005, {API: 400}, _Reading(now, 0, {API: 400}, 8), now - 0.1, 0.02, on=True)
    s.windows = [first]
    due = now + bud.MIN_ON_S
    for intervals in range(bud.MIN_INTERVALS):
        cuda.launch_links.intervals = intervals
        assert b._held_open(key, s, due), intervals
        assert s.next_toggle == pytest.approx(due + bud.STRETCH_S)
    cuda.launch_links.intervals = bud.MIN_INTERVALS
    assert not b._held_open(key, s, due)
    cuda.launch_links.intervals = 0
    # long enough: closed as it is (a microsecond past MAX_ON_S: (t + 0.025) - t rounds below 0.025
    # for some clock readings, and a fresh-clone CI run drew one)
    assert not b._held_open(key, s, now + bud.MAX_ON_S + 1e-6)
    s.windows = [_Span(first.start, _Reading(now - 0.08, 0, {API: 400}, 0))]
    s.phase = _Reading(now, 0, {API: 400}, 0)
    cuda.maps.traps = 0
    assert not b._held_open(key, s, due)  # no exact call, in this window or before
    cuda.maps.traps = 2
    assert b._held_open(key, s, due)  # its first, in this one


# ---- a window's links (sensors/cuda/launches.py), on fake maps and links ----


@dataclass
class FakeMap:
    keys: set[int] = field(default_factory=set)

    def update(self, key: Any, value: Any) -> None:
        self.keys.add(key.value)

    def delete(self, key: Any) -> None:
        self.keys.discard(key.value)


@dataclass
class FakeObj:
    fails: bool
    made: list[Any] = field(default_factory=list)

    def attach_uprobe_multi(self, *args: Any, **kwargs: Any) -> Any:
        if self.fails:
            raise AttachError("gone")
        link = FakeLink()
        self.made.append(link)
        return link


@dataclass
class FakeLink:
    destroyed: bool = False

    def destroy(self) -> None:
        self.destroyed = True


def test_a_window_never_opens_without_its_links() -> None:
    """Opening a window whose launch link cannot be attached (the process
    or its library going) says so and opens no window: BPF would count the
    exact calls' intervals of a window whose launches no link counted, and
    the budget would take that for a loop with no launches. A link made to
    another of its libraries meanwhile goes again."""
    for fails in (False, True):
        window = FakeMap()
        maps = {name: FakeMap() for name in ("launch_own", "launch_linked", "launch_sampling")}
        obj = FakeObj(fails)
        links = LaunchLinks(obj, {**maps, "launch_window": window}, lambda: [], lambda fid: None)  # type: ignore[arg-type, dict-item]
        a, b = FileId(1, 1), FileId(1, 2)
        for fid in (a, b):
            links.targets[fid] = LaunchTarget(fid, "libcuda.so.1", (0x10,), (100,))
        links._procs[7] = _Own(start_ticks=1, libs={a, b}, on=False)
        assert links.set_on(7, True) is not fails
        assert (7 in window.keys) is not fails
        assert links.is_on(7) is not fails
    # The failing attach came second: none is left attached.
    obj = FakeObj(False)
    links = LaunchLinks(obj, {**maps, "launch_window": FakeMap()}, lambda: [], lambda fid: None)  # type: ignore[arg-type, dict-item]
    calls = iter([True, False])
    real = links._attach
    links._attach = lambda pid, t: real(pid, t) if next(calls) else None  # type: ignore[method-assign]
    for fid in (a, b):
        links.targets[fid] = LaunchTarget(fid, "libcuda.so.1", (0x10,), (100,))
    links._procs[7] = _Own(start_ticks=1, libs={a, b}, on=False)
    assert links.set_on(7, True) is False and not links.is_on(7)
    deadline = time.monotonic() + 5
    while not obj.made[0].destroyed and time.monotonic() < deadline:
        time.sleep(0.01)  # detached on a thread of its own
    assert len(obj.made) == 1 and obj.made[0].destroyed
