"""One rank of torch.distributed with the nccl backend: collectives with known
calls and bytes, for memtrace's NCCL sensor on a real libnccl.

    memtrace run --format json -o out.json -- python3 examples/torch_nccl.py TRUTH.json

Each all_reduce of N float32 elements is one ncclAllReduce of 4*N bytes; the
broadcasts and all_gathers likewise. TRUTH.json gets what the script asked for.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

R, N = 200, 1 << 20
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(N, device="cuda")
for _ in range(R):
    dist.all_reduce(x)
for _ in range(R // 2):
    dist.broadcast(x, src=0)
out = [torch.empty_like(x)]
for _ in range(R // 4):
    dist.all_gather(out, x)
torch.cuda.synchronize()
dist.destroy_process_group()
truth = {
    "all_reduce": {"calls": R, "bytes": R * 4 * N},
    "broadcast": {"calls": R // 2, "bytes": R // 2 * 4 * N},
    "all_gather": {"calls": R // 4, "bytes": R // 4 * 4 * N},
    "nccl": str(torch.cuda.nccl.version()),
}
with open(sys.argv[1], "w") as f:
    json.dump(truth, f)
