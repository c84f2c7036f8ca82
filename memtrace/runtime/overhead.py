"""Measuring what one uprobe trap costs on this host.

The traced process pays for each of memtrace's probes in its own system
time: the breakpoint's exception, the kernel's uprobe dispatch and the BPF
program. What that costs depends on the instruction the probe replaced
(core/overhead.py, EntryKind): one the kernel emulates takes one exception,
one it single-steps out of line takes two, about ten times the cost in a
VM. memtrace times each kind once at start, on a thread of its own: a
function of the agent's own is called unprobed, with an entry probe, and
with an entry and a return probe, each probe filtered to the agent's pid
(no other process takes a trap) and running a program that returns at once
(`mt_calibrate`). The stepped kind is timed on libc's `labs` (endbr64 or
mov first), the emulated kind on `mt_cal_push` in memtrace's C helpers
(x86-64; push first, as every CUDA entry point seen). The differences of
the medians are the costs. They leave out the work memtrace's real
programs do past the trap (a map lookup for a launch, the in-flight slot
and the ring record for a copy), so the figure is a floor:
bench/overhead.py sets it beside the slowdown a launch loop actually shows.

The agent's CPU time while calibrating: CALLS x ROUNDS x 3 calls of each
function, about 0.1 s on a small VM; attaching and detaching the probes
take longer (0.1 to 0.5 s each here). The figures are kept for an hour in
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
from typing import Any

from memtrace.bpf import elf
from memtrace.bpf.libbpf import BpfObject, Link
from memtrace.core import native
from memtrace.core.errors import MemtraceError
from memtrace.core.overhead import FALLBACK, EntryKind, TrapCost, TrapCosts, entry_kind
from memtrace.core.threads import thread

log = logging.getLogger("memtrace")

CALLS = 2000
ROUNDS = 3
PROGRAM = "mt_calibrate"
CACHE = Path("/run/memtrace/trap-costs.json")  # tmpfs: gone at the next boot
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


Target = tuple[Callable[[int], int], str, int]  # a function of this process, its file and file offset


def _target(fn: Any) -> Target:
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long]
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if addr is None:
        raise MemtraceError("a calibration target has no address", "")
    path, offset = file_offset(addr)
    return fn, path, offset


def _labs() -> Target:
    name = ctypes.util.find_library("c")
    if name is None:
        raise MemtraceError("no libc to calibrate with", "")
    return _target(ctypes.CDLL(name).labs)


def _push() -> Target | None:
    """memtrace's own push-first function (x86-64, where the C helpers are built)."""
    try:
        return _target(native.library().mt_cal_push)
    except (native.NativeUnavailable, AttributeError):
        return None


def _cpu_per_call(fn: Callable[[int], int], n: int) -> float:
    """This thread's CPU seconds per call: a trap is paid in the caller's
    system time, and time spent preempted on a busy host is not counted."""
    t = time.thread_time()
    for i in range(n):
        fn(i)
    return (time.thread_time() - t) / n


def _time(obj: BpfObject, target: Target, kind: EntryKind, calls: int, rounds: int, links: list[Link]) -> TrapCost:
    fn, path, offset = target
    me = os.getpid()
    _cpu_per_call(fn, calls)  # warm
    bare = [_cpu_per_call(fn, calls) for _ in range(rounds)]
    links.append(obj.attach_uprobe(PROGRAM, path, offset, 0, False, pid=me))
    entry = [_cpu_per_call(fn, calls) for _ in range(rounds)]
    links.append(obj.attach_uprobe(PROGRAM, path, offset, 0, True, pid=me))
    pair = [_cpu_per_call(fn, calls) for _ in range(rounds)]
    b = statistics.median(bare)
    cost = TrapCost(
        entry_seconds=max(statistics.median(entry) - b, 1e-9),
        pair_seconds=max(statistics.median(pair) - b, 2e-9),
        kind=kind.value,
    )
    log.info(
        "a probe's trap at a %s entry costs %.2f us on this host (an entry and a return: %.2f us)",
        kind.value,
        cost.entry_seconds * 1e6,
        cost.pair_seconds * 1e6,
    )
    return cost


def calibrate(obj: BpfObject, calls: int = CALLS, rounds: int = ROUNDS) -> tuple[TrapCosts, list[Link]]:
    """Time a trap at each entry kind this host can time. Returns the costs
    and the probes' links, still attached: detaching waits out kernel grace
    periods (up to a second on a loaded host), so the caller lets them go
    where nobody waits (`release`)."""
    machine = os.uname().machine
    targets = [_labs()]
    push = _push()
    if push is not None:
        targets.append(push)
    links: list[Link] = []
    by_kind: dict[EntryKind, TrapCost] = {}
    try:
        for target in targets:
            with open(target[1], "rb") as f:
                kind = entry_kind(elf.code_at(f, target[2], 2), machine)
            if kind not in by_kind:
                by_kind[kind] = _time(obj, target, kind, calls, rounds, links)
    except BaseException:
        release(links)
        raise
    return TrapCosts(by_kind), links


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def load_cached(path: Path = CACHE, max_age_s: float = CACHE_MAX_AGE_S) -> TrapCosts | None:
    """This boot's last measured costs, if younger than `max_age_s` (agents
    that start often, `memtrace run`, need not attach and detach the
    calibration probes each time)."""
    try:
        doc = json.loads(path.read_text())
        if doc["boot_id"] != _boot_id() or not 0 <= time.time() - doc["measured_at"] < max_age_s:
            return None
        by_kind = {
            EntryKind(k): TrapCost(float(v["entry_seconds"]), float(v["pair_seconds"]), kind=k)
            for k, v in doc["kinds"].items()
        }
        return TrapCosts(by_kind) if by_kind else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_cached(costs: TrapCosts, path: Path = CACHE) -> None:
    doc = {
        "boot_id": _boot_id(),
        "measured_at": time.time(),
        "kinds": {
            k.value: {"entry_seconds": c.entry_seconds, "pair_seconds": c.pair_seconds}
            for k, c in costs.by_kind.items()
        },
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

    def __init__(self, obj: BpfObject, on_done: Callable[[TrapCosts], None] = lambda costs: None) -> None:
        self._obj = obj
        self._on_done = on_done
        self._cost: TrapCosts | None = None
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
            self._cost = TrapCosts({EntryKind.STEPPED: FALLBACK})
        finally:
            if self._cost is not None:
                self._on_done(self._cost)
            self._done.set()

    def result(self, timeout: float | None = None) -> TrapCosts | None:
        """The costs once measured (FALLBACK if they could not be); None if
        not done within `timeout`."""
        if not self._done.wait(timeout):
            return None
        return self._cost

    def close(self) -> None:
        """Wait for the calibration (its probes use the BPF object) and let its probes go."""
        self._thread.join()
        links, self._links = self._links, []
        release(links)
