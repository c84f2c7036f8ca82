"""Load the CPU sensor (bpf/sched.bpf.c), choose the processes it traces, and
read what it measured as typed per-process results.

The runtime calls ``start(pids)`` once, ``add_pid``/``remove_pid`` as traced
processes come and go (the same processes the CUDA sensor traces), ``read()``
on its sampling timer and ``close()`` at the end.
"""

from __future__ import annotations

import ctypes
from importlib import resources
from pathlib import Path

from memtrace.bpf.host import bpf_arch, check_kernel
from memtrace.bpf.libbpf import BpfObject, Libbpf, Link, Map, destroy_together
from memtrace.core.cpu import CpuStats, Preemptor, quantile_us, slot_bounds_us
from memtrace.sensors.sched.abi import FILTER_BITS, SLOTS, STAT_COUNT, Preempt, PreemptKey, Proc, SchedStat

PROGRAMS = ("sc_switch", "sc_wakeup", "sc_wakeup_new")

__all__ = ["PROGRAMS", "CpuStats", "Preemptor", "SchedSensor", "object_path", "quantile_us", "slot_bounds_us"]


def object_path(arch: str | None = None) -> Path:
    return Path(str(resources.files("memtrace") / "bpf" / f"sched.{arch or bpf_arch()}.bpf.o"))


def _u32(key: ctypes._CData) -> int:
    assert isinstance(key, ctypes.c_uint32)
    return int(key.value)


class SchedSensor:
    """The sched tracepoint programs, loaded and attached, with their maps."""

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
        self.traced: set[int] = set()

    def start(self, pids: list[int] | tuple[int, ...] = ()) -> None:
        """Load and attach; trace `pids` (and whatever add_pid adds later)."""
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
            for pid in pids:
                self.add_pid(pid)
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

    def add_pid(self, pid: int) -> None:
        """Trace a process (all its threads) from now on."""
        self.maps["traced"].update(ctypes.c_uint32(pid), ctypes.c_uint8(1))
        self._set_bit(pid, True)  # after the hash: a set bit only sends BPF to look there
        self.traced.add(pid)

    def remove_pid(self, pid: int) -> None:
        """Stop tracing a process and forget what was measured (read it first)."""
        self.traced.discard(pid)
        self.maps["traced"].delete(ctypes.c_uint32(pid))
        if not any(p % FILTER_BITS == pid % FILTER_BITS for p in self.traced):
            self._set_bit(pid, False)
        self.maps["procs"].delete(ctypes.c_uint32(pid))
        pre = self.maps["preempts"]
        for k in list(pre.keys(PreemptKey)):
            assert isinstance(k, PreemptKey)
            if k.tgid == pid:
                pre.delete(k)

    def pids(self) -> list[int]:
        """The processes with measurements."""
        return [_u32(k) for k in self.maps["procs"].keys(ctypes.c_uint32)]

    def _preemptors(self) -> dict[int, list[Preemptor]]:
        out: dict[int, list[Preemptor]] = {}
        pre = self.maps["preempts"]
        v = Preempt()
        for k in list(pre.keys(PreemptKey)):
            assert isinstance(k, PreemptKey)
            if pre.lookup(k, v):
                out.setdefault(k.tgid, []).append(
                    Preemptor(
                        cgroup_id=k.cgroup_id,
                        count=v.count,
                        wait_ns=v.wait_ns,
                        last_pid=v.last_tgid,
                        last_comm=v.last_comm.decode(errors="replace"),
                    )
                )
        return out

    def read(self) -> dict[int, CpuStats]:
        """Everything measured so far, per traced process (cumulative)."""
        pre = self._preemptors()
        procs = self.maps["procs"]
        out: dict[int, CpuStats] = {}
        v = Proc()
        for k in list(procs.keys(ctypes.c_uint32)):
            pid = _u32(k)
            if not procs.lookup(k, v):
                continue
            out[pid] = CpuStats(
                pid=pid,
                runq_hist=tuple(v.runq_hist),
                offcpu_hist=tuple(v.offcpu_hist),
                runq_ns=v.runq_ns,
                offcpu_ns=v.offcpu_ns,
                oncpu_ns=v.oncpu_ns,
                voluntary=v.nvcsw,
                involuntary=v.nivcsw,
                cgroup_id=v.cgroup_id,
                preemptors=tuple(sorted(pre.get(pid, []), key=lambda p: -p.count)),
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
            "procs": ctypes.c_uint32,
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
