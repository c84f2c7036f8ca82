"""memtrace's pipeline, built in one place for `run`, `top` and `push`.

Two paths meet in the model and the live diagnosis:

- the CUDA path: uprobes -> the events and control rings -> the drain
  thread -> one queue of typed notices -> the fold thread -> the Model
  (runtime/agent.py);
- the host path: the sched and NCCL sensors, NVML, rtnetlink and the C
  fast sampler -> the host sampling thread -> the HostBook
  (runtime/hostsignals.py), and each tick the live diagnosis, which reads
  both (runtime/diagnose.py).

Every part is given what it calls at construction: the agent the NCCL
sensor's hook for a libnccl a held process maps, the host signals the
agent's processes, its collectives queue and its rings to guard, the
sampling thread the diagnosis's tick. What differs between the commands
is in PipelineOptions; nothing is wired afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.ids import ProcessKey
from memtrace.core.procfiles import Candidate
from memtrace.runtime.agent import DRAIN_INTERVAL_S, Agent
from memtrace.runtime.diagnose import LiveDiagnosis
from memtrace.runtime.hostsignals import HostOptions, HostSignals
from memtrace.runtime.recorder import Recorder
from memtrace.sensors.cuda import Options

__all__ = ["Options", "Pipeline", "PipelineOptions"]


@dataclass(frozen=True)
class PipelineOptions:
    """What a command asks of the pipeline.

    `cuda`: the CUDA sensor's options (Options.only_traced: `run`'s command
    and its children, else every process on the host, those running now
    included). `host`: the host signals' options, None for none (--no-host;
    no diagnosis then). `budget`: the share of a process's CPU time its probes
    may cost (None: off). `measure_overhead`: time a trap at start, so each
    process's overhead is told. `diagnose`: run the live diagnosis on the
    host signals' ticks. `from_exec`: every process is traced from its
    first instruction (`memtrace run CMD`); not when attaching to running
    processes (`profile --pid`, and `top` and `push` for those running at
    start), whose earlier host memory is then unknown, not pageable."""

    cuda: Options = field(default_factory=Options)
    host: HostOptions | None = field(default_factory=HostOptions)
    budget: float | None = None
    measure_overhead: bool = True
    diagnose: bool = True
    from_exec: bool = False


class Pipeline:
    """The agent, its host signals and the live diagnosis, wired. A context
    manager: entering starts the CUDA sensor (and, for a host-wide agent,
    attaches to the libraries running processes have mapped); leaving
    closes everything, the host signals first (their last sample folds
    into the model)."""

    def __init__(
        self,
        opts: PipelineOptions,
        on_diagnosis: Callable[[Diagnosis], None] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        """`recorder`: the flight recorder (runtime/recorder.py), shown every
        notice the agent takes, ticked with the host signals, told each
        diagnosis before `on_diagnosis` is (so the file it will write can be named)."""
        self.opts = opts
        host = opts.host
        self.recorder = recorder
        self._on_diagnosis = on_diagnosis
        self.agent = Agent(
            opts.cuda,
            measure_overhead=opts.measure_overhead,
            budget=opts.budget,
            other_library=self._nccl_mapped if host is not None and host.nccl else None,
            from_exec=opts.from_exec,
            recorder=recorder.take if recorder is not None else None,
        )
        self.host: HostSignals | None = None
        self.diagnosis: LiveDiagnosis | None = None
        if host is not None:
            self.host = HostSignals(
                host,
                self.agent.processes,
                collectives=self.agent.add_collectives,
                execed=self.agent.execed,
                ring_owner=self.agent,
                follows_nccl=host.nccl and opts.cuda.hold_nccl,
                on_tick=self._tick if opts.diagnose or recorder is not None else None,
            )
            self.agent.on_met = self.host.nudge
            if opts.diagnose:
                told = self._diagnosed if recorder is not None else on_diagnosis
                self.diagnosis = LiveDiagnosis(self.agent, self.host, told)
        if recorder is not None:
            recorder.bind(self.agent, self.host)

    def _nccl_mapped(self, key: ProcessKey, lib: Candidate, held: bool) -> bool:
        return self.host is not None and self.host.nccl_mapped(key, lib, held)

    def _tick(self) -> None:
        if self.diagnosis is not None:
            self.diagnosis.tick()
        if self.recorder is not None:
            self.recorder.tick(self.agent, self.host)

    def _diagnosed(self, d: Diagnosis) -> None:
        if self.recorder is not None:
            self.recorder.diagnosed(d)
        if self._on_diagnosis is not None:
            self._on_diagnosis(d)

    def start(self) -> None:
        self.agent.start()
        if not self.opts.cuda.only_traced:
            self.agent.scan()

    @contextlib.contextmanager
    def running(self, pinned: Iterable[int] = (), drain_interval: float = DRAIN_INTERVAL_S) -> Iterator[Pipeline]:
        """Drain and sample on threads of their own for the duration of the
        block: the host signals trace `pinned` (run's command) from now to the
        end, besides every process the model meets."""
        if self.host is not None:
            self.host.start(pinned)
        with self.agent.draining(drain_interval), self.host.sampling() if self.host else contextlib.nullcontext():
            yield self

    def finish_host(self) -> None:
        """The host signals' last sample, folded into the model (before a last report or push)."""
        if self.host is not None:
            self.host.close()
            self.agent.fold()

    def close(self) -> None:
        try:
            self.finish_host()
        finally:
            self.agent.close()

    def __enter__(self) -> Pipeline:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
