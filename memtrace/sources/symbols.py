"""Naming native frames: the files processes map, and the functions there.

A process's executable mappings are read from /proc/PID/maps while it runs,
and each file is opened through /proc/PID/map_files and kept open, so its
frames can be named after the process is gone and inside containers (the
descriptor is the file, whatever the mount namespace). Files are known by
inode, read once; each frame carries its file's build id, for symbolizing
elsewhere.

Function names come from the ELF symbol tables (.symtab and .dynsym,
through pyelftools), loaded once per file, when first asked for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from elftools.elf.segments import NoteSegment

from memtrace.core.procfiles import map_files_path

log = logging.getLogger("memtrace")

# Names the compiler gives a function's clones and split parts (load_batch.constprop.0,
# step.part.0, f.cold): the function the user wrote is the name before them.
_CLONE = re.compile(r"(?:\.(?:constprop|isra|part|cold|lto_priv|localalias|llvm)(?:\.\d+)?)+$")


def source_name(symbol: str) -> str:
    return _CLONE.sub("", symbol) or symbol


@functools.cache
def _cxa_demangle() -> tuple[Callable[..., int], Callable[[int], None]] | None:
    """libstdc++'s own demangler (the one c++filt and gdb use), and free();
    None where the host has no libstdc++."""
    try:
        cxx = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    f = cxx.__cxa_demangle
    f.restype = ctypes.c_void_p
    f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    free = libc.free
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return f, free


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """A C++ symbol as its source names it (at::native::copy_(at::Tensor&,
    at::Tensor const&, bool)); any other name, or one the demangler refuses,
    as it is."""
    if not name.startswith("_Z"):
        return name
    api = _cxa_demangle()
    if api is None:
        return name
    f, free = api
    status = ctypes.c_int(-1)
    p = f(name.encode(), None, None, ctypes.byref(status))
    if not p:
        return name
    try:
        return ctypes.string_at(p).decode("utf-8", "replace") if status.value == 0 else name
    finally:
        free(p)


def load_segments(elf: ELFFile) -> list[tuple[int, int, int]]:
    """(file offset, vaddr, file size) of each PT_LOAD segment."""
    return [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]


_STT_FUNC, _STT_GNU_IFUNC = 2, 10


def _sym_dtype(elfclass: int, little: bool) -> np.dtype:
    """Elf32_Sym / Elf64_Sym."""
    e = "<" if little else ">"
    if elfclass == 64:
        fields = [
            ("name", e + "u4"),
            ("info", "u1"),
            ("other", "u1"),
            ("shndx", e + "u2"),
            ("value", e + "u8"),
            ("size", e + "u8"),
        ]
    else:
        fields = [
            ("name", e + "u4"),
            ("value", e + "u4"),
            ("size", e + "u4"),
            ("info", "u1"),
            ("other", "u1"),
            ("shndx", e + "u2"),
        ]
    return np.dtype(fields)


class ElfSymbols:
    """One file's function symbols, looked up by file offset.

    The symbol tables are read as arrays (a PyTorch library holds about a
    million symbols, too many to walk one by one: docs/design/evidence.md#symbols)
    and a name is read from the file's string
    table only when a frame asks for it."""

    def __init__(self, module: Module) -> None:
        self.module = module  # names are read through its descriptor, while it is open
        fd = module.fd
        self.starts = np.zeros(0, np.uint64)
        self.ends = np.zeros(0, np.uint64)
        self.name_at = np.zeros(0, np.uint64)  # file offset of each symbol's name
        self.segments: list[tuple[int, int, int]] = []  # (file offset, vaddr, size) of each PT_LOAD
        if fd < 0:  # let go (Modules.MAX_FILES): no names, never another file's
            return
        with os.fdopen(os.dup(fd), "rb") as f:
            try:
                self._load(ELFFile(f))
            except (ELFError, ValueError, OSError, KeyError) as e:
                log.debug("no symbols from fd %d: %s", fd, e)

    def _load(self, elf: ELFFile) -> None:
        self.segments = load_segments(elf)
        dt = _sym_dtype(elf.elfclass, elf.little_endian)
        parts = []
        for secname in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(secname)
            if not isinstance(sec, SymbolTableSection) or sec["sh_entsize"] != dt.itemsize:
                continue
            strtab = elf.get_section(sec["sh_link"])
            raw = os.pread(self.module.fd, sec["sh_size"], sec["sh_offset"])
            syms = np.frombuffer(raw, dt, len(raw) // dt.itemsize)
            kind = syms["info"] & 0xF
            keep = (
                ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC))
                & (syms["shndx"] != 0)
                & (syms["value"] != 0)
                & (syms["name"] != 0)
            )
            syms = syms[keep]
            parts.append(
                (
                    syms["value"].astype(np.uint64),
                    syms["size"].astype(np.uint64),
                    syms["name"].astype(np.uint64) + np.uint64(strtab["sh_offset"]),
                )
            )
        if not parts:
            return
        value, size, name = (np.concatenate(x) for x in zip(*parts, strict=True))
        # One symbol an address: the first seen (.symtab before .dynsym), unless
        # only a later one has a size. Stable sort by (address, sized first, order).
        order = np.lexsort((np.arange(len(value)), size == 0, value))
        value, size, name = value[order], size[order], name[order]
        first = np.ones(len(value), bool)
        first[1:] = value[1:] != value[:-1]
        value, size, name = value[first], size[first], name[first]
        self.starts = value
        self.ends = value + np.maximum(size, np.uint64(1))
        self.name_at = name

    def vaddr(self, offset: int) -> int | None:
        for off, vaddr, size in self.segments:
            if off <= offset < off + size:
                return offset - off + vaddr
        return None

    def _name(self, at: int) -> str | None:
        fd = self.module.fd
        if fd < 0:  # let go: its number may be another file's now
            return None
        raw = b""
        while b"\0" not in raw:
            chunk = os.pread(fd, 256, at + len(raw))
            if not chunk:
                break
            raw += chunk
            if len(raw) > 65536:
                break
        return source_name(raw.split(b"\0", 1)[0].decode("utf-8", "replace")) or None

    def function_at(self, offset: int) -> str | None:
        """The function holding the code at this file offset, or None."""
        v = self.vaddr(offset)
        if v is None:
            return None
        i = int(np.searchsorted(self.starts, np.uint64(v), side="right")) - 1
        if i < 0 or v >= int(self.ends[i]):
            return None
        try:
            name = self._name(int(self.name_at[i]))
        except OSError:
            return None
        return demangle(name) if name else None


def build_id_of(fd: int) -> str:
    """The GNU build id of an ELF file, in hex; "" if it has none (or the
    file is let go). Read from the PT_NOTE segments: a file that is mapped
    has them, whatever sections were stripped."""
    if fd < 0:
        return ""
    with os.fdopen(os.dup(fd), "rb") as f:
        try:
            elf = ELFFile(f)
            for seg in elf.iter_segments():
                if not isinstance(seg, NoteSegment):
                    continue
                for note in seg.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return str(note["n_desc"])
        except (ELFError, ValueError, OSError, KeyError):
            return ""
    return ""


@dataclass
class Module:
    name: str  # the path as the process saw it
    fd: int  # the file, kept open (-1 once let go)
    symbols: ElfSymbols | None = None
    build_id: str | None = None  # read when first asked for


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    pgoff: int
    module: Module


class Modules:
    """The files processes map, by inode (each opened and read once)."""

    MAX_FILES = 1024  # files kept open; the least recently used is let go beyond

    def __init__(self) -> None:
        self._by_inode: OrderedDict[tuple[int, int], Module] = OrderedDict()

    def close(self) -> None:
        for m in self._by_inode.values():
            self._let_go(m)
        self._by_inode.clear()

    @staticmethod
    def _let_go(m: Module) -> None:
        """Close a file; a mapping still naming it gets no names from it (its
        descriptor's number may be another file's by then)."""
        if m.fd >= 0:
            os.close(m.fd)
            m.fd = -1

    def _module(self, key: tuple[int, int], path: str, name: str) -> Module | None:
        m = self._by_inode.get(key)
        if m is not None:
            self._by_inode.move_to_end(key)
            return m
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # its frames stay unplaced (counted by the stack table)
        m = Module(name, fd)
        self._by_inode[key] = m
        while len(self._by_inode) > self.MAX_FILES:
            _, old = self._by_inode.popitem(last=False)
            self._let_go(old)
        return m

    def learn(self, pid: int) -> list[Mapping]:
        """Every executable file mapping of a live process (none if it is gone)."""
        out: list[Mapping] = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 5 or "x" not in parts[1]:
                continue
            if len(parts) == 5 or not parts[5].startswith("/"):
                # Code in no file (a JIT's, a trampoline, [vdso]): placed, never named.
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append(Mapping(lo, hi, 0, Module(parts[5] if len(parts) == 6 else "[anon]", -1)))
                continue
            rng, _perms, off, dev, ino, name = parts
            name = name.removesuffix(" (deleted)")
            major, minor = (int(x, 16) for x in dev.split(":"))
            m = self._module((os.makedev(major, minor), int(ino)), map_files_path(pid, rng), name)
            if m is None:
                continue
            lo, hi = (int(x, 16) for x in rng.split("-"))
            out.append(Mapping(lo, hi, int(off, 16), m))
        return out

    def build_id(self, m: Module) -> str:
        """The file's build id, read once ("" once the file is let go)."""
        if m.build_id is None:
            m.build_id = build_id_of(m.fd)
        return m.build_id

    def symbols(self, m: Module) -> ElfSymbols:
        """The file's function symbols, read once (none once the file is let go)."""
        if m.symbols is None:
            m.symbols = ElfSymbols(m)
        return m.symbols
