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
from dataclasses import dataclass, field

import numpy as np

from memtrace.core import apis
from memtrace.core.histogram import ExpHistogram
from memtrace.core.nccl import F_BYTES_UNKNOWN, F_GROUPED, Collective

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
    """
    n = len(collectives)
    wait = np.zeros(n, np.int64)
    charged = np.full(n, -1, np.int64)
    issued = issue_times(collectives)
    live = np.flatnonzero(issued != NOT_ISSUED)
    live = live[np.argsort(issued[live], kind="stable")]
    m = len(syncs)
    if scopes is None:
        scopes = np.zeros(m, np.uint8)
    s_order = np.argsort(np.asarray(syncs["ts_ns"], np.int64), kind="stable") if m else np.zeros(0, np.int64)
    pending: dict[int, int] = {}  # stream -> latest pending collective (its event index)
    ci = 0
    streams = collectives["stream"]
    for si in s_order.tolist():
        start = int(syncs["ts_ns"][si])
        while ci < len(live) and issued[live[ci]] <= start:
            j = int(live[ci])
            pending[int(streams[j])] = j
            ci += 1
        if scopes[si] == SyncScope.STREAM:
            j_or_none = pending.pop(int(syncs["stream"][si]), None)
        else:
            j_or_none = max(pending.values(), key=lambda j: (int(issued[j]), j)) if pending else None
            pending.clear()
        if j_or_none is not None:
            wait[j_or_none] = int(syncs["duration_ns"][si])
            charged[j_or_none] = si
    by: dict[Collective, tuple[int, int]] = {}
    hit = np.flatnonzero(charged >= 0)
    for c in np.unique(collectives["coll"][hit]).tolist():
        sel = hit[collectives["coll"][hit] == c]
        by[Collective(c)] = (len(sel), int(wait[sel].sum()))
    return WaitAttribution(wait, charged, by)
