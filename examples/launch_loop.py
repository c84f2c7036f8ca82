"""A launch-bound PyTorch loop: tiny kernels, as small-batch inference makes,
each step S launches and a synchronisation. Prints its own timing as JSON on
stderr (median step, launches per second): memtrace's worst case for trap cost.

    python3 examples/launch_loop.py [--steps 400] [--launches 100]
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
a = ap.parse_args()

x = torch.zeros(256, device="cuda")
for _ in range(200):  # warm up
    x.add_(1)
torch.cuda.synchronize()
times = []
t0 = time.perf_counter()
for _ in range(a.steps):
    t = time.perf_counter()
    for _ in range(a.launches):
        x.add_(1)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
wall = time.perf_counter() - t0
print(
    json.dumps(
        {
            "median_step_s": statistics.median(times),
            "steps": a.steps,
            "launches": a.steps * a.launches,
            "launches_per_second": a.steps * a.launches / wall,
        }
    ),
    file=sys.stderr,
)
