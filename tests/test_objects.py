"""The BPF objects shipped in the package are the ones the sources build,
for the architecture they are named after."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO
from elftools.elf.elffile import ELFFile

from memtrace.bpf.host import object_path, rodata_options

SENSORS = ("memtrace", "sched", "nccl")
needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang to rebuild the objects")


def fresh_checkout(tmp_path: Path) -> Path:
    """The build's inputs copied to another path (the build must not depend on where the tree is)."""
    tree = tmp_path / "elsewhere"
    shutil.copytree(REPO / "bpf", tree / "bpf")
    shutil.copytree(REPO / "vmlinux", tree / "vmlinux")
    shutil.copy(REPO / "Makefile", tree)
    return tree


@pytest.mark.slow
@needs_clang
def test_shipped_objects_match_a_rebuild_from_a_fresh_checkout(tmp_path: Path) -> None:
    tree = fresh_checkout(tmp_path)
    out = tree / "out"
    subprocess.run(["make", "-s", "-C", str(tree), f"OUT={out}"], check=True, capture_output=True)
    for sensor in SENSORS:
        for arch in ("x86", "arm64"):
            name = f"{sensor}.{arch}.bpf.o"
            assert (out / name).read_bytes() == (REPO / "memtrace" / "bpf" / name).read_bytes(), f"{name} is stale"


@pytest.mark.slow
@needs_clang
def test_a_header_change_rebuilds_every_object_that_includes_it(tmp_path: Path) -> None:
    tree = fresh_checkout(tmp_path)
    out = tree / "out"
    subprocess.run(["make", "-s", "-C", str(tree), f"OUT={out}"], check=True, capture_output=True)
    now = time.time()
    sources, objects = list((tree / "bpf").iterdir()) + list((tree / "vmlinux").rglob("*")), list(out.iterdir())
    for f in sources:
        os.utime(f, (now - 1000, now - 1000))
    for f in objects:
        os.utime(f, (now - 500, now - 500))
    for header in sorted((tree / "bpf").glob("*.h")):
        os.utime(header, (now - 100, now - 100))  # changed since the build
        for sensor in SENSORS:
            # The compiler's own list of what the source includes.
            deps = subprocess.run(
                ["clang", "-MM", "-target", "bpf", "-D__TARGET_ARCH_x86", "-I", "bpf", "-I", "vmlinux/x86",
                 f"bpf/{sensor}.bpf.c"], cwd=tree, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            if f"bpf/{header.name}" in deps.split():
                obj = f"{out}/{sensor}.x86.bpf.o"
                q = subprocess.run(["make", "-q", "-C", str(tree), f"OUT={out}", obj], capture_output=True)
                assert q.returncode == 1, f"{obj} is not rebuilt when {header.name} changes"
        os.utime(header, (now - 1000, now - 1000))


@pytest.mark.parametrize("arch", ["x86", "arm64"])
def test_objects_carry_btf_and_the_expected_programs(arch: str) -> None:
    path = object_path(arch)
    with open(path, "rb") as f:
        e = ELFFile(f)
        assert e["e_machine"] == "EM_BPF"
        names = {s.name for s in e.iter_sections()}
        assert {".BTF", ".BTF.ext", ".maps", "uprobe", "uretprobe"} <= names
    assert {"filter_pids", "hold_libraries", "agent_tgid"} <= set(rodata_options(path))


def test_arch_objects_differ_where_pt_regs_differ() -> None:
    # The same source built for two arches must not produce one object twice.
    assert object_path("x86").read_bytes() != object_path("arm64").read_bytes()
