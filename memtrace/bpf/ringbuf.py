"""A batched reader for the `events` ring: the whole backlog in one numpy view.

libbpf's ring_buffer__consume calls back into Python once per record, and that
callback (ctypes, one bytes object per event) was the agent's whole cost: 650k
events/s per core. Every record on the `events` ring has the same size, so the
backlog between the consumer and producer positions is an array of fixed-size
records. This reader maps the ring as libbpf does (consumer page read-write,
producer page and data read-only, the data mapped twice so a backlog that
wraps is contiguous), checks the record headers in one vectorised pass, copies
the committed events out, and advances the consumer position once.

Memory ordering: the kernel publishes the producer position with a release
store when it reserves a record, and commits the record with a release store
to its header (clearing BUSY). libbpf (and cilium/ebpf) read both with
acquire loads and store the consumer position with a release store. A load
here must not be satisfied before the load it depends on: on arm64 a plain
load of a record's data can be, before the load of its header, and a
committed header could then come with stale data. Python has no acquire
load, and a call per record would undo the batching, so the reader puts a
full barrier between each stage instead, which is stronger than acquire for
every load of the stage before it:

    load producer position; FENCE; load every header; FENCE;
    copy the committed records; FENCE; store the consumer position.

The barrier is a threading.Lock taken and released twice: CPython's lock is
an atomic read-modify-write with acquire semantics and its release one with
release semantics (glibc semaphores or mutexes up to 3.12, PyMutex's
sequentially consistent compare-and-swap from 3.13), and a release followed
by an acquire of the same lock orders every access before it before every
access after it, on arm64 as on x86. It needs no compiler and no library
beyond Python (libatomic, which a ctypes fence could use, is not in every
image); each barrier costs about 1 us on the 2-core CI machine, three per
batch, not per record (bench/ring_fence.py: +2% on a batch of 4096
records, +8% on one of 64). On x86 (TSO) loads are not reordered with loads, so the
barriers cost but change nothing there.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from typing import Any

import numpy as np

from memtrace.core import native

BUSY = 1 << 31  # BPF_RINGBUF_BUSY_BIT: reserved, not yet committed
DISCARD = 1 << 30  # BPF_RINGBUF_DISCARD_BIT
HDR = 8  # BPF_RINGBUF_HDR_SZ

_fence_lock = threading.Lock()


def _fence() -> None:
    """A full memory barrier (acquire + release): a lock taken and released twice."""
    with _fence_lock:
        pass
    with _fence_lock:
        pass


def _c_reader() -> Any:
    """memtrace's C reader (mt_ring_read), or None where the C helpers are not built."""
    try:
        f = native.library().mt_ring_read
    except (native.NativeUnavailable, AttributeError):
        return None
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64
    f.argtypes = [vp, vp, vp, u64, ctypes.c_uint32, vp, u64, ctypes.POINTER(u64)]
    f.restype = u64
    return f


class RingPositions:
    """A second, read-only mapping of a ring's consumer and producer pages,
    whose reader is someone else (libbpf's, for the control ring): for a
    watcher that wants to know when records wait (sources/fastsample.py,
    watch_ring). The kernel allows a read-only mapping of a ring at any
    offset; the pages are the reader's own."""

    def __init__(self, fd: int) -> None:
        page = mmap.PAGESIZE
        self._map = mmap.mmap(fd, 2 * page, mmap.MAP_SHARED, mmap.PROT_READ, offset=0)
        self._cons = np.frombuffer(self._map, np.uint64, 1, 0)
        self._prod = np.frombuffer(self._map, np.uint64, 1, page)

    def positions(self) -> tuple[int, int]:
        """The addresses of the consumer and producer positions: valid until close()."""
        return int(self._cons.ctypes.data), int(self._prod.ctypes.data)

    def close(self) -> None:
        del self._cons, self._prod
        self._map.close()


class EventRing:
    """Reads with memtrace's C reader where it is built (`reader` "c": the
    loop libbpf runs, with acquire loads, and a copy per record), else with
    the vectorised numpy reader below ("numpy"); `reader` may name one."""

    def __init__(self, fd: int, size: int, dtype: np.dtype, reader: str = "auto") -> None:
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError(f"ring size {size} is not a power-of-two multiple of the page size")
        page = mmap.PAGESIZE
        self._maps: tuple[mmap.mmap, ...] = (
            mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0),
            mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page),
        )
        cons, prod = self._maps
        self._setup(
            np.frombuffer(cons, np.uint64, 1),
            np.frombuffer(prod, np.uint64, 1),
            np.frombuffer(prod, np.uint8, 2 * size, page),
            size,
            dtype,
            reader,
        )

    @classmethod
    def over(
        cls, cons: np.ndarray, prod: np.ndarray, data: np.ndarray, size: int, dtype: np.dtype, reader: str = "auto"
    ) -> EventRing:
        """A reader of memory laid out as the kernel lays out a ring (`data`
        twice `size` bytes, its second half the first's twin): for records
        written by hand, in tests and benchmarks."""
        ring = cls.__new__(cls)
        ring._maps = ()
        ring._setup(cons, prod, data, size, dtype, reader)
        return ring

    def _setup(
        self, cons: np.ndarray, prod: np.ndarray, data: np.ndarray, size: int, dtype: np.dtype, reader: str
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.record = (HDR + dtype.itemsize + 7) & ~7
        self._cons, self._prod, self._data = cons, prod, data
        self.malformed = 0  # records of another size (skipped, counted)
        self._c: Any = _c_reader() if reader in ("auto", "c") else None
        if reader == "c" and self._c is None:
            raise native.NativeUnavailable("memtrace's C ring reader is not built here", "reinstall with gcc")
        self.reader = "c" if self._c is not None else "numpy"

    def read(self) -> np.ndarray:
        """Every committed event now on the ring, in ring order; consumes them."""
        cons = int(self._cons[0])  # ours: no other writer
        prod = int(self._prod[0])
        if prod == cons:
            return np.empty(0, self.dtype)
        if self._c is not None:
            return self._read_c(prod - cons)
        _fence()  # acquire: the headers are read after the producer position
        avail = prod - cons
        n = avail // self.record
        start = cons & (self.size - 1)
        raw = self._data[start : start + n * self.record].reshape(n, self.record)
        hdr = raw[:, :4].copy().view("<u4")[:, 0]
        _fence()  # acquire: each record's data is read after its header
        busy = np.flatnonzero(hdr & BUSY)
        k = int(busy[0]) if len(busy) else n
        sizes = hdr[:k] & ~np.uint32(BUSY | DISCARD)
        if k and (sizes != self.dtype.itemsize).any() or (k == n and avail % self.record):
            return self._read_slow(cons, prod)
        keep = (hdr[:k] & DISCARD) == 0
        out = raw[:k, HDR : HDR + self.dtype.itemsize][keep].copy().view(self.dtype).reshape(-1)
        _fence()  # release: the copies are done before the kernel may reuse the space
        self._cons[0] = cons + k * self.record
        batch: np.ndarray = out
        return batch

    def _read_c(self, avail: int) -> np.ndarray:
        # Up to the producer position seen on entry, as the numpy reader: a
        # drain never chases a producer that keeps writing.
        end = int(self._cons[0]) + avail
        parts = []
        while avail > 0:
            # Room for every record of the event's size seen waiting; smaller
            # records (malformed) may leave more: read on until a call ends short.
            cap = avail // self.record + 1
            out = np.empty(cap, self.dtype)
            malformed = ctypes.c_uint64(0)
            n = int(
                self._c(
                    self._cons.ctypes.data,
                    self._prod.ctypes.data,
                    self._data.ctypes.data,
                    self.size - 1,
                    self.dtype.itemsize,
                    out.ctypes.data,
                    cap,
                    ctypes.byref(malformed),
                )
            )
            self.malformed += malformed.value
            parts.append(out[:n] if n < cap else out)
            if n < cap:
                break
            avail = end - int(self._cons[0])
        batch: np.ndarray = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return batch

    def _read_slow(self, cons: int, prod: int) -> np.ndarray:
        """Record by record, for a backlog holding a record of another size."""
        keep = []
        mask = self.size - 1
        _fence()  # acquire: the headers are read after the producer position
        while cons < prod:
            off = cons & mask
            hdr = int(self._data[off : off + 4].view("<u4")[0])
            if hdr & BUSY:
                break
            _fence()  # acquire: this record's data is read after its header
            length = hdr & ~(BUSY | DISCARD)
            if not hdr & DISCARD:
                if length == self.dtype.itemsize:
                    keep.append(self._data[off + HDR : off + HDR + length].copy())
                else:
                    self.malformed += 1
            cons += (HDR + length + 7) & ~7
        _fence()
        self._cons[0] = cons
        if not keep:
            return np.empty(0, self.dtype)
        return np.concatenate(keep).view(self.dtype)

    def positions(self) -> tuple[int, int]:
        """The addresses of the consumer and producer positions, for a
        watcher that reads them (sources/fastsample.py, watch_ring): valid
        until close()."""
        return int(self._cons.ctypes.data), int(self._prod.ctypes.data)

    def close(self) -> None:
        del self._cons, self._prod, self._data
        for m in self._maps:
            m.close()
