"""What a wake costs: the same small piece of the agent's work, hot and after
a sleep (issue 16: the agent at most 1% of a core).

    .venv/bin/python bench/wake_cost.py [--rounds N] [--calls N]

The agent's threads wake on timers (a drain every 5-40 ms, the host sample
every 0.1 s, the C sampler every 10 ms) and do a little work each time: a
drain of a trickling job reads a few dozen records. On the 2-vCPU VM that
work measured 200-300 us of CPU inside the agent, against about 10 us in a
loop. This benchmark measures that gap side by side, in one run, alternating
rounds: the records-read step of a drain (the numpy operations
memtrace/bpf/ringbuf.py's EventRing.read makes on 27 records, on an array
here, not a BPF map) run back to back, then after sleeps of 1, 5, 40 and 100
ms; and the CPU a bare timer wake costs the thread (a sleep with no work).

Printed: the median microseconds of CPU per call (this thread's CPU clock)
for each, and the ratio to back to back. Where the ratio is large, the
agent's CPU is set by how often it wakes, not by how much it reads; fewer,
fuller wakes are what lower it there.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

RECORD = 80  # an events-ring record: 8 bytes of header, 72 of event
BUSY, DISCARD, HDR, SIZE = 1 << 31, 1 << 30, 8, 72


def read_step(raw: np.ndarray) -> np.ndarray:
    """EventRing.read's vectorised steps (no fences: one thread here)."""
    hdr = raw[:, :4].copy().view("<u4")[:, 0]
    busy = np.flatnonzero(hdr & BUSY)
    k = int(busy[0]) if len(busy) else len(raw)
    sizes = hdr[:k] & ~np.uint32(BUSY | DISCARD)
    if k and (sizes != SIZE).any():
        raise AssertionError("a record of another size")
    keep = (hdr[:k] & DISCARD) == 0
    out: np.ndarray = raw[:k, HDR : HDR + SIZE][keep].copy()
    return out


def measure(sleep_s: float, calls: int, raw: np.ndarray) -> tuple[float, float]:
    """Median CPU microseconds of one read step after `sleep_s` of sleep,
    and of the sleep's own wake (the thread's CPU across time.sleep)."""
    work, wake = [], []
    for _ in range(calls):
        if sleep_s:
            s = time.thread_time_ns()
            time.sleep(sleep_s)
            wake.append(time.thread_time_ns() - s)
        t = time.thread_time_ns()
        read_step(raw)
        work.append(time.thread_time_ns() - t)
    return statistics.median(work) / 1e3, (statistics.median(wake) / 1e3 if wake else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=60, help="calls per schedule per round")
    a = ap.parse_args()
    raw = np.zeros((27, RECORD), np.uint8)
    raw[:, :4] = np.frombuffer(np.uint32(SIZE).tobytes(), np.uint8)
    sleeps = [0.0, 0.001, 0.005, 0.04, 0.1]
    work: dict[float, list[float]] = {s: [] for s in sleeps}
    wake: dict[float, list[float]] = {s: [] for s in sleeps}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}; {a.calls} calls each")
    for r in range(a.rounds):
        for s in sleeps:
            w, k = measure(s, a.calls, raw)
            work[s].append(w)
            wake[s].append(k)
        print(f"round {r + 1}: " + ", ".join(f"{s * 1e3:g} ms {work[s][-1]:.1f} us" for s in sleeps), flush=True)
    hot = statistics.median(work[0.0])
    print(f"{'sleep before':>14} {'read step (us CPU)':>19} {'x back to back':>15} {'the wake itself (us CPU)':>25}")
    for s in sleeps:
        w = statistics.median(work[s])
        label = "back to back" if s == 0 else f"{s * 1e3:g} ms"
        k = f"{statistics.median(wake[s]):.1f}" if s else "-"
        print(f"{label:>14} {w:>19.1f} {w / hot:>15.1f} {k:>25}")
    cold = statistics.median(work[0.04])
    print(
        f"SUMMARY | a drain's read step after a 40 ms sleep against back to back | "
        f"{cold:.0f} us against {hot:.0f} us of CPU ({cold / hot:.0f}x) | - | -"
    )


if __name__ == "__main__":
    main()
