"""What taking call stacks costs a traced process, per copy and per
allocation (issue 17: at most 1.3x the cost without stacks).

    sudo .venv/bin/python bench/targets/stack_cost.py [--calls N] [--rounds R] [--depth D]
        [--python PYTHON [--threads T]]

A process pinned to one CPU calls the test CUDA runtime (cudaMemcpy, or a
cudaMalloc and its cudaFree) in a tight loop from D frames down, built with
frame pointers (bench/src/stackloop.c). Side by side in one run, rounds
alternating, it runs untraced, under `memtrace run` and under `memtrace run
--stacks`, each with its own copy of the libraries; each reports its own ns
per call. The cost of tracing is the
traced time less the untraced one; the ratio is stacks' cost over the cost
without, taken within each round, and its median over the rounds.

With --python, the loop is Python's (bench/src/stackloop.py, through
ctypes, D Python frames down): --stacks then walks the interpreter's frames
too, and names their code objects. --threads starts T idle Python threads
before the loop, listed before the loop's thread: BPF finds the calling
thread's state among them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Spread, Target

LOOP_CPU = 1
TARGET = Target("<=", 1.3)


def build(tmp: Path) -> tuple[Path, Path]:
    fx = harness.build_fixtures(tmp / "fx")
    loop = harness.build_c(
        "stackloop.c",
        tmp / "stackloop",
        cflags=["-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"],
        libs=[f"-L{fx}/lib", "-lcudart"],
    )
    return fx, loop


def one(mode: str, loop: list[str], fx: Path, kind: str, calls: int, shape: list[str]) -> tuple[float, dict]:
    """The loop's ns per call, and (with stacks) what memtrace says of its stacks."""
    # Each run loads its own copy of the libraries (new inodes): probes a
    # previous run left detaching on the shared files must not slow this one.
    with tempfile.TemporaryDirectory() as d:
        for name in ("libcudart.so.13", "libcuda.so.1"):
            harness.fresh_copy(fx / "lib" / name, Path(d))
        return _one(mode, loop, Path(d), kind, calls, shape)


def _one(mode: str, loop: list[str], lib: Path, kind: str, calls: int, shape: list[str]) -> tuple[float, dict]:
    argv = harness.pinned([*loop, kind, str(calls), *shape], LOOP_CPU)
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib), FAKE_LIBCUDA=str(lib / "libcuda.so.1"))
    out = lib / "summary.json"
    if mode != "untraced":
        flags = ["--stacks"] if mode == "stacks" else []
        argv = [
            sys.executable,
            "-m",
            "memtrace",
            "run",
            "--no-host",
            *flags,
            "--format",
            "json",
            "-o",
            str(out),
            "--",
            *argv,
        ]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, check=True)
    stacks = json.loads(out.read_text())["agent"].get("stacks") or {} if mode == "stacks" else {}
    return float(p.stdout.split()[-1]), stacks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=30, help="frames between main and the loop")
    ap.add_argument("--python", help="a CPython: run the Python loop (bench/src/stackloop.py) under it")
    ap.add_argument("--threads", type=int, default=0, help="with --python: idle threads listed before the loop's")
    a = ap.parse_args()
    if a.threads and not a.python:
        ap.error("--threads needs --python")
    harness.need_root("stack_cost")
    rec = Record()
    what_loop = f"Python loop under {a.python}, {a.threads} idle threads" if a.python else "C loop"
    shape = [str(a.depth), str(a.threads)] if a.python else [str(a.depth)]  # the loop's arguments after CALLS
    print(f"machine: {harness.describe()}; {what_loop}, {a.calls:,} calls a run, depth {a.depth}")
    with tempfile.TemporaryDirectory() as d:
        fx, c_loop = build(Path(d))
        loop = [a.python, str(REPO / "bench" / "src" / "stackloop.py")] if a.python else [str(c_loop)]
        for kind in ("copy", "alloc"):
            ns: dict[str, list[float]] = {"untraced": [], "memtrace": [], "stacks": []}
            stacks: dict = {}
            for _, m in harness.alternating(list(ns), a.rounds):
                v, got = one(m, loop, fx, kind, a.calls, shape)
                ns[m].append(v)
                stacks = got or stacks
            # The cost of tracing is the traced time less the untraced one; the ratio is taken within each round.
            base = [m - u for m, u in zip(ns["memtrace"], ns["untraced"], strict=True)]
            with_stacks = [s - u for s, u in zip(ns["stacks"], ns["untraced"], strict=True)]
            ratios = [w / b if b > 0 else float("nan") for w, b in zip(with_stacks, base, strict=True)]
            ratio = Spread.of(ratios)
            med = {m: Spread.of(v).median for m, v in ns.items()}
            what = "cudaMemcpy" if kind == "copy" else "cudaMalloc + cudaFree"
            print(
                f"{what:>22}: untraced {med['untraced']:7.1f} ns, memtrace {med['memtrace']:7.1f} ns "
                f"(+{med['memtrace'] - med['untraced']:.1f}), --stacks {med['stacks']:7.1f} ns "
                f"(+{med['stacks'] - med['untraced']:.1f}); stacks/no stacks cost: {ratio.median:.2f}x "
                f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})"
            )
            rec.add(
                f"--stacks against no stacks, {what}{', Python' if a.python else ''}",
                ratio.median,
                "x",
                ".2f",
                TARGET,
                ratio,
                note=what_loop,
            )
            if stacks.get("python_frames_walked"):
                walked, reads = stacks["python_frames_walked"], stacks["python_frame_reads"]
                print(
                    f"{'':>22}  last --stacks run: {stacks['taken']:,} stacks, {walked:,} Python frames walked "
                    f"in {reads:,} reads ({walked / max(reads, 1):.1f} frames a read); "
                    f"{stacks.get('python_thread_reads', 0):,} reads to find the thread's state"
                )
    rec.write()


if __name__ == "__main__":
    main()
