"""The benchmarks run, the targets record, and bench/RESULTS.md says only
what their committed records hold.

Benchmarks are run by hand, not in CI, so one that breaks (probe_cost.py
stopped at import once an event field was added, unseen for days) would
otherwise wait for the next person who needs its figure: every script at
least starts (`--help` runs its imports, module-level code and argument
parser), and each target that can in seconds runs at bench/run_all.py's
quick size and writes a valid record. Nothing here is timed: a figure's
value is never asserted, only that it was measured and recorded.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))
from bench import harness, run_all
from bench.harness import CpuWindow, Reading, Record, Spread, Target

RESULTS = REPO / "bench" / "RESULTS.md"
RECORDS = REPO / "docs" / "perf" / "records"
SCRIPTS = [
    *sorted((REPO / "bench" / "targets").glob("*.py")),
    *sorted((REPO / "bench" / "experiments").glob("*.py")),
    REPO / "bench" / "run_all.py",
]
# The targets whose quick run takes seconds here (the rest: minutes, or a GPU, or the recorded traces).
SMOKE = (
    "probe_cost",
    "footprint",
    "attach_time",
    "exit_time",
    "step_time",
    "diagnose",
    "diagnose_zoo",
    "overhead_budget",
    "agent_cpu",
    "agent_cpu_host",
    "agent_cpu_floor",
    "idle_agent",
    "stack_cost",
    "host_sampling",
)


BENCHES = {b.name: b for b in run_all.TARGETS}


def _env(out: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), MEMTRACE_BENCH_OUT=str(out), MEMTRACE_BENCH_SMOKE="1")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO / "bench")))
def test_the_benchmark_starts(script: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=REPO, env=_env(REPO), timeout=60
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage:" in p.stdout, p.stdout[-500:]


def test_every_target_script_is_run_by_run_all() -> None:
    scripts = {b.script for b in run_all.TARGETS}
    assert scripts == {p.name for p in (REPO / "bench" / "targets").glob("*.py")}


@pytest.mark.bpf
@pytest.mark.parametrize("name", SMOKE)
def test_the_target_writes_a_valid_record_at_its_quick_size(name: str, tmp_path: Path) -> None:
    bench = BENCHES[name]
    argv = run_all.argv(bench, True, None)
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env(tmp_path), timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    written = sorted(tmp_path.glob("*.json"))
    assert [w.name.startswith(f"{name}-") for w in written] == [True], written
    doc = harness.load_record(written[0])
    assert harness.check_record(doc) == []
    assert doc["target"] == name and doc["smoke"] is True
    assert doc["command"] == " ".join([f"bench/targets/{bench.script}", *bench.quick])


@pytest.mark.bpf
def test_run_all_prints_the_records_it_made_and_leaves_results_alone(tmp_path: Path) -> None:
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    run = [sys.executable, str(REPO / "bench" / "run_all.py")]
    p = subprocess.run(
        [*run, "--quick", "--only", "step_time"], capture_output=True, text=True, cwd=REPO, env=_env(tmp_path)
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 of 1 targets wrote their record (quick)" in p.stdout
    (record,) = tmp_path.glob("step_time-*.json")
    assert "step_time (" in p.stdout and str(record) in p.stdout
    assert (RESULTS.read_bytes() if RESULTS.exists() else None) == before
    table = subprocess.run(
        [*run, "--table", "--markdown", "--only", "step_time"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(tmp_path),
        check=True,
    ).stdout
    rows = results_rows(table)
    assert rows and all(r["record"] == f"../docs/perf/records/{record.name}" for r in rows)


# ---- bench/RESULTS.md against the committed records ----

COLUMNS = ("figure", "measured", "target", "met", "date", "command", "record")


def results_rows(text: str) -> list[dict[str, str]]:
    """The rows of RESULTS.md's figures table (and of run_all.py --table --markdown)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS) or not line.startswith("|") or cells[0] in ("figure", "---"):
            continue
        row = dict(zip(COLUMNS, cells, strict=True))
        link = re.fullmatch(r"\[record\]\(([^)]+)\)", row["record"])
        command = re.fullmatch(r"`([^`]+)`", row["command"])
        row["record"] = link.group(1) if link else row["record"]
        row["command"] = command.group(1) if command else row["command"]
        rows.append(row)
    return rows


def drift(row: dict[str, str], base: Path = RESULTS.parent) -> list[str]:
    """Where a RESULTS.md row says other than the record it cites."""
    path = (base / row["record"]).resolve()
    if not path.is_file() or path.parent != RECORDS.resolve():
        return [f"{row['figure']}: cites {row['record']}, not a record in docs/perf/records"]
    doc = harness.load_record(path)
    problems = [f"{path.name}: {p}" for p in harness.check_record(doc)]
    if doc.get("smoke"):
        problems.append(f"{path.name}: a smoke record (run_all.py --quick), not a figure")
    figs = [f for f in doc.get("figures", []) if f.get("name") == row["figure"]]
    if len(figs) != 1:
        return [*problems, f"{path.name} has no figure named {row['figure']!r}"]
    f = figs[0]
    said = {
        "measured": f"{f['shown']} {f['unit']}".strip(),
        "target": harness.target_text(f),
        "met": harness.verdict(f),
        "date": doc["when"][:10],
        "command": doc["command"],
    }
    problems += [f"{row['figure']}: {k} is {row[k]!r}, the record says {v!r}" for k, v in said.items() if row[k] != v]
    return problems


def test_every_figure_in_results_is_its_committed_record() -> None:
    rows = results_rows(RESULTS.read_text())
    assert rows, "no figures table in bench/RESULTS.md"
    assert [p for row in rows for p in drift(row)] == []


def test_a_results_row_that_drifts_from_its_record_is_caught() -> None:
    row = results_rows(RESULTS.read_text())[0]
    assert drift(row) == []
    changed = {"measured": "0.001 x", "target": "<= 99", "met": "met?", "date": "2000-01-01", "command": "bench/x.py"}
    for column, other in changed.items():
        assert drift({**row, column: other}), column
    assert drift({**row, "figure": "a figure nobody measured"})
    assert drift({**row, "record": "../bench/out/elsewhere.json"})


def test_every_committed_record_is_valid_and_cited() -> None:
    cited = {Path(r["record"]).name for r in results_rows(RESULTS.read_text())}
    committed = {p.name: harness.load_record(p) for p in RECORDS.glob("*.json")}
    assert committed
    assert {name: harness.check_record(doc) for name, doc in committed.items()} == dict.fromkeys(committed, [])
    assert sorted(committed) == sorted(cited)


# ---- the harness ----


def test_a_spread_holds_the_median_between_order_statistics() -> None:
    five = Spread.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (five.median, five.lo, five.hi, five.ci, five.n) == (3.0, 1.0, 5.0, (1.0, 5.0), 5)
    assert five.confidence == pytest.approx(1 - 2 / 32)  # min-max holds the median unless all fall on one side
    ten = Spread.of(float(x) for x in range(10))
    assert ten.ci == (1.0, 8.0) and ten.confidence == pytest.approx(1 - 2 * 11 / 1024)


def test_arms_alternate_in_the_order_asked() -> None:
    arms = ("a", "b", "c")
    assert [a for _, a in harness.alternating(arms, 2)] == ["a", "b", "c", "a", "b", "c"]
    assert [a for _, a in harness.alternating(arms, 3, "rotate")] == [*"abc", *"bca", *"cab"]
    assert [a for _, a in harness.alternating(arms, 2, "reverse")] == [*"abc", *"cba"]
    assert [r for r, _ in harness.alternating(arms, 2)] == [0, 0, 0, 1, 1, 1]


def test_a_threads_cpu_is_read_by_its_name() -> None:
    code = "import ctypes,time; ctypes.CDLL(None).prctl(15, b'bench-spin'); t=time.process_time()\n"
    code += "while time.process_time() - t < 0.3: pass\nprint('spun', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "spun"
        threads = harness.thread_cpu_seconds(p.pid)
    finally:
        p.kill()
        p.wait()
    (cpu,) = [c for name, c in threads.values() if name == "bench-spin"]
    assert cpu >= 0.2
    assert harness.thread_cpu_seconds(p.pid) == {}


def test_an_agents_reading_holds_its_guardians_cpu_and_no_other_childs() -> None:
    """The guardian is a process of its own (memtrace/sensors/cuda/holds.py):
    the agent's CPU figures count it, by its name or, unnamed, as a fork that
    never exec'd; a traced job, also the agent's child under `memtrace run`,
    is not the agent's."""
    spin = "import ctypes,os,time; ctypes.CDLL(None).prctl(15, {name!r}); t=time.process_time()\n"
    spin += "while time.process_time() - t < 0.3: pass\nos.write(1, b'x'); time.sleep(30)"
    code = "import subprocess, sys, time\n"
    code += f"kids = [subprocess.Popen([sys.executable, '-c', {spin.format(name=b'memtrace-guard')!r}]),"
    code += f" subprocess.Popen([sys.executable, '-c', {spin.format(name=b'job')!r}])]\n"
    # and one forked, never exec'd (the guardian of a memtrace from before it was named)
    code += "import os\nif os.fork() == 0:\n    t = time.process_time()\n"
    code += "    while time.process_time() - t < 0.3: pass\n"
    code += "    os.write(1, b'x'); time.sleep(30)\n"
    code += "time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.read(3) == b"xxx"
        names = [name for name, _ in Reading.of(p.pid).threads.values()]
        kids = harness.guardians(p.pid)
        own = harness.process_cpu_seconds(p.pid)
        total = harness.agent_cpu_seconds(p.pid)
        cpus = [harness.process_cpu_seconds(k) for k in kids]
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the children too
        p.wait()
    assert "memtrace-guard" in names and "job" not in names and len(kids) == 2
    assert own is not None and total is not None and all(c is not None and c >= 0.2 for c in cpus)
    assert total == pytest.approx(own + sum(c or 0.0 for c in cpus), abs=0.02)


def test_a_cpu_window_counts_each_thread_from_the_first_reading_or_its_start() -> None:
    first = Reading(10.0, {1: ("memtrace-drain", 2.0), 2: ("memtrace-fold", 1.0)})
    last = Reading(12.0, {1: ("memtrace-drain", 2.5), 2: ("memtrace-fold", 1.5), 3: ("memtrace-fold", 0.25)})
    w = CpuWindow.between(first, last)
    assert w.by_name == {"memtrace-drain": 0.5, "memtrace-fold": 0.75}
    assert w.share == pytest.approx(0.625)
    assert w.busiest() == "fold 37.50%, drain 25.00%"
    gone = Reading(13.0, {1: ("memtrace-drain", 3.0)}).keeping(last)
    assert CpuWindow.between(first, gone).by_name == {"memtrace-drain": 1.0, "memtrace-fold": 0.75}


def test_a_record_holds_its_figures_against_their_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTRACE_BENCH_OUT", str(tmp_path))
    monkeypatch.setenv("MEMTRACE_BENCH_SMOKE", "0")
    rec = Record("example")
    rec.add("a ratio", 1.0312, "x", ".3f", Target("<=", 1.15), Spread.of([1.0, 1.0312, 1.2]))
    rec.add("a rate", 9e5, "events/s", ",.0f", Target(">=", 1e6))
    rec.add("a time", 149.0, "ms", ".0f")
    doc = json.loads(rec.write().read_text())
    assert harness.check_record(doc) == []
    assert [(f["shown"], f["met"]) for f in doc["figures"]] == [("1.031", True), ("900,000", False), ("149", None)]
    assert doc["target"] == "example" and doc["smoke"] is False and doc["machine"]["cpus"] == os.cpu_count()
    assert doc["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", doc["commit"])
    broken = {**doc, "figures": [{**doc["figures"][1], "met": True}]}
    assert harness.check_record(broken) == ["figure 'a rate': met is True, but 900000.0 >= 1000000.0 says otherwise"]
    assert harness.check_record({**doc, "machine": {}})
    assert harness.check_record({**doc, "figures": []}) == ["no figures"]


def test_a_window_that_measured_nothing_gives_no_ratio_and_no_figure() -> None:
    assert harness.ratios([1.0, 2.0], [0.0, 4.0]) == [0.5]
    assert harness.ratio_spread([1.0], [0.0]) is None
    assert harness.over(1.0, 4.0) == 0.25 and math.isnan(harness.over(1.0, 0.0))
    rec = Record("example")
    assert rec.add("a ratio", harness.over(1.0, 0.0), "x") is None
    assert rec.figures == []
