"""PyTorch copies with known truth: pageable and pinned H2D, D2H, D2D.

    memtrace run --format json -- python examples/torch_copies.py

Prints the truth it knows (calls and bytes per direction) on stderr.
"""

import json
import sys

import torch

N, SIZE = 200, 4 << 20  # 200 copies of 4 MiB per kind
dev = torch.device("cuda")
pageable = torch.empty(SIZE, dtype=torch.uint8)
pinned = torch.empty(SIZE, dtype=torch.uint8).pin_memory()
d1 = torch.empty(SIZE, dtype=torch.uint8, device=dev)
d2 = torch.empty(SIZE, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()

for _ in range(N):
    d1.copy_(pageable)  # h2d, pageable
for _ in range(N):
    d1.copy_(pinned, non_blocking=True)  # h2d, pinned
for _ in range(N):
    pageable.copy_(d1)  # d2h
for _ in range(N):
    d2.copy_(d1)  # d2d
torch.cuda.synchronize()

truth = {
    "h2d": {"calls": 2 * N, "bytes": 2 * N * SIZE},
    "d2h": {"calls": N, "bytes": N * SIZE},
    "d2d": {"calls": N, "bytes": N * SIZE},
}
print(json.dumps({"truth": truth}), file=sys.stderr)
