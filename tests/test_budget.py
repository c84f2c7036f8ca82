"""The overhead budget's extrapolation (runtime/budget.py), on numbers whose
truth is known: a sampled process's windows and gaps, as the kernel's counts
and BPF's complete intervals between exact calls would give them. The real
duty cycle on real uprobes is in test_overhead.py and test_detach.py."""

from __future__ import annotations

import pytest

from memtrace.runtime.budget import _Sampled, _Window

API = 100  # cuLaunchKernel


def test_a_gap_is_extrapolated_per_exact_call_from_complete_intervals() -> None:
    """A loop that launches 100 times per copy (two exact traps): a window
    saw 3 complete intervals of 100; a gap of 40 traps (20 copies) is 2,000
    launches, whatever the windows' edges cut."""
    s = _Sampled(1, 0.01, base={API: 5_000})
    s.windows.append(_Window({API: 350}, interval_launches=300, intervals=3, seconds=0.05))
    s.counted[API] = 350
    s.on, s.phase_traps, s.phase_start = False, 1_000, 10.0
    assert s.gap_estimate(traps_now=1_040, now=11.0) == {API: pytest.approx(2_000)}
    assert s.per_call is True
    # Reported: before sampling, the window, and the gap so far.
    assert s.report({API: 9_999_999}, traps_now=1_040, now=11.0) == {API: 5_000 + 350 + 2_000}


def test_a_process_with_no_exact_call_is_extrapolated_per_second() -> None:
    """No complete interval in any window: launches per second of window,
    over the gap's time (a floor for a loop the probes slow), and none after
    the process ended."""
    s = _Sampled(1, 0.01, base={})
    s.windows.append(_Window({API: 1_000}, interval_launches=0, intervals=0, seconds=0.5))
    s.on, s.phase_traps, s.phase_start = False, 0, 10.0
    assert s.gap_estimate(traps_now=0, now=12.0) == {API: pytest.approx(4_000)}
    assert s.per_call is False
    s.ended = 11.0
    assert s.gap_estimate(traps_now=0, now=20.0) == {API: pytest.approx(2_000)}


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
    s.windows.append(_Window({100: 300, 102: 100}, interval_launches=400, intervals=4, seconds=0.1))
    s.on, s.phase_traps = False, 0
    assert s.gap_estimate(traps_now=20, now=0.0) == {100: pytest.approx(750), 102: pytest.approx(250)}
