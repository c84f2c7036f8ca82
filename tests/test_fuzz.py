"""Property-based fuzzing: malformed input gives a clear error or is skipped
and counted, never a crash or a wrong total."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from memtrace.cli import app
from memtrace.core.abi import EVENT_DTYPE, CtlEvent, Family
from memtrace.core.apis import BY_ID
from memtrace.export.report import summary
from memtrace.model import BookChanges, Model
from memtrace.sensors.cuda import control

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@given(st.lists(st.binary(min_size=0, max_size=120), max_size=40))
@settings(max_examples=300, deadline=None)
def test_control_records_of_any_shape_are_taken_or_refused_never_misread(records: list[bytes]) -> None:
    """The control ring's records: one of the right size and a known type is
    taken as it is; anything else is refused (the control thread counts it
    as malformed). Event records of any shape: tests/test_ringbuf.py."""
    n = ctypes.sizeof(CtlEvent)
    for kind in (1, 3, 4, 2):
        records.append(bytes(8) + kind.to_bytes(4, "little") + bytes(n - 12))
    for r in records:
        ev = control.decode(r)
        if len(r) != n or int.from_bytes(r[8:12], "little") not in (1, 3, 4):
            assert ev is None
        else:
            assert ev is not None and bytes(ev) == r


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1), st.integers(0, 255), st.integers(0, 2**63))
@settings(max_examples=200, deadline=None)
def test_any_event_values_are_aggregated_without_error(pid: int, api: int, direction: int, nbytes: int) -> None:
    b = np.zeros(3, dtype=EVENT_DTYPE)
    b["pid"], b["api"], b["direction"], b["bytes"] = pid, api, direction, nbytes
    b["duration_ns"] = [0, 1, 2**63]
    m = Model()
    m.add_events(b)
    doc = summary(m, {}, [])
    if api in BY_ID and BY_ID[api].family != Family.COPY:
        return  # a memory call or a wait: not a copy row
    (st_,) = m.copies.values()
    assert st_.events == 3 and st_.durations.count == 3 and st_.sizes.count == 3
    (row,) = doc["memcpy"]
    assert row["calls"] == 3 and row["bytes"] == 3 * nbytes  # exact past 2**64


@given(endpoint=text, headers=text, protocol=text, temporality=text, histogram=text, ring=st.floats(allow_nan=True))
@settings(max_examples=200, deadline=None)
def test_push_options_fail_cleanly(
    endpoint: str, headers: str, protocol: str, temporality: str, histogram: str, ring: float
) -> None:
    # The ring size is out of range, so push can never start: every input must
    # end in a clear message and exit code 2, never a traceback.
    ring = 5000.0 if not (ring != ring) and 0.004 <= ring <= 1024 else ring
    r = CliRunner().invoke(
        app,
        [
            "push",
            "--endpoint",
            endpoint,
            "--headers",
            headers,
            "--protocol",
            protocol,
            "--temporality",
            temporality,
            "--histogram",
            histogram,
            "--ring-size",
            str(ring),
        ],
        env={},
    )
    assert r.exit_code == 2, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output


@given(fmt=text, ring=text)
@settings(max_examples=100, deadline=None)
def test_run_options_fail_cleanly_before_anything_starts(fmt: str, ring: str) -> None:
    r = CliRunner().invoke(app, ["run", "--format", fmt, "--ring-size", ring, "--", "/nonexistent/cmd"])
    if fmt in ("table", "json"):
        try:
            ok = 0.004 <= float(ring) <= 1024
        except ValueError:
            ok = False
        if ok:
            return  # a valid invocation: covered by the BPF tests
    assert r.exit_code == 2, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)


def _naive_replay(book: list, ops: list, queries: list) -> tuple[list[int], list]:  # type: ignore[type-arg]
    """The book's rule said plainly, one change at a time: a new range
    replaces every range it overlaps; removing needs the exact start; a
    pointer is what the one range holding it says."""
    out = {}
    events = sorted([(at, 1, i) for i, (at, _) in enumerate(queries)] + [(at, 0, i) for i, (at, *_) in enumerate(ops)])
    for _at, is_query, i in events:
        if is_query:
            p = queries[i][1]
            out[i] = next((w for s, e, w in book if s <= p < e), 0)
        else:
            _, add, start, size, what = ops[i]
            if add:
                end = start + max(size, 1)
                book = [r for r in book if r[1] <= start or r[0] >= end] + [(start, end, what)]
            else:
                book = [r for r in book if r[0] != start]
    return [out[i] for i in range(len(queries))], book


_start = st.sampled_from([0x100, 0x180, 0x200, 0x300])


@given(
    before=st.lists(st.tuples(_start, st.sampled_from([1, 0x80, 0x100]), st.sampled_from([1, 2, 3])), max_size=4),
    ops=st.lists(
        st.tuples(st.booleans(), _start, st.sampled_from([0, 8, 0x80, 0x100, 0x180]), st.sampled_from([1, 2, 3]))
    ),
    queries=st.lists(st.tuples(st.integers(0, 60), st.integers(0x0F0, 0x420)), max_size=30),
)
@settings(max_examples=500, deadline=None)
def test_address_book_replays_a_batch_as_one_change_at_a_time(before, ops, queries) -> None:  # type: ignore[no-untyped-def]
    # A batch's changes are applied at once when their ranges only ever meet
    # at the same start (JAX's staging buffer), else one by one: either way
    # each query must see the book as it stood at its ring position, and the
    # book must end as the changes leave it.
    from memtrace.model import AddressBook

    book = AddressBook()
    for start, size, what in before:
        book.add(start, size, what)
    naive_before = [(s, e, w) for s, (e, w) in book.ranges.items()]
    timed = [(2 * i + 1, add, start, size, what) for i, (add, start, size, what) in enumerate(ops)]
    expect, naive_after = _naive_replay(naive_before, timed, [(2 * t, p) for t, p in queries])
    cols = [
        np.array([o[k] for o in timed], dtype=dt)
        for k, dt in enumerate((np.int64, bool, np.uint64, np.uint64, np.uint8))
    ]
    changes = BookChanges(np.zeros(len(timed), np.uint32), *cols)
    got = book.replay(
        changes, np.array([2 * t for t, _ in queries], np.int64), np.array([p for _, p in queries], np.uint64)
    )
    assert got.tolist() == expect
    assert sorted((s, e, w) for s, (e, w) in book.ranges.items()) == sorted(naive_after)
    assert book.pinned_bytes == sum(e - s for s, e, w in naive_after if w == 2)


def test_a_staging_buffer_reused_at_one_address_is_replayed_at_once() -> None:
    # JAX's pattern: alloc, copy, free of one pinned buffer, again and again,
    # with a device range elsewhere. This must take the path without a Python
    # step per change, and say pinned only while the buffer is allocated.
    from memtrace.model import AddressBook

    book = AddressBook()
    book.add(0x9000, 0x1000, 1)
    n = 50
    op_at = np.arange(n * 2, dtype=np.int64) * 3  # alloc at 0, free at 3, alloc at 6...
    op_add = np.tile([True, False], n)
    op_start = np.full(2 * n, 0x1000, np.uint64)
    op_size = np.tile(np.array([8, 0], np.uint64), n) + np.repeat(np.arange(n, dtype=np.uint64), 2)
    op_what = np.full(2 * n, 2, np.uint8)
    q_at = np.concatenate([op_at + 1, op_at + 1])
    q_ptr = np.concatenate([np.full(2 * n, 0x1004, np.uint64), np.full(2 * n, 0x9004, np.uint64)])
    got = book._replay_at_once(
        BookChanges(np.zeros(2 * n, np.uint32), op_at, op_add, op_start, op_size, op_what), q_at, q_ptr
    )
    assert got is not None
    assert got[: 2 * n].tolist() == [2, 0] * n  # pinned after each alloc, untracked after each free
    assert got[2 * n :].tolist() == [1] * 2 * n
    assert sorted(book.ranges) == [0x9000]


# Events for the ordering property below: memory calls and copies of two
# processes over a few overlapping addresses, so ranges are replaced, reused,
# freed twice and hit at their edges.
_ADDRS = [0x10000, 0x10800, 0x11000, 2**64 - 0x1000]  # and one whose ranges would wrap
_COPY_APIS = [2, 20, 21, 22, 23, 25, 26, 27, 28]  # unified, fixed-direction and peer copies
_HOST_APIS = [46, 48, 49, 50, 66, 68]  # host alloc, free, register, unregister
_OTHER_APIS = [40, 41, 42, 45, 71, 72, 73, 74, 90]  # device, pitched, managed, VMM, a wait
_event = st.tuples(
    st.sampled_from([10**7 + 1, 10**7 + 2]),  # pid (no such process: identity is not what is tested)
    st.one_of(st.sampled_from(_COPY_APIS), st.sampled_from(_HOST_APIS), st.sampled_from(_OTHER_APIS)),
    st.sampled_from([0, 1, 2, 3, 4, 5]),  # direction, as the kernel sent it (fixed APIs override)
    st.sampled_from(_ADDRS + [0]),  # dst
    st.sampled_from(_ADDRS + [0]),  # src
    st.sampled_from([0, 1, 0x7FF, 0x800, 0x1000, 0x2800]),  # bytes
    st.sampled_from([0, 0, 0, 2]),  # ret
    st.sampled_from([0, 1, 0x7FF, 0x800]),  # pointer offset into the range
    st.sampled_from([1, 1, 2, 17, 40]),  # repeats: long runs of copies reach the numpy path
)


def _events(rows: list) -> np.ndarray:  # type: ignore[type-arg]
    out = []
    for pid, api, d, dst, src, nbytes, ret, off, rep in rows:
        a = BY_ID[api]
        if a.family == Family.COPY and a.dirsrc == 0 and a.dirval not in (4, 5):
            d = a.dirval
        n = rep if a.family == Family.COPY else 1
        out += [(pid, api, d, dst + off, src + off, nbytes, ret, 3)] * n
    b = np.zeros(len(out), dtype=EVENT_DTYPE)
    for i, (pid, api, d, dst, src, nbytes, ret, aux) in enumerate(out):
        b[i]["pid"], b[i]["api"], b[i]["direction"] = pid, api, d
        b[i]["dst"], b[i]["src"], b[i]["bytes"], b[i]["ret"], b[i]["stream"] = dst, src, nbytes, ret, aux
        b[i]["duration_ns"] = 1000 + i
    return b


def _state(m: Model) -> dict:  # type: ignore[type-arg]
    return {
        "copies": {
            k: (v.calls, v.bytes, v.errors, v.duration_ns, v.durations.count, v.sizes.count)
            for k, v in m.copies.items()
        },
        "syncs": {k: (v.calls, v.duration_ns) for k, v in m.syncs.items()},
        "books": {pid: dict(p.book.ranges) for pid, p in m.processes.items()},
        "pinned": {pid: p.book.pinned_bytes for pid, p in m.processes.items()},
        "memory": {
            pid: (
                p.memory.allocations, p.memory.allocated_bytes, p.memory.frees, p.memory.freed_bytes,
                p.memory.unknown_frees, p.memory.failed_allocations, p.memory.in_use_bytes,
                p.memory.peak_bytes, dict(p.memory.live), p.memory.sizes.count,
            )
            for pid, p in m.processes.items()
        },
    }  # fmt: skip


@pytest.mark.slow
@given(rows=st.lists(_event, min_size=1, max_size=60), complete=st.booleans())
@settings(max_examples=500, deadline=None)
def test_a_batch_folds_exactly_as_its_events_one_by_one(rows: list, complete: bool) -> None:  # type: ignore[type-arg]
    # Memory calls change the address books between copies: however a batch
    # mixes them, the batch path (inline host calls, one-at-a-time and numpy
    # segments) must give what folding each event alone gives.
    b = _events(rows)
    after = None if complete else 1 << 62
    whole, single = Model(complete_after_ns=after), Model(complete_after_ns=after)
    whole.add_events(b)
    for i in range(len(b)):
        single.add_events(b[i : i + 1])
    assert _state(whole) == _state(single)
    # Every allocation's size is in its process's histogram, once.
    for p in whole.processes.values():
        assert (p.memory.sizes.count, p.memory.sizes.sum) == (p.memory.allocations, p.memory.allocated_bytes)
