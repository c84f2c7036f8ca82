"""What one fold of a batch of events into the model costs, this checkout
against another commit's, on the same recorded batches (issue 16: the agent
at most 1% of a core; the fold is most of its host thread's work).

    git worktree add /tmp/old COMMIT
    sudo .venv/bin/python bench/experiments/fold_cost.py [--old /tmp/old] [--rounds R]

First `memtrace run` traces the training-like job bench/experiments/agent_ab.py runs
(tests/fixtures/trainjob.c: real CPU work per step, four 4 MiB copies,
three kernels) and every batch it folds is recorded (Model.add_events
wrapped). Then each tree replays those batches into a fresh Model of its
own, in turn, round after round: each batch after a sleep of --sleep
seconds (the host thread folds every 0.5 s, so its caches are cold) and
then back to back, each pass in a fresh Model. Only the second half of a
pass is timed (the step detector has found its loop by then; a second
pass would send the step detector back in time), by the thread's CPU clock.

Printed: each round's median microseconds of CPU a fold per tree, cold
and warm, the medians over rounds and their ratio (this checkout over the
other). Without --old, this checkout alone.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Spread

RECORD = """
import atexit, pickle, sys
import memtrace.model.aggregate as a
out, batches, fold = sys.argv[1], [], a.Model.add_events
def add_events(self, batch):
    batches.append(batch.copy())
    return fold(self, batch)
a.Model.add_events = add_events
atexit.register(lambda: pickle.dump(batches, open(out, "wb")))
sys.argv = ["memtrace", *sys.argv[2:]]
from memtrace.cli import entry
entry()
"""

REPLAY = """
import json, pickle, statistics, sys, time
from memtrace.model import Model
batches, sleep = pickle.load(open(sys.argv[1], "rb")), float(sys.argv[2])
def median_us(gap):
    m, took = Model(), []
    for i, b in enumerate(batches):
        if gap:
            time.sleep(gap)
        t = time.thread_time_ns()
        m.add_events(b)
        if i >= len(batches) // 2:
            took.append(time.thread_time_ns() - t)
    return statistics.median(took) / 1000
print(json.dumps({"cold_us": median_us(sleep), "warm_us": median_us(0)}))
"""


def record(fx: Path, tmp: Path, seconds: float) -> Path:
    out = tmp / "batches.pkl"
    job = harness.training_job(fx, seconds)
    cmd = [sys.executable, "-c", RECORD, str(out), "run", "-o", str(tmp / "summary.json"), "--format", "json", "--"]
    env = dict(os.environ, PYTHONPATH=str(REPO), WORKLOAD_TRUTH="/dev/null", FAKE_PCIE=str(tmp / "pcie"))
    subprocess.run([*cmd, *job], env=env, cwd=REPO, stdout=subprocess.DEVNULL, check=True)
    return out


def replay(tree: Path, batches: Path, sleep: float) -> dict[str, float]:
    cmd = harness.pinned([sys.executable, "-c", REPLAY, str(batches), str(sleep)], 0)
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"fold_cost: the replay in {tree} failed (an older event layout?):\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="a worktree of the commit to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0, help="the recorded job's run")
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds before each cold fold")
    a = ap.parse_args()
    harness.need_root("fold_cost")
    rec = Record()
    trees = harness.trees("fold_cost", a.old)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-fold-cost-"))
    fx = harness.build_fixtures(tmp / "fx", quiet=True)
    harness.idle_pcie_link(tmp / "pcie")
    batches = record(fx, tmp, a.seconds)
    sizes = [len(b) for b in pickle.loads(batches.read_bytes())]
    print(f"machine: {harness.describe()}")
    print(f"{len(sizes)} batches recorded, {statistics.median(sizes):.0f} events each (median); sleep {a.sleep:g} s")
    got: dict[str, dict[str, list[float]]] = {arm: {"cold_us": [], "warm_us": []} for arm in trees}
    for r, arm in harness.alternating(list(trees), a.rounds):
        d = replay(trees[arm], batches, a.sleep)
        for k in ("cold_us", "warm_us"):
            got[arm][k].append(d[k])
        print(f"round {r + 1} {arm}: cold {d['cold_us']:.0f} us, warm {d['warm_us']:.0f} us a fold", flush=True)
    med = {arm: {k: Spread.of(v) for k, v in d.items()} for arm, d in got.items()}
    for arm, m in med.items():
        print(
            f"{arm}: cold {m['cold_us'].median:.0f} us, warm {m['warm_us'].median:.0f} us a fold "
            f"(medians of {a.rounds} rounds)"
        )
    for k, what in (("cold_us", "after a sleep"), ("warm_us", "back to back")):
        rec.add(f"a fold {what}", med["new"][k].median, "us of CPU", ".0f", spread=med["new"][k])
        if "old" in med:
            ratio = Spread.of(harness.ratios(got["new"][k], got["old"][k]))
            rec.add(
                f"a fold {what}, this tree over --old",
                med["new"][k].median / med["old"][k].median,
                "x",
                ".2f",
                spread=ratio,
                note=str(a.old),
            )
    rec.write()


if __name__ == "__main__":
    main()
