"""A ctypes binding to the system libbpf (1.1 or newer).

Only what memtrace needs: open and load an object with its read-only
options set, attach uprobes with cookies and auto-attach the tracepoints,
drain ring buffers, read and write maps. Every failure is a MemtraceError
that says how to fix it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from memtrace.core.errors import AttachError, BadOption, LibbpfMissing, LibbpfTooOld, LoadError, NotPrivileged

log = logging.getLogger("memtrace.libbpf")

MIN_VERSION = (1, 1)

_c_void_p = ctypes.c_void_p
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
RING_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _UprobeOpts(ctypes.Structure):
    # struct bpf_uprobe_opts as of libbpf 1.1; `sz` tells newer libbpf which
    # fields we know, so the same layout works with later versions.
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ref_ctr_offset", ctypes.c_size_t),
        ("bpf_cookie", ctypes.c_uint64),
        ("retprobe", ctypes.c_bool),
        ("func_name", ctypes.c_char_p),
    ]


class _BtfType(ctypes.Structure):
    # struct btf_type (uapi linux/btf.h): the kind and vlen are packed in
    # `info`; a DATASEC's `size` is followed by vlen btf_var_secinfo, an
    # INT's by one u32 of encoding bits.
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _BtfVarSecinfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32)]


BTF_KIND_INT, BTF_KIND_ENUM, BTF_KIND_DATASEC, BTF_KIND_ENUM64 = 1, 6, 15, 19
BTF_INT_SIGNED, BTF_INT_BOOL = 1 << 0, 1 << 2


@dataclass(frozen=True)
class RodataVar:
    """One `const volatile` option: where it lies in .rodata and what it holds."""

    name: str
    offset: int
    size: int  # bytes: 1, 2, 4 or 8
    signed: bool = False
    boolean: bool = False

    def encode(self, value: int | bool) -> bytes:
        """The option's bytes (little-endian, as on every arch we ship), or
        BadOption for a value its type cannot hold: never a truncation."""
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            raise BadOption(f"option {self.name} takes an integer, not {value!r}")
        if self.boolean:
            lo, hi = 0, 1
        elif self.signed:
            lo, hi = -(1 << (8 * self.size - 1)), (1 << (8 * self.size - 1)) - 1
        else:
            lo, hi = 0, (1 << (8 * self.size)) - 1
        if not lo <= value <= hi:
            raise BadOption(
                f"option {self.name} = {value} does not fit its {self.size}-byte "
                f"{'bool' if self.boolean else 'signed' if self.signed else 'unsigned'} type ({lo}..{hi})",
                "give a value within the range",
            )
        return value.to_bytes(self.size, "little", signed=self.signed)


def _find_library() -> str:
    env = os.environ.get("MEMTRACE_LIBBPF")
    if env:
        return env
    return ctypes.util.find_library("bpf") or "libbpf.so.1"


class Libbpf:
    """The loaded shared library with typed signatures."""

    _instance: Libbpf | None = None

    def __init__(self, path: str | None = None) -> None:
        name = path or _find_library()
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as e:
            raise LibbpfMissing(str(e)) from None
        self.lib = lib
        self.path = name
        try:
            self.version = (int(lib.libbpf_major_version()), int(lib.libbpf_minor_version()))
        except AttributeError:
            raise LibbpfTooOld("< 0.7") from None
        if self.version < MIN_VERSION:
            raise LibbpfTooOld(f"{self.version[0]}.{self.version[1]}")
        self._declare()
        self.messages: deque[str] = deque(maxlen=400)
        self._libc = ctypes.CDLL(None)
        self._print_cb = _PRINT_FN(self._on_print)
        lib.libbpf_set_print(self._print_cb)

    @classmethod
    def get(cls) -> Libbpf:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _declare(self) -> None:
        L = self.lib
        sigs: dict[str, tuple[object, list[object]]] = {
            "libbpf_set_print": (_c_void_p, [_PRINT_FN]),
            "bpf_object__open_file": (_c_void_p, [ctypes.c_char_p, _c_void_p]),
            "bpf_object__load": (ctypes.c_int, [_c_void_p]),
            "bpf_object__close": (None, [_c_void_p]),
            "bpf_object__find_program_by_name": (_c_void_p, [_c_void_p, ctypes.c_char_p]),
            "bpf_object__find_map_by_name": (_c_void_p, [_c_void_p, ctypes.c_char_p]),
            "bpf_object__next_program": (_c_void_p, [_c_void_p, _c_void_p]),
            "bpf_program__name": (ctypes.c_char_p, [_c_void_p]),
            "bpf_program__set_autoload": (ctypes.c_int, [_c_void_p, ctypes.c_bool]),
            "bpf_program__attach": (_c_void_p, [_c_void_p]),
            "bpf_program__attach_uprobe_opts": (
                _c_void_p,
                [_c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_UprobeOpts)],
            ),
            "bpf_link__destroy": (ctypes.c_int, [_c_void_p]),
            "bpf_program__fd": (ctypes.c_int, [_c_void_p]),
            "bpf_program__set_expected_attach_type": (ctypes.c_int, [_c_void_p, ctypes.c_int]),
            "bpf_map__fd": (ctypes.c_int, [_c_void_p]),
            "bpf_map__initial_value": (_c_void_p, [_c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
            "bpf_map__set_max_entries": (ctypes.c_int, [_c_void_p, ctypes.c_uint32]),
            "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, _c_void_p, _c_void_p]),
            "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, _c_void_p, _c_void_p, ctypes.c_uint64]),
            "bpf_map_delete_elem": (ctypes.c_int, [ctypes.c_int, _c_void_p]),
            "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, _c_void_p, _c_void_p]),
            "ring_buffer__new": (_c_void_p, [ctypes.c_int, RING_SAMPLE_FN, _c_void_p, _c_void_p]),
            "ring_buffer__add": (ctypes.c_int, [_c_void_p, ctypes.c_int, RING_SAMPLE_FN, _c_void_p]),
            "ring_buffer__consume": (ctypes.c_int, [_c_void_p]),
            "ring_buffer__poll": (ctypes.c_int, [_c_void_p, ctypes.c_int]),
            "ring_buffer__epoll_fd": (ctypes.c_int, [_c_void_p]),
            "bpf_map_get_next_id": (ctypes.c_int, [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]),
            "bpf_map_get_fd_by_id": (ctypes.c_int, [ctypes.c_uint32]),
            "bpf_obj_get_info_by_fd": (ctypes.c_int, [ctypes.c_int, _c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
            "ring_buffer__free": (None, [_c_void_p]),
            "libbpf_num_possible_cpus": (ctypes.c_int, []),
            "bpf_object__btf": (_c_void_p, [_c_void_p]),
            "btf__find_by_name_kind": (ctypes.c_int32, [_c_void_p, ctypes.c_char_p, ctypes.c_uint32]),
            "btf__type_by_id": (ctypes.POINTER(_BtfType), [_c_void_p, ctypes.c_uint32]),
            "btf__resolve_type": (ctypes.c_int, [_c_void_p, ctypes.c_uint32]),
            "btf__name_by_offset": (ctypes.c_char_p, [_c_void_p, ctypes.c_uint32]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(L, name)
            fn.restype = res
            fn.argtypes = args

    def _on_print(self, level: int, fmt: bytes | None, args: int | None) -> int:
        buf = ctypes.create_string_buffer(1 << 16)
        self._libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), fmt, ctypes.c_void_p(args))
        msg = buf.value.decode(errors="replace").rstrip()
        self.messages.append(msg)
        # libbpf prefixes most of its messages with "libbpf: " itself.
        log.debug("%s", msg if msg.startswith("libbpf:") else f"libbpf: {msg}")
        return 0

    def drain_messages(self) -> str:
        out = "\n".join(self.messages)
        self.messages.clear()
        return out


def _errno(ret: int | None = None) -> int:
    if ret is not None and ret < 0:
        return -ret
    return ctypes.get_errno() or errno.EINVAL


_Key = TypeVar("_Key", bound="ctypes._CData")


_PERCPU_TYPES = {5, 6, 10}  # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH


class Map:
    """A loaded map, by file descriptor. Every key and value buffer handed to
    the kernel is checked against the map's own sizes first: the kernel
    writes key_size (and value_size, times the CPUs for a per-CPU map) bytes
    into them, and a buffer one byte short would corrupt the heap silently."""

    def __init__(self, lib: Libbpf, fd: int, name: str) -> None:
        self.lib = lib.lib
        self.fd = fd
        self.name = name
        info = map_info(lib, fd)
        self.key_size = info.key_size if info else 0
        self.value_size = info.value_size if info else 0
        self.max_entries = info.max_entries if info else 0
        if info is not None and info.type in _PERCPU_TYPES:
            self.value_size = (info.value_size + 7) // 8 * 8 * int(lib.lib.libbpf_num_possible_cpus())

    def _check(self, key: ctypes._CData, value: ctypes._CData | None = None) -> None:
        if self.key_size and ctypes.sizeof(key) != self.key_size:
            raise TypeError(f"map {self.name}: a {ctypes.sizeof(key)}-byte key for {self.key_size}-byte keys")
        if value is not None and self.value_size and ctypes.sizeof(value) < self.value_size:
            raise TypeError(f"map {self.name}: a {ctypes.sizeof(value)}-byte buffer for {self.value_size}-byte values")

    def lookup(self, key: ctypes._CData, value: ctypes._CData) -> bool:
        self._check(key, value)
        return bool(self.lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value)) == 0)

    def update(self, key: ctypes._CData, value: ctypes._CData, flags: int = 0) -> None:
        self._check(key, value)
        ret = self.lib.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), flags)
        if ret < 0:
            raise OSError(_errno(ret), f"update of map {self.name}: {os.strerror(_errno(ret))}")

    def delete(self, key: ctypes._CData) -> bool:
        self._check(key)
        return bool(self.lib.bpf_map_delete_elem(self.fd, ctypes.byref(key)) == 0)

    def keys(self, key_type: type[_Key]) -> Iterator[_Key]:
        """All keys present now (a snapshot walk; entries may come and go)."""
        prev = None
        while True:
            nxt = key_type()
            self._check(nxt)
            if (
                self.lib.bpf_map_get_next_key(self.fd, None if prev is None else ctypes.byref(prev), ctypes.byref(nxt))
                < 0
            ):
                return
            yield nxt
            prev = nxt


class MapInfo(ctypes.Structure):
    """The head of struct bpf_map_info (uapi): enough to know a map by name and shape."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


def map_info(lib: Libbpf, fd: int) -> MapInfo | None:
    info = MapInfo()
    n = ctypes.c_uint32(ctypes.sizeof(info))
    return info if lib.lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n)) == 0 else None


def maps_named(lib: Libbpf, name: str) -> Iterator[tuple[Map, MapInfo]]:
    """Every BPF map on the host with this name (any program's, any agent's).
    The caller closes each map's fd."""
    cur = ctypes.c_uint32(0)
    while lib.lib.bpf_map_get_next_id(cur.value, ctypes.byref(cur)) == 0:
        fd = lib.lib.bpf_map_get_fd_by_id(cur.value)
        if fd < 0:
            continue  # gone since
        info = map_info(lib, fd)
        if info is None or info.name.decode(errors="replace") != name:
            os.close(fd)
            continue
        yield Map(lib, fd, name), info


class Link:
    """An attachment: a libbpf link (`ptr`), or a BPF link file descriptor
    made here (`fd`, a multi-uprobe); destroyed once."""

    def __init__(self, lib: Libbpf, ptr: int, what: str, fd: int = -1) -> None:
        self._lib = lib
        self.ptr: int | None = ptr or None
        self.fd = fd
        self.what = what

    def destroy(self) -> None:
        if self.ptr:
            self._lib.lib.bpf_link__destroy(self.ptr)
            self.ptr = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def destroy_together(links: Sequence[Link]) -> None:
    """Destroy links at once, each on a thread of its own, and return when
    all are gone. Removing a tracepoint or a multi-uprobe link waits out the
    kernel's grace periods, one link after another when done in turn; at
    once, the links share them (docs/design/evidence.md#link-removal).
    (ctypes and os.close let go of the interpreter lock meanwhile.)"""
    if len(links) <= 1:
        for link in links:
            link.destroy()
        return
    threads = [threading.Thread(target=link.destroy, name="memtrace-detach", daemon=True) for link in links]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- multi-uprobe links (Linux 6.6+), made with the bpf() syscall itself:
# libbpf 1.1 (Debian bookworm's) has no API for them. One link attaches a
# program at every offset of one file, each with its cookie; closing it
# removes them all after one grace period, where single uprobes wait one
# each (~0.1 s: a hundred probes took 13 s to go).

BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_PROG_TYPE_KPROBE = 2
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
_NR_BPF = {"x86_64": 321, "aarch64": 280}


class _LinkCreateUprobeMulti(ctypes.Structure):
    # union bpf_attr, its link_create.uprobe_multi member (include/uapi/linux/bpf.h)
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),
        ("cookies", ctypes.c_uint64),
        ("cnt", ctypes.c_uint32),
        ("multi_flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class _ProgLoad(ctypes.Structure):
    # union bpf_attr, its BPF_PROG_LOAD part up to expected_attach_type
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


def _sys_bpf(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(cmd, attr, sizeof attr): the result, or -errno."""
    nr = _NR_BPF.get(os.uname().machine)
    if nr is None:
        return -errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    ret = int(
        libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    )
    return ret if ret >= 0 else -ctypes.get_errno()


def _uprobe_multi_link(
    prog_fd: int, path: str, offsets: list[int], cookies: list[int], retprobe: bool, pid: int = 0
) -> int:
    n = len(offsets)
    offs = (ctypes.c_uint64 * n)(*offsets)
    cks = (ctypes.c_uint64 * n)(*cookies)
    name = ctypes.create_string_buffer(path.encode())
    attr = _LinkCreateUprobeMulti(
        prog_fd=prog_fd,
        attach_type=BPF_TRACE_UPROBE_MULTI,
        path=ctypes.addressof(name),
        offsets=ctypes.addressof(offs),
        cookies=ctypes.addressof(cks),
        cnt=n,
        multi_flags=BPF_F_UPROBE_MULTI_RETURN if retprobe else 0,
        pid=pid,
    )
    return _sys_bpf(BPF_LINK_CREATE, attr)


_UPROBE_MULTI: bool | None = None


def uprobe_multi_supported() -> bool:
    """Whether this kernel makes multi-uprobe links, as libbpf probes it: a
    program of that attach type loads, and a link to "/" (no ELF file) is
    refused with EBADF, not EINVAL. MEMTRACE_UPROBE_MULTI=0 says no."""
    global _UPROBE_MULTI
    if os.environ.get("MEMTRACE_UPROBE_MULTI") == "0":
        return False
    if _UPROBE_MULTI is None:
        insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)  # r0 = 0; exit
        lic = ctypes.create_string_buffer(b"GPL")
        attr = _ProgLoad(
            prog_type=BPF_PROG_TYPE_KPROBE,
            insn_cnt=2,
            insns=ctypes.addressof(insns),
            license=ctypes.addressof(lic),
            expected_attach_type=BPF_TRACE_UPROBE_MULTI,
        )
        fd = _sys_bpf(BPF_PROG_LOAD, attr)
        if fd < 0:
            _UPROBE_MULTI = False
        else:
            try:
                link = _uprobe_multi_link(fd, "/", [0], [0], False)
                if link >= 0:
                    os.close(link)
                _UPROBE_MULTI = link == -errno.EBADF
            finally:
                os.close(fd)
    return _UPROBE_MULTI


class BpfObject:
    """One BPF object file: open, set options, load, attach, close."""

    def __init__(self, path: Path, lib: Libbpf | None = None) -> None:
        self.lib = lib or Libbpf.get()
        self.path = path
        ctypes.set_errno(0)
        obj = self.lib.lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            err = _errno()
            raise LoadError(f"open {path}", err, self.lib.drain_messages())
        self.obj: int | None = obj
        self.loaded = False

    def _map_ptr(self, name: str) -> int:
        m = self.lib.lib.bpf_object__find_map_by_name(self.obj, name.encode())
        if not m:
            raise KeyError(f"no map {name} in {self.path}")
        return int(m)

    def rodata_vars(self) -> dict[str, RodataVar]:
        """The `const volatile` options, from the object's BTF: the .rodata
        DATASEC lists each variable's offset and size, as libbpf's skeletons
        read them, and its type says whether it is signed or a bool."""
        L = self.lib.lib
        btf = L.bpf_object__btf(self.obj)
        if not btf:
            raise LoadError(f"read BTF of {self.path.name}", errno.ENOENT, "the object carries no BTF")
        sec_id = L.btf__find_by_name_kind(btf, b".rodata", BTF_KIND_DATASEC)
        if sec_id < 0:
            return {}
        sec = L.btf__type_by_id(btf, sec_id)
        vlen = sec.contents.info & 0xFFFF
        infos = ctypes.cast(
            ctypes.addressof(sec.contents) + ctypes.sizeof(_BtfType), ctypes.POINTER(_BtfVarSecinfo * vlen)
        ).contents
        out: dict[str, RodataVar] = {}
        for vi in infos:
            var = L.btf__type_by_id(btf, vi.type).contents  # a BTF_KIND_VAR
            name = L.btf__name_by_offset(btf, var.name_off).decode()
            tid = L.btf__resolve_type(btf, var.size)  # a VAR's `size` is its type; past const, volatile, typedefs
            t = L.btf__type_by_id(btf, tid).contents if tid > 0 else None
            kind = (t.info >> 24) & 0x1F if t is not None else 0
            signed = boolean = False
            if t is not None and kind == BTF_KIND_INT:
                enc = ctypes.c_uint32.from_address(ctypes.addressof(t) + ctypes.sizeof(_BtfType)).value >> 24
                signed, boolean = bool(enc & BTF_INT_SIGNED), bool(enc & BTF_INT_BOOL)
            elif t is not None and kind in (BTF_KIND_ENUM, BTF_KIND_ENUM64):
                signed = bool(t.info >> 31)  # kflag: a signed enum
            else:
                continue  # not a scalar option (an array, a struct): not settable here
            out[name] = RodataVar(name, int(vi.offset), int(vi.size), signed, boolean)
        return out

    def set_rodata(self, values: Mapping[str, int | bool]) -> None:
        """Write `const volatile` options into .rodata before load, each with
        its own width; an unknown name or a value that does not fit is a
        BadOption, and nothing is written then."""
        if self.loaded:
            raise BadOption("options can only be set before the object is loaded")
        layout = self.rodata_vars()
        writes: list[tuple[RodataVar, bytes]] = []
        for name, value in values.items():
            var = layout.get(name)
            if var is None:
                raise BadOption(
                    f"{self.path.name} has no option {name}", f"its options: {', '.join(sorted(layout)) or 'none'}"
                )
            writes.append((var, var.encode(value)))
        if not writes:
            return
        size = ctypes.c_size_t()
        ptr = self.lib.lib.bpf_map__initial_value(self._map_ptr(".rodata"), ctypes.byref(size))
        if not ptr:
            raise KeyError(".rodata has no initial value")
        for var, data in writes:
            if var.offset + var.size > size.value:
                raise KeyError(f"{var.name} lies outside .rodata")
            ctypes.memmove(ptr + var.offset, data, var.size)

    def rodata(self) -> bytes:
        """The .rodata the programs see: after load, read back from the
        kernel's map (a one-element array holding the whole section)."""
        size = ctypes.c_size_t()
        m = self._map_ptr(".rodata")
        ptr = self.lib.lib.bpf_map__initial_value(m, ctypes.byref(size))
        if not self.loaded:
            return ctypes.string_at(ptr, size.value) if ptr else b""
        buf = ctypes.create_string_buffer(size.value)
        key = ctypes.c_uint32(0)
        fd = self.lib.lib.bpf_map__fd(m)
        if self.lib.lib.bpf_map_lookup_elem(fd, ctypes.byref(key), buf) < 0:
            raise OSError(_errno(), "lookup of .rodata")
        return buf.raw

    def set_max_entries(self, map_name: str, n: int) -> None:
        if self.lib.lib.bpf_map__set_max_entries(self._map_ptr(map_name), n) < 0:
            raise ValueError(f"cannot set max_entries of {map_name} to {n}")

    def set_autoload(self, prog: str, on: bool) -> None:
        self.lib.lib.bpf_program__set_autoload(self._prog(prog), on)

    def load_for_uprobe_multi(self, prog: str) -> None:
        """Load this uprobe program for multi-uprobe links (before load):
        it can then no longer be attached one probe at a time."""
        if self.lib.lib.bpf_program__set_expected_attach_type(self._prog(prog), BPF_TRACE_UPROBE_MULTI) < 0:
            raise BadOption(f"cannot load {prog} for multi-uprobe links")

    def load(self) -> None:
        self.lib.drain_messages()
        ctypes.set_errno(0)
        ret = self.lib.lib.bpf_object__load(self.obj)
        if ret < 0:
            err = _errno(ret)
            if err == errno.EPERM:  # EACCES is the verifier's refusal
                raise NotPrivileged("loading BPF programs")
            raise LoadError(f"load {self.path.name}", err, self.lib.drain_messages())
        self.loaded = True

    def map(self, name: str) -> Map:
        fd = self.lib.lib.bpf_map__fd(self._map_ptr(name))
        if fd < 0:
            raise KeyError(f"map {name} has no fd (not loaded?)")
        return Map(self.lib, fd, name)

    def _prog(self, name: str) -> int:
        p = self.lib.lib.bpf_object__find_program_by_name(self.obj, name.encode())
        if not p:
            raise KeyError(f"no program {name} in {self.path}")
        return int(p)

    def attach(self, prog: str) -> Link:
        """Attach a program by its section (tracepoints, tp_btf)."""
        ctypes.set_errno(0)
        link = self.lib.lib.bpf_program__attach(self._prog(prog))
        if not link:
            err = _errno()
            if err in (errno.EPERM, errno.EACCES):
                raise NotPrivileged(f"attaching {prog}")
            raise AttachError(
                f"cannot attach {prog}: {os.strerror(err)}",
                "run `memtrace doctor`; tracepoints need tracefs at /sys/kernel/tracing",
            )
        return Link(self.lib, int(link), prog)

    def attach_uprobe(self, prog: str, path: str, offset: int, cookie: int, retprobe: bool, pid: int = -1) -> Link:
        """`pid`: only that process takes the probe's trap (-1: every process)."""
        opts = _UprobeOpts(sz=ctypes.sizeof(_UprobeOpts), bpf_cookie=cookie, retprobe=retprobe)
        ctypes.set_errno(0)
        link = self.lib.lib.bpf_program__attach_uprobe_opts(
            self._prog(prog), pid, path.encode(), offset, ctypes.byref(opts)
        )
        if not link:
            err = _errno()
            if err in (errno.EPERM, errno.EACCES):
                raise NotPrivileged(f"attaching a uprobe to {path}")
            raise AttachError(
                f"cannot attach a uprobe to {path}+{offset:#x}: {os.strerror(err)}",
                "the library may have been removed or replaced; memtrace attaches again when it is mapped next",
            )
        return Link(self.lib, int(link), f"{path}+{offset:#x}")

    def attach_uprobe_multi(
        self, prog: str, path: str, offsets: list[int], cookies: list[int], retprobe: bool, pid: int = 0
    ) -> Link:
        """One link for every offset of a file, each with its cookie (the
        program was loaded with load_for_uprobe_multi); every process, or
        the process `pid` (as this process's pid namespace names it) only:
        the kernel then writes the breakpoints into that process's memory
        alone, and no other process takes their traps."""
        fd = self.lib.lib.bpf_program__fd(self._prog(prog))
        link = _uprobe_multi_link(fd, path, offsets, cookies, retprobe, pid)
        if link < 0:
            err = -link
            if err in (errno.EPERM, errno.EACCES):
                raise NotPrivileged(f"attaching uprobes to {path}")
            raise AttachError(
                f"cannot attach {len(offsets)} uprobes to {path}: {os.strerror(err)}",
                "the library may have been removed or replaced; memtrace attaches again when it is mapped next",
            )
        return Link(self.lib, 0, f"{path} ({len(offsets)} offsets)", fd=link)

    def close(self) -> None:
        if self.obj:
            self.lib.lib.bpf_object__close(self.obj)
            self.obj = None


class RingBuffer:
    """libbpf ring buffers drained on demand (no epoll: docs/design/evidence.md#ring-wakeups).

    ``callback(data_ptr, size)`` is called per record; it must not raise.
    """

    def __init__(self, lib: Libbpf, maps: list[tuple[Map, Callable[[int, int], None]]]) -> None:
        self.lib = lib
        self._cbs: list[object] = []
        self.rb: int | None = None
        for m, fn in maps:
            cb = RING_SAMPLE_FN(self._wrap(fn))
            self._cbs.append(cb)
            if self.rb is None:
                rb = lib.lib.ring_buffer__new(m.fd, cb, None, None)
                if not rb:
                    raise OSError(_errno(), f"ring_buffer__new({m.name})")
                self.rb = int(rb)
            elif lib.lib.ring_buffer__add(self.rb, m.fd, cb, None) < 0:
                raise OSError(_errno(), f"ring_buffer__add({m.name})")

    @staticmethod
    def _wrap(fn: Callable[[int, int], None]) -> Callable[[int, int, int], int]:
        def cb(_ctx: int, data: int, size: int) -> int:
            fn(data, size)
            return 0

        return cb

    def consume(self) -> int:
        """Drain every ring; returns the number of records consumed."""
        assert self.rb is not None
        n = self.lib.lib.ring_buffer__consume(self.rb)
        if n < 0:
            raise OSError(-n, "ring_buffer__consume")
        return int(n)

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for a record (epoll), then drain. Only for
        rings whose programs submit with a wakeup (the control ring)."""
        assert self.rb is not None
        n = self.lib.lib.ring_buffer__poll(self.rb, timeout_ms)
        if n < 0 and n != -errno.EINTR:
            raise OSError(-n, "ring_buffer__poll")
        return max(int(n), 0)

    def epoll_fd(self) -> int:
        """libbpf's epoll descriptor for these rings: readable once a record
        submitted with a wakeup waits (poll() without a callback: select on it)."""
        assert self.rb is not None
        return int(self.lib.lib.ring_buffer__epoll_fd(self.rb))

    def close(self) -> None:
        if self.rb:
            self.lib.lib.ring_buffer__free(self.rb)
            self.rb = None
