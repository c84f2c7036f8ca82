"""The NCCL sensor: load nccl.<arch>.bpf.o, attach its probes to libnccl
files (once per inode), drain its ring, read its maps.

The runtime drives it: `start()`, `scan()` or `attach()` when libnccl shows
up (either may come from another thread: the CUDA sensor's control thread
attaches a libnccl whose mapping held a process), `poll()` on a timer (the
ring is written without wakeups, so nothing is delivered unless it is
drained), `totals()`, `close()`. A host with no NCCL leaves it idle:
nothing attached, empty batches, no error.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from memtrace.bpf.detach import destroy_links
from memtrace.bpf.host import bpf_arch, check_kernel
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, Map, destroy_together, uprobe_multi_supported
from memtrace.bpf.ringbuf import EventRing
from memtrace.core.errors import AttachError
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import (
    COMM_EVENT_DTYPE,
    EVENT_DTYPE,
    F_BYTES_UNKNOWN,
    STAT_COUNT,
    CallTotals,
    Collective,
    Stat,
    Totals,
    TotalsKey,
)
from memtrace.core.procfiles import FileId, pids
from memtrace.sensors.nccl.discovery import mapped_nccl
from memtrace.sensors.nccl.plan import COMM_PROGRAMS, PROGRAMS, probe_plan

log = logging.getLogger("memtrace")

DEFAULT_RING_BYTES = 4 << 20
COMM_RING_BYTES = 256 << 10  # communicator records: a few per process


def object_path(arch: str | None = None) -> Path:
    return Path(str(resources.files("memtrace") / "bpf" / f"nccl.{arch or bpf_arch()}.bpf.o"))


@dataclass
class NcclAttachment:
    fid: FileId
    name: str
    symbols: dict[str, int]  # symbol -> file offset
    links: list[Link] = field(default_factory=list)


class NcclSensor:
    name = "nccl"

    def __init__(self, ring_bytes: int = DEFAULT_RING_BYTES) -> None:
        self.ring_bytes = ring_bytes
        self.attachments: dict[FileId, NcclAttachment] = {}
        self.obj: BpfObject | None = None
        self.ring: EventRing | None = None
        self.comm_ring: EventRing | None = None
        self._maps: dict[str, Map] = {}
        self._links: list[Link] = []
        self._seen: dict[tuple[ProcessKey, Collective], CallTotals] = {}
        self._attach_lock = threading.RLock()  # attach() and scan(): one file once, from any thread
        self.multi = False  # multi-uprobe links (one per program and file), not one per symbol

    # ---- lifecycle ----

    def start(self, keys: Iterable[ProcessKey] | None = None) -> None:
        """Load the programs. With `keys`, only those processes (and the
        children they fork from now on) are traced; else every process."""
        check_kernel()
        obj = BpfObject(object_path(), Libbpf.get())
        self.obj = obj
        try:
            obj.set_rodata({"filter_pids": keys is not None})
            obj.set_max_entries("events", self.ring_bytes)
            # One link per program and library where the kernel has multi-uprobes (as the CUDA sensor).
            self.multi = uprobe_multi_supported()
            if self.multi:
                for prog, _ret in PROGRAMS + COMM_PROGRAMS:
                    obj.load_for_uprobe_multi(prog)
            obj.load()
            self._maps = {n: obj.map(n) for n in ("lost", "stats", "traced", "inflight", "group_depth")}
            for key in keys or ():
                self.trace(key)
            for prog in ("nc_fork", "nc_exit"):
                self._links.append(obj.attach(prog))
            self.ring = EventRing(obj.map("events").fd, self.ring_bytes, EVENT_DTYPE)
            self.comm_ring = EventRing(obj.map("comms").fd, COMM_RING_BYTES, COMM_EVENT_DTYPE)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        destroy_together(self._links)
        self._links.clear()
        destroy_links([link for a in self.attachments.values() for link in a.links])
        for a in self.attachments.values():
            a.links.clear()
        for ring in (self.ring, self.comm_ring):
            if ring is not None:
                ring.close()
        self.ring = self.comm_ring = None
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    def __enter__(self) -> NcclSensor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- processes and libraries ----

    def trace(self, key: ProcessKey) -> None:
        """Trace a process, and the children it forks from now on. A key whose
        start_ns is 0 (not known) traces the first process BPF sees calling
        NCCL with that pid; a reused pid is then another process, not traced."""
        self._maps["traced"].update(ctypes.c_uint32(key.pid), ctypes.c_uint64(key.start_ns))

    def attach(self, path: str, name: str | None = None) -> NcclAttachment | None:
        """Probe the NCCL symbols a file defines, once per inode (every process
        mapping it is then seen, from its first call). None: nothing to probe."""
        with self._attach_lock:
            return self._attach(path, name)

    def _attach(self, path: str, name: str | None) -> NcclAttachment | None:
        assert self.obj is not None, "start() first"
        try:
            fid = FileId.of(os.stat(path))
            if fid in self.attachments:
                return self.attachments[fid]
            plan = probe_plan(path)
        except OSError as e:
            log.warning("cannot read %s: %s", name or path, e)
            return None
        if not plan:
            log.warning("%s exports none of the NCCL symbols memtrace probes; not attached", name or path)
            return None
        att = NcclAttachment(fid, name or path, {p.symbol: p.offset for p in plan})
        try:
            if self.multi:
                for programs in (PROGRAMS, COMM_PROGRAMS):
                    part = [p for p in plan if p.programs == programs]
                    if not part:
                        continue
                    for prog, ret in sorted(programs, key=lambda pr: not pr[1]):  # returns first (CUDA sensor)
                        offsets, cookies = [p.offset for p in part], [p.cookie for p in part]
                        att.links.append(self.obj.attach_uprobe_multi(prog, path, offsets, cookies, ret))
            else:
                for p in plan:
                    for prog, ret in p.programs:
                        att.links.append(self.obj.attach_uprobe(prog, path, p.offset, p.cookie, ret))
        except AttachError as e:
            destroy_links(att.links)
            log.warning("%s vanished while attaching: %s", name or path, e.message)
            return None
        self.attachments[fid] = att
        log.info("attached %d NCCL probes to %s", len(plan), att.name)
        return att

    def scan(self, pids_: Iterable[int] | None = None) -> int:
        """Attach to the libnccl files mapped by running processes (all, or
        `pids_`). Returns how many files were newly attached."""
        new = 0
        for pid in pids_ if pids_ is not None else list(pids()):
            for cand in mapped_nccl(pid):
                with self._attach_lock:
                    if cand.fid not in self.attachments and self._attach(cand.path, cand.name) is not None:
                        new += 1
        return new

    # ---- draining ----

    def poll(self) -> np.ndarray:
        """Every event queued since the last poll, as an EVENT_DTYPE array."""
        assert self.ring is not None, "start() first"
        batch = self.ring.read()
        if len(batch):
            self._count(batch)
        return batch

    def poll_comms(self) -> np.ndarray:
        """Every communicator record queued since the last call, as a
        COMM_EVENT_DTYPE array (communicators made, sizes and ranks asked)."""
        assert self.comm_ring is not None, "start() first"
        return self.comm_ring.read()

    def _count(self, batch: np.ndarray) -> None:
        who = (batch["pid"].astype(np.uint64) << np.uint64(8)) | batch["coll"].astype(np.uint64)
        uniq, inv = np.unique(np.stack([batch["start_ns"], who], axis=1), axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        ok = batch["ret"] == 0
        unknown = (batch["flags"] & F_BYTES_UNKNOWN) != 0
        calls = np.bincount(inv, minlength=len(uniq))
        nbytes = np.bincount(inv, weights=np.where(ok, batch["bytes"], 0).astype(np.float64), minlength=len(uniq))
        errors = np.bincount(inv, weights=(~ok).astype(np.float64), minlength=len(uniq))
        unk = np.bincount(inv, weights=unknown.astype(np.float64), minlength=len(uniq))
        dur = np.bincount(inv, weights=batch["duration_ns"].astype(np.float64), minlength=len(uniq))
        for i, (start, k) in enumerate(uniq.tolist()):
            t = self._seen.setdefault((ProcessKey(k >> 8, start), Collective(k & 0xFF)), CallTotals())
            t.calls += int(calls[i])
            t.bytes += int(nbytes[i])
            t.errors += int(errors[i])
            t.bytes_unknown += int(unk[i])
            t.duration_ns += int(dur[i])

    # ---- maps ----

    def lost(self) -> dict[tuple[ProcessKey, Collective], Totals]:
        """Calls the ring could not take, counted by the kernel."""
        m = self._maps["lost"]
        out: dict[tuple[ProcessKey, Collective], Totals] = {}
        for k in m.keys(TotalsKey):
            assert isinstance(k, TotalsKey)
            v = Totals()
            if m.lookup(k, v) and k.coll in Collective._value2member_map_:
                out[(ProcessKey(int(k.pid), int(k.start_ns)), Collective(k.coll))] = v
        return out

    def totals(self) -> dict[tuple[ProcessKey, Collective], CallTotals]:
        """Per (process, collective): every call polled so far plus those the
        ring could not take (exact even when the ring overflowed)."""
        out = {k: CallTotals(t.calls, t.bytes, t.errors, t.bytes_unknown, t.duration_ns) for k, t in self._seen.items()}
        for k, v in self.lost().items():
            t = out.setdefault(k, CallTotals())
            t.calls += v.calls
            t.bytes += v.bytes
            t.errors += v.errors
            t.bytes_unknown += v.bytes_unknown
            t.duration_ns += v.duration_ns
        return out

    def stats(self) -> dict[Stat, int]:
        ncpu = Libbpf.get().lib.libbpf_num_possible_cpus()
        vals = (ctypes.c_uint64 * ncpu)()
        assert len(Stat) == STAT_COUNT
        return {s: sum(vals) if self._maps["stats"].lookup(ctypes.c_uint32(s), vals) else 0 for s in Stat}
