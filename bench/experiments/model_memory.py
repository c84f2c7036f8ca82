"""The model's own memory at 1000 processes, without BPF or an export (issue 13).

    .venv/bin/python bench/experiments/model_memory.py [--processes 1000] [--batches 20]

Folds synthetic copy events into a Model as the agent's fold thread does:
each process makes 50 synchronous copies per batch through three copy APIs
and four sizes (the footprint bench's mix), at random times, so no thread
ever settles into steps (the step search's worst case: it keeps its pending
events and every candidate symbol's last waits). Prints the resident memory
after the imports and after the fold, and the top allocation sites (with
--trace; tracemalloc inflates the resident figure). bench/targets/footprint.py
measures the whole agent, real uprobes and exports included; this one
isolates the model, whose figure moves little with machine load.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.harness import rss_mb  # the footprint target's reading of the agent's resident memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--trace", action="store_true", help="list the top allocation sites (tracemalloc)")
    a = ap.parse_args()

    import numpy as np

    from memtrace.core import apis
    from memtrace.core.abi import EVENT_DTYPE, Family
    from memtrace.model.aggregate import Model

    base = rss_mb()
    if a.trace:
        tracemalloc.start(1)
    copies = [x.id for x in apis.BY_ID.values() if x.family == Family.COPY and x.synchronous][:3]
    m, rng, per = Model(), np.random.default_rng(1), 50
    sizes = np.array([4 << 10, 64 << 10, 1 << 20, 16 << 20], dtype=np.uint64)
    pids = np.repeat(np.arange(100_000, 100_000 + a.processes), per)
    for rep in range(a.batches):
        b = np.zeros(len(pids), EVENT_DTYPE)
        b["pid"] = b["tid"] = pids
        b["start_ns"] = pids * 1000
        b["api"] = np.array(copies)[rng.integers(0, len(copies), len(b))]
        b["direction"] = 1
        b["src"] = b["dst"] = 0x10000
        b["bytes"] = sizes[rng.integers(0, 4, len(b))]
        b["ts_ns"] = rep * 10**9 + np.sort(rng.integers(0, 10**9, len(b)))
        b["duration_ns"] = rng.lognormal(np.log(20e3), 1.0, len(b)).astype(np.uint64) + 1
        m.add_events(b)
    del b
    gc.collect()
    events = a.processes * per * a.batches
    print(f"copy APIs {copies}; {a.processes} processes, {events:,} events, {len(m.copies):,} series")
    print(f"resident: {base:.1f} MB after the imports, {rss_mb():.1f} MB after the fold (+{rss_mb() - base:.1f} MB)")
    if a.trace:
        for st in tracemalloc.take_snapshot().statistics("lineno")[:12]:
            print(f"  {st.size / 1e6:7.2f} MB {st.count:8d}  {st.traceback}")


if __name__ == "__main__":
    main()
