"""Finding CUDA libraries: by name in process mappings, by symbols in executables."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from memtrace.core.abi import Layer
from memtrace.core.procfiles import Candidate, mapped_files
from memtrace.core.procfiles import opened_file as _opened_file

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


def mapped_libraries(pid: int) -> Iterator[Candidate]:
    """CUDA libraries mapped by a process, reached through its own root."""
    return mapped_files(pid, "/libcuda", layer_of, lambda name: layer_of(name) is not None)


def opened_file(pid: int, fd: int) -> Candidate | None:
    """The file a process holds open at `fd`, with the CUDA layer it provides (if any)."""
    return _opened_file(pid, fd, layer_of)
