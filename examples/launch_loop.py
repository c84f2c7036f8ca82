"""A launch-bound PyTorch loop: tiny kernels, as small-batch inference makes,
each step S launches and a synchronisation. Prints its own timing as JSON on
stderr (median step, launches per second): memtrace's worst case for trap cost.

    python3 examples/launch_loop.py [--steps 400] [--launches 100]
    python3 examples/launch_loop.py --seconds 150 --times TIMES.json
        (for bench/agent_onoff.py: runs for SECONDS and writes each step's
        end time, CLOCK_REALTIME ns, to TIMES.json)
"""

import argparse
import json
import statistics
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=400)
ap.add_argument("--launches", type=int, default=100)
ap.add_argument("--seconds", type=float, help="run this long instead of --steps")
ap.add_argument("--times", help="write each step's end time (time.time_ns) here as JSON")
a = ap.parse_args()

x = torch.zeros(256, device="cuda")
for _ in range(200):  # warm up
    x.add_(1)
torch.cuda.synchronize()
times, ends = [], []
t0 = time.perf_counter()
stop = t0 + a.seconds if a.seconds else None
while (len(times) < a.steps) if stop is None else (time.perf_counter() < stop):
    t = time.perf_counter()
    for _ in range(a.launches):
        x.add_(1)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    ends.append(time.time_ns())
wall = time.perf_counter() - t0
if a.times:
    with open(a.times, "w") as f:
        json.dump({"step_end_unix_nano": ends}, f)
print(
    json.dumps(
        {
            "median_step_s": statistics.median(times),
            "steps": len(times),
            "launches": len(times) * a.launches,
            "launches_per_second": len(times) * a.launches / wall,
        }
    ),
    file=sys.stderr,
)
