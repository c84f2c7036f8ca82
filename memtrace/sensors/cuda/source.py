"""The BPF source: load memtrace's object, attach probes to CUDA libraries,
drain its rings, read its maps.

Everything that touches the kernel lives here; the model above it sees
decoded event batches, control notices and totals.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from memtrace.bpf.host import check_kernel, ensure_tracefs, object_path
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, RingBuffer, destroy_together, uprobe_multi_supported
from memtrace.bpf.ringbuf import EventRing, RingPositions
from memtrace.core import apis
from memtrace.core.abi import (
    ATTACHED_EXECUTABLE,
    ATTACHED_LIBRARY,
    ATTACHED_OTHER,
    ATTACHED_PER_PROCESS,
    EVENT_DTYPE,
    STAT_COUNT,
    TRAPS_API,
    CtlEvent,
    CtlType,
    Family,
    HoldState,
    InodeKey,
    Layer,
    PyCode,
    PyCodeKey,
    PyProc,
    Stack,
    Stat,
    Totals,
    TotalsKey,
)
from memtrace.core.errors import AttachError, MemtraceError, ProcMismatch
from memtrace.core.ids import ProcessKey
from memtrace.core.overhead import EntryKind, entry_kind
from memtrace.core.threads import thread
from memtrace.sensors.cuda import discovery, elf
from memtrace.sensors.cuda.holds import HELD_MAP, HOLD_LIMIT_S, Guardian, refresh, release, release_all
from memtrace.sensors.cuda.launches import LAUNCH_PROGRAM, LaunchLinks, LaunchTarget

log = logging.getLogger("memtrace")

DEFAULT_RING_BYTES = 16 << 20
CONTROL_QUIET_S = 0.1  # the longest a process notice waits for the control thread, unwatched
LAUNCH_APIS = tuple(a.id for a in apis.APIS if a.family == Family.LAUNCH)


@dataclass(frozen=True)
class Probe:
    symbol: str
    offset: int  # file offset of the function
    cookie: int
    needs_return: bool = True
    kind: EntryKind = EntryKind.STEPPED  # how the kernel runs its first instruction: what a trap costs

    @property
    def programs(self) -> tuple[tuple[str, bool], ...]:
        """(program, is return probe) pairs to attach at this offset."""
        if self.needs_return:
            return (("mt_enter", False), ("mt_return", True))
        return (("mt_launch", False),)


def probe_plan(path: str, layer: Layer) -> list[Probe]:
    """The probes for one file: each probed symbol of `layer` it defines, one
    per code address (aliases of one function would count a call twice)."""
    table = apis.apis_for(layer)
    machine = os.uname().machine
    with open(path, "rb") as f:
        offsets = elf.function_offsets(f, table)
        by_offset: dict[int, str] = {}
        for sym in sorted(offsets, key=lambda s: (table[s].id, s != table[s].name, s)):
            by_offset.setdefault(offsets[sym], sym)
        kinds = {off: entry_kind(elf.code_at(f, off, 2), machine) for off in by_offset}
    return [
        Probe(sym, off, table[sym].cookie(), table[sym].needs_return, kinds[off])
        for off, sym in sorted(by_offset.items())
    ]


# The programs attached at CUDA symbols (Probe.programs); loaded for
# multi-uprobe links where the kernel has them.
UPROBE_PROGRAMS = ("mt_enter", "mt_return", "mt_launch")


@dataclass
class Attachment:
    """One file with probes: a CUDA library, or an executable with a static runtime."""

    fid: discovery.FileId
    name: str
    layer: Layer
    symbols: dict[str, int]  # symbol -> file offset, one per distinct offset
    links: list[Link] = field(default_factory=list)
    link_count: int = 0  # kernel links made: one per probe and program, or one per program (multi-uprobes)
    # Its launch probes (multi-uprobes only): the link for every process, and
    # what a process's own link needs (sensors/cuda/launches.py).
    launch_link: Link | None = None
    launch: LaunchTarget | None = None
    # Its probes' entry kinds (what a trap costs): launch probes, and the others.
    launch_kinds: frozenset[EntryKind] = frozenset()
    other_kinds: frozenset[EntryKind] = frozenset()

    def close(self) -> None:
        destroy_links(self.links)
        self.links.clear()
        if self.launch is not None:
            self.launch.close()


# Benchmarks that attach and detach in a loop turn this off: they must not
# measure the next round with the last round's probes still going away.
DETACH_IN_BACKGROUND = True


def destroy_links(links: list[Link]) -> None:
    """Detach many uprobes without making the caller wait for the kernel.

    Removing a uprobe waits out the kernel's tracepoint grace periods, one
    probe at a time (~0.1 s each, serialised by the kernel): a hundred probes
    kept `memtrace run` from exiting for 13 s after its command ended. So a
    detached grandchild holds a reference to every probe while this process
    drops its own (each at once), then exits and leaves the slow part to the
    kernel, in the background: the uprobes go away within seconds of the
    agent, and until then they only feed a ring nobody reads. (Never used
    for the mmap tracepoint: it could hold a process nobody continues.)"""
    if len(links) < 8 or not DETACH_IN_BACKGROUND:
        # A few links (multi-uprobe ones: every probe of a library in one) go
        # here and now, so that no breakpoint outlives the run, together.
        destroy_together(links)
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            if os.fork() == 0:
                os.close(w)
                _keep_only_bpf_fds(r)
                os.read(r, 1)  # until the agent has dropped its references
        finally:
            os._exit(0)
    os.close(r)
    os.waitpid(pid, 0)
    try:
        for link in links:
            link.destroy()  # the grandchild's reference keeps the removal off this path
    finally:
        os.close(w)


def _keep_only_bpf_fds(keep: int) -> None:  # pragma: no cover - runs in the detaching grandchild
    """Close every inherited file but `keep` and the kernel objects (links,
    perf events, maps, programs: anonymous inodes). The grandchild lives
    for seconds while the kernel removes the probes; an inherited pipe
    (the guardian's, a shell pipeline's stdout) would keep its reader
    waiting that long: `push` took 5 s to exit on SIGINT."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == keep:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:"):
                continue
            os.close(fd)
        except OSError:
            pass  # the listing's own descriptor, gone already


@dataclass
class Options:
    only_traced: bool = False  # `memtrace run`: only processes added with trace_pid and their children
    ring_bytes: int = DEFAULT_RING_BYTES
    hold_libraries: bool = True
    hold_nccl: bool = False  # hold a process mapping a new libnccl too, for on_library_mapped
    hold_limit_s: float = HOLD_LIMIT_S  # the longest a process is held, whatever the agent does
    stacks: bool = False  # take the caller's stack at copies and allocations (core/stacks.py)


_INIT_PIDNS_INO = 0xEFFFFFFC  # PROC_PID_INIT_INO


def pid_namespace() -> tuple[int, int]:
    """(nsfs dev in the kernel's encoding, inode) of this process's pid
    namespace, or (0, 0) for the host's. Raises ProcMismatch when /proc
    belongs to another pid namespace (pids read there would be wrong)."""
    st = os.stat("/proc/self/ns/pid")
    try:
        proc_self = int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        proc_self = -1
    if proc_self != os.getpid():
        raise ProcMismatch(os.getpid(), proc_self)
    if st.st_ino == _INIT_PIDNS_INO:
        return 0, 0
    return (os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino


class BpfSource:
    """Owns the loaded object, its links and the attached libraries."""

    def __init__(
        self,
        opts: Options,
        on_events: Callable[[np.ndarray], None],
        on_exit: Callable[[ProcessKey, int], None] = lambda key, cpu_ns: None,
        on_library: Callable[[Attachment], None] = lambda a: None,
        on_held: Callable[[ProcessKey], None] = lambda key: None,
        on_missed: Callable[[ProcessKey], None] = lambda key: None,
        on_process: Callable[[ProcessKey, str, int], None] = lambda key, comm, cgroup_id: None,
    ) -> None:
        self.opts = opts
        self.on_events = on_events
        self.on_exit = on_exit
        self.on_library = on_library
        self.on_held = on_held  # held before its new library ran: nothing missed
        self.on_missed = on_missed  # not held (foreground job, hold expired): calls may have been missed
        # Its library had probes but it had no launch link of its own yet (the
        # overhead budget's per-process mode): launches, only, may have been missed.
        self.on_launches_missed: Callable[[ProcessKey], None] = lambda key: None
        # Attaching runs on the control thread and in scan(): one at a time.
        self._attach_lock = threading.RLock()
        # Process notices from the control thread, applied by poll() in order
        # with the events: (kind, process, comm, cgroup id), kind "held", "missed", "exit" or "proc".
        self._notices: list[tuple[str, ProcessKey, str, int]] = []
        self._notices_lock = threading.Lock()
        self._ctl_stop = threading.Event()
        self._ctl_thread: threading.Thread | None = None
        # Wakes the control thread: a watcher saw a record waiting (control_watch), or stop.
        self._ctl_wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ctl_positions: RingPositions | None = None
        # How long the control thread sleeps with no wakeup: records submitted without
        # one (process notices, from uprobes) wait at most this long, unless watched.
        self.control_quiet_s = CONTROL_QUIET_S

        # Another sensor's library (libnccl, with hold_nccl) that a process
        # was stopped for: (pid, the file, held?) -> True once handled. Called
        # on the control thread before the process is continued.
        self.on_library_mapped: Callable[[int, discovery.Candidate, bool], bool] | None = None
        self.holds_expired = 0  # holds the guardian ended at the limit before the probes were in
        self.not_held = 0  # processes that mapped a new CUDA library and were not held
        self.on_process = on_process  # a process's first event: (key, comm, cgroup id), from BPF
        # A process stopped on a CUDA library mapping: called on the control
        # thread while it is still stopped.
        self.on_map_notice: Callable[[ProcessKey], None] | None = None
        # Called on the control thread when a process makes its first traced call.
        self.on_proc_notice: Callable[[ProcessKey], None] | None = None
        # The kernel's `lost` and `counts` keys of each process, as read by
        # lost() and counts(): forgetting a process deletes these alone.
        self._kernel_keys: dict[ProcessKey, set[tuple[str, bytes]]] = {}
        self.attachments: dict[discovery.FileId, Attachment] = {}
        self._checked_executables: set[discovery.FileId] = set()
        self._batches: list[np.ndarray] = []
        self._ctl: list[CtlEvent] = []
        self._malformed = 0  # control records of the wrong size or type, skipped
        self._links: list[Link] = []
        self.obj: BpfObject | None = None
        self.multi = False  # multi-uprobe links (one per program and file), not one per symbol
        self.ring: RingBuffer | None = None  # the control ring (libbpf, per-record callbacks)
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
        self.maps = {
            n: obj.map(n)
            for n in (
                "lost", "counts", "stats", "traced", "attached", HELD_MAP, "inflight", "fresh", "stack_frames",
                "py_procs", "py_codes", "launch_own", "launch_linked", "launch_window", "launch_sampling",
            )
        }  # fmt: skip
        # Launch probes per process, for the overhead budget: multi-uprobe links only
        # (single ones take ~0.1-1 s each to attach or detach).
        if self.multi:
            self.launch_links = LaunchLinks(
                obj, self.maps, self._scope, lambda fid: self._mark(fid, ATTACHED_PER_PROCESS)
            )
        # Fork the guardian before any link exists, so it never inherits one.
        self.guardian = Guardian(self.maps[HELD_MAP], self.opts.hold_limit_s)
        progs = ["mt_fork", "mt_exit"]
        if self.opts.hold_libraries:
            progs.append("mt_mmap")
        for p in progs:
            self._links.append(obj.attach(p))
        self.events = EventRing(obj.map("events").fd, self.opts.ring_bytes, EVENT_DTYPE)
        self.ring = RingBuffer(lib, [(obj.map("ctl_events"), self._on_ctl)])
        self._ctl_positions = RingPositions(obj.map("ctl_events").fd)
        self._start_control()

    def close(self) -> None:
        # The tracepoints first (three, removed here and now): once mt_mmap is
        # gone no process can be held any more, and every held one is continued.
        destroy_together(self._links)
        self._links.clear()
        self._stop_control()
        if self.obj is not None and self.obj.loaded:
            release_all(self.maps[HELD_MAP], self.opts.hold_limit_s)
        own = self.launch_links.close() if self.launch_links is not None else []
        destroy_links(own + [link for a in self.attachments.values() for link in a.links])
        for a in self.attachments.values():
            a.links.clear()
            if a.launch is not None:
                a.launch.close()
        if self.ring:
            self.ring.close()
            self.ring = None
        if self._ctl_positions is not None:
            self._ctl_positions.close()
            self._ctl_positions = None
        if self.events:
            self.events.close()
            self.events = None
        if self.guardian:
            self.guardian.close()
            self.guardian = None
        if self.obj:
            self.obj.close()
            self.obj = None
        if self._ctl_wake >= 0:
            os.close(self._ctl_wake)
            self._ctl_wake = -1

    # ---- processes and libraries ----

    def _scope(self) -> list[int]:
        """The pids this agent traces now: `run`'s (the `traced` map), or the host's."""
        if self.opts.only_traced:
            return [k.value for k in self.maps["traced"].keys(ctypes.c_uint32)]
        return list(discovery.pids())

    def launches_per_process(self, fid: discovery.FileId) -> int:
        """Put a library's launch probes in per-process mode (the budget's
        lever, sensors/cuda/launches.py). Returns the processes linked."""
        with self._attach_lock:
            att = self.attachments.get(fid)
            if att is None or att.launch is None or self.launch_links is None:
                return 0
            wide, att.launch_link = att.launch_link, None
            if wide is not None:
                att.links.remove(wide)
            return self.launch_links.go_per_process(att.launch, wide)

    def trace_pid(self, pid: int) -> None:
        one = ctypes.c_uint8(1)
        self.maps["traced"].update(ctypes.c_uint32(pid), one)

    def scan(self, pids: list[int] | None = None) -> None:
        """Attach to the CUDA libraries already mapped by running processes.
        (One attachment at a time holds the lock, so a held process's
        attachment on the control thread waits for one, not for the scan.)"""
        for pid in pids if pids is not None else list(discovery.pids()):
            found_driver = False
            for cand in discovery.mapped_libraries(pid):
                self.attach(cand)
                found_driver |= cand.layer == Layer.DRIVER
            if found_driver:
                exe = discovery.executable(pid)
                if exe:
                    self.check_executable(exe)

    def check_executable(self, exe: discovery.Candidate) -> None:
        """Attach runtime probes to an executable with a statically linked cudart."""
        with self._attach_lock:
            if exe.fid in self._checked_executables or exe.fid in self.attachments:
                return
            try:
                self.attach(exe)
            finally:
                self._checked_executables.add(exe.fid)
                self._mark(exe.fid, ATTACHED_EXECUTABLE)

    def _mark(self, fid: discovery.FileId, value: int) -> None:
        try:
            self.maps["attached"].update(InodeKey(fid.dev, fid.ino), ctypes.c_uint8(value))
        except OSError as e:  # full: the process is held each time, still correct
            log.debug("attached map: %s", e)

    def attach(self, cand: discovery.Candidate) -> Attachment | None:
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

    def _attach(self, cand: discovery.Candidate) -> Attachment | None:
        if cand.fid in self.attachments:
            return self.attachments[cand.fid]
        layer = cand.layer if cand.layer is not None else Layer.RUNTIME
        try:
            plan = probe_plan(cand.path, layer)
        except OSError as e:
            log.warning("cannot read %s (pid %d): %s", cand.name, cand.pid, e)
            return None
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
        )
        assert self.obj is not None
        try:
            if self.multi:
                # Returns before entries: a call entered between the two has no
                # entry to return to and is not counted; the other way round it
                # would be an entry without a return (unreturned_calls).
                for prog, ret in (("mt_return", True), ("mt_enter", False), (LAUNCH_PROGRAM, False)):
                    mine = [p for p in plan if (prog, ret) in p.programs]
                    if mine:
                        offsets, cookies = [p.offset for p in mine], [p.cookie for p in mine]
                        if prog == LAUNCH_PROGRAM and self.launch_links is not None:
                            att.launch = LaunchTarget.open(cand.path, cand.fid, cand.name, offsets, cookies)
                        att.links.append(self.obj.attach_uprobe_multi(prog, cand.path, offsets, cookies, ret))
                        if prog == LAUNCH_PROGRAM:
                            att.launch_link = att.links[-1]
                        self._progress()
            else:
                for p in plan:
                    for prog, ret in p.programs:
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
        self.on_library(att)
        return att

    # ---- draining ----

    def _on_event(self, data: int, size: int) -> None:
        if size != EVENT_DTYPE.itemsize:
            self._malformed += 1  # one odd record must not misalign the batch
            return
        self._batches.append(np.frombuffer(ctypes.string_at(data, size), dtype=EVENT_DTYPE))

    def _on_ctl(self, data: int, size: int) -> None:
        if size != ctypes.sizeof(CtlEvent):
            self._malformed += 1
            return
        ev = CtlEvent.from_buffer_copy(ctypes.string_at(data, size))
        if ev.type not in (CtlType.MAP, CtlType.EXIT, CtlType.PROC):
            self._malformed += 1
            return
        self._ctl.append(ev)

    @property
    def malformed(self) -> int:
        """Ring records of the wrong size or type, skipped and counted."""
        return self._malformed + (self.events.malformed if self.events else 0)

    def _read_events(self) -> None:
        assert self.events is not None
        batch = self.events.read()
        if len(batch):
            self._batches.append(batch)

    def poll(self, events: bool = True) -> int:
        """Drain the events ring and apply the control thread's notices in
        order with it. Returns events seen. (Control events themselves are
        handled on the control thread, as they arrive: see _control_loop.)
        With `events` False the events ring is left unread (its reader is
        behind): notices are still applied."""
        with self._notices_lock:
            notices, self._notices = self._notices, []
        # Who a process is, and held/missed, first: the process's events are
        # in the ring behind the notice. Exits last: every event of the
        # process is in the ring before its exit notice.
        for kind, key, comm, cgroup_id in notices:
            if kind == "proc":
                self.on_process(key, comm, cgroup_id)
            elif kind == "held":
                self.on_held(key)
            elif kind == "missed":
                self.on_missed(key)
            elif kind == "launches_missed":
                self.on_launches_missed(key)
        if events:
            self._read_events()
        n = self.decode_pending()
        for kind, key, _comm, cpu_ns in notices:
            if kind == "exit":
                self.on_exit(key, cpu_ns)
        return n

    def decode_pending(self) -> int:
        """Hand the records drained so far to the model as one batch."""
        if not self._batches:
            return 0
        batches, self._batches = self._batches, []
        batch = batches[0] if len(batches) == 1 else np.concatenate(batches)
        self.on_events(batch)
        return len(batch)

    def _control_loop(self) -> None:
        """The control thread: sleeps in epoll on the control ring (whose
        records, rare, are submitted with a wakeup) and acts on each at
        once, so a held process waits for its attachment only, not for a
        drain period or the drain thread."""
        assert self.ring is not None
        epoll = self.ring.epoll_fd()
        while not self._ctl_stop.is_set():
            try:
                # Process notices come from uprobes, submitted without a wakeup
                # (a wakeup there loses later hits: field notes): read them too,
                # every control_quiet_s, or when a watcher says they wait.
                woken, _, _ = select.select([epoll, self._ctl_wake], [], [], self.control_quiet_s)
                if self._ctl_wake in woken:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._ctl_wake)
                self.ring.consume()
            except OSError as e:  # pragma: no cover
                log.error("control ring: %s", e)
                time.sleep(0.1)
            self._act_on_control()

    def _act_on_control(self) -> None:
        ctl, self._ctl = self._ctl, []
        for ev in ctl:
            try:
                self._handle_ctl(ev)
            except Exception:  # pragma: no cover - never leave a hold to the limit for a bug
                log.exception("control event for pid %d", ev.pid)
                if ev.type == CtlType.MAP and ev.held == HoldState.HELD:
                    release(self.maps[HELD_MAP], ev.host_pid, self.opts.hold_limit_s)

    def control_watch(self) -> tuple[int, int, int] | None:
        """For a watcher of the control ring (Agent.guard_ring): the addresses
        of its consumer and producer positions, valid until close(), and the
        eventfd that wakes the control thread. None before start()."""
        if self._ctl_positions is None:
            return None
        return (*self._ctl_positions.positions(), self._ctl_wake)

    def set_control_quiet(self, seconds: float) -> None:
        """How long the control thread sleeps without a wakeup, from now."""
        self.control_quiet_s = seconds
        if self._ctl_wake >= 0:
            os.eventfd_write(self._ctl_wake, 1)

    def read_control_now(self) -> None:
        """Act on every control record in the ring now, for a last drain
        before a report: process notices come without a wakeup and the
        control thread may not have read the last ones yet. The thread is
        paused meanwhile (libbpf's ring reader is not for two threads)."""
        if self.ring is None:
            return
        running = self._ctl_thread is not None
        if running:
            self._stop_control()
        self.ring.consume()
        self._act_on_control()
        if running:
            self._start_control()

    def _start_control(self) -> None:
        self._ctl_stop.clear()
        self._ctl_thread = thread(self._control_loop, "memtrace-ctl")
        self._ctl_thread.start()

    def _stop_control(self) -> None:
        if self._ctl_thread is not None:
            self._ctl_stop.set()
            os.eventfd_write(self._ctl_wake, 1)
            self._ctl_thread.join()
            self._ctl_thread = None
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._ctl_wake)

    def _progress(self) -> None:
        """Attaching goes on: every process this agent holds stays held (the
        limit runs from the agent's last progress). An attachment can wait seconds behind other
        tools' uprobe removals in the kernel; the limit bounds a stopped or
        stuck agent, not a slow kernel."""
        held = self.maps[HELD_MAP]
        for host_pid in list(held.keys(ctypes.c_uint32)):  # queued holds wait behind this one
            refresh(held, host_pid.value)

    def _notice(self, kind: str, ev: CtlEvent, comm: str = "", number: int = 0) -> None:
        """`number`: a process notice's cgroup id, an exit's CPU time (ns)."""
        with self._notices_lock:
            self._notices.append((kind, ProcessKey(ev.pid, ev.start_ns), comm, number))

    def _handle_ctl(self, ev: CtlEvent) -> None:
        if ev.type == CtlType.EXIT:
            self._notice("exit", ev, number=ev.cpu_ns)
            return
        if ev.type == CtlType.PROC:
            self._notice("proc", ev, ev.comm.decode(errors="replace"), ev.cgroup_id)
            if self.on_proc_notice is not None:
                self.on_proc_notice(ProcessKey(ev.pid, ev.start_ns))
            if self.launch_links is not None and self.launch_links.adopt(ev.pid):
                self._notice("launches_missed", ev)  # it may have launched before its own link
            return
        held = ev.held == HoldState.HELD
        cuda = True  # a CUDA library's hold: the model hears whether the process was held
        only_launches = False  # its library had probes: only its own launch link was missing
        try:
            opened = discovery.opened_file(ev.pid, ev.fd)
            cuda = not self._other_library(ev.pid, opened, held)
            only_launches = (
                opened is not None
                and self.launch_links is not None
                and self.launch_links.per_process(opened.fid)
                and self._exe_known(ev.pid)
            )
            self._attach_mapped(ev.pid, opened)
            if self.on_map_notice is not None:
                self.on_map_notice(ProcessKey(ev.pid, ev.start_ns))
        except MemtraceError as e:
            log.warning("pid %d: %s", ev.pid, e)
        finally:
            if held:
                if cuda:
                    self._notice("held", ev)  # nothing of it ran before its probes
                rel = release(self.maps[HELD_MAP], ev.host_pid, self.opts.hold_limit_s)
                if rel.expired and discovery.alive(ev.pid):
                    self.holds_expired += 1
                    if cuda:
                        self._notice("missed", ev)
                    log.warning(
                        "pid %d ran on before its %s library was attached (hold limit %g s): "
                        "its first calls may be missing",
                        ev.pid,
                        "CUDA" if cuda else "NCCL",
                        self.opts.hold_limit_s,
                    )
            elif only_launches:
                self._notice("launches_missed", ev)
            elif cuda:
                self.not_held += 1
                self._notice("missed", ev)

    def _exe_known(self, pid: int) -> bool:
        exe = discovery.executable(pid)
        return exe is not None and (exe.fid in self._checked_executables or exe.fid in self.attachments)

    def _other_library(self, pid: int, cand: discovery.Candidate | None, held: bool) -> bool:
        """Hand a mapped file that is not CUDA's (libnccl) to the sensor that
        asked for it; marked known once handled, so its next mappings run
        on. True: it was such a file (whether or not a sensor took it)."""
        if cand is None or cand.layer is not None:
            return False
        if self.on_library_mapped is None:
            return True
        try:
            handled = self.on_library_mapped(pid, cand, held)
        except Exception as e:  # noqa: BLE001 - another sensor's failure must not keep the process stopped
            log.warning("pid %d: %s not attached: %s: %s", pid, cand.name, type(e).__name__, e)
            return True
        if handled:
            self._mark(cand.fid, ATTACHED_OTHER)
        return True

    def _attach_mapped(self, pid: int, cand: discovery.Candidate | None) -> None:
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
            exe = discovery.executable(pid)
            if exe is not None:
                self.check_executable(exe)

    # ---- maps ----

    def _index(self, name: str, k: TotalsKey) -> None:
        self._kernel_keys.setdefault(ProcessKey(k.pid, k.start_ns), set()).add((name, bytes(k)))

    def lost(self) -> list[tuple[TotalsKey, Totals]]:
        """Calls the events ring could not take, counted by the kernel."""
        m = self.maps["lost"]
        out = []
        for k in m.keys(TotalsKey):
            v = Totals()
            if m.lookup(k, v):
                out.append((k, v))
                self._index("lost", k)
        return out

    def counts(self) -> list[tuple[TotalsKey, int]]:
        """Launches per (process, api), counted by the kernel; under api
        TRAPS_API, the entry and return traps each process took."""
        m = self.maps["counts"]
        out = []
        for k in m.keys(TotalsKey):
            v = ctypes.c_uint64()
            if m.lookup(k, v):
                out.append((k, v.value))
                self._index("counts", k)
        return out

    def process_counts(self, key: ProcessKey) -> tuple[dict[int, int], int]:
        """One process's launch counts by api and its entry and return traps,
        read key by key (never a walk of the map): what the budget reads
        at each window's edge."""
        m = self.maps["counts"]
        v = ctypes.c_uint64()
        launches = {}
        for api in LAUNCH_APIS:
            if m.lookup(TotalsKey(key.start_ns, key.pid, api, 0, 0), v):
                launches[api] = v.value
        traps = v.value if m.lookup(TotalsKey(key.start_ns, key.pid, TRAPS_API, 0, 0), v) else 0
        return launches, traps

    def is_fresh(self, key: ProcessKey) -> bool:
        """Was the process forked after the programs were attached?"""
        return self.obj is not None and self.maps["fresh"].lookup(ctypes.c_uint32(key.pid), ctypes.c_uint8())

    def forget_process(self, key: ProcessKey) -> None:
        """Delete a process's kernel totals: the keys lost() and counts() read
        for it (it has exited, and they were read after that), one syscall
        each, never a walk of the whole maps."""
        self.maps["fresh"].delete(ctypes.c_uint32(key.pid))
        for name, raw in self._kernel_keys.pop(key, set()):
            self.maps[name].delete(TotalsKey.from_buffer_copy(raw))

    def stats(self) -> dict[Stat, int]:
        ncpu = Libbpf.get().lib.libbpf_num_possible_cpus()
        vals = (ctypes.c_uint64 * ncpu)()
        out = {}
        for s in Stat:
            out[s] = sum(vals) if self.maps["stats"].lookup(ctypes.c_uint32(s), vals) else 0
        assert len(Stat) == STAT_COUNT
        return out

    def tell_python(self, key: ProcessKey, config: PyProc | None) -> None:
        """Where a process's interpreter keeps its state, for BPF's walk of
        its Python frames (None: walk it no more; a process that reused the
        pid since keeps its own). A full map leaves the process without
        Python frames, which its stacks say."""
        pid = ctypes.c_uint32(key.pid)
        if config is None:
            cur = PyProc()
            if self.maps["py_procs"].lookup(pid, cur) and cur.start_ns == key.start_ns:
                self.maps["py_procs"].delete(pid)
            return
        try:
            self.maps["py_procs"].update(pid, config)
        except OSError as e:
            log.warning("pid %d: Python frames not taken: %s", key.pid, e)

    def take_py_codes(self) -> list[tuple[PyCodeKey, PyCode]]:
        """What the code objects of new stacks said (memtrace.h), deleted there once read."""
        m = self.maps["py_codes"]
        out: list[tuple[PyCodeKey, PyCode]] = []
        for k in list(m.keys(PyCodeKey)):
            v = PyCode()
            if m.lookup(k, v):
                out.append((k, v))
            m.delete(k)
        return out

    def take_stack(self, key: int) -> Stack | None:
        """A stack from `stack_frames`, deleted there once read (memtrace.h); None if absent."""
        k = ctypes.c_uint64(key)
        v = Stack()
        if not self.maps["stack_frames"].lookup(k, v):
            return None
        self.maps["stack_frames"].delete(k)
        return v

    def inflight_count(self) -> int:
        """Calls in flight now: claimed slots, plus entries in the overflow hash."""
        slots = self.obj.map("slots") if self.obj else None
        busy = 0
        if slots is not None:
            # The slot's owner word, then its call: sized by the map itself (struct mt_slot).
            value = (ctypes.c_uint64 * (slots.value_size // 8))()
            for i in range(65536):
                if slots.lookup(ctypes.c_uint32(i), value) and value[0]:
                    busy += 1
        return busy + sum(1 for _ in self.maps["inflight"].keys(ctypes.c_uint64))
