"""Finding libnccl in running processes, by name in their mappings."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from memtrace.core.procmaps import map_files_path
from memtrace.sensors.cuda.discovery import PROC, Candidate, FileId

_NCCL = re.compile(r"^libnccl\.so(\.|$)")


def is_nccl(path: str) -> bool:
    return bool(_NCCL.match(os.path.basename(path)))


def lines_with(text: str, needle: str) -> Iterator[str]:
    """The lines of `text` that hold `needle`, found by searching rather than
    by splitting every line: a PyTorch process maps thousands of regions,
    and the sampler looks at each traced process's maps every second."""
    i = text.find(needle)
    while i >= 0:
        start = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        if end < 0:
            end = len(text)
        yield text[start:end]
        i = text.find(needle, end)


def mapped_nccl(pid: int) -> Iterator[Candidate]:
    """The libnccl files a process maps, reached through map_files/ (the
    mapped file itself, even when deleted or replaced on disk)."""
    try:
        text = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return
    seen: set[str] = set()
    for line in lines_with(text, "libnccl.so"):
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not is_nccl(parts[5]) or parts[5] in seen:
            continue
        seen.add(parts[5])
        path = map_files_path(pid, parts[0])
        try:
            st = os.stat(path)
        except OSError:
            continue
        yield Candidate(pid, path, parts[5], None, FileId.of(st))
