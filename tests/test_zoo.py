"""The workload zoo (tests/fixtures/zoo): jobs written with the habits of
real training and inference jobs, each run under `memtrace run --format
json` and its steps (a server's: its iterations) compared with the truth it
prints: the end of each of its iterations, and their kinds
(docs/steps.md says what a step is, and so what each job counts).

Counts and kinds only, no timing thresholds: N iterations end at N waits,
so memtrace counts N - 1 steps (the time before the first is setup); each
count must be within 1% of that. Each test prints its medians, memtrace's
and the truth's (pytest -s), for docs/steps.md's table.

The loop's kind is in the JSON's step row (`loop`); a server's classes of
work are the model's: the run's model is read at exit through
fixtures/zoo/hook (sitecustomize.py on PYTHONPATH), beside the JSON of the
same run.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, run_traced

from memtrace.model.steps import work_class

sys.path.insert(0, str(FIXTURES))
import traces  # noqa: E402

pytestmark = pytest.mark.bpf

HOOK = FIXTURES / "zoo" / "hook"


def traced(fakecuda: Path, tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run argv under `memtrace run`; the JSON, the truth line of the
    process that printed one, its step row and the model's steps."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    steps = tmp_path / "model.json"
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH")) if p)
    doc, lines, p = run_traced(argv, tmp_path, env={"PYTHONPATH": path, "ZOO_STEPS": str(steps), **(env or {})})
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(lines) <= 1, lines
    truth = lines[0] if lines else {}
    model = json.loads(steps.read_text()) if steps.exists() else {}
    pid = truth.get("pid")
    rows = [r for r in doc["steps"] if r["pid"] == pid]
    assert len(rows) <= 1, doc["steps"]
    return {"doc": doc, "truth": truth, "row": rows[0] if rows else None, "model": model.get(str(pid))}


def compare(name: str, run: dict[str, Any]) -> int:
    """The truth's iterations (N ends: N - 1 steps); prints both medians."""
    ends = run["truth"]["ends"]
    want = len(ends) - 1
    row = run["row"]
    assert row is not None, f"{name}: no steps, {want} expected"
    truth_p50 = statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False)) / 1e9
    got_p50 = row["duration_seconds"]["p50"]
    print(
        f"zoo {name}: {row['steps']} steps of {want} ({(row['steps'] - want) / want:+.1%}), "
        f"median {got_p50 * 1e3:.3f} ms of {truth_p50 * 1e3:.3f} ms ({(got_p50 - truth_p50) / truth_p50:+.1%}), "
        f"{run['model']['loop'] if run['model'] else '-'}"
    )
    return want


def train(*args: str) -> list[str]:
    return ["train", "-n", "400", *args]


# What each training job does (zoo/train.c): a step is one pass over a batch
# (its H2D copies, its launches, the loss's 4-byte read and a wait), and
# evaluation passes are steps too; see docs/steps.md.
TRAINING = [
    pytest.param(train("-L", "1", "-M", "i", "-P", "m"), id="log_every_1_mid_step"),
    pytest.param(train("-L", "1", "-M", "i", "-P", "e", "-c", "1"), id="log_every_1_after_the_loss"),
    # The loop that was counted 10% over (every tenth step split in two): 439 steps for 399.
    pytest.param(train("-L", "10", "-M", "i", "-P", "e", "-c", "1"), id="log_every_10"),
    pytest.param(train("-L", "10", "-M", "s", "-P", "m"), id="log_every_10_sync_and_copy"),
    pytest.param(train("-L", "50", "-M", "d", "-P", "m", "-c", "1", "-s", "3"), id="log_every_50_default_stream"),
    pytest.param(train("-L", "50", "-M", "i", "-P", "m", "-c", "1", "-s", "4"), id="log_every_50_item"),
    pytest.param(train("-C", "100", "-T", "20", "-B", "65536", "-Z", "20000", "-c", "1"), id="checkpoint_every_100"),
    pytest.param(
        ["train", "-n", "800", "-L", "50", "-C", "400", "-Z", "50000"], id="log_every_50_checkpoint_every_400"
    ),
    pytest.param(train("-E", "100", "-I", "20"), id="evaluation_every_100"),
    pytest.param(train("-A", "4", "-g"), id="accumulation_each_batch_reads_its_loss"),
    pytest.param(train("-A", "4", "-a"), id="accumulation_the_optimizer_step_reads"),
    pytest.param(train("-j", "40", "-s", "7"), id="variable_length_batches"),
    pytest.param(train("-W", "2"), id="loader_workers_in_processes"),
    pytest.param(train("-X"), id="compute_and_copy_streams"),
    pytest.param(train("-G"), id="one_graph_replay_a_step"),
    pytest.param(["pool", "-n", "300"], id="thread_pool_one_stream"),
    pytest.param(["pool", "-n", "300", "-r", "20"], id="thread_pool_in_stretches"),
    # A batch of four arrays, each transferred on its own by a pool thread drawn for it.
    pytest.param(["pool", "-n", "300", "-c", "4"], id="thread_pool_a_batch_of_arrays"),
]


@pytest.mark.parametrize("argv", TRAINING)
def test_a_training_job_has_one_step_a_pass(argv: list[str], fakecuda: Path, tmp_path: Path, request: Any) -> None:
    run = traced(fakecuda, tmp_path, [str(fakecuda / "zoo" / argv[0]), *argv[1:]])
    want = compare(request.node.callspec.id, run)
    assert abs(run["row"]["steps"] - want) <= 0.01 * want
    assert run["model"] is not None and run["model"]["loop"] == run["row"]["loop"] == "training"
    if "-E" in argv:
        assert Counter(run["truth"]["kinds"])["e"] == 4 * 20  # its evaluation passes are among the steps


SERVERS = [
    pytest.param(["server", "-r", "1000", "-R", "1200"], id="batching_server"),
    pytest.param(["server", "-r", "1000", "-R", "600", "-F", "3", "-s", "2"], id="batching_server_load_triples"),
    pytest.param(["server", "-m", "llm", "-r", "150", "-R", "60", "-k", "250", "-K", "8"], id="llm_prefill_and_decode"),
]


@pytest.mark.parametrize("argv", SERVERS)
def test_a_server_has_iterations_with_their_work(argv: list[str], fakecuda: Path, tmp_path: Path, request: Any) -> None:
    """Its iterations are counted as a training loop's steps are, and said
    to be a server's; their work (bytes in and out) is each iteration's,
    class by class: what a diagnosis compares at equal work."""
    run = traced(fakecuda, tmp_path, [str(fakecuda / "zoo" / argv[0]), *argv[1:]])
    want = compare(request.node.callspec.id, run)
    got = run["model"]
    assert got is not None and got["loop"] == run["row"]["loop"] == "serving"
    assert abs(got["steps"] - want) <= 0.01 * want
    if got["steps"] == want:  # each iteration's own work: the first ended the setup
        t = run["truth"]
        assert (got["bytes_in"], got["bytes_out"]) == (sum(t["bytes_in"][1:]), sum(t["bytes_out"][1:]))
        classes = Counter(work_class(i, o) for i, o in zip(t["bytes_in"][1:], t["bytes_out"][1:], strict=True))
        assert {(a, b): n for a, b, n, _i, _o in got["work"]} == dict(classes)
    if "llm" in argv[2:]:
        kinds = Counter(run["truth"]["kinds"])
        assert kinds["p"] and kinds["d"]  # both kinds of iteration were served


def retimed(name: str, tmp_path: Path) -> Path:
    """The recorded trace as fixtures/zoo/retime.c replays it: each call
    after its recorded entry time."""
    recs = list(traces.records(name))
    plain = tmp_path / "replay.txt"
    n = traces.write_replay(recs, plain)
    kept = [r for r in recs if r["depth"] == 0 and (r["sym"] in traces._SYMS or r["sym"] in traces._RUNTIME_LAUNCHES)]
    lines = plain.read_text().splitlines()
    assert len(lines) == len(kept) == n
    out = tmp_path / "timed.txt"
    out.write_text("".join(f"{r['t_enter_ns']} {line}\n" for r, line in zip(kept, lines, strict=True)))
    return out


def replayed(name: str, fakecuda: Path, tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lib = fakecuda / "lib"
    tmp_path.mkdir(parents=True, exist_ok=True)
    argv = [str(fakecuda / "zoo" / "retime"), str(lib / "libcudart.so.13"), str(lib / "libcuda.so.1")]
    run = traced(
        fakecuda, tmp_path, [*argv, str(retimed(name, tmp_path))], env={"FAKE_LIBCUDA": str(lib / "libcuda.so.1")}
    )
    (row,) = run["doc"]["steps"] or [None]
    model = json.loads((tmp_path / "model.json").read_text())
    return run, [row, model.get(str(row["pid"])) if row else None]


def recorded_ends(name: str) -> list[int]:
    """The recorded loop's iteration ends: its waits that follow a D2H copy
    (loss.item(), or a served batch's result)."""
    ends, last = [], ""
    for r in traces.records(name):
        if r["depth"] != 0:
            continue
        if r["sym"] == "cudaMemcpyAsync":
            last = "d2h" if r["args"][3] == 2 else "other"
        elif r["sym"] == "cudaStreamSynchronize":
            if last == "d2h":
                ends.append(r["t_enter_ns"])
            last = ""
    return ends


@pytest.mark.parametrize(
    ("name", "loop"),
    [("torch_train_pinned", "training"), ("torch_train_pageable", "training"), ("torch_serve", "serving")],
)
def test_the_recorded_pytorch_jobs_replayed_at_their_pace(name: str, loop: str, fakecuda: Path, tmp_path: Path) -> None:
    """Real call streams (tests/traces) at their recorded pace: the two
    training loops have a step per iteration, the server an iteration per
    batch it served, said to be a server's."""
    _run, (row, model) = replayed(name, fakecuda, tmp_path)
    ends = recorded_ends(name)
    want = len(ends) - 1
    assert row is not None and model is not None
    print(
        f"zoo {name}: {row['steps']} of {want}, median {row['duration_seconds']['p50'] * 1e3:.3f} ms of "
        f"{statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False)) / 1e6:.3f} ms, {model['loop']}"
    )
    assert abs(row["steps"] - want) <= 0.01 * want, (row["steps"], want)
    assert model["loop"] == loop, model


def test_the_recorded_jax_job_makes_no_wait_a_step_and_has_no_steps(fakecuda: Path, tmp_path: Path) -> None:
    """JAX's 300 steps replay a graph and copy two batches each, from a pool
    of threads, and never wait for the GPU (it reads its loss without a
    synchronisation the probes see): no wait closes them, and memtrace makes
    none up. Its waits on one stream from six threads come at compile time."""
    run, (row, _model) = replayed("jax_train", fakecuda, tmp_path)
    assert row is None
    assert traces.waits(list(traces.records("jax_train")))  # it did wait, at setup
    assert run["doc"]["synchronization"]
