"""Live diagnosis: every WINDOW_S, what changed in each traced process and
on the host (from the model and the host signals' book) becomes one window
for the diagnosis engine (analysis/diagnosis.py). Runs on the host-signal
sampling thread; takes the model lock, then the book's, briefly each.

A window is the difference of two readings of cumulative counters, so the
previous reading of each process is kept, by its ProcessKey (a reused pid
is another process, never a difference across two), for the live
processes only: an exited one makes no more windows, and an agent that
meets a process a second for weeks keeps no state of those gone."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from memtrace.analysis.diagnosis import Diagnoser, Diagnosis, GpuWindow, HostWindow, LinkWindow, ProcWindow
from memtrace.core.cpu import CpuStats
from memtrace.core.histogram import ExpHistogram
from memtrace.core.ids import ProcessKey
from memtrace.core.tcp import TcpPath
from memtrace.model.host import HostBook
from memtrace.model.steps import Loop, StepStats
from memtrace.runtime.agent import Agent
from memtrace.runtime.hostsignals import HostSignals
from memtrace.sources.cgroup import CgroupNames
from memtrace.sources.psi import Stall
from memtrace.sources.steal import Steal, share
from memtrace.sources.tcp import TcpSource

log = logging.getLogger("memtrace")

AGENT_COMM = "memtrace (this agent)"  # a preemptor that is memtrace's own threads


@dataclass(frozen=True)
class _Counters:
    """A process's cumulative counters as a window reads them; a window's
    own figures are the difference of two readings, field by field."""

    steps: int = 0
    step_ns: int = 0
    gpu_idle_ns: int = 0
    host_ns: int = 0
    collective_ns: int = 0  # in its collective calls, within steps
    copy_bytes: int = 0
    copy_ns: int = 0
    waited_ns: int = 0  # in the waits charged to its collectives

    def __sub__(self, prev: _Counters) -> _Counters:
        return _Counters(*(getattr(self, f.name) - getattr(prev, f.name) for f in dataclasses.fields(self)))


_K = TypeVar("_K")
_C = TypeVar("_C", bound=tuple[int, ...])


def grown(prev: Mapping[_K, _C], cur: Mapping[_K, _C]) -> dict[_K, _C]:
    """Per class, what its cumulative counters (the first one a count) moved from `prev` to
    `cur`: the classes whose count grew, each counter's difference (a class not in `prev`: all
    of it). A server's iterations and copies, a training loop's steps, by class."""
    out: dict[_K, _C] = {}
    for k, now in cur.items():
        was = prev.get(k)
        if now[0] > (0 if was is None else was[0]):
            out[k] = now if was is None else cast(_C, tuple(a - b for a, b in zip(now, was, strict=True)))
    return out


def longest_added(prev: ExpHistogram | None, cur: ExpHistogram) -> int:
    """The longest duration added to a histogram of seconds since its copy `prev`, at least
    (ns: the lower edge of its bucket, within 2.2% at the default scale); 0 where that cannot
    be told (no copy, nothing added, or `cur` not what `prev` grew into: a process's steps
    now another thread's)."""
    if prev is None or prev.scale < cur.scale or prev.count >= cur.count:
        return 0
    base = prev.downscaled(cur.scale) if prev.scale > cur.scale else prev
    n = len(base.buckets)
    if n and (base.offset < cur.offset or base.offset + n > cur.offset + len(cur.buckets)):
        return 0
    d = cur.minus(base)
    if not len(d.buckets) or (d.buckets < 0).any():
        return 0
    top = int(np.flatnonzero(d.buckets)[-1]) + d.offset
    return int(2.0 ** (top * 2.0**-d.scale) * 1e9)


# The training loops' TCP connections are read every this many windows (2 s): a slowdown's round
# trips are judged against theirs in the baseline (analysis/diagnosis.Diagnoser._remote).
TCP_EVERY = 4


def _whom(d: Diagnosis) -> str:
    """Whom a straggler diagnosis's process waits for, where it waits (for the log line)."""
    ev = d.evidence
    if "waits_for_pid" in ev:
        return f": waits for pid {ev['waits_for_pid']}"
    if "waits_for_peer" in ev:
        return (
            f": waits for {ev['waits_for_peer']} across the network, round trip"
            f" {ev['round_trip_seconds'] * 1e3:.3g} ms, {ev['baseline_round_trip_seconds'] * 1e3:.3g} ms before"
        )
    return ""


class LiveDiagnosis:
    def __init__(
        self, agent: Agent, host: HostSignals, on_diagnosis: Callable[[Diagnosis], None] | None = None
    ) -> None:
        self.agent = agent
        self.host = host
        self.tcp = TcpSource()
        self._ticks = 0  # windows judged (every TCP_EVERY-th reads the loops' TCP connections)
        self._tcp_warned = False
        self.engine = Diagnoser(tcp=self._paths)
        self.on_diagnosis = on_diagnosis
        # Each live process's readings at the last window.
        self._prev_counters: dict[ProcessKey, _Counters] = {}
        self._prev_cpu: dict[ProcessKey, CpuStats] = {}
        self._prev_quota: dict[ProcessKey, int] = {}  # its CPU quota's throttled ns
        self._prev_hits: dict[ProcessKey, int] = {}  # its memory cgroups' limit hits
        self._prev_calls: dict[ProcessKey, int] = {}  # ns in its collective calls, as the NCCL sensor has them
        self._prev_work: dict[ProcessKey, dict[tuple[int, int], tuple[int, int]]] = {}  # a server's, by class
        self._prev_classes: dict[ProcessKey, dict[tuple[int, int], tuple[int, int]]] = {}  # a training loop's
        self._prev_sizes: dict[ProcessKey, dict[tuple[int, int], tuple[int, int, int]]] = {}  # its copies, by size
        self._prev_durations: dict[ProcessKey, ExpHistogram] = {}  # its step durations (s)
        self._prev_pcie: dict[str, int] = {}  # per GPU: the PCIe bytes its driver counted
        self._prev_t: int | None = None
        self._prev_stall: int | None = None
        self._prev_replays: dict[str, int] = {}
        self._prev_links: dict[Any, tuple[int, ...]] = {}
        self.failures = 0
        # The CPU its ticks took, less the agent's drain and fold they ask for (Agent.fold_cpu_ns
        # counts the fold): what the diagnosis itself costs (bench/targets/agent_cpu.py).
        self.cpu_ns = 0
        self._agent_ns = 0  # of its ticks' CPU, the agent's drain and fold
        self._stall = Stall("memory")
        self._steal = Steal()
        self._prev_steal: dict[int, int] | None = None

    def _read_paths(self, procs: dict[ProcessKey, ProcWindow]) -> None:
        """The TCP connections of the training loops that stepped in this window: their round
        trips while healthy are what a slowdown's are judged against (Diagnoser._remote)."""
        keys = [k for k, w in procs.items() if w.steps and not w.serving]
        got = self.tcp.paths_of([k.pid for k in keys], fresh=False, prune=True)  # lets go of what none needs
        for k in keys:
            procs[k].tcp = got.get(k.pid)
        self._tcp_said()

    def _paths(self, key: ProcessKey) -> tuple[TcpPath, ...] | None:
        """A process's TCP connections, for the diagnosis: those its last scan found, each looked
        up now. A connection made since has no baseline to be judged against, and a fresh scan
        at every window judged (a process of 10,000 files: 60 ms) would cost far more."""
        got = self.tcp.paths_of([key.pid], fresh=False)[key.pid]
        self._tcp_said()
        return got

    def _tcp_said(self) -> None:
        """The first failure to read a process's TCP connections for another reason than its
        exit (no privilege to enter its namespace or read its files, no sock_diag) is logged
        once; every failure is counted (TcpSource.failures)."""
        if not self._tcp_warned and self.tcp.last_errno not in (0, errno.ENOENT, errno.ESRCH):
            self._tcp_warned = True
            log.warning(
                "TCP connections not read (%s): a wait on the network reads as input starvation", self.tcp.last_error
            )

    @property
    def diagnoses(self) -> list[Diagnosis]:
        return self.engine.diagnoses

    def counts(self) -> dict[ProcessKey, dict[str, int]]:
        """Diagnoses so far per process and cause (for the OTLP counter)."""
        out: dict[ProcessKey, dict[str, int]] = {}
        for d in list(self.engine.diagnoses):
            c = out.setdefault(d.key, {})
            c[d.cause] = c.get(d.cause, 0) + 1
        return out

    def _prune(self, live: set[ProcessKey]) -> None:
        """Keep the readings, and the engine's history, of the live processes only."""
        for prev in (
            self._prev_counters,
            self._prev_cpu,
            self._prev_quota,
            self._prev_hits,
            self._prev_calls,
            self._prev_work,
            self._prev_classes,
            self._prev_sizes,
            self._prev_durations,
        ):
            for key in prev.keys() - live:
                del prev[key]
        for key in self.engine.seen.keys() - live:
            self.engine.gone(key)

    def tick(self) -> list[Diagnosis]:
        """One window; returns the diagnoses it made. Never raises: a failure is counted and logged once."""
        start, agent = time.thread_time_ns(), self._agent_ns
        try:
            return self._tick()
        except Exception as e:  # noqa: BLE001 - the analysis must never stop the sampling or the traced run
            self.failures += 1
            if self.failures == 1:
                log.warning("diagnosis failed (%s: %s); counted in host.diagnosis_failures", type(e).__name__, e)
            return []
        finally:
            self.cpu_ns += time.thread_time_ns() - start - (self._agent_ns - agent)

    def _tick(self) -> list[Diagnosis]:
        mono = time.monotonic_ns()
        offset = time.time_ns() - mono
        seconds = (mono - self._prev_t) / 1e9 if self._prev_t is not None else 0.0
        first = self._prev_t is None
        self._prev_t = mono
        procs: dict[ProcessKey, ProcWindow] = {}
        copy_bytes: dict[ProcessKey, int] = {}
        calls_ns: dict[ProcessKey, int] = {}  # time in collective calls within steps, this window
        entered = time.thread_time_ns()
        with self.agent.locked() as model:
            self._agent_ns += time.thread_time_ns() - entered  # its drain and fold: the agent's
            live = [(k, p) for k, p in model.processes.items() if not p.exited]
            for key, proc in live:
                st = model.step_trackers.get(key)
                steps = st.stats() if st is not None else None
                copies = proc.copy_view().values()
                # The waits charged to its collectives: NCCL returns at once, and a rank
                # waits for its peers in the synchronisation that follows.
                att = model.collective_waits.get(key)
                cur = _Counters(
                    copy_bytes=sum(c.bytes for c in copies),
                    copy_ns=sum(c.duration_ns for c in copies),
                    waited_ns=sum(ns for _n, ns in att.by_collective.values()) if att is not None else 0,
                )
                if steps is not None:
                    cur = dataclasses.replace(
                        cur,
                        steps=steps.steps,
                        step_ns=steps.step_ns,
                        gpu_idle_ns=steps.gpu_idle_ns,
                        host_ns=steps.host_ns,
                        collective_ns=steps.collective_ns,
                    )
                prev = self._prev_counters.get(key)
                self._prev_counters[key] = cur
                work = self._work(key, steps)
                classes = self._classes(key, steps)
                sizes = self._sizes(key, steps)
                longest = self._longest(key, steps)
                if prev is None:
                    continue
                d = cur - prev
                copy_bytes[key] = d.copy_bytes
                calls_ns[key] = d.collective_ns
                procs[key] = ProcWindow(
                    key=key,
                    name=proc.name,
                    exe=proc.exe.rsplit("/", 1)[-1] if proc.exe else proc.name,
                    ppid=proc.ppid,
                    start_ns=proc.start_ns,
                    steps=d.steps,
                    step_ns=d.step_ns,
                    gpu_idle_ns=d.gpu_idle_ns,
                    host_ns=d.host_ns,
                    collective_ns=d.collective_ns + d.waited_ns,  # in the calls, and waiting for them after
                    copy_bytes=d.copy_bytes,
                    copy_ns=d.copy_ns,
                    job=str(proc.attributes.get("memtrace.job.id", "")),
                    longest_ns=longest,
                    serving=work is not None,
                    work=work or {},  # a server's first window as one: no classes yet (learned next)
                    copies=sizes or {},
                    classes=classes,
                )
        if not live:
            # Nothing to judge (an idle node): the host's readings are not taken, and the next
            # window with a process is a first one, every counter read afresh, as at the start (a
            # process is judged from its second window: its first has no counters before it).
            self._prune(set())
            self._prev_t = None
            self.engine.observe([], HostWindow(end_ns=mono, wall_offset_ns=offset, seconds=seconds or 0.5))
            return []
        hw = HostWindow(end_ns=mono, wall_offset_ns=offset, seconds=seconds or 0.5, copy_bytes=copy_bytes)
        stall = self._stall.read_us()
        if stall is not None and self._prev_stall is not None:
            hw.memory_stall_ns = (stall - self._prev_stall) * 1000
        self._prev_stall = stall
        self._steal_shares(procs, seconds)
        with self.host.lock:
            book = self.host.book
            calls: dict[ProcessKey, int] = {}
            for (owner, _c), t in book.collectives.items():
                calls[owner] = calls.get(owner, 0) + t.duration_ns
            for key, w in procs.items():
                cpu = book.cpu.get(key)
                cpu_before = self._prev_cpu.get(key)
                if cpu is not None:
                    self._prev_cpu[key] = cpu
                if cpu is not None and cpu_before is not None:
                    win = cpu.since(cpu_before)
                    w.runq_ns, w.on_cpu_ns, w.off_cpu_ns = win.runq_ns, win.oncpu_ns, win.offcpu_ns
                    w.preemptors = {p.cgroup_id: (p.wait_ns, "", self._comm(p.pid, p.comm)) for p in win.preemptors}
                q = book.quota_throttled_ns.get(key)
                if q is not None:
                    w.quota_throttled_ns = q[1] - self._prev_quota.get(key, q[1])
                    self._prev_quota[key] = q[1]
                hits = book.memory_limit_hits.get(key)
                if hits is not None:
                    w.memory_limit_hits = max(hits - self._prev_hits.get(key, hits), 0)
                    self._prev_hits[key] = hits
                coll = calls.get(key, 0)
                before = self._prev_calls.get(key)
                self._prev_calls[key] = coll
                if before is not None and coll - before > calls_ns.get(key, 0):
                    # The calls' own time as the NCCL sensor has it, where the steps have less (none).
                    w.collective_ns += coll - before - calls_ns.get(key, 0)
                w.netns = book.netns_of(key.pid)
            hw.gpus = self.gpu_windows(book)
            hw.links = self._links(book, seconds)
        self._prune({key for key, _ in live})
        if first:
            return []
        self._ticks += 1
        if self._ticks % TCP_EVERY == 0:
            self._read_paths(procs)
        made = self.engine.observe(list(procs.values()), hw)
        if log.isEnabledFor(logging.DEBUG):
            gpus = ", ".join(f"{g.index}: throttled {g.throttled} x{g.link_width}" for g in hw.gpus)
            links = ", ".join(
                f"{x.interface}@{x.netns}: busy {x.utilization or 0:.0%}, held {x.overlimits}, dropped {x.drops}"
                for x in hw.links
                if x.interface != "lo"
            )
            log.debug(
                "diagnosis window: %.2f s; GPUs %s; memory stall %s ns; links %s",
                hw.seconds,
                gpus,
                hw.memory_stall_ns,
                links,
            )
            for key, w in procs.items():
                mean = f"{w.step_ns / w.steps * 1e-6:.3g} ms" if w.steps else "no steps"
                if w.steal_share:
                    mean += f", {w.steal_share:.1%} stolen"
                if w.collective_ns and w.step_ns:
                    mean += f", {w.collective_ns / w.step_ns:.0%} in collectives"
                if w.memory_limit_hits:
                    mean += f", {w.memory_limit_hits} memory limit hits"
                if w.netns is not None:
                    mean += f", netns {w.netns}"
                if w.copy_ns:
                    mean += f", copies {w.copy_bytes / w.copy_ns:.3g} GB/s ({w.copy_bytes / 2**20:.1f} MiB)"
                if w.serving:
                    mean += f", {sum(n for n, _ns in w.work.values())} iterations"
                for link in hw.links:
                    if link.netns == w.netns and link.interface != "lo":
                        busy = "" if link.utilization is None else f" {link.utilization:.0%} busy"
                        moved = "" if link.bytes is None else f" {link.bytes / 2**20:.1f} MiB"
                        mean += f", {link.interface}{busy}{moved} {link.overlimits + link.drops} held or dropped"
                log.debug("diagnosis window: pid %d %s: %s; %s", key.pid, w.name, mean, self.engine.state(key))
        names = CgroupNames() if made else None
        for diag in made:
            who = diag.evidence.get("taken_by")
            if names is not None and isinstance(who, dict) and who.get("cgroup_id"):
                who["cgroup"] = names.path(who["cgroup_id"])
            if isinstance(who, dict):
                # Its own threads took the CPU: said so, never left for a user to recognise.
                who["memtrace"] = who.get("process") == AGENT_COMM
            if isinstance(who, str) and who.startswith("its own CPU quota"):
                self._name_quota(diag)
            log.warning(
                "diagnosis: pid %d %s: %s (%s%s)", diag.key.pid, diag.process, diag.symptom, diag.cause, _whom(diag)
            )
            if self.on_diagnosis is not None:
                self.on_diagnosis(diag)
        return made

    def _steal_shares(self, procs: dict[ProcessKey, ProcWindow], seconds: float) -> None:
        """Each process's share of the window the hypervisor stole from the CPUs it may run on
        (its affinity now: a CPU manager may move it)."""
        steal = self._steal.read()
        before, self._prev_steal = self._prev_steal, steal
        if steal is None or before is None or not any(steal.values()):
            return  # not a VM (no steal ever): nothing to weigh
        for key, w in procs.items():
            try:
                cpus = os.sched_getaffinity(key.pid)
            except OSError:
                continue  # gone, or in a pid namespace this agent cannot see into
            w.steal_share = share(before, steal, cpus, seconds)

    @staticmethod
    def _comm(pid: int, comm: str) -> str:
        """A preempting process's name; memtrace itself (the agent's threads) as AGENT_COMM."""
        return AGENT_COMM if pid == os.getpid() else comm

    def _longest(self, key: ProcessKey, steps: StepStats | None) -> int:
        """The window's longest step (longest_added) from the process's step histograms."""
        if steps is None:
            self._prev_durations.pop(key, None)
            return 0
        prev = self._prev_durations.get(key)
        self._prev_durations[key] = steps.durations.copy()
        return longest_added(prev, steps.durations)

    def _work(self, key: ProcessKey, steps: StepStats | None) -> dict[tuple[int, int], tuple[int, int]] | None:
        """A server's iterations in the window by class of work: (iterations, busy ns), the
        difference of its cumulative classes (the first window it is one: all it did so far, to be
        learned, never judged); None for a process that is not a server (yet)."""
        if steps is None or steps.loop is not Loop.SERVING:
            self._prev_work.pop(key, None)
            return None
        cur = {wk: (w.steps, w.busy_ns) for wk, w in steps.work.items()}
        prev = self._prev_work.get(key, {})
        self._prev_work[key] = cur
        return grown(prev, cur)

    def _classes(self, key: ProcessKey, steps: StepStats | None) -> dict[tuple[int, int], tuple[int, int]]:
        """A training loop's steps in the window by class of work: (steps, step ns), the difference
        of its cumulative classes ({} for a server, or in its first window)."""
        if steps is None or steps.loop is Loop.SERVING:
            self._prev_classes.pop(key, None)
            return {}
        cur = {wk: (w.steps, w.step_ns) for wk, w in steps.work.items()}
        prev = self._prev_classes.get(key)
        self._prev_classes[key] = cur
        return {} if prev is None else grown(prev, cur)

    def _sizes(self, key: ProcessKey, steps: StepStats | None) -> dict[tuple[int, int], tuple[int, int, int]] | None:
        """A server's copies in the window by (direction, size class): (calls, bytes, ns), as _work's
        classes (the first window it is one: none); None for a process that is not a server (yet)."""
        if steps is None or steps.loop is not Loop.SERVING:
            self._prev_sizes.pop(key, None)
            return None
        cur = {ck: (c.calls, c.bytes, c.ns) for ck, c in steps.copies.items()}
        prev = self._prev_sizes.get(key)
        self._prev_sizes[key] = cur
        return None if prev is None else grown(prev, cur)

    def _name_quota(self, diag: Diagnosis) -> None:
        """Whose quota throttled it (`quota_cgroup`): the cgroup it is charged to
        now, so a job moved under a CPU manager's quota names that one."""
        with self.host.lock:
            q = self.host.book.quota_throttled_ns.get(diag.key)
        if q is not None:
            diag.evidence["quota_cgroup"] = q[0]

    def gpu_windows(self, book: HostBook) -> list[GpuWindow]:
        """Each GPU in this window: its state now, and what its cumulative counters moved since the
        previous window (PCIe replays; PCIe bytes where the driver counts them). Caller holds the lock."""
        out = []
        for g in book.gpus.values():
            latest, last = g.latest, g.last
            replays = g.replays_since_start()
            prev_r = self._prev_replays.get(g.uuid)
            if replays is not None:
                self._prev_replays[g.uuid] = replays
            pcie = g.pcie_tx_count.bytes + g.pcie_rx_count.bytes
            pcie_before = self._prev_pcie.get(g.uuid)
            self._prev_pcie[g.uuid] = pcie
            # Its NVLinks' bytes and errors since the previous window (kept beside its PCIe bytes).
            nv_bytes = sum(link.tx.bytes + link.rx.bytes for link in g.nvlinks.values())
            nv_errors = sum(sum(link.errors.values()) for link in g.nvlinks.values())
            nv_before = self._prev_pcie.get(f"nvlink:{g.uuid}")
            nv_errors_before = self._prev_pcie.get(f"nvlink-errors:{g.uuid}")
            self._prev_pcie[f"nvlink:{g.uuid}"], self._prev_pcie[f"nvlink-errors:{g.uuid}"] = nv_bytes, nv_errors
            counted = any(link.tx.seconds or link.rx.seconds for link in g.nvlinks.values())
            out.append(
                GpuWindow(
                    index=g.index,
                    uuid=g.uuid,
                    throttled=None if latest is None or latest.lost else latest.throttled,
                    reasons=tuple(latest.clock_event_reasons or ()) if latest is not None else (),
                    replays=None if replays is None or prev_r is None else replays - prev_r,
                    link_width=last.link_width if last else None,
                    max_link_width=last.max_link_width if last else None,
                    link_generation=last.link_generation if last else None,
                    max_link_generation=last.max_link_generation if last else None,
                    pcie_bytes=pcie - pcie_before if pcie_before is not None and g.pcie_counted else None,
                    pids=tuple(g.processes),
                    nvlink_bytes=nv_bytes - nv_before if nv_before is not None and counted else None,
                    nvlinks_down=last.nvlinks_down if last else 0,
                    nvlink_errors=nv_errors - nv_errors_before if nv_errors_before is not None and g.nvlinks else None,
                )
            )
        return out

    def _links(self, book: Any, seconds: float) -> list[LinkWindow]:
        out = []
        qd: dict[tuple[int, str], list[int]] = {}
        for q in book.latest_qdiscs():
            qcur = (q.drops, q.overlimits)
            qprev = self._prev_links.get(("q", q.key))
            self._prev_links[("q", q.key)] = qcur
            if qprev is not None:
                v = qd.setdefault((q.netns, q.ifname), [0, 0, 0])
                v[0] += max(qcur[0] - qprev[0], 0)
                v[1] += max(qcur[1] - qprev[1], 0)
                v[2] += q.backlog_bytes
        for i in book.latest_interfaces():
            cur = (i.rx_bytes, i.tx_bytes, i.rx_dropped + i.tx_dropped)
            prev = self._prev_links.get(("i", i.key))
            self._prev_links[("i", i.key)] = cur
            if prev is None or not seconds:
                continue
            util = None
            if cap := i.capacity_bits_per_s:
                util = max(cur[0] - prev[0], cur[1] - prev[1]) * 8 / seconds / cap
            q = qd.get((i.netns, i.name), [0, 0, 0])
            moved = max(cur[0] - prev[0], 0) + max(cur[1] - prev[1], 0)
            out.append(LinkWindow(i.netns, i.name, util, max(cur[2] - prev[2], 0) + q[0], q[1], q[2], moved))
        return out
