"""The overhead budget's extrapolation (runtime/budget.py), on numbers whose
truth is known: a sampled process's windows and gaps, as the kernel's counts
and BPF's complete intervals between exact calls would give them. The real
duty cycle on real uprobes is in test_overhead.py and test_detach.py."""

from __future__ import annotations

import pytest

from memtrace.runtime.budget import NEAR, _Sampled, _Window

API = 100  # cuLaunchKernel


def gap_from(s: _Sampled, traps: int, now: float) -> dict[int, int]:
    """What the current gap adds to the report (the report less the rest)."""
    s.on = False
    rest = {a: s.base.get(a, 0) + s.counted.get(a, 0) + s.estimated.get(a, 0.0) for a in s.counted}
    return {a: n - round(rest.get(a, 0)) for a, n in s.report({}, traps, now).items()}


def test_a_gap_is_extrapolated_per_exact_call_from_complete_intervals() -> None:
    """A loop that launches 100 times per copy (two exact traps): a window
    saw 3 complete intervals of 100; a gap of 40 traps (20 copies) is 2,000
    launches, whatever the windows' edges cut."""
    s = _Sampled(1, 0.01, base={API: 5_000})
    s.close_window(_Window({API: 350}, interval_launches=300, intervals=3, seconds=0.05))
    s.phase_traps, s.phase_start = 1_000, 10.0
    assert gap_from(s, traps=1_040, now=11.0) == {API: 2_000}
    assert s.per_call is True
    # Reported: before sampling, the window, and the gap so far.
    assert s.report({API: 9_999_999}, traps_now=1_040, now=11.0) == {API: 5_000 + 350 + 2_000}


def test_a_process_with_no_exact_call_is_extrapolated_per_second() -> None:
    """No complete interval in any window: launches per second of window,
    over the gap's time (a floor for a loop the probes slow), and none after
    the process ended."""
    s = _Sampled(1, 0.01, base={})
    s.close_window(_Window({API: 1_000}, interval_launches=0, intervals=0, seconds=0.5))
    s.phase_traps, s.phase_start = 0, 10.0
    assert gap_from(s, traps=0, now=12.0) == {API: 4_000}
    assert s.per_call is False
    s.ended = 11.0
    assert gap_from(s, traps=0, now=20.0) == {API: 2_000}


def test_an_open_window_counts_what_the_kernel_counted_since_it_opened() -> None:
    """In a window, launches are counted, not estimated: the kernel's count
    now less its count when the window opened, on top of what came before."""
    s = _Sampled(1, 0.5, base={API: 10})
    s.estimated[API] = 90.4
    s.on, s.phase_counts = True, {API: 50}
    assert s.report({API: 75}, traps_now=0, now=0.0) == {API: 10 + 90 + 25}


def test_launches_split_by_api_as_the_windows_saw_them() -> None:
    """Kernel and graph launches are extrapolated in the mix the windows counted."""
    s = _Sampled(1, 0.01, base={})
    s.close_window(_Window({100: 300, 102: 100}, interval_launches=400, intervals=4, seconds=0.1))
    s.phase_traps = 0
    assert gap_from(s, traps=20, now=0.0) == {100: 750, 102: 250}


def test_a_gap_is_extrapolated_from_the_windows_on_both_sides_of_it() -> None:
    """Launches in lumps: 41 between one pair of a step's four exact calls,
    none between the others. One window's complete intervals cut steps
    (37 intervals holding 369 launches: 9.97 a call, not 10.25); the gap
    before the next windows is re-extrapolated as they come, and settled
    once NEAR windows followed it."""
    s = _Sampled(1, 0.01, base={})
    s.close_window(_Window({API: 392}, interval_launches=369, intervals=37, seconds=0.025))
    s.phase_traps = 0
    s.gaps.append(s.current_gap(traps_now=8_000, now=0.0))  # 4,000 calls: 1,000 steps, 41,000 launches
    first = s.report({}, 8_000, 0.0)[API] - 392
    assert first == round(369 / 37 * 4_000)  # the first window alone: 2.7% low
    s.close_window(_Window({API: 410}, interval_launches=410, intervals=39, seconds=0.025))
    both = round(s.report({}, 8_000, 0.0)[API] - 392 - 410)
    assert both == round((369 + 410) / (37 + 39) * 4_000)  # 0.1% off
    for _ in range(NEAR - 1):
        s.close_window(_Window({API: 410}, interval_launches=410, intervals=40, seconds=0.025))
    assert s.gaps == [] and s.estimated[API] > 0  # settled


def test_a_lower_duty_ends_an_open_window_at_its_new_length() -> None:
    """First weighed during set-up (few launches: duty 0.7, a 3.5 s window),
    then the loop starts and the duty drops to 0.05: the window that opened
    at t=10 ends at 10 + 0.25 s, not 13.5 s; already past that, at once. A
    higher duty never lengthens a window, and a gap keeps its end."""
    s = _Sampled(1, 0.7, base={}, phase_start=10.0, next_toggle=13.5)
    s.retune(0.05, on_s=0.25)
    assert (s.duty, s.next_toggle) == (0.05, 10.25)
    s.retune(0.9, on_s=4.5)
    assert s.next_toggle == 10.25
    s = _Sampled(1, 0.5, base={}, phase_start=10.0, next_toggle=12.5)
    s.retune(0.01, on_s=0.02)
    assert s.next_toggle == 10.02  # in the past by the next toggle: it closes then
    gap = _Sampled(1, 0.5, base={}, on=False, phase_start=10.0, next_toggle=15.0)
    gap.retune(0.01, on_s=0.02)
    assert gap.next_toggle == 15.0


def test_the_windows_never_take_more_than_the_duty_once_the_first_has_closed() -> None:
    """Windows stretched for their intervals (1.4 s where the duty asked for
    0.45 s): each opens only once it, and every window before it, fit in the
    duty's share of the time since sampling began, so the share of time the
    launch probes were attached is at most the duty at every window's end
    after the first. A gap of window x (1/duty - 1) alone let the second
    window end at 0.164 of the time (duty 0.09): twice the budget a short
    job could see. The steady rhythm is that gap."""
    duty, w = 0.09, 1.4
    s = _Sampled(1, duty, base={}, phase_start=100.0, since=100.0)
    opened, ends = 100.0, []
    for _ in range(6):
        closed = opened + w
        s.close_window(_Window({API: 1_000}, interval_launches=1_000, intervals=64, seconds=w))
        ends.append((closed, s.on_seconds))
        nxt = s.next_window_at(closed, w)
        assert nxt - closed >= w * (1 / duty - 1) - 1e-9  # never a shorter gap than the steady one
        opened = nxt
    shares = [on / (end - 100.0) for end, on in ends]
    assert shares[0] == pytest.approx(1.0)
    assert all(sh <= duty + 1e-9 for sh in shares[1:]), shares
    assert abs(ends[-1][0] - ends[-2][0] - w / duty) < 1e-9  # then one window per w / duty seconds
    old_second_end = 100.0 + w / duty + w  # the old rule's second window
    assert 2 * w / (old_second_end - 100.0) > 1.8 * duty


def test_a_debt_from_a_set_up_at_a_higher_duty_never_holds_the_loops_windows_off() -> None:
    """A set-up weighed at duty 0.7 had 3.5 s of windows; then the loop
    drops it to 0.05 with 0.25 s windows. Paying that debt at once would
    put the next window 70 s off, and the loop's launches would be
    extrapolated from the set-up's windows all that while: the next window
    comes at most one window's worth of time past the steady gap (9.75 s,
    not 4.75 s), and the debt is paid a gap at a time."""
    s = _Sampled(1, 0.05, base={}, since=0.0, on_seconds=3.5 + 0.25)
    closed = 10.0
    nxt = s.next_window_at(closed, 0.25)
    assert nxt == pytest.approx(closed + 0.25 * (2 / 0.05 - 1))
    assert s.since + (s.on_seconds + 0.25) / s.duty > 70  # what the debt alone would have said
