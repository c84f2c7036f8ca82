"""Holding a process while its new CUDA library is attached: the rules for
continuing it, and the guardian that bounds every hold.

BPF stops (SIGSTOP) a process that maps the code of a CUDA library this
agent has not attached, and records the hold in this agent's `mt_held` map,
keyed by the host tgid, with the time and the pid to continue it by. Every
agent on the host has its own map of that name, so:

- an agent continues a process only once no other agent's live hold on it
  remains (each gets its probes in before the process runs on); the last
  one to let go continues it;
- a hold lives at most `HOLD_LIMIT_S` past the agent's last progress on
  it (each probe attached restarts its clock): the guardian, a child process in its
  own session (a ^Z on the agent's terminal does not stop it; it ignores
  the terminal's signals), continues any hold older than that even when the
  agent is alive but stopped or stuck, and continues everything as soon as the
  agent dies, and again each sweep until its links are closed (so no hold
  outlasts it by more than a sweep).

Whoever deletes a hold's entry from its map continues the process: the
agent learns that its hold expired when the entry is already gone. Before
it deletes one, it marks the release in the same map (the pid with the
`RELEASING` bit): an agent killed or stopped between the delete and its
SIGCONT leaves the mark, and the guardian continues the process for it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from memtrace.bpf.libbpf import Libbpf, Map, map_info, maps_named
from memtrace.core.abi import Hold
from memtrace.core.threads import load_libc, name_os_thread

log = logging.getLogger("memtrace")

HELD_MAP = "mt_held"
# The longest a process stays held without the agent making progress on it
# (each probe attached restarts the clock), whether the agent is stopped,
# stuck or gone.
HOLD_LIMIT_S = 5.0
# The guardian sleeps until the oldest hold reaches the limit (a hold made
# later reaches it no sooner than the limit from now: with none, it wakes once
# a limit), never less than SWEEP_S; after the agent died, it sweeps every SWEEP_S.
SWEEP_S = 0.02
GUARDIAN_NAME = "memtrace-guard"  # its comm, where operators look (`top`, `ps`)
# A key with this bit set marks a release under way for the pid below it
# (pids stay under 2**22, PID_MAX_LIMIT; the kernel never writes such a key).
RELEASING = 1 << 31


@dataclass(frozen=True)
class Release:
    host_pid: int
    pid: int  # as this agent's pid namespace names it
    expired: bool  # continued by the hold limit, not once attached
    waited_for_another: bool  # another agent still holds it: that agent continues it


def _now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # bpf_ktime_get_ns's clock


def _other_held_maps(lib: Libbpf, own: Map) -> Iterator[Map]:
    own_info = map_info(lib, own.fd)
    own_id = own_info.id if own_info else -1
    for m, info in maps_named(lib, HELD_MAP):
        if info.id == own_id or info.key_size != 4 or info.value_size != ctypes.sizeof(Hold):
            os.close(m.fd)
            continue
        yield m


def held_elsewhere(lib: Libbpf, own: Map, host_pid: int, limit_ns: int) -> bool:
    """Does another agent hold this process, with a hold younger than the limit?"""
    now = _now_ns()
    found = False
    for m in _other_held_maps(lib, own):
        try:
            h = Hold()
            if not found and m.lookup(ctypes.c_uint32(host_pid), h) and now - h.ts_ns < limit_ns:
                found = True
        finally:
            os.close(m.fd)
    return found


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    except PermissionError as e:  # pragma: no cover
        log.error("cannot continue pid %d: %s", pid, e)


def release(held: Map, host_pid: int, limit_s: float = HOLD_LIMIT_S) -> Release:
    """Lift this agent's hold on a process once its probes are in.

    `expired` when the entry is gone already: the guardian got there first
    (the hold outlived the limit), or the process exited."""
    key = ctypes.c_uint32(host_pid)
    h = Hold()
    if not held.lookup(key, h):
        return Release(host_pid, 0, True, False)
    mark = _mark(held, host_pid, h)
    try:
        if not held.delete(key):
            return Release(host_pid, h.pid, True, False)  # the guardian deleted it in between
        return _continue_unless_held_elsewhere(held, host_pid, h.pid, int(limit_s * 1e9), expired=False)
    finally:
        if mark is not None:
            held.delete(mark)


def _mark(held: Map, host_pid: int, h: Hold) -> ctypes.c_uint32 | None:
    """Mark a release under way, so a death between the delete and the
    SIGCONT cannot leave the process stopped (the guardian continues what
    a mark names). None if the map is full: the release goes on unmarked."""
    mark = ctypes.c_uint32(host_pid | RELEASING)
    m = Hold(ts_ns=_now_ns(), pid=h.pid)
    try:
        held.update(mark, m, 0)
    except OSError:
        return None
    return mark


def _continue_unless_held_elsewhere(held: Map, host_pid: int, pid: int, limit_ns: int, expired: bool) -> Release:
    # This agent's entry is gone already: of two agents letting go at once,
    # at least the second sees the other's entry gone, so one continues it.
    if held_elsewhere(Libbpf.get(), held, host_pid, limit_ns):
        return Release(host_pid, pid, expired, True)
    _cont(pid)
    return Release(host_pid, pid, expired, False)


def refresh(held: Map, host_pid: int) -> bool:
    """Restart a live hold's clock (the agent is making progress on it).
    False if it is gone already: never brings back an expired hold."""
    key = ctypes.c_uint32(host_pid)
    h = Hold()
    if not held.lookup(key, h):
        return False
    h.ts_ns = _now_ns()
    try:
        held.update(key, h, _BPF_EXIST)
    except OSError:
        return False
    return True


_BPF_EXIST = 2


def _entries(held: Map) -> list[tuple[int, int, Hold]]:
    """(key, host pid, hold) for every entry: holds and marked releases."""
    out = []
    for k in list(held.keys(ctypes.c_uint32)):
        h = Hold()
        if held.lookup(k, h):
            out.append((int(k.value), int(k.value) & ~RELEASING, h))
    return out


def until_due_s(held: Map, limit_s: float = HOLD_LIMIT_S) -> float:
    """Seconds until the oldest entry (hold or marked release) reaches the
    limit; the limit itself when there is none (an entry made from now on
    reaches it no sooner). At least SWEEP_S, at most the limit."""
    now = _now_ns()
    due = min((h.ts_ns for _k, _p, h in _entries(held)), default=now) + int(limit_s * 1e9)
    return min(limit_s, max(SWEEP_S, (due - now) / 1e9))


def expire(held: Map, limit_s: float = HOLD_LIMIT_S) -> list[Release]:
    """Continue every hold of this agent's older than the limit, and every
    release it marked that long ago and did not finish (it is stopped or
    stuck in between)."""
    limit_ns = int(limit_s * 1e9)
    now = _now_ns()
    out = []
    for key, host_pid, h in _entries(held):
        if now - h.ts_ns >= limit_ns and held.delete(ctypes.c_uint32(key)):
            out.append(_continue_unless_held_elsewhere(held, host_pid, h.pid, limit_ns, expired=True))
    return out


def release_all(held: Map, limit_s: float = HOLD_LIMIT_S) -> list[Release]:
    """Let go of every hold of this agent's and finish every release it
    marked (it is closing or gone)."""
    limit_ns = int(limit_s * 1e9)
    out = []
    for key, host_pid, h in _entries(held):
        if held.delete(ctypes.c_uint32(key)):
            out.append(_continue_unless_held_elsewhere(held, host_pid, h.pid, limit_ns, expired=False))
    return out


_QUIT = b"q"


class Guardian:
    """A child process that bounds every hold of its agent's.

    It holds the `mt_held` map and the read end of a pipe. It continues holds
    older than the limit, waking as the oldest reaches it (until_due_s: an
    agent holding nothing wakes its guardian once a limit, 5 s, where a sweep
    every SWEEP_S cost about 1% of a core on a 2-vCPU VM). When the agent closes normally it
    writes a byte first; when the agent dies (SIGKILL included) the pipe
    just reaches EOF, maybe before the agent's links are closed, so the
    guardian continues whatever is held then, and again each sweep until
    the agent is gone (it is reparented).
    """

    def __init__(self, held: Map, limit_s: float = HOLD_LIMIT_S) -> None:
        r, w = os.pipe()
        agent = os.getpid()
        load_libc()  # the child names itself with no dlopen after the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (covered by the safety tests)
            try:
                os.close(w)
                name_os_thread(GUARDIAN_NAME)
                os.setsid()  # out of the agent's process group: the terminal's ^Z, ^C do not reach it
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
                    signal.signal(s, signal.SIG_IGN)
                # Keep only the pipe, the map and stderr: no link or
                # program fd may outlive the agent in here.
                keep = sorted({2, r, held.fd})
                lo = 3
                for fd in keep:
                    if fd >= lo:
                        os.closerange(lo, fd)
                        lo = fd + 1
                os.closerange(lo, os.sysconf("SC_OPEN_MAX"))
                _guard(held, r, agent, limit_s)
            finally:
                os._exit(0)
        os.close(r)
        self.pid = pid
        self._w = w

    def close(self) -> None:
        if self._w >= 0:
            try:
                os.write(self._w, _QUIT)
            finally:
                os.close(self._w)
                self._w = -1
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"memtrace: guardian: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _guard(held: Map, r: int, agent: int, limit_s: float) -> None:  # pragma: no cover - child
    quit_ = False
    while True:
        ready, _, _ = select.select([r], [], [], until_due_s(held, limit_s))
        if ready:
            data = os.read(r, 64)
            if not data or _QUIT in data:
                quit_ = _QUIT in data
                break
        for rel in expire(held, limit_s):
            _say(f"continued pid {rel.pid}: held past the hold limit ({limit_s:g} s)")
    if not quit_:
        # The agent died: its links close after this pipe, one by one (the
        # kernel waits out RCU grace periods for each uprobe: seconds for a
        # few dozen), and until the tracepoint's closes it may still hold a
        # process. Nobody will attach for a dead agent: continue every hold
        # at once, and again each sweep until the agent is gone.
        while os.getppid() == agent:
            release_all(held, limit_s)
            time.sleep(SWEEP_S)
        time.sleep(0.05)  # a program already running when its link went
    release_all(held, limit_s)
