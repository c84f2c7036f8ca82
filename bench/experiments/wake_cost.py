"""What a wake costs: the same small piece of the agent's work, hot and after
a sleep (issue 16: the agent at most 1% of a core).

    .venv/bin/python bench/experiments/wake_cost.py [--rounds N] [--calls N] [--netlink]

The agent's threads wake on timers (a drain every 5-40 ms, the host sample
every 0.1 s, the C sampler every 10 ms) and do a little work each time: a
drain of a trickling job reads a few dozen records, and that work costs far
more inside the agent than in a loop (docs/perf/notes.md). This benchmark
measures that gap side by side, in one run, alternating
rounds: the records-read step of a drain (the numpy operations
memtrace/bpf/ringbuf.py's EventRing.read makes on 27 records, on an array
here, not a BPF map) run back to back, then after sleeps of 1, 5, 40 and 100
ms; and the CPU a bare timer wake costs the thread (a sleep with no work).

`--netlink` times the C sampler's step instead: one RTM_GETSTATS dump of
this namespace's interfaces' counters, which it makes 100 times a second
(a system call's kernel work cools in a sleep as numpy's does).

Printed: the median microseconds of CPU per call (this thread's CPU clock)
for each, and the ratio to back to back. Where the ratio is large, the
agent's CPU is set by how often it wakes, not by how much it reads; fewer,
fuller wakes are what lower it there.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np

from bench import harness
from bench.harness import Record, Spread

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


def netlink_dump(sock: socket.socket) -> None:
    """One RTM_GETSTATS dump of every interface's rtnl_link_stats64, the
    request the C sampler makes each tick (memtrace/native/fastsample.c)."""
    # nlmsghdr (len, RTM_GETSTATS, NLM_F_REQUEST | NLM_F_DUMP, seq, pid), if_stats_msg with the filter
    sock.send(struct.pack("=IHHII", 28, 94, 0x301, 1, 0) + struct.pack("=BBHiI", 0, 0, 0, 0, 1 << 2))
    while True:
        buf = sock.recv(65536)
        if not buf:
            return
        at = 0
        while at + 16 <= len(buf):
            size, kind = struct.unpack_from("=IH", buf, at)
            if kind in (2, 3) or size < 16:  # NLMSG_ERROR, NLMSG_DONE
                return
            at += (size + 3) & ~3


def measure(sleep_s: float, calls: int, step: Callable[[], object]) -> tuple[float, float]:
    """Median CPU microseconds of one step after `sleep_s` of sleep, and of
    the sleep's own wake (the thread's CPU across time.sleep)."""
    work, wake = [], []
    for _ in range(calls):
        if sleep_s:
            s = time.thread_time_ns()
            time.sleep(sleep_s)
            wake.append(time.thread_time_ns() - s)
        t = time.thread_time_ns()
        step()
        work.append(time.thread_time_ns() - t)
    return statistics.median(work) / 1e3, (statistics.median(wake) / 1e3 if wake else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=60, help="calls per schedule per round")
    ap.add_argument(
        "--netlink",
        action="store_true",
        help="the step is the C sampler's: one RTM_GETSTATS dump of this namespace's interfaces",
    )
    a = ap.parse_args()
    rec = Record()
    raw = np.zeros((27, RECORD), np.uint8)
    raw[:, :4] = np.frombuffer(np.uint32(SIZE).tobytes(), np.uint8)
    step: Callable[[], object] = lambda: read_step(raw)  # noqa: E731
    what = "a drain's read step"
    if a.netlink:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        step, what = (lambda: netlink_dump(sock)), "a netlink dump of the interfaces' counters"
    sleeps = [0.0, 0.001, 0.005, 0.04, 0.1]
    work: dict[float, list[float]] = {s: [] for s in sleeps}
    wake: dict[float, list[float]] = {s: [] for s in sleeps}
    print(f"machine: {harness.describe()}; {a.calls} calls each")
    for r, s in harness.alternating(sleeps, a.rounds):
        w, k = measure(s, a.calls, step)
        work[s].append(w)
        wake[s].append(k)
        if s == sleeps[-1]:
            print(f"round {r + 1}: " + ", ".join(f"{s * 1e3:g} ms {work[s][-1]:.1f} us" for s in sleeps), flush=True)
    hot = statistics.median(work[0.0])
    print(f"{'sleep before':>14} {'the step (us CPU)':>19} {'x back to back':>15} {'the wake itself (us CPU)':>25}")
    for s in sleeps:
        w = statistics.median(work[s])
        label = "back to back" if s == 0 else f"{s * 1e3:g} ms"
        k = f"{statistics.median(wake[s]):.1f}" if s else "-"
        print(f"{label:>14} {w:>19.1f} {w / hot:>15.1f} {k:>25}")
    cold = Spread.of(work[0.04])
    rec.add(f"{what}, back to back", hot, "us of CPU", ".0f", spread=Spread.of(work[0.0]))
    rec.add(f"{what}, after a 40 ms sleep", cold.median, "us of CPU", ".0f", spread=cold)
    rec.add(f"{what}, after a 40 ms sleep against back to back", cold.median / hot, "x", ".0f")
    rec.write()


if __name__ == "__main__":
    main()
