"""Holding a process while its new CUDA library is attached, and the
guardian that continues every held process if the agent dies.
"""

from __future__ import annotations

import ctypes
import os
import signal

from memtrace.bpf.libbpf import Map


class Guardian:
    """A child process that continues every held process if the agent dies.

    It holds the `held` map and the read end of a pipe; when the agent
    exits for any reason (SIGKILL included) the pipe reaches EOF and the
    guardian sends SIGCONT to whatever is still in the map.
    """

    def __init__(self, held: Map) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.close(w)
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(s, signal.SIG_IGN)
                # Keep only the pipe and the map: no link or program fd may
                # outlive the agent in here.
                lo, hi = sorted((r, held.fd))
                os.closerange(3, lo)
                os.closerange(lo + 1, hi)
                os.closerange(hi + 1, os.sysconf("SC_OPEN_MAX"))
                while os.read(r, 64):
                    pass
                release_all(held)
            finally:
                os._exit(0)
        os.close(r)
        self.pid = pid
        self._w = w

    def close(self) -> None:
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def release_all(held: Map) -> list[int]:
    out = []
    for k in list(held.keys(ctypes.c_uint32)):
        pid = k.value
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        held.delete(k)
        out.append(pid)
    return out
