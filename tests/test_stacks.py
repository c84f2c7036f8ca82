"""Call sites: `memtrace run --stacks` charges every copy and device
allocation to the stack that made it, calls and bytes exact, with real BPF
stack capture on real uprobes: native frames of workloads built with frame
pointers and without, and the Python frames (function, file, line) of real
CPython 3.10 to 3.13 interpreters calling through ctypes."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, memtrace_cmd

from memtrace.core.abi import PY_DEPTH, PY_NONE
from memtrace.core.stacks import NativeFrame, PythonFrame
from memtrace.export.callsites import folded
from memtrace.runtime.stacks import _Maps, merge
from memtrace.sources import python as pyframes
from memtrace.sources.symbols import Mapping, Module, demangle, source_name


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


@pytest.mark.bpf
@pytest.mark.parametrize("program", ["stackwork_fp", "stackwork_nopie"])
def test_each_copy_and_allocation_is_charged_to_the_stack_that_made_it(
    program: str, fakecuda: Path, tmp_path: Path
) -> None:
    """Position-independent or not: a non-PIE executable is mapped low, where
    /proc/PID/maps pads the addresses that map_files/ names unpadded."""
    doc, truth = run_stacks([str(fakecuda / program), "7"], tmp_path, fakecuda)
    for want in truth[0]["sites"]:
        got = find(doc, want["kind"], want["callers"])
        assert len(got) == 1, (want, [functions(s) for s in doc["stacks"]])
        s = got[0]
        # Innermost first: the CUDA call itself, in the runtime, then its callers in the executable.
        assert s["frames"][0]["function"] == want["api"] == s["api"]
        assert Path(s["frames"][0]["module"]).name == "libcudart.so.13"
        assert all(Path(f["module"]).name == program for f in s["frames"][1 : 1 + len(want["callers"])])
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


@pytest.mark.bpf
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


@pytest.mark.bpf
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
    """CPython 3.10 to 3.13 on this machine (pyenv, or pythonX.Y on PATH), one
    per minor version, and the distribution's own (Debian's and Ubuntu's
    /usr/bin/python3.x: a non-PIE executable with libpython linked in, as
    the GPU machine's PyTorch runs on)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found: dict[str, str] = {}
    for minor in ("3.10", "3.11", "3.12", "3.13"):
        for cand in [*sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python3")), shutil.which(f"python{minor}")]:
            if cand and os.access(cand, os.X_OK):
                found[minor] = cand
                break
    distro = sorted(p for p in glob.glob("/usr/bin/python3.1[0-3]") if os.access(p, os.X_OK))
    return [*found.values(), *distro[-1:]]


def test_cpython_310_to_313_is_found_here() -> None:
    """The interpreters the next test runs: a machine without any fails, it does not skip."""
    assert interpreters(), "no CPython 3.10-3.13 found (pyenv versions or pythonX.Y on PATH)"


def python_frames(site: dict) -> list[dict]:
    return [f for f in site["frames"] if "file" in f]


def leaf(function: str) -> str:
    """A function's own name: 3.11+ gives qualified names (main.<locals>.upload)."""
    return function.rsplit(".", 1)[-1]


@pytest.mark.bpf
@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_ctypes_calls_from_python_are_charged_to_the_lines_that_made_them(
    python: str, fakecuda: Path, tmp_path: Path
) -> None:
    """Real CPython 3.10 to 3.13: every copy and allocation is charged to
    its Python call site, function, file and line, innermost first, after
    the native frames of the CUDA call (the walk stops in libffi, built
    without frame pointers, so the Python frames follow the native ones)."""
    doc, truth = run_stacks([python, str(FIXTURES / "ctypes_sites.py"), str(fakecuda / "lib"), "6"], tmp_path, fakecuda)
    t = truth[0]
    for want in t["sites"]:
        got = [
            s
            for s in doc["stacks"]
            if s["kind"] == want["kind"] and (want["kind"] == "alloc" or s["direction"] == want["direction"])
        ]
        assert [(s["calls"], s["bytes"]) for s in got] == [(want["calls"], want["bytes"])], t["python"]
        site = got[0]
        assert site["frames"][0]["function"] == site["api"]
        assert Path(site["frames"][0]["module"]).name == "libcudart.so.13"
        assert site["python_frames"] == "taken", (t["python"], site)
        py = python_frames(site)
        assert [[leaf(f["function"]), f["line"]] for f in py] == want["python"], (t["python"], py)
        assert {Path(f["file"]).resolve() for f in py} == {Path(t["file"]).resolve()}
        # The Python frames are the outermost: no native frame after them, and
        # no address the walk found past libffi (no frame pointers) taken for a frame.
        first = site["frames"].index(py[0])
        assert all("file" in f for f in site["frames"][first:])
        assert all(f["module"] != "[unknown]" for f in site["frames"][:first]), site["frames"]
    assert doc["agent"]["stacks"]["not_taken"] == 0
    assert doc["agent"]["stacks"]["python_frames_unnamed"] == 0


@pytest.mark.bpf
@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_a_thread_gets_its_own_python_frames_and_deep_recursion_keeps_the_innermost(
    python: str, fakecuda: Path, tmp_path: Path
) -> None:
    """A worker thread's copies carry the worker's frames, never those of
    the main thread waiting in join(); a stack deeper than BPF keeps is
    marked truncated and keeps its innermost frames, each at its line."""
    depth = 40
    doc, truth = run_stacks(
        [python, str(FIXTURES / "ctypes_threads.py"), str(fakecuda / "lib"), str(depth)], tmp_path, fakecuda
    )
    t = truth[0]
    worker, deep = t["sites"]
    got = [s for s in doc["stacks"] if s["direction"] == "h2d"]
    assert [(s["calls"], s["bytes"]) for s in got] == [(worker["calls"], worker["bytes"])]
    py = python_frames(got[0])
    assert got[0]["python_frames"] == "taken"
    assert [leaf(py[0]["function"]), py[0]["line"]] == worker["python"][0]
    assert all(f["line"] != t["join_line"] and leaf(f["function"]) not in ("main", "idle") for f in py), py
    got = [s for s in doc["stacks"] if s["direction"] == "d2h"]
    assert [(s["calls"], s["bytes"]) for s in got] == [(deep["calls"], deep["bytes"])]
    py = python_frames(got[0])
    assert got[0]["python_frames"] == "truncated"
    assert len(py) == PY_DEPTH
    assert [[leaf(f["function"]), f["line"]] for f in py] == deep["python"][:PY_DEPTH]
    st = doc["agent"]["stacks"]
    assert st["python_frames_unnamed"] == 0
    # 3.10's frames are heap objects, read one at a time; from 3.11 they lie
    # on the thread's own stack of memory, and one read holds a run of them.
    if t["python"] == "3.10":
        assert st["python_frame_reads"] == st["python_frames_walked"] > PY_DEPTH, st
    else:
        assert 2 * st["python_frame_reads"] < st["python_frames_walked"], st
        assert st["python_frames_walked"] > PY_DEPTH, st
    # The worker's state is listed after the newer waiter's: found by a search
    # (the interpreter, two thread states, the frame: six reads) once, then
    # checked where it was (itself, its neighbour: two). Searched afresh each
    # time, it would take six a call.
    assert st["taken"] == worker["calls"] + deep["calls"]
    assert 0 < st["python_thread_reads"] < 3 * st["taken"], st


@pytest.mark.bpf
@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_a_native_thread_whose_python_state_is_gone_gets_no_python_frames(
    python: str, fakecuda: Path, tmp_path: Path
) -> None:
    """A native thread runs a Python hook (ctypes gives it a thread state,
    then deletes it) and then copies from C. The hook's copies carry the
    hook's frame; the C copies that follow say `no thread state`: the
    state BPF remembered for the thread is gone from the interpreter's
    list, though its freed memory may still hold the thread's id."""
    rounds = 5
    doc, truth = run_stacks(
        [python, str(FIXTURES / "ctypes_callin.py"), str(fakecuda / "lib"), str(rounds)], tmp_path, fakecuda
    )
    t = truth[0]
    hook = [s for s in doc["stacks"] if s["direction"] == "h2d"]
    assert [(s["calls"], s["bytes"]) for s in hook] == [(t["hook"]["calls"], t["hook"]["bytes"])], t["python"]
    assert hook[0]["python_frames"] == "taken"
    assert [[leaf(f["function"]), f["line"]] for f in python_frames(hook[0])][:1] == t["hook"]["python"]
    native = [s for s in doc["stacks"] if s["direction"] == "d2h"]
    assert sum(s["calls"] for s in native) == t["native"]["calls"]
    assert sum(s["bytes"] for s in native) == t["native"]["bytes"]
    assert {s["python_frames"] for s in native} == {"no thread state"}, (t["python"], native)
    assert not any(python_frames(s) for s in native)


@pytest.mark.bpf
def test_a_python_process_met_after_its_libraries_gets_its_frames_from_when_it_is_found(
    fakecuda: Path, tmp_path: Path
) -> None:
    """A second process of the same interpreter maps libraries memtrace has
    attached already, so it is not held: its interpreter is found at its
    first call, and the calls before that have no Python frames and say so
    ("not taken"). Every call is charged; no call gets another's frames."""
    python = interpreters()[-1]
    work = f"{python} {FIXTURES / 'ctypes_sites.py'} {fakecuda / 'lib'} 40"
    # The second is read at its first call, on the control thread: it must
    # outlive that (its 41 calls take milliseconds, and an exited process's
    # maps cannot be read; then it has no interpreter, and says nothing).
    doc, truth = run_stacks(["sh", "-c", f"{work} && SITES_LINGER=1 {work}"], tmp_path, fakecuda)
    assert len(truth) == 2
    for t in truth:
        rows = [s for s in doc["stacks"] if s["pid"] == t["pid"]]
        for want in t["sites"]:
            got = [
                s
                for s in rows
                if s["kind"] == want["kind"] and (want["kind"] == "alloc" or s["direction"] == want["direction"])
            ]
            assert sum(s["calls"] for s in got) == want["calls"] and sum(s["bytes"] for s in got) == want["bytes"]
            for s in got:
                py = python_frames(s)
                assert s["python_frames"] in ("taken", "not taken"), s
                if s["python_frames"] == "taken":
                    assert [[leaf(f["function"]), f["line"]] for f in py] == want["python"]
                else:
                    assert py == []
    first = [s for s in doc["stacks"] if s["pid"] == truth[0]["pid"]]
    assert {s["python_frames"] for s in first} == {"taken"}  # held at its first CUDA library: all of it


@pytest.mark.bpf
def test_the_pageable_finding_names_the_python_lines_that_copied_most(fakecuda: Path, tmp_path: Path) -> None:
    """pageable_h2d says where the pageable bytes came from: the line in the
    user's code, with each line's bytes and share in its evidence."""
    python = interpreters()[-1]
    doc, truth = run_stacks([python, str(FIXTURES / "ctypes_pageable.py"), str(fakecuda / "lib")], tmp_path, fakecuda)
    t = truth[0]
    (f,) = [f for f in doc["findings"] if f["code"] == "pageable_h2d"]
    total = sum(b for _, b in t["sites"].values())
    want = [
        {"site": f"{t['file']}:{line} in main.<locals>.{fn}", "bytes": b, "share": b / total}
        for fn, (line, b) in sorted(t["sites"].items(), key=lambda kv: -kv[1][1])
    ]
    assert f["evidence"]["sites"] == want
    assert f["summary"].endswith(f"; 75% of them from {want[0]['site']}")


def other_pythons() -> list[str]:
    """CPython versions memtrace does not walk (pyenv's 3.6 to 3.9 here)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/3.[6-9].*/bin/python3"))
    return found[-1:]


@pytest.mark.bpf
def test_an_interpreter_memtrace_does_not_walk_gets_native_frames_marked_unsupported(
    fakecuda: Path, tmp_path: Path
) -> None:
    """CPython 3.9 (any version outside 3.10-3.13): no Python frames, never
    frames read with another version's layout; the stacks say so, the agent
    says which interpreter, and every call is still charged."""
    others = other_pythons()
    assert others, "no CPython older than 3.10 found (pyenv versions)"
    doc, truth = run_stacks(
        [others[0], str(FIXTURES / "ctypes_sites.py"), str(fakecuda / "lib"), "3"], tmp_path, fakecuda
    )
    for want in truth[0]["sites"]:
        got = [
            s
            for s in doc["stacks"]
            if s["kind"] == want["kind"] and (want["kind"] == "alloc" or s["direction"] == want["direction"])
        ]
        assert sum(s["calls"] for s in got) == want["calls"] and sum(s["bytes"] for s in got) == want["bytes"]
        for s in got:
            assert s["python_frames"] == "unsupported"
            assert not python_frames(s)
            assert s["frames"][0]["function"] == s["api"]
    version = truth[0]["python"]
    assert list(doc["agent"]["stacks"]["python_unsupported"]) == [
        f"CPython {version}: memtrace walks the frames of CPython 3.10 to 3.13"
    ]


LINES_DUMP = r"""
import json, sys, types
import json.decoder, argparse, textwrap
def codes(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)
out = []
for mod in (json.decoder, argparse, textwrap):
    src = open(mod.__file__).read()
    for co in codes(compile(src, mod.__file__, "exec")):
        out.append([co.co_linetable.hex(), co.co_firstlineno, [list(r) for r in co.co_lines()]])
print(json.dumps(out))
"""


@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_line_tables_decode_as_the_interpreter_itself_reads_them(python: str) -> None:
    """Every instruction of every function of three stdlib modules gets the
    line the interpreter's own co_lines() gives it (3.10's table and
    3.11+'s location table)."""
    dump = json.loads(subprocess.run([python, "-c", LINES_DUMP], capture_output=True, text=True, check=True).stdout)
    location = not Path(python).resolve().name.startswith("python3.10")
    decode = pyframes.line_of_location_table if location else pyframes.line_of_line_table
    checked = 0
    for table, first, ranges in dump:
        for start, end, line in ranges:
            for offset in range(start, end, 2):
                assert decode(bytes.fromhex(table), first, offset) == line, (first, start, end)
                checked += 1
    assert checked > 10_000


# Offsets the naming reads in every version (sources/python.py), not in a Layout.
FIXED_OFFSETS = {"bytes_size": 16, "bytes_sval": 32, "str_length": 16, "str_state": 32, "ob_type": 8}


@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_each_versions_offsets_are_those_of_its_own_headers(python: str, tmp_path: Path) -> None:
    """The layout memtrace walks each CPython with, against offsetof() in a
    program built with that interpreter's own headers (3.13's layout is
    then taken from the interpreter itself: _Py_DebugOffsets)."""
    cfg = json.loads(
        subprocess.run(
            [python, "-c", "import json, sysconfig; print(json.dumps(sysconfig.get_paths()['include']))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    exe = tmp_path / "offsets"
    subprocess.run(
        ["cc", "-w", "-I", cfg, "-I", f"{cfg}/internal", str(FIXTURES / "py_offsets.c"), "-o", str(exe)], check=True
    )
    measured = dict(
        l.split() for l in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    )
    version = tuple(int(x) for x in Path(cfg).name.removeprefix("python").split(".")[:2])
    layout = pyframes.LAYOUTS[version]
    for name, value in measured.items():
        want = FIXED_OFFSETS[name] if name in FIXED_OFFSETS else getattr(layout, name)
        assert int(value) == want, (version, name)
    # What the headers do not have is absent from the layout too.
    for name in ("cframe_frame", "frame_owner", "frame_is_entry", "code_qualname", "code_adaptive"):
        if name not in measured:
            assert getattr(layout, name) == PY_NONE, (version, name)


def test_python_frames_take_the_place_of_the_interpreters_evaluation_frames() -> None:
    """With frame pointers, the native walk reaches the interpreter: each
    _PyEval_EvalFrameDefault gives way to the Python frames it ran (up to
    an entry frame); frames the walk did not reach follow the native ones."""
    nat = [NativeFrame("libcudart.so", f, 0) for f in ("cudaMemcpy", "ext_call", "_PyEval_EvalFrameDefault")]
    nat += [NativeFrame("libpython.so", f, 0) for f in ("PyObject_Call", "_PyEval_EvalFrameDefault", "main")]
    a, b, c = (PythonFrame(n, "t.py", i) for i, n in enumerate("abc"))
    got = merge(nat, ((a, False), (b, True), (c, True)))
    assert [f.function for f in got] == ["cudaMemcpy", "ext_call", "a", "b", "PyObject_Call", "c", "main"]
    # The walk stopped before the interpreter: every Python frame follows, unnamed ones marked.
    got = merge(nat[:2], ((a, False), (None, True), (c, True)))
    assert [f.function for f in got] == ["cudaMemcpy", "ext_call", "a", "[python]", "c"]


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


@pytest.mark.bpf
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


def test_cpp_functions_are_named_as_their_source_names_them() -> None:
    """PyTorch's frames as the H200 showed them, through the host's own
    libstdc++ demangler; C names and what it refuses stay as they are."""
    assert demangle("_ZN2at6nativeL16copy_kernel_cudaERNS_14TensorIteratorEb") == (
        "at::native::copy_kernel_cuda(at::TensorIterator&, bool)"
    )
    assert (
        demangle("_ZN2at6native5copy_ERNS_6TensorERKS1_b") == "at::native::copy_(at::Tensor&, at::Tensor const&, bool)"
    )
    assert demangle("cudaMemcpyAsync") == "cudaMemcpyAsync"
    assert demangle("_Znot-a-name") == "_Znot-a-name"


def test_symbol_tables_read_as_arrays_name_each_function_as_its_elf_symbol_does() -> None:
    """The symbol tables are read as arrays (a PyTorch library has about a
    million symbols); every function symbol pyelftools lists, walked one by
    one, is found at its own address under its own (demangled) name."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    from memtrace.sources.symbols import ElfSymbols

    for path in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/lib/x86_64-linux-gnu/libc.so.6"):
        if not os.path.exists(path):
            path = path.replace("x86_64", "aarch64")
        fd = os.open(path, os.O_RDONLY)
        try:
            syms = ElfSymbols(Module(path, fd))
            checked = 0
            with open(path, "rb") as f:
                elf = ELFFile(f)
                segs = [
                    (s["p_offset"], s["p_vaddr"], s["p_filesz"])
                    for s in elf.iter_segments()
                    if s["p_type"] == "PT_LOAD"
                ]
                named: dict[int, set[str]] = {}
                for sec in elf.iter_sections():
                    if not isinstance(sec, SymbolTableSection):
                        continue
                    for sym in sec.iter_symbols():
                        if sym["st_info"]["type"] in ("STT_FUNC", "STT_LOOS", "STT_GNU_IFUNC") and sym["st_value"]:
                            if sym["st_shndx"] != "SHN_UNDEF" and sym.name:
                                named.setdefault(sym["st_value"], set()).add(demangle(source_name(sym.name)))
            for value, names in named.items():
                off = next((value - va + o for o, va, n in segs if va <= value < va + n), None)
                if off is None:
                    continue
                assert syms.function_at(off) in names, (path, hex(value), names)
                checked += 1
            assert checked > 1000, (path, checked)
        finally:
            os.close(fd)


def test_a_line_of_text_names_a_cpp_function_without_its_parameters() -> None:
    """The table and a finding's words (the JSON keeps the whole name)."""
    from memtrace.export.callsites import site_label, without_parameters

    assert without_parameters("at::native::copy_(at::Tensor&, at::Tensor const&, bool)") == "at::native::copy_"
    assert without_parameters("foo::operator()(int) const") == "foo::operator()"
    assert without_parameters("(anonymous namespace)::f(int)") == "(anonymous namespace)::f"
    assert without_parameters("cudaMemcpy") == "cudaMemcpy"
    site = {
        "frames": [
            {"module": "/x/libcudart.so.13", "function": "cudaMemcpyAsync", "offset": 1},
            {"module": "/x/libtorch_cuda.so", "function": "at::native::copy_kernel_cuda(at::TensorIterator&, bool)"},
        ]
    }
    assert site_label(site) == "at::native::copy_kernel_cuda (libtorch_cuda.so)"
