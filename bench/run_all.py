"""Run the tracked targets (bench/targets) and print their figures.

    sudo .venv/bin/python bench/run_all.py [--quick] [--only NAME,...] [--old DIR]
    .venv/bin/python bench/run_all.py --table [--markdown]

Each target measures its figures side by side in one run and writes one
JSON record (the machine, kernel, Python, memtrace's commit, the command,
when, and each figure with its unit and target) to bench/out, or
$MEMTRACE_BENCH_OUT. This runs them one after the other and prints a table
from the records they wrote. --quick runs each at a small size: a check
that it runs and writes its record (marked smoke: never a figure to cite).
--old DIR is given to the targets that compare with another commit's
worktree. --table prints the newest record of each target already there,
running nothing; --markdown prints it as rows for bench/RESULTS.md.

This never writes bench/RESULTS.md: that page is curated, each row citing
a record committed under docs/perf/records/ (tests/test_bench.py holds the
two to each other).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness


@dataclass(frozen=True)
class Bench:
    """A target: the record it writes, its script in bench/targets, its
    arguments for the figure and for a quick run."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    takes_old: bool = False


TARGETS = (
    Bench("probe_cost", "probe_cost.py", ("--rounds", "7"), ("--rounds", "1", "--calls", "2000")),
    Bench(
        "agent_throughput",
        "agent_throughput.py",
        quick=("--rounds", "1", "--events", "20000", "--calls", "4000", "--ring-runs", "1"),
    ),
    Bench(
        "footprint",
        "footprint.py",
        quick=("--counts", "1,10", "--seconds", "1", "--gap-window", "0.5", "--soak", "2000000"),
    ),
    Bench("attach_time", "attach_time.py", quick=("--rounds", "1"), takes_old=True),
    Bench("exit_time", "exit_time.py", quick=("--rounds", "1")),
    # Target 5 needs the GPU machine (bench/targets/step_time.py there, without --simulate).
    Bench("step_time", "step_time.py", ("--simulate",), ("--simulate", "--rounds", "1", "--steps", "20")),
    Bench(
        "diagnose",
        "diagnose.py",
        ("--trials-per-fault", "2"),
        ("--trials-per-fault", "1", "--faults", "none,slow_loader", "--seconds", "6"),
    ),
    # The same faults across the workload zoo's shapes (issue 39): about 30 minutes; run it in pieces
    # with --shapes and --keep (its docstring).
    Bench(
        "diagnose_zoo",
        "diagnose_zoo.py",
        ("--healthy-seconds", "60"),
        ("--shapes", "log,server", "--faults", "cpu_hog", "--seconds", "6"),
    ),
    # CUDA's kind of entry (a push, emulated), as every CUDA entry point has.
    Bench(
        "overhead_budget",
        "overhead_budget.py",
        ("--libs", "pushfirst"),
        ("--libs", "pushfirst", "--rounds", "1", "--launches", "20000", "--steps", "20"),
    ),
    # The budget on jobs of every shape, each entry kind (issue 41).
    Bench("budget_shapes", "budget_shapes.py", quick=("--rounds", "1", "--only", "short", "--libs", "emulated")),
    Bench("agent_cpu", "agent_cpu.py", quick=("--rounds", "1", "--seconds", "0.5")),
    Bench("agent_cpu_host", "agent_cpu.py", ("--host",), ("--host", "--rounds", "1", "--seconds", "2")),
    Bench("agent_cpu_floor", "agent_cpu.py", ("--floor",), ("--floor", "--rounds", "1", "--seconds", "2")),
    Bench("idle_agent", "idle_agent.py", quick=("--rounds", "1", "--seconds", "3", "--settle", "2"), takes_old=True),
    Bench("stack_cost", "stack_cost.py", quick=("--rounds", "1", "--calls", "2000")),
    Bench("host_sampling", "host_sampling.py", quick=("--seconds", "0.2", "--rounds", "1")),
    Bench(
        "agent_onoff",
        "agent_onoff.py",
        ("--libs", "pushfirst"),
        ("--libs", "pushfirst", "--seconds", "16", "--period", "4", "--settle", "0.5"),
    ),
)
# The slow rank across hosts on the fleet rig (issue 42): a few minutes at 4 x 4.
TARGETS = (*TARGETS, Bench("fleet", "fleet.py", quick=("--trials", "1", "--healthy", "10")))
# What a node costs the fleet, and many nodes the collector and backend (issue 42): real pushes replayed.
TARGETS = (
    *TARGETS,
    Bench(
        "fleet_scale",
        "fleet_scale.py",
        quick=("--nodes", "5", "--at-default", "10", "--seconds", "12", "--warm", "10", "--record-seconds", "5"),
    ),
)
TARGETS_DIR = harness.REPO / "bench" / "targets"


def argv(bench: Bench, quick: bool, old: Path | None) -> list[str]:
    args = [*(bench.quick if quick else bench.args)]
    if old is not None and bench.takes_old:
        args += ["--old", str(old)]
    return [sys.executable, str(TARGETS_DIR / bench.script), *args]


def run(bench: Bench, quick: bool, old: Path | None, out: Path) -> tuple[int, list[Path]]:
    """Run one target (its output as it comes); its exit status and the records it wrote."""
    before = set(out.glob("*.json")) if out.is_dir() else set()
    env = dict(os.environ, MEMTRACE_BENCH_OUT=str(out), MEMTRACE_BENCH_SMOKE="1" if quick else "0")
    cmd = argv(bench, quick, old)
    print(f"== {bench.name}: {' '.join(cmd[1:])}", flush=True)
    rc = subprocess.run(cmd, env=env, cwd=harness.REPO).returncode
    new = sorted(set(out.glob("*.json")) - before) if out.is_dir() else []
    return rc, [p for p in new if p.name.startswith(bench.name + "-")]


def table(rows: list[tuple[str, Path | None, dict[str, Any] | None, str]]) -> list[str]:
    """A block per target: its name and record, then its figures, 80 columns."""
    lines = []
    for name, path, doc, failed in rows:
        if doc is None or path is None:
            lines.append(f"{name}: {failed or 'no record'}")
            continue
        smoke = ", smoke" if doc.get("smoke") else ""
        lines.append(f"{name} ({doc['when'][:10]}{smoke}): {path}")
        problems = harness.check_record(doc)
        lines += [f"  INVALID: {p}" for p in problems] or harness.figure_lines(doc)
    return lines


def markdown(rows: list[tuple[str, Path | None, dict[str, Any] | None, str]]) -> list[str]:
    """The records' figures as rows for bench/RESULTS.md, once the records are
    copied to docs/perf/records/."""
    out = []
    for _name, path, doc, _ in rows:
        if doc is None or path is None:
            continue
        for f in doc["figures"]:
            out.append(
                f"| {f['name']} | {f['shown']} {f['unit']}".strip()
                + f" | {harness.target_text(f)} | {harness.verdict(f)} "
                f"| {doc['when'][:10]} | `{doc['command']}` | [record](../docs/perf/records/{path.name}) |"
            )
    return out


def latest(out: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    newest: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path, doc in harness.records(out):
        if isinstance(doc, dict) and isinstance(doc.get("target"), str):
            newest[doc["target"]] = (path, doc)
    return newest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="each target at a small size: does it run and record")
    ap.add_argument("--only", help="these targets (comma-separated names)")
    ap.add_argument("--old", type=Path, help="another commit's worktree, for the targets that compare with one")
    ap.add_argument("--table", action="store_true", help="print the newest records there are; run nothing")
    ap.add_argument("--markdown", action="store_true", help="with --table: rows for bench/RESULTS.md")
    a = ap.parse_args()
    out = harness.out_dir()
    names = [b.name for b in TARGETS]
    chosen = a.only.split(",") if a.only else names
    unknown = set(chosen) - set(names)
    if unknown:
        ap.error(f"no target {', '.join(sorted(unknown))}; the targets: {', '.join(names)}")
    benches = [b for b in TARGETS if b.name in chosen]
    rows: list[tuple[str, Path | None, dict[str, Any] | None, str]] = []
    if a.table:
        have = latest(out)
        rows = [(b.name, *have[b.name], "") if b.name in have else (b.name, None, None, "") for b in benches]
        print("\n".join(markdown(rows) if a.markdown else table(rows)))
        return 0
    harness.need_root("run_all")
    print(f"machine: {harness.describe()}; records to {out}", flush=True)
    failed = 0
    for b in benches:
        rc, written = run(b, a.quick, a.old, out)
        if rc != 0 or len(written) != 1:
            failed += 1
            why = f"exit {rc}" if rc else f"{len(written)} records written, not one"
            rows.append((b.name, None, None, f"FAILED ({why})"))
            continue
        rows.append((b.name, written[0], harness.load_record(written[0]), ""))
    print()
    print("\n".join(table(rows)))
    print(f"{len(benches) - failed} of {len(benches)} targets wrote their record" + (" (quick)" if a.quick else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
