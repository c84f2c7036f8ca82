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

import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memtrace.core.errors import BadOption

DEFAULT_BUDGET = 0.01
BUDGET_ENV = "MEMTRACE_OVERHEAD_BUDGET"


class EntryKind(enum.Enum):
    """How the kernel runs the instruction a uprobe replaced, which sets what
    a trap costs: EMULATED, it carries the instruction out itself (x86-64:
    the push of a register, how every CUDA entry point seen begins), one
    exception; STEPPED, it runs a copy out of line under a single step
    (endbr64, mov, sub, and every arm64 function entry), a second exception,
    about ten times the cost in a VM (bench/entry_cost.py)."""

    EMULATED = "emulated"
    STEPPED = "stepped"


def entry_kind(code: bytes, machine: str) -> EntryKind:
    """The kind of a probed function's entry, from its first bytes. Only an
    x86-64 push of a register counts as emulated (Linux 5.19 and later
    emulate it; the calibration times it, so an older kernel that steps it
    shows the stepped cost there); anything else is stepped, the dearer
    kind, so a probe never looks cheaper than it is."""
    if machine in ("x86_64", "amd64") and code:
        if 0x50 <= code[0] <= 0x57:  # push %rax..%rdi
            return EntryKind.EMULATED
        if len(code) > 1 and code[0] == 0x41 and 0x50 <= code[1] <= 0x57:  # push %r8..%r15
            return EntryKind.EMULATED
    return EntryKind.STEPPED


@dataclass(frozen=True)
class TrapCost:
    """Seconds one trap costs the process that takes it, on this host.

    `entry_seconds`: an entry probe (what a launch costs); `pair_seconds`:
    an entry and a return probe (a copy, memory call or wait), per trap
    half of it. `calibrated` False: not measured here (a fallback figure).
    `kind`: the entry kind(s) it was timed at ("" where not told)."""

    entry_seconds: float
    pair_seconds: float
    calibrated: bool = True
    kind: str = ""

    def per_trap(self) -> float:
        """The cost of one trap of an entry+return pair."""
        return self.pair_seconds / 2


# When the cost cannot be measured: a small VM's figure, marked not calibrated
# wherever shown (docs/design/evidence.md#trap-cost).
FALLBACK = TrapCost(5e-6, 10e-6, calibrated=False)

# What the overhead budget weighs with until the calibration is ready, so
# that a first weighing never waits for it: about the dearest kind's cost
# measured (single-stepped; docs/design/evidence.md#trap-cost), so no
# process looks cheaper than it may be. Never shown: the overhead waits for
# the calibration.
PROVISIONAL = TrapCost(10e-6, 20e-6, calibrated=False, kind="stepped")


@dataclass(frozen=True)
class TrapCosts:
    """A trap's cost timed at each entry kind this host could time (an
    emulated one needs memtrace's C helpers, and x86-64)."""

    by_kind: Mapping[EntryKind, TrapCost]

    def applied(self, launch_kinds: Iterable[EntryKind], other_kinds: Iterable[EntryKind]) -> TrapCost:
        """The cost to charge: a launch trap at the dearest kind among the
        launch probes' entries, a copy, memory call or wait at the dearest
        among the others' (the kernel counts a process's traps, not which
        probe took them, so this is an upper bound where kinds are mixed).
        A kind not timed here is charged at the dearest kind that was."""
        launch = self._dearest(set(launch_kinds), lambda c: c.entry_seconds)
        other = self._dearest(set(other_kinds), lambda c: c.pair_seconds)
        kinds = sorted({launch.kind, other.kind})
        return TrapCost(
            launch.entry_seconds,
            other.pair_seconds,
            calibrated=launch.calibrated and other.calibrated,
            kind="+".join(kinds),
        )

    def _dearest(self, kinds: set[EntryKind], key: Any) -> TrapCost:
        known = [self.by_kind[k] for k in kinds if k in self.by_kind]
        if not kinds or len(known) < len(kinds):
            known = list(self.by_kind.values())  # nothing attached yet, or a kind not timed: the dearest timed
        return max(known, key=key)


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
            "trap_entry_kind": self.cost.kind,
            "calibrated": self.cost.calibrated,
            "bounded": self.bounded,
            "estimated": True,
        }
