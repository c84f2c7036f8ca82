"""The CUDA sensor: load memtrace's object, attach probes to CUDA
libraries, drain its rings, and tell the agent what it saw as typed
notices (core/notices.py), in the order the model must take them.

Everything that touches the kernel for CUDA lives in this package: the
probes a library gets (probes.py), the control thread (control.py), the
holds (holds.py), the launch links (launches.py) and the maps (maps.py).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memtrace.bpf.detach import destroy_links
from memtrace.bpf.host import check_kernel, ensure_tracefs, object_path, pid_namespace
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, destroy_together, uprobe_multi_supported
from memtrace.bpf.ringbuf import EventRing
from memtrace.core import apis
from memtrace.core.abi import (
    ATTACHED_EXECUTABLE,
    ATTACHED_LIBRARY,
    ATTACHED_OTHER,
    ATTACHED_PER_PROCESS,
    EVENT_DTYPE,
    CtlEvent,
    CtlType,
    Family,
    HoldState,
    InodeKey,
    Layer,
)
from memtrace.core.errors import AttachError, MemtraceError
from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.notices import Events, Exited, Held, Launches, LaunchesMissed, Missed, Notice, ProcessMet
from memtrace.core.overhead import EntryKind
from memtrace.core.procfiles import Candidate, FileId, alive, executable, pids
from memtrace.sensors.cuda import discovery
from memtrace.sensors.cuda.control import ControlThread
from memtrace.sensors.cuda.holds import HELD_MAP, HOLD_LIMIT_S, Guardian, refresh, release, release_all
from memtrace.sensors.cuda.launches import LAUNCH_PROGRAM, LaunchLinks, LaunchTarget
from memtrace.sensors.cuda.maps import KernelMaps
from memtrace.sensors.cuda.probes import LAUNCH_RETURN, UPROBE_PROGRAMS, Attachment, plan_file

log = logging.getLogger("memtrace")

DEFAULT_RING_BYTES = 16 << 20


@dataclass(frozen=True)
class Options:
    only_traced: bool = False  # `memtrace run`: only processes added with trace_pid and their children
    ring_bytes: int = DEFAULT_RING_BYTES
    hold_libraries: bool = True
    hold_nccl: bool = False  # hold a process mapping a new libnccl too, for Hooks.other_library
    hold_limit_s: float = HOLD_LIMIT_S  # the longest a process is held, whatever the agent does
    stacks: bool = False  # take the caller's stack at copies and allocations (core/stacks.py)
    # Each launch of a process whose launches are all probed is also a record (a
    # timeline's slice: `run --timeline`); off, a launch is a trap and a counter.
    launch_events: bool = False


# Per api id: a launch (its records go to the timeline, not the model).
_LAUNCH = np.zeros(1 << 16, bool)
for _a in apis.APIS:
    _LAUNCH[_a.id] = _a.family == Family.LAUNCH


def _nothing(_notices: list[Notice]) -> None:
    pass


@dataclass(frozen=True)
class Hooks:
    """What the sensor tells its owner, given at construction.

    `notices`: every fact for the model, in the order it must take them (one
    call per poll, on the polling thread). The others run on the control
    thread, or in scan(), while a held process is still stopped:
    `library_attached` once per file given probes; `process_seen` when a
    process is stopped at a CUDA library, or makes its first traced call;
    `other_library` for another sensor's library a process was stopped
    for (libnccl, with Options.hold_nccl): (process, the file, held?) -> True
    once that sensor has it. `identify`: what the host says of a process
    (sources/procfs.read_process), read while it is held at its CUDA
    library and again at its first traced call: a process that exits
    before the fold still has its executable, container and job."""

    notices: Callable[[list[Notice]], None] = _nothing
    library_attached: Callable[[Attachment], None] | None = None
    process_seen: Callable[[ProcessKey], None] | None = None
    other_library: Callable[[ProcessKey, Candidate, bool], bool] | None = None
    identify: Callable[[ProcessKey], ProcessInfo] | None = None


class CudaSensor:
    """Owns the loaded object, its links and the attached libraries."""

    name = "cuda"

    def __init__(self, opts: Options, hooks: Hooks = Hooks()) -> None:
        self.opts = opts
        self.hooks = hooks
        # Attaching runs on the control thread and in scan(): one at a time.
        self._attach_lock = threading.RLock()
        # Notices from the control thread, handed on by poll() in order with the
        # events: a process's introduction before its events, its exit after them.
        self._notices: list[Notice] = []
        self._notices_lock = threading.Lock()
        self.holds_expired = 0  # holds the guardian ended at the limit before the probes were in
        self.not_held = 0  # processes that mapped a new CUDA library and were not held
        self.attachments: dict[FileId, Attachment] = {}
        self._checked_executables: set[FileId] = set()
        self._links: list[Link] = []
        self.obj: BpfObject | None = None
        self.maps: KernelMaps | None = None
        self.multi = False  # multi-uprobe links (one per program and file), not one per symbol
        self.control: ControlThread | None = None
        self.events: EventRing | None = None  # the events ring (batched reads)
        self.guardian: Guardian | None = None
        self.launch_links: LaunchLinks | None = None
        self.started_ns = time.time_ns()

    # ---- lifecycle ----

    def start(self) -> None:
        check_kernel()
        lib = Libbpf.get()
        path = object_path()
        if self.opts.hold_libraries:
            ensure_tracefs()
        obj = BpfObject(path, lib)
        self.obj = obj
        ns_dev, ns_ino = pid_namespace()
        obj.set_rodata(
            {
                "filter_pids": self.opts.only_traced,
                "hold_libraries": self.opts.hold_libraries,
                "hold_nccl": self.opts.hold_libraries and self.opts.hold_nccl,
                "agent_tgid": os.getpid(),
                "pidns_dev": ns_dev,
                "pidns_ino": ns_ino,
                "capture_stacks": self.opts.stacks,
                "launch_events": self.opts.launch_events,
            },
        )
        obj.set_max_entries("events", self.opts.ring_bytes)
        if not self.opts.hold_libraries:
            obj.set_autoload("mt_mmap", False)
        # One link per program and library where the kernel has multi-uprobes
        # (6.6+): attached and removed at once, not a hundred probes one by one.
        self.multi = uprobe_multi_supported()
        if self.multi:
            for prog in UPROBE_PROGRAMS:
                obj.load_for_uprobe_multi(prog)
        obj.load()
        maps = self.maps = KernelMaps(obj)
        # Launch probes per process, for the overhead budget: multi-uprobe links only
        # (single ones take ~0.1-1 s each to attach or detach).
        if self.multi:
            self.launch_links = LaunchLinks(
                obj, maps.by_name, self._scope, lambda fid: self._mark(fid, ATTACHED_PER_PROCESS)
            )
        # Fork the guardian before any link exists, so it never inherits one.
        self.guardian = Guardian(maps[HELD_MAP], self.opts.hold_limit_s)
        progs = ["mt_fork", "mt_exit"]
        if self.opts.hold_libraries:
            progs.append("mt_mmap")
        for p in progs:
            self._links.append(obj.attach(p))
        self.events = EventRing(obj.map("events").fd, self.opts.ring_bytes, EVENT_DTYPE)
        self.control = ControlThread(lib, obj.map("ctl_events"), self._on_control)
        self.control.start()

    def close(self) -> None:
        # The tracepoints first (three, removed here and now): once mt_mmap is
        # gone no process can be held any more, and every held one is continued.
        destroy_together(self._links)
        self._links.clear()
        if self.control is not None:
            self.control.stop()
        if self.maps is not None and self.obj is not None and self.obj.loaded:
            release_all(self.maps[HELD_MAP], self.opts.hold_limit_s)
        own = self.launch_links.close() if self.launch_links is not None else []
        destroy_links(own + [link for a in self.attachments.values() for link in a.links])
        for a in self.attachments.values():
            a.links.clear()
            if a.launch is not None:
                a.launch.close()
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.events:
            self.events.close()
            self.events = None
        if self.guardian:
            self.guardian.close()
            self.guardian = None
        self.maps = None
        if self.obj:
            self.obj.close()
            self.obj = None

    # ---- processes and libraries ----

    def _scope(self) -> list[int]:
        """The pids this agent traces now: `run`'s (the `traced` map), or the host's."""
        assert self.maps is not None
        if self.opts.only_traced:
            return self.maps.traced_pids()
        return list(pids())

    def trace_pid(self, pid: int) -> None:
        """Trace this process and the children it forks from now on (with Options.only_traced)."""
        assert self.maps is not None
        self.maps.trace_pid(pid)

    def launches_timed(self, pid: int) -> bool:
        """Whether a process's launches each take a return trap too: a timeline is
        recorded (Options.launch_events) and a library it maps still has its launches'
        return probe (launches_per_process takes it away: a sampled launch has no slice)."""
        if not self.opts.launch_events:
            return False
        timed = {fid for fid, att in dict(self.attachments).items() if att.launch_return_link is not None}
        return bool(timed) and any(c.fid in timed for c in discovery.mapped_libraries(pid))

    def launches_per_process(self, fid: FileId) -> int:
        """Put a library's launch probes in per-process mode (the budget's
        lever, sensors/cuda/launches.py). Returns the processes linked."""
        with self._attach_lock:
            att = self.attachments.get(fid)
            if att is None or att.launch is None or self.launch_links is None:
                return 0
            wide, att.launch_link = att.launch_link, None
            if wide is not None:
                att.links.remove(wide)
            # A sampled launch has no slice: the timeline's return probes go with the wide link.
            timed, att.launch_return_link = att.launch_return_link, None
            if timed is not None:
                att.links.remove(timed)
            linked = self.launch_links.go_per_process(att.launch, wide)
            if timed is not None:
                destroy_links([timed])
            return linked

    def scan(self, pids_: list[int] | None = None) -> None:
        """Attach to the CUDA libraries already mapped by running processes.
        (One attachment at a time holds the lock, so a held process's
        attachment on the control thread waits for one, not for the scan.)"""
        for pid in pids_ if pids_ is not None else list(pids()):
            found_driver = False
            for cand in discovery.mapped_libraries(pid):
                self.attach(cand)
                found_driver |= cand.layer == Layer.DRIVER
            if found_driver:
                exe = executable(pid)
                if exe:
                    self.check_executable(exe)

    def check_executable(self, exe: Candidate) -> None:
        """Attach runtime probes to an executable with a statically linked cudart."""
        with self._attach_lock:
            if exe.fid in self._checked_executables or exe.fid in self.attachments:
                return
            try:
                self.attach(exe)
            finally:
                self._checked_executables.add(exe.fid)
                self._mark(exe.fid, ATTACHED_EXECUTABLE)

    def _mark(self, fid: FileId, value: int) -> None:
        assert self.maps is not None
        try:
            self.maps["attached"].update(InodeKey(fid.dev, fid.ino), ctypes.c_uint8(value))
        except OSError as e:  # full: the process is held each time, still correct
            log.debug("attached map: %s", e)

    def attach(self, cand: Candidate) -> Attachment | None:
        with self._attach_lock:
            return self._attach(cand)

    def entry_kinds(self) -> tuple[set[EntryKind], set[EntryKind]]:
        """The entry kinds of every probe attached so far: launch probes', and the others'."""
        launch: set[EntryKind] = set()
        other: set[EntryKind] = set()
        for att in list(self.attachments.values()):
            launch |= att.launch_kinds
            other |= att.other_kinds
        return launch, other

    def _attach(self, cand: Candidate) -> Attachment | None:
        if cand.fid in self.attachments:
            return self.attachments[cand.fid]
        layer = cand.layer if cand.layer is not None else Layer.RUNTIME
        try:
            filed = plan_file(cand.path, layer)
        except OSError as e:
            log.warning("cannot read %s (pid %d): %s", cand.name, cand.pid, e)
            return None
        plan = filed.probes
        if not plan:
            if cand.layer is not None:
                log.warning("%s exports none of the CUDA symbols memtrace probes; not attached", cand.name)
            return None
        att = Attachment(
            cand.fid,
            cand.name,
            layer,
            {p.symbol: p.offset for p in plan},
            launch_kinds=frozenset(p.kind for p in plan if not p.needs_return),
            other_kinds=frozenset(p.kind for p in plan if p.needs_return),
            simulated=filed.simulated,
        )
        assert self.obj is not None
        try:
            if self.multi:
                # Returns before entries: a call entered between the two has no
                # entry to return to and is not counted; the other way round it
                # would be an entry without a return (unreturned_calls).
                order = (("mt_return", True), ("mt_enter", False), (LAUNCH_RETURN, True), (LAUNCH_PROGRAM, False))
                for prog, ret in order:
                    mine = [p for p in plan if (prog, ret) in p.programs_for(self.opts.launch_events)]
                    if mine:
                        offsets, cookies = [p.offset for p in mine], [p.cookie for p in mine]
                        if prog == LAUNCH_PROGRAM and self.launch_links is not None:
                            att.launch = LaunchTarget.open(cand.path, cand.fid, cand.name, offsets, cookies)
                        att.links.append(self.obj.attach_uprobe_multi(prog, cand.path, offsets, cookies, ret))
                        if prog == LAUNCH_PROGRAM:
                            att.launch_link = att.links[-1]
                        elif prog == LAUNCH_RETURN:
                            att.launch_return_link = att.links[-1]
                        self._progress()
            else:
                for p in plan:
                    for prog, ret in p.programs_for(self.opts.launch_events):
                        att.links.append(self.obj.attach_uprobe(prog, cand.path, p.offset, p.cookie, ret))
                        self._progress()
        except (AttachError, OSError) as e:
            att.close()
            why = e.message if isinstance(e, AttachError) else str(e)
            log.warning("%s (pid %d) vanished while attaching: %s", cand.name, cand.pid, why)
            return None
        att.link_count = len(att.links)
        self.attachments[cand.fid] = att
        self._mark(cand.fid, ATTACHED_LIBRARY)
        log.info("attached %d %s probes to %s", len(plan), layer.label, cand.name)
        if self.hooks.library_attached is not None:
            self.hooks.library_attached(att)
        return att

    # ---- draining ----

    @property
    def malformed(self) -> int:
        """Ring records of the wrong size or type, skipped and counted."""
        ctl = self.control.malformed if self.control is not None else 0
        return ctl + (self.events.malformed if self.events else 0)

    def poll(self, events: bool = True) -> int:
        """Drain the events ring and hand it on with the control thread's
        notices, in order: who a process is and whether it was held first
        (its events are in the ring behind those notices), its events, then
        exits (every event of an exited process is in the ring before its
        exit notice). Returns the events read. With `events` False the
        events ring is left unread (its reader is behind): notices still go."""
        with self._notices_lock:
            notices, self._notices = self._notices, []
        out: list[Notice] = [n for n in notices if not isinstance(n, Exited)]
        n = 0
        if events:
            assert self.events is not None
            batch = self.events.read()
            n = len(batch)
            if n and self.opts.launch_events:
                launch = _LAUNCH[batch["api"]]
                if launch.any():
                    out.append(Launches(batch[launch]))
                    batch = batch[~launch]
            if len(batch):
                out.append(Events(batch))
        out += [x for x in notices if isinstance(x, Exited)]
        if out:
            self.hooks.notices(out)
        return n

    # ---- the control ring ----

    def control_watch(self) -> tuple[int, int, int] | None:
        """For a watcher of the control ring (Agent.guard_ring); None before start()."""
        return self.control.watch() if self.control is not None else None

    def set_control_quiet(self, seconds: float) -> None:
        if self.control is not None:
            self.control.set_quiet(seconds)

    def read_control_now(self) -> None:
        """Act on every control record in the ring now (a last drain before a report)."""
        if self.control is not None:
            self.control.read_now()

    def _progress(self) -> None:
        """Attaching goes on: every process this agent holds stays held (the
        limit runs from the agent's last progress). An attachment can wait
        seconds behind other tools' uprobe removals in the kernel; the limit
        bounds a stopped or stuck agent, not a slow kernel."""
        assert self.maps is not None
        held = self.maps[HELD_MAP]
        for host_pid in list(held.keys(ctypes.c_uint32)):  # queued holds wait behind this one
            refresh(held, host_pid.value)

    def _notice(self, notice: Notice) -> None:
        with self._notices_lock:
            self._notices.append(notice)

    def _on_control(self, ev: CtlEvent) -> None:
        try:
            self._handle(ev)
        except Exception:  # pragma: no cover - never leave a hold to the limit for a bug
            log.exception("control event for pid %d", ev.pid)
            if ev.type == CtlType.MAP and ev.held == HoldState.HELD and self.maps is not None:
                release(self.maps[HELD_MAP], ev.host_pid, self.opts.hold_limit_s)

    def _handle(self, ev: CtlEvent) -> None:
        key = ProcessKey(ev.pid, ev.start_ns)
        if ev.type == CtlType.EXIT:
            self._notice(Exited(key, ev.cpu_ns))
            return
        if ev.type == CtlType.PROC:
            self._notice(ProcessMet(key, ev.comm.decode(errors="replace"), ev.cgroup_id, self._identify(key)))
            if self.hooks.process_seen is not None:
                self.hooks.process_seen(key)
            if self.launch_links is not None and self.launch_links.adopt(ev.pid):
                self._notice(LaunchesMissed(key))  # it may have launched before its own link
            return
        assert self.maps is not None
        held = ev.held == HoldState.HELD
        cuda = True  # a CUDA library's hold: the model hears whether the process was held
        only_launches = False  # its library had probes: only its own launch link was missing
        try:
            opened = discovery.opened_file(ev.pid, ev.fd)
            cuda = not self._other_library(key, opened, held)
            only_launches = (
                opened is not None
                and self.launch_links is not None
                and self.launch_links.per_process(opened.fid)
                and self._exe_known(ev.pid)
            )
            self._attach_mapped(ev.pid, opened)
            if self.hooks.process_seen is not None:
                self.hooks.process_seen(key)
        except MemtraceError as e:
            log.warning("pid %d: %s", ev.pid, e)
        finally:
            if held:
                if cuda:  # nothing of it ran before its probes; it is surely there to be read
                    self._notice(Held(key, self._identify(key)))
                rel = release(self.maps[HELD_MAP], ev.host_pid, self.opts.hold_limit_s)
                if rel.expired and alive(ev.pid):
                    self.holds_expired += 1
                    if cuda:
                        self._notice(Missed(key))
                    log.warning(
                        "pid %d ran on before its %s library was attached (hold limit %g s): "
                        "its first calls may be missing",
                        ev.pid,
                        "CUDA" if cuda else "NCCL",
                        self.opts.hold_limit_s,
                    )
            elif only_launches:
                self._notice(LaunchesMissed(key))
            elif cuda:
                self.not_held += 1
                self._notice(Missed(key))

    def _identify(self, key: ProcessKey) -> ProcessInfo | None:
        return self.hooks.identify(key) if self.hooks.identify is not None else None

    def _exe_known(self, pid: int) -> bool:
        exe = executable(pid)
        return exe is not None and (exe.fid in self._checked_executables or exe.fid in self.attachments)

    def _other_library(self, key: ProcessKey, cand: Candidate | None, held: bool) -> bool:
        """Hand a mapped file that is not CUDA's (libnccl) to the sensor that
        asked for it; marked known once handled, so its next mappings run
        on. True: it was such a file (whether or not a sensor took it)."""
        if cand is None or cand.layer is not None:
            return False
        if self.hooks.other_library is None:
            return True
        try:
            handled = self.hooks.other_library(key, cand, held)
        except Exception as e:  # noqa: BLE001 - another sensor's failure must not keep the process stopped
            log.warning("pid %d: %s not attached: %s: %s", key.pid, cand.name, type(e).__name__, e)
            return True
        if handled:
            self._mark(cand.fid, ATTACHED_OTHER)
        return True

    def _attach_mapped(self, pid: int, cand: Candidate | None) -> None:
        """Attach the library a MAP notice names, and check the executable.

        Through the process's descriptor while it is still open (`cand`);
        when it is gone (the loader closes it once mapped, and a process not
        held runs on) through the mapping itself (/proc/PID/map_files),
        which we open ourselves."""
        with self._attach_lock:
            if cand is not None and cand.layer is not None:
                if self.attach(cand) is None:
                    cand = None
                elif self.launch_links is not None:
                    self.launch_links.mapped(pid, cand.fid)
            if cand is None or cand.layer is None:
                for c in discovery.mapped_libraries(pid):
                    if self.attach(c) is not None and self.launch_links is not None:
                        self.launch_links.mapped(pid, c.fid)
            exe = executable(pid)
            if exe is not None:
                self.check_executable(exe)
