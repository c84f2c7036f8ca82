"""Function symbols of an ELF file as uprobe file offsets.

A process that maps a new CUDA library waits, held, while its symbols are
read here (bench/attach_time.py), so this reads only what it needs: the
ELF header, the program and section headers, then each symbol table and
its strings, decoded as arrays. pyelftools, which decodes every symbol as
an object, took 5-20 ms a file (a real libcudart 20 ms); this takes well
under one. Only 64-bit little-endian files (x86-64, arm64): another is a
file memtrace does not probe, and has no offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import BinaryIO

import numpy as np

# Elf64_Ehdr after e_ident: type, machine, version, entry, phoff, shoff,
# flags, ehsize, phentsize, phnum, shentsize, shnum, shstrndx.
_EHDR = struct.Struct("<HHIQQQIHHHHHH")
_PHDR = np.dtype(
    [
        ("p_type", "<u4"),
        ("p_flags", "<u4"),
        ("p_offset", "<u8"),
        ("p_vaddr", "<u8"),
        ("p_paddr", "<u8"),
        ("p_filesz", "<u8"),
        ("p_memsz", "<u8"),
        ("p_align", "<u8"),
    ]
)
_SHDR = np.dtype(
    [
        ("sh_name", "<u4"),
        ("sh_type", "<u4"),
        ("sh_flags", "<u8"),
        ("sh_addr", "<u8"),
        ("sh_offset", "<u8"),
        ("sh_size", "<u8"),
        ("sh_link", "<u4"),
        ("sh_info", "<u4"),
        ("sh_addralign", "<u8"),
        ("sh_entsize", "<u8"),
    ]
)
_SYM = np.dtype(
    [
        ("st_name", "<u4"),
        ("st_info", "u1"),
        ("st_other", "u1"),
        ("st_shndx", "<u2"),
        ("st_value", "<u8"),
        ("st_size", "<u8"),
    ]
)
PT_LOAD, PF_X = 1, 1
SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
# The symbol tables read, in order: a name found in the first is not looked
# for in the second (a statically linked runtime's symbols are often in
# .symtab alone).
_TABLES = (SHT_DYNSYM, SHT_SYMTAB)
_MAX_TABLE = 256 << 20  # a section this large is not a symbol table worth reading


class _Malformed(Exception):
    pass


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    if size < 0 or size > _MAX_TABLE:
        raise _Malformed
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise _Malformed
    return data


def _table(f: BinaryIO, offset: int, count: int, entsize: int, dtype: np.dtype) -> np.ndarray:
    """`count` entries of `dtype` (their first bytes, where the file's entries are larger)."""
    if entsize < dtype.itemsize:
        raise _Malformed
    raw = np.frombuffer(_read(f, offset, count * entsize), dtype=np.uint8).reshape(count, entsize)
    return np.ascontiguousarray(raw[:, : dtype.itemsize]).view(dtype).reshape(count)


def function_offsets(f: BinaryIO, names: Iterable[str]) -> dict[str, int]:
    """Map each defined function among `names` to its file offset.

    Reads .dynsym and .symtab (a statically linked runtime's symbols are
    often only in .symtab). Symbols that alias the same code are all
    returned; the caller must attach once per offset.
    """
    wanted = {n.encode(): n for n in names}
    out: dict[str, int] = {}
    if not wanted:
        return out
    try:
        ident = _read(f, 0, 16)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:  # ELFCLASS64, ELFDATA2LSB
            return out
        (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _EHDR.unpack(_read(f, 16, _EHDR.size))
        ph = _table(f, phoff, phnum, phentsize, _PHDR)
        code = ph[(ph["p_type"] == PT_LOAD) & ((ph["p_flags"] & PF_X) != 0)]
        sh = _table(f, shoff, shnum, shentsize, _SHDR) if shnum else np.empty(0, _SHDR)
        # Every wanted name is at least `lead` bytes: compare those first, as
        # one integer, and read the whole name only where they match.
        lead = min(8, min(len(n) for n in wanted))
        leads = np.array(sorted({int.from_bytes(n[:lead], "little") for n in wanted}), dtype=np.uint64)
        for kind in _TABLES:
            for sec in sh[sh["sh_type"] == kind]:
                link = int(sec["sh_link"])
                if link >= len(sh):
                    continue
                count = int(sec["sh_size"]) // _SYM.itemsize
                syms = _table(f, int(sec["sh_offset"]), count, max(int(sec["sh_entsize"]), _SYM.itemsize), _SYM)
                strs = _read(f, int(sh[link]["sh_offset"]), int(sh[link]["sh_size"]))
                _lookup(syms, strs, wanted, lead, leads, code, out)
    except (_Malformed, OSError, ValueError, struct.error):
        return {}
    return out


def _lookup(
    syms: np.ndarray,
    strs: bytes,
    wanted: dict[bytes, str],
    lead: int,
    leads: np.ndarray,  # sorted
    code: np.ndarray,
    out: dict[str, int],
) -> None:
    kind = syms["st_info"] & 0xF
    keep = ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (syms["st_shndx"] != 0) & (syms["st_value"] != 0)
    keep &= syms["st_name"].astype(np.int64) + lead <= len(strs)
    syms = syms[keep]
    if not len(syms):
        return
    text = np.frombuffer(strs, dtype=np.uint8)
    at = syms["st_name"].astype(np.int64)
    head = np.zeros(len(syms), dtype=np.uint64)
    for k in range(lead):
        head |= text[at + k].astype(np.uint64) << np.uint64(8 * k)
    # (np.isin would do, but its first call imports numpy.ma: ~10 ms.)
    near = leads[np.minimum(np.searchsorted(leads, head), len(leads) - 1)]
    for i in np.flatnonzero(near == head).tolist():
        start = int(at[i])
        end = strs.find(b"\0", start)
        name = wanted.get(strs[start:end] if end >= 0 else strs[start:])
        if name is None or name in out:
            continue
        vaddr = int(syms["st_value"][i])
        for seg in code:
            lo = int(seg["p_vaddr"])
            if lo <= vaddr < lo + int(seg["p_filesz"]):
                out[name] = vaddr - lo + int(seg["p_offset"])
                break


def code_at(f: BinaryIO, offset: int, n: int) -> bytes:
    """The first `n` bytes of the code at a file offset (b"" past the end)."""
    try:
        f.seek(offset)
        return f.read(n)
    except (OSError, ValueError):
        return b""
