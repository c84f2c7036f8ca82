"""The agent counts the CPU of its parts that grow with the traced work (the
fold, the live diagnosis, the host samples), so that its cost can be told
over the bare sampler's floor with and without them
(bench/targets/agent_cpu.py --floor, issue 41); and a sample skips what it
cannot find (no libnccl attached: no NCCL maps read).

The CPU clock is replaced by one the test moves, so every figure is exact
and no test depends on this machine's speed."""

from __future__ import annotations

import contextlib
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from memtrace.core.abi import EVENT_DTYPE
from memtrace.core.notices import Events
from memtrace.model import Model
from memtrace.model.host import HostBook
from memtrace.runtime.agent import Agent
from memtrace.runtime.diagnose import LiveDiagnosis
from memtrace.runtime.hostsignals import HostOptions, HostSignals
from memtrace.sensors.cuda import Options


class Clock:
    """A thread CPU clock that moves only when told."""

    def __init__(self) -> None:
        self.ns = 1_000_000

    def __call__(self) -> int:
        return self.ns

    def spend(self, ns: int) -> None:
        self.ns += ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "thread_time_ns", c)
    return c


def copies(pid: int, n: int) -> np.ndarray:
    b = np.zeros(n, dtype=EVENT_DTYPE)
    b["pid"] = b["tid"] = pid
    b["start_ns"] = 1
    b["api"] = 2  # cudaMemcpyAsync
    b["ts_ns"] = np.arange(n) + 1
    b["bytes"] = 4096
    return b


def test_the_agent_counts_the_cpu_of_its_folds_and_only_theirs(clock: Clock) -> None:
    """Agent.fold_cpu_ns: the CPU the model's folds took, whichever thread
    folded (the fold thread a share at a time, or a reader folding first);
    queueing what a drain read is not counted in it."""
    agent = Agent(Options())
    take = agent.model.take
    spent: list[int] = []

    def costly_take(notices: Any) -> None:
        clock.spend(7_000 + 1_000 * len(spent))  # each fold dearer than the last
        spent.append(7_000 + 1_000 * len(spent))
        take(notices)

    agent.model.take = costly_take  # type: ignore[method-assign]
    agent._take([Events(copies(4_000_001, 10))])
    clock.spend(50_000)  # the drain's own work: not a fold's
    assert agent.fold_cpu_ns == 0
    agent.fold()
    assert agent.fold_cpu_ns == 7_000 and agent.model.events == 10
    assert agent.folds == 1
    agent.fold()  # nothing pending: not a fold
    assert agent.folds == 1
    agent._take([Events(copies(4_000_001, 3))])
    with agent.lock:
        agent._fold(2)  # a share: two events now, the third next time
        agent._fold(2)
    assert agent.fold_cpu_ns == sum(spent) == 7_000 + 8_000 + 9_000
    assert agent.model.events == 13 and agent.folds == 3


def test_the_diagnosis_counts_its_own_cpu_not_the_agents_drain_and_fold(clock: Clock) -> None:
    """LiveDiagnosis.cpu_ns: its ticks' CPU less what the agent's locked()
    spent draining and folding for it (the agent counts its folds), so that
    the two are told apart and never counted twice; a tick that fails is
    counted too."""
    model, book = Model(), HostBook()

    @contextlib.contextmanager
    def locked() -> Iterator[Model]:
        clock.spend(1_000_000)  # the agent drains and folds
        yield model

    agent = types.SimpleNamespace(locked=locked)
    live = LiveDiagnosis(agent, types.SimpleNamespace(lock=threading.Lock(), book=book))  # type: ignore[arg-type]
    observe = live.engine.observe
    live.engine.observe = lambda *a: (clock.spend(3_000), observe(*a))[1]  # type: ignore[method-assign]
    model.add_events(copies(4_000_002, 4))
    live.tick()  # the first window: readings kept, nothing judged
    first = live.cpu_ns
    assert first < 1_000_000  # the agent's million is not the diagnosis's
    live.tick()
    assert live.cpu_ns - first == 3_000  # the engine's work, exactly: the clock moved for nothing else

    def broken(*a: Any) -> Any:
        clock.spend(2_000)
        raise RuntimeError("a bug in the engine")

    live.engine.observe = broken  # type: ignore[method-assign]
    before = live.cpu_ns
    assert live.tick() == [] and live.failures == 1
    assert live.cpu_ns - before == 2_000


def test_host_samples_count_their_cpu_failed_ones_too(clock: Clock) -> None:
    """HostSignals.sample_cpu_ns: every sample's CPU, one that raised included."""
    hs = HostSignals(HostOptions())
    calls: list[bool] = []

    def sample(final: bool = False) -> None:
        calls.append(final)
        clock.spend(400)
        if len(calls) == 2:
            raise OSError("a sensor failed")

    hs.sample = sample  # type: ignore[method-assign]
    for _ in range(3):
        hs._safe_sample()
    assert hs.sample_cpu_ns == 1_200 and hs.sample_errors == 1 and len(calls) == 3


class FakeNccl:
    """An NCCL sensor with no ring to read, whose maps' reads are counted."""

    def __init__(self, attachments: dict[int, Any]) -> None:
        self.attachments = attachments
        self.map_reads = 0

    def poll_comms(self) -> np.ndarray:
        from memtrace.core.nccl import COMM_EVENT_DTYPE

        return np.zeros(0, COMM_EVENT_DTYPE)

    def poll(self) -> np.ndarray:
        from memtrace.core.nccl import EVENT_DTYPE as NCCL_EVENT_DTYPE

        return np.zeros(0, NCCL_EVENT_DTYPE)

    def scan(self, pids: list[int]) -> bool:
        return False

    def totals(self) -> dict[Any, Any]:
        self.map_reads += 1
        return {}


def test_a_sample_reads_no_nccl_maps_while_no_libnccl_is_attached() -> None:
    """Most hosts have no libnccl: its totals map is then empty, and a sample
    does not walk it (two map walks every sample); once one is attached it is
    read at every sample."""
    import os

    hs = HostSignals(HostOptions())
    none = FakeNccl({})
    hs._sample_nccl(none, {os.getpid()})  # type: ignore[arg-type]
    assert none.map_reads == 0
    assert hs.book.collectives == {}
    some = FakeNccl({1: types.SimpleNamespace(name="libnccl.so.2")})
    hs._sample_nccl(some, {os.getpid()})  # type: ignore[arg-type]
    assert some.map_reads == 1
