"""The overhead budget on the worst case: a CPU-bound launch loop.

    sudo .venv/bin/python bench/targets/overhead_budget.py [--rounds 3] [--launches 1000000] [--work-us 20]
        [--copy-every 1000] [--libs as-built|pushfirst]

tests/fixtures/launchloop.c makes LAUNCHES cuLaunchKernel calls through the
test libcuda, each followed by a fixed amount of CPU work (about WORK_US, sized
here at start) and a 64-byte copy every COPY_EVERY launches. Three configurations run
in alternating order each round, under `memtrace run` as users run it:
untraced, traced with the default budget (1% of the process's CPU time), and
traced with the budget off (every launch probed: what the budget saves). The
loop times itself (from its first launch to its last), so the agent's start
and its attach time are not counted. Reported: medians and spreads of the
loop's time, ratios to untraced, the launch count memtrace reports against the
loop's own, the share of launches that took a trap (the duty cycle's effect),
and memtrace's own overhead estimate for the process.

--libs: the test libcuda as the tests build it (-O2: its launch and copy
entries begin with an instruction the kernel single-steps, the dear kind of
trap), or the same built push-first (tests/fixtures/Makefile's
pushfirst/: every entry begins with a push, as every CUDA entry point
does, which the kernel emulates, a far cheaper trap;
bench/experiments/entry_cost.py).

The copies are exact probes, never sampled: with single-stepped traps, a copy
every 100 launches alone costs about the whole 1% of a 20 us launch
(docs/perf/notes.md), so the default is a copy every 1000 launches;
--copy-every 100 shows that floor.

Then a GPU-bound simulated training step (bench/src/trainstep.c, as
bench/step_time.py --simulate runs it), untraced against traced with the
default budget: the budget must leave such a loop unchanged.

Not a timed test: the machine is shared; run it niced and read the spreads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import FIXTURES, Record, Spread, Target


def build(tmp: Path, libs: str) -> tuple[Path, Path, Path]:
    harness.build_fixtures(tmp, quiet=True)
    loop = harness.build_c(FIXTURES / "launchloop.c", tmp / "launchloop", libs=["-ldl"])
    step = harness.build_c("trainstep.c", tmp / "trainstep", libs=["-ldl"])
    return tmp / ("pushfirst" if libs == "pushfirst" else "lib") / "libcuda.so.1", loop, step


def memtrace_run(
    argv: list[str], budget: str | None, out: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cmd = [sys.executable, "-m", "memtrace", "run", "--no-host", "--format", "json", "-o", str(out)]
    if budget is not None:
        cmd += ["--overhead-budget", budget]
    p = subprocess.run([*cmd, "--", *argv], capture_output=True, text=True, check=True)
    return p, json.loads(out.read_text())


def loop_round(argv: list[str], mode: str, out: Path) -> dict[str, Any]:
    if mode == "untraced":
        # Another agent on the host (host-wide probes on every libcuda it sees) would make
        # "untraced" traced: a bare loop of launches with no work says whether one is there.
        bare = subprocess.run([*argv[:2], "20000", "0", "0"], capture_output=True, text=True, check=True)
        p = subprocess.run(argv, capture_output=True, text=True, check=True)
        doc: dict[str, Any] = {"bare_ns": float(bare.stdout.split()[7]) / 20000 * 1e9}
    else:
        p, doc = memtrace_run(argv, None if mode == "budget 1%" else "off", out)
    w = p.stdout.split()
    r: dict[str, Any] = {"seconds": float(w[7]), "truth": int(w[1]), **doc}
    if "launches" in doc:
        r["launches"] = sum(row["launches"] for row in doc["launches"])
        r["estimated"] = any(row["estimated"] for row in doc["launches"])
        o = doc.get("overhead") or [{}]
        r["share"] = o[0].get("share_of_cpu")
        r["trap_us"] = (o[0].get("trap_seconds") or 0) * 1e6
        r["traps"] = o[0].get("traps")
        r["launch_traps"] = o[0].get("launch_traps") or 0
        r["duty"] = o[0].get("launch_duty")
    return r


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{Spread.of(xs).range()}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=1_000_000)
    ap.add_argument("--work-us", type=float, default=20.0)
    ap.add_argument("--copy-every", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=200, help="GPU-bound simulated steps per round")
    ap.add_argument("--libs", choices=("as-built", "pushfirst"), default="as-built", help="the test libcuda's entries")
    a = ap.parse_args()
    harness.need_root("overhead_budget", "memtrace attaches uprobes")
    rec = Record()
    tmp = Path(tempfile.mkdtemp(prefix="memtrace-budget-"))
    lib, loop, step = build(tmp, a.libs)
    copies = iter(range(1_000_000))

    def fresh() -> Path:
        # The previous traced round's probes are detached in the background (seconds): not from this copy.
        return harness.fresh_copy(lib, tmp / f"round{next(copies)}")

    # Size the work: iterations of the loop's CPU work per microsecond, untraced.
    probe = subprocess.run([str(loop), str(lib), "20000", "2000", "0"], capture_output=True, text=True, check=True)
    per_us = 2000 / (float(probe.stdout.split()[7]) / 20000 * 1e6)
    work = max(int(a.work_us * per_us), 1)
    argv = [str(loop), str(lib), str(a.launches), str(work), str(a.copy_every)]
    print(f"machine: {harness.describe()}")
    print(
        f"launch loop: {a.launches} launches, ~{a.work_us:g} us of CPU work each ({work} iterations), "
        f"a copy every {a.copy_every}; the test libcuda {'built push-first' if a.libs == 'pushfirst' else 'as built'}"
    )
    modes = ["untraced", "budget 1%", "budget off"]
    res: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r, m in harness.alternating(modes, a.rounds, "rotate"):
        res[m].append(loop_round([argv[0], str(fresh()), *argv[2:]], m, tmp / "out.json"))
        x = res[m][-1]
        more = f"  launches {x['launches']}" if "launches" in x else f"  bare launch {x['bare_ns']:.0f} ns"
        print(f"  round {r + 1} {m:10} {x['seconds']:.3f} s{more}")
    base = statistics.median(x["seconds"] for x in res["untraced"])
    for m in modes:
        xs = res[m]
        ratio = statistics.median(x["seconds"] for x in xs) / base
        line = f"{m:10} loop {spread([x['seconds'] for x in xs])}  ratio {ratio:.3f}"
        if m == "untraced":
            line += f"  bare launch {statistics.median(x['bare_ns'] for x in xs):.0f} ns (foreign probes if >> 100)"
            print(line)
            continue
        errs = [abs(x["launches"] - x["truth"]) / x["truth"] for x in xs]
        line += f"  launch error median {statistics.median(errs):.2%} max {max(errs):.2%}"
        line += f"  estimated {sum(x['estimated'] for x in xs)}/{len(xs)}"
        trapped = statistics.median(x["launch_traps"] / x["truth"] for x in xs)
        line += f"  launches trapped {trapped:.1%}"
        shares = [x["share"] for x in xs if x["share"] is not None]
        if shares:
            line += f"  memtrace's estimate {statistics.median(shares):.1%} of CPU"
        line += f"  trap {statistics.median(x['trap_us'] for x in xs):.1f} us"
        print(line)
        rounds = Spread.of(harness.ratios([x["seconds"] for x in xs], [x["seconds"] for x in res["untraced"]]))
        if m == "budget 1%":
            rec.add("launch loop traced/untraced, default budget", ratio, "x", ".3f", Target("<=", 1.01), rounds)
            rec.add(
                "launches reported against the loop's own, default budget (median error)",
                statistics.median(errs) * 100,
                "%",
                ".2f",
                Target("<=", 2),
            )
            if shares:
                rec.add(
                    "memtrace's estimate of its cost, default budget",
                    statistics.median(shares) * 100,
                    "% of the loop's CPU",
                    ".1f",
                )
        else:
            rec.add("launch loop traced/untraced, budget off", ratio, "x", ".3f", spread=rounds)
    # GPU-bound: the simulated training step (41 launches, 10 us CPU and 63 us GPU each, copies, a sync).
    sargv = [str(step), str(lib), str(a.steps), "41", "10", str(2590 / 41)]
    times: dict[str, list[float]] = {"untraced": [], "budget 1%": []}
    for _, m in harness.alternating(list(times), a.rounds, "reverse"):
        run_argv = [sargv[0], str(fresh()), *sargv[2:]]
        if m == "untraced":
            p = subprocess.run(run_argv, capture_output=True, text=True, check=True)
        else:
            p, _ = memtrace_run(run_argv, None, tmp / "out.json")
        times[m].append(json.loads(p.stderr.strip().splitlines()[-1])["median_step_s"])
    mu, mt = Spread.of(times["untraced"]), Spread.of(times["budget 1%"])
    print(
        f"GPU-bound simulated step: untraced {mu.median * 1e3:.3f} ms [{mu.range(scale=1e3)}], "
        f"budget 1% {mt.median * 1e3:.3f} ms [{mt.range(scale=1e3)}], ratio {mt.median / mu.median:.3f}"
    )
    rec.add(
        "GPU-bound simulated step, default budget/untraced",
        mt.median / mu.median,
        "x",
        ".3f",
        spread=Spread.of(harness.ratios(times["budget 1%"], times["untraced"])),
    )
    rec.write()


if __name__ == "__main__":
    main()
