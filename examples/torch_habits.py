"""A PyTorch training loop with the habits real jobs have, for checking
memtrace's steps on a real GPU against the loop's own count and clock
(docs/steps.md says what a step is in each):

    python3 examples/torch_habits.py TRUTH.json --habit log|ckpt|eval|accum|accum-quiet [--iters N]

Every habit trains the same MLP on batches copied from pinned memory:
- log: reads its loss every iteration (`loss.item()`), and every 10th one
  logs: a device synchronisation and a read of the batch's accuracy;
- ckpt: reads its loss every iteration, and every 100th one saves a
  checkpoint (`torch.save` of the model's and the optimizer's state: a
  D2H copy per tensor, then serialisation on the CPU);
- eval: reads its loss every iteration, and every 100th one evaluates for
  20 forward-only iterations, each reading its count of right answers;
- accum: accumulates gradients over 4 micro-batches, each reading its loss;
  the optimizer steps after the 4th;
- accum-quiet: the same, with only the optimizer's step reading the loss.

TRUTH.json gets the loop's own figures: each periodic wait's return time
(the loop's `.item()` that ends an iteration, CLOCK_MONOTONIC ns, the clock
memtrace stamps calls with), the number of steps docs/steps.md defines for
the habit (waits - 1: the time before the first wait is setup), and their
median.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("truth")
ap.add_argument("--habit", choices=("log", "ckpt", "eval", "accum", "accum-quiet"), required=True)
ap.add_argument("--iters", type=int, default=600, help="training iterations (micro-batches under accum)")
a = ap.parse_args()

torch.manual_seed(0)
dev = torch.device("cuda")
B, D = 256, 1024
model = nn.Sequential(nn.Linear(D, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()
host_x = torch.randn(8, B, D).pin_memory()
host_y = torch.randint(0, 10, (8, B)).pin_memory()
ends: list[int] = []  # the return of each wait that ends an iteration


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    return host_x[i % 8].to(dev, non_blocking=True), host_y[i % 8].to(dev, non_blocking=True)


def mark() -> None:
    ends.append(time.monotonic_ns())


ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
K = 4
for i in range(a.iters):
    x, y = batch(i)
    if a.habit.startswith("accum"):
        loss = loss_fn(model(x), y) / K
        loss.backward()
        last = i % K == K - 1
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if a.habit == "accum" or last:
            loss.item()
            mark()
        continue
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = loss_fn(out, y)
    loss.backward()
    opt.step()
    loss.item()
    mark()
    if a.habit == "log" and i % 10 == 9:
        torch.cuda.synchronize()
        (out.argmax(1) == y).float().mean().item()
    elif a.habit == "ckpt" and i % 100 == 99:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
    elif a.habit == "eval" and i % 100 == 99:
        model.eval()
        with torch.no_grad():
            for j in range(20):
                ex, ey = batch(j)
                (model(ex).argmax(1) == ey).sum().item()
                mark()  # docs/steps.md: each evaluation iteration is a step too
        model.train()
steps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
truth = {
    "habit": a.habit,
    "waits": len(ends),
    "steps": len(steps),
    "median_step_s": statistics.median(steps) / 1e9,
    "first_wait_monotonic_ns": ends[0],
    "last_wait_monotonic_ns": ends[-1],
}
with open(a.truth, "w") as f:
    json.dump(truth, f)
if os.path.exists(ckpt):
    os.unlink(ckpt)
