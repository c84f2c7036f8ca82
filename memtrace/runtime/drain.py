"""How punctual the agent's drains are: the intervals between their starts.

A drain reads the rings and acts on control events (attaching new
libraries, continuing held processes). A late drain means a held process
stays stopped longer and the events ring fills, so the agent measures every
interval between the starts of consecutive drains and reports the worst.
While the events ring is quiet the drain thread puts drains off on purpose
(up to a few periods: runtime/agent.py, IDLE_STRETCH); an interval counts
without what was put off, so a gap is always the period plus lateness."""

from __future__ import annotations

import math
from dataclasses import dataclass

from memtrace.export.schema import Drain

# Gaps are counted in buckets of a quarter power of two (19% wide), from
# 1 us (bucket 0) to about 9 days: p99 to within a bucket, in constant memory.
_PER_OCTAVE = 4
_BUCKETS = 40 * _PER_OCTAVE
_FLOOR_S = 1e-6


@dataclass(frozen=True)
class DrainStats:
    """What the agent's drains did, for the JSON summary and the logs."""

    interval_seconds: float  # the period drains are scheduled at (0: no drain thread ran)
    drains: int  # drains started
    gap_max_seconds: float  # the worst interval between the starts of two consecutive drains (less any put-off)
    gap_p99_seconds: float  # the 99th percentile of those intervals (to within 19%)
    folds_deferred: int  # times the fold thread found the model busy (an export or a report) and waited for it
    reads_deferred: int  # drains that left the events ring unread because the pending events reached their bound
    pending_events_max: int  # the most events ever waiting for the model at once

    def as_dict(self) -> Drain:
        """As the summary's `agent.drain`."""
        return Drain(
            interval_seconds=self.interval_seconds,
            drains=self.drains,
            gap_max_seconds=self.gap_max_seconds,
            gap_p99_seconds=self.gap_p99_seconds,
            folds_deferred=self.folds_deferred,
            reads_deferred=self.reads_deferred,
            pending_events_max=self.pending_events_max,
        )


class DrainGaps:
    """The intervals between consecutive drain starts: their maximum, a
    log-bucketed histogram for quantiles, and the worst since the last
    `take_window_max` (the OTLP gauge's window). Not thread-safe: the
    caller serialises `started` (the agent does, under its drain lock)."""

    def __init__(self) -> None:
        self.count = 0  # drains started
        self.max = 0.0
        self.window_max = 0.0
        self._last: float | None = None
        self._buckets = [0] * _BUCKETS

    def started(self, now: float, put_off: float = 0.0) -> None:
        """A drain starts at `now` (time.monotonic seconds), `put_off`
        seconds later than its period on purpose (not counted as a gap)."""
        self.count += 1
        last, self._last = self._last, now
        if last is None:
            return
        gap = max(now - last - put_off, 0.0)
        self.max = max(self.max, gap)
        self.window_max = max(self.window_max, gap)
        i = 0 if gap <= _FLOOR_S else math.floor(math.log2(gap / _FLOOR_S) * _PER_OCTAVE)
        self._buckets[min(max(i, 0), _BUCKETS - 1)] += 1

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the q-th gap (at most the maximum)."""
        n = sum(self._buckets)
        if n == 0:
            return 0.0
        rank = max(1, math.ceil(q * n))
        seen = 0
        for i, c in enumerate(self._buckets):
            seen += c
            if seen >= rank:
                return min(_FLOOR_S * 2 ** ((i + 1) / _PER_OCTAVE), self.max)
        return self.max

    def take_window_max(self) -> float:
        """The worst gap since the previous call; starts a new window."""
        w, self.window_max = self.window_max, 0.0
        return w
