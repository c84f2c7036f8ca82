"""The agent's memory between exports: given back to the system, and kept
out of the way of the drain thread.

CPython's cyclic garbage collector walks every tracked object in a full
collection while holding the GIL. At 1000 traced processes (about 27k
series) a full pass took 200-500 ms on a 2-CPU host, and an export's
hundreds of thousands of short-lived objects set one off: the drain thread
could not run meanwhile, so a drain came that much late and a held process
stayed stopped longer (bench/footprint.py measures the worst drain gap).
So an export is built with the cyclic collector paused (its objects are
freed by reference counting when it is sent), and what lives on after it
(the model) is frozen out of later passes. The model makes no reference cycles
(tests/test_otlp.py checks that exports and forgetting processes leave no
cyclic garbage), so freezing leaks nothing: a frozen object is still freed
by reference counting when its process is forgotten. What can be kept: a
cycle that was not yet collected at a freeze (pyelftools makes some when
a new library is attached); bench/footprint.py counts it over the agent's
life.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator


def give_back_free_memory() -> None:
    """After an export: hand the memory it freed back to the system (glibc
    keeps freed heap pages otherwise, and the resident size stays at the
    export's peak), and keep what lives on out of the cyclic collector's
    full passes (freeze_long_lived)."""
    trim = getattr(_LIBC, "malloc_trim", None)  # glibc only (not musl)
    if trim is not None:
        trim(0)
    freeze_long_lived()


def freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic collector's passes
    (objects made later are collected as before)."""
    gc.freeze()


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector paused for the block (an export's build), and
    what the block made frozen at its end: otherwise the allocations it made
    set off a collection at once that walks all of them (100-300 ms at 1000
    processes, the GIL held). They are freed by reference counting once the
    export is sent, frozen or not."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        freeze_long_lived()
        if was:
            gc.enable()


_LIBC = ctypes.CDLL(None)
