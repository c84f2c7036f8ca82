"""`memtrace run`: trace a command from its first instruction until it
exits; `memtrace profile --pid`: a running process for a while."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass

from memtrace.core.errors import BadOption, CommandNotFound
from memtrace.core.procfiles import alive
from memtrace.runtime.agent import DRAIN_INTERVAL_S
from memtrace.runtime.pipeline import Pipeline


@dataclass
class Finished:
    exit_code: int
    wall_seconds: float
    signal: str | None = None  # the signal that ended it (SIGINT, SIGKILL, SIGSEGV, ...), if one did
    interrupted: bool = False  # a ^C or SIGTERM reached memtrace while it ran, and was passed on to it


class GatedChild:
    """A forked child that execs CMD only once released, so the agent can
    start tracing its pid before the first instruction of CMD runs."""

    def __init__(self, argv: list[str]) -> None:
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if exe is None or not os.path.exists(exe):
            raise CommandNotFound(argv[0])
        if not os.access(exe, os.X_OK):
            raise CommandNotFound(f"{argv[0]} (not executable)")
        gate_r, gate_w = os.pipe()
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(gate_w)
                os.close(err_r)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if os.read(gate_r, 1) != b"g":
                    os._exit(125)
                os.close(gate_r)
                os.execv(exe, argv)
            except OSError as e:
                os.write(err_w, str(e).encode())
            os._exit(127)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid
        self._gate = gate_w
        self._err = err_r
        self.started = time.monotonic()

    def release(self) -> None:
        os.write(self._gate, b"g")
        os.close(self._gate)
        msg = os.read(self._err, 4096)  # EOF on a successful exec
        os.close(self._err)
        self.started = time.monotonic()
        if msg:
            raise CommandNotFound(msg.decode(errors="replace"))

    def abort(self) -> None:
        try:
            os.close(self._gate)
        except OSError:
            pass
        os.waitpid(self.pid, 0)

    def poll(self) -> Finished | None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return self._finished(status)

    def wait(self) -> Finished:
        """Until the command exits (signals are handled meanwhile: waitpid is retried)."""
        _, status = os.waitpid(self.pid, 0)
        return self._finished(status)

    def _finished(self, status: int) -> Finished:
        code = os.waitstatus_to_exitcode(status)
        if code >= 0:
            return Finished(code, time.monotonic() - self.started)
        return Finished(128 - code, time.monotonic() - self.started, signal.Signals(-code).name)


def run_command(pipe: Pipeline, argv: list[str], drain_interval: float = DRAIN_INTERVAL_S) -> Finished:
    """Trace argv and its descendants until it exits, with the pipeline's
    host signals sampling the same processes meanwhile (their last sample
    taken and folded in on return)."""
    agent = pipe.agent
    child = GatedChild(argv)
    running = contextlib.ExitStack()
    try:
        agent.cuda.trace_pid(child.pid)
        running.enter_context(pipe.running([child.pid], drain_interval))
    except BaseException:
        running.close()
        child.abort()
        pipe.finish_host()
        raise
    # The terminal's ^C reaches the child too; we wait for it and report.
    interrupted = [False]

    def noted(_sig: int, _frame: object) -> None:
        interrupted[0] = True

    def forward(sig: int, _frame: object) -> None:
        interrupted[0] = True
        os.kill(child.pid, sig)

    old_int = signal.signal(signal.SIGINT, noted)
    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        # The agent drains on its own thread while this one waits for the command.
        with running:
            child.release()
            done = child.wait()
        # Every event and notice of the finished process is already in the
        # rings; with the drain thread stopped, the model stays as reported.
        agent.cuda.read_control_now()
        agent.poll()
        agent.sync_totals()
        done.interrupted = interrupted[0]
        return done
    finally:
        pipe.finish_host()  # its last sample sees the command's end, and goes into the model
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def watch_pid(pipe: Pipeline, pid: int, seconds: float, drain_interval: float = DRAIN_INTERVAL_S) -> Finished:
    """Trace a running process, and the children it forks from now on, for
    `seconds` or until it exits (or ^C): the libraries it has mapped are
    attached at once. Its calls before then were not seen: host memory that
    was allocated before is `unknown`, and its Python frames are taken from
    its first call memtrace sees on. Exit code 0."""
    if not alive(pid):
        raise BadOption(f"no process {pid}", "give --pid a running process (as this pid namespace names it)")
    agent = pipe.agent
    agent.cuda.trace_pid(pid)
    agent.scan([pid])
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        with pipe.running([pid], drain_interval):
            while not stop.wait(0.05):
                if time.monotonic() - started >= seconds or not alive(pid):
                    break
        agent.cuda.read_control_now()
        agent.poll()
        agent.sync_totals()
        return Finished(0, time.monotonic() - started)
    finally:
        pipe.finish_host()
        for sig, old in handlers.items():
            signal.signal(sig, old)
