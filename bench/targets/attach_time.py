"""Time to attach (issue 6, target 4; issue 41).

    sudo .venv/bin/python bench/targets/attach_time.py [--rounds R] [--old TREE]

Side by side in one run:
  start to tracing     from creating the agent to its probes being live on a
                       process that already has libcudart and libcuda mapped
                       (load, attach, scan), as `memtrace push` starts
  library to probes    how long a process's dlopen() of a CUDA library it has
                       never mapped takes with the agent running (the process
                       is held at the mmap, the probes attached, the process
                       continued) against the same dlopen() with no agent
Each round runs each arm in a fresh interpreter (the agent's whole start,
libbpf's own set-up included, as `memtrace run` pays it) and maps a fresh
copy of the library (a new inode), so every round pays the whole attach.
With `--old TREE` (`git worktree add TREE COMMIT`) the rounds alternate
between that commit's memtrace, objects and all, and this checkout's. Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DLOPEN = "import ctypes,sys,time; t=time.perf_counter(); ctypes.CDLL(sys.argv[1]); print(time.perf_counter()-t)"
THIS = Path(__file__).resolve()


def dlopen_seconds(lib: Path) -> float:
    out = subprocess.run([sys.executable, "-c", DLOPEN, str(lib)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def arm(pid: int, lib: Path) -> None:
    """One round of one arm, in this interpreter, memtrace from PYTHONPATH (the
    tree measured; bench.harness is not imported: the tree's own would shadow
    it): its two figures as one JSON line on stdout."""
    import threading

    import memtrace.bpf.detach as detach
    from memtrace.runtime.agent import Agent
    from memtrace.sensors.cuda import Options

    detach.DETACH_IN_BACKGROUND = False  # closing waits until the probes are gone
    t = time.perf_counter()
    with Agent(Options()) as agent:
        agent.scan([pid])
        start = time.perf_counter() - t
        assert len(agent.libraries) == 2, agent.libraries
        stop = threading.Event()

        def drain() -> None:
            while not stop.wait(0.001):
                agent.poll()

        th = threading.Thread(target=drain)
        th.start()
        try:
            with_agent = dlopen_seconds(lib)
        finally:
            stop.set()
            th.join()
        assert any(str(lib.parent) in x.name for x in agent.libraries), "the new library was not attached"
    print(json.dumps({"start": start, "with_agent": with_agent, "memtrace": detach.__file__}))


def run_arm(tree: Path, pid: int, lib: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, str(THIS), "--arm", str(pid), str(lib)], env=env, cwd=tree, capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"attach_time: the arm of {tree} failed:\n{out.stderr}")
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(res["memtrace"]).startswith(str(tree)), f"{tree}'s arm ran {res['memtrace']}"
    return res


def main() -> None:
    sys.path.insert(0, str(THIS.parents[2]))
    from bench import harness
    from bench.harness import Record, Spread, Target

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old", type=Path, help="a worktree of the commit to compare with")
    a = ap.parse_args()
    harness.need_root("attach_time")
    rec = Record()
    trees = harness.trees("attach_time", a.old)
    harness.build_helper(harness.REPO)
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-attach-"))
    fx = harness.build_fixtures(tmp / "fx", quiet=True)
    start: dict[str, list[float]] = {k: [] for k in trees}
    held: dict[str, list[float]] = {k: [] for k in trees}  # each round's, less that round's dlopen without
    without: list[float] = []
    w = subprocess.Popen(
        [str(fx / "workload"), "-w", "-n", "1"], stdin=subprocess.PIPE, env={"WORKLOAD_TRUTH": "/dev/null"}
    )
    time.sleep(0.3)
    try:
        for i in range(a.rounds):
            bare = dlopen_seconds(harness.fresh_copy(fx / "lib" / "libcuda.so.1", tmp / f"n{i}"))
            without.append(bare)
            for name, tree in trees.items():
                res = run_arm(tree, w.pid, harness.fresh_copy(fx / "lib" / "libcuda.so.1", tmp / f"{name}{i}"))
                start[name].append(res["start"])
                held[name].append(res["with_agent"] - bare)
            print(
                f"round {i + 1}: "
                + ", ".join(f"{k} start {start[k][-1] * 1e3:.1f} ms, held {held[k][-1] * 1e3:.2f} ms" for k in trees)
                + f"; dlopen without an agent {bare * 1e3:.2f} ms",
                flush=True,
            )
    finally:
        w.kill()
        w.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(f"machine: {harness.describe()}; {a.rounds} rounds, medians")
    for k in trees:
        print(
            f"{k:>3}: start to tracing (load, attach 2 libraries, scan) {med(start[k]) * 1e3:7.1f} ms; "
            f"a new CUDA library held {med(held[k]) * 1e3:.2f} ms while its probes attached "
            f"(dlopen without an agent {med(without) * 1e3:.2f} ms)"
        )
    rec.add(
        "start to tracing",
        med(start["new"]) * 1e3,
        "ms",
        ".0f",
        target=Target("<=", 150),
        spread=Spread.of(x * 1e3 for x in start["new"]),
    )
    rec.add(
        "new CUDA library mapped to probes live",
        med(held["new"]) * 1e3,
        "ms",
        ".1f",
        target=Target("<=", 10),
        spread=Spread.of(x * 1e3 for x in held["new"]),
    )
    if "old" in trees:
        rec.add(
            "start to tracing, the commit before",
            med(start["old"]) * 1e3,
            "ms",
            ".0f",
            spread=Spread.of(x * 1e3 for x in start["old"]),
            note=f"--old {trees['old']}",
        )
        rec.add(
            "new CUDA library mapped to probes live, the commit before",
            med(held["old"]) * 1e3,
            "ms",
            ".1f",
            spread=Spread.of(x * 1e3 for x in held["old"]),
        )
    rec.write()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--arm":
        arm(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
