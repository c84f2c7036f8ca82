"""A batched reader for the `events` ring: the whole backlog in one numpy view.

libbpf's ring_buffer__consume calls back into Python once per record, and that
callback (ctypes, one bytes object per event) was the agent's whole cost: 650k
events/s per core. Every record on the `events` ring has the same size, so the
backlog between the consumer and producer positions is an array of fixed-size
records. This reader maps the ring as libbpf does (consumer page read-write,
producer page and data read-only, the data mapped twice so a backlog that
wraps is contiguous), checks the record headers in one vectorised pass, copies
the committed events out, and advances the consumer position once.

Memory ordering: the kernel commits a record with a release store to its
header and publishes the producer position with a release store. The reads
here must not be reordered before those loads (on arm64 they can be); a
lock released and taken again between them is a full barrier on every
platform Python runs on, which is what libbpf's smp_load_acquire gives.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

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


class EventRing:
    def __init__(self, fd: int, size: int, dtype: np.dtype) -> None:
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError(f"ring size {size} is not a power-of-two multiple of the page size")
        page = mmap.PAGESIZE
        self.size = size
        self.dtype = dtype
        self.record = (HDR + dtype.itemsize + 7) & ~7
        self._cons_map = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod_map = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._cons = np.frombuffer(self._cons_map, np.uint64, 1)
        self._prod = np.frombuffer(self._prod_map, np.uint64, 1)
        self._data = np.frombuffer(self._prod_map, np.uint8, 2 * size, page)
        self.malformed = 0  # records of another size (skipped, counted)

    def read(self) -> np.ndarray:
        """Every committed event now on the ring, in ring order; consumes them."""
        cons = int(self._cons[0])
        prod = int(self._prod[0])
        if prod == cons:
            return np.empty(0, self.dtype)
        _fence()
        avail = prod - cons
        n = avail // self.record
        start = cons & (self.size - 1)
        raw = self._data[start : start + n * self.record].reshape(n, self.record)
        hdr = raw[:, :4].copy().view("<u4")[:, 0]
        busy = np.flatnonzero(hdr & BUSY)
        k = int(busy[0]) if len(busy) else n
        sizes = hdr[:k] & ~np.uint32(BUSY | DISCARD)
        if k and (sizes != self.dtype.itemsize).any() or (k == n and avail % self.record):
            return self._read_slow(cons, prod)
        keep = (hdr[:k] & DISCARD) == 0
        out = raw[:k, HDR : HDR + self.dtype.itemsize][keep].copy().view(self.dtype).reshape(-1)
        _fence()
        self._cons[0] = cons + k * self.record
        return out

    def _read_slow(self, cons: int, prod: int) -> np.ndarray:
        """Record by record, for a backlog holding a record of another size."""
        keep = []
        mask = self.size - 1
        while cons < prod:
            off = cons & mask
            hdr = int(self._data[off : off + 4].view("<u4")[0])
            if hdr & BUSY:
                break
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

    def close(self) -> None:
        del self._cons, self._prod, self._data
        self._cons_map.close()
        self._prod_map.close()
