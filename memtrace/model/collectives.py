"""NCCL collectives per process, and the waits that follow them. No I/O.

Two things are built from the NCCL sensor's events (memtrace.core.nccl.EVENT_DTYPE):

- `CollectiveStats`: per (pid, collective) calls, bytes, errors and the
  distribution of the call's own duration (the enqueue cost: NCCL returns
  once the work is queued on the stream, not when it is done).
- `attribute_waits`: the time a process then spends waiting for that work.
  A collective returns at once; the rank pays for it at its next
  synchronisation on the collective's stream (or a device-wide or event
  wait), and that wait is long on the ranks that wait for a straggler.

Bytes are the count argument times the datatype's size, as NCCL counts:
the buffer for all_reduce, broadcast, reduce; this rank's contribution
(sendcount) for all_gather, this rank's share of the result (recvcount) for
reduce_scatter; the message for send and recv; count per peer for
all_to_all. The communicator's rank count is not read, so the bytes on the
wire are not claimed.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field

import numpy as np

from memtrace.core import apis
from memtrace.core.histogram import ExpHistogram
from memtrace.core.nccl import EVENT_DTYPE, F_BYTES_UNKNOWN, F_GROUPED, Collective

NOT_ISSUED = -1  # issue time of a call whose work was never issued (failed, or its group never ended)


@dataclass
class CollectiveCalls:
    calls: int = 0
    bytes: int = 0  # successful calls with a known datatype
    errors: int = 0
    bytes_unknown: int = 0  # calls whose datatype NCCL did not define
    grouped: int = 0  # calls made inside ncclGroupStart/End
    duration_ns: int = 0
    durations: ExpHistogram = field(default_factory=ExpHistogram)  # seconds, per call


class CollectiveStats:
    """Calls per (pid, collective), fed batch by batch."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[int, Collective], CollectiveCalls] = {}

    def add(self, events: np.ndarray) -> None:
        if len(events) == 0:
            return
        keys = (events["pid"].astype(np.uint64) << np.uint64(8)) | events["coll"].astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        ev = events[order]
        starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        ends = np.r_[starts[1:], len(ks)]
        ok = ev["ret"] == 0
        known = (ev["flags"] & F_BYTES_UNKNOWN) == 0
        good_bytes = np.where(ok & known, ev["bytes"], 0)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            k = int(ks[s])
            coll = k & 0xFF
            if coll not in Collective._value2member_map_:
                continue
            st = self.by_key.setdefault((k >> 8, Collective(coll)), CollectiveCalls())
            st.calls += e - s
            st.bytes += int(good_bytes[s:e].sum())
            st.errors += int((~ok[s:e]).sum())
            st.bytes_unknown += int((~known[s:e]).sum())
            st.grouped += int(((ev["flags"][s:e] & F_GROUPED) != 0).sum())
            d = ev["duration_ns"][s:e]
            st.duration_ns += int(d.sum())
            st.durations.add(d.astype(np.float64) * 1e-9)

    def add_lost(self, pid: int, coll: Collective, calls: int, nbytes: int, errors: int, duration_ns: int) -> None:
        """Calls the ring could not take, counted by the kernel: no durations."""
        st = self.by_key.setdefault((pid, coll), CollectiveCalls())
        st.calls += calls
        st.bytes += nbytes
        st.errors += errors
        st.duration_ns += duration_ns


def issue_times(events: np.ndarray) -> np.ndarray:
    """When each call's work was handed to the GPU (ns, the events' clock):
    its return; for a call inside a group, the return of the outermost
    ncclGroupEnd that follows it on the same thread. NOT_ISSUED for failed
    calls, group calls themselves, and calls whose group has not ended."""
    n = len(events)
    out = np.full(n, NOT_ISSUED, np.int64)
    if n == 0:
        return out
    end = (events["ts_ns"] + events["duration_ns"]).astype(np.int64)
    coll = events["coll"]
    is_group = (coll == Collective.GROUP_START) | (coll == Collective.GROUP_END)
    ok = events["ret"] == 0
    grouped = (events["flags"] & F_GROUPED) != 0
    direct = ok & ~is_group & ~grouped
    out[direct] = end[direct]
    # Outermost group ends (depth 1 at the call), per thread, in time order.
    gend = (coll == Collective.GROUP_END) & (events["depth"] == 1)
    want = ok & ~is_group & grouped
    thread = (events["pid"].astype(np.uint64) << np.uint64(32)) | events["tid"].astype(np.uint64)
    for key in np.unique(thread[want]).tolist():
        same = thread == np.uint64(key)
        ends = np.sort(end[gend & same])
        idx = np.flatnonzero(want & same)
        pos = np.searchsorted(ends, events["ts_ns"][idx].astype(np.int64), side="left")
        has = pos < len(ends)
        out[idx[has]] = ends[pos[has]]
    return out


class SyncScope(enum.IntEnum):
    STREAM = 0  # waits for one stream (the event's `stream`)
    DEVICE = 1  # waits for every stream (cudaDeviceSynchronize, cuCtxSynchronize)
    EVENT = 2  # waits for an event, recorded on a stream memtrace does not know


_SCOPE = {apis.SyncKind.STREAM: SyncScope.STREAM, apis.SyncKind.DEVICE: SyncScope.DEVICE}


def sync_scopes(api_ids: np.ndarray) -> np.ndarray:
    """SyncScope of each CUDA sensor sync event, from its api id."""
    table = np.full(max(apis.BY_ID) + 1, SyncScope.EVENT, np.uint8)
    for a in apis.BY_ID.values():
        if a.sync is not None:
            table[a.id] = _SCOPE.get(a.sync, SyncScope.EVENT)
    ids = np.asarray(api_ids, np.int64)
    return np.where(ids < len(table), table[np.minimum(ids, len(table) - 1)], SyncScope.EVENT).astype(np.uint8)


@dataclass
class WaitAttribution:
    wait_ns: np.ndarray  # per collective event: the wait attributed to it (0: none)
    sync_index: np.ndarray  # per collective event: the sync event it was charged with (-1: none)
    by_collective: dict[Collective, tuple[int, int]]  # waits attributed, total ns

    def total_ns(self, coll: Collective) -> int:
        return self.by_collective.get(coll, (0, 0))[1]


class WaitAttributor:
    """attribute_waits for one process, fed as the events come: collectives
    from the NCCL sensor (polled on the host-signal timer), waits from the
    CUDA sensor (drained every few ms), in any interleaving.

    A wait can be judged only once every collective issued before it began
    is known: `advance(until_ns)` judges the waits that began by then (the
    NCCL sensor's last poll, as CLOCK_MONOTONIC ns, the events' clock), in
    the order they began; later ones wait. Grouped calls whose group has not
    ended yet are kept until it does. Bounded: at most MAX_WAITING waits and
    MAX_WAITING grouped calls wait; beyond that the oldest are dropped and
    counted (`dropped`), never silently misjudged."""

    MAX_WAITING = 65536

    def __init__(self, record: bool = False) -> None:
        self._issued: list[tuple[int, int, int, int]] = []  # heap: (issued, id, stream, coll) not yet live
        self._pending: dict[int, tuple[int, int, int]] = {}  # stream -> (issued, id, coll): latest live, not waited for
        self._syncs: list[tuple[int, int, int, int, int]] = []  # heap: (start, id, duration, stream, scope)
        self._ungrouped = np.zeros(0, EVENT_DTYPE)  # grouped calls (and their ids) whose group has not ended
        self._ungrouped_ids = np.zeros(0, np.int64)
        self.by_collective: dict[Collective, tuple[int, int]] = {}  # waits attributed, total ns
        self.charges: list[tuple[int, int, int]] = []  # (collective id, sync id, ns), with `record`
        self._record = record
        self._next_id = 0
        self.dropped = 0

    def add_collectives(self, events: np.ndarray, ids: np.ndarray | None = None) -> None:
        """NCCL sensor events (EVENT_DTYPE of memtrace.core.nccl), in ring order."""
        if ids is None:
            ids = np.arange(self._next_id, self._next_id + len(events), dtype=np.int64)
            self._next_id += len(events)
        ev = np.concatenate([self._ungrouped, events]) if len(self._ungrouped) else events
        idx = np.concatenate([self._ungrouped_ids, ids]) if len(self._ungrouped_ids) else ids
        issued = issue_times(ev)
        live = issued != NOT_ISSUED
        streams, colls = ev["stream"][live].tolist(), ev["coll"][live].tolist()
        for t, i, st, c in zip(issued[live].tolist(), idx[live].tolist(), streams, colls, strict=True):
            heapq.heappush(self._issued, (t, i, st, c))
        # Grouped calls still waiting for their group's end (ok calls only: failed ones are never issued).
        coll = ev["coll"]
        wait = (
            (issued == NOT_ISSUED)
            & (ev["ret"] == 0)
            & ((ev["flags"] & F_GROUPED) != 0)
            & (coll != Collective.GROUP_START)
            & (coll != Collective.GROUP_END)
        )
        self._ungrouped, self._ungrouped_ids = ev[wait], idx[wait]
        if len(self._ungrouped) > self.MAX_WAITING:
            self.dropped += len(self._ungrouped) - self.MAX_WAITING
            self._ungrouped = self._ungrouped[-self.MAX_WAITING :]
            self._ungrouped_ids = self._ungrouped_ids[-self.MAX_WAITING :]

    def add_syncs(self, ts_ns: np.ndarray, duration_ns: np.ndarray, streams: np.ndarray, scopes: np.ndarray) -> None:
        """The process's CUDA synchronisation events (their SyncScope each)."""
        base = self._next_id
        self._next_id += len(ts_ns)
        for k, (t, d, st, sc) in enumerate(
            zip(ts_ns.tolist(), duration_ns.tolist(), streams.tolist(), scopes.tolist(), strict=True)
        ):
            heapq.heappush(self._syncs, (t, base + k, d, st, sc))
        while len(self._syncs) > self.MAX_WAITING:  # the oldest waits go first: they are judged least late
            heapq.heappop(self._syncs)
            self.dropped += 1

    def advance(self, until_ns: int) -> None:
        """Judge every wait that began at or before `until_ns`, in order."""
        while self._syncs and self._syncs[0][0] <= until_ns:
            start, sid, duration, stream, scope = heapq.heappop(self._syncs)
            while self._issued and self._issued[0][0] <= start:
                t, i, st, c = heapq.heappop(self._issued)
                self._pending[st] = (t, i, c)
            if scope == SyncScope.STREAM:
                hit = self._pending.pop(stream, None)
            else:
                hit = max(self._pending.values()) if self._pending else None
                self._pending.clear()
            if hit is not None:
                _t, i, c = hit
                n, ns = self.by_collective.get(Collective(c), (0, 0))
                self.by_collective[Collective(c)] = (n + 1, ns + duration)
                if self._record:
                    self.charges.append((i, sid, duration))


def attribute_waits(collectives: np.ndarray, syncs: np.ndarray, scopes: np.ndarray | None = None) -> WaitAttribution:
    """Charge each synchronisation wait of one process to the collective it
    waited for: the last collective issued on the waited stream (any stream
    for a device or event wait) before the wait began and not yet waited
    for. A wait with no such collective (it waited for copies or kernels
    only) is charged to none. Each collective is charged at most once: the
    first wait that covers it; collectives issued earlier on the same stream
    and still pending are covered by the same wait and charged nothing.

    `collectives`: NCCL sensor events (EVENT_DTYPE of memtrace.core.nccl).
    `syncs`: arrays with ts_ns, duration_ns, stream (the CUDA sensor's sync
    events of the same process); `scopes`: their SyncScope (all STREAM if None).
    All at once: WaitAttributor over the whole of both.
    """
    n, m = len(collectives), len(syncs)
    a = WaitAttributor(record=True)
    a.add_collectives(collectives, np.arange(n, dtype=np.int64))
    a._next_id = n
    a.add_syncs(
        np.asarray(syncs["ts_ns"], np.int64) if m else np.zeros(0, np.int64),
        np.asarray(syncs["duration_ns"], np.int64) if m else np.zeros(0, np.int64),
        np.asarray(syncs["stream"], np.uint64) if m else np.zeros(0, np.uint64),
        np.zeros(m, np.uint8) if scopes is None else np.asarray(scopes, np.uint8),
    )
    a.advance(2**63 - 1)
    wait = np.zeros(n, np.int64)
    charged = np.full(n, -1, np.int64)
    for i, sid, ns in a.charges:
        wait[i] = ns
        charged[i] = sid - n
    return WaitAttribution(wait, charged, dict(a.by_collective))
