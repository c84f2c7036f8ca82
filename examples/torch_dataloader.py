"""A DataLoader training loop for memtrace's pinned/pageable check (issue 5).

    memtrace run --format json -o out.json -- python3 examples/torch_dataloader.py --pin-memory
    memtrace run --format json -o out.json -- python3 examples/torch_dataloader.py

Prints its own truth on stderr: how many batches it moved and their bytes.
With --pin-memory every batch copy must come out `pinned`; without it,
`pageable`, and memtrace's `pageable_h2d` finding names the fix.
"""

import argparse
import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--pin-memory", action="store_true")
ap.add_argument("--steps", type=int, default=200)
a = ap.parse_args()

x = torch.randn(a.steps * 64, 3, 64, 64)
y = torch.randint(0, 10, (a.steps * 64,))
loader = DataLoader(TensorDataset(x, y), batch_size=64, pin_memory=a.pin_memory, num_workers=2)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
moved = 0
for xb, yb in loader:
    xb = xb.cuda(non_blocking=a.pin_memory)
    yb = yb.cuda(non_blocking=a.pin_memory)
    moved += xb.numel() * xb.element_size() + yb.numel() * yb.element_size()
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(json.dumps({"pin_memory": a.pin_memory, "batches": len(loader) * 2, "batch_bytes": moved}), file=sys.stderr)
