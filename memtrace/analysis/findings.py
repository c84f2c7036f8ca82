"""Findings: what the numbers mean for a process, with the evidence and the fix.

Each finding is computed from the model alone, so `memtrace run`, `memtrace
top`, the JSON summary and the OTLP export all say the same thing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from memtrace.core import apis
from memtrace.core.abi import Direction
from memtrace.core.enums import HostMemory
from memtrace.core.ids import ProcessKey
from memtrace.core.units import human_bytes
from memtrace.model import Model, Process

GiB = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    # pageable host-to-device copies
    pageable_share: float = 0.20  # of H2D bytes whose host memory is known
    pageable_min_bytes: int = 64 << 20
    # synchronisation waits
    sync_share: float = 0.50  # of the wall time memtrace watched the process
    sync_min_wall_s: float = 1.0
    # device memory growth with no frees
    growth_bytes: int = 1 * GiB
    growth_min_s: float = 300.0


@dataclass
class Finding:
    code: str  # pageable_h2d, sync_wait, device_memory_growth
    key: ProcessKey
    process: str
    value: float  # the headline number: a share, or bytes
    summary: str  # the evidence, in words
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0  # the process's start, wall clock (0: unknown)

    @property
    def pid(self) -> int:
        return self.key.pid

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "pid": self.pid,
            "start_time_unix_nano": self.start_ns,
            "process": self.process,
            "value": self.value,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": self.evidence,
        }


def _duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.1f} s"


DEFAULT = Thresholds()


def _start(proc: Process | None) -> int:
    return proc.start_ns if proc else 0


def compute(model: Model, th: Thresholds = DEFAULT, now_ns: int | None = None) -> list[Finding]:
    now_ns = now_ns if now_ns is not None else time.time_ns()
    out: list[Finding] = []
    h2d: dict[ProcessKey, dict[int, list[int]]] = {}  # process -> host kind -> [bytes, call time ns]
    for (key, _api, d, host), st in model.copy_view().items():
        if d != Direction.H2D or host in (HostMemory.NONE, HostMemory.UNKNOWN):
            continue
        v = h2d.setdefault(key, {}).setdefault(host, [0, 0])
        v[0] += st.bytes
        v[1] += st.duration_ns
    for key, kinds in sorted(h2d.items()):
        total = sum(v[0] for v in kinds.values())
        pageable = kinds.get(HostMemory.PAGEABLE, [0, 0])
        share = pageable[0] / total if total else 0.0
        if pageable[0] < th.pageable_min_bytes or share < th.pageable_share:
            continue
        proc = model.processes.get(key)
        ev: dict[str, Any] = {"h2d_bytes": total, "pageable_bytes": pageable[0]}
        msg = f"{share:.0%} of H2D bytes ({human_bytes(pageable[0])} of {human_bytes(total)}) came from pageable memory"
        if pageable[1]:
            bw = pageable[0] / (pageable[1] / 1e9)
            ev["pageable_bytes_per_second"] = bw
            msg += f" at {bw / 1e9:.1f} GB/s"
        pinned = kinds.get(HostMemory.PINNED)
        if pinned and pinned[0] and pinned[1]:
            pbw = pinned[0] / (pinned[1] / 1e9)
            ev["pinned_bytes_per_second"] = pbw
            msg += f"; pinned copies in the same process reach {pbw / 1e9:.1f} GB/s"
        out.append(
            Finding(
                "pageable_h2d",
                key,
                proc.name if proc else "",
                share,
                msg,
                "copy from page-locked memory: DataLoader(pin_memory=True) or tensor.pin_memory() in PyTorch, "
                "cudaHostAlloc/cudaHostRegister elsewhere; then the copy can be asynchronous",
                ev,
                _start(proc),
            )
        )
    waits: dict[ProcessKey, dict[str, list[int]]] = {}
    for (key, api), wst in model.sync_view().items():
        a = apis.BY_ID.get(api)
        kind = a.sync.value if a and a.sync else "other"
        w = waits.setdefault(key, {}).setdefault(kind, [0, 0])
        w[0] += wst.calls
        w[1] += wst.duration_ns
    for key, wait_kinds in sorted(waits.items()):
        proc = model.processes.get(key)
        if proc is None:
            continue
        wall = proc.wall_ns(now_ns)
        waited = sum(v[1] for v in wait_kinds.values())
        if wall < th.sync_min_wall_s * 1e9 or waited < th.sync_share * wall:
            continue
        share = waited / wall
        top = max(wait_kinds.items(), key=lambda kv: kv[1][1])
        out.append(
            Finding(
                "sync_wait",
                key,
                proc.name,
                share,
                f"the process spent {share:.0%} of its wall time ({waited / 1e9:.1f} s of {wall / 1e9:.1f} s) "
                f"waiting for the GPU, most in {top[0]} synchronisation ({top[1][0]:,} waits)",
                "let the CPU run ahead: drop per-step .item()/.cpu()/print of GPU values, copy with "
                "non_blocking=True, and synchronise once per step (or on an event) instead of per operation",
                {
                    "wait_seconds": waited / 1e9,
                    "wall_seconds": wall / 1e9,
                    "by_kind": {k: v[0] for k, v in wait_kinds.items()},
                },
                _start(proc),
            )
        )
    for key, proc in sorted(model.processes.items()):
        mem = proc.memory
        if mem.frees:
            since = mem.last_free_ns
        else:
            since = proc.start_ns if proc.complete and proc.start_ns else proc.first_seen_ns
        grew = mem.in_use_bytes - mem.in_use_at_last_free
        span = ((proc.exited_ns or now_ns) - since) / 1e9
        if grew < th.growth_bytes or span < th.growth_min_s:
            continue
        out.append(
            Finding(
                "device_memory_growth",
                key,
                proc.name,
                float(grew),
                f"device memory grew by {human_bytes(grew)} over {_duration(span)} with no frees "
                f"({mem.outstanding:,} allocations outstanding, {human_bytes(mem.in_use_bytes)} in use)",
                "look for GPU tensors kept alive across steps (a list of losses without .item(), "
                "a growing cache); torch.cuda.memory_snapshot() shows where they were allocated",
                {"grew_bytes": grew, "seconds": span, "in_use_bytes": mem.in_use_bytes},
                _start(proc),
            )
        )
    return out
