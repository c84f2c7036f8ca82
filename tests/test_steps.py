"""The step detector (memtrace/model/steps.py) on synthetic event streams
with exact, known timelines: counts, durations and breakdowns are exact."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from memtrace.core.abi import EVENT_DTYPE, Direction
from memtrace.core.ids import ProcessKey
from memtrace.export.report import steps
from memtrace.model import Model
from memtrace.model.steps import MERGE_BELOW, RECENT, StepTracker, _Thread, _Window, feed

MEMCPY_ASYNC, STREAM_SYNC, DEVICE_SYNC, MALLOC = 2, 80, 81, 40
US = 1000
MS = 1000 * US
PID, TID = 4242, 4243
STREAM = 0x7F00DEAD0000

Ev = tuple[int, int, int, int, int, int]  # entry ns, duration ns, api, stream, direction, tid


def events(rows: list[Ev], pid: int = PID) -> np.ndarray:
    """An mt_event batch in ring (return) order."""
    rows = sorted(rows, key=lambda r: r[0] + r[1])
    a = np.zeros(len(rows), EVENT_DTYPE)
    for i, (ts, dur, api, stream, d, tid) in enumerate(rows):
        a[i]["ts_ns"], a[i]["duration_ns"], a[i]["api"], a[i]["stream"] = ts, dur, api, stream
        a[i]["direction"], a[i]["tid"], a[i]["pid"], a[i]["bytes"] = d, tid, pid, 4096
    return a


def step(t0: int, host_ns: int, sync_ns: int = 2 * MS, tid: int = TID) -> tuple[list[Ev], int]:
    """One iteration from t0: three 100 us H2D copies, a 100 us D2H copy, a
    stream sync of sync_ns, then host work; returns (events, the next t0)."""
    rows: list[Ev] = [(t0 + k * 100 * US, 100 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, tid) for k in range(3)]
    rows.append((t0 + 300 * US, 100 * US, MEMCPY_ASYNC, STREAM, Direction.D2H, tid))
    rows.append((t0 + 400 * US, sync_ns, STREAM_SYNC, STREAM, 0, tid))
    return rows, t0 + 400 * US + sync_ns + host_ns


def loop(n: int, host_ns: list[int] | int = 5 * MS, sync_ns: int = 2 * MS, t0: int = 10**12) -> list[Ev]:
    rows: list[Ev] = []
    for i in range(n):
        ev, t0 = step(t0, host_ns if isinstance(host_ns, int) else host_ns[i], sync_ns)
        rows += ev
    return rows


def tracked(rows: list[Ev], batches: int = 1, collectives: np.ndarray | None = None) -> StepTracker:
    t = StepTracker(PID)
    b = events(rows)
    for part in np.array_split(b, batches):
        t.add(part, collectives)
    return t


def test_n_iterations_make_n_minus_one_steps_with_exact_breakdown() -> None:
    t = tracked(loop(20))
    st = t.stats()
    assert st is not None and st.tid == TID
    # 20 waits are 20 boundaries: 19 steps (the time before the first is setup).
    assert st.steps == 19
    assert st.step_ns == 19 * 7400 * US
    assert st.copy_ns == 19 * 400 * US
    assert st.sync_ns == 19 * 2 * MS
    assert st.host_ns == 19 * 5 * MS
    assert st.collective_ns == 0
    # from each wait's return to the next copy's entry: the host work
    assert st.gpu_idle_ns == 19 * 5 * MS
    assert st.durations.count == 19
    assert st.durations.min == st.durations.max == pytest.approx(7.4e-3)


@pytest.mark.parametrize("batches", [2, 7, 95])
def test_batches_of_any_size_give_the_same_steps(batches: int) -> None:
    whole = tracked(loop(20)).stats()
    parts = tracked(loop(20), batches=batches).stats()
    assert whole is not None and parts is not None
    assert (parts.steps, parts.step_ns, parts.copy_ns, parts.sync_ns, parts.host_ns, parts.gpu_idle_ns) == (
        whole.steps,
        whole.step_ns,
        whole.copy_ns,
        whole.sync_ns,
        whole.host_ns,
        whole.gpu_idle_ns,
    )


def test_a_device_sync_every_k_steps_is_no_step_but_waiting() -> None:
    rows = loop(30)
    # a checkpoint every 5 iterations: a 1 ms device sync 1 ms into the host work
    rows += [(10**12 + i * 7400 * US + 3400 * US, 1 * MS, DEVICE_SYNC, 0, 0, TID) for i in range(4, 30, 5)]
    st = tracked(rows, batches=4).stats()
    assert st is not None
    assert st.steps == 29
    # iteration i's host work is in step i + 1: the sync of iteration 29 is after the last boundary
    assert st.sync_ns == 29 * 2 * MS + 5 * MS
    assert st.host_ns == 29 * 5 * MS - 5 * MS


@pytest.mark.parametrize("at", [0.1, 0.9])
def test_an_extra_wait_on_the_anchor_stream_every_k_steps_keeps_the_count(at: float) -> None:
    rows = loop(40)
    period = 7400 * US
    # a checkpoint every 10 steps: an extra 200 us stream sync `at` of the way into the host work
    for i in range(40):
        if i % 10 == 5:
            ts = 10**12 + i * period + 2400 * US + int(at * 5 * MS)
            rows.append((ts, 200 * US, STREAM_SYNC, STREAM, 0, TID))
    st = tracked(rows, batches=9).stats()
    assert st is not None
    assert st.steps == 39
    assert st.step_ns == 39 * period
    assert st.sync_ns == 39 * 2 * MS + 4 * 200 * US


def test_jitter_and_warm_up_keep_the_count_and_the_median() -> None:
    rng = np.random.default_rng(7)
    host = [int(x) for x in rng.uniform(2 * MS, 8 * MS, 60)]  # data-loader jitter: +-60%
    host[:3] = [80 * MS, 40 * MS, 20 * MS]  # warm-up
    rows = loop(60, host_ns=host)
    st = tracked(rows, batches=13).stats()
    assert st is not None
    assert st.steps == 59
    truth = np.array([2400 * US + h for h in host[:59]], np.float64) * 1e-9  # step i ends at wait i + 1
    true_median = float(np.median(truth))
    # the histogram's buckets are 2.2% wide (scale 5): the median is within one bucket
    assert st.durations.quantile(0.5) == pytest.approx(true_median, rel=0.03)
    assert st.durations.max == pytest.approx(truth.max())
    assert st.step_ns == round(truth.sum() * 1e9)


def test_a_one_shot_script_has_no_steps() -> None:
    t0 = 10**12
    rows: list[Ev] = [(t0 + k * MS, 500 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, TID) for k in range(50)]
    rows += [(t0 + 60 * MS, 3 * MS, STREAM_SYNC, STREAM, 0, TID), (t0 + 70 * MS, 1 * MS, DEVICE_SYNC, 0, 0, TID)]
    rows += [(t0 + 80 * MS + k * MS, 100 * US, MALLOC, 0, 0, TID) for k in range(20)]
    t = tracked(rows)
    assert t.stats() is None


def test_irregular_waits_make_no_steps() -> None:
    rng = np.random.default_rng(3)
    gaps = rng.exponential(5 * MS, 200).astype(np.int64)  # a Poisson stream of waits: CV about 1
    starts = 10**12 + np.cumsum(gaps + 200 * US)
    rows: list[Ev] = [(int(s), 100 * US, STREAM_SYNC, STREAM, 0, TID) for s in starts]
    assert tracked(rows, batches=5).stats() is None


def test_a_thread_that_never_steps_holds_a_bounded_number_of_events() -> None:
    # Waits at random for 100k events: no anchor ever, and what the thread
    # keeps meanwhile stays at MAX_SEARCH_PENDING events (plus one batch),
    # whatever the count (1000 such processes once held 500 MB).
    from memtrace.model.steps import FEED_EVENTS, MAX_SEARCH_PENDING

    rng = np.random.default_rng(4)
    t = StepTracker(PID)
    t0 = 10**12
    for _ in range(400):
        gaps = rng.exponential(5 * MS, 250).astype(np.int64)
        starts = t0 + np.cumsum(gaps + 200 * US)
        t0 = int(starts[-1]) + MS
        kinds = rng.choice([STREAM_SYNC, MEMCPY_ASYNC], 250)
        t.add(
            events([(int(s), 100 * US, int(k), STREAM, Direction.H2D, TID) for s, k in zip(starts, kinds, strict=True)])
        )
        held = sum(th.pending.count for th in t.threads.values())
        assert held <= MAX_SEARCH_PENDING + 250 + FEED_EVENTS
    assert t.stats() is None


def test_a_thread_fed_in_small_batches_keeps_a_few_arrays_and_each_symbols_last_waits() -> None:
    # 2,000 batches of 12 events (1000 processes once held 16 MB of small
    # arrays this way): the pending events stay a few arrays, the latest
    # MAX_SEARCH_PENDING of them (and the chunks since the last join), and each symbol keeps its last RING waits
    # (return time, event number), exactly.
    from memtrace.model.steps import MAX_CHUNKS, MAX_SEARCH_PENDING, RING

    rng = np.random.default_rng(7)
    t = StepTracker(PID)
    t0, rows = 10**12, []
    for _ in range(2000):
        starts = t0 + np.cumsum(rng.exponential(5 * MS, 12).astype(np.int64) + 200 * US)
        t0 = int(starts[-1]) + MS
        batch = [(int(x), 100 * US, STREAM_SYNC, STREAM, Direction.H2D, TID) for x in starts]
        rows += batch
        t.add(events(batch))
        t.flush()
        (th,) = t.threads.values()
        assert len(th.pending.chunks) <= MAX_CHUNKS + 1
    assert t.stats() is None  # waits at random: no anchor
    (th,) = t.threads.values()
    assert th.pending.count <= MAX_SEARCH_PENDING + (MAX_CHUNKS + 1) * 12
    ret = th.pending.joined()[1]
    want = np.array([r[0] + r[1] for r in rows], np.int64)
    assert ret.tolist() == want[-len(ret) :].tolist()  # the latest events, in order
    ((sym, ring),) = th.seen.items()
    assert ring.pairs()[:, 0].tolist() == want[-RING:].tolist()
    assert ring.pairs()[:, 1].tolist() == list(range(len(rows) - RING, len(rows)))
    assert th.counts[sym] == len(rows)


def test_collectives_count_as_collective_time() -> None:
    rows = loop(10)
    coll = np.zeros(10, EVENT_DTYPE)
    for i in range(10):  # a 1 ms all-reduce in each step's host work
        coll[i]["ts_ns"] = 10**12 + i * 7400 * US + 3 * MS
        coll[i]["duration_ns"], coll[i]["tid"], coll[i]["pid"] = 1 * MS, TID, PID
    st = tracked(rows, collectives=coll).stats()
    assert st is not None
    assert st.steps == 9
    # iteration i's host work is in step i + 1: the last all-reduce is after the last boundary
    assert st.collective_ns == 9 * MS
    assert st.host_ns == 9 * 4 * MS


@pytest.mark.parametrize("batches", [1, 4, 9])
def test_the_stepping_thread_is_reported_and_other_threads_do_not_mix_in(batches: int) -> None:
    # The loader's copies fall between the stepping thread's events, so batches
    # begin and end with the stepping thread's and hold the loader's inside.
    rows = loop(12)
    loader = TID + 1
    rows += [(10**12 + k * 3 * MS, 1 * MS, MEMCPY_ASYNC, STREAM + 1, Direction.H2D, loader) for k in range(30)]
    st = tracked(rows, batches).stats()
    assert st is not None
    assert (st.tid, st.steps, st.copy_ns) == (TID, 11, 11 * 400 * US)


def test_model_feeds_steps_and_views_them_per_process() -> None:
    m = Model()
    b = events(loop(8)), events(loop(3), pid=PID + 1)
    m.add_events(np.concatenate(b))
    assert list(m.steps_view()) == [ProcessKey(PID, 0)]  # three waits are no steps yet
    rows = steps(m)
    assert [r["pid"] for r in rows] == [PID]
    r = rows[0]
    assert r["steps"] == 7
    assert r["duration_seconds"]["max"] == pytest.approx(7.4e-3)
    assert r["breakdown"] == pytest.approx({"copy": 4 / 74, "sync_wait": 20 / 74, "collective": 0.0, "host": 50 / 74})
    assert r["gpu_idle_share"] == pytest.approx(50 / 74)
    m.forget(ProcessKey(PID, 0))
    assert m.steps_view() == {} and steps(m) == []


def test_feed_splits_by_process() -> None:
    trackers: dict[int, StepTracker] = {}
    feed(trackers, np.concatenate([events(loop(8)), events(loop(9), pid=7)]))
    a, b = trackers[PID].stats(), trackers[7].stats()
    assert a is not None and b is not None
    assert (a.steps, b.steps) == (7, 8)


def test_a_loop_on_a_loaded_machine_is_found_by_its_event_cadence() -> None:
    # preemption makes host work random (exponential: a spread like waits at random),
    # but each step still makes the same copies and wait
    rng = np.random.default_rng(11)
    host = [int(x) for x in rng.exponential(5 * MS, 80)]
    rows = loop(80, host_ns=host)
    st = tracked(rows, batches=10).stats()
    assert st is not None
    assert st.steps == 79
    assert st.step_ns == sum(2400 * US + h for h in host[:79])


def test_a_preempted_extra_wait_on_the_anchor_stream_is_still_no_step() -> None:
    rows = loop(40)
    period = 7400 * US
    # every 10 steps a second sync of the step's stream right after its own,
    # but the thread was preempted for 4.5 ms in between: longer than half a step
    for i in range(5, 40, 10):
        rows.append((10**12 + i * period + 6900 * US, 100 * US, STREAM_SYNC, STREAM, 0, TID))
    st = tracked(rows, batches=6).stats()
    assert st is not None
    assert st.steps == 39


def test_the_most_frequent_regular_wait_is_the_step_not_a_rarer_checkpoint() -> None:
    rows = loop(30)
    # a device sync every 3 iterations: as regular as the step's wait, a third as frequent
    rows += [(10**12 + i * 7400 * US + 3400 * US, 1 * MS, DEVICE_SYNC, 0, 0, TID) for i in range(2, 30, 3)]
    st = tracked(rows).stats()  # one batch: both are candidates at once
    assert st is not None
    assert st.steps == 29


def pytorch_step(t0: int, host_ns: int, tid: int = TID) -> tuple[list[Ev], int, int]:
    """One iteration of PyTorch's loop with pageable batches, as traced on the
    H200: two H2D copies, each followed by the stream sync PyTorch makes for
    a pageable source (short), the forward and backward pass (launches, not
    events), `loss.item()`'s D2H copy and its sync (long: the GPU's work),
    then the next batch's loading (host). Returns (events, the first sync's
    return, the next t0)."""
    rows: list[Ev] = [
        (t0, 200 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, tid),
        (t0 + 200 * US, 50 * US, STREAM_SYNC, STREAM, 0, tid),
        (t0 + 250 * US, 30 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, tid),
        (t0 + 280 * US, 20 * US, STREAM_SYNC, STREAM, 0, tid),
        (t0 + 1300 * US, 10 * US, MEMCPY_ASYNC, STREAM, Direction.D2H, tid),
        (t0 + 1310 * US, 1500 * US, STREAM_SYNC, STREAM, 0, tid),
    ]
    return rows, t0 + 250 * US, t0 + 2810 * US + host_ns


@pytest.mark.parametrize("batches", [1, 7])
def test_a_step_of_three_waits_on_one_stream_is_one_step(batches: int) -> None:
    """Every wait of the loop is the same symbol (api, stream), at uneven
    places: irregular wait to wait. The wait after the D2H copy is once a
    step. Data-loader jitter changes each step's length, not its calls."""
    rng = np.random.default_rng(5)
    host = [int(x) for x in rng.uniform(0.5 * MS, 4 * MS, 50)]
    rows: list[Ev] = []
    firsts: list[int] = []
    t0 = 10**12
    for h in host:
        ev, first, t0 = pytorch_step(t0, h)
        rows += ev
        firsts.append(first)
    st = tracked(rows, batches=batches).stats()
    assert st is not None
    # Each step is one iteration, from its D2H wait's return to the next
    # one's: as long as from one iteration's start to the next.
    truth = np.diff(np.array(firsts, np.int64))
    assert st.steps == 49
    assert st.step_ns == int(truth.sum())
    assert st.durations.quantile(0.5) == pytest.approx(float(np.median(truth)) * 1e-9, rel=0.03)
    assert st.copy_ns == 49 * 240 * US
    assert st.sync_ns == 49 * 1570 * US


def recorded(name: str) -> tuple[np.ndarray, StepTracker]:
    import sys

    from conftest import FIXTURES

    sys.path.insert(0, str(FIXTURES))
    import traces

    b = traces.events(list(traces.records(name)))
    t = StepTracker(int(b["pid"][0]))
    for part in np.array_split(b, len(b) // 40):  # a drain's worth at a time
        t.add(part)
    return b, t


@pytest.mark.parametrize(
    ("name", "iterations"), [("torch_train_pinned", 300), ("torch_train_pageable", 300), ("torch_serve", 500)]
)
def test_the_recorded_pytorch_loops_have_one_step_per_iteration(name: str, iterations: int) -> None:
    """Real call streams recorded on an H100 (tests/traces): N iterations,
    N - 1 steps, each from one `loss.item()` (or result) wait to the next:
    the wait after the iteration's D2H copy. PyTorch's weight uploads at
    setup are H2D copies each waited for: they are no steps."""
    b, t = recorded(name)
    st = t.stats()
    assert st is not None
    assert st.steps == iterations - 1
    # The truth: the returns of the waits that follow a D2H copy.
    waits = []
    last_dir = 0
    for e in b:
        if e["api"] == MEMCPY_ASYNC:
            last_dir = int(e["direction"])
        elif e["api"] == STREAM_SYNC:
            if last_dir == Direction.D2H:
                waits.append(int(e["ts_ns"]) + int(e["duration_ns"]))
            last_dir = 0
    assert len(waits) == iterations
    truth = np.diff(np.array(waits, np.int64))
    assert st.step_ns == int(truth.sum())
    assert st.durations.quantile(0.5) == pytest.approx(float(np.median(truth)) * 1e-9, rel=0.03)


def test_a_step_made_by_a_pool_of_threads_is_no_ones_step() -> None:
    """JAX's runtime waits on one stream from six threads, each for a stretch
    (recorded jax_train): one thread's stretch is not the job's step."""
    _b, t = recorded("jax_train")
    assert t.stats() is None
    assert any(th.stats.steps for th in t.threads.values())  # a thread alone would have had some


def test_the_gpu_is_idle_until_the_first_launch_after_a_wait() -> None:
    """The PyTorch loop above, its forward and backward launched from 10 us
    after the second wait returns (t0 + 310 us) until the loss.item() copy:
    each wait says when its thread first launched since its last (BPF's
    first-launch slot, in a sync event's `src`). The GPU idles for the host
    work and those 10 us a step, not the 1 ms of launches before the copy."""
    rng = np.random.default_rng(6)
    host = [int(x) for x in rng.uniform(0.5 * MS, 4 * MS, 40)]
    rows: list[Ev] = []
    launches: dict[int, int] = {}  # row index of an item() wait -> its first launch
    t0 = 10**12
    for h in host:
        ev, _first, nxt = pytorch_step(t0, h)
        launches[len(rows) + 5] = t0 + 310 * US
        rows += ev
        t0 = nxt
    b = np.zeros(len(rows), EVENT_DTYPE)
    for i, (ts, dur, api, stream, d, tid) in enumerate(rows):  # in ring order already: each returns before the next
        b[i]["ts_ns"], b[i]["duration_ns"], b[i]["api"], b[i]["stream"] = ts, dur, api, stream
        b[i]["direction"], b[i]["tid"], b[i]["pid"], b[i]["src"] = d, tid, PID, launches.get(i, 0)
    t = StepTracker(PID)
    for part in np.array_split(b, 5):
        t.add(part)
    st = t.stats()
    assert st is not None and st.steps == 39
    assert st.gpu_idle_ns == sum(h + 10 * US for h in host[:39])
    # Without the launches' times, the upper bound: the launches count as idle.
    b["src"] = 0
    t = StepTracker(PID)
    t.add(b)
    st = t.stats()
    assert st is not None and st.gpu_idle_ns == sum(h + 1000 * US for h in host[:39])


def _one_by_one(t: _Thread, b: list[int], c: list[int]) -> bool:
    """The loop's judgement of anchor waits (returns `b`, copies and waits so
    far `c`): none short, each weighed against the steps before it."""
    before = 0
    for d_ret, count in zip(b, c, strict=True):
        if t._short(d_ret - (t.boundary or 0), count - before):
            return False
        t.recent.append(d_ret - (t.boundary or 0))
        t.recent_events.append(count - before)
        t.boundary, before = d_ret, count
    return True


@pytest.mark.parametrize("seed", range(6))
def test_the_steady_loops_shortcut_judges_every_wait_as_the_loop_does(seed: int) -> None:
    """_none_short answers at once for a batch of anchor waits; whether it
    takes the medians or settles it from the windows' least and greatest
    counts, its answer and the windows it leaves are the loop's, on steady
    loops (every step alike), steps that vary a little, and extra waits."""
    rng = np.random.default_rng(seed)
    taken = [0, 0]  # cases the medians settled, cases the least and greatest counts did
    for case in range(400):
        per_step = int(rng.integers(1, 12))
        spread = int(rng.choice([0, 0, 1, per_step]))  # most loops alike; some vary; some by a lot
        history = [max(1, per_step + int(rng.integers(-spread, spread + 1))) for _ in range(RECENT)]
        counts = [max(1, per_step + int(rng.integers(-spread, spread + 1))) for _ in range(int(rng.integers(1, 40)))]
        if rng.random() < 0.2:  # an extra anchor wait, a few events after a boundary
            counts[int(rng.integers(len(counts)))] = int(rng.integers(1, max(2, per_step // 2 + 1)))
        fast, slow = _Thread(TID), _Thread(TID)
        for t in (fast, slow):
            t.boundary = 10**12
            t.recent.extend([5 * MS] * RECENT)
            t.recent_events.extend(history)
        c = np.cumsum(counts).astype(np.int64)
        b = (10**12 + np.arange(1, len(counts) + 1) * 5 * MS).astype(np.int64)
        window = history + counts[:-1]
        medians = [statistics.median(window[i : i + RECENT]) for i in range(len(counts))]
        settled = min(window) > 2 and min(counts) > MERGE_BELOW * max(window)
        taken[settled] += 1
        expected = all(m > 2 for m in medians) and all(
            n > MERGE_BELOW * m for n, m in zip(counts, medians, strict=True)
        )
        got = fast._none_short(b, c)
        assert got == expected, case
        if not got:  # nothing changed: the loop then weighs them itself
            assert list(fast.recent_events) == history, case
            continue
        assert _one_by_one(slow, b.tolist(), c.tolist()), (case, history, counts)
        assert list(fast.recent_events) == list(slow.recent_events), case
        assert list(fast.recent) == list(slow.recent), case
    assert min(taken) > 20, taken  # both ways were weighed


def logging_step(t0: int, host_ns: int, log: bool) -> tuple[list[Ev], int]:
    """One batch as a loop with one input copy makes it: a 100 us H2D copy,
    then its launches (1 ms), the loss read back (a D2H copy, a 1 ms wait
    on the stream); when `log`, the step then logs: a 100 us D2H copy of a
    metric and another wait on that stream, 1 ms into the host work."""
    rows: list[Ev] = [(t0, 100 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, TID)]
    rows.append((t0 + 1100 * US, 100 * US, MEMCPY_ASYNC, STREAM, Direction.D2H, TID))
    rows.append((t0 + 1200 * US, 1 * MS, STREAM_SYNC, STREAM, 0, TID))
    end = t0 + 2200 * US + host_ns
    if log:
        rows.append((t0 + 3200 * US, 100 * US, MEMCPY_ASYNC, STREAM, Direction.D2H, TID))
        rows.append((t0 + 3300 * US, 200 * US, STREAM_SYNC, STREAM, 0, TID))
    return rows, end


@pytest.mark.parametrize("every", [1, 10, 50])
@pytest.mark.parametrize("batches", [1, 9])
def test_a_loop_that_logs_every_n_steps_makes_one_step_a_batch(every: int, batches: int) -> None:
    """A log's wait follows a D2H copy on the loss's stream, as the loss's
    does, and holds nearly a step's copies and waits: only the input copy
    says which of the two ends a batch. Logging every 10 steps was counted
    10% over (each tenth step split in two)."""
    rng = np.random.default_rng(every)
    host = [int(x) for x in rng.uniform(3 * MS, 5 * MS, 300)]
    rows: list[Ev] = []
    ends, t0 = [], 10**12
    for i, h in enumerate(host):
        ev, t0 = logging_step(t0, h, log=i % every == every - 1)
        rows += ev
        ends.append(ev[2][0] + ev[2][1])  # the loss's wait returns: the batch's end
    st = tracked(rows, batches=batches).stats()
    assert st is not None
    assert st.steps == len(host) - 1
    assert st.step_ns == ends[-1] - ends[0]


def test_the_step_windows_median_and_typical_step_are_those_of_their_values() -> None:
    """_Window keeps its values sorted beside it (the detector's hot path
    reads its median at every anchor wait): what it answers is what
    statistics.median gives on the last RECENT values, through appends, batch
    extends and warm-up outliers."""
    rng = np.random.default_rng(3)
    w = _Window()
    values: list[int] = []
    for _ in range(500):
        if rng.random() < 0.1:
            new = [int(x) for x in rng.integers(1, 10**6, int(rng.integers(1, 40)))]
            w.extend(new)
        else:
            new = [int(rng.integers(1, 10**6)) * (50 if rng.random() < 0.05 else 1)]
            w.append(new[0])
        values = (values + new)[-RECENT:]
        assert list(w) == values
        m = statistics.median(values)
        assert w.median() == m
        assert w.typical() == float(statistics.median([x for x in values if x <= 2 * m]))


@pytest.mark.parametrize("size", [3, 32, 10**6])
def test_a_loop_after_uploads_each_waited_for_begins_at_its_first_step(size: int) -> None:
    """PyTorch's setup uploads the weights, each an H2D copy waited for on
    the loop's stream (five, as in the recorded pageable loop): the anchor
    may be chosen among them when events come a few at a time and the agent
    reads its steps at each tick (that loop replayed was counted 304 steps
    for 299). The uploads are no steps, however the events are cut."""
    rows: list[Ev] = []
    t0 = 10**12
    for _ in range(5):
        rows.append((t0, 100 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, TID))
        rows.append((t0 + 100 * US, 20 * US, STREAM_SYNC, STREAM, 0, TID))
        t0 += 150 * US
    rows += loop(40, t0=t0 + 500 * MS)
    b = events(rows)
    t = StepTracker(PID)
    for off in range(0, len(b), size):
        t.add(b[off : off + size])
        t.stats()
    st = t.stats()
    assert st is not None
    assert st.steps == 39
    assert st.step_ns == 39 * 7400 * US


def served(t0: int, bytes_in: int, bytes_out: int) -> np.ndarray:
    """One iteration of a server (or a step that reads back a result): its input copied in, its
    result read back 1 ms later, then a wait of 1 ms."""
    rows: list[Ev] = [
        (t0, 100 * US, MEMCPY_ASYNC, STREAM, Direction.H2D, TID),
        (t0 + 1 * MS, 50 * US, MEMCPY_ASYNC, STREAM, Direction.D2H, TID),
        (t0 + 1 * MS + 50 * US, 1 * MS, STREAM_SYNC, STREAM, 0, TID),
    ]
    a = events(rows)
    a["bytes"] = np.where(a["direction"] == Direction.D2H, bytes_out, bytes_in)
    return a


def test_a_server_saturated_for_a_while_is_still_a_server() -> None:
    """A server's iterations read back what their batches made (varying amounts: a server);
    then requests queue and every batch is full for a long stretch, each reading back one
    amount, as a training loop's loss is. It is still a server (its diagnosis baseline is in
    units of work): it was found one, and stays one. Without that it turned training once the
    full batches were most of its iterations (the zoo's LLM server under a CPU quota)."""
    from memtrace.model.steps import Loop

    def iteration(t0: int, out: int) -> tuple[np.ndarray, int]:
        return served(t0, 16 * out, out), t0 + 3 * MS

    t, t0 = StepTracker(PID), 10**12
    for i in range(500):
        a, t0 = iteration(t0, 4 << (i % 4) if i < 100 else 32)  # four batch sizes, then every one full
        t.add(a)
        if i == 99:
            st = t.stats()
            assert st is not None and st.loop is Loop.SERVING
    st = t.stats()
    assert st is not None and st.steps == 499 and st.loop is Loop.SERVING


@pytest.mark.parametrize(
    ("prefill", "serving"),
    [(300 * 4, True), (None, False)],
    ids=["llm-prefills-and-decodes", "training-varying-batches-reading-results"],
)
def test_a_loop_busy_from_its_start_is_a_server_where_its_work_spans_octaves(
    prefill: int | None, serving: bool
) -> None:
    """A loop that never idles, whose steps mostly read back what they copied in (a reply), with
    no collectives. An LLM server saturated from its start (or paced by its link: the zoo's LLM
    server sending its replies over a shaped link) runs a prefill (hundreds of token ids in, one
    token out) between decodes (a token in and out per running sequence, all eight running): its
    work spans octaves, and its most common output is most of its steps. It is a server. Without
    that it was never found one (it never idles, one output dominates), was judged a training
    loop, and a flood on its link was named input starvation. A training loop of batches of
    varying length (+-40%) that reads back its outputs each step (one amount) is no server: its
    work spans less than an octave."""
    from memtrace.model.steps import Loop

    rng = np.random.default_rng(3)
    t, t0 = StepTracker(PID), 10**12
    for i in range(300):
        if prefill is not None:
            b_in, b_out = (prefill, 4) if i % 3 == 0 else (32, 32)
        else:
            b_in, b_out = int(64 * 1024 * rng.uniform(0.6, 1.4)), 4096  # a batch's sequences, its outputs
        t.add(served(t0, b_in, b_out))
        t0 += 2 * MS + 100 * US  # the next iteration at once: no idle
    st = t.stats()
    assert st is not None and st.steps == 299
    assert st.judged and st.lead_ns < 0.1 * st.judged_ns  # it never idled
    assert max(st.outputs.values()) >= st.steps / 2 and st.replies >= st.steps / 2
    assert st.loop is (Loop.SERVING if serving else Loop.TRAINING), (len(st.work), st.replies, st.outputs)


@pytest.mark.parametrize(
    ("varied", "ranked", "serving"),
    [(False, True, False), (True, True, True), (False, False, True)],
    ids=["rank-one-batch-size", "rank-batches-vary", "no-collectives-one-size"],
)
def test_a_loop_that_idles_at_random_in_collectives_is_a_server_only_if_its_work_varies(
    varied: bool, ranked: bool, serving: bool
) -> None:
    """Every step copies its input in, reads back a small result (a reply, not
    nothing) and waits; one step in eight begins late, after an idle stretch
    at random. A server idles so between requests; a data-parallel rank does
    too, waiting for its peers' exchange on a busy link (the fleet rig's ranks
    under a bulk flow were judged servers, and stayed so), and spends time in
    collectives. A rank is a server only if its batches follow a load; a loop
    with no collectives that serves one size (one request at a time, at a low
    load) is one."""
    from memtrace.model.steps import Loop

    rng = np.random.default_rng(7)
    t, t0 = StepTracker(PID), 10**12
    for i in range(400):
        lead = 20 * MS if rng.random() < 1 / 8 else 200 * US
        t0 += lead
        a = served(t0, (64 << 10) << (i % 4 if varied else 0), 4096)
        coll = None
        if ranked:  # a 0.5 ms all-reduce before the result is read back
            coll = np.zeros(1, EVENT_DTYPE)
            coll[0]["ts_ns"], coll[0]["duration_ns"] = t0 + 200 * US, 500 * US
            coll[0]["tid"], coll[0]["pid"] = TID, PID
        t.add(a, coll)
        t0 += 3 * MS
    st = t.stats()
    assert st is not None and st.steps == 399
    assert (st.collective_ns > 0) is ranked
    assert st.loop is (Loop.SERVING if serving else Loop.TRAINING), (st.judged, st.late, st.replies, len(st.work))


def test_a_servers_copies_are_counted_by_direction_and_size_with_their_time() -> None:
    """Each copy of a step, by direction and size class (bytes within a quarter octave): its
    calls, bytes and time inside the calls, exact. The diagnosis times a server's copies at equal
    size with them (a narrowed or shared link shows in each copy, whatever the load's sizes)."""
    from memtrace.model.steps import work_class

    def iteration(t0: int, out: int) -> tuple[np.ndarray, int]:
        return served(t0, 16 * out, out), t0 + 3 * MS

    t, t0 = StepTracker(PID), 10**12
    for i in range(400):
        a, t0 = iteration(t0, 1024 << (i % 4))  # four batch sizes, an octave apart
        t.add(a)
    st = t.stats()
    assert st is not None and st.steps == 399
    assert len(st.copies) == 8  # two directions, four sizes
    for (direction, size), c in st.copies.items():
        assert c.ns == c.calls * (100 if direction == Direction.H2D else 50) * US
        assert c.bytes % c.calls == 0 and work_class(c.bytes // c.calls, 0)[0] == size
    assert sum(c.calls for c in st.copies.values()) == 2 * st.steps


def test_unique_inverse_is_numpys() -> None:
    """The fold's grouping gives numpy's own answer: empty, one value (the steady fast path), many."""
    from memtrace.core.arrays import unique_inverse

    rng = np.random.default_rng(5)
    for a in (
        np.zeros(0, np.int64),
        np.full(7, 3, np.int64),
        rng.integers(-5, 5, 300),
        rng.integers(0, 1 << 62, 50),
    ):
        u, inv = unique_inverse(a)
        want_u, want_inv = np.unique(a, return_inverse=True)
        assert u.tolist() == want_u.tolist() and inv.tolist() == want_inv.tolist()
        assert (u[inv] == a).all()


@pytest.mark.parametrize("steady", [True, False], ids=["steady", "mixed"])
def test_steps_work_and_copy_classes_add_up_as_one_step_at_a_time(steady: bool) -> None:
    """A batch of steps folds into work classes, read-back amounts and copy size classes exactly
    as the steps would one at a time (work_class of each, summed), on a steady loop's batch (each
    step moving the same bytes) and on a mixed one."""
    from memtrace.model.steps import StepStats, _count_copies, _count_work, _quarter_octave, work_class

    rng = np.random.default_rng(9)
    n = 200
    b_in = np.full(n, 3 << 20, np.int64) if steady else rng.choice([0, 1000, 1100, 3 << 20], n).astype(np.int64)
    b_out = np.full(n, 4, np.int64) if steady else rng.choice([0, 4, 4096], n).astype(np.int64)
    spans = rng.integers(1_000_000, 3_000_000, n).astype(np.int64)
    busy = spans - rng.integers(0, 1000, n)
    st = StepStats()
    _count_work(st, b_in, b_out, spans, busy)
    want: dict[tuple[int, int], list[int]] = {}
    outputs: dict[int, int] = {}
    for i, o, s, b in zip(b_in.tolist(), b_out.tolist(), spans.tolist(), busy.tolist(), strict=True):
        acc = want.setdefault(work_class(i, o), [0, 0, 0, 0, 0])
        for k, v in enumerate((1, s, b, i, o)):
            acc[k] += v
        outputs[o] = outputs.get(o, 0) + 1
    got = {k: [w.steps, w.step_ns, w.busy_ns, w.bytes_in, w.bytes_out] for k, w in st.work.items()}
    assert got == want
    assert st.outputs == outputs
    direction = rng.choice([int(Direction.H2D), int(Direction.D2H)], 3 * n).astype(np.uint8)
    nbytes = (
        np.where(direction == int(Direction.H2D), 3 << 20, 4).astype(np.int64)
        if steady
        else rng.choice([4, 5, 4096, 4097, 3 << 20], 3 * n).astype(np.int64)
    )
    ns = rng.integers(0, 50_000, 3 * n).astype(np.float64)
    _count_copies(st, direction, nbytes, ns)
    want_c: dict[tuple[int, int], list[int]] = {}
    for d, nb, t in zip(direction.tolist(), nbytes.tolist(), ns.tolist(), strict=True):
        acc = want_c.setdefault((d, int(_quarter_octave(np.array([nb]))[0])), [0, 0, 0])
        acc[0] += 1
        acc[1] += nb
        acc[2] += int(t)
    got_c = {k: [c.calls, c.bytes, c.ns] for k, c in st.copies.items()}
    assert got_c == want_c
