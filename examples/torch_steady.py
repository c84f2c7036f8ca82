"""A steady PyTorch loop for memtrace's diagnosis on a real GPU: each step
copies a 128 MiB pinned batch to the GPU, multiplies, and waits for it. Runs SECONDS
and writes each step's end time (CLOCK_REALTIME ns) to TIMES.json, so a
slowdown can be placed against the fault's own clock.

    python3 examples/torch_steady.py SECONDS TIMES.json
    python3 examples/torch_steady.py --copier SECONDS ONSET   (a competing
        copier: 256 MiB pinned H2D copies back to back on the same GPU; it
        writes the time its first copy starts to ONSET)
"""

import json
import sys
import time

import torch

if sys.argv[1] == "--copier":
    src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with open(sys.argv[3], "w") as f:
        f.write(str(time.time_ns()))
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
    sys.exit(0)

seconds, out = float(sys.argv[1]), sys.argv[2]
batch = torch.randn(128 << 20 >> 2).pin_memory()  # 128 MiB
dev = torch.empty_like(batch, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
ends = []
end = time.time() + seconds
while time.time() < end:
    dev.copy_(batch, non_blocking=True)
    y = w
    for _ in range(4):
        y = torch.tanh(y @ w)
    s = 0.0
    for i in range(20000):  # the host's own work between steps
        s += i * 0.5
    torch.cuda.synchronize()
    ends.append(time.time_ns())
with open(out, "w") as f:
    json.dump({"step_end_unix_nano": ends}, f)
