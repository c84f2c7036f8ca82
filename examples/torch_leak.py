"""A torch script that leaks device memory (issue 5's leak signal).

    memtrace run --format json -o out.json -- python3 examples/torch_leak.py

Keeps every step's activations alive (a list that only grows) and allocates
outside the caching allocator's reuse, so device memory grows with no frees.
Prints its own truth on stderr: the bytes it kept.
"""

import json
import sys

import torch

torch.cuda.set_per_process_memory_fraction(0.5)
kept = []
for _ in range(40):
    kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))  # 64 MiB a step, never freed
torch.cuda.synchronize()
print(json.dumps({"kept_bytes": sum(t.numel() for t in kept), "allocations": len(kept)}), file=sys.stderr)
