"""The control thread: reads the control ring (libraries mapped, processes
met and exited) and hands each record to the sensor as it arrives, so a
held process waits for its attachment only, not for a drain period."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import threading
import time
from collections.abc import Callable

from memtrace.bpf.libbpf import Libbpf, Map, RingBuffer
from memtrace.bpf.ringbuf import RingPositions
from memtrace.core.abi import CtlEvent, CtlType
from memtrace.core.threads import thread

log = logging.getLogger("memtrace")

CONTROL_QUIET_S = 0.1  # the longest a process notice waits for the control thread, unwatched


def decode(raw: bytes) -> CtlEvent | None:
    """A control record, or None for one of the wrong size or type (never misread)."""
    if len(raw) != ctypes.sizeof(CtlEvent):
        return None
    ev = CtlEvent.from_buffer_copy(raw)
    return ev if ev.type in (CtlType.MAP, CtlType.EXIT, CtlType.PROC) else None


class ControlThread:
    """Owns the control ring's reader and the thread that sleeps on it."""

    def __init__(self, lib: Libbpf, ring_map: Map, handle: Callable[[CtlEvent], None]) -> None:
        self._handle = handle
        self._ctl: list[CtlEvent] = []
        self.malformed = 0  # records of the wrong size or type, skipped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Wakes the thread: a watcher saw a record waiting (watch()), or stop.
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # How long the thread sleeps with no wakeup: records submitted without
        # one (process notices, from uprobes) wait at most this long, unless watched.
        self.quiet_s = CONTROL_QUIET_S
        self.ring: RingBuffer | None = RingBuffer(lib, [(ring_map, self._on_record)])
        self._positions: RingPositions | None = RingPositions(ring_map.fd)

    def _on_record(self, data: int, size: int) -> None:
        ev = decode(ctypes.string_at(data, size))
        if ev is None:
            self.malformed += 1
            return
        self._ctl.append(ev)

    def _loop(self) -> None:
        """Sleeps in epoll on the control ring (whose records, rare, are
        submitted with a wakeup) and acts on each at once."""
        assert self.ring is not None
        epoll = self.ring.epoll_fd()
        while not self._stop.is_set():
            try:
                # Process notices come from uprobes, submitted without a wakeup
                # (a wakeup there loses later hits: docs/design/evidence.md): read them too,
                # every quiet_s, or when a watcher says they wait.
                woken, _, _ = select.select([epoll, self._wake], [], [], self.quiet_s)
                if self._wake in woken:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                self.ring.consume()
            except OSError as e:  # pragma: no cover
                log.error("control ring: %s", e)
                time.sleep(0.1)
            self._act()

    def _act(self) -> None:
        ctl, self._ctl = self._ctl, []
        for ev in ctl:
            self._handle(ev)

    def watch(self) -> tuple[int, int, int] | None:
        """For a watcher of the control ring (Agent.guard_ring): the addresses
        of its consumer and producer positions, valid until close(), and the
        eventfd that wakes the thread. None once closed."""
        if self._positions is None:
            return None
        return (*self._positions.positions(), self._wake)

    def set_quiet(self, seconds: float) -> None:
        """How long the thread sleeps without a wakeup, from now."""
        self.quiet_s = seconds
        if self._wake >= 0:
            os.eventfd_write(self._wake, 1)

    def read_now(self) -> None:
        """Act on every record in the ring now, for a last drain before a
        report: process notices come without a wakeup and the thread may not
        have read the last ones yet. The thread is paused meanwhile
        (libbpf's ring reader is not for two threads)."""
        if self.ring is None:
            return
        running = self._thread is not None
        if running:
            self.stop()
        self.ring.consume()
        self._act()
        if running:
            self.start()

    def start(self) -> None:
        self._stop.clear()
        self._thread = thread(self._loop, "memtrace-ctl")
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            os.eventfd_write(self._wake, 1)
            self._thread.join()
            self._thread = None
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake)

    def close(self) -> None:
        self.stop()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._positions is not None:
            self._positions.close()
            self._positions = None
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1
