"""The BPF source: load memtrace's object, attach probes to CUDA libraries,
drain its rings, read its maps.

Everything that touches the kernel lives here; the model above it sees
decoded event batches, control notices and totals.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from memtrace.bpf.host import check_kernel, ensure_tracefs, object_path
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, RingBuffer
from memtrace.bpf.ringbuf import EventRing
from memtrace.core import apis
from memtrace.core.abi import EVENT_DTYPE, STAT_COUNT, CtlEvent, CtlType, InodeKey, Layer, Stat, Totals, TotalsKey
from memtrace.core.errors import AttachError, MemtraceError
from memtrace.core.ids import ProcessKey
from memtrace.sensors.cuda import discovery, elf
from memtrace.sensors.cuda.holds import Guardian, release_all

log = logging.getLogger("memtrace")

# `attached` map values
_ATTACHED_LIBRARY = 1
_CHECKED_EXECUTABLE = 2

DEFAULT_RING_BYTES = 16 << 20


@dataclass(frozen=True)
class Probe:
    symbol: str
    offset: int  # file offset of the function
    cookie: int
    needs_return: bool = True

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
    with open(path, "rb") as f:
        offsets = elf.function_offsets(f, table)
    by_offset: dict[int, str] = {}
    for sym in sorted(offsets, key=lambda s: (table[s].id, s != table[s].name, s)):
        by_offset.setdefault(offsets[sym], sym)
    return [Probe(sym, off, table[sym].cookie(), table[sym].needs_return) for off, sym in sorted(by_offset.items())]


@dataclass
class Attachment:
    """One file with probes: a CUDA library, or an executable with a static runtime."""

    fid: discovery.FileId
    name: str
    layer: Layer
    symbols: dict[str, int]  # symbol -> file offset, one per distinct offset
    links: list[Link] = field(default_factory=list)

    def close(self) -> None:
        destroy_links(self.links)
        self.links.clear()


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
        for link in links:
            link.destroy()
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


class BpfSource:
    """Owns the loaded object, its links and the attached libraries."""

    def __init__(
        self,
        opts: Options,
        on_events: Callable[[np.ndarray], None],
        on_exit: Callable[[ProcessKey], None] = lambda key: None,
        on_library: Callable[[Attachment], None] = lambda a: None,
        on_held: Callable[[ProcessKey], None] = lambda key: None,
        on_process: Callable[[ProcessKey, str, int], None] = lambda key, comm, cgroup_id: None,
    ) -> None:
        self.opts = opts
        self.on_events = on_events
        self.on_exit = on_exit
        self.on_library = on_library
        self.on_held = on_held
        self.on_process = on_process  # a process's first event: (key, comm, cgroup id), from BPF
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
        self.ring: RingBuffer | None = None  # the control ring (libbpf, per-record callbacks)
        self.events: EventRing | None = None  # the events ring (batched reads)
        self.guardian: Guardian | None = None
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
        obj.set_rodata(
            {
                "filter_pids": self.opts.only_traced,
                "hold_libraries": self.opts.hold_libraries,
                "agent_tgid": os.getpid(),
            }
        )
        obj.set_max_entries("events", self.opts.ring_bytes)
        if not self.opts.hold_libraries:
            obj.set_autoload("mt_mmap", False)
        obj.load()
        self.maps = {
            n: obj.map(n) for n in ("lost", "counts", "stats", "traced", "attached", "held", "inflight", "fresh")
        }
        # Fork the guardian before any link exists, so it never keeps a
        # probe alive after the agent is gone.
        self.guardian = Guardian(self.maps["held"])
        progs = ["mt_fork", "mt_exit"]
        if self.opts.hold_libraries:
            progs.append("mt_mmap")
        for p in progs:
            self._links.append(obj.attach(p))
        self.events = EventRing(obj.map("events").fd, self.opts.ring_bytes, EVENT_DTYPE)
        self.ring = RingBuffer(lib, [(obj.map("ctl_events"), self._on_ctl)])

    def close(self) -> None:
        # The tracepoints first (three, removed here and now): once mt_mmap is
        # gone no process can be held any more, and every held one is continued.
        for link in self._links:
            link.destroy()
        self._links.clear()
        if self.obj is not None and self.obj.loaded:
            release_all(self.maps["held"])
        destroy_links([link for a in self.attachments.values() for link in a.links])
        for a in self.attachments.values():
            a.links.clear()
        if self.ring:
            self.ring.close()
            self.ring = None
        if self.events:
            self.events.close()
            self.events = None
        if self.guardian:
            self.guardian.close()
            self.guardian = None
        if self.obj:
            self.obj.close()
            self.obj = None

    # ---- processes and libraries ----

    def trace_pid(self, pid: int) -> None:
        one = ctypes.c_uint8(1)
        self.maps["traced"].update(ctypes.c_uint32(pid), one)

    def scan(self, pids: list[int] | None = None) -> None:
        """Attach to the CUDA libraries already mapped by running processes."""
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
        if exe.fid in self._checked_executables or exe.fid in self.attachments:
            return
        try:
            self.attach(exe)
        finally:
            self._checked_executables.add(exe.fid)
            self._mark(exe.fid, _CHECKED_EXECUTABLE)

    def _mark(self, fid: discovery.FileId, value: int) -> None:
        try:
            self.maps["attached"].update(InodeKey(fid.dev, fid.ino), ctypes.c_uint8(value))
        except OSError as e:  # full: the process is held each time, still correct
            log.debug("attached map: %s", e)

    def attach(self, cand: discovery.Candidate) -> Attachment | None:
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
        att = Attachment(cand.fid, cand.name, layer, {p.symbol: p.offset for p in plan})
        assert self.obj is not None
        try:
            for p in plan:
                for prog, ret in p.programs:
                    att.links.append(self.obj.attach_uprobe(prog, cand.path, p.offset, p.cookie, ret))
        except AttachError as e:
            att.close()
            log.warning("%s (pid %d) vanished while attaching: %s", cand.name, cand.pid, e.message)
            return None
        self.attachments[cand.fid] = att
        self._mark(cand.fid, _ATTACHED_LIBRARY)
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
        """Drain both rings and act on control events. Returns events seen.
        With `events` False the events ring is left unread (its reader is
        behind): control events are still handled, holds still released."""
        assert self.ring is not None
        if events:
            self._read_events()
        self.ring.consume()
        ctl, self._ctl = self._ctl, []
        for ev in ctl:
            self._handle_ctl(ev)
        if ctl:
            # Events queued while a library was being attached.
            if events:
                self._read_events()
            self.ring.consume()
            for ev in self._ctl:
                self._handle_ctl(ev)
            self._ctl = []
        return self.decode_pending()

    def decode_pending(self) -> int:
        """Hand the records drained so far to the model as one batch."""
        if not self._batches:
            return 0
        batches, self._batches = self._batches, []
        batch = batches[0] if len(batches) == 1 else np.concatenate(batches)
        self.on_events(batch)
        return len(batch)

    def _handle_ctl(self, ev: CtlEvent) -> None:
        if ev.type == CtlType.MAP:
            try:
                cand = discovery.opened_file(ev.pid, ev.fd)
                if cand is not None and cand.layer is not None:
                    self.attach(cand)
                exe = discovery.executable(ev.pid)
                if exe is not None:
                    self.check_executable(exe)
            except MemtraceError as e:
                log.warning("pid %d: %s", ev.pid, e)
            finally:
                if ev.held:
                    self.on_held(ProcessKey(ev.pid, ev.start_ns))  # nothing of it ran before its probes
                    self._release(ev.pid)
        elif ev.type == CtlType.EXIT:
            self.on_exit(ProcessKey(ev.pid, ev.start_ns))
        elif ev.type == CtlType.PROC:
            self.on_process(ProcessKey(ev.pid, ev.start_ns), ev.comm.decode(errors="replace"), ev.cgroup_id)

    def _release(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        except PermissionError as e:  # pragma: no cover
            log.error("cannot continue pid %d: %s", pid, e)
        self.maps["held"].delete(ctypes.c_uint32(pid))

    # ---- maps ----

    def _index(self, name: str, k: TotalsKey) -> None:
        self._kernel_keys.setdefault(ProcessKey(k.pid, k.start_ns), set()).add((name, bytes(k)))

    def lost(self) -> list[tuple[TotalsKey, Totals]]:
        """Calls the events ring could not take, counted by the kernel."""
        m = self.maps["lost"]
        out = []
        for raw in m.keys(TotalsKey):
            k = cast(TotalsKey, raw)
            v = Totals()
            if m.lookup(k, v):
                out.append((k, v))
                self._index("lost", k)
        return out

    def counts(self) -> list[tuple[TotalsKey, int]]:
        """Launches per (process, api), counted by the kernel."""
        m = self.maps["counts"]
        out = []
        for raw in m.keys(TotalsKey):
            k = cast(TotalsKey, raw)
            v = ctypes.c_uint64()
            if m.lookup(k, v):
                out.append((k, v.value))
                self._index("counts", k)
        return out

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

    def inflight_count(self) -> int:
        """Calls in flight now: claimed slots, plus entries in the overflow hash."""
        slots = self.obj.map("slots") if self.obj else None
        owner = (ctypes.c_uint64 * 8)()  # the slot's owner word, then its call (56 bytes)
        busy = 0
        for i in range(65536 if slots else 0):
            if slots.lookup(ctypes.c_uint32(i), owner) and owner[0]:
                busy += 1
        return busy + sum(1 for _ in self.maps["inflight"].keys(ctypes.c_uint64))
