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
right; only where the boundary lies moves. The median and the typical
step are read from the window kept sorted (_Window), not computed at each
anchor wait: that was the agent's hot spot.

Counting short in events fails where a step makes few copies: a loop that
copies one batch in, reads its loss (a D2H copy and a wait) and, every N
steps, logs (another small D2H and a wait on the same stream) makes a log
interval of two events in a step of three, not short, so every Nth step
was split in two (10% over at N = 10). What tells them apart is the input:
a loop that copies its input (H2D) in at least INPUT_SHARE of its anchor's
intervals is *gated*: an anchor wait with no input copy since the last
boundary ends no step, whatever its length (a log, a checkpoint's
tensors, a scalar read twice a step). If DRY_RUN step-long intervals in a
row bring no input, the loop stopped copying it, and the gate is lifted.
A loop is one thread's: when other threads of the process wait on the
stepping thread's anchor (its api and stream) more than SHARED_ABOVE as
often as it does, no one thread's steps are the process's. JAX is that:
its runtime makes a step's transfers and waits from a pool of threads,
each for a stretch, all on one stream (the recorded jax_train: 716 waits
on it from 6 threads). Once two threads wait on one symbol, the process's
threads are also followed as one (tid 0, events in return order); their
steps are the process's only where that loop is gated (each step copies
its input), never a pool's waits taken as steps on their own.

Data-loader jitter changes step lengths, not the count: a long step is a
long step. Warm-up steps are steps (the first ones are slow; the median is
not moved by a few of them). A process with no recurring wait (a one-shot
script, fewer than MIN_OCCURRENCES waits of one symbol, or waits without
regularity) reports no steps, never made-up ones.

The first step: memtrace sees boundaries, so N waits make N - 1 steps; the
time before the first boundary is not a step (it holds the process's setup).
Where the loop begins is decided once more than RECENT of the anchor's
waits are held (_settle): the first that a step's worth of copies and waits
came before. Setup waits of the same symbol (weight uploads, each waited
for) are no steps, however few events each poll brings; until then the
steps read are those a copy decided now would have.

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
  CPU otherwise. Not split here: the sched sensor's per-process run-queue
  and off-CPU time (model/host.py) are read beside the steps by the
  diagnosis, per window, not per step.

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
an ExpHistogram of step durations, at most MAX_WORK classes of work and
MAX_OUTPUTS amounts read back. At most MAX_THREADS threads per process.
Until an anchor is chosen only the last MAX_SEARCH_PENDING events are kept
(a thread that never steps, the common case on a busy host, would
otherwise hold MAX_PENDING: 0.5 MB each, 500 MB at 1000 processes): steps
count from the first anchor wait among them, so a loop of more than
MAX_SEARCH_PENDING / MIN_OCCURRENCES copies and waits per step loses its
first few steps, not their durations.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import enum
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import Direction, Family
from memtrace.core.arrays import unique_inverse
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
INPUT_SHARE = 1 / 3  # the loop copies its input in at least this share of its anchor's intervals: a step needs one
DRY_RUN = 8  # anchor intervals in a row, each at least half a step long, with no input: the loop stopped copying it
SERVING_BELOW = 0.5  # fewer of the steps than this read back their most common number of bytes: a server
MAX_OUTPUTS = 64  # distinct amounts read back counted per thread
REPLY_SHARE = 0.01  # a step that reads back at least this share of the bytes it copies in replies (a result, no loss)
IDLE_AFTER = 4  # a step whose first call came this many times later than in a typical one (the last RING's median) ...
IDLE_SHARE = 1 / 32  # ... for at least this share of the steps after the first RECENT, ...
IDLE_ABOVE = 0.1  # ... which spent at least this share of their time before their first calls: the thread idles
ONE_WORK = 0.9  # ... unless a rank in collectives moved one class of work in this share of its steps
# A loop that never idles (a server saturated from its start, or paced by its link) is a server where
# most of its steps reply, it makes no collectives, and its work spans WIDE_WORK octaves or more between
# classes of COMMON_WORK of its steps or more, each: a load's batches, prefills and decodes. A training
# loop's batches of varying length span less than an octave (steps +-40%).
WIDE_WORK = 2
COMMON_WORK = 0.05
MAX_WORK = 64  # classes of work (bytes in and out) kept per thread; more join OTHER_WORK
MAX_COPY_SIZES = 64  # (direction, size class) of copies kept per thread; more are not counted by size
WORK_CLASSES_PER_OCTAVE = 4
OTHER_WORK = (-1, -1)

_COPY, _SYNC, _COLL = 0, 1, 2
_NOT_A_WAIT = -1
_NO_DIRECTION = -1
_H2D, _D2H = int(Direction.H2D), int(Direction.D2H)
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


class Loop(enum.Enum):
    """What a thread's steps are: a training loop's, each reading back the
    same few bytes (its loss), or a server's iterations, each reading back
    what its batch made, as many bytes as its load brought."""

    TRAINING = "training"
    SERVING = "serving"


@dataclass
class WorkStats:
    """The steps of one class of work: bytes in and out, each within a
    quarter of an octave (WORK_CLASSES_PER_OCTAVE)."""

    steps: int = 0
    step_ns: int = 0
    busy_ns: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass
class CopySizeStats:
    """The copies of one direction and size class (bytes within a quarter
    octave: work_class's) made in steps: their time, call by call, at equal
    size, so that a link's slowdown shows whatever the load's sizes are."""

    calls: int = 0
    bytes: int = 0
    ns: int = 0  # inside the calls, entry to return


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
    bytes_in: int = 0  # H2D bytes copied in the steps
    bytes_out: int = 0  # D2H bytes
    busy_ns: int = 0  # each step from its first call (a copy, a wait or a launch) to its end: not the wait before it
    work: dict[tuple[int, int], WorkStats] = field(default_factory=dict)  # by class of work (work_class)
    copies: dict[tuple[int, int], CopySizeStats] = field(default_factory=dict)  # by (direction, size class)
    outputs: dict[int, int] = field(default_factory=dict)  # bytes read back in a step -> steps (MAX_OUTPUTS amounts)
    replies: int = 0  # steps that copied in and read back at least REPLY_SHARE of it
    # After the first RECENT steps (warm-up): steps, their time, the time before their first calls,
    # and how many began IDLE_AFTER times later than a typical one; the last RING's time before.
    judged: int = 0
    judged_ns: int = 0
    lead_ns: int = 0
    late: int = 0
    leads: deque[int] = field(default_factory=lambda: deque(maxlen=RING))
    served: bool = False  # found serving once: a server stays one (note_loop)

    @property
    def loop(self) -> Loop:
        """Serving where the steps read back varying amounts (fewer than
        SERVING_BELOW of them the most common one: each batch's results
        grow with its load), or where most reply (read back REPLY_SHARE of
        what they copied in: a result, not a loss) and the thread idles
        before some, at random (after warm-up, at least IDLE_SHARE of the
        steps had their first call IDLE_AFTER times later than a typical
        one, and the time before first calls was IDLE_ABOVE of the steps'
        or more), unless it spends time in collectives and its work does
        not vary (ONE_WORK of the steps in one class of work: a
        data-parallel rank waiting at random for its peers' exchange moves
        one batch's bytes a step). Serving too where most steps reply, with
        no collectives, and their work spans WIDE_WORK octaves (_wide), idle
        or not: a server busy from its start (saturated, or paced by its
        link) never idles, and an LLM server's full decodes read back one
        amount (the zoo's LLM server sending its replies over a shaped link
        was judged a training loop, and a flood on its link named input
        starvation). Training otherwise, and until RECENT steps were seen.
        Once serving, always: a server saturated for a while (every batch
        full, no idle) reads back one amount each iteration and idles
        never, as a training loop does; it is still a server, and its
        diagnosis baseline (in units of work) was thrown away at each
        flip (the zoo's LLM server under a CPU quota: 4x slower, judged as
        a training loop whose baseline was the slowed steps)."""
        return Loop.SERVING if self.served or self._serving() else Loop.TRAINING

    def note_loop(self) -> None:
        """Keep that the steps were found a server's (after each batch of steps closed)."""
        self.served = self.served or self._serving()

    def _serving(self) -> bool:
        if self.steps < RECENT or not self.outputs:
            return False
        if max(self.outputs.values()) < SERVING_BELOW * self.steps:
            return True
        idle = (
            self.judged >= RECENT
            and self.lead_ns >= IDLE_ABOVE * self.judged_ns
            and self.late >= IDLE_SHARE * self.judged
        )
        # A data-parallel rank waits before its first calls too, at random (for its peers' exchange on
        # a busy link), and reads back its loss; but it spends time in collectives, and each of its
        # steps moves one batch's bytes. A server's batches follow its load (one that serves one
        # request at a time, at a low load, moves one size too: without collectives it is one).
        varied = bool(self.work) and max(w.steps for w in self.work.values()) < ONE_WORK * self.steps
        replying = self.replies >= self.steps / 2
        if replying and not self.collective_ns and self._wide():
            return True  # busy from its start (saturated, or paced by its link): never idle, still a server
        return idle and (varied or not self.collective_ns) and replying

    def _wide(self) -> bool:
        """The steps' work spans WIDE_WORK octaves or more, in bytes in or out, between classes
        each holding COMMON_WORK of the steps or more (no class holds ONE_WORK of them)."""
        common = [wk for wk, w in self.work.items() if wk != OTHER_WORK and w.steps >= COMMON_WORK * self.steps]
        if not common or max(self.work[wk].steps for wk in common) >= ONE_WORK * self.steps:
            return False
        span = WIDE_WORK * WORK_CLASSES_PER_OCTAVE
        return any(max(wk[d] for wk in common) - min(wk[d] for wk in common) >= span for d in (0, 1))

    def share(self, ns: int) -> float:
        return ns / self.step_ns if self.step_ns else 0.0


def work_class(bytes_in: int, bytes_out: int) -> tuple[int, int]:
    """The class of a step's work: each amount of bytes by its quarter octave
    (0: none), so that two steps of one class moved within 19% of each other."""
    return int(_quarter_octave(np.array([bytes_in]))[0]), int(_quarter_octave(np.array([bytes_out]))[0])


def _quarter_octave(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    q = np.floor(np.log2(np.maximum(x, 1.0)) * WORK_CLASSES_PER_OCTAVE) + 1
    return np.where(x > 0, q, 0).astype(np.int64)


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
# symbol, launch (a synchronisation's first launch since the thread's last
# one, ns; 0: none or not a synchronisation), a copy's direction
# (_NO_DIRECTION: not a copy) and the bytes it moved.
_Cols = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_NCOLS = 7
_DTYPES = (np.int64, np.int64, np.uint8, np.int64, np.int64, np.int8, np.int64)


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
        """Every pending event's columns, sorted by return."""
        if len(self.chunks) != 1:
            if self.chunks:
                parts = list(zip(*self.chunks, strict=True))
                joined = tuple(np.concatenate(x).astype(d, copy=False) for x, d in zip(parts, _DTYPES, strict=True))
            else:
                joined = tuple(np.zeros(0, d) for d in _DTYPES)
            self.chunks = deque([joined])  # type: ignore[list-item]
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
    return tuple(c[at].copy() if copy else c[at] for c in cols)  # type: ignore[return-value]


def _gated(inputs: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Of the anchor waits `at`, those that end a step by the input rule:
    the first, then each one with an input copy since the one before it
    (`inputs`: input copies up to each event). Waits with none between them
    join one step, so "since the one before" is "since the last kept"."""
    if len(at) == 0:
        return at
    fed = np.concatenate([[True], np.diff(inputs[at]) > 0])
    kept: np.ndarray = at[fed]
    return kept


class _Thread:
    def __init__(self, tid: int) -> None:
        self.stats = StepStats(tid=tid)
        self.pending = _Pending()
        self.anchor: int | None = None
        self.gated = False  # a step needs an input copy (H2D): the loop copies its input every step
        self.settled = False  # where the loop begins is decided (_settle): steps are closed
        self.seen: dict[int, _Ring] = {}  # symbol -> its last (return time, event number)
        self.events = 0  # events seen (until an anchor)
        self.counts: dict[int, int] = {}  # symbol -> waits seen (until an anchor)
        self.waits = 0  # waits seen (until an anchor)
        self.next_choice = MIN_OCCURRENCES  # look for an anchor once this many waits were seen
        self.recent = _Window()  # step durations, ns
        self.recent_events = _Window()  # copies and waits per step
        self.boundary: int | None = None  # return time of the last boundary
        self.first_boundary: int | None = None  # where the first step began
        self.qual = 0  # the qualifier of a synchronisation now: the last copy since the last wait

    def take_over(self, other: _Thread) -> None:
        """Continue another thread's loop from where it is: its anchor, its
        steps so far and what a typical one is (the thread stays as it was)."""
        st = other.stats
        self.stats = dataclasses.replace(
            st,
            tid=self.stats.tid,
            durations=st.durations.copy(),
            work={k: dataclasses.replace(w) for k, w in st.work.items()},
            copies={k: dataclasses.replace(c) for k, c in st.copies.items()},
            outputs=dict(st.outputs),
            leads=deque(st.leads, maxlen=RING),
        )
        self.anchor, self.gated, self.settled = other.anchor, other.gated, other.settled
        self.recent.extend(other.recent)
        self.recent_events.extend(other.recent_events)
        self.boundary, self.first_boundary = other.boundary, other.first_boundary

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

    def add(self, cols: _Cols) -> None:
        entry, ret, kind, sym = cols[0], cols[1], cols[2], cols[3]
        if self.boundary is not None and self.first_boundary is not None:
            # Collectives come from another sensor, polled less often: those that
            # returned inside steps already closed move their time from host there.
            late = (kind == _COLL) & (ret <= self.boundary)
            if late.any():
                inside = ret[late] - np.maximum(entry[late], self.first_boundary)
                moved = min(int(inside.clip(min=0).sum()), self.stats.host_ns)
                self.stats.collective_ns += moved
                self.stats.host_ns -= moved
                cols = _take(cols, ~late)
                entry, ret, kind, sym = cols[0], cols[1], cols[2], cols[3]
        self.pending.extend(cols)
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
            self.seen.clear()
            self.counts.clear()
        if not self.settled and not self._settle(force=False):
            return  # the loop's start is not known yet: its events are held
        self._close_steps()

    def _settle(self, force: bool) -> bool:
        """Decide where the loop begins, once the events held since the
        anchor was chosen hold more than RECENT of its waits (or MAX_PENDING
        / 2 events; at once when `force`): whether steps need an input copy
        (gated), and the first boundary: the first anchor wait that a step's
        worth of copies and waits came before (more than MERGE_BELOW of the
        median of the last RECENT intervals), where steps copy. The waits
        before it were the setup's (PyTorch's weight uploads, each an H2D
        copy waited for): an anchor chosen among them, as events come a few
        at a time, would make each a step. False: not yet."""
        _e, p_ret, p_kind, p_sym, _la, p_dir, _nb = self.pending.joined()
        at = self._matches(p_sym)
        if not force and len(at) <= RECENT and self.pending.count < MAX_PENDING // 2:
            return False
        inputs = np.cumsum((p_kind == _COPY) & (p_dir == _H2D))
        fed = np.diff(inputs[at]) > 0  # the anchor's intervals that copied input
        self.gated = len(fed) > 0 and float(fed.mean()) >= INPUT_SHARE
        if self.gated:
            at = _gated(inputs, at)
        counted = np.cumsum(p_kind != _COLL)
        n, d = np.diff(counted[at]), np.diff(p_ret[at])
        if len(n) and (typical := float(np.median(n[-RECENT:]))) > 2:
            first = int(np.argmax(np.diff(counted[at], prepend=0) > MERGE_BELOW * typical))
            if first:
                self.pending.keep_from(int(at[first]))
                n, d = n[first:], d[first:]
        self.recent.extend(d.tolist())
        self.recent_events.extend(n.tolist())
        self.settled = True
        return True

    def view(self) -> _Thread:
        """The thread; while the loop's start is not decided, a copy that
        decided it now and closed its steps (the thread still waits)."""
        if self.settled or self.anchor is None:
            return self
        t = copy.deepcopy(self)
        t._settle(force=True)
        t._close_steps()
        return t

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
        the 1.6 of waits at random.

        A symbol that recurs twice a step, at uneven places (a metric read
        in the middle of each step, then the loss at its end), is irregular
        wait to wait but regular in events two waits apart: it may be the
        anchor (the input rule then keeps one wait a step), weighed at half
        its rate, after the symbols regular wait to wait."""
        regular: list[tuple[float, bool, bool, float, int]] = []  # rate, once a step, plain, -spread, symbol
        for s, q in self.seen.items():
            if q.n < MIN_OCCURRENCES:
                continue
            times, at = q.pairs().astype(np.float64).T
            spread = _spread(np.diff(times))
            between = np.diff(at)  # copies and waits from one to the next
            if (ev := _event_spread(between, 2)) <= MAX_EVENT_SPREAD:
                spread = min(spread, ev)
            plain = (s >> _QUAL_SHIFT) & 0xF == _ANY
            rate = (len(times) - 1) / max(times[-1] - times[0], 1.0)
            if spread <= (MAX_SPREAD if plain else MAX_QUALIFIED_SPREAD):
                regular.append((rate, True, plain, -spread, s))
                continue
            two = at[2:] - at[:-2]  # copies and waits two waits apart
            if len(two) >= MIN_OCCURRENCES - 2 and (ev := _event_spread(two, 4)) <= MAX_EVENT_SPREAD:
                regular.append((rate / 2, False, plain, -ev, s))
        if not regular:
            return None
        most = max(r[0] for r in regular)
        return max((r for r in regular if r[0] >= 0.9 * most), key=lambda r: r[1:4])[4]

    def _close_steps(self) -> None:
        p = self.pending
        cols = p.joined()
        ret, kind, sym = cols[1], cols[2], cols[3]
        at = self._matches(sym)
        counted = np.cumsum(kind != _COLL)  # copies and waits up to each event (collectives not counted)
        inputs = np.cumsum((kind == _COPY) & (cols[5] == _H2D))  # input copies up to each event
        start = 0  # events before `start` belong to closed steps
        bounds: list[int] = []  # boundaries closed by this batch, after self.boundary
        ends: list[int] = []  # their event index + 1
        lo, first = self.boundary, 0  # where the first step closed here starts: time, event index
        before = 0  # copies and waits before `start`
        held = 0  # input copies before `start`
        if (
            self.boundary is not None
            and len(at)
            and (not self.gated or bool((np.diff(inputs[at], prepend=0) > 0).all()))
            and self._none_short(ret[at], counted[at])
        ):
            bounds, ends = ret[at].tolist(), (at + 1).tolist()
            self.boundary, start = bounds[-1], ends[-1]
            at = at[:0]  # every boundary taken: the loop below has none left to weigh
        last, last_in, dry = self.boundary, 0, 0  # the anchor wait before, its inputs; dry intervals in a row
        for i, b, c, h in zip(at.tolist(), ret[at].tolist(), counted[at].tolist(), inputs[at].tolist(), strict=True):
            if self.boundary is None:  # the first boundary: what came before is no step
                self.boundary, start, lo, first, before, held = b, i + 1, b, i + 1, c, h
                self.first_boundary = b
                last, last_in = b, h
                continue
            if self.gated and h == held:  # no input since the last boundary: no step ended here
                assert last is not None
                long = not self.recent or b - last >= MERGE_BELOW * self.recent.typical()
                dry = dry + 1 if h == last_in and long else 0
                last, last_in = b, h
                if dry < DRY_RUN:
                    continue
                self.gated = False  # steps as long as steps, without input: the loop no longer copies it
            last, last_in = b, h
            d, n = b - self.boundary, c - before
            if self._short(d, n):
                continue  # an extra wait of the anchor's symbol: its time joins the next interval
            bounds.append(b)
            ends.append(i + 1)
            self.recent.append(d)
            self.recent_events.append(n)
            self.boundary, start, before, held, dry = b, i + 1, c, h, 0
        if bounds:
            assert lo is not None
            e = ends[-1]
            self._steps(lo, bounds, [x - first for x in ends], _take(cols, slice(first, e)))
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
            typical = self.recent_events.median()
            if typical > 2:  # steps that copy: count events, which a preempted thread does not stretch
                return n <= MERGE_BELOW * typical
        return bool(self.recent) and d < MERGE_BELOW * self.recent.typical()

    def _steps(self, lo: int, bounds: list[int], ends: list[int], cols: _Cols) -> None:
        """Account the steps (lo, bounds[0]], (bounds[0], bounds[1]], ...: step k
        is made of events ends[k-1]..ends[k]-1 (from 0 for the first), all at once."""
        entry, ret, kind, _sym, launch, direction, nbytes = cols
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
        # What each step moved, and its time from its first call to its end.
        moved = nbytes.astype(np.float64) * (kind == _COPY)
        b_in = np.bincount(step, moved * (direction == _H2D), n).astype(np.int64)
        b_out = np.bincount(step, moved * (direction == _D2H), n).astype(np.int64)
        busy = spans - np.minimum(gap[:n].clip(min=0).astype(np.int64), spans)
        st = self.stats
        st.steps += n
        st.step_ns += int(spans.sum())
        st.copy_ns += int(copy.sum())
        st.sync_ns += int(sync.sum())
        st.collective_ns += int(coll.sum())
        st.host_ns += int(np.maximum(spans - copy - sync - coll, 0).sum())
        st.gpu_idle_ns += int(gap.clip(min=0).sum())
        st.durations.add(spans * 1e-9)
        st.bytes_in += int(b_in.sum())
        st.bytes_out += int(b_out.sum())
        st.busy_ns += int(busy.sum())
        _count_work(st, b_in, b_out, spans, busy)
        is_copy = (kind == _COPY) & (nbytes > 0)
        if is_copy.any():
            _count_copies(st, direction[is_copy], nbytes[is_copy], inside[is_copy])
        st.replies += int(np.count_nonzero((b_in > 0) & (b_out >= REPLY_SHARE * b_in)))
        lead = spans - busy
        judged = np.arange(st.steps - n, st.steps) >= RECENT  # after warm-up
        if len(st.leads) >= RECENT and judged.any():
            st.judged += int(np.count_nonzero(judged))
            st.judged_ns += int(spans[judged].sum())
            st.lead_ns += int(lead[judged].sum())
            st.late += int(np.count_nonzero(lead[judged] > IDLE_AFTER * statistics.median(st.leads)))
        st.leads.extend(lead.tolist())
        st.note_loop()


def _count_copies(st: StepStats, direction: np.ndarray, nbytes: np.ndarray, ns: np.ndarray) -> None:
    """Fold copies into their (direction, size class) (at most MAX_COPY_SIZES; more are not counted).
    Grouped by their exact (direction, bytes) first: a loop copies a few sizes over and over, so
    the classes are taken of those few, not of every copy."""
    raw, inv = unique_inverse(direction.astype(np.int64) << 56 | nbytes.astype(np.int64))
    m = len(raw)
    calls = np.bincount(inv, minlength=m).tolist()
    took = np.bincount(inv, ns.clip(min=0), m).tolist()
    size = raw & _BYTES_MASK
    classes = _quarter_octave(size).tolist()
    sums: dict[tuple[int, int], list[float]] = {}  # each class's calls, bytes (each size times its calls) and time
    for j, (key, b, q) in enumerate(zip(raw.tolist(), size.tolist(), classes, strict=True)):
        acc = sums.setdefault((key >> 56, q), [0, 0, 0.0])
        acc[0] += calls[j]
        acc[1] += b * calls[j]
        acc[2] += took[j]
    for ck, (n, b, t) in sums.items():
        c = st.copies.get(ck)
        if c is None:
            if len(st.copies) >= MAX_COPY_SIZES:
                continue
            c = st.copies[ck] = CopySizeStats()
        c.calls += int(n)
        c.bytes += int(b)
        c.ns += int(t)


_BYTES_MASK = (1 << 56) - 1  # _count_copies: a copy's bytes below its direction


def _count_work(st: StepStats, b_in: np.ndarray, b_out: np.ndarray, spans: np.ndarray, busy: np.ndarray) -> None:
    """Fold steps' work into their classes (at most MAX_WORK), and the bytes
    they read back into `outputs` (at most MAX_OUTPUTS amounts)."""
    n = len(b_in)
    groups: list[tuple[tuple[int, int], int, list[float]]]  # (class, steps, [ns, busy ns, bytes in, bytes out])
    if n and bool((b_in == b_in[0]).all()) and bool((b_out == b_out[0]).all()):
        # A steady loop's steps, each moving the same bytes: one class, one amount read back.
        i, o = int(b_in[0]), int(b_out[0])
        groups = [(work_class(i, o), n, [float(spans.sum()), float(busy.sum()), i * n, o * n])]
        amounts = [(o, n)]
    else:
        q_in, q_out = _quarter_octave(b_in), _quarter_octave(b_out)
        keys, inv = unique_inverse(q_in << 32 | q_out)
        m = len(keys)
        sums = [np.bincount(inv, x.astype(np.float64), m).tolist() for x in (spans, busy, b_in, b_out)]
        counts = np.bincount(inv, minlength=m).tolist()
        groups = [
            ((key >> 32, key & 0xFFFFFFFF), counts[j], [sums[0][j], sums[1][j], sums[2][j], sums[3][j]])
            for j, key in enumerate(keys.tolist())
        ]
        amounts = list(zip(*(x.tolist() for x in np.unique(b_out, return_counts=True)), strict=True))
    for wk, steps, (ns, busy_ns, bytes_in, bytes_out) in groups:
        w = st.work.get(wk)
        if w is None:
            if len(st.work) >= MAX_WORK:
                wk = OTHER_WORK
            w = st.work.setdefault(wk, WorkStats())
        w.steps += steps
        w.step_ns += int(ns)
        w.busy_ns += int(busy_ns)
        w.bytes_in += int(bytes_in)
        w.bytes_out += int(bytes_out)
    for a, count in amounts:
        if a in st.outputs or len(st.outputs) < MAX_OUTPUTS:
            st.outputs[a] = st.outputs.get(a, 0) + count


class _Window(deque[int]):
    """The last RECENT steps' durations or event counts, kept sorted beside
    the deque, so that their median and a typical step are read, not
    computed: _short asks at every anchor wait, and statistics.median there
    was the agent's hot spot (bench/targets/agent_throughput.py)."""

    def __init__(self) -> None:
        super().__init__(maxlen=RECENT)
        self._sorted: list[int] = []
        self._typical: float | None = None  # until the window changes

    def __deepcopy__(self, memo: dict[int, object]) -> _Window:
        w = _Window()
        w.extend(self)
        return w

    def append(self, x: int) -> None:
        if len(self) == RECENT:
            del self._sorted[bisect.bisect_left(self._sorted, self[0])]
        super().append(x)
        bisect.insort(self._sorted, x)
        self._typical = None

    def extend(self, xs: Iterable[int]) -> None:
        xs = list(xs)
        if len(xs) < 8:
            for x in xs:
                self.append(x)
        else:  # a batch of steps at once (_none_short): sort once
            super().extend(xs)
            self._sorted = sorted(self)
            self._typical = None

    def median(self) -> float:
        """statistics.median of the window (not empty)."""
        return _sorted_median(self._sorted, len(self._sorted))

    def typical(self) -> float:
        """A typical step: the median of those no longer than twice the
        median, so that slow warm-up steps do not make real steps look short.
        Kept until the window changes: a run of short intervals asks again
        at each wait."""
        if self._typical is None:
            self._typical = float(_sorted_median(self._sorted, bisect.bisect_right(self._sorted, 2 * self.median())))
        return self._typical


def _sorted_median(s: list[int], n: int) -> float:
    """statistics.median of the first n (at least one) of the sorted s."""
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2


def _quantile(s: np.ndarray, q: float) -> float:
    """The q-quantile of sorted values, interpolated as numpy's default
    (linear) percentile does, without its per-call overhead (this runs for
    every candidate wait of every thread)."""
    i = q * (len(s) - 1)
    lo = int(i)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (i - lo))


def _event_spread(between: np.ndarray, more_than: int) -> float:
    """The spread of a symbol's intervals in copies and waits, where steps
    copy (the median interval holds more than `more_than`); inf otherwise.
    Where most intervals hold one count and it is such a step, the spread
    is that of those alone (at most MAX_EVENT_SPREAD): a checkpoint's
    waits, a run of short intervals, may be up to half of the ring."""
    s = np.sort(between)
    if _quantile(s, 0.5) <= more_than:
        return math.inf
    spread = _spread(s)
    if spread > MAX_EVENT_SPREAD:
        values, counts = np.unique(s, return_counts=True)
        k = int(counts.argmax())
        if values[k] > more_than and counts[k] >= len(s) / 2:
            return MAX_EVENT_SPREAD
    return spread


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
        self.pooled: _Thread | None = None  # the process's threads as one (tid 0), once two wait on one symbol
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
        is_copy = kind == _COPY
        copy_dir = np.where(is_copy, direction, _NO_DIRECTION).astype(np.int8)
        nbytes = np.where(is_copy & (b["ret"] == 0), b["bytes"], 0).astype(np.int64)  # moved only if it succeeded
        if collectives is not None and len(collectives):
            c = collectives
            c_entry = c["ts_ns"].astype(np.int64)
            m = len(c)
            entry = np.concatenate([entry, c_entry])
            ret = np.concatenate([ret, c_entry + c["duration_ns"].astype(np.int64)])
            kind = np.concatenate([kind, np.full(m, _COLL, np.uint8)])
            sym = np.concatenate([sym, np.full(m, _NOT_A_WAIT, np.int64)])
            tids = np.concatenate([tids, c["tid"]])
            direction = np.concatenate([direction, np.zeros(m, np.int64)])
            launch = np.concatenate([launch, np.zeros(m, np.int64)])
            copy_dir = np.concatenate([copy_dir, np.full(m, _NO_DIRECTION, np.int8)])
            nbytes = np.concatenate([nbytes, np.zeros(m, np.int64)])
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
        pool = False  # two threads wait on one symbol now: follow them as one from here
        for tid, o in parts:
            if tid not in self.threads and len(self.threads) >= MAX_THREADS:
                continue
            syncs = sym[o][kind[o] == _SYNC]
            if len(syncs):
                for y, n in zip(*np.unique(syncs, return_counts=True), strict=True):
                    k = (int(y), tid)
                    if k in self.waits:
                        self.waits[k] += int(n)
                    elif len(self.waits) < MAX_SHARED:
                        pool |= self.pooled is None and any(s == k[0] for s, _t in self.waits)
                        self.waits[k] = int(n)
        if pool:
            self._pool()
        for tid, o in parts:
            t = self.threads.get(tid)
            if t is None:
                if len(self.threads) >= MAX_THREADS:
                    continue
                t = self.threads[tid] = _Thread(tid)
            t.add(
                (entry[o], ret[o], kind[o], t.qualify(kind[o], sym[o], direction[o]), launch[o], copy_dir[o], nbytes[o])
            )
        if self.pooled is not None:  # every thread's events, in return order
            order = np.argsort(ret, kind="stable")
            self._feed_pooled(_take((entry, ret, kind, sym, launch, copy_dir, nbytes), order))

    def _pool(self) -> None:
        """Two threads wait on one symbol: follow the process's threads as one
        too (a pool of threads making one loop's transfers and waits, as JAX's
        runtime does), from the events its threads still hold."""
        p = self.pooled = _Thread(0)
        lead = max(self.threads.values(), key=lambda t: t.stats.steps, default=None)
        if lead is not None and lead.anchor is not None and lead.stats.steps:
            p.take_over(lead)  # one thread's stretch of the loop so far: the loop's first steps
        held = [t.pending.joined() for t in self.threads.values() if t.pending.count]
        if held:
            cols: _Cols = tuple(np.concatenate(x) for x in zip(*held, strict=True))  # type: ignore[assignment]
            later = cols[1] > (p.boundary if p.boundary is not None else -1)
            sym = cols[3]
            plain = np.where(sym == _NOT_A_WAIT, sym, sym & ~_QUAL_BITS)  # each thread qualified its own
            cols = (*cols[:3], plain, *cols[4:])
            later_ones = np.flatnonzero(later)
            self._feed_pooled(_take(cols, later_ones[np.argsort(cols[1][later_ones], kind="stable")]))

    def _feed_pooled(self, cols: _Cols) -> None:
        p = self.pooled
        assert p is not None
        entry, ret, kind, sym, launch, copy_dir, nbytes = cols
        p.add((entry, ret, kind, p.qualify(kind, sym, copy_dir.astype(np.int64)), launch, copy_dir, nbytes))

    def stats(self) -> StepStats | None:
        """The process's steps: those of its stepping thread (the one with
        the most steps), or, where other threads share its anchor's waits
        (the step is no one thread's), those of its threads taken as one
        (tid 0); None while it has none."""
        self.flush()
        t = max((t.view() for t in self.threads.values()), key=lambda t: t.stats.steps, default=None)
        if t is not None and t.stats.steps and t.anchor is not None:
            plain = t.anchor & ~_QUAL_BITS
            own = others = 0
            for (y, tid), n in self.waits.items():
                if y == plain:
                    if tid == t.stats.tid:
                        own += n
                    else:
                        others += n
            if others <= SHARED_ABOVE * own:
                return t.stats
        p = self.pooled.view() if self.pooled is not None else None
        return p.stats if p is not None and p.stats.steps and p.anchor is not None and p.gated else None


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
