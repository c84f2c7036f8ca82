"""The files a process has mapped or open, named as the kernel names them:
what every uprobe sensor needs to find its libraries in running processes.

A file is identified by its inode (FileId), so a library seen through
several mount namespaces (/proc/PID/root) is attached once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from memtrace.core.abi import Layer

PROC = Path("/proc")


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
    """A file a process maps or holds open, reachable by us."""

    pid: int
    path: str  # a path the kernel and we can open: /proc/PID/root/... or /proc/PID/fd/N
    name: str  # the path as the process sees it
    layer: Layer | None  # the CUDA layer it provides; None: another library, or an executable
    fid: FileId


def map_files_path(pid: int, address_range: str) -> str:
    """/proc/PID/map_files/ entry of a maps line's range.

    maps pads addresses to 8 hex digits ("0041f000-006d2000", as a non-PIE
    executable such as Debian's and Ubuntu's /usr/bin/python3.x is mapped);
    map_files names the same mapping without the padding ("41f000-6d2000").
    """
    lo, hi = address_range.split("-")
    return f"/proc/{pid}/map_files/{int(lo, 16):x}-{int(hi, 16):x}"


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


def lines_with(text: str, needle: str) -> Iterator[str]:
    """The lines of `text` that hold `needle`, found by searching rather than
    by splitting every line: a PyTorch process maps thousands of regions."""
    i = text.find(needle)
    while i >= 0:
        start = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        if end < 0:
            end = len(text)
        yield text[start:end]
        i = text.find(needle, end)


def mapped_files(
    pid: int, needle: str, layer: Callable[[str], Layer | None], keep: Callable[[str], bool]
) -> Iterator[Candidate]:
    """The files a process maps whose path holds `needle` and that `keep`
    accepts (once each), reached through map_files/: the mapped file itself,
    even when deleted or replaced on disk, never following links out of the
    process's container. `layer` names the CUDA layer a path provides."""
    try:
        text = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return
    seen: set[str] = set()
    for line in lines_with(text, needle):
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5] in seen:
            continue
        name = parts[5]
        seen.add(name)
        if not keep(name):
            continue
        path = map_files_path(pid, parts[0])
        try:
            st = os.stat(path)
        except OSError:
            continue
        yield Candidate(pid, path, name, layer(name), FileId.of(st))


def _candidate(pid: int, path: str, layer: Callable[[str], Layer | None]) -> Candidate | None:
    try:
        st = os.stat(path)
        name = os.readlink(path)
    except OSError:
        return None
    return Candidate(pid, path, name, layer(name), FileId.of(st))


def executable(pid: int) -> Candidate | None:
    return _candidate(pid, f"/proc/{pid}/exe", lambda _name: None)


def opened_file(pid: int, fd: int, layer: Callable[[str], Layer | None]) -> Candidate | None:
    return _candidate(pid, f"/proc/{pid}/fd/{fd}", layer)
