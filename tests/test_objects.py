"""The BPF objects shipped in the package are the ones the sources build,
for the architecture they are named after."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from elftools.elf.elffile import ELFFile

from memtrace.bpf.host import object_path, rodata_options


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang to rebuild the objects")
def test_shipped_objects_match_a_rebuild_from_a_fresh_checkout(tmp_path: Path) -> None:
    # Another path on purpose: the build must not depend on where the tree is.
    tree = tmp_path / "elsewhere"
    shutil.copytree(REPO / "bpf", tree / "bpf")
    shutil.copytree(REPO / "vmlinux", tree / "vmlinux")
    shutil.copy(REPO / "Makefile", tree)
    out = tree / "out"
    subprocess.run(["make", "-s", "-C", str(tree), f"OUT={out}"], check=True, capture_output=True)
    for arch in ("x86", "arm64"):
        built = (out / f"memtrace.{arch}.bpf.o").read_bytes()
        assert built == object_path(arch).read_bytes(), f"memtrace.{arch}.bpf.o is stale: run make"


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
