"""memtrace's threads, named where operators look: `top -H`, `ps -L`,
/proc/PID/task/TID/comm. Python gives OS threads a name of its own only from
3.14; before, every agent thread shows as `python3`, and a host's operator
cannot tell the drain from the host sampler when one of them costs CPU."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_NAME = 15
_COMM_LEN = 15  # TASK_COMM_LEN less its NUL

_libc: Any = None


def load_libc() -> None:
    """Open libc's handle now: before a fork, so that the child names itself
    with no dlopen (a lock another thread of the parent may have held at the
    fork)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            pass


def name_os_thread(name: str) -> bool:
    """Name the calling OS thread (cut to the kernel's 15 bytes); False where
    the kernel or libc says no, which harms nothing."""
    load_libc()
    try:
        return _libc is not None and bool(_libc.prctl(_PR_SET_NAME, name.encode()[:_COMM_LEN], 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def thread(target: Callable[..., object], name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """A daemon thread, not started, whose OS thread carries `name` too."""

    def run() -> None:
        name_os_thread(name)
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)
