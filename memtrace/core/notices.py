"""What the sensors tell the model: one frozen class per kind of fact.

The CUDA sensor's drain and control thread, and the NCCL sensor's polls,
hand these to the agent in the order the model must take them (a process's
introduction before its events, its events before its exit); the agent
queues them in that order, in one queue, and folds them into the model
(runtime/agent.py). A new kind of fact is a new class here and one line in
the fold's dispatch table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memtrace.core.ids import ProcessInfo, ProcessKey
from memtrace.core.nccl import COMM_EVENT_DTYPE

NO_COMMS = np.zeros(0, COMM_EVENT_DTYPE)


@dataclass(frozen=True, eq=False)
class Events:
    """A batch of decoded call events (core/abi.EVENT_DTYPE), in ring order."""

    batch: np.ndarray

    @property
    def count(self) -> int:
        return len(self.batch)


@dataclass(frozen=True)
class ProcessMet:
    """A process's first traced call, as BPF saw it: its command name and
    cgroup; and what the host said of it then, while it was surely alive
    (its executable, container, job: None when not read)."""

    key: ProcessKey
    comm: str
    cgroup_id: int
    info: ProcessInfo | None = None


@dataclass(frozen=True)
class Held:
    """The process was stopped at its new CUDA library until the probes
    were in: nothing was missed. `info`: what the host said of it while it
    was stopped (None: not read)."""

    key: ProcessKey
    info: ProcessInfo | None = None


@dataclass(frozen=True)
class Missed:
    """The process ran on before its new CUDA library's probes were in
    (a terminal's foreground job, or its hold expired): calls may be missing."""

    key: ProcessKey


@dataclass(frozen=True)
class LaunchesMissed:
    """Its own launch link (the overhead budget's per-process mode) came after
    it may have launched: its launch counts, only, may be short."""

    key: ProcessKey


@dataclass(frozen=True)
class Execed:
    """The process runs another program now (an exec, counted by the CPU
    sensor and read from /proc by the host signals): its command name and
    executable from then on."""

    key: ProcessKey
    comm: str
    exe: str


@dataclass(frozen=True)
class Exited:
    """The process exited, having run `cpu_ns` of CPU time; every event of it came before."""

    key: ProcessKey
    cpu_ns: int


@dataclass(frozen=True, eq=False)
class Collectives:
    """The NCCL sensor's events (core/nccl.EVENT_DTYPE), complete up to
    `complete_until_ns` (CLOCK_MONOTONIC), the processes with libnccl
    mapped (whose waits may follow collectives), and the communicators made
    or asked about since the last (core/nccl.COMM_EVENT_DTYPE), which come
    before the events in time."""

    events: np.ndarray
    complete_until_ns: int
    users: frozenset[ProcessKey]
    comms: np.ndarray = field(default_factory=lambda: NO_COMMS)


@dataclass(frozen=True, eq=False)
class Launches:
    """A batch of launch records (core/abi.EVENT_DTYPE: entry time, stream,
    function in `dst`, no duration), in ring order: made only while a
    timeline is recorded (cuda Options.launch_events), for its slices. The
    model counts launches from the kernel's counters, never from these."""

    batch: np.ndarray

    @property
    def count(self) -> int:
        return len(self.batch)


Notice = Events | ProcessMet | Held | Missed | LaunchesMissed | Execed | Exited | Collectives | Launches
