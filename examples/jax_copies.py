"""JAX transfers with known user-visible truth (driver API only).

    memtrace run --format json -- python examples/jax_copies.py

JAX may stage transfers through extra driver copies; the truth printed
is what the script asked for.
"""

import json
import sys

import jax
import numpy as np

N, SIZE = 100, 4 << 20
host = np.ones(SIZE, dtype=np.uint8)
dev = jax.devices("gpu")[0]
for _ in range(N):
    x = jax.device_put(host, dev)
    x.block_until_ready()
bump = jax.jit(lambda a: a + 1)  # constants live in the kernel: no transfer
bump(x).block_until_ready()  # compile outside the counted loop
for _ in range(N):
    x = bump(x)  # a fresh buffer, so each fetch really transfers
    np.asarray(x)
truth = {"h2d": {"calls": N, "bytes": N * SIZE}, "d2h": {"calls": N, "bytes": N * SIZE}}
print(json.dumps({"truth": truth}), file=sys.stderr)
