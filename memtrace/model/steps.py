"""Steps with no code change: each process's training or serving iteration,
inferred from the CUDA call stream of its threads.

Design
------
A training or serving loop ends each iteration by waiting for the GPU: a
stream or device synchronisation (PyTorch's `loss.item()`, a D2H copy of the
logits, an optimizer step that reads a scalar), or a synchronous copy. So,
as Ingero does, a step boundary is the *return* of the loop's periodic wait
(the "anchor"), per (process, thread): the thread that drives the GPU is the
one whose time we break down.

Choosing the anchor. Every wait on a thread has a symbol: (api, stream) for
a synchronisation, (api, direction) for a synchronous copy. For each symbol
the tracker keeps the return times and event numbers of its last RING
occurrences. A symbol is *regular* once it recurred MIN_OCCURRENCES times
and the spread (interquartile range over median, robust to warm-up steps
and to occasional extra waits) of its intervals in time is at most
MAX_SPREAD, or, where steps copy (more than two copies and waits between
two of its waits), that of its intervals in events is at most
MAX_EVENT_SPREAD (a loop makes the same calls every step; waits and copies
in random order spread about 0.67 in events, never under 0.25); waits at random times have a
spread of about 1.6.
Event counts keep a loop regular on a loaded machine, where preemption
makes its durations irregular. Among regular symbols the most frequent is the anchor:
a checkpoint or eval sync every K steps is regular too but K times rarer,
so it never wins; a sync made several times per step at uneven places is
frequent but irregular (short, short, long intervals), so it never wins
either. The choice is sticky: a loop does not change its wait symbol.

A synchronisation is also known by the copy that came before it: its
symbol qualified by the direction of the thread's last copy since its last
wait (none: no copy since). PyTorch's loop with pageable batches waits on
one stream three times a step (each pageable H2D `copy_` synchronises it,
then `loss.item()`; seen on the H200), so (api, stream) is irregular, but
the wait after the D2H copy is the step's end, once a step. Each wait
counts for its plain symbol and for its qualified one; the plain one wins
ties (it is never rarer), so loops that were found before are found alike.
Autocorrelation of the symbol sequence (Falcon) would also find periods in
event counts, but the sequence is dominated by copies and launches whose
numbers vary per step (variable-length batches); the wait cadence is cheaper
(only waits are looked at) and bounded.

Extra waits on the anchor's own symbol (a checkpoint or a logged
`.item()` that syncs the same stream every K steps) would split one step in
two. An interval too short to be a step closes none: its time joins the
next interval. Short is counted in events where steps copy (more than two
copies and waits in a typical step): an interval holding at most MERGE_BELOW
of a typical step's copies and waits (the median of the last RECENT). Event
counts do not stretch when the thread is preempted or the machine is
loaded, where durations do. In loops that make no copies (launches and the
wait only), short is in time: under MERGE_BELOW of a typical recent step
(the median, leaving out steps over twice it: warm-up). Either way, of the
two parts of a split step one is short (unless a checkpoint copies as much
as a step, or falls mid-step in a copy-less loop), so the count stays
right; only where the boundary lies moves.
A loop is one thread's: when other threads of the process wait on the
stepping thread's anchor (its api and stream) more than SHARED_ABOVE as
often as it does, the process has no steps. JAX is that: its runtime makes
a step's transfers and waits from a pool of threads, each for a stretch,
all on one stream (the recorded jax_train: 716 waits on it from 6
threads), and one thread's stretch of them is not the job's step.

Data-loader jitter changes step lengths, not the count: a long step is a
long step. Warm-up steps are steps (the first ones are slow; the median is
not moved by a few of them). A process with no recurring wait (a one-shot
script, fewer than MIN_OCCURRENCES waits of one symbol, or waits without
regularity) reports no steps, never made-up ones.

The first step: memtrace sees boundaries, so N waits make N - 1 steps; the
time before the first boundary is not a step (it holds the process's setup).

Breakdown of a step (the interval between two boundaries on the thread):
- copy: time inside copy calls (their entry-to-return durations);
- sync_wait: time inside synchronisation calls (the GPU was working, the
  thread waited for it);
- collective: time inside collectives (NCCL), from an optional array of
  events with the same fields (`collectives=`). The NCCL sensor is polled
  less often than the CUDA one, so collectives may come after the steps
  they fell in were closed: their time then moves from those steps' host
  share to their collective share (the totals are exact; the per-step
  durations, which do not depend on it, are unchanged);
- host: the rest, the thread's own work: on CPU, waiting for a CPU, or off
  CPU otherwise. A sched sensor (later) splits it: it will feed per-thread
  (ts, on_cpu_ns, run_queue_ns) records into the same windows; the field
  `host_ns` is the sum its three parts will make.

GPU idle (the GPU waiting for the host): after a wait returns, the stream or
device is empty until the thread gives it work again: its next copy or wait
entry, or its next launch. Launches are counted in the kernel, not sent as
events; the launch program keeps the time of each thread's first launch
since its last wait returned (a per-thread slot, no ring event), and the
thread's next wait carries it (the `src` field of a sync event). A
thread whose slot another shared at that moment falls back to the next copy
or wait entry, an upper bound. On the H200 the bound alone put a PyTorch
training loop's GPU 94% idle: its forward and backward launches fell
between a wait and the loss.item() copy.

Bounded state: per thread, RING return times per candidate symbol (until
the anchor is chosen), the events of the step in progress (at most
MAX_PENDING), RECENT step durations for the merge median, running sums and
an ExpHistogram of step durations. At most MAX_THREADS threads per process.
Until an anchor is chosen only the last MAX_SEARCH_PENDING events are kept
(a thread that never steps, the common case on a busy host, would
otherwise hold MAX_PENDING: 0.5 MB each, 500 MB at 1000 processes): steps
count from the first anchor wait among them, so a loop of more than
MAX_SEARCH_PENDING / MIN_OCCURRENCES copies and waits per step loses its
first few steps, not their durations.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import Family
from memtrace.core.histogram import ExpHistogram

RING = 64  # return times kept per candidate symbol
MIN_OCCURRENCES = 6  # waits of one symbol before it can be an anchor (5 intervals)
MAX_SPREAD = 0.75  # regular: interquartile range / median of the intervals at most this
MAX_EVENT_SPREAD = 0.2  # regular in events: a loop makes the same copies and waits every step
MAX_QUALIFIED_SPREAD = 0.5  # regular in time, for a qualified symbol (see _choose)
MERGE_BELOW = 0.5  # an interval with at most this share of a typical step's events (or time) closes no step
RECENT = 31  # steps whose durations and event counts make a typical step
MAX_PENDING = 16384  # events of the step in progress kept per thread
MAX_SEARCH_PENDING = 1024  # events kept per thread while no anchor is chosen
MAX_CHUNKS = 8  # pending chunks kept apart while searching, before they are joined
MAX_THREADS = 256  # threads tracked per process
MAX_SHARED = 4096  # (symbol, thread) wait counts kept per process
SHARED_ABOVE = 0.5  # other threads' waits on the anchor's stream past this share of the stepping thread's: no steps
FEED_EVENTS = 32  # a process's copies and waits are folded in chunks of at least this many (or when read)

_COPY, _SYNC, _COLL = 0, 1, 2
_NOT_A_WAIT = -1
_SYM_API_SHIFT = 48
_SYM_LOW = (1 << _SYM_API_SHIFT) - 1
# A wait's symbol: api << 48 | stream (or direction); bits 56-59 qualify a
# synchronisation by the copy before it (direction + 1, 0: none). An anchor
# with _ANY there matches its symbol whatever the qualifier.
_QUAL_SHIFT = 56
_QUAL_BITS = 0xF << _QUAL_SHIFT
_ANY = 0xF
assert max(a.id for a in apis.APIS) < 1 << (_QUAL_SHIFT - _SYM_API_SHIFT)

# Per-api: what the event is to the tracker (copy, sync or ignored) and whether it is a wait.
_KIND = np.full(1 << 16, 255, np.uint8)  # 255: not looked at (memory calls, launches)
_WAIT_COPY = np.zeros(1 << 16, bool)  # a synchronous copy: the host waits for it
for _a in apis.APIS:
    if _a.family == Family.COPY:
        _KIND[_a.id] = _COPY
        _WAIT_COPY[_a.id] = _a.synchronous
    elif _a.family == Family.SYNC:
        _KIND[_a.id] = _SYNC


@dataclass
class StepStats:
    """A thread's (or process's) steps so far."""

    tid: int = 0
    steps: int = 0
    step_ns: int = 0
    copy_ns: int = 0
    sync_ns: int = 0
    collective_ns: int = 0
    host_ns: int = 0
    gpu_idle_ns: int = 0
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds

    def share(self, ns: int) -> float:
        return ns / self.step_ns if self.step_ns else 0.0


class _Ring:
    """The last RING (return time, event number) pairs of one candidate
    symbol, oldest first, in one array: 1 KB, where a deque of tuples took
    about 8 KB (a thread that never steps keeps one per symbol it waits in)."""

    __slots__ = ("buf", "n")

    def __init__(self) -> None:
        self.buf = np.zeros((RING, 2), np.int64)
        self.n = 0

    def extend(self, ret: np.ndarray, at: np.ndarray) -> None:
        m = len(ret)
        if m >= RING:
            self.buf[:, 0], self.buf[:, 1] = ret[-RING:], at[-RING:]
            self.n = RING
            return
        keep = min(self.n, RING - m)
        self.buf[:keep] = self.buf[self.n - keep : self.n].copy()
        self.buf[keep : keep + m, 0], self.buf[keep : keep + m, 1] = ret, at
        self.n = keep + m

    def pairs(self) -> np.ndarray:
        return self.buf[: self.n]


# A batch of a thread's events, column by column: entry, return, kind,
# symbol, and launch (a synchronisation's first launch since the thread's
# last one, ns; 0: none or not a synchronisation).
_Cols = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_NCOLS = 5


class _Pending:
    """Events of the step in progress, in return order: chunks as they came
    (appending costs nothing), joined into one when the step closes."""

    def __init__(self) -> None:
        self.chunks: deque[_Cols] = deque()
        self.count = 0

    def extend(self, cols: _Cols) -> None:
        if len(cols[1]):
            self.chunks.append(cols)
            self.count += len(cols[1])

    def bound(self, most: int) -> None:
        """Forget the oldest chunks beyond `most` events; many small chunks
        are joined into one of the latest `most` (an array's own overhead is
        that of a few dozen events)."""
        while self.chunks and self.count - len(self.chunks[0][1]) >= most:
            self.count -= len(self.chunks.popleft()[1])
        if len(self.chunks) > MAX_CHUNKS:
            cols = self.joined()
            cut = max(0, len(cols[1]) - most)
            self.chunks = deque([_take(cols, slice(cut, None), copy=True)])
            self.count = len(cols[1]) - cut

    def joined(self) -> _Cols:
        """(entry, ret, kind, sym, launch) of every pending event, sorted by return."""
        if len(self.chunks) != 1:
            parts = list(zip(*self.chunks, strict=True)) if self.chunks else [[np.zeros(0, np.int64)]] * _NCOLS
            e, r, k, y, la = (np.concatenate(x) for x in parts)
            self.chunks = deque([(e, r, k.astype(np.uint8), y, la)])
        cols = self.chunks[0]
        r = cols[1]
        if len(r) > 1 and bool((np.diff(r) < 0).any()):  # a late sensor's events: sort by return
            cols = _take(cols, np.argsort(r, kind="stable"))
            self.chunks[0] = cols
        return cols

    def keep_from(self, i: int) -> None:
        cols = self.joined()
        self.chunks = deque([_take(cols, slice(i, None))])
        self.count = len(cols[1]) - i


def _take(cols: _Cols, at: slice | np.ndarray, copy: bool = False) -> _Cols:
    e, r, k, y, la = (c[at].copy() if copy else c[at] for c in cols)
    return e, r, k, y, la


class _Thread:
    def __init__(self, tid: int) -> None:
        self.stats = StepStats(tid=tid)
        self.pending = _Pending()
        self.anchor: int | None = None
        self.seen: dict[int, _Ring] = {}  # symbol -> its last (return time, event number)
        self.events = 0  # events seen (until an anchor)
        self.counts: dict[int, int] = {}  # symbol -> waits seen (until an anchor)
        self.waits = 0  # waits seen (until an anchor)
        self.next_choice = MIN_OCCURRENCES  # look for an anchor once this many waits were seen
        self.recent: deque[int] = deque(maxlen=RECENT)  # step durations, ns
        self.recent_events: deque[int] = deque(maxlen=RECENT)  # copies and waits per step
        self.boundary: int | None = None  # return time of the last boundary
        self.first_boundary: int | None = None  # where the first step began
        self.qual = 0  # the qualifier of a synchronisation now: the last copy since the last wait

    def qualify(self, kind: np.ndarray, sym: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """The symbols with each synchronisation qualified by the direction
        of this thread's last copy since its last wait (the thread's events
        come in order, batch after batch)."""
        n = len(sym)
        if n == 0:
            return sym
        idx = np.arange(n)
        wait = sym != _NOT_A_WAIT
        copy = (kind == _COPY) & ~wait
        last_copy = np.maximum.accumulate(np.where(copy, idx, -1))
        last_wait = np.maximum.accumulate(np.where(wait, idx, -1))
        wait_before = np.concatenate([[-1], last_wait[:-1]])
        q = np.where(last_copy > wait_before, direction[last_copy.clip(min=0)].astype(np.int64) + 1, 0)
        q[(last_copy < 0) & (wait_before < 0)] = self.qual  # nothing before it here: the last batch's state
        if last_wait[-1] >= last_copy[-1]:
            self.qual = 0 if last_wait[-1] >= 0 else self.qual
        else:
            self.qual = int(direction[last_copy[-1]]) + 1
        sync = kind == _SYNC
        out: np.ndarray = sym.copy()
        out[sync] |= q[sync] << _QUAL_SHIFT
        return out

    def _matches(self, sym: np.ndarray) -> np.ndarray:
        """Where the anchor's waits are."""
        assert self.anchor is not None
        if (self.anchor >> _QUAL_SHIFT) & 0xF == _ANY:
            return np.flatnonzero((sym & ~_QUAL_BITS) == (self.anchor & ~_QUAL_BITS))
        return np.flatnonzero(sym == self.anchor)

    def add(self, entry: np.ndarray, ret: np.ndarray, kind: np.ndarray, sym: np.ndarray, launch: np.ndarray) -> None:
        if self.boundary is not None and self.first_boundary is not None:
            # Collectives come from another sensor, polled less often: those that
            # returned inside steps already closed move their time from host there.
            late = (kind == _COLL) & (ret <= self.boundary)
            if late.any():
                inside = ret[late] - np.maximum(entry[late], self.first_boundary)
                moved = min(int(inside.clip(min=0).sum()), self.stats.host_ns)
                self.stats.collective_ns += moved
                self.stats.host_ns -= moved
                keep = ~late
                entry, ret, kind, sym, launch = entry[keep], ret[keep], kind[keep], sym[keep], launch[keep]
        self.pending.extend((entry, ret, kind, sym, launch))
        if self.anchor is None:
            waits = np.flatnonzero(sym != _NOT_A_WAIT)
            # Events are numbered among copies and waits alone: collectives come
            # late or on time (another sensor), and must not change the numbers.
            number = np.cumsum(kind != _COLL) - 1
            w_sym, w_ret, w_at = sym[waits], ret[waits], number[waits] + self.events
            w_any = (w_sym & ~_QUAL_BITS) | (_ANY << _QUAL_SHIFT)
            for by in (w_any, w_sym):  # each wait counts for its plain symbol and its qualified one
                for s in np.unique(by).tolist():
                    if by is w_sym and s == (s & ~_QUAL_BITS):
                        continue  # not qualified: the same waits as its plain symbol
                    mine = by == s
                    q = self.seen.get(s)
                    if q is None:
                        q = self.seen[s] = _Ring()
                    q.extend(w_ret[mine], w_at[mine])
                    self.counts[s] = self.counts.get(s, 0) + int(np.count_nonzero(mine))
            self.events += int(number[-1]) + 1 if len(number) else 0
            self.waits += len(waits)
            if self.waits >= self.next_choice:
                # Looked at again after a share of the waits seen so far (at most a
                # ring's worth): a thread that waits at random costs a bounded,
                # shrinking amount, and a loop is found within a few steps.
                self.next_choice = self.waits + min(RING, max(1, self.waits // 8))
                self.anchor = self._choose()
            if self.anchor is None:
                self.pending.bound(MAX_SEARCH_PENDING)
                return
            _e, p_ret, p_kind, p_sym, _la = self.pending.joined()
            at = self._matches(p_sym)
            self.recent.extend(np.diff(p_ret[at]).tolist())
            self.recent_events.extend(np.diff(np.cumsum(p_kind != _COLL)[at]).tolist())
            self.seen.clear()
            self.counts.clear()
        self._close_steps()

    def _choose(self) -> int | None:
        """The anchor: the most frequent regular wait symbol, by its rate
        over its last RING waits (a symbol's whole count would also weigh
        the setup's waits: PyTorch's weight uploads are H2D copies, each
        waited for). Symbols within 10% of the highest rate are one step's
        waits counted alike: a plain symbol first, then the most regular.

        A qualified symbol must be more regular in time than a plain one:
        the waits that follow a copy, in a random stream of waits and
        copies, are never two events apart, and their spread is about 1.0
        (under 0.75 in 5% of samples of 64; never under 0.55 in 3000), not
        the 1.6 of waits at random."""
        regular: list[tuple[float, bool, float, int]] = []  # rate, plain, -spread, symbol
        for s, q in self.seen.items():
            if q.n < MIN_OCCURRENCES:
                continue
            times, at = q.pairs().astype(np.float64).T
            spread = _spread(np.diff(times))
            between = np.diff(at)  # copies and waits from one to the next
            if _quantile(np.sort(between), 0.5) > 2 and (ev := _spread(between)) <= MAX_EVENT_SPREAD:
                spread = min(spread, ev)
            plain = (s >> _QUAL_SHIFT) & 0xF == _ANY
            if spread > (MAX_SPREAD if plain else MAX_QUALIFIED_SPREAD):
                continue
            rate = (len(times) - 1) / max(times[-1] - times[0], 1.0)
            regular.append((rate, plain, -spread, s))
        if not regular:
            return None
        most = max(r[0] for r in regular)
        return max((r for r in regular if r[0] >= 0.9 * most), key=lambda r: r[1:3])[3]

    def _close_steps(self) -> None:
        p = self.pending
        entry, ret, kind, sym, launch = p.joined()
        at = self._matches(sym)
        counted = np.cumsum(kind != _COLL)  # copies and waits up to each event (collectives not counted)
        start = 0  # events before `start` belong to closed steps
        bounds: list[int] = []  # boundaries closed by this batch, after self.boundary
        ends: list[int] = []  # their event index + 1
        lo, first = self.boundary, 0  # where the first step closed here starts: time, event index
        before = 0  # copies and waits before `start`
        if self.boundary is not None and len(at) and self._none_short(ret[at], counted[at]):
            bounds, ends = ret[at].tolist(), (at + 1).tolist()
            self.boundary, start = bounds[-1], ends[-1]
            at = at[:0]  # every boundary taken: the loop below has none left to weigh
        for i, b, c in zip(at.tolist(), ret[at].tolist(), counted[at].tolist(), strict=True):
            if self.boundary is None:  # the first boundary: what came before is no step
                self.boundary, start, lo, first, before = b, i + 1, b, i + 1, c
                self.first_boundary = b
                continue
            d, n = b - self.boundary, c - before
            if self._short(d, n):
                continue  # an extra wait of the anchor's symbol: its time joins the next interval
            bounds.append(b)
            ends.append(i + 1)
            self.recent.append(d)
            self.recent_events.append(n)
            self.boundary, start, before = b, i + 1, c
        if bounds:
            assert lo is not None
            e = ends[-1]
            self._steps(
                lo, bounds, [x - first for x in ends], entry[first:e], ret[first:e], kind[first:e], launch[first:e]
            )
        p.keep_from(start)
        if p.count > MAX_PENDING:  # no boundary for a long time: keep the latest events
            p.keep_from(p.count - MAX_PENDING)

    def _none_short(self, b: np.ndarray, c: np.ndarray) -> bool:
        """The loop's common case at once, when steps copy: would _short
        find none of these anchor waits (returns `b`, copies and waits so
        far `c`) short, each weighed against the steps before it as the loop
        appends them? Then every one is a boundary, and the intervals are
        appended here. False (nothing changed) where the loop must weigh
        them one by one: a window not yet full, a copy-less loop (short is
        in time), or any of them short. Exactly the loop's judgement: the
        windows' medians are the same numbers statistics.median gives."""
        if len(self.recent_events) < RECENT:
            return False
        n = np.diff(c, prepend=0)
        window = np.concatenate([np.asarray(self.recent_events, np.int64), n[:-1]])
        # Every window's median lies between the windows' least and greatest
        # count: when those already settle both questions (a steady loop, its
        # steps alike), the medians need not be taken. Otherwise they are.
        low, high = int(window.min()), int(window.max())
        if not (low > 2 and int(n.min()) > MERGE_BELOW * high):
            typical = np.median(np.lib.stride_tricks.sliding_window_view(window, RECENT), axis=1)
            if not bool((typical > 2).all()) or bool((n <= MERGE_BELOW * typical).any()):
                return False
        assert self.boundary is not None
        self.recent.extend(np.diff(b, prepend=self.boundary).tolist())
        self.recent_events.extend(n.tolist())
        return True

    def _short(self, d: int, n: int) -> bool:
        """Too short to be a step: d ns holding n copies and waits."""
        if self.recent_events:
            typical = statistics.median(self.recent_events)
            if typical > 2:  # steps that copy: count events, which a preempted thread does not stretch
                return n <= MERGE_BELOW * typical
        return bool(self.recent) and d < MERGE_BELOW * _typical(self.recent)

    def _steps(
        self,
        lo: int,
        bounds: list[int],
        ends: list[int],
        entry: np.ndarray,
        ret: np.ndarray,
        kind: np.ndarray,
        launch: np.ndarray,
    ) -> None:
        """Account the steps (lo, bounds[0]], (bounds[0], bounds[1]], ...: step k
        is made of events ends[k-1]..ends[k]-1 (from 0 for the first), all at once."""
        n = len(bounds)
        hi = np.asarray(bounds, np.int64)
        lows = np.concatenate([np.array([lo], np.int64), hi[:-1]])
        sizes = np.diff(np.asarray([0, *ends]))
        step = np.repeat(np.arange(n), sizes)  # each event's step
        inside = (ret - np.maximum(entry, lows[step])).astype(np.float64)  # time in each call, within its step
        copy = np.bincount(step, inside * (kind == _COPY), n)
        sync = np.bincount(step, inside * (kind == _SYNC), n)
        coll = np.bincount(step, inside * (kind == _COLL), n)
        spans = hi - lows
        # GPU idle: from each step's start and each wait's return in it to the
        # next work given the GPU: a copy or wait entry, or a launch (each
        # synchronisation says when the thread first launched since its last).
        work = np.sort(np.concatenate([entry[(kind == _COPY) | (kind == _SYNC)], launch[launch > 0]]))
        w = (kind == _SYNC) & (ret < hi[step])
        starts = np.concatenate([lows, ret[w]])
        owner = np.concatenate([np.arange(n), step[w]])
        k = np.searchsorted(work, starts, side="left")
        has = k < len(work)
        gap = np.zeros(len(starts), np.float64)
        gap[has] = np.minimum(work[k[has]], hi[owner[has]]) - starts[has]
        st = self.stats
        st.steps += n
        st.step_ns += int(spans.sum())
        st.copy_ns += int(copy.sum())
        st.sync_ns += int(sync.sum())
        st.collective_ns += int(coll.sum())
        st.host_ns += int(np.maximum(spans - copy - sync - coll, 0).sum())
        st.gpu_idle_ns += int(gap.clip(min=0).sum())
        st.durations.add(spans * 1e-9)


def _typical(d: deque[int]) -> float:
    """A typical step: the median of the durations no longer than twice the
    median, so that slow warm-up steps do not make real steps look short."""
    m = statistics.median(d)
    return float(statistics.median([x for x in d if x <= 2 * m]))


def _quantile(s: np.ndarray, q: float) -> float:
    """The q-quantile of sorted values, interpolated as numpy's default
    (linear) percentile does, without its per-call overhead (this runs for
    every candidate wait of every thread)."""
    i = q * (len(s) - 1)
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (i - lo))


def _spread(d: np.ndarray) -> float:
    """Interquartile range over median: 0 for a metronome, about 1.6 for
    waits at random (a Poisson stream), unmoved by a few warm-up steps."""
    if len(d) == 0:
        return math.inf
    s = np.sort(d)
    q50 = _quantile(s, 0.5)
    return (_quantile(s, 0.75) - _quantile(s, 0.25)) / q50 if q50 > 0 else math.inf


class StepTracker:
    """One process's steps, fed its events batch by batch (bounded state).

    A drain brings each process a few events (at 1000 processes, one or two
    each every 5 ms), and the tracker's fixed cost per batch was most of the
    agent's: so a process's events are gathered until FEED_EVENTS of them
    wait, and folded then, or when the steps are read (`stats()`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads: dict[int, _Thread] = {}
        self.waits: dict[tuple[int, int], int] = {}  # (plain symbol, tid) -> synchronisations
        self._waiting: list[np.ndarray] = []
        self._waiting_events = 0

    def add(self, batch: np.ndarray, collectives: np.ndarray | None = None) -> None:
        """Fold a batch of this process's mt_event records (EVENT_DTYPE), and
        optionally its collectives (an array with ts_ns, duration_ns and tid)."""
        batch = batch[_KIND[batch["api"]] != 255]  # copies and waits only
        if collectives is None or len(collectives) == 0:
            if len(batch):
                self._waiting.append(batch)
                self._waiting_events += len(batch)
            if self._waiting_events >= FEED_EVENTS:
                self.flush()
            return
        self.flush()
        self._add(batch, collectives)

    def flush(self) -> None:
        """Fold the events gathered so far."""
        if self._waiting:
            b = self._waiting[0] if len(self._waiting) == 1 else np.concatenate(self._waiting)
            self._waiting.clear()
            self._waiting_events = 0
            self._add(b, None)

    def _add(self, batch: np.ndarray, collectives: np.ndarray | None) -> None:
        """Fold copies and waits (add() has left the rest out of `batch`)."""
        b, kind = batch, _KIND[batch["api"]]
        entry = b["ts_ns"].astype(np.int64)
        ret = entry + b["duration_ns"].astype(np.int64)
        api = b["api"].astype(np.int64)
        sym = np.full(len(b), _NOT_A_WAIT, np.int64)
        is_sync = kind == _SYNC
        sym[is_sync] = api[is_sync] << _SYM_API_SHIFT | (b["stream"][is_sync] & np.uint64(_SYM_LOW)).astype(np.int64)
        wcopy = _WAIT_COPY[b["api"]]
        sym[wcopy] = api[wcopy] << _SYM_API_SHIFT | b["direction"][wcopy].astype(np.int64)
        tids = b["tid"]
        direction = b["direction"].astype(np.int64)
        launch = np.where(is_sync, b["src"], 0).astype(np.int64)  # BPF: the first launch since the last wait
        if collectives is not None and len(collectives):
            c = collectives
            c_entry = c["ts_ns"].astype(np.int64)
            entry = np.concatenate([entry, c_entry])
            ret = np.concatenate([ret, c_entry + c["duration_ns"].astype(np.int64)])
            kind = np.concatenate([kind, np.full(len(c), _COLL, np.uint8)])
            sym = np.concatenate([sym, np.full(len(c), _NOT_A_WAIT, np.int64)])
            tids = np.concatenate([tids, c["tid"]])
            direction = np.concatenate([direction, np.zeros(len(c), np.int64)])
            launch = np.concatenate([launch, np.zeros(len(c), np.int64)])
        if len(tids) == 0:
            return
        parts: list[tuple[int, slice | np.ndarray]]
        if tids[0] == tids[-1] and bool((tids == tids[0]).all()):  # one calling thread, the common case
            parts = [(int(tids[0]), slice(None))]
        else:
            order = np.argsort(tids, kind="stable")  # each thread's events stay in ring order
            uniq, starts = np.unique(tids[order], return_index=True)
            ends = np.append(starts[1:], len(tids))
            parts = [(t, order[s:e]) for t, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist(), strict=True)]
        for tid, o in parts:
            t = self.threads.get(tid)
            if t is None:
                if len(self.threads) >= MAX_THREADS:
                    continue
                t = self.threads[tid] = _Thread(tid)
            syncs = sym[o][kind[o] == _SYNC]
            if len(syncs):
                for y, n in zip(*np.unique(syncs, return_counts=True), strict=True):
                    k = (int(y), tid)
                    if k in self.waits or len(self.waits) < MAX_SHARED:
                        self.waits[k] = self.waits.get(k, 0) + int(n)
            t.add(entry[o], ret[o], kind[o], t.qualify(kind[o], sym[o], direction[o]), launch[o])

    def stats(self) -> StepStats | None:
        """The process's steps: those of its stepping thread (the one with
        the most steps), None while it has none, or when other threads
        share its anchor's waits (the step is no one thread's)."""
        self.flush()
        t = max(self.threads.values(), key=lambda t: t.stats.steps, default=None)
        if t is None or not t.stats.steps or t.anchor is None:
            return None
        plain = t.anchor & ~_QUAL_BITS
        own = others = 0
        for (y, tid), n in self.waits.items():
            if y == plain:
                if tid == t.stats.tid:
                    own += n
                else:
                    others += n
        return None if others > SHARED_ABOVE * own else t.stats


def feed(trackers: dict[int, StepTracker], batch: np.ndarray, collectives: np.ndarray | None = None) -> None:
    """Split a batch (any processes) by pid and feed each process's tracker."""
    if len(batch) == 0 and (collectives is None or len(collectives) == 0):
        return
    pids = np.union1d(batch["pid"], collectives["pid"] if collectives is not None else np.zeros(0, np.uint32))
    for pid in pids.tolist():
        t = trackers.get(pid)
        if t is None:
            t = trackers[pid] = StepTracker(pid)
        b = batch if len(pids) == 1 else batch[batch["pid"] == pid]
        c = None if collectives is None else collectives[collectives["pid"] == pid]
        t.add(b, c)
