"""Finding CUDA libraries: by name in process mappings, by symbols in executables.

A file is identified by its inode, as the kernel names it, so a library
seen through several mount namespaces (/proc/PID/root) is attached once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memtrace.core.abi import Layer
from memtrace.core.procmaps import map_files_path

PROC = Path("/proc")
_RUNTIME = re.compile(r"^libcudart\.so(\.|$)")
_DRIVER = re.compile(r"^libcuda\.so(\.|$)")


def layer_of(path: str) -> Layer | None:
    """The layer a library provides, judged by its file name."""
    base = os.path.basename(path)
    if _RUNTIME.match(base):
        return Layer.RUNTIME
    if _DRIVER.match(base):
        return Layer.DRIVER
    return None


@dataclass(frozen=True)
class FileId:
    """(dev, ino) in the kernel's encoding: what sb->s_dev and i_ino hold."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        return cls((os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino)


@dataclass(frozen=True)
class Candidate:
    pid: int
    path: str  # a path the kernel and we can open: /proc/PID/root/... or /proc/PID/fd/N
    name: str  # the path as the process sees it
    layer: Layer | None  # None: an executable that may hold a static runtime
    fid: FileId


def pids() -> Iterator[int]:
    for d in PROC.iterdir():
        if d.name.isdigit():
            yield int(d.name)


def alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def mapped_libraries(pid: int) -> Iterator[Candidate]:
    """CUDA libraries mapped by a process, reached through its own root."""
    try:
        text = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return
    seen: set[str] = set()
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        name = parts[5]
        if name in seen:
            continue
        seen.add(name)
        layer = layer_of(name)
        if layer is None:
            continue
        # map_files/ names the mapped file itself, even when deleted or
        # replaced on disk, and never follows links out of the container.
        path = map_files_path(pid, parts[0])
        try:
            st = os.stat(path)
        except OSError:
            continue
        yield Candidate(pid, path, name, layer, FileId.of(st))


def executable(pid: int) -> Candidate | None:
    path = f"/proc/{pid}/exe"
    try:
        st = os.stat(path)
        name = os.readlink(path)
    except OSError:
        return None
    return Candidate(pid, path, name, None, FileId.of(st))


def opened_file(pid: int, fd: int) -> Candidate | None:
    path = f"/proc/{pid}/fd/{fd}"
    try:
        st = os.stat(path)
        name = os.readlink(path)
    except OSError:
        return None
    return Candidate(pid, path, name, layer_of(name), FileId.of(st))
