"""The agent: owns the CUDA sensor and the model, and keeps them in step."""

from __future__ import annotations

import logging

import numpy as np

from memtrace.core.abi import Stat
from memtrace.model import Model
from memtrace.sensors.cuda.source import Attachment, BpfSource, Options

__all__ = ["DRAIN_INTERVAL_S", "Agent", "Options"]
from memtrace.sources.procfs import boot_ticks_now, read_process

log = logging.getLogger("memtrace")

DRAIN_INTERVAL_S = 0.005


class Agent:
    def __init__(self, opts: Options) -> None:
        # `memtrace run` traces a command from its first instruction: every
        # process is seen whole. Otherwise only those that start once the
        # probes are live are (set in start()), and those held at load.
        self.model = Model(complete_after_ticks=None if opts.only_traced else 2**63, identify=read_process)
        self.libraries: list[Attachment] = []
        self.source = BpfSource(
            opts,
            self._on_events,
            self._on_exit,
            self.libraries.append,
            on_held=self.model.mark_complete,
            on_missed=self.model.mark_incomplete,
        )

    def _on_events(self, batch: np.ndarray) -> None:
        self.model.add_events(batch)

    def _on_exit(self, pid: int) -> None:
        self.model.process_exited(pid)

    def start(self) -> None:
        try:
            self.source.start()
        except BaseException:
            self.source.close()
            raise
        self.model.forked_since_start = self.source.is_fresh
        if self.model.complete_after_ticks is not None:
            # A process that started in a later clock tick started after the probes went live.
            self.model.complete_after_ticks = boot_ticks_now()

    def poll(self) -> int:
        return self.source.poll()

    def sync_totals(self) -> None:
        """Copy what the kernel counts (launches, calls lost from the ring) into the model."""
        for k, v in self.source.lost():
            self.model.set_lost(k.pid, k.api, k.direction, v.calls, v.bytes, v.errors, v.duration_ns)
        for k, n in self.source.counts():
            self.model.set_launches(k.pid, k.api, n)

    def forget(self, pid: int) -> None:
        """Drop a process's state here and in the kernel's totals."""
        self.model.forget(pid)
        self.source.forget_pid(pid)

    def stats(self) -> dict[Stat, int]:
        return self.source.stats()

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
