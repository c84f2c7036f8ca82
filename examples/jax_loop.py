"""A JAX loop with a device_put of each host batch (issue 5: staging copies).

    memtrace run --format json -o out.json -- python3 examples/jax_loop.py

JAX stages host-to-device transfers through pinned buffers it allocates
itself (cuMemHostAlloc): memtrace must report those copies `pinned`.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

w = jnp.ones((512, 512))
f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum())
n = 0
for _ in range(200):
    x = jax.device_put(np.random.rand(256, 512).astype(np.float32))
    f(x, w).block_until_ready()
    n += 256 * 512 * 4
print(json.dumps({"host_batches": 200, "batch_bytes": n}), file=sys.stderr)
