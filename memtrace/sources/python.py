"""CPython interpreters in traced processes: where each keeps its state,
so that BPF can walk the calling thread's frames, and what a frame's code
object says, so that a frame can be named (function, file, line).

An interpreter is found in a process's mappings: the file (the executable,
or libpython when the interpreter is built shared) that defines
`_PyRuntime`. Its version is `Py_Version` (3.11+) or its file name (3.10).
The offsets BPF needs are per minor version, measured against each
version's own headers (tests/test_stacks.py checks them with offsetof());
for 3.13 they are read from the interpreter's own `_Py_DebugOffsets`, at
the start of `_PyRuntime`. A version not in the table gets no Python
frames, and says so: never frames read with another version's layout.

What a code object says (name, file, first line, line table) comes from
BPF, which keeps it when a stack naming it is first taken (`Interpreter.
keep`), or else from the process's memory (/proc/PID/mem) while it lives;
it is kept by address for the process's life. A code object whose type is
not `PyCode_Type` is not named (counted): an address is never guessed at.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import struct
from dataclasses import dataclass, field, fields, replace

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from memtrace.core import abi
from memtrace.core.ids import ProcessKey
from memtrace.core.stacks import PythonFrame
from memtrace.sources.symbols import load_segments

log = logging.getLogger("memtrace")

NONE = abi.PY_NONE
_NAME = re.compile(r"^(?:lib)?python(\d)\.(\d+)")
MAX_CODES = 65536  # code objects named per process; past that, frames are named but not kept
MAX_STRING = 4096  # characters read of a function or file name


@dataclass(frozen=True)
class Layout:
    """Where one CPython minor version keeps what the frame walk and the
    naming read (byte offsets; NONE: the version has no such field)."""

    interpreters_head: int
    interp_threads: int
    tstate_next: int
    tstate_prev: int
    tstate_id: int  # native_thread_id (3.11+) or thread_id (3.10: pthread_self)
    tstate_frame: int  # the current frame, or the _PyCFrame holding it
    cframe_frame: int  # _PyCFrame.current_frame (3.11, 3.12)
    frame_previous: int
    frame_code: int
    frame_instr: int
    frame_owner: int
    frame_is_entry: int
    instr_size: int  # 4: 3.10's f_lasti (an instruction index); 8: a pointer to the instruction
    owner_cstack: int  # FRAME_OWNED_BY_CSTACK (3.12+)
    code_name: int
    code_qualname: int
    code_filename: int
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int  # co_code_adaptive: the instructions (3.11+)
    ascii_size: int  # sizeof(PyASCIIObject): an ASCII string's characters follow it
    compact_size: int  # sizeof(PyCompactUnicodeObject)
    match: abi.PyMatch = abi.PyMatch.NATIVE_TID
    location_table: bool = True  # 3.11+'s co_linetable format (3.10: (offset, line) delta pairs)
    every_frame_entry: bool = False  # 3.10: one C evaluation per frame
    data_stack: bool = True  # 3.11+: a thread's frames lie on its own stack, each caller's below (3.10: on the heap)

    @property
    def tstate_size(self) -> int:
        """The bytes of a thread state that hold every field BPF checks a
        remembered one by (its id, its neighbour, its frame): one read."""
        return max(self.tstate_prev, self.tstate_id, self.tstate_frame) + 8

    @property
    def frame_size(self) -> int:
        """The bytes of a frame that hold every field BPF reads of it (one read a frame)."""
        ends = [self.frame_previous + 8, self.frame_code + 8, self.frame_instr + self.instr_size]
        ends += [off + 1 for off in (self.frame_owner, self.frame_is_entry) if off != NONE]
        return max(ends)


# Measured with offsetof() against each version's headers (x86-64 and
# arm64 alike: LP64, no field depends on the architecture).
LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 10): Layout(
        interpreters_head=32,
        interp_threads=8,
        tstate_next=8,
        tstate_prev=0,
        tstate_id=176,
        tstate_frame=24,
        cframe_frame=NONE,
        frame_previous=24,
        frame_code=32,
        frame_instr=96,
        frame_owner=NONE,
        frame_is_entry=NONE,
        instr_size=4,
        owner_cstack=0,
        code_name=112,
        code_qualname=NONE,
        code_filename=104,
        code_firstlineno=40,
        code_linetable=120,
        code_adaptive=NONE,
        ascii_size=48,
        compact_size=72,
        match=abi.PyMatch.PTHREAD,
        location_table=False,
        every_frame_entry=True,
        data_stack=False,
    ),  # fmt: skip
    (3, 11): Layout(
        interpreters_head=40,
        interp_threads=16,
        tstate_next=8,
        tstate_prev=0,
        tstate_id=160,
        tstate_frame=56,
        cframe_frame=8,
        frame_previous=48,
        frame_code=32,
        frame_instr=56,
        frame_owner=NONE,
        frame_is_entry=68,
        instr_size=8,
        owner_cstack=0,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=72,
        code_linetable=136,
        code_adaptive=184,
        ascii_size=48,
        compact_size=72,
    ),  # fmt: skip
    (3, 12): Layout(
        interpreters_head=40,
        interp_threads=72,
        tstate_next=8,
        tstate_prev=0,
        tstate_id=144,
        tstate_frame=56,
        cframe_frame=0,
        frame_previous=8,
        frame_code=0,
        frame_instr=56,
        frame_owner=70,
        frame_is_entry=NONE,
        instr_size=8,
        owner_cstack=3,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        code_adaptive=192,
        ascii_size=40,
        compact_size=56,
    ),  # fmt: skip
    # 3.13: these are checked against, and replaced by, the interpreter's own _Py_DebugOffsets.
    (3, 13): Layout(
        interpreters_head=632,
        interp_threads=7344,
        tstate_next=8,
        tstate_prev=0,
        tstate_id=160,
        tstate_frame=72,
        cframe_frame=NONE,
        frame_previous=8,
        frame_code=0,
        frame_instr=56,
        frame_owner=70,
        frame_is_entry=NONE,
        instr_size=8,
        owner_cstack=3,
        code_name=120,
        code_qualname=128,
        code_filename=112,
        code_firstlineno=68,
        code_linetable=136,
        code_adaptive=200,
        ascii_size=40,
        compact_size=56,
    ),  # fmt: skip
}

# _Py_DebugOffsets (3.13): the byte positions of the uint64 fields read here.
_DEBUG_COOKIE = b"xdebugpy"
_DEBUG_FIELDS = {
    "version": 8,
    "free_threaded": 16,
    "interpreters_head": 40,
    "interp_threads": 72,
    "tstate_prev": 160,
    "tstate_next": 168,
    "tstate_frame": 184,
    "tstate_id": 200,  # native_thread_id
    "frame_previous": 232,
    "frame_code": 240,  # executable
    "frame_instr": 248,  # instr_ptr
    "frame_owner": 264,
    "code_filename": 280,
    "code_name": 288,
    "code_qualname": 296,
    "code_linetable": 304,
    "code_firstlineno": 312,
    "code_adaptive": 344,
}
_DEBUG_SIZE = 352


class Unsupported(Exception):
    """A CPython memtrace cannot walk: its frames are not taken, and the
    stacks of its process say why."""


@dataclass
class Interpreter:
    """One process's interpreter: its version, where its state is, and the
    code objects of its frames named so far."""

    key: ProcessKey
    version: tuple[int, int]
    runtime: int  # the address of _PyRuntime
    code_type: int  # the address of PyCode_Type
    layout: Layout
    codes: dict[int, _Code | None] = field(default_factory=dict)
    ready: bool = True  # its layout is known: BPF can walk it

    @property
    def label(self) -> str:
        return "CPython {}.{}".format(*self.version)

    def config(self) -> abi.PyProc:
        """What BPF needs to walk this interpreter's frames (struct mt_py_proc)."""
        lay = self.layout
        c = abi.PyProc()
        c.start_ns, c.runtime = self.key.start_ns, self.runtime
        for f in (
            "interpreters_head", "interp_threads", "tstate_next", "tstate_prev", "tstate_id", "tstate_frame",
            "cframe_frame", "frame_previous", "frame_code", "frame_instr", "frame_owner", "frame_is_entry",
        ):  # fmt: skip
            setattr(c, f, getattr(lay, f))
        c.code_name = lay.code_qualname if lay.code_qualname != NONE else lay.code_name
        c.code_filename, c.code_firstlineno, c.code_linetable = (
            lay.code_filename,
            lay.code_firstlineno,
            lay.code_linetable,
        )
        c.ascii_size, c.compact_size = lay.ascii_size, lay.compact_size
        c.match, c.instr_size, c.owner_cstack = lay.match, lay.instr_size, lay.owner_cstack
        c.frame_size = lay.frame_size
        c.frames_window = lay.data_stack
        c.tstate_size = lay.tstate_size
        return c

    def keep(self, code_addr: int, raw: abi.PyCode) -> None:
        """What BPF read of a code object when a new stack naming it was
        taken (the process may be gone by now). It replaces what was known
        at that address (a code object freed and another made there names
        the new stacks, not the old one), unless that says the same with a
        whole line table."""
        code = _from_kernel(raw, self.code_type)
        if code is None:
            return
        old = self.codes.get(code_addr)
        if (
            old is not None
            and old.complete
            and (old.name, old.firstlineno) == (code.name, code.firstlineno)
            and old.filename.endswith(code.filename.removeprefix("..."))
            and old.linetable.startswith(code.linetable)
        ):
            return
        if old is not None or len(self.codes) < MAX_CODES:
            self.codes[code_addr] = code


@dataclass(frozen=True)
class _Code:
    name: str
    filename: str
    firstlineno: int
    linetable: bytes
    complete: bool = True  # the whole line table (BPF keeps its first PY_TABLE_LEN bytes)


def _decode(data: bytes, kind: int) -> str:
    return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")


def _from_kernel(raw: abi.PyCode, code_type: int) -> _Code | None:
    """A code object as BPF read it, or None if it was not one (or its names were unreadable)."""
    if raw.type != code_type or raw.name_kind not in (1, 2, 4) or raw.file_kind not in (1, 2, 4):
        return None
    name_n = min(raw.name_size, abi.PY_NAME_LEN)
    file_n = min(raw.file_size, abi.PY_FILE_LEN)
    name = _decode(bytes(raw.name[:name_n]), raw.name_kind)  # its start
    filename = _decode(bytes(raw.file[:file_n]), raw.file_kind)  # its end
    if raw.file_size > file_n:
        filename = "..." + filename
    table_n = min(raw.table_size, abi.PY_TABLE_LEN)
    return _Code(name, filename, raw.firstlineno, bytes(raw.table[:table_n]), raw.table_size <= table_n)


# ---- finding the interpreter ----


def _elf_facts(fd: int, names: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[int, int, int]]]:
    """The values of these symbols (any type) in an ELF file, by name, and
    its PT_LOAD segments, from one read of the file."""
    out: dict[str, int] = {}
    with os.fdopen(os.dup(fd), "rb") as f:
        try:
            elf = ELFFile(f)
            for secname in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(secname)
                if not isinstance(sec, SymbolTableSection):
                    continue
                for name in names:
                    if name in out:
                        continue
                    for sym in sec.get_symbol_by_name(name) or []:
                        if sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                            out[name] = int(sym["st_value"])
                            break
            return out, load_segments(elf) if out else []
        except (ELFError, ValueError, OSError, KeyError) as e:
            log.debug("no symbols from fd %d: %s", fd, e)
    return out, []


def _file_word(fd: int, segments: list[tuple[int, int, int]], vaddr: int) -> int | None:
    """A 4-byte word of a file at a virtual address (an initialised constant)."""
    for off, va, size in segments:
        if va <= vaddr < va + size:
            data = os.pread(fd, 4, off + vaddr - va)
            return struct.unpack("<I", data)[0] if len(data) == 4 else None
    return None


@dataclass(frozen=True)
class Candidate:
    """A file mapped executable by a process, that may hold an interpreter."""

    name: str  # its path as the process saw it
    fd: int  # the file, open
    start: int  # the mapping's address
    pgoff: int  # the file offset mapped there


def find(key: ProcessKey, files: list[Candidate], machine: str | None = None) -> Interpreter | None:
    """The interpreter a process runs, from the files it maps executable;
    None if none of them is CPython's. Raises Unsupported for a CPython
    whose frames memtrace cannot walk (the message says which)."""
    machine = machine or platform.machine()
    for c in sorted(files, key=lambda c: not os.path.basename(c.name).startswith("lib")):
        m = _NAME.match(os.path.basename(c.name))
        if m is None:
            continue
        syms, segs = _elf_facts(c.fd, ("_PyRuntime", "Py_Version", "PyCode_Type"))
        if "_PyRuntime" not in syms or "PyCode_Type" not in syms:
            continue  # the executable of a shared build: libpython holds the interpreter
        version = (int(m.group(1)), int(m.group(2)))
        if "Py_Version" in syms:
            hexv = _file_word(c.fd, segs, syms["Py_Version"])
            if hexv:
                version = (hexv >> 24, (hexv >> 16) & 0xFF)
        bias = _bias(segs, c.start, c.pgoff)
        if bias is None:
            continue
        lay = LAYOUTS.get(version)
        label = "CPython {}.{}".format(*version)
        if lay is None:
            raise Unsupported(f"{label}: memtrace walks the frames of CPython 3.10 to 3.13")
        if lay.match is abi.PyMatch.PTHREAD and machine not in ("x86_64", "amd64"):
            raise Unsupported(f"{label} on {machine}: its threads are found by pthread_t, read on x86-64 only")
        interp = Interpreter(key, version, syms["_PyRuntime"] + bias, syms["PyCode_Type"] + bias, lay)
        if version >= (3, 13):
            try:
                interp.layout = _debug_offsets(key.pid, interp)
            except OSError as e:
                log.debug("%s", e)
                interp.ready = False  # a Python process, gone before it could be walked
        lay = interp.layout
        if (
            lay.frame_size > abi.PY_FRAME_READ
            or lay.tstate_size > abi.PY_TSTATE_READ
            or any(NONE < getattr(lay, f.name) for f in fields(Layout) if f.type == "int")
        ):  # offsets BPF keeps in 16 bits
            raise Unsupported(f"{label}: its frames are laid out past what memtrace reads")
        return interp
    return None


def _bias(segs: list[tuple[int, int, int]], start: int, pgoff: int) -> int | None:
    """Where a file is loaded: address minus virtual address, from one of its mappings."""
    for off, va, size in segs:
        if off - (off % 4096) <= pgoff < off + max(size, 1):
            return start - pgoff - (va - off)
    return None


def _debug_offsets(pid: int, interp: Interpreter) -> Layout:
    """3.13's own description of its layout (_Py_DebugOffsets, at the start
    of _PyRuntime): the offsets BPF and the naming use, taken from it."""
    mem = _Mem(pid)
    try:
        raw = mem.read(interp.runtime, _DEBUG_SIZE)
    finally:
        mem.close()
    if raw is None:
        raise OSError(f"pid {pid}: {interp.label}'s _Py_DebugOffsets could not be read (gone?)")
    if raw[:8] != _DEBUG_COOKIE:
        raise Unsupported(f"{interp.label}: no _Py_DebugOffsets where _PyRuntime begins")
    v = {k: struct.unpack_from("<Q", raw, at)[0] for k, at in _DEBUG_FIELDS.items()}
    if (v["version"] >> 24, (v["version"] >> 16) & 0xFF) != interp.version:
        raise Unsupported(f"{interp.label}: its _Py_DebugOffsets are of another version ({v['version']:#x})")
    if v["free_threaded"]:
        raise Unsupported(f"{interp.label}, free-threaded: not walked yet")
    lay = interp.layout
    for k, x in v.items():
        if k not in ("version", "free_threaded"):
            lay = replace(lay, **{k: int(x)})  # type: ignore[arg-type]  # every field named here is an offset
    return lay


# ---- reading code objects ----


class _Mem:
    """A process's memory, open for a run of reads."""

    def __init__(self, pid: int) -> None:
        try:
            self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1

    def read(self, addr: int, size: int) -> bytes | None:
        if self.fd < 0 or addr <= 0:
            return None
        try:
            data = os.pread(self.fd, size, addr)
        except OSError:
            return None
        return data if len(data) == size else None

    def word(self, addr: int) -> int | None:
        data = self.read(addr, 8)
        return struct.unpack("<Q", data)[0] if data else None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _string(mem: _Mem, addr: int, lay: Layout) -> str | None:
    """A str object's text (compact strings: every str a code object names)."""
    head = mem.read(addr, lay.compact_size)
    if head is None:
        return None
    length = struct.unpack_from("<q", head, 16)[0]
    state = struct.unpack_from("<I", head, 32)[0]
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or length < 0 or kind not in (1, 2, 4):
        return None
    length = min(length, MAX_STRING)
    if ascii_:
        data = mem.read(addr + lay.ascii_size, length)
        return data.decode("ascii", "replace") if data is not None else None
    data = mem.read(addr + lay.compact_size, length * kind)
    return _decode(data, kind) if data is not None else None


def _bytes(mem: _Mem, addr: int, limit: int = 1 << 20) -> bytes | None:
    """A bytes object's contents (ob_size at 16, ob_sval at 32 in every version)."""
    n = mem.word(addr + 16)
    if n is None or n < 0 or n > limit:
        return None
    return mem.read(addr + 32, n) if n else b""


def _read_code(mem: _Mem, interp: Interpreter, addr: int) -> _Code | None:
    lay = interp.layout
    if mem.word(addr + 8) != interp.code_type:  # ob_type: not a code object
        return None
    name_at = lay.code_qualname if lay.code_qualname != NONE else lay.code_name
    name_ptr, file_ptr = mem.word(addr + name_at), mem.word(addr + lay.code_filename)
    table_ptr, first = mem.word(addr + lay.code_linetable), mem.read(addr + lay.code_firstlineno, 4)
    if name_ptr is None or file_ptr is None or table_ptr is None or first is None:
        return None
    name, filename, table = _string(mem, name_ptr, lay), _string(mem, file_ptr, lay), _bytes(mem, table_ptr)
    if name is None or filename is None or table is None:
        return None
    return _Code(name, filename, struct.unpack("<i", first)[0], table)


def name_frames(interp: Interpreter, frames: list[tuple[int, int]]) -> list[PythonFrame | None]:
    """Name (code object, where in it) frames of a live process: None for a
    frame whose code object could not be read."""
    mem: _Mem | None = None
    out: list[PythonFrame | None] = []
    try:
        for code_addr, instr in frames:
            if code_addr not in interp.codes:
                if mem is None:
                    mem = _Mem(interp.key.pid)
                code = _read_code(mem, interp, code_addr)
                if len(interp.codes) < MAX_CODES or code is None:
                    interp.codes[code_addr] = code
            else:
                code = interp.codes[code_addr]
            if code is None:
                out.append(None)
                continue
            out.append(PythonFrame(code.name, code.filename, frame_line(interp, code_addr, code, instr)))
    finally:
        if mem is not None:
            mem.close()
    return out


def frame_line(interp: Interpreter, code_addr: int, code: _Code, instr: int) -> int | None:
    """The line a frame is executing, from where BPF found it."""
    lay = interp.layout
    instr &= ~abi.PY_ENTRY
    if lay.instr_size == 4:  # 3.10: f_lasti, an instruction index (-1 before the first)
        lasti = struct.unpack("<i", struct.pack("<I", instr & 0xFFFFFFFF))[0]
        if lasti < 0:
            return code.firstlineno
        offset = lasti * 2
    else:
        offset = instr - (code_addr + lay.code_adaptive)
        if offset < 0:
            return code.firstlineno
    line = _line(lay, code, offset)
    if line is None and not code.complete:
        # Past the start BPF kept: the whole table, if the process still runs.
        mem = _Mem(interp.key.pid)
        try:
            full = _read_code(mem, interp, code_addr)
        finally:
            mem.close()
        if full is not None:
            interp.codes[code_addr] = full
            line = _line(lay, full, offset)
    return line


def _line(lay: Layout, code: _Code, offset: int) -> int | None:
    if lay.location_table:
        return line_of_location_table(code.linetable, code.firstlineno, offset)
    return line_of_line_table(code.linetable, code.firstlineno, offset)


def line_of_line_table(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.10's co_linetable (Objects/lnotab_notes.txt): (bytecode delta,
    line delta) byte pairs; a line delta of -128 means no line."""
    line, start = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        end = start + table[i]
        ldelta = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        cur: int | None = None
        if ldelta != -128:
            line += ldelta
            cur = line
        if start <= offset < end:
            return cur
        start = end
    return None


def _varint(t: bytes, i: int) -> tuple[int, int]:
    b = t[i]
    i += 1
    val, shift = b & 63, 0
    while b & 64:
        b = t[i]
        i += 1
        shift += 6
        val |= (b & 63) << shift
    return val, i


def _svarint(t: bytes, i: int) -> tuple[int, int]:
    u, i = _varint(t, i)
    return (-(u >> 1) if u & 1 else u >> 1), i


def line_of_location_table(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.11+'s co_linetable (Objects/locations.md): entries of one to eight
    code units, each with a line delta (or no line at all)."""
    line, start, i = firstlineno, 0, 0
    try:
        while i < len(table):
            b = table[i]
            i += 1
            code, end = (b >> 3) & 15, start + ((b & 7) + 1) * 2
            delta: int | None
            if code == 15:  # no location
                delta = None
            elif code == 14:  # long form: line delta, end line delta, column, end column
                delta, i = _svarint(table, i)
                for _ in range(3):
                    _, i = _varint(table, i)
            elif code == 13:  # no column
                delta, i = _svarint(table, i)
            elif code >= 10:  # one line, columns in two bytes
                delta, i = code - 10, i + 2
            else:  # short form: same line, a column byte
                delta, i = 0, i + 1
            cur: int | None = None
            if delta is not None:
                line += delta
                cur = line
            if start <= offset < end:
                return cur
            start = end
    except IndexError:
        return None
    return None
