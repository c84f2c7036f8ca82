"""Load the CPU sensor (bpf/sched.bpf.c), choose the processes it traces, and
read what it measured as typed per-process results.

The runtime calls ``start(keys)`` once, ``add``/``remove`` as traced
processes come and go (the same processes the CUDA sensor traces, each a
ProcessKey), ``read()`` on its sampling timer and ``close()`` at the end.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from memtrace.bpf.host import bpf_arch, check_kernel
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, Map, destroy_together
from memtrace.core.cpu import CpuStats, Preemptor, quantile_us, slot_bounds_us
from memtrace.core.ids import ProcessKey
from memtrace.sensors.sched.abi import FILTER_BITS, SLOTS, STAT_COUNT, Preempt, PreemptKey, Proc, ProcKey, SchedStat

PROGRAMS = ("sc_switch", "sc_wakeup", "sc_wakeup_new", "sc_exit", "sc_exec", "sc_cgroup_move")

__all__ = ["PROGRAMS", "CpuStats", "Preemptor", "SchedSensor", "object_path", "quantile_us", "slot_bounds_us"]


def object_path(arch: str | None = None) -> Path:
    return Path(str(resources.files("memtrace") / "bpf" / f"sched.{arch or bpf_arch()}.bpf.o"))


def _key(k: ctypes._CData) -> ProcessKey:
    assert isinstance(k, ProcKey)
    return ProcessKey(int(k.tgid), int(k.start_ns))


class SchedSensor:
    """The sched tracepoint programs, loaded and attached, with their maps.

    A process is a ProcessKey: BPF charges a task to the process traced under
    its tgid only if its process started then, so a reused pid is not taken
    for it. A key whose start_ns is 0 (not known) traces the first process
    BPF sees with that pid, and read() gives that process's start."""

    name = "cpu"

    def __init__(
        self,
        *,
        filter_pids: bool = True,
        max_processes: int = 10240,
        max_threads: int = 65536,
        max_preemptors: int = 16384,
        path: Path | None = None,
    ) -> None:
        self.path = path or object_path()
        self.filter_pids = filter_pids
        self.limits = {"procs": max_processes, "traced": max_processes, "threads": max_threads}
        self.limits["preempts"] = max_preemptors
        self.obj: BpfObject | None = None
        self.links: list[Link] = []
        self.maps: dict[str, Map] = {}
        self.traced: dict[int, ProcessKey] = {}  # pid -> the process traced under it, as added

    def start(self, keys: Iterable[ProcessKey] = ()) -> None:
        """Load and attach; trace `keys` (and whatever add() adds later)."""
        check_kernel()
        obj = BpfObject(self.path)
        self.obj = obj
        try:
            obj.set_rodata({"filter_pids": self.filter_pids})
            for name, n in self.limits.items():
                obj.set_max_entries(name, n)
            obj.load()
            names = ("traced", "traced_bits", "procs", "threads", "preempts", "stats")
            self.maps = {n: obj.map(n) for n in names}
            for key in keys:
                self.add(key)
            for prog in PROGRAMS:
                self.links.append(obj.attach(prog))
        except BaseException:
            self.close()
            raise

    def _set_bit(self, pid: int, on: bool) -> None:
        bit = pid % FILTER_BITS
        key, word = ctypes.c_uint32(bit // 64), ctypes.c_uint64()
        bits = self.maps["traced_bits"]
        bits.lookup(key, word)
        mask = 1 << (bit % 64)
        bits.update(key, ctypes.c_uint64(word.value | mask if on else word.value & ~mask))

    def add(self, key: ProcessKey) -> None:
        """Trace a process (all its threads) from now on; it replaces any other traced under its pid."""
        self.maps["traced"].update(ctypes.c_uint32(key.pid), ctypes.c_uint64(key.start_ns))
        self._set_bit(key.pid, True)  # after the hash: a set bit only sends BPF to look there
        self.traced[key.pid] = key

    def _start_of(self, pid: int) -> int | None:
        """The start BPF holds for the process traced under `pid` (0: none seen yet); None: none traced."""
        v = ctypes.c_uint64()
        return int(v.value) if self.maps["traced"].lookup(ctypes.c_uint32(pid), v) else None

    def remove(self, key: ProcessKey) -> None:
        """Stop tracing a process and forget what was measured of it (read it first).
        Another process traced under the same pid stays traced."""
        added, held = self.traced.get(key.pid), self._start_of(key.pid)
        starts = {key.start_ns}
        if added is not None and (added == key or held == key.start_ns):
            if held:
                starts.add(held)  # the start BPF bound a key of start 0 to
            del self.traced[key.pid]
            self.maps["traced"].delete(ctypes.c_uint32(key.pid))
            if not any(p % FILTER_BITS == key.pid % FILTER_BITS for p in self.traced):
                self._set_bit(key.pid, False)
        for start in starts:
            self.maps["procs"].delete(ProcKey(start_ns=start, tgid=key.pid))
        pre = self.maps["preempts"]
        for k in list(pre.keys(PreemptKey)):
            assert isinstance(k, PreemptKey)
            if k.tgid == key.pid and k.start_ns in starts:
                pre.delete(k)

    def keys(self) -> list[ProcessKey]:
        """The processes with measurements."""
        return [_key(k) for k in self.maps["procs"].keys(ProcKey)]

    def _preemptors(self) -> dict[ProcessKey, list[Preemptor]]:
        out: dict[ProcessKey, list[Preemptor]] = {}
        pre = self.maps["preempts"]
        v = Preempt()
        for k in list(pre.keys(PreemptKey)):
            assert isinstance(k, PreemptKey)
            if pre.lookup(k, v):
                out.setdefault(ProcessKey(k.tgid, k.start_ns), []).append(
                    Preemptor(
                        cgroup_id=k.cgroup_id,
                        count=v.count,
                        wait_ns=v.wait_ns,
                        pid=v.tgid,
                        comm=v.comm.decode(errors="replace"),
                    )
                )
        return out

    def poll(self) -> dict[ProcessKey, CpuStats]:
        """What it measured so far (core.sensor.Sensor): read()."""
        return self.read()

    def read(self) -> dict[ProcessKey, CpuStats]:
        """Everything measured so far, per traced process (cumulative)."""
        pre = self._preemptors()
        procs = self.maps["procs"]
        out: dict[ProcessKey, CpuStats] = {}
        v = Proc()
        for k in list(procs.keys(ProcKey)):
            key = _key(k)
            if not procs.lookup(k, v):
                continue
            out[key] = CpuStats(
                pid=key.pid,
                start_ns=key.start_ns,
                runq_hist=tuple(v.runq_hist),
                offcpu_hist=tuple(v.offcpu_hist),
                runq_ns=v.runq_ns,
                offcpu_ns=v.offcpu_ns,
                oncpu_ns=v.oncpu_ns,
                voluntary=v.nvcsw,
                involuntary=v.nivcsw,
                cgroup_id=v.cgroup_id,
                execs=v.execs,
                moves=v.moves,
                stolen_ns=v.stolen_ns,
                preemptors=tuple(sorted(pre.get(key, []), key=lambda p: (-p.wait_ns, -p.count))),
            )
        return out

    def stats(self) -> dict[SchedStat, int]:
        """The sensor's health counters, summed over CPUs."""
        ncpu = int(Libbpf.get().lib.libbpf_num_possible_cpus())
        out = {}
        for s in SchedStat:
            vals = (ctypes.c_uint64 * ncpu)()
            out[s] = sum(vals) if self.maps["stats"].lookup(ctypes.c_uint32(s), vals) else 0
        return out

    def gaps(self) -> dict[str, int]:
        """What the sensor could not keep, or was never told, so far (the summary's `cpu_sensor`)."""
        st = self.stats()
        return {
            "switch_gaps": st[SchedStat.UNSEEN],
            "processes_not_kept": st[SchedStat.PROCS_FULL],
            "threads_not_kept": st[SchedStat.THREADS_FULL],
            "preemptions_not_attributed": st[SchedStat.PREEMPT_FULL],
        }

    def map_entries(self) -> dict[str, int]:
        """How many entries each bounded map holds now (for health and tests)."""
        types: dict[str, type[ctypes._CData]] = {
            "traced": ctypes.c_uint32,
            "procs": ProcKey,
            "threads": ctypes.c_uint32,
            "preempts": PreemptKey,
        }
        return {name: sum(1 for _ in self.maps[name].keys(t)) for name, t in types.items()}

    def close(self) -> None:
        destroy_together(self.links)
        self.links.clear()
        self.maps.clear()
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    def __enter__(self) -> SchedSensor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


assert STAT_COUNT == len(SchedStat)
assert SLOTS == 26
