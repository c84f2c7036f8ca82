"""What the ring reader's memory barriers cost (issue 14, arm64 ordering).

    .venv/bin/python bench/experiments/ring_fence.py [--records N] [--rounds R]

The reader (memtrace/bpf/ringbuf.py) puts a full barrier (a lock taken and
released twice) between loading the producer position, the record headers
and the records, and before storing the consumer position: three per batch.
This reads a ring laid out as the kernel lays it out (consumer page,
producer page, data), in a memfd filled with committed records, with the
barriers and with them replaced by nothing, alternating rounds; it prints
the medians, the cost per batch and per record, and the ratio. Each read
maps the ring afresh, so its first touch of the pages is in both figures.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np

from bench import harness
from bench.harness import Spread
from memtrace.bpf import ringbuf
from memtrace.core.abi import EVENT_DTYPE


def make_ring(records: int) -> tuple[int, int]:
    """A memfd shaped like a BPF ring of the smallest power-of-two size that holds `records`."""
    rec = (ringbuf.HDR + EVENT_DTYPE.itemsize + 7) & ~7
    size = mmap.PAGESIZE
    while size < records * rec:
        size *= 2
    page = mmap.PAGESIZE
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * page + 2 * size)
    m = mmap.mmap(fd, 2 * page + 2 * size)
    data = np.frombuffer(m, np.uint8, records * rec, 2 * page).reshape(records, rec)
    data[:, :4] = np.frombuffer(np.uint32(EVENT_DTYPE.itemsize).tobytes(), np.uint8)
    np.frombuffer(m, np.uint64, 1, page)[0] = records * rec  # producer position
    del data
    m.close()
    return fd, size


def one_read(fd: int, size: int) -> float:
    ring = ringbuf.EventRing(fd, size, EVENT_DTYPE)
    ring._cons[0] = 0
    t = time.perf_counter_ns()
    out = ring.read()
    dt = time.perf_counter_ns() - t
    ring.close()
    assert len(out) > 0
    return dt / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=200, help="reads each way, alternating")
    a = ap.parse_args()
    fd, size = make_ring(a.records)
    fence = ringbuf._fence
    reads: dict[str, list[float]] = {"without": [], "with": []}
    for _, arm in harness.alternating(list(reads), a.rounds):
        ringbuf._fence = fence if arm == "with" else (lambda: None)
        reads[arm].append(one_read(fd, size))
    ringbuf._fence = fence
    t = time.perf_counter_ns()
    for _ in range(10000):
        fence()
    per_fence = (time.perf_counter_ns() - t) / 1e4 / 1e3
    w, wo = Spread.of(reads["with"]).median, Spread.of(reads["without"]).median
    print(f"machine: {harness.describe()}")
    print(f"batch of {a.records} records, median of {len(reads['with'])} reads each way")
    print(f"  with barriers    {w:8.1f} us  ({w * 1e3 / a.records:.1f} ns/record)")
    print(f"  without          {wo:8.1f} us  ({wo * 1e3 / a.records:.1f} ns/record)")
    print(f"  one barrier      {per_fence:8.3f} us; the reader takes 3 per batch")
    print(f"  ratio            {w / wo:8.3f}")


if __name__ == "__main__":
    main()
