"""The domain model: processes, their copies, device memory, waits and
launches, built from the kernel's event batches.

Every completed call is one event; a call whose event the ring could not
take is counted by the kernel (`lost`) and added here under host memory
"unknown", so totals stay exact. Launches are counted in the kernel.

Host memory and unified directions are decided here, in ring order: each
process has an address book of the ranges its own calls made pinned,
managed or device memory, and a copy's pointers are looked up in it as it
stood when the copy returned. Nothing here knows of ctypes, BPF or OTLP.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from memtrace.core import apis
from memtrace.core.abi import EVENT_DTYPE, Family, Layer
from memtrace.core.arrays import unique_inverse
from memtrace.core.histogram import Grouped, add_grouped_all
from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.nccl import Collective
from memtrace.core.notices import (
    Collectives,
    Events,
    Execed,
    Exited,
    Held,
    Launches,
    LaunchesMissed,
    Missed,
    Notice,
    ProcessMet,
)
from memtrace.core.overhead import Overhead, TrapCost
from memtrace.model.book import _DRIVER
from memtrace.model.collectives import WaitAttributor, sync_scopes
from memtrace.model.communicators import Communicators
from memtrace.model.communicators import attributes as comm_attributes
from memtrace.model.copies import add_copies, exact_sums, resolve, what_copies_touch
from memtrace.model.memory import memory_calls
from memtrace.model.process import (
    CopyKey,
    CopyStats,
    LaunchKey,
    LostKey,
    LostTotals,
    Process,
    SyncKey,
    SyncStats,
    direction_of,
)
from memtrace.model.steps import StepStats, StepTracker

# Per-api lookup tables for vectorised decoding.
_FAMILY = np.full(1 << 16, Family.COPY, np.uint8)  # an id this version does not know: kept as a copy
for _a in apis.APIS:
    _FAMILY[_a.id] = int(_a.family)


def _processes_of(batch: np.ndarray) -> tuple[list[ProcessKey], np.ndarray]:
    """The distinct processes (pid, start) of a batch, sorted, and each
    event's index into them."""
    pid, start = batch["pid"], batch["start_ns"]
    if (pid == pid[0]).all() and (start == start[0]).all():  # the common case: one process
        return [ProcessKey(int(pid[0]), int(start[0]))], np.zeros(len(batch), np.int64)
    order = np.lexsort((start, pid))
    sp, ss = pid[order], start[order]
    new = np.empty(len(order), bool)
    new[0] = True
    new[1:] = (sp[1:] != sp[:-1]) | (ss[1:] != ss[:-1])
    which = np.empty(len(order), np.int64)
    which[order] = np.cumsum(new) - 1
    firsts = order[new]
    keys = [ProcessKey(p, t) for p, t in zip(pid[firsts].tolist(), start[firsts].tolist(), strict=True)]
    return keys, which


_NO_EVENTS = np.zeros(0, EVENT_DTYPE)  # a CUDA batch of none (collectives alone for a step tracker)


class Model:
    MAX_NCCL_USERS = 10240  # processes said to map libnccl, kept until the model meets them (BPF's MAX_PROCESSES)

    def __init__(
        self,
        complete_after_ns: int | None = None,
        identify: Callable[[ProcessKey], ProcessInfo] = lambda key: ProcessInfo(),
        *,
        boot_wall_ns: int | None = None,
        stacks: bool = False,
        forked_since_start: Callable[[ProcessKey], bool] = lambda key: False,
        driver_mapped: Callable[[ProcessKey], list[tuple[int, int]]] = lambda key: [],
    ) -> None:
        """`complete_after_ns`: a process that started after this
        (CLOCK_BOOTTIME ns, as process keys count) was traced from its first
        CUDA call; None: every process is (`memtrace run`'s command).
        `identify`: what the host adds to a process's identity (the runtime
        reads it; the model does no I/O). `boot_wall_ns`: the host's boot
        time, wall clock, the same in every agent: a process's start (boot
        ns) plus it never moves; by default the two clocks sampled now.
        `stacks`: calls are kept by call site too (the kernel takes stacks).
        `forked_since_start`: the kernel's word on whether a process was
        forked once the probes were live (exact even when it is gone before
        its events are decoded). `driver_mapped`: for a process not seen
        from its start, the host memory ranges its GPU driver mapped into it
        (/dev/nvidia*): pinned, whatever it called before tracing began.
        """
        self.processes: dict[ProcessKey, Process] = {}
        self.events = 0
        # A process that started after this (CLOCK_BOOTTIME ns, as process
        # keys count) was traced from its first CUDA call; None: every
        # process is (`memtrace run`).
        self.complete_after_ns = complete_after_ns
        self.forked_since_start = forked_since_start
        self.identify = identify
        self._driver_mapped = driver_mapped
        self.boot_wall_ns = (
            boot_wall_ns if boot_wall_ns is not None else time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        )
        self.stacks = stacks
        self.step_trackers: dict[ProcessKey, StepTracker] = {}  # its steps (model/steps.py)
        # Who waited for its collectives (model/collectives.py), for processes that made any.
        self.collective_waits: dict[ProcessKey, WaitAttributor] = {}
        # Processes said to have libnccl mapped, perhaps before the model met
        # them: their waits are kept from their first event on (a key whose
        # start is not known, 0, stands for the next process of its pid).
        self._nccl_users: set[ProcessKey] = set()
        self.collectives_unmatched = 0  # NCCL events of a pid the model has no live process for
        # The NCCL communicators each process made (model/communicators.py), and the
        # attributes they gave it (taken again when its communicators change).
        self.communicators = Communicators()
        self._comm_attributes: dict[ProcessKey, frozenset[str]] = {}
        self._by_pid: dict[int, ProcessKey] = {}  # the latest process of each pid
        self.trap_cost: TrapCost | None = None  # what a probe's trap costs on this host, once measured

    def _process(self, key: ProcessKey, info: ProcessInfo | None = None) -> Process:
        p = self.processes.get(key)
        if p is None:
            info = info if info is not None and info.exe else self.identify(key)
            p = Process(
                key,
                name=info.name,
                exe=info.exe,
                ppid=info.ppid,
                start_ns=self.boot_wall_ns + key.start_ns if key.start_ns else 0,
                attributes=dict(info.attributes),
            )
            after = self.complete_after_ns
            p.complete = after is None or key.start_ns > after or self.forked_since_start(key)
            if not p.complete:
                # Met mid-run: what its driver mapped before then is pinned; the rest stays unknown.
                for lo, hi in self._driver_mapped(key):
                    p.book.add(lo, hi - lo, _DRIVER)
            self.processes[key] = p
            if key.start_ns >= self._by_pid.get(key.pid, ProcessKey(0, 0)).start_ns:
                self._by_pid[key.pid] = key
            if key in self._nccl_users or ProcessKey(key.pid, 0) in self._nccl_users:
                self.collective_waits.setdefault(key, WaitAttributor())
            if self.communicators.of(key):
                self._name_communicator(p)
        return p

    def tracing_from(self, boot_ns: int) -> None:
        """The probes went live at `boot_ns` (CLOCK_BOOTTIME): a process that
        started later is traced from its first CUDA call (unless every
        process is: `complete_after_ns` None)."""
        if self.complete_after_ns is not None:
            self.complete_after_ns = boot_ns

    def take(self, notices: Sequence[Notice]) -> None:
        """Fold the sensors' notices (core/notices.py) in their order;
        consecutive event batches fold as one."""
        batches: list[np.ndarray] = []
        for n in notices:
            if isinstance(n, Events):
                batches.append(n.batch)
                continue
            if batches:
                self.add_events(batches[0] if len(batches) == 1 else np.concatenate(batches))
                batches = []
            match n:
                case ProcessMet():
                    self.introduce(n.key, n.comm, n.cgroup_id, n.info)
                case Held():
                    self.mark_complete(n.key, n.info)  # held before its CUDA library ran: nothing was missed
                case Missed():
                    self.mark_incomplete(n.key)
                case LaunchesMissed():
                    self.mark_launches_partial(n.key)
                case Execed():
                    self.execed(n.key, n.comm, n.exe)
                case Exited():
                    self.process_exited(n.key, n.cpu_ns)
                case Collectives():
                    self.add_collectives(n.events, n.complete_until_ns, n.users)
                    self.add_communicators(n.comms, n.events)
                case Launches():
                    self.add_launch_returns(n.batch)
        if batches:
            self.add_events(batches[0] if len(batches) == 1 else np.concatenate(batches))

    def introduce(self, key: ProcessKey, name: str, cgroup_id: int, info: ProcessInfo | None = None) -> None:
        """Who a process is, as BPF saw it at its first event: this name wins
        over the host's. `info`: what the host said of it then; it fills in a
        process the model met first by its events and could not read (gone)."""
        p = self._learn(key, info)
        if name:
            p.name = name
        p.cgroup_id = cgroup_id

    def execed(self, key: ProcessKey, name: str, exe: str) -> None:
        """The process runs another program now: its name and executable are
        the new program's (a process the model never met stays unmet)."""
        p = self.processes.get(key)
        if p is not None:
            p.name, p.exe = name or p.name, exe or p.exe

    def mark_complete(self, key: ProcessKey, info: ProcessInfo | None = None) -> None:
        """The process was held before its CUDA library ran: nothing was
        missed. `info`: what the host said of it while it was held."""
        self._learn(key, info).complete = True

    def _learn(self, key: ProcessKey, info: ProcessInfo | None) -> Process:
        """The process, met with what the host said of it (`info`, read while
        it was surely alive), or filled in with it if the model met it first
        by its events, when it could no longer be read."""
        p = self._process(key, info)
        if info is not None and not p.exe and info.exe:
            p.exe, p.ppid = info.exe, info.ppid or p.ppid
            p.attributes = {**info.attributes, **p.attributes}
        return p

    # Every process's state, merged (for tests and whole-model views).
    @property
    def copies(self) -> dict[CopyKey, CopyStats]:
        return {k: v for p in self.processes.values() for k, v in p.copies.items()}

    @property
    def syncs(self) -> dict[SyncKey, SyncStats]:
        return {k: v for p in self.processes.values() for k, v in p.syncs.items()}

    @property
    def launches(self) -> dict[LaunchKey, int]:
        return {k: v for p in self.processes.values() for k, v in p.launches.items()}

    @property
    def lost(self) -> dict[LostKey, LostTotals]:
        return {k: v for p in self.processes.values() for k, v in p.lost.items()}

    def mark_incomplete(self, key: ProcessKey) -> None:
        """The process ran CUDA code before its probes were in: its host memory may be unknown."""
        self._process(key).complete = False

    # ---- events ----

    def add_events(self, batch: np.ndarray) -> None:
        """Fold a batch of decoded mt_event records, in ring order."""
        if len(batch) == 0:
            return
        self.events += len(batch)
        keys, proc = _processes_of(batch)
        procs = [self._process(k) for k in keys]
        values: list[Grouped] = []  # what the copies and waits add to their histograms
        fam = _FAMILY[batch["api"]]
        copies = np.flatnonzero(fam == Family.COPY)
        mem = np.flatnonzero(fam == Family.MEM)
        ops = memory_calls(batch[mem], mem, proc[mem], procs, self.stacks) if len(mem) else None
        if len(copies) or ops is not None:
            src_what, dst_what = what_copies_touch(batch, copies, ops, proc, procs)
        if len(copies):
            b = batch[copies]
            direction, host = resolve(b, src_what, dst_what, proc[copies], procs)
        if len(copies):
            add_copies(b, direction, host, proc[copies], procs, values, self.stacks)
        syncs = fam == Family.SYNC
        if syncs.any():
            self._add_syncs(batch[syncs], proc[syncs], procs, values)
        add_grouped_all(values)  # the copies' and waits' histograms in one pass
        # Each process's events, in ring order: one sort, not a pass per process.
        order = np.argsort(proc, kind="stable")
        bounds = np.searchsorted(proc[order], np.arange(len(keys) + 1)).tolist()
        for i, key in enumerate(keys):
            t = self.step_trackers.get(key)
            if t is None:
                t = self.step_trackers[key] = StepTracker(key.pid)
            t.add(batch if len(keys) == 1 else batch[order[bounds[i] : bounds[i + 1]]])

    def add_collectives(
        self, events: np.ndarray, complete_until_ns: int, users: frozenset[ProcessKey] = frozenset()
    ) -> None:
        """The NCCL sensor's events (EVENT_DTYPE of memtrace.core.nccl), complete
        up to `complete_until_ns`: each process's collectives join its steps
        (the `collective` share) and the waits that followed are charged to them.
        `users`: processes with libnccl mapped: their waits are kept from now on,
        before their first collective is polled (a poll comes less often than a drain),
        and from its first event for one the model has not met yet (the CUDA
        sensor reports a held libnccl mapping before the process's first call)."""
        self._nccl_users |= users
        if len(self._nccl_users) > self.MAX_NCCL_USERS:  # processes never met, kept too long: the latest word only
            self._nccl_users = set(users)
        for user in users:
            met = user if user.start_ns else self._by_pid.get(user.pid, user)
            if met in self.processes and met not in self.collective_waits:
                self.collective_waits[met] = WaitAttributor()
        if len(events):
            pids, inv = unique_inverse(events["pid"])
            for i, pid in enumerate(pids.tolist()):
                key = self._by_pid.get(pid)
                ev = events[inv == i]
                if key is None or key not in self.processes:
                    self.collectives_unmatched += len(ev)
                    continue
                att = self.collective_waits.get(key)
                if att is None:
                    att = self.collective_waits[key] = WaitAttributor()
                att.add_collectives(ev)
                t = self.step_trackers.get(key)
                if t is None:
                    t = self.step_trackers[key] = StepTracker(key.pid)
                t.add(_NO_EVENTS, ev)
        for att in self.collective_waits.values():
            att.advance(complete_until_ns)

    def add_communicators(self, records: np.ndarray, events: np.ndarray | None = None) -> None:
        """The NCCL sensor's communicator records (COMM_EVENT_DTYPE of
        memtrace.core.nccl), and the collectives made since (counted by
        communicator): a process's communicator names it on every signal
        (model/communicators.py). A process the model has not met yet is
        named when it is met (up to Communicators.MAX_UNMET such processes)."""
        changed = self.communicators.add(records)
        for key in sorted(changed):
            p = self.processes.get(key)
            if p is not None:
                self._name_communicator(p)
        if changed - self.processes.keys():
            self.communicators.prune(self.processes)
        if events is not None and len(events):
            self.communicators.count_calls(events)

    def _name_communicator(self, p: Process) -> None:
        """The process's attributes with its communicator's (replacing those
        an earlier one gave): one dict swapped whole, for lock-free readers."""
        main = self.communicators.main(p.key)
        if main is None:
            return
        given = self._comm_attributes.get(p.key, frozenset())
        base = {k: v for k, v in p.attributes.items() if k not in given}
        launcher = {k: v for k, v in base.items() if k.startswith("memtrace.job.")}
        mine = comm_attributes(main, launcher)
        p.attributes = {**base, **mine}
        self._comm_attributes[p.key] = frozenset(mine)

    def _add_syncs(self, b: np.ndarray, proc: np.ndarray, procs: list[Process], values: list[Grouped]) -> None:
        """Waits into their stats; their durations into `values`, for their histograms."""
        if self.collective_waits:  # the waits of processes that made collectives, for their attribution
            for i in np.unique(proc).tolist():
                att = self.collective_waits.get(procs[i].key)
                if att is not None:
                    mine = b[proc == i]
                    att.add_syncs(
                        mine["ts_ns"].astype(np.int64),
                        mine["duration_ns"].astype(np.int64),
                        mine["stream"],
                        sync_scopes(mine["api"]),
                    )
        keys = proc.astype(np.uint64) << np.uint64(16) | b["api"].astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        keys, dur, ret = keys[order], b["duration_ns"][order], b["ret"][order]
        uniq, starts = np.unique(keys, return_index=True)
        counts = np.diff(np.append(starts, len(keys)))
        errors = np.add.reduceat((ret != 0).astype(np.int64), starts)
        stats = []
        for k, n, err, dsum in zip(
            uniq.tolist(), counts.tolist(), errors.tolist(), exact_sums(dur, starts), strict=True
        ):
            p = procs[k >> 16]
            key = SyncKey(p.key, k & 0xFFFF)
            st = p.syncs.get(key)
            if st is None:
                st = p.syncs[key] = SyncStats()
            st.calls += n
            st.errors += err
            st.duration_ns += dsum
            stats.append(st)
        values.append(([st.durations for st in stats], starts, dur.astype(np.float64) * 1e-9))

    # ---- what the kernel counts ----

    def set_lost(
        self, key: ProcessKey, api: int, direction: int, calls: int, nbytes: int, errors: int, dur: int
    ) -> None:
        self._process(key).lost[LostKey(key, api, direction_of(direction))] = (calls, nbytes, errors, dur)

    def lost_memory_calls(self, key: ProcessKey) -> int:
        """Memory calls of a process whose event was lost: its address book may be incomplete."""
        p = self.processes.get(key)
        return p.lost_memory_calls() if p else 0

    def set_launches(
        self,
        key: ProcessKey,
        counts: dict[int, int],
        traps: int | None = None,
        duty: float | None = None,
        error: float | None = 0.0,
    ) -> None:
        """A process's launches by api. `traps`: the launch traps it took,
        when that is not their sum (the budget sampled them: `duty`, and the
        counts are partly extrapolated, within `error` of the truth, relative;
        None: not bounded)."""
        p = self._process(key)
        for api, n in counts.items():
            p.launches[LaunchKey(key, api)] = n
        p.launch_traps = sum(counts.values()) if traps is None else traps
        if duty is not None:
            p.launch_duty = duty
            p.launch_error = error

    def mark_launches_partial(self, key: ProcessKey) -> None:
        """It may have launched before it had launch probes of its own."""
        self._process(key).launches_partial = True

    # ---- views ----

    def copy_view(self) -> dict[CopyKey, CopyStats]:
        """Every copy key of every process with its exact totals (Process.copy_view)."""
        out: dict[CopyKey, CopyStats] = {}
        for p in self.processes.values():
            out.update(p.copy_view())
        return out

    def sync_view(self) -> dict[SyncKey, SyncStats]:
        out: dict[SyncKey, SyncStats] = {}
        for p in self.processes.values():
            out.update(p.sync_view())
        return out

    def steps_view(self) -> dict[ProcessKey, StepStats]:
        """Each process with steps: the steps of its stepping thread, by process."""
        out = {}
        for key, t in sorted(self.step_trackers.items()):
            st = t.stats()
            if st is not None:
                out[key] = st
        return out

    def process_exited(self, key: ProcessKey, cpu_ns: int = 0) -> None:
        """`cpu_ns`: its whole CPU time, as the kernel had it at the exit (0: not said)."""
        p = self.processes.get(key)
        if p is not None:
            p.exited = True
            p.exited_ns = p.exited_ns or time.time_ns()
            if cpu_ns:
                p.cpu_ns, p.cpu_final = cpu_ns, True

    def set_traps(self, key: ProcessKey, traps: int) -> None:
        self._process(key).traps = traps

    def add_launch_returns(self, batch: np.ndarray) -> None:
        """A timeline's launch records (core/notices.Launches): each is a launch's return
        trap, a trap its process paid beside the launch's entry (core/overhead.Overhead)."""
        if not len(batch):
            return
        keys, counts = np.unique(batch[["pid", "start_ns"]], return_counts=True)
        for k, n in zip(keys, counts, strict=True):
            self._process(ProcessKey(int(k["pid"]), int(k["start_ns"]))).launch_returns += int(n)

    def set_cpu(self, key: ProcessKey, cpu_ns: int) -> None:
        """A running process's CPU time so far (never over its final figure)."""
        p = self.processes.get(key)
        if p is not None and not p.cpu_final:
            p.cpu_ns = cpu_ns

    def overhead(self, key: ProcessKey) -> Overhead | None:
        """What the probes cost the process, by the calibrated trap cost
        (`trap_cost`, set by the agent); None if it took no trap or the
        cost is not known yet."""
        p = self.processes.get(key)
        if p is None or self.trap_cost is None:
            return None
        launch_traps = p.launch_traps
        if not p.traps and not launch_traps:
            return None
        cpu = p.cpu_ns / 1e9 if p.cpu_ns is not None else None
        # A launch's return (a timeline's) is priced as an exact call's return is.
        traps = p.traps + launch_traps + p.launch_returns
        return Overhead(traps, launch_traps, self.trap_cost, cpu, p.cpu_final)

    def forget(self, key: ProcessKey) -> None:
        """Drop a process and everything it did (its own state: no scan)."""
        self.processes.pop(key, None)
        self.step_trackers.pop(key, None)
        self.collective_waits.pop(key, None)
        self.communicators.forget(key)
        self._comm_attributes.pop(key, None)
        self._nccl_users.discard(key)
        self._nccl_users.discard(ProcessKey(key.pid, 0))
        if self._by_pid.get(key.pid) == key:
            del self._by_pid[key.pid]

    def collective_wait_totals(self) -> dict[tuple[ProcessKey, Collective], tuple[int, int]]:
        """Per (process, collective): the waits charged to it, and their total ns."""
        out: dict[tuple[ProcessKey, Collective], tuple[int, int]] = {}
        for key, att in self.collective_waits.items():
            for c, v in att.by_collective.items():
                out[(key, c)] = v
        return out


def describe(key: CopyKey) -> tuple[str, str, str, bool, str | None]:
    """(layer, api, direction, synchronous, host memory) labels of a copy key."""
    api = apis.BY_ID.get(key.api)
    layer = api.layer.label if api else Layer.DRIVER.label
    return layer, apis.api_name(key.api), key.direction.label, bool(api and api.synchronous), key.host.label
