"""Call sites: `memtrace run --stacks` charges every copy and device
allocation to the native stack that made it, calls and bytes exact, with
real BPF stack capture on real uprobes, workloads built with frame pointers
and without, and real CPython interpreters calling through ctypes."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, memtrace_cmd

from memtrace.export.callsites import folded
from memtrace.runtime.stacks import _Maps
from memtrace.sources.symbols import Mapping, Module, source_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")


def run_stacks(argv: list[str], tmp_path: Path, fakecuda: Path, *extra: str) -> tuple[dict, list[dict]]:
    truth, out = tmp_path / "truth.jsonl", tmp_path / "summary.json"
    env = dict(os.environ, WORKLOAD_TRUTH=str(truth), FAKE_LIBCUDA=str(fakecuda / "lib" / "libcuda.so.1"))
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--stacks", "--no-host", "--format", "json", "-o", str(out), *extra, "--", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), [json.loads(l) for l in truth.read_text().splitlines()]


def functions(site: dict) -> list[str | None]:
    return [f["function"] for f in site["frames"]]


def find(doc: dict, kind: str, callers: list[str]) -> list[dict]:
    """The call sites of this kind whose callers (the frames past the CUDA call) begin with `callers`."""
    return [s for s in doc["stacks"] if s["kind"] == kind and functions(s)[1 : 1 + len(callers)] == callers]


def test_each_copy_and_allocation_is_charged_to_the_stack_that_made_it(fakecuda: Path, tmp_path: Path) -> None:
    doc, truth = run_stacks([str(fakecuda / "stackwork_fp"), "7"], tmp_path, fakecuda)
    for want in truth[0]["sites"]:
        got = find(doc, want["kind"], want["callers"])
        assert len(got) == 1, (want, [functions(s) for s in doc["stacks"]])
        s = got[0]
        # Innermost first: the CUDA call itself, in the runtime, then its callers in the executable.
        assert s["frames"][0]["function"] == want["api"] == s["api"]
        assert Path(s["frames"][0]["module"]).name == "libcudart.so.13"
        assert all(Path(f["module"]).name == "stackwork_fp" for f in s["frames"][1 : 1 + len(want["callers"])])
        assert (s["calls"], s["bytes"]) == (want["calls"], want["bytes"]), want
        if want["kind"] == "copy":
            assert (s["direction"], s["host_memory"]) == (want["direction"], want["host_memory"])
        else:
            assert s["in_use_bytes"] == want["in_use_bytes"]
    # Every call has its stack: the sites add up to the copy totals.
    copies = [s for s in doc["stacks"] if s["kind"] == "copy"]
    assert sum(s["calls"] for s in copies) == sum(r["calls"] for r in doc["memcpy"])
    assert sum(s["bytes"] for s in copies) == sum(r["bytes"] for r in doc["memcpy"])
    counts = doc["agent"]["stacks"]
    assert counts["not_taken"] == counts["not_kept"] == 0
    assert counts["taken"] == sum(s["calls"] for s in doc["stacks"])


def test_without_frame_pointers_the_caller_is_kept_and_its_callers_are_lost(fakecuda: Path, tmp_path: Path) -> None:
    """What a frame-pointer walk recovers from code built without them: the
    CUDA call and its caller (from the return address at the call's entry),
    and no further frame of the program (the walk has no chain to follow)."""
    doc, truth = run_stacks([str(fakecuda / "stackwork_nofp"), "3"], tmp_path, fakecuda)
    for want in truth[0]["sites"]:
        callers = want["callers"][:1]
        got = find(doc, want["kind"], callers)
        assert len(got) == 1, (want, [functions(s) for s in doc["stacks"]])
        s = got[0]
        assert (s["calls"], s["bytes"]) == (want["calls"], want["bytes"])
        rest = functions(s)[2:]
        assert not set(want["callers"][1:]) & set(rest), rest


def test_folded_stacks_weigh_exactly_the_copied_bytes(fakecuda: Path, tmp_path: Path) -> None:
    out = tmp_path / "copies.folded"
    doc, _ = run_stacks([str(fakecuda / "stackwork_fp"), "5"], tmp_path, fakecuda, "--folded", str(out))
    lines = out.read_text().splitlines()
    assert sum(int(l.rsplit(" ", 1)[1]) for l in lines) == sum(r["bytes"] for r in doc["memcpy"])
    h2d = [l for l in lines if "cudaMemcpy h2d pageable" in l]
    assert len(h2d) == 1
    # Outermost first, the process, then the callers down to the call and what it moved.
    assert h2d[0].split(";")[-4:-1] == ["main (stackwork_fp)", "train_step (stackwork_fp)", "load_batch (stackwork_fp)"]
    assert out.read_text() == folded(doc["stacks"])


def interpreters() -> list[str]:
    """CPython 3.10 to 3.13 on this machine (pyenv, or pythonX.Y on PATH), one per minor version."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found: dict[str, str] = {}
    for minor in ("3.10", "3.11", "3.12", "3.13"):
        for cand in [*sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python3")), shutil.which(f"python{minor}")]:
            if cand and os.access(cand, os.X_OK):
                found[minor] = cand
                break
    return list(found.values())


def test_cpython_310_to_313_is_found_here() -> None:
    """The interpreters the next test runs: a machine without any fails, it does not skip."""
    assert interpreters(), "no CPython 3.10-3.13 found (pyenv versions or pythonX.Y on PATH)"


@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_ctypes_calls_from_python_are_all_charged_to_native_stacks(python: str, fakecuda: Path, tmp_path: Path) -> None:
    """Native frames only: the stacks hold the CUDA call and the ctypes
    call path; Python's own frames are not taken yet."""
    doc, truth = run_stacks([python, str(FIXTURES / "ctypes_sites.py"), str(fakecuda / "lib"), "6"], tmp_path, fakecuda)
    for want in truth[0]["sites"]:
        got = [
            s
            for s in doc["stacks"]
            if s["kind"] == want["kind"] and (want["kind"] == "alloc" or s["direction"] == want["direction"])
        ]
        assert [(s["calls"], s["bytes"]) for s in got] == [(want["calls"], want["bytes"])], truth[0]["python"]
        assert got[0]["frames"][0]["function"] == got[0]["api"]
        assert Path(got[0]["frames"][0]["module"]).name == "libcudart.so.13"
    assert doc["agent"]["stacks"]["not_taken"] == 0


def test_folded_without_stacks_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--folded", str(tmp_path / "f"), "--", "touch", str(marker)],
        capture_output=True,
        text=True,
    )
    assert p.returncode != 0
    assert "--folded needs --stacks" in p.stderr and "Traceback" not in p.stderr
    assert not marker.exists()


def test_an_address_is_placed_only_in_a_mapping_that_holds_it() -> None:
    lib = Module("/lib/libx.so", "", -1)
    maps = _Maps([Mapping(0x2000, 0x3000, 0x1000, lib), Mapping(0x5000, 0x6000, 0, lib)])
    assert maps.place(0x2010) == (lib, 0x1010)
    assert maps.place(0x5FFF) == (lib, 0xFFF)
    assert maps.place(0x3000) is None and maps.place(0x1FFF) is None and maps.place(0x4000) is None
    assert maps.overlaps(0x2FFF, 0x4000) and not maps.overlaps(0x3000, 0x5000)


def test_compiler_clone_suffixes_name_the_function_the_user_wrote() -> None:
    assert source_name("load_batch.constprop.0") == "load_batch"
    assert source_name("grow_cache.constprop.0.isra.0") == "grow_cache"
    assert source_name("step.part.0") == "step" and source_name("f.cold") == "f"
    assert source_name("cudaMemcpy") == "cudaMemcpy" and source_name("_ZN3foo3barEv") == "_ZN3foo3barEv"


def test_the_table_names_the_top_call_sites_within_80_columns(fakecuda: Path, tmp_path: Path) -> None:
    env = dict(os.environ, COLUMNS="80", FAKE_LIBCUDA=str(fakecuda / "lib" / "libcuda.so.1"))
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--stacks", "--no-host", "--", str(fakecuda / "stackwork_fp"), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    at = lines.index("call sites: most bytes copied")
    # Most bytes first: the one checkpoint (64 KiB), then the four batches (16 KiB).
    assert lines[at + 1].split(":")[1].strip() == "cudaMemcpy d2h pageable"
    assert lines[at + 2].strip().startswith("<- save_checkpoint <- main")
    assert lines[at + 3].split(":")[1].strip() == "cudaMemcpy h2d pageable"
    assert lines[at + 4].strip().startswith("<- load_batch <- train_step <- main")
    assert "call sites: most bytes allocated" in lines
    assert all(len(l) <= 80 for l in lines), [l for l in lines if len(l) > 80]
