"""The call stacks of copies and memory calls: taken from the kernel as the
drain meets them, named when a report asks.

The kernel keeps each stack in `stack_frames` under a hash of its addresses
and its process until it is read here; what is read is deleted there (the
same stack comes back under the same key, which this table then has) and
kept here. Addresses mean something only in their process's address space,
so each is placed in its file (file, offset) at once, with the process's
maps: read when the process was stopped on a CUDA library mapping, and
again when an address lies outside what was read, if the process still
runs. The files are kept open (sources/symbols.py), so frames are named
after the process is gone. An address in none of its process's executable
mappings is no return address: the frame-pointer walk went astray there
(through a function built without frame pointers), and the native frames
end before it (counted). A process whose maps were never read has its
addresses as `[unknown]`, never guessed.

Python frames: when a process maps the files of a CPython memtrace can walk
(sources/python.py), BPF is told where its interpreter keeps its state and
takes the calling thread's frames with the native ones. Their code objects
are read from the process at once, like its maps, and each frame named
(function, file, line). When the stack is named, the Python frames take
the place of the interpreter's own evaluation frames; where the native walk
stopped before reaching them (an interpreter built without frame
pointers), they follow the last native frame.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from memtrace.core import stacks as st
from memtrace.core.abi import PY_ENTRY, PyCode, PyCodeKey, PyProc, PyState
from memtrace.core.abi import Stack as RawStack
from memtrace.core.ids import ProcessKey
from memtrace.core.stacks import NO_STACK, Frame, NativeFrame, PythonFrame, Stack
from memtrace.sources import python
from memtrace.sources.procfs import is_running
from memtrace.sources.symbols import Mapping, Module, Modules

log = logging.getLogger("memtrace")

# A frame placed in its file: (the file, or None when no map covered it; the
# offset in the file, or the address).
_Placed = tuple[Module | None, int]

# The interpreter's function that evaluates Python frames: its native frames
# are where the Python frames go.
EVAL_FUNCTIONS = frozenset({"_PyEval_EvalFrameDefault"})

_PY_STATE = {
    PyState.WALKED: st.PY_TAKEN,
    PyState.TRUNCATED: st.PY_TRUNCATED,
    PyState.NO_THREAD: st.PY_NO_THREAD,
    PyState.FAULT: st.PY_FAULT,
}


@dataclass(frozen=True)
class _PlacedStack:
    proc: ProcessKey
    native: tuple[_Placed, ...]
    py_state: int  # enum mt_py_state
    py: tuple[tuple[PythonFrame | None, bool], ...]  # (the frame, or None if unnamed; an entry frame?)


class _Maps:
    """One process's executable mappings, for placing addresses."""

    def __init__(self, mappings: list[Mapping]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self.starts, end) - 1
        return i >= 0 and self.mappings[i].end > start

    def place(self, ip: int) -> _Placed | None:
        i = bisect.bisect_right(self.starts, ip) - 1
        if i >= 0 and ip < self.mappings[i].end:
            m = self.mappings[i]
            return m.module, ip - m.start + m.pgoff
        return None


class StackTable:
    MAX_STACKS = 65536  # stacks kept; a further new stack is counted, not kept
    MAX_PROCESS_MAPS = 4096  # processes whose maps are kept (the least recently used go)

    def __init__(
        self,
        take: Callable[[int], RawStack | None],
        tell_python: Callable[[ProcessKey, PyProc | None], None] | None = None,
        take_codes: Callable[[], list[tuple[PyCodeKey, PyCode]]] | None = None,
    ) -> None:
        self._take = take  # reads (and deletes) a stack from the kernel's map
        self._tell_python = tell_python  # tells BPF a process's interpreter (None: forget it)
        self._take_codes = take_codes  # what BPF read of new stacks' code objects (read and deleted)
        self.modules = Modules()
        self._maps: OrderedDict[ProcessKey, _Maps] = OrderedDict()
        # Each process's interpreter: walked, unsupported (why), or none (None).
        self._python: OrderedDict[ProcessKey, python.Interpreter | str | None] = OrderedDict()
        self._placed: dict[int, _PlacedStack] = {}
        self._named: dict[int, Stack] = {}
        self.not_found = 0  # keys the kernel's map did not have (never expected: counted)
        self.not_kept = 0  # new stacks past MAX_STACKS
        self.unplaced_frames = 0  # addresses no map of their process covered
        self.python_unnamed = 0  # Python frames whose code object could not be read
        self.unsupported: dict[str, int] = {}  # interpreters memtrace cannot walk (why), processes each
        # The drain adds, the control thread learns, a report names: one at a time.
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.modules.close()
            self._maps.clear()

    @property
    def distinct(self) -> int:
        return len(self._placed)

    def learn(self, key: ProcessKey) -> None:
        """Read a process's maps (and find its interpreter) while it lives:
        when it is stopped on a library mapping, and at its first call."""
        with self._lock:
            self._learn(key)

    def _learn(self, key: ProcessKey) -> _Maps | None:
        if not is_running(key):
            return None
        mappings = self.modules.learn(key.pid)
        if not is_running(key):  # the pid was reused while its maps were read
            return None
        old = self._maps.get(key)
        if old is not None:
            # An exiting process shows no maps: what was read before stays,
            # where nothing mapped since lies over it.
            fresh = _Maps(mappings)
            mappings += [o for o in old.mappings if not fresh.overlaps(o.start, o.end)]
        m = self._maps[key] = _Maps(mappings)
        self._maps.move_to_end(key)
        while len(self._maps) > self.MAX_PROCESS_MAPS:
            self._maps.popitem(last=False)
        if self._python.get(key) is None:
            self._find_python(key, m)
        return m

    def _find_python(self, key: ProcessKey, maps: _Maps) -> None:
        """Look for an interpreter in a process's files; tell BPF of one it can walk."""
        files = [
            python.Candidate(x.module.name, x.module.fd, x.start, x.pgoff) for x in maps.mappings if x.module.fd >= 0
        ]
        found: python.Interpreter | str | None
        try:
            found = python.find(key, files)
        except python.Unsupported as e:
            found = str(e)
            self.unsupported[found] = self.unsupported.get(found, 0) + 1
            log.info("pid %d: no Python frames: %s", key.pid, e)
        except (OSError, ValueError) as e:
            found = None
            log.debug("pid %d: interpreter not read: %s", key.pid, e)
        self._python[key] = found
        self._python.move_to_end(key)
        while len(self._python) > self.MAX_PROCESS_MAPS:
            self._python.popitem(last=False)
        if isinstance(found, python.Interpreter) and found.ready and self._tell_python is not None:
            self._tell_python(key, found.config())

    def forget(self, key: ProcessKey) -> None:
        """A process exited: BPF no longer walks its interpreter (its frames are kept here)."""
        with self._lock:
            interp = self._python.get(key)
            if isinstance(interp, python.Interpreter) and interp.ready and self._tell_python is not None:
                self._tell_python(key, None)

    def add(self, batch: np.ndarray) -> None:
        """Take the stacks a batch of events names that this table does not have yet."""
        keys = batch["stack"]
        if not keys.any():
            return
        uniq, first = np.unique(keys, return_index=True)
        pids, starts = batch["pid"][first].tolist(), batch["start_ns"][first].tolist()
        with self._lock:
            codes_read = False
            for key, pid, start in zip(uniq.tolist(), pids, starts, strict=True):
                if key == NO_STACK or key in self._placed:
                    continue
                if not codes_read:
                    codes_read = True
                    self._keep_codes()
                self._add(key, ProcessKey(pid, start))

    def _keep_codes(self) -> None:
        """Take what BPF kept of new stacks' code objects, for naming their
        frames even once their process is gone."""
        if self._take_codes is None:
            return
        for k, raw in self._take_codes():
            interp = self._python.get(ProcessKey(k.pid, k.start_ns))
            if isinstance(interp, python.Interpreter):
                interp.keep(k.code, raw)

    def _add(self, key: int, proc: ProcessKey) -> None:
        raw = self._take(key)
        if raw is None:
            self.not_found += 1
            return
        if len(self._placed) >= self.MAX_STACKS:
            self.not_kept += 1
            return
        maps = self._maps.get(proc)
        relearnt = False
        placed: list[_Placed] = []
        ips = list(raw.ips[: min(raw.nframes, len(raw.ips))])
        while ips and ips[-1] == 0:  # where a walk without frame pointers ended: no frame
            ips.pop()
        for ip in ips:
            p = maps.place(ip) if maps is not None else None
            if p is None and not relearnt:
                relearnt = True  # a library mapped since: read the maps again, once per stack
                maps = self._learn(proc) or maps
                p = maps.place(ip) if maps is not None else None
            if p is None:
                self.unplaced_frames += 1
                if maps is not None:
                    # In no executable mapping: no return address. The walk went
                    # astray (a caller without frame pointers); it ends here.
                    break
                p = (None, ip)
            placed.append(p)
        self._placed[key] = _PlacedStack(proc, tuple(placed), raw.py_state, self._python_frames(proc, raw))

    def _python_frames(self, proc: ProcessKey, raw: RawStack) -> tuple[tuple[PythonFrame | None, bool], ...]:
        """Name a stack's Python frames now, while their process lives."""
        n = min(raw.py_nframes, len(raw.py_code))
        if not n:
            return ()
        frames = [(int(raw.py_code[i]), int(raw.py_instr[i])) for i in range(n)]
        interp = self._python.get(proc)
        names: list[PythonFrame | None]
        if isinstance(interp, python.Interpreter):
            names = python.name_frames(interp, frames)
            every_entry = interp.layout.every_frame_entry
        else:  # forgotten meanwhile: unnamed, never guessed
            names, every_entry = [None] * n, False
        out: list[tuple[PythonFrame | None, bool]] = []
        for name, (_, instr) in zip(names, frames, strict=True):
            if name is None:
                self.python_unnamed += 1
            out.append((name, every_entry or bool(instr & PY_ENTRY)))
        return tuple(out)

    def stack(self, key: int) -> Stack | None:
        """The named frames of a stack, innermost first; None for a call
        without one (or a stack not kept)."""
        named = self._named.get(key)
        if named is not None:
            return named
        placed = self._placed.get(key)
        if placed is None:
            return None
        native = [self._name(m, off, i) for i, (m, off) in enumerate(placed.native)]
        named = self._named[key] = Stack(merge(native, placed.py), self._python_word(placed))
        return named

    def _python_word(self, placed: _PlacedStack) -> str | None:
        """What became of a stack's Python frames (core/stacks.py), or None
        for a process that runs no interpreter memtrace knows of."""
        interp = self._python.get(placed.proc)
        if placed.py_state == PyState.NOT_PYTHON:
            if isinstance(interp, python.Interpreter):
                return st.PY_NOT_TAKEN
            return st.PY_UNSUPPORTED if isinstance(interp, str) else None
        word = _PY_STATE.get(PyState(placed.py_state), st.PY_FAULT)
        if word == st.PY_TAKEN and any(f is None for f, _ in placed.py):
            return st.PY_UNNAMED
        return word

    def _name(self, m: Module | None, offset: int, depth: int) -> NativeFrame:
        if m is None:
            return NativeFrame("[unknown]", None, offset)
        # A caller's frame holds its return address: the call lies just before it.
        fn = self.modules.symbols(m).function_at(offset - 1 if depth else offset)
        return NativeFrame(m.name, fn, offset, self.modules.build_id(m))

    def stacks(self, keys: Iterable[int]) -> dict[int, Stack]:
        """The named frames of these stacks (those this table has)."""
        out: dict[int, Stack] = {}
        with self._lock:
            for k in keys:
                s = self.stack(k)
                if s is not None:
                    out[k] = s
        return out


UNNAMED_PYTHON = PythonFrame("[python]", "", None)


def merge(native: list[NativeFrame], py: tuple[tuple[PythonFrame | None, bool], ...]) -> tuple[Frame, ...]:
    """One stack, innermost first: each of the interpreter's evaluation
    frames gives way to the Python frames it ran (up to and including an
    entry frame); Python frames the native walk did not reach (it stopped
    short: no frame pointers) follow the native frames."""
    groups: list[list[PythonFrame]] = []
    cur: list[PythonFrame] = []
    for frame, entry in py:
        cur.append(frame if frame is not None else UNNAMED_PYTHON)
        if entry:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    out: list[Frame] = []
    g = 0
    for f in native:
        if f.function in EVAL_FUNCTIONS and g < len(groups):
            out.extend(groups[g])
            g += 1
        else:
            out.append(f)
    for rest in groups[g:]:
        out.extend(rest)
    return tuple(out)
