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


def mapped_nccl(pid: int) -> Iterator[Candidate]:
    """The libnccl files a process maps, reached through map_files/ (the
    mapped file itself, even when deleted or replaced on disk)."""
    try:
        text = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return
    seen: set[str] = set()
    for line in text.splitlines():
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
