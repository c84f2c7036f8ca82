"""memtrace/bpf/elf.py reads a library's function offsets as pyelftools
reads them (the reference it replaced): the same names, the same file
offsets, on the test CUDA libraries and on real system libraries; a file
that is not a 64-bit little-endian ELF, or is cut short, gives none."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from memtrace.bpf.elf import function_offsets
from memtrace.core import apis

SYSTEM = [
    Path(p)
    for p in (
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libbpf.so.1",
        "/usr/lib/aarch64-linux-gnu/libbpf.so.1",
    )
]


def reference(path: Path, names: set[str]) -> dict[str, int]:
    """What pyelftools says: functions (IFUNCs too) defined in .dynsym, then
    .symtab, in executable PT_LOAD segments."""
    out: dict[str, int] = {}
    with path.open("rb") as f:
        elf = ELFFile(f)
        segs = [
            (s["p_vaddr"], s["p_offset"], s["p_filesz"])
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
        ]
        for secname in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(secname)
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym.name not in names or sym.name in out:
                    continue
                # pyelftools names STT_GNU_IFUNC (10) STT_LOOS
                if sym["st_info"]["type"] not in ("STT_FUNC", "STT_LOOS") or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                v = sym["st_value"]
                for lo, off, size in segs:
                    if v and lo <= v < lo + size:
                        out[sym.name] = v - lo + off
                        break
    return out


def names_in(path: Path) -> set[str]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        return {
            s.name
            for sec in elf.iter_sections()
            if isinstance(sec, SymbolTableSection)
            for s in sec.iter_symbols()
            if s.name
        }


def test_cuda_libraries_offsets_match_pyelftools(fakecuda: Path) -> None:
    wanted = {s for a in apis.APIS for s in a.symbols} | {"not_a_symbol", "cu"}
    for lib in ("libcuda.so.1", "libcudart.so.13"):
        path = fakecuda / "lib" / lib
        with path.open("rb") as f:
            got = function_offsets(f, wanted)
        want = reference(path, wanted)
        assert got == want, lib
        assert len(got) > 10, lib


@pytest.mark.parametrize("path", [p for p in SYSTEM if p.exists()], ids=lambda p: p.name)
def test_system_libraries_offsets_match_pyelftools(path: Path) -> None:
    # Every name the file holds (functions, objects, versions' aliases), and names it lacks.
    names = names_in(path) | {"memtrace_absent", "m"}
    with path.open("rb") as f:
        got = function_offsets(f, names)
    want = reference(path, names)
    assert got == want
    assert len(got) > 50


def test_what_is_not_a_readable_elf_has_no_offsets(fakecuda: Path) -> None:
    data = (fakecuda / "lib" / "libcuda.so.1").read_bytes()
    names = {"cuMemcpyHtoD_v2"}
    assert function_offsets(io.BytesIO(data), names)  # the whole file: found
    for bad in (data[:64], data[: len(data) // 3], b"", b"\x7fELF" + bytes(60), data[:4] + b"\x01" + data[5:]):
        assert function_offsets(io.BytesIO(bad), names) == {}
