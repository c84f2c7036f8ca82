"""What memtrace's probes cost a traced process: plain values.

A uprobe trap is paid by the process that takes it, in its own system
time. The kernel counts each traced process's traps (bpf/memtrace.bpf.c:
an entry and a return per copy, memory call and wait, nested driver calls
included; one entry per launch), the agent measures what one trap costs on
this host (runtime/overhead.py), and the process's CPU time comes from the
kernel (its scheduler runtime at exit, /proc while it runs). The overhead
is traps x cost, and its share of the process's CPU time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from memtrace.core.errors import BadOption

DEFAULT_BUDGET = 0.01
BUDGET_ENV = "MEMTRACE_OVERHEAD_BUDGET"


@dataclass(frozen=True)
class TrapCost:
    """Seconds one trap costs the process that takes it, on this host.

    `entry_seconds`: an entry probe (what a launch costs); `pair_seconds`:
    an entry and a return probe (a copy, memory call or wait), per trap
    half of it. `calibrated` False: not measured here (a fallback figure)."""

    entry_seconds: float
    pair_seconds: float
    calibrated: bool = True

    def per_trap(self) -> float:
        """The cost of one trap of an entry+return pair."""
        return self.pair_seconds / 2


# When the cost cannot be measured: the field notes' figure for a small VM
# (an H100 host measured about 0.8 us). Marked not calibrated wherever shown.
FALLBACK = TrapCost(5e-6, 10e-6, calibrated=False)


def parse_budget(text: str | None, env: dict[str, str] | os._Environ[str] = os.environ) -> float | None:
    """A budget as given to --overhead-budget (or, when that is not given,
    MEMTRACE_OVERHEAD_BUDGET): '1%', '0.01' -> a share of CPU time;
    'off' or '0' -> None, no budget. Unset: the default, 1%."""
    if text is None or not text.strip():
        text = env.get(BUDGET_ENV, "")
    s = text.strip().lower()
    if not s:
        return DEFAULT_BUDGET
    if s in ("off", "none", "0", "0%"):
        return None
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise BadOption(
            f"overhead budget {text!r} is not a number",
            "give a share of CPU time as a percentage (1%) or a fraction (0.01), or 'off'",
        ) from None
    if not 0 < v < 1:
        raise BadOption(
            f"overhead budget {text!r} is out of range",
            "give a share of CPU time above 0% and below 100% (for example 1%), or 'off'",
        )
    return v


@dataclass(frozen=True)
class Overhead:
    """One process's overhead: its traps (launch traps apart), what they
    cost by the calibrated figure, and its CPU time."""

    traps: int  # every trap: launches, entries and returns
    launch_traps: int
    cost: TrapCost
    cpu_seconds: float | None  # None: not read (gone before it was)
    cpu_final: bool  # read at its exit: its whole CPU time

    @property
    def traps_seconds(self) -> float:
        """The traps at the calibrated cost."""
        pair_traps = self.traps - self.launch_traps
        return self.launch_traps * self.cost.entry_seconds + pair_traps * self.cost.per_trap()

    @property
    def bounded(self) -> bool:
        """The traps at the calibrated cost come to more than the process's
        whole CPU time, which includes them: the figure was timed under
        other conditions (a cached one, a loaded host). Capped at the CPU time."""
        return self.cpu_seconds is not None and self.traps_seconds > self.cpu_seconds

    @property
    def seconds(self) -> float:
        """What the traps cost the process: never more than its CPU time."""
        est = self.traps_seconds
        return min(est, self.cpu_seconds) if self.cpu_seconds is not None else est

    @property
    def share(self) -> float | None:
        """Of the process's CPU time (the traps are part of it); None if unknown."""
        if not self.cpu_seconds:
            return None
        return self.seconds / self.cpu_seconds

    def over(self, budget: float | None) -> bool:
        """Its share of CPU time is known and above the budget (None: no budget)."""
        share = self.share
        return budget is not None and share is not None and share > budget

    def as_dict(self) -> dict[str, Any]:
        return {
            "traps": self.traps,
            "launch_traps": self.launch_traps,
            "estimated_seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "cpu_final": self.cpu_final,
            "share_of_cpu": self.share,
            "trap_seconds": self.cost.entry_seconds,
            "pair_seconds": self.cost.pair_seconds,
            "calibrated": self.cost.calibrated,
            "bounded": self.bounded,
            "estimated": True,
        }
