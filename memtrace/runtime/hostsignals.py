"""The host signals beside the CUDA sensor: the CPU each traced process gets
(sensors/sched, BPF), its collectives (sensors/nccl, BPF), the GPUs (NVML)
and the network interfaces of the namespaces the processes live in
(rtnetlink). One sampling thread reads them on a timer and folds the
readings into a HostBook (model/host.py).

Each sensor is optional: one that cannot start here (no NVIDIA driver, no
BTF for the sched tracepoints, no netlink socket) is off, with the reason
and the fix in the summary's `host.sensors` and a warning in the log; the
CUDA tracing and the other sensors go on. A sensor that fails mid-run (a
GPU falls off the bus, a namespace goes away) is reported in its section,
never raised into the traced run.

Which processes: those the caller names (`memtrace run`'s command, from
its first instruction) and every process the CUDA model has met, polled at
each sample. The sched sensor measures a process from the moment it is
added; the NCCL sensor follows the traced processes' forks itself. It
attaches to a libnccl file as a process maps it: the CUDA sensor stops the
process at the mapping (`nccl_mapped`, wired by `follow`) and continues it
once the probes are in, so every collective is seen from the first. Where
that cannot be (a terminal's foreground job is never stopped; a library
mapped before the agent started), a sample that finds the library mapped
attaches it: collectives made before then are not seen, and the
collectives rows of such a process say so (`counted_from`).

Identity follows each process (model/host.py's `place`): its network
namespace at every sample (the netdev source looks at /proc/PID/ns/net
anyway), its cgroup, command and executable when they may have changed.
The sched sensor counts each traced process's execs and cgroup moves in
BPF (two rare tracepoints) and its entry is read at every sample anyway:
/proc is read again only for a process whose counts moved, or whose
cgroup at its last switch is not the one known. Without that sensor they
are read again with the quota, every `quota_s`. A process's CPU quota
throttling and memory limit hits are charged from then on to the cgroup
it is in.

Cost: one sample reads the sched maps (one lookup per traced process), the
NCCL ring, NVML's fast readings (utilisation, clock events, XIDs; the slow
ones about once a second, `gpu_detail_s`) and the interface counters
(RTM_GETSTATS; names and speeds every `link_s`). bench/host_sampling.py
measures it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from memtrace.core.errors import MemtraceError
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import COMM_EVENT_DTYPE, Collective
from memtrace.core.nccl import EVENT_DTYPE as NCCL_EVENT_DTYPE
from memtrace.core.notices import Collectives, Execed
from memtrace.core.procfiles import Candidate
from memtrace.core.sensor import Sensor
from memtrace.core.threads import thread
from memtrace.export import schema
from memtrace.export.host import collective_rows, host_section
from memtrace.model.host import HostBook, Identity, SensorState
from memtrace.sensors.nccl import is_nccl, mapped_nccl
from memtrace.sources.cgroup import CgroupNames, cgroup_id, cpu_cgroup, cpu_quotas, memory_limit_hits, read_cgroups
from memtrace.sources.fastsample import DEFAULT_RATE_HZ as DEFAULT_FAST_HZ
from memtrace.sources.procfs import boot_wall_ns, command_of

if TYPE_CHECKING:  # started lazily: NVML and netlink are optional on a host
    from memtrace.sensors.nccl import NcclSensor
    from memtrace.sensors.sched import SchedSensor
    from memtrace.sources.fastsample import FastSampler, FastWindow
    from memtrace.sources.netdev import NetdevSource
    from memtrace.sources.nvml import NvmlSource

log = logging.getLogger("memtrace")

DEFAULT_INTERVAL_S = 0.1
COMPLETE_MARGIN_NS = 10_000_000  # an NCCL poll's events are taken as complete up to this long before it
GAPS_S = 10.0  # the CPU sensor's gap counters are read this often (and at the last sample)
# The fast sampler's rate while no process is traced (an idle node's agent): its readings serve
# the traced processes (their links' busiest ticks, their GPUs' throttling), so a fifth of its
# cost buys enough; it is back at --host-rate from the first sample that traces one. It also
# watches the rings: a new process's notice then waits for the control thread 50 ms at most
# (CONTROL_QUIET_S, 0.1 s, unwatched).
QUIET_FAST_HZ = 20.0
# ... reading the interfaces and GPUs at QUIET_READ_HZ only: its ticks then watch the rings (two loads
# each), their readings (a netlink dump, NVML's calls: about half a tick's cost here) feed host series
# nothing is diagnosed from.
QUIET_READ_HZ = 2.0
# While no process is traced, the samples come every QUIET_INTERVAL_S (HostOptions.quiet_s; tick_s
# if longer; each is a tick), not each interval_s: nothing is diagnosed, and the host-wide readings pushed (its
# NICs' and GPUs' counters, read as deltas) lose nothing. A process the agent meets (nudge) brings
# back interval_s at once, for NUDGE_S while the model folds it in.
QUIET_INTERVAL_S = 1.0
NUDGE_S = 1.0


@dataclass(frozen=True)
class HostOptions:
    cpu: bool = True
    nccl: bool = True
    gpu: bool = True
    network: bool = True
    interval_s: float = DEFAULT_INTERVAL_S
    # The slower readings, in seconds, taken at the sample nearest: whatever
    # the interval (0.5 s by default, top's 0.1 s), a degraded link or a hot GPU
    # is seen within a second, not ten samples.
    gpu_detail_s: float = 1.0  # NVML refreshes its slow readings at about 1 Hz
    link_s: float = 1.0  # interface names and speeds
    quota_s: float = 1.0  # cgroup cpu.stat, and the memory cgroups' limit hits, per process
    scan_s: float = 1.0  # /proc/PID/maps of the traced processes, for a libnccl loaded late
    # The same, where the CUDA sensor reports each libnccl a traced process maps:
    # a safety net then (a PyTorch process's maps: docs/design/evidence.md#maps-read).
    followed_scan_s: float = 10.0

    def every(self, seconds: float) -> int:
        """The samples between two readings taken every `seconds` (at least 1)."""
        return max(1, round(seconds / self.interval_s))

    # The fast sampler's rate (a C thread: NIC counters, GPU utilisation and clock events); 0: none,
    # those are read in Python at each sample.
    fast_hz: float = DEFAULT_FAST_HZ
    tick_s: float = 0.5  # on_tick (the live diagnosis's window) after the sample nearest each tick_s
    quiet_s: float = QUIET_INTERVAL_S  # the samples' period while nothing is traced (tick_s at least)


def _off(e: BaseException) -> SensorState:
    if isinstance(e, MemtraceError):
        return SensorState(False, e.message, e.fix)
    return SensorState(False, str(e) or type(e).__name__, "run `memtrace doctor` to see what this host lacks")


class RingOwner(Protocol):
    """Whose rings the fast sampler's C thread watches (runtime.agent.Agent.guard_ring)."""

    def guard_ring(self, guard: Any) -> None: ...

    def unguard_ring(self) -> None: ...


class HostSignals:
    def __init__(
        self,
        opts: HostOptions,
        processes: Callable[[], set[ProcessKey]] = set,
        *,
        collectives: Callable[[Collectives], None] | None = None,
        execed: Callable[[Execed], None] | None = None,
        ring_owner: RingOwner | None = None,
        follows_nccl: bool = False,
        on_tick: Callable[[], object] | None = None,
    ) -> None:
        """`processes`: who to sample, polled at each sample (the CUDA
        model's processes); `collectives`: where each NCCL poll's events go
        (the agent's model); `execed`: told when a traced process is
        found running another program (the agent's model); `ring_owner`: whose rings the fast sampler
        watches once it runs, so that their threads sleep while the rings
        are quiet; `follows_nccl`: the CUDA sensor reports each libnccl a
        traced process maps (nccl_mapped), so their maps are scanned
        seldom; `on_tick`: called on the sampling thread after the sample
        nearest each opts.tick_s (the live diagnosis)."""
        self.opts = opts
        self.book = HostBook()
        self.lock = threading.Lock()  # the book's
        self._processes = processes
        self._met: set[ProcessKey] = set()  # the processes the agent knew at the last sample
        # The process traced here under each pid: the agent's latest of that pid, or for a
        # pid named at start before the agent knows it, ProcessKey(pid, 0) (the sensors
        # bind that to the first process they see with the pid: run's command).
        self._tracked: dict[int, ProcessKey] = {}
        self._pinned: set[int] = set()  # named at start: traced until the end
        self._sched: SchedSensor | None = None
        self._nccl: NcclSensor | None = None
        self._nvml: NvmlSource | None = None
        self._net: NetdevSource | None = None
        self._fast: FastSampler | None = None  # when it runs
        self._fast_state = SensorState(
            False, "not asked for (--host-rate 0)" if opts.fast_hz <= 0 else "no NIC or GPU signals asked for", ""
        )
        self._fast_last: FastWindow | None = None  # its last window
        self._fast_hz = opts.fast_hz  # the rate it runs at now (QUIET_FAST_HZ while nothing is traced)
        # Its readings' rate (None: each tick; QUIET_READ_HZ while nothing is traced).
        self._fast_read_hz: float | None = None
        self._fast_gpus = False  # it reads the GPUs
        self._ring_owner = ring_owner
        self._nccl_since: dict[ProcessKey, float] = {}  # when its libnccl was attached, if after it loaded
        self._nccl_scanned: set[int] = set()  # processes whose maps were looked at once
        self._nccl_users: set[int] = set()  # traced processes with an attached libnccl mapped
        # Processes that mapped an attached libnccl (nccl_mapped, another thread), each
        # until it is traced here (a few samples at most): pid -> samples waited.
        self._nccl_mapped: dict[int, int] = {}
        self._followed = follows_nccl
        self._nccl_lock = threading.Lock()  # _nccl's lifetime and _nccl_mapped, against nccl_mapped
        # Who each traced process is, as last read: its /proc/PID/cgroup text, (comm, exe), and the
        # sched sensor's (execs, moves, cgroup id) when they were read.
        self._cgroup_text: dict[ProcessKey, str] = {}
        self._command: dict[ProcessKey, tuple[str, str]] = {}
        self._identity_marks: dict[ProcessKey, tuple[int, int, int]] = {}
        self._cgroup_ids: dict[str, int] = {}  # v2 path -> id, as stat found it
        self._count = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop, and by nudge
        self._nudged_until = 0.0  # monotonic: samples each interval_s until then, traced or not
        self.sample_errors = 0
        self.sample_cpu_ns = 0  # the CPU its samples took (bench/targets/agent_cpu.py)
        self._on_collectives = collectives
        self._on_execed = execed
        self._started = False
        self._finished = False
        self._on_tick = on_tick
        self._last_tick = 0.0
        self._boot_wall_ns = boot_wall_ns()  # a process's start in the rows: this + its key's (as the model's)

    # ---- lifecycle ----

    def start(self, pids: Iterable[int] = ()) -> None:
        """Start every sensor asked for that can run here; trace `pids` from
        now to the end (a second call only adds them)."""
        first = set(pids)
        if self._started:
            self._pinned |= first
            return
        self._started = True
        o = self.opts
        if o.fast_hz > 0 and (o.gpu or o.network):
            self._start_fast()
        keys = [ProcessKey(pid, 0) for pid in sorted(first)]
        if o.cpu:
            self._start("cpu", self._start_sched, keys)
        if o.nccl:
            self._start("nccl", self._start_nccl, keys)
        if o.gpu:
            self._start("gpu", self._start_nvml, keys)
        if o.network:
            self._start("network", self._start_net, keys)
        self._pinned = set(first)
        self._tracked = {pid: ProcessKey(pid, 0) for pid in sorted(first)}
        if self._fast is not None:
            try:
                if self._net is None and not self._fast_gpus:
                    raise OSError("no network interfaces or GPUs to read here")
                self._fast.start()
            except OSError as e:
                self._fast_off(e)
        if self._fast is not None and self._ring_owner is not None:
            self._ring_owner.guard_ring(self._fast)
        self._safe_sample()

    def _start_fast(self) -> None:
        from memtrace.core.gpu import THROTTLE_MASK
        from memtrace.sources.fastsample import FastSampler

        try:
            self._fast = FastSampler(self.opts.fast_hz, THROTTLE_MASK)
        except (MemtraceError, OSError) as e:
            self._fast_off(e)
            return
        self._fast_state = SensorState(True)

    def _fast_off(self, e: BaseException) -> None:
        self._fast_state = _off(e)
        log.info("the fast host sampler is off (%s); NICs and GPUs are read at each sample", self._fast_state.reason)
        if self._net is not None:
            self._net.stop_fast()
        if self._fast is not None:
            if self._ring_owner is not None:
                self._ring_owner.unguard_ring()
            self._fast.close()
            self._fast = None

    def _start(self, name: str, fn: Callable[[list[ProcessKey]], None], keys: list[ProcessKey]) -> None:
        try:
            fn(keys)
        except (MemtraceError, OSError) as e:
            state = _off(e)
            log.info("%s signals are off: %s", name, state.reason)
            self.book.set_sensor(name, state)
            return
        self.book.set_sensor(name, SensorState(True))

    def _start_sched(self, keys: list[ProcessKey]) -> None:
        from memtrace.sensors.sched import SchedSensor

        s = SchedSensor()
        s.start(keys)
        self._sched = s

    def _start_nccl(self, keys: list[ProcessKey]) -> None:
        from memtrace.sensors.nccl import NcclSensor

        s = NcclSensor()
        s.start(keys)
        self._nccl = s

    def _start_nvml(self, _keys: list[ProcessKey]) -> None:
        from memtrace.sources.nvml import NvmlSource

        src = NvmlSource.connect(self.opts.every(self.opts.gpu_detail_s))
        self._nvml = src
        self.book.driver_version = src.driver_version
        if self._fast is not None:
            try:
                src.hand_to(self._fast)
                self._fast_gpus = src.gpu_count > 0
            except OSError as e:
                log.info("GPU utilisation and clock events are read at each sample, not by the fast sampler: %s", e)

    def _start_net(self, _keys: list[ProcessKey]) -> None:
        from memtrace.sources.netdev import NetdevSource

        self._net = NetdevSource(link_every=self.opts.every(self.opts.link_s), fast=self._fast)

    def nccl_mapped(self, key: ProcessKey, lib: Candidate, held: bool) -> bool:
        """A traced process maps a libnccl not attached yet (the CUDA
        sensor's control thread, with the process stopped when `held`):
        attach it now. True once attached (or already). Not held, the
        process ran on meanwhile: its rows are counted from now."""
        pid = key.pid
        if not is_nccl(lib.name):
            return False
        with self._nccl_lock:
            if self._nccl is None:
                return False
            if self._nccl.attach(lib.path, lib.name) is None:
                return False
            self._nccl.trace(key)
            self._nccl_mapped[pid] = 0
        if self._on_collectives is not None:
            # Said now, before the process runs on: its waits are kept from its
            # first CUDA call, not from the next sample (which may come after many).
            self._on_collectives(Collectives(np.zeros(0, NCCL_EVENT_DTYPE), 0, frozenset({key})))
        if not held:
            self._nccl_since.setdefault(key, time.time())
        log.info("pid %d mapped %s: attached%s", pid, lib.name, "" if held else " (it was not held)")
        return True

    def finish(self) -> None:
        """Stop sampling and take the last sample now, before a last export
        (what the sensors saw since the previous sample goes out with it);
        close() takes no other."""
        self.stop()
        if not self._finished:
            self._finished = True
            self._safe_sample(final=True)

    def close(self) -> None:
        """A last sample (unless finish() took it), then every sensor closed."""
        self.finish()
        with self._nccl_lock:
            nccl, self._nccl = self._nccl, None
        if self._fast is not None and self._ring_owner is not None:
            self._ring_owner.unguard_ring()  # its drains keep their own schedule once the sampler stops
        sensors: list[Sensor[object] | None] = [self._sched, nccl, self._fast, self._nvml, self._net]
        for s in sensors:
            if s is not None:
                with contextlib.suppress(MemtraceError, OSError):
                    s.close()
        self._sched = self._nvml = self._net = self._fast = None

    def __enter__(self) -> HostSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sampling ----

    def _track(self, keys: set[ProcessKey]) -> None:
        """Trace the processes the agent knows now, one per pid (its latest), and
        those named at start; forget the rows of those it forgot (an exited
        process, once pushed), the ones named at start excepted. A pid named
        at start stands as ProcessKey(pid, 0) until the agent knows its
        process: its rows kept under that key move to the process's own."""
        for key in sorted(self._met - keys):
            if key.pid not in self._pinned:
                with self.lock:
                    self.book.forget(key)
                self._nccl_since.pop(key, None)
                for seen in (self._cgroup_text, self._command, self._identity_marks):
                    seen.pop(key, None)
        self._met = set(keys)
        want = {k.pid: k for k in sorted(keys)}  # sorted by (pid, start): each pid's latest process wins
        for pid in sorted(self._pinned - want.keys()):
            want[pid] = self._tracked.get(pid, ProcessKey(pid, 0))
        for pid, key in sorted(self._tracked.items()):
            new = want.get(pid)
            if new is None:
                if self._sched is not None:
                    with contextlib.suppress(MemtraceError, OSError):
                        self._sched.remove(key)
                self._nccl_scanned.discard(pid)
            elif new != key and not key.start_ns:
                self._placed(key, new)
        for pid, key in sorted(want.items()):
            if self._tracked.get(pid) == key:
                continue
            if self._sched is not None:
                with contextlib.suppress(MemtraceError, OSError):
                    self._sched.add(key)
            if self._nccl is not None:
                with contextlib.suppress(MemtraceError, OSError):
                    self._nccl.trace(key)
        self._tracked = want

    def _placed(self, old: ProcessKey, new: ProcessKey) -> None:
        """A pid named at start is now a process the agent knows: what was kept
        under its placeholder key is that process's."""
        with self.lock:
            self.book.rename(old, new)
        for seen in (self._cgroup_text, self._command, self._identity_marks):
            if old in seen:
                seen.setdefault(new, seen.pop(old))  # type: ignore[arg-type]
        if old in self._nccl_since:
            self._nccl_since.setdefault(new, self._nccl_since.pop(old))

    def _settle_pinned(self) -> None:
        """A pid named at start whose process the agent met after the last
        sample: what its placeholder holds is that process's (for a view)."""
        known = {k.pid: k for k in sorted(self._processes())}
        for pid in sorted(self._pinned):
            key, new = self._tracked.get(pid), known.get(pid)
            if key is not None and not key.start_ns and new is not None:
                self._placed(key, new)
                self._tracked[pid] = new

    def _key_of(self, pid: int) -> ProcessKey:
        """The process traced under `pid` (a reading by pid: /proc, cgroups, a maps scan)."""
        return self._tracked.get(pid, ProcessKey(pid, 0))

    def _pace_fast(self, fast: FastSampler, tracing: bool) -> None:
        """The fast sampler at --host-rate while a process is traced, at QUIET_FAST_HZ while none is."""
        want = self.opts.fast_hz if tracing else min(self.opts.fast_hz, QUIET_FAST_HZ)
        read = None if tracing else min(want, QUIET_READ_HZ)
        if (want, read) != (self._fast_hz, self._fast_read_hz):
            fast.set_rate(want, read)
            self._fast_hz, self._fast_read_hz = want, read
            log.debug(
                "the fast host sampler now ticks at %g Hz, reading at %g Hz (%s)",
                want,
                fast.read_hz,
                "tracing" if tracing else "nothing traced",
            )

    def sample(self, final: bool = False) -> None:
        """One reading of every sensor that is on, folded into the book."""
        self._count += 1
        self._track(self._processes())
        pids = set(self._tracked)
        if self._fast is not None:
            self._pace_fast(self._fast, bool(pids))
        if self._nccl is not None:
            self._sample_nccl(self._nccl, pids, final)
        fast = self._fast.poll() if self._fast is not None else None
        if fast is not None:
            self._fast_last = fast
        if self._nvml is not None:
            gpus = self._nvml.poll(detail=True if final else None, fast=fast)
            with self.lock:
                self.book.add_gpus(gpus)
        if self._net is not None:
            # Past the C side's row limit it drops readings (counted): then every counter is read here.
            fresh = final or (fast is not None and fast.interfaces_dropped > 0)
            snap = self._net.poll(sorted(pids), fast=fast, fresh=fresh)
            with self.lock:
                self.book.add_net(snap)
        stats = self._sched.read() if self._sched is not None else {}
        if self._sched is not None:
            self._bind_pinned(stats)
            with self.lock:
                self.book.set_cpu(stats)
        if self._sched is not None and (final or (self._count - 1) % self.opts.every(GAPS_S) == 0):
            gaps = self._sched.gaps()  # health counters: every 10 s is enough, and the last sample
            with self.lock:
                self.book.cpu_gaps = gaps
        due = final or (self._count - 1) % self.opts.every(self.opts.quota_s) == 0
        # Each process's cgroups read once for its CPU quota and its memory limit, every quota_s,
        # and at once for a process new here or that may have moved or exec'd (the sched sensor's word).
        changed = self._changed(pids, stats)
        read = sorted(pids) if due else sorted(changed)
        cgroups = {pid: text for pid in read if (text := read_cgroups(pid)) is not None}
        if self._sched is not None:
            self._sample_quotas(stats, cgroups)
        for pid, text in cgroups.items():
            key = self._key_of(pid)
            self._cgroup_text[key] = text
            hits = memory_limit_hits(pid, cgroups=text)
            if hits is not None:
                with self.lock:
                    self.book.read_limit_hits(key, text, hits)
        self._place(pids, stats, changed, due)

    def _bind_pinned(self, stats: Mapping[ProcessKey, Any]) -> None:
        """A pid named at start that the sched sensor bound to its process
        (BPF reads the start at the task): its readings by pid (cgroups,
        identity) are that process's from now on, as the sensor's rows are."""
        for key in stats:
            held = self._tracked.get(key.pid)
            if held is not None and not held.start_ns and key.start_ns and key.pid in self._pinned:
                self._placed(held, key)
                self._tracked[key.pid] = key

    def _changed(self, pids: set[int], stats: Mapping[ProcessKey, Any]) -> set[int]:
        """The traced pids whose identity must be read again now: new here, or
        the sched sensor counted an exec or a cgroup move of them since it was
        read, or saw them in another cgroup at their last switch."""
        out = set()
        for pid in pids:
            key = self._key_of(pid)
            st = stats.get(key)
            mark = (st.execs, st.moves, st.cgroup_id) if st is not None else None
            seen = self._identity_marks.get(key)
            if seen is None or (mark is not None and mark != seen):
                out.add(pid)
        return out

    def _place(self, pids: set[int], stats: Mapping[ProcessKey, Any], changed: set[int], due: bool) -> None:
        """Each traced process's identity at this sample into the book: its
        namespace as the netdev source found it now, its cgroup as last read,
        its command and executable read again where they may have changed."""
        now = time.time_ns()
        for pid in sorted(pids):
            key = self._key_of(pid)
            st = stats.get(key)
            # With the sched sensor an exec is counted; without it, the command is read with the quota.
            if pid in changed or (due and self._sched is None):
                command = command_of(key)
                if command is not None:
                    before = self._command.get(key)
                    self._command[key] = command
                    if before is not None and before != command and self._on_execed is not None:
                        self._on_execed(Execed(key, *command))
            if st is not None:
                self._identity_marks[key] = (st.execs, st.moves, st.cgroup_id)
            elif key not in self._identity_marks:
                self._identity_marks[key] = (0, 0, 0)
            text = self._cgroup_text.get(key)
            cg = cpu_cgroup(text) if text is not None else None
            comm, exe = self._command.get(key, ("", ""))
            ident = Identity(
                netns=self.book.netns_of(pid) if self._net is not None else None,
                cgroup=cg,
                cgroup_id=self._cgroup_id(cg)
                if cg is not None and text is not None and f"0::{cg}" in text.splitlines()
                else 0,
                comm=comm,
                exe=exe,
            )
            with self.lock:
                if self.book.place(key, ident, now) and len(self.book.placements[key]) > 1:
                    log.info("pid %d is measured in netns %s, cgroup %s from now", pid, ident.netns, cg)

    def _cgroup_id(self, path: str) -> int:
        """A v2 cgroup's id (its directory's inode), 0 where it is not one (v1, gone)."""
        cid = self._cgroup_ids.get(path)
        if cid is None:
            if len(self._cgroup_ids) > 4096:
                self._cgroup_ids.clear()
            cid = self._cgroup_ids[path] = cgroup_id(path) or 0
        return cid

    def _sample_nccl(self, s: NcclSensor, pids: set[int], final: bool = False) -> None:
        before = len(s.attachments)
        # A call that returned before this is in the ring when it is read below
        # (a record is submitted as its return is timed; the margin covers that).
        # The last sample, after `run`'s command has exited, takes every wait up
        # to now: nothing more will come, and a command that ends within the
        # margin of its last waits (60 rounds in 50 ms) must still have them
        # judged (the control thread's 100 ms polls used to delay that sample).
        complete_until = time.monotonic_ns() - (0 if final else COMPLETE_MARGIN_NS)
        # With no libnccl attached (most hosts) its rings and maps are empty: not read.
        # Communicators first: a communicator is made before the collectives on it.
        comms = s.poll_comms() if s.attachments else np.zeros(0, COMM_EVENT_DTYPE)
        batches = [s.poll()] if s.attachments else [np.zeros(0, NCCL_EVENT_DTYPE)]
        # Look for a newly loaded libnccl in new processes at once, in the others every scan_s
        # (a /proc/PID/maps read each), or followed_scan_s where the CUDA sensor reports them.
        new = pids - self._nccl_scanned
        every = self.opts.every(self.opts.followed_scan_s if self._followed else self.opts.scan_s)
        look = pids if (self._count - 1) % every == 0 else new
        self._nccl_scanned |= new
        if look and s.scan(sorted(look)):
            # Attached now: what the processes that had it loaded called before is not seen.
            now = time.time()
            fids = set(s.attachments)
            for pid in pids:
                if any(c.fid in fids for c in mapped_nccl(pid)):
                    self._nccl_since.setdefault(self._key_of(pid), now)
            log.info("attached to %d new NCCL file(s) while sampling", len(s.attachments) - before)
        if s.attachments:
            more = s.poll_comms()
            comms = np.concatenate([comms, more]) if len(more) else comms
            batches.append(s.poll())
        if look and s.attachments:
            fids = set(s.attachments)
            for pid in look - self._nccl_users:
                if any(c.fid in fids for c in mapped_nccl(pid)):
                    self._nccl_users.add(pid)
        with self._nccl_lock:
            for pid in list(self._nccl_mapped):
                if pid in pids:
                    self._nccl_users.add(pid)
                    del self._nccl_mapped[pid]
                else:
                    self._nccl_mapped[pid] += 1  # never traced here past a scan period: its scan will do
                    if self._nccl_mapped[pid] > self.opts.every(self.opts.scan_s):
                        del self._nccl_mapped[pid]
        events = np.concatenate(batches) if any(len(b) for b in batches) else batches[0]
        # Every event and communicator is handed over, whoever made it (BPF records those of
        # traced processes and their children alone). A process may have made them before the
        # agent met it: its first CUDA call came later, or was drained after this sample began
        # (`pids` is older than that drain, which add_collectives makes first). The model names
        # it by its communicator when it meets it, and counts a collective it cannot place
        # (`collective_events_unmatched`): neither is dropped here unseen.
        if len(events):
            self._nccl_users.update(np.unique(events["pid"]).tolist())
        self._nccl_users &= pids
        # With no collective, no communicator and no process that has libnccl mapped, the model
        # has nothing to match a wait to: nothing is handed over (most hosts' every sample, at no cost).
        if self._on_collectives is not None and (len(events) or self._nccl_users or len(comms)):
            users = frozenset(self._key_of(pid) for pid in self._nccl_users)
            self._on_collectives(Collectives(events, complete_until, users, comms))
        # With no libnccl attached nothing is counted: its maps are not read (two map walks a sample).
        totals = {k: t for k, t in s.totals().items() if k[0].pid in pids} if s.attachments else {}
        with self.lock:
            self.book.set_collectives(totals, [a.name for a in s.attachments.values()])

    def _sample_quotas(self, stats: dict[ProcessKey, Any], cgroups: dict[int, str]) -> None:
        for pid in sorted({k.pid for k in stats} & cgroups.keys()):
            qs = cpu_quotas(pid, cgroups=cgroups.get(pid))
            limited = [q for q in qs if q.quota_us is not None] or qs[:1]
            if not limited:
                continue
            q = limited[0]
            with self.lock:
                self.book.read_quota(self._key_of(pid), q.path, q.throttled_ns, q.nr_throttled)

    def _safe_sample(self, final: bool = False) -> None:
        """A sample whose failure is counted and logged once, never raised into the traced run."""
        start = time.thread_time_ns()
        try:
            self.sample(final=final)
        except Exception as e:  # noqa: BLE001 - a sensor's failure must not stop the run or the agent
            self.sample_errors += 1
            if self.sample_errors == 1:
                log.warning("a host-signal sample failed (%s: %s); counted in host.sample_errors", type(e).__name__, e)
        finally:
            self.sample_cpu_ns += time.thread_time_ns() - start

    def nudge(self, key: ProcessKey | None = None) -> None:
        """The agent met a process (`key`; any thread): sample each interval_s
        from now, where nothing traced had slowed the samples (QUIET_INTERVAL_S)."""
        self._nudged_until = time.monotonic() + NUDGE_S
        self._wake.set()

    def quiet(self) -> bool:
        """Nothing traced, nor met in the last NUDGE_S: the samples come every QUIET_INTERVAL_S."""
        return not self._tracked and time.monotonic() >= self._nudged_until

    def _loop(self) -> None:
        interval = self.opts.interval_s
        quiet = max(interval, self.opts.tick_s, self.opts.quiet_s)
        nxt = time.monotonic() + interval
        while True:
            self._wake.wait(max(0.0, nxt - time.monotonic()))
            if self._stop.is_set():
                break
            if self._wake.is_set():  # nudged: the next sample an interval_s from now at the latest
                self._wake.clear()
                nxt = min(nxt, time.monotonic() + interval)
                continue
            due = nxt
            self._safe_sample()
            # Ticks keep the samples' schedule, not the clock after a sample: a sample that
            # ran long (a GPU detail read) then one that ran short must not skip a tick
            # (push's 0.5 s ticks became 1 s windows with details every other sample).
            if self._on_tick is not None and due - self._last_tick >= self.opts.tick_s * 0.999:
                self._last_tick = due
                self._on_tick()
            step = quiet if self.quiet() else interval
            nxt = due + step
            now = time.monotonic()
            if nxt < now:  # fell behind (a stopped agent, a slow NVML call): skip, do not burst
                nxt = now + step

    @contextlib.contextmanager
    def sampling(self) -> Iterator[HostSignals]:
        """Sample on a thread of its own for the duration of the block."""
        self._stop.clear()
        self._wake.clear()
        self._thread = thread(self._loop, "memtrace-host")
        self._thread.start()
        try:
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ---- views ----

    def view(self, names: Mapping[ProcessKey, str] | None = None) -> schema.Host:
        """The summary's `host` section; `names`: each process's command name, as the CUDA model knows it."""
        cg = CgroupNames()
        self._settle_pinned()
        with self.lock:
            self.book.names.update(names or {})
            ids = {st.cgroup_id for st in self.book.cpu.values()}
            ids |= {p.cgroup_id for st in self.book.cpu.values() for p in st.preemptors}
            return host_section(
                self.book,
                boot_wall_ns=self._boot_wall_ns,
                cgroup_names={i: n for i in ids if i and (n := cg.path(i)) is not None},
                pids=set(self._tracked),
                sample_interval_seconds=self.opts.interval_s,
                sample_errors=self.sample_errors,
                fast_sampler=self._fast_view(),
                agent_pid=os.getpid(),  # as the sched sensor's tgids count, in the host's pid namespace
            )

    def _fast_view(self) -> schema.FastSampler:
        """The fast sampler: on (its rate, ticks, ticks skipped late, netlink errors, its own CPU) or off and why."""
        st = self._fast_state
        if not st.on:
            return schema.FastSampler(state="off", reason=st.reason, fix=st.fix)
        out = schema.FastSampler(state="on")
        w = self._fast_last
        if w is not None:
            out["rate_hz"] = self._fast_hz
            out["read_hz"] = self._fast.read_hz if self._fast is not None else self._fast_hz
            out["ticks"] = w.ticks
            out["late_ticks"] = w.late
            out["net_errors"] = w.net_errors
            out["interfaces_dropped"] = w.interfaces_dropped
            out["cpu_seconds"] = w.cpu_ns / 1e9
        return out

    def collectives_view(
        self, waits: Mapping[tuple[ProcessKey, Collective], tuple[int, int]]
    ) -> list[schema.CollectiveRow]:
        """The summary's `collectives`; `waits` (the model's
        collective_wait_totals): how long each process waited for each
        collective's work afterwards."""
        self._settle_pinned()
        with self.lock:
            return collective_rows(self.book, boot_wall_ns=self._boot_wall_ns, attached=self._nccl_since, waits=waits)
