"""What the flight recorder costs the agent, at 10k, 100k and 1M events a second.

Standalone (no kernel, no traced process): the drain thread's side is
replayed as it runs in the agent, one batch of decoded events every 5 ms
(DRAIN_INTERVAL_S) handed to Recorder.take, for SECONDS at each rate, with
the recorder's defaults (30 s, 64 MiB). Measured in this one process:

- the CPU the recorder's tap adds to the drain thread, as a share of one
  core (thread CPU time inside take(), over the wall time), against the
  same loop without a recorder;
- the memory it holds at the end (its own count of the batches' bytes)
  and the process's RSS growth;
- the cost of writing its window as a Perfetto trace (encode and write:
  CPU seconds, bytes) and as the HTML picture, from what it holds.

    .venv/bin/python bench/experiments/recorder_cost.py [--seconds 35] [--rates 10000,100000,1000000]

Prints one line per rate; docs/timeline.md keeps the figures with this command.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from memtrace.core.abi import EVENT_DTYPE  # noqa: E402
from memtrace.core.notices import Events  # noqa: E402
from memtrace.export.timeline_html import render  # noqa: E402
from memtrace.runtime.recorder import Recorder, RecorderOptions  # noqa: E402

PERIOD_S = 0.005


def batch(n: int, t0: int, rng: np.random.Generator) -> np.ndarray:
    """n events spread over one drain period: copies and waits of 8 threads, as a loop makes them."""
    b = np.zeros(n, EVENT_DTYPE)
    b["ts_ns"] = t0 + np.sort(rng.integers(0, int(PERIOD_S * 1e9), n))
    b["duration_ns"] = rng.integers(1_000, 50_000, n)
    b["bytes"] = rng.integers(1, 1 << 22, n)
    b["pid"] = 4242
    b["tid"] = 4242 + rng.integers(0, 8, n)
    b["start_ns"] = 1
    wait = rng.random(n) < 0.2
    b["api"] = np.where(wait, 80, 2)
    b["direction"] = np.where(wait, 0, rng.integers(1, 3, n))
    b["stream"] = 7
    return b


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def one(rate: int, seconds: float, with_recorder: bool) -> dict[str, float]:
    rng = np.random.default_rng(1)
    rec = Recorder(RecorderOptions()) if with_recorder else None
    per = max(int(rate * PERIOD_S), 1)
    rss0 = rss_kib()
    cpu = 0.0
    start = time.monotonic()
    next_at = start
    k = 0
    while time.monotonic() - start < seconds:
        b = batch(per, time.monotonic_ns(), rng)  # the drain's decode: not the recorder's cost
        c0 = time.thread_time()
        if rec is not None:
            rec.take([Events(b)])
        cpu += time.thread_time() - c0
        k += 1
        next_at += PERIOD_S
        time.sleep(max(next_at - time.monotonic(), 0.0))
    wall = time.monotonic() - start
    out = {"rate": rate, "cpu_share": cpu / wall, "batches": k}
    if rec is None:
        return out
    out.update(held=rec.held_events(), held_mib=rec.bytes / 2**20, rss_mib=(rss_kib() - rss0) / 1024)
    out.update(dropped=rec.dropped, aged_out=rec.aged_out)
    now = time.monotonic_ns()
    c0 = time.process_time()
    tl = rec.timeline(None, None, now - int(30e9), now)
    with tempfile.TemporaryDirectory() as d:
        size = rec.write(tl, os.path.join(d, "w.pftrace"))
        out.update(write_cpu_s=time.process_time() - c0, write_mib=size / 2**20)
        c0 = time.process_time()
        html = render(tl)
        out.update(html_cpu_s=time.process_time() - c0, html_mib=len(html) / 2**20)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=35.0)
    ap.add_argument("--rates", default="10000,100000,1000000")
    a = ap.parse_args()
    for rate in (int(r) for r in a.rates.split(",")):
        base = one(rate, min(a.seconds, 5.0), False)
        r = one(rate, a.seconds, True)
        print(
            f"{rate:>8} ev/s: tap {r['cpu_share'] * 100:.3f}% of a core "
            f"(loop without it {base['cpu_share'] * 100:.3f}%); "
            f"holds {r['held']:.0f} events, {r['held_mib']:.1f} MiB (RSS +{r['rss_mib']:.0f} MiB), "
            f"dropped {r['dropped']:.0f}, aged out {r['aged_out']:.0f}; "
            f"window as Perfetto {r['write_cpu_s']:.1f} s CPU, {r['write_mib']:.1f} MiB; "
            f"as HTML {r['html_cpu_s']:.1f} s CPU, {r['html_mib']:.2f} MiB; peak RSS {r['peak_rss_mib']:.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
