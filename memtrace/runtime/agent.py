"""The agent: owns the CUDA sensor and the model, and keeps them in step."""

from __future__ import annotations

import logging
import time

import numpy as np

from memtrace.core.abi import Stat
from memtrace.core.ids import ProcessKey
from memtrace.model import Model
from memtrace.sensors.cuda.source import Attachment, BpfSource, Options

__all__ = ["DRAIN_INTERVAL_S", "Agent", "Options"]
from memtrace.sources.procfs import read_process

log = logging.getLogger("memtrace")

DRAIN_INTERVAL_S = 0.005


class Agent:
    def __init__(self, opts: Options) -> None:
        # `memtrace run` traces a command from its first instruction: every
        # process is seen whole. Otherwise only those that start once the
        # probes are live are (set in start()), and those held at load.
        self.model = Model(complete_after_ns=None if opts.only_traced else 2**63, identify=read_process)
        self.libraries: list[Attachment] = []
        self.source = BpfSource(
            opts,
            self._on_events,
            self._on_exit,
            self.libraries.append,
            on_held=self.model.mark_complete,
            on_process=self.model.introduce,
        )

    def _on_events(self, batch: np.ndarray) -> None:
        self.model.add_events(batch)

    def _on_exit(self, key: ProcessKey) -> None:
        self.model.process_exited(key)

    def start(self) -> None:
        try:
            self.source.start()
        except BaseException:
            self.source.close()
            raise
        self.model.forked_since_start = self.source.is_fresh
        if self.model.complete_after_ns is not None:
            # A process that started after now (its start as BPF reads it) started after the probes went live.
            self.model.complete_after_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)

    def poll(self) -> int:
        return self.source.poll()

    def sync_totals(self) -> None:
        """Copy what the kernel counts (launches, calls lost from the ring) into the model."""
        for k, v in self.source.lost():
            key = ProcessKey(k.pid, k.start_ns)
            self.model.set_lost(key, k.api, k.direction, v.calls, v.bytes, v.errors, v.duration_ns)
        for k, n in self.source.counts():
            self.model.set_launches(ProcessKey(k.pid, k.start_ns), k.api, n)

    def forget(self, key: ProcessKey) -> None:
        """Drop a process's state here and in the kernel's totals."""
        self.model.forget(key)
        self.source.forget_process(key)

    def stats(self) -> dict[Stat, int]:
        return self.source.stats()

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
