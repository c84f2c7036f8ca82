"""Run every benchmark of issue 6 and write bench/RESULTS.md.

    sudo .venv/bin/python bench/run_all.py [--quick]

Each benchmark prints ratios measured side by side in one run; this runner
records their output with the machine, kernel and commit, so results are
never separated from where they were measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BENCHES = [
    ("Traced-process overhead per call (target 1: memtrace/bare <= 1.15)", "probe_cost.py", ["--rounds", "7"]),
    ("Agent throughput (target 2: >= 1M events/s per core, no drops)", "agent_throughput.py", []),
    ("Agent footprint (target 3: < 150 MB at 1000 processes)", "footprint.py", []),
    ("Time to attach (target 4)", "attach_time.py", []),
    ("Step time, SIMULATED without a GPU (stand-in for target 5)", "step_time.py", ["--simulate"]),
    ("Host sampling, NICs and GPUs (issue 15: <= 0.5% of one core at 100 Hz)", "host_sampling.py", []),
    ("CPU sensor: sched probes per context switch (issue 15)", "sched_cost.py", ["--rounds", "7"]),
    (
        "What memtrace costs a CPU-bound launch loop, against what it says (issue 18)",
        "overhead.py",
        ["--rounds", "4", "--launches", "50000", "--work", "18000"],
    ),
]
FOOTER = [
    "## Not measured here",
    "",
    "Target 5 (step time of a PyTorch training loop traced against untraced, alternating A/B, and the",
    "per-call figure of target 1 there) needs the GPU machine, which this run did not have:",
    "`sudo .venv/bin/python bench/step_time.py` there runs `examples/torch_train.py` in alternating rounds.",
    "The simulated section above is not that figure: it has no GPU, and its GPU-bound shape is a model.",
    "The uprobe trap on this VM costs about 5 us (0.8 us on the H100 host, field notes), so the",
    "absolute figures above are this VM's.",
    "",
]
QUICK = {
    "probe_cost.py": ["--rounds", "3", "--calls", "50000"],
    "footprint.py": ["--counts", "1,10,100", "--soak", "2000000"],
    "agent_throughput.py": ["--rounds", "3"],
    "step_time.py": ["--simulate", "--rounds", "3", "--steps", "200"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds, no 1000-process run")
    ap.add_argument("--out", default=str(REPO / "bench" / "RESULTS.md"))
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    cpu = next(
        (l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in l),
        platform.processor(),
    )
    lines = [
        "# memtrace benchmark results",
        "",
        f"Written by `bench/run_all.py` on {datetime.date.today()}, commit {commit.stdout.strip() or '?'}.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, "
        f"Python {platform.python_version()}.",
        "Each section is one benchmark's own output: every ratio in it was measured side by side in one run.",
        "",
    ]
    rows: list[str] = []
    sections: list[str] = []
    for title, script, args in BENCHES:
        argv = [sys.executable, str(REPO / "bench" / script), *(QUICK.get(script, args) if a.quick else args)]
        print(f"== {title}: {' '.join(argv[1:])}", flush=True)
        r = subprocess.run(argv, capture_output=True, text=True)
        out = "\n".join(l for l in r.stdout.splitlines() if l.strip() and not l.startswith("SUMMARY |"))
        rows += [l.split("|", 1)[1].strip() for l in r.stdout.splitlines() if l.startswith("SUMMARY |")]
        print(out, flush=True)
        cmd = f"sudo .venv/bin/python bench/{script} {' '.join(args)}".strip()
        sections += [f"## {title}", "", f"`{cmd}`", ""]
        sections += ["```", out or f"(failed: {r.stderr.strip()[-500:]})", "```", ""]
    lines += ["| figure | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {r} |" for r in rows]
    lines += ["", *sections, *FOOTER]
    Path(a.out).write_text("\n".join(lines))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
