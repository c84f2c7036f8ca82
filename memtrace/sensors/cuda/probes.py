"""Which probes a CUDA library gets, and what one attached file holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from memtrace.bpf import elf
from memtrace.bpf.detach import destroy_links
from memtrace.bpf.libbpf import Link
from memtrace.core import apis
from memtrace.core.abi import Layer
from memtrace.core.overhead import EntryKind, entry_kind
from memtrace.core.procfiles import FileId
from memtrace.sensors.cuda.launches import LaunchTarget

# The programs attached at CUDA symbols (Probe.programs); loaded for
# multi-uprobe links where the kernel has them. LAUNCH_RETURN: at launches
# too, while a timeline is recorded (cuda Options.launch_events): each
# launch's host-side duration, for its slice.
LAUNCH_RETURN = "mt_launch_return"
UPROBE_PROGRAMS = ("mt_enter", "mt_return", "mt_launch", LAUNCH_RETURN)


@dataclass(frozen=True)
class Probe:
    symbol: str
    offset: int  # file offset of the function
    cookie: int
    needs_return: bool = True
    kind: EntryKind = EntryKind.STEPPED  # how the kernel runs its first instruction: what a trap costs

    @property
    def programs(self) -> tuple[tuple[str, bool], ...]:
        """(program, is return probe) pairs to attach at this offset."""
        if self.needs_return:
            return (("mt_enter", False), ("mt_return", True))
        return (("mt_launch", False),)

    def programs_for(self, launch_events: bool) -> tuple[tuple[str, bool], ...]:
        """Its programs, a launch's return probe among them while a timeline is recorded."""
        if launch_events and not self.needs_return:
            return ((LAUNCH_RETURN, True), *self.programs)
        return self.programs


# A function memtrace's own test CUDA libraries export (tests/fixtures): what is
# traced through them is a simulated workload, and the output says so.
SIMULATED_MARKER = "memtrace_simulated_cuda"


@dataclass(frozen=True)
class FilePlan:
    probes: list[Probe]
    simulated: bool  # the file is memtrace's test library, not CUDA's


def plan_file(path: str, layer: Layer) -> FilePlan:
    """The probes for one file: each probed symbol of `layer` it defines, one
    per code address (aliases of one function would count a call twice);
    and whether it is memtrace's test library. One read of its symbols."""
    table = apis.apis_for(layer)
    machine = os.uname().machine
    with open(path, "rb") as f:
        offsets = elf.function_offsets(f, [*table, SIMULATED_MARKER])
        simulated = offsets.pop(SIMULATED_MARKER, None) is not None
        by_offset: dict[int, str] = {}
        for sym in sorted(offsets, key=lambda s: (table[s].id, s != table[s].name, s)):
            by_offset.setdefault(offsets[sym], sym)
        kinds = {off: entry_kind(elf.code_at(f, off, 2), machine) for off in by_offset}
    probes = [
        Probe(sym, off, table[sym].cookie(), table[sym].needs_return, kinds[off])
        for off, sym in sorted(by_offset.items())
    ]
    return FilePlan(probes, simulated)


def probe_plan(path: str, layer: Layer) -> list[Probe]:
    """The probes for one file (plan_file's)."""
    return plan_file(path, layer).probes


@dataclass
class Attachment:
    """One file with probes: a CUDA library, or an executable with a static runtime."""

    fid: FileId
    name: str
    layer: Layer
    symbols: dict[str, int]  # symbol -> file offset, one per distinct offset
    links: list[Link] = field(default_factory=list)
    link_count: int = 0  # kernel links made: one per probe and program, or one per program (multi-uprobes)
    # Its launch probes (multi-uprobes only): the link for every process, and
    # what a process's own link needs (sensors/cuda/launches.py).
    launch_link: Link | None = None
    launch_return_link: Link | None = None  # while a timeline is recorded: launches' return probes
    launch: LaunchTarget | None = None
    # Its probes' entry kinds (what a trap costs): launch probes, and the others.
    launch_kinds: frozenset[EntryKind] = frozenset()
    other_kinds: frozenset[EntryKind] = frozenset()
    simulated: bool = False  # memtrace's test library (SIMULATED_MARKER), not CUDA's

    def close(self) -> None:
        destroy_links(self.links)
        self.links.clear()
        if self.launch is not None:
            self.launch.close()
