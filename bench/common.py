"""What the benchmarks share: the checkout they measure, root, and the test
fixtures (tests/fixtures: the test CUDA, NVML and NCCL libraries and the
workloads) built fresh for each run."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def need_root(bench: str, why: str = "memtrace loads BPF programs") -> None:
    """Exit with a word of why when not run as root."""
    if os.geteuid() != 0:
        sys.exit(f"{bench}: run as root ({why})")


def build_fixtures(out: Path, *targets: str, quiet: bool = False) -> Path:
    """tests/fixtures built into `out` (every target, or these): `out`."""
    subprocess.run(["make", "-s", "-C", str(FIXTURES), f"OUT={out}", *targets], check=True, capture_output=quiet)
    return out


def loop_seconds(stdout: str) -> float:
    """The seconds a launch loop (tests/fixtures/launchloop.c) says it took."""
    words = stdout.split()
    return float(words[words.index("seconds") + 1])


def training_job(fx: Path, seconds: float) -> list[str]:
    """The training-like job bench/diagnose shapes (tests/fixtures/trainjob.c):
    real CPU work per step, four 4 MiB copies over the emulated PCIe link,
    three kernels; it runs for `seconds`."""
    job = [str(fx / "trainjob"), "-t", str(seconds), "-L", "2000000", "-w", "1000000", "-k", "3000"]
    return [*job, "-c", "4", "-b", str(4 << 20)]


def idle_pcie_link(path: Path, rate: int = 8 << 30) -> Path:
    """The test driver's emulated PCIe link (FAKE_PCIE, tests/fixtures/driver.c):
    free now, `rate` bytes a second."""
    path.write_bytes((0).to_bytes(8, "little") + rate.to_bytes(8, "little"))
    return path


def build_helper(tree: Path) -> None:
    """The C helpers (memtrace._fastsample) in a tree that has none built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = tree / "memtrace" / f"_fastsample{suffix}"
    if out.exists():
        return
    inc = sysconfig.get_paths()["include"]
    src = tree / "memtrace" / "native" / "fastsample.c"
    cmd = ["gcc", "-O2", "-fvisibility=hidden", "-shared", "-fPIC", f"-I{inc}", "-o", str(out), str(src), "-ldl"]
    subprocess.run([*cmd, "-lpthread"], check=True)


def old_checkout(bench: str, path: Path) -> Path:
    """The other commit's worktree a bench compares this checkout with (--old), its C helpers
    built; exits with how to make one when it holds no memtrace."""
    old = path.resolve()
    if not (old / "memtrace" / "__init__.py").exists():
        sys.exit(f"{bench}: {old} holds no memtrace checkout (git worktree add {old} COMMIT)")
    build_helper(old)
    return old
