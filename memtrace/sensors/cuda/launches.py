"""Launch probes per process: the lever the overhead budget pulls.

Launches are the hottest CUDA calls and the only ones whose exact count is
not needed for exact bytes. A library's launch probes start as one link
for every process (exact, as every other probe). When a process goes over
its budget, the library is put in per-process mode:

1. `attached` says PER_PROCESS: from then on a process that maps the
   library without its own launch link is held like one mapping a new
   library (bpf/memtrace.bpf.c mt_mmap), and linked before it runs on;
2. every process mapping it now gets its own link, pid-filtered (the
   kernel writes the breakpoints into that process's memory alone: another
   process calling the same function takes no trap), and `launch_own`
   moves the counting of its launches from the library-wide link to it;
3. the library-wide launch link goes.

A process's own links can then be detached and attached again (the duty
cycle, runtime/budget.py) without blinding any other process. With
multi-uprobe links (Linux 6.6+) attaching or detaching one takes
milliseconds (docs/design/evidence.md#launch-links), in the agent's time,
not the process's. Without them (single uprobes, a tenth of a second or
more each) the budget is not kept: reported only.

A process the budget samples from its first weighing is linked with its
links detached (`link_off`): its first gap begins as the library-wide link
goes, with no attach and detach of its own in between. Links are detached
on a thread of their own: the kernel takes the breakpoints out at once and
then waits out grace periods (tens of ms), which the budget's thread, due
to close another process's window meanwhile, must not wait for.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from memtrace.bpf.libbpf import BpfObject, Link, Map
from memtrace.core.abi import CK_OWN_SHIFT, InodeKey, LaunchLib, LaunchSample
from memtrace.core.errors import AttachError
from memtrace.core.procfiles import FileId
from memtrace.core.threads import thread
from memtrace.sensors.cuda import discovery

log = logging.getLogger("memtrace")

LAUNCH_PROGRAM = "mt_launch"


@dataclass
class LaunchTarget:
    """A library's launch probes: where to attach a process's own link."""

    fid: FileId
    name: str
    offsets: tuple[int, ...]
    cookies: tuple[int, ...]  # the library-wide link's; own links add the OWN bit
    fd: int = -1  # the file, held open by the agent: the process it was found in may be gone

    @classmethod
    def open(cls, path: str, fid: FileId, name: str, offsets: list[int], cookies: list[int]) -> LaunchTarget:
        """Keep the file open (through the path it was attached by, which
        lasts only as long as the process it names)."""
        return cls(fid, name, tuple(offsets), tuple(cookies), os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class _Own:
    """One process's own launch links, one per library in per-process mode."""

    start_ticks: int
    libs: set[FileId] = field(default_factory=set)
    links: dict[FileId, Link] = field(default_factory=dict)
    on: bool = True  # the duty cycle's state: its links attached


def start_ticks(pid: int) -> int:
    """The process's start in clock ticks (/proc/PID/stat), -1 if it is gone:
    a pid read twice with the same start is the same process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


class LaunchLinks:
    """Each process's own launch links, for the libraries in per-process mode.

    Called from the control thread (a process held on a mapping: `mapped`)
    and from the budget's thread (everything else); one lock."""

    def __init__(
        self,
        obj: BpfObject,
        maps: dict[str, Map],
        scope: Callable[[], Iterable[int]],
        mark_per_process: Callable[[FileId], None],
    ) -> None:
        self.obj = obj
        self.own_map = maps["launch_own"]
        self.linked_map = maps["launch_linked"]
        self.window_map = maps["launch_window"]
        self.sampling_map = maps["launch_sampling"]  # 1 once any process has its own links
        self._sampling = False
        self.scope = scope  # the pids this agent traces (all of the host's, or `run`'s)
        self.mark_per_process = mark_per_process
        self.targets: dict[FileId, LaunchTarget] = {}  # libraries in per-process mode
        self._procs: dict[int, _Own] = {}
        self._lock = threading.RLock()
        self._off: set[int] = set()  # to be linked with their links detached (link_off)
        self.linked_late = 0  # processes given their own links after they may have launched

    # ---- libraries ----

    def per_process(self, fid: FileId) -> bool:
        return fid in self.targets

    def go_per_process(self, target: LaunchTarget, library_wide: Link | None) -> int:
        """Put a library in per-process mode (see the module's doc); returns
        the processes linked. `library_wide`: its link for every process,
        destroyed once each process that maps the library has its own."""
        with self._lock:
            if target.fid in self.targets:
                return 0
            self.targets[target.fid] = target
            self.mark_per_process(target.fid)  # new mappings are held from here on
            linked = 0
            for pid in list(self.scope()):
                if pid == os.getpid():
                    continue
                if any(c.fid == target.fid for c in discovery.mapped_libraries(pid)):
                    linked += self._link(pid, target)
        if library_wide is not None:
            detach([library_wide])
        log.info("%s: launch probes per process now (%d processes linked)", target.name, linked)
        return linked

    # ---- processes ----

    def mapped(self, pid: int, fid: FileId) -> bool:
        """A process mapped a library (held on it, or noticed): give it its
        own launch link if the library is in per-process mode. True if it
        was linked now."""
        with self._lock:
            target = self.targets.get(fid)
            if target is None:
                return False
            return self._link(pid, target) > 0

    def adopt(self, pid: int) -> bool:
        """A process noticed at its first traced call (a child forked from a
        process that had mapped the library: no mapping of its own to hold
        it on). Links it to every library in per-process mode it maps; True
        if it had none yet: launches it made before now were not counted."""
        with self._lock:
            if not self.targets or pid in self._procs:
                return False
            mapped = {c.fid for c in discovery.mapped_libraries(pid)}
            made = sum(self._link(pid, t) for fid, t in self.targets.items() if fid in mapped)
            if made:
                self.linked_late += 1
            return made > 0

    def link_off(self, pid: int, off: bool) -> None:
        """Link this process with its links detached when it is linked next
        (going per process, or adopted): the budget samples it from a gap.
        False: as usual again (it was not linked)."""
        with self._lock:
            if off:
                self._off.add(pid)
            else:
                self._off.discard(pid)

    def has_own(self, pid: int) -> bool:
        with self._lock:
            return pid in self._procs

    def is_on(self, pid: int) -> bool:
        """Its own links are attached (the duty cycle's window is open, or it is not sampled)."""
        with self._lock:
            own = self._procs.get(pid)
            return own is not None and own.on

    def set_on(self, pid: int, on: bool) -> bool:
        """Open (attach its own launch links, then open the window BPF
        counts launch intervals in) or close (the window, then detach) a
        process's launch window: the duty cycle. False if the process has
        no own links (or is gone), or one could not be attached: then no
        window opens (BPF would count its exact calls' intervals with
        launches no link counted)."""
        pid32 = ctypes.c_uint32(pid)
        with self._lock:
            own = self._procs.get(pid)
            if own is None:
                return False
            if on:
                if not own.on:
                    made: dict[FileId, Link] = {}
                    for fid in own.libs:
                        link = self._attach(pid, self.targets[fid])
                        if link is None:
                            detach(list(made.values()))
                            return False
                        made[fid] = link
                    own.on = True
                    own.links.update(made)
                self.window_map.update(pid32, ctypes.c_uint8(1))
                return True
            self.window_map.delete(pid32)
            if not own.on:
                return True
            own.on = False
            links, own.links = list(own.links.values()), {}
        detach(links)
        return True

    def sample(self, pid: int) -> tuple[int, int]:
        """Launches in complete intervals between exact calls made while
        its window was open, and those intervals (struct mt_launch_sample)."""
        v = LaunchSample()
        if not self.own_map.lookup(ctypes.c_uint32(pid), v):
            return 0, 0
        return v.launches, v.calls

    def exited(self, pid: int, ticks: int) -> None:
        """The process `pid` that started at `ticks` is gone: its links and
        its `launch_linked` entries go (BPF deleted its `launch_own` at the
        exit)."""
        with self._lock:
            own = self._procs.get(pid)
            if own is None or own.start_ticks != ticks:
                return  # not linked, or a later process of that pid
            del self._procs[pid]
            self._off.discard(pid)
        for fid in own.libs:
            self.linked_map.delete(LaunchLib(pid, 0, _inode(fid)))
        detach(list(own.links.values()))

    def close(self) -> list[Link]:
        """Forget every process's own links and return them, for the caller
        to destroy with the rest (at once: a hundred processes' links, ~30 ms
        each to remove, must not hold an agent's exit)."""
        with self._lock:
            procs, self._procs = self._procs, {}
        for t in self.targets.values():
            t.close()
        return [link for own in procs.values() for link in own.links.values()]

    # ---- the kernel's side ----

    def _attach(self, pid: int, target: LaunchTarget) -> Link | None:
        cookies = [c | (1 << CK_OWN_SHIFT) for c in target.cookies]
        try:
            return self.obj.attach_uprobe_multi(
                LAUNCH_PROGRAM, target.path, list(target.offsets), cookies, False, pid=pid
            )
        except AttachError as e:  # gone, or the library with it
            log.debug("pid %d: own launch link to %s: %s", pid, target.name, e.message)
            return None

    def _link(self, pid: int, target: LaunchTarget) -> int:
        """Give a process its own link to a library: the link (its program
        skips the process until `launch_own` says otherwise), then the maps.
        1 if linked now, 0 if it was already or is gone."""
        ticks = start_ticks(pid)
        if ticks < 0:
            return 0
        own = self._procs.get(pid)
        if own is not None and own.start_ticks != ticks:  # a process of that pid that is gone
            self._procs.pop(pid)
            detach(list(own.links.values()))
            own = None
        if own is not None and target.fid in own.libs:
            return 0
        if not self._sampling:  # before the first own link: BPF looks at launch_own from now on
            self.sampling_map.update(ctypes.c_uint32(0), ctypes.c_uint32(1))
            self._sampling = True
        on = own.on if own is not None else pid not in self._off
        link = self._attach(pid, target) if on else None
        if link is None and on:
            return 0
        pid32 = ctypes.c_uint32(pid)
        self.linked_map.update(LaunchLib(pid, 0, _inode(target.fid)), ctypes.c_uint8(1))
        if own is None:
            self.own_map.update(pid32, LaunchSample())
        if start_ticks(pid) != ticks:  # exited meanwhile: a reused pid must not find these
            if own is None:
                self.own_map.delete(pid32)
            self.linked_map.delete(LaunchLib(pid, 0, _inode(target.fid)))
            if link is not None:
                link.destroy()
            return 0
        if own is None:
            own = self._procs[pid] = _Own(ticks, on=on)
            self._off.discard(pid)
        own.libs.add(target.fid)
        if link is not None:
            own.links[target.fid] = link
        return 1


def _inode(fid: FileId) -> InodeKey:
    return InodeKey(fid.dev, fid.ino)


def detach(links: list[Link]) -> None:
    """Destroy links on a thread of their own (see the module's doc)."""

    def destroy() -> None:
        for link in links:
            link.destroy()

    if links:
        thread(destroy, "memtrace-detach").start()
