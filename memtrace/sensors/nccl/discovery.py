"""Finding libnccl in running processes, by name in their mappings."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from memtrace.core.procfiles import Candidate, mapped_files

_NCCL = re.compile(r"^libnccl\.so(\.|$)")


def is_nccl(path: str) -> bool:
    return bool(_NCCL.match(os.path.basename(path)))


def mapped_nccl(pid: int) -> Iterator[Candidate]:
    """The libnccl files a process maps (the mapped file itself, even when deleted or replaced on disk)."""
    return mapped_files(pid, "libnccl.so", lambda _name: None, is_nccl)
