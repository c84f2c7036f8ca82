"""The events ring's readers on rings laid out by hand: memtrace's C reader
(libbpf's loop, with acquire loads) and the numpy reader it falls back to
must agree with each other and with the ring's truth, record for record:
what was committed and not discarded, in order, up to the first record
still being written; records of another size skipped and counted; a backlog
that wraps past the end read whole; the consumer position where the kernel
expects it. (The real ring under real uprobes is read in every end-to-end
test; this one makes the shapes the kernel makes rarely.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace.bpf.ringbuf import BUSY, DISCARD, HDR, EventRing
from memtrace.core.abi import EVENT_DTYPE

SIZE = 4096  # a page: small, so that backlogs wrap often
ITEM = EVENT_DTYPE.itemsize


def readers() -> list[str]:
    ring = EventRing.over(
        np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.zeros(2 * SIZE, np.uint8), SIZE, EVENT_DTYPE
    )
    return ["numpy", "c"] if ring.reader == "c" else ["numpy"]


class HandRing:
    """A ring's pages as the kernel keeps them: the consumer and producer
    positions, and the data twice (the same pages mapped back to back)."""

    def __init__(self, start: int) -> None:
        self.cons = np.array([start], np.uint64)
        self.prod = np.array([start], np.uint64)
        self.phys = np.zeros(SIZE, np.uint8)
        self.data = np.zeros(2 * SIZE, np.uint8)

    def add(self, payload: bytes, flags: int = 0) -> int:
        pos = int(self.prod[0])
        rec = len(payload).to_bytes(4, "little") + bytes(4) + payload
        rec = rec.ljust((HDR + len(payload) + 7) & ~7, b"\0")
        hdr = (len(payload) | flags).to_bytes(4, "little")
        rec = hdr + rec[4:]
        idx = (np.arange(len(rec)) + pos) % SIZE
        self.phys[idx] = np.frombuffer(rec, np.uint8)
        self.prod[0] = pos + len(rec)
        self.data[:SIZE] = self.data[SIZE:] = self.phys
        return pos

    def commit(self, pos: int) -> None:
        """Clear a record's BUSY bit, as bpf_ringbuf_submit does."""
        idx = (np.arange(4) + pos) % SIZE
        hdr = int.from_bytes(self.phys[idx].tobytes(), "little") & ~BUSY
        self.phys[idx] = np.frombuffer(hdr.to_bytes(4, "little"), np.uint8)
        self.data[:SIZE] = self.data[SIZE:] = self.phys

    def reader(self, kind: str) -> EventRing:
        return EventRing.over(self.cons, self.prod, self.data, SIZE, EVENT_DTYPE, reader=kind)


def event(i: int) -> bytes:
    e = np.zeros(1, EVENT_DTYPE)
    e["pid"], e["bytes"], e["duration_ns"] = 1000 + i, 4096 * i + 1, 7 * i + 3
    return e.tobytes()


# A record: ("event" | "discard" | "other size" of n bytes | "busy").
record = st.one_of(
    st.just(("event", 0)),
    st.just(("discard", 0)),
    st.tuples(st.just("other"), st.integers(0, 100).filter(lambda n: n != ITEM)),
    st.just(("busy", 0)),
)


@pytest.mark.parametrize("kind", readers())
@given(start=st.integers(0, 3 * SIZE), recs=st.lists(record, max_size=40))
@settings(max_examples=300, deadline=None)
def test_a_reader_returns_what_was_committed_in_order(kind: str, start: int, recs: list[tuple[str, int]]) -> None:
    ring = HandRing(start)
    want, malformed, busy_at = [], 0, None
    used = 0
    for i, (what, n) in enumerate(recs):
        payload = event(i) if what in ("event", "discard", "busy") else bytes(range(n % 256))[:n].ljust(n, b"x")
        if used + HDR + len(payload) + 8 > SIZE:  # the kernel never lets the producer lap the consumer
            break
        flags = {"discard": DISCARD, "busy": BUSY}.get(what, 0)
        pos = ring.add(payload, flags)
        used += (HDR + len(payload) + 7) & ~7
        if busy_at is None:
            if what == "busy":
                busy_at = pos
            elif what == "event":
                want.append(payload)
            elif what == "other":
                malformed += 1
    r = ring.reader(kind)
    got = r.read()
    assert got.tobytes() == b"".join(want)
    assert r.malformed == malformed
    assert int(ring.cons[0]) == (busy_at if busy_at is not None else int(ring.prod[0]))
    if busy_at is not None:  # committed later: the next read goes on from there
        ring.commit(busy_at)
        rest = r.read()
        assert int(ring.cons[0]) > busy_at
        assert len(rest) >= 1 and rest[:1].tobytes() == event(next(i for i, (w, _) in enumerate(recs) if w == "busy"))


def test_both_readers_agree_on_a_full_ring_that_wraps() -> None:
    if "c" not in readers():
        pytest.skip("memtrace's C helpers are not built here")
    got = {}
    for kind in ("numpy", "c"):
        ring = HandRing(SIZE - 40)  # the first record straddles the end of the pages
        for i in range(SIZE // (HDR + ITEM) - 1):
            ring.add(event(i))
        got[kind] = (ring.reader(kind).read().tobytes(), int(ring.cons[0]))
    assert got["numpy"] == got["c"]
    assert len(got["c"][0]) == (SIZE // (HDR + ITEM) - 1) * ITEM
