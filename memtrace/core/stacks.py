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


Stack = tuple[NativeFrame, ...]  # innermost first
