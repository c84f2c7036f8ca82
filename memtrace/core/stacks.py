"""Call stacks: what a frame is, once named, for every stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A call with no stack: none was asked for, the kernel could not take one,
# or it could not be kept (each counted in the stats).
NO_STACK = 0


@dataclass(frozen=True)
class NativeFrame:
    """One native frame: the file it lies in (its name as the process saw
    it; `[unknown]` when no map of the process held the address, and the
    offset is then the address), the function there (None when the file
    has no symbol for it) and the offset in the file."""

    module: str
    function: str | None
    offset: int
    build_id: str = ""  # the file's GNU build id, hex ("" if it has none or is not known)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"module": self.module, "function": self.function, "offset": self.offset}
        if self.build_id:
            d["build_id"] = self.build_id
        return d


@dataclass(frozen=True)
class PythonFrame:
    """One Python frame: the function (its qualified name from CPython
    3.11), its file, and the line being executed there (None where the
    code object's line table has none)."""

    function: str
    file: str
    line: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line}


Frame = NativeFrame | PythonFrame

# What became of a stack's Python frames (`python_frames` in JSON), for a
# process running an interpreter; a stack of any other process has none.
PY_TAKEN = "taken"
PY_TRUNCATED = "truncated"  # deeper than BPF keeps: the innermost are there
PY_NO_THREAD = "no thread state"  # the calling thread runs no Python code
PY_FAULT = "fault"  # a read failed mid-walk: the frames before it are there
PY_NOT_TAKEN = "not taken"  # the call came before memtrace found the interpreter
PY_UNNAMED = "unnamed"  # a code object could not be read: that frame is `[python]`
PY_UNSUPPORTED = "unsupported"  # a CPython whose frames memtrace cannot walk (the agent says which)


@dataclass(frozen=True)
class Stack:
    """A call's frames, innermost first: native frames, with Python frames
    in place of the interpreter's own where the process runs Python."""

    frames: tuple[Frame, ...]
    python: str | None = None  # one of the PY_ words above; None: not a Python process
