"""memtrace's C helpers (memtrace/native/fastsample.c, built with the package
as memtrace._fastsample where a C compiler was present), reached through
ctypes as libbpf is. Optional: every user has a Python path beside it."""

from __future__ import annotations

import ctypes
import functools
import importlib.util


class NativeUnavailable(Exception):
    """The C helpers are not built here, or do not load."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.reason, self.fix = reason, fix


@functools.lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | tuple[str, str]:
    spec = importlib.util.find_spec("memtrace._fastsample")
    if spec is None or spec.origin is None:
        return (
            "memtrace was installed without its C helpers (no C compiler at install)",
            "reinstall memtrace with gcc and the Python headers present (apt install gcc python3-dev)",
        )
    try:
        return ctypes.CDLL(spec.origin)
    except OSError as e:
        return (
            f"memtrace's C helpers do not load here ({e})",
            "reinstall memtrace on this machine so its C helpers are built for it",
        )


def library() -> ctypes.CDLL:
    """The loaded library (once per process); NativeUnavailable if there is none."""
    lib = _load()
    if isinstance(lib, tuple):
        raise NativeUnavailable(*lib)
    return lib
