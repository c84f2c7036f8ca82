"""CuPy copies with known truth (driver API only).

memtrace run --format json -- python examples/cupy_copies.py
"""

import json
import sys

import cupy as cp
import numpy as np

N, SIZE = 300, 4 << 20
host = np.ones(SIZE, dtype=np.uint8)
d = cp.empty(SIZE, dtype=cp.uint8)
for _ in range(N):
    d.set(host)  # h2d
out = np.empty_like(host)
for _ in range(N):
    d.get(out=out)  # d2h
e = cp.empty_like(d)
for _ in range(N):
    e[...] = d  # d2d (a copy kernel or a memcpy, CuPy's choice)
cp.cuda.runtime.deviceSynchronize()
truth = {"h2d": {"calls": N, "bytes": N * SIZE}, "d2h": {"calls": N, "bytes": N * SIZE}}
print(json.dumps({"truth": truth}), file=sys.stderr)
