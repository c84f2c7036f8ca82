"""A realistic PyTorch training loop (CNN, DataLoader with workers, AdamW):
thousands of copies and launches per second. Prints the median step time
(batch in hand to loss.item()) and the median iteration (one loss.item() to
the next, the batch's loading included: what memtrace calls a step).

    python examples/torch_train.py [--steps N] [--pin]
"""

import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=400)
ap.add_argument("--pin", action="store_true")
a = ap.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(a.steps * 64, 3, 32, 32), torch.randint(0, 10, (a.steps * 64,)))
loader = DataLoader(data, batch_size=64, num_workers=2, pin_memory=a.pin, shuffle=True)
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1),
    nn.ReLU(),
    nn.Conv2d(32, 64, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear(64 * 16 * 16, 128),
    nn.ReLU(),
    nn.Linear(128, 10),
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
times = []
ends = []  # when each iteration's loss.item() returned: an iteration is one end to the next
for x, y in loader:
    t = time.perf_counter()
    x, y = x.cuda(non_blocking=a.pin), y.cuda(non_blocking=a.pin)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    loss.item()  # a sync per step, as logging does
    ends.append(time.perf_counter())
    times.append(ends[-1] - t)
iterations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
print(
    json.dumps(
        {
            "median_step_s": statistics.median(times[20:]),  # from the batch in hand to loss.item()
            "median_iteration_s": statistics.median(iterations),  # the whole loop, loading included
            "steps": len(times),
        }
    ),
    file=sys.stderr,
)
