"""Function symbols of an ELF file as uprobe file offsets (pyelftools)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection


def _file_offset(segments: list[tuple[int, int, int]], vaddr: int) -> int | None:
    for start, off, size in segments:
        if start <= vaddr < start + size:
            return vaddr - start + off
    return None


def function_offsets(f: BinaryIO, names: Iterable[str]) -> dict[str, int]:
    """Map each defined function among `names` to its file offset.

    Reads .dynsym and .symtab (a statically linked runtime's symbols are
    often only in .symtab). Symbols that alias the same code are all
    returned; the caller must attach once per offset.
    """
    wanted = set(names)
    out: dict[str, int] = {}
    try:
        elf = ELFFile(f)
        segments = [
            (s["p_vaddr"], s["p_offset"], s["p_filesz"])
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1  # executable
        ]
        for secname in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(secname)
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym.name not in wanted or sym.name in out:
                    continue
                if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC"):
                    continue
                if sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"]:
                    continue
                off = _file_offset(segments, sym["st_value"])
                if off is not None:
                    out[sym.name] = off
    except (ELFError, ValueError, OSError):
        return {}
    return out


def code_at(f: BinaryIO, offset: int, n: int) -> bytes:
    """The first `n` bytes of the code at a file offset (b"" past the end)."""
    try:
        f.seek(offset)
        return f.read(n)
    except (OSError, ValueError):
        return b""
