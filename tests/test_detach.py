"""A run's probes go when it does: with multi-uprobe links (this kernel has
them) a library's probes are removed at once as memtrace exits, so no
process calling the library afterwards takes a trap for a run that ended.
(Single uprobes are removed one by one, ~0.1 s each: bench/detach_time.py
measured them lingering 10 s on this VM, while every process calling the
library paid their traps.) Seen in the library's own code: a uprobe is a
breakpoint written over a function's first instruction in every process
that maps the file (int3 on x86-64, BRK #5 on arm64)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import memtrace_cmd

from memtrace.bpf.libbpf import uprobe_multi_supported
from memtrace.core.abi import Layer
from memtrace.sensors.cuda import probe_plan

pytestmark = pytest.mark.bpf

# Maps the library, then prints the first 4 bytes of code at each file offset
# given, as this process sees them (hex, JSON), and exits.
READ_OWN = """
import ctypes, json, sys
lib, offsets = sys.argv[1], [int(x) for x in sys.argv[2:]]
ctypes.CDLL(lib)
maps = []
for line in open("/proc/self/maps"):
    p = line.split()
    if len(p) >= 6 and p[5] == lib:
        lo, hi = (int(x, 16) for x in p[0].split("-"))
        maps.append((lo, hi, int(p[2], 16)))
out = []
with open("/proc/self/mem", "rb") as mem:
    for off in offsets:
        mem.seek(next(lo + off - o for lo, hi, o in maps if o <= off < o + hi - lo))
        out.append(mem.read(4).hex())
print(json.dumps(out))
"""


def first_instructions(lib: Path, offsets: list[int], traced: bool = False) -> list[str]:
    argv = [sys.executable, "-c", READ_OWN, str(lib), *map(str, offsets)]
    if traced:  # memtrace holds the process at the library's mapping until its probes are in
        argv = [*memtrace_cmd(), "run", "--no-host", "--", *argv]
    p = subprocess.run(
        argv, env=dict(os.environ, MEMTRACE_UPROBE_MULTI="1"), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return list(json.loads(p.stdout.splitlines()[-1]))


def breakpoint_in(code: str) -> bool:
    if platform.machine() in ("x86_64", "amd64"):
        return code.startswith("cc")
    return code == "a00020d4"  # BRK #0x5, the arm64 uprobe breakpoint


def test_no_breakpoint_is_left_in_a_library_once_the_run_is_over(fakecuda: Path, tmp_path: Path) -> None:
    assert uprobe_multi_supported(), "this kernel (6.6+) makes multi-uprobe links"
    lib = tmp_path / "libcuda.so.1"  # a fresh inode: no earlier run's probes
    shutil.copy(fakecuda / "lib" / "libcuda.so.1", lib)
    offsets = [p.offset for p in probe_plan(str(lib), Layer.DRIVER)]
    assert len(offsets) > 30
    clean = first_instructions(lib, offsets)
    assert not any(breakpoint_in(c) for c in clean)
    # Traced: every probed function starts with a breakpoint in the traced process.
    assert all(breakpoint_in(c) for c in first_instructions(lib, offsets, traced=True))
    # Over: the same code as before, at once, in the next process to map the library.
    assert first_instructions(lib, offsets) == clean


@pytest.mark.parametrize("budget", ["1%", "off"])
def test_sampled_launch_probes_are_in_the_sampled_process_alone(fakecuda: Path, tmp_path: Path, budget: str) -> None:
    """With the budget on, a sampled process's library has its launch probes
    per process (pid-filtered links): beside the sampled loop, a light one
    whose own launch probes stay attached all along; a third process,
    untraced, mapping the library meanwhile finds no breakpoint on the
    launch functions (neither loop's link reaches it), only on the copies
    (whose probes stay for every process). With the budget off the launch
    probes are the library's, for every process: breakpoints there."""
    assert uprobe_multi_supported()
    lib = tmp_path / "libcuda.so.1"
    shutil.copy(fakecuda / "lib" / "libcuda.so.1", lib)
    plan = probe_plan(str(lib), Layer.DRIVER)
    launches = [p.offset for p in plan if not p.needs_return]
    copy = next(p.offset for p in plan if p.symbol == "cuMemcpyHtoDAsync_v2")
    out = tmp_path / "run.json"
    heavy = [str(fakecuda / "launchloop"), str(lib), "400000", "10000", "100"]
    light = [str(fakecuda / "launchloop"), str(lib), "400", "10000000", "10"]  # ~10 ms of work a launch
    argv = [*memtrace_cmd(), "run", "--no-host", "--overhead-budget", budget, "--format", "json", "-o", str(out)]
    run = subprocess.Popen(
        [*argv, "--", "sh", "-c", f"{' '.join(light)} & {' '.join(heavy)}; wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MEMTRACE_UPROBE_MULTI="1"),
    )
    try:
        seen = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.5)
            codes = first_instructions(lib, [*launches, copy])
            attached = breakpoint_in(codes[-1])  # the copy's probe: every process's
            if attached and (budget == "off" or not any(breakpoint_in(c) for c in codes[:-1])):
                seen = codes
                break
        assert seen is not None, "the loop ended before its launch probes became its own"
        assert [breakpoint_in(c) for c in seen[:-1]] == [budget == "off"] * len(launches)
    finally:
        _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    rows = {row["launches"]: row for row in json.loads(out.read_text())["launches"]}
    assert rows[400]["estimated"] is False  # the light loop: under budget, exact
    (row,) = [r for n, r in rows.items() if n != 400]
    assert row["estimated"] is (budget == "1%")
