"""Measuring what one uprobe trap costs on this host.

The traced process pays for each of memtrace's probes in its own system
time: the breakpoint's exception, the kernel's uprobe dispatch and the BPF
program. memtrace times that once at start, on a thread of its own: a libc
function of the agent's own (`labs`) is called unprobed, with an entry
probe, and with an entry and a return probe, each probe filtered to the
agent's pid (no other process takes a trap) and running a program that
returns at once (`mt_calibrate`). The differences of the medians are the
costs. They leave out the work memtrace's real programs do past the trap
(a map lookup for a launch, the in-flight slot and the ring record for a
copy), so the figure is a floor: bench/overhead.py sets it beside the
slowdown a launch loop actually shows.

The agent's CPU time while calibrating: CALLS x ROUNDS x 3 calls of
`labs`, about 0.1 s on a small VM; attaching and detaching the two probes
take longer (0.1 to 0.5 s each here). The figure is kept for an hour in
/run/memtrace (cleared at boot), so `memtrace run` does not pay that each
time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memtrace.bpf.libbpf import BpfObject, Link
from memtrace.core.errors import MemtraceError
from memtrace.core.overhead import FALLBACK, TrapCost
from memtrace.core.threads import thread

log = logging.getLogger("memtrace")

CALLS = 2000
ROUNDS = 3
PROGRAM = "mt_calibrate"
CACHE = Path("/run/memtrace/trap-cost.json")  # tmpfs: gone at the next boot
CACHE_MAX_AGE_S = 3600.0


def file_offset(addr: int, maps: str = "/proc/self/maps") -> tuple[str, int]:
    """The file, and the offset in it, of a code address of this process."""
    with open(maps) as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi and len(parts) >= 6 and parts[5].startswith("/"):
                return parts[5], addr - lo + int(parts[2], 16)
    raise MemtraceError(f"address {addr:#x} is in no mapped file", "")


def _labs() -> tuple[Callable[[int], int], str, int]:
    name = ctypes.util.find_library("c")
    if name is None:
        raise MemtraceError("no libc to calibrate with", "")
    fn = ctypes.CDLL(name).labs
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long]
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if addr is None:
        raise MemtraceError("labs has no address", "")
    path, offset = file_offset(addr)
    return fn, path, offset


def _cpu_per_call(fn: Callable[[int], int], n: int) -> float:
    """This thread's CPU seconds per call: a trap is paid in the caller's
    system time, and time spent preempted on a busy host is not counted."""
    t = time.thread_time()
    for i in range(n):
        fn(i)
    return (time.thread_time() - t) / n


def calibrate(obj: BpfObject, calls: int = CALLS, rounds: int = ROUNDS) -> tuple[TrapCost, list[Link]]:
    """Time a trap. Returns the cost and the probes' links, still attached:
    detaching waits out kernel grace periods (up to a second on a loaded
    host), so the caller lets them go where nobody waits (`release`)."""
    fn, path, offset = _labs()
    me = os.getpid()
    links: list[Link] = []
    try:
        _cpu_per_call(fn, calls)  # warm
        bare = [_cpu_per_call(fn, calls) for _ in range(rounds)]
        links.append(obj.attach_uprobe(PROGRAM, path, offset, 0, False, pid=me))
        entry = [_cpu_per_call(fn, calls) for _ in range(rounds)]
        links.append(obj.attach_uprobe(PROGRAM, path, offset, 0, True, pid=me))
        pair = [_cpu_per_call(fn, calls) for _ in range(rounds)]
    except BaseException:
        release(links)
        raise
    b = statistics.median(bare)
    cost = TrapCost(
        entry_seconds=max(statistics.median(entry) - b, 1e-9),
        pair_seconds=max(statistics.median(pair) - b, 2e-9),
    )
    log.info(
        "a probe's trap costs %.2f us on this host (an entry and a return: %.2f us)",
        cost.entry_seconds * 1e6,
        cost.pair_seconds * 1e6,
    )
    return cost, links


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def load_cached(path: Path = CACHE, max_age_s: float = CACHE_MAX_AGE_S) -> TrapCost | None:
    """This boot's last measured cost, if younger than `max_age_s` (agents
    that start often, `memtrace run`, need not attach and detach the
    calibration probes each time)."""
    try:
        doc = json.loads(path.read_text())
        if doc["boot_id"] != _boot_id() or not 0 <= time.time() - doc["measured_at"] < max_age_s:
            return None
        return TrapCost(float(doc["entry_seconds"]), float(doc["pair_seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_cached(cost: TrapCost, path: Path = CACHE) -> None:
    doc = {
        "boot_id": _boot_id(),
        "measured_at": time.time(),
        "entry_seconds": cost.entry_seconds,
        "pair_seconds": cost.pair_seconds,
    }
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
    except OSError as e:
        log.debug("cannot keep the trap cost in %s: %s", path, e)


def release(links: list[Link]) -> None:
    """Detach on a daemon thread: nobody waits for the kernel's grace periods."""

    def detach() -> None:
        for link in links:
            link.destroy()

    if links:
        thread(detach, "memtrace-detach").start()


class Calibration:
    """Runs `calibrate` on a thread of its own; `result` waits for it."""

    def __init__(self, obj: BpfObject, on_done: Callable[[TrapCost], None] = lambda cost: None) -> None:
        self._obj = obj
        self._on_done = on_done
        self._cost: TrapCost | None = None
        self._done = threading.Event()
        self._links: list[Link] = []
        self._thread = thread(self._run, "memtrace-calibrate")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self._cost = load_cached()
            if self._cost is None:
                self._cost, self._links = calibrate(self._obj)
                save_cached(self._cost)
        except Exception as e:  # noqa: BLE001 - a cost it cannot time is a fallback, never a failure
            log.warning(
                "cannot time a probe's trap here (%s): overheads are estimated at %.1f us a trap, not calibrated",
                e,
                FALLBACK.entry_seconds * 1e6,
            )
            self._cost = FALLBACK
        finally:
            if self._cost is not None:
                self._on_done(self._cost)
            self._done.set()

    def result(self, timeout: float | None = None) -> TrapCost | None:
        """The cost once measured (FALLBACK if it could not be); None if not
        done within `timeout`."""
        if not self._done.wait(timeout):
            return None
        return self._cost

    def close(self) -> None:
        """Wait for the calibration (its probes use the BPF object) and let its probes go."""
        self._thread.join()
        links, self._links = self._links, []
        release(links)
