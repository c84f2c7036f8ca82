"""`memtrace top`: wiring only; the view is export/top.py."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.live import Live

from memtrace.cli.common import BUDGET_HELP, app, fail, overhead_budget, setup_logging
from memtrace.core.errors import MemtraceError


@contextmanager
def keys() -> Iterator[Callable[[float], str]]:
    """Keys typed at the terminal, read in cbreak mode (no Enter needed);
    ``wait(t)`` sleeps up to t seconds and returns what was typed. Without a
    terminal on stdin it only sleeps."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else -1
    if fd < 0:

        def sleep(t: float) -> str:
            time.sleep(t)
            return ""

        yield sleep
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def wait(t: float) -> str:
        ready, _, _ = select.select([fd], [], [], t)
        return os.read(fd, 64).decode(errors="replace") if ready else ""

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@app.command(short_help="Live view of every CUDA process.")
def top(
    interval: float = typer.Option(
        1.0, "--interval", "-i", min=0.1, metavar="SECONDS", help="Refresh period in seconds."
    ),
    iterations: int = typer.Option(
        0, "--iterations", "-n", min=0, metavar="N", help="Stop after N refreshes (0: run until ^C)."
    ),
    detail: bool = typer.Option(
        False,
        "--detail",
        "-d",
        help="Also show bytes per direction, errors, launches, step time, GPU idle share and run-queue p99.",
    ),
    budget: str | None = typer.Option(None, "--overhead-budget", metavar="SHARE", help=BUDGET_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """A live view of every CUDA process on the host: copies, bytes and rates."""
    setup_logging(verbose)
    from memtrace.export.top import TopView
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions

    try:
        share = overhead_budget(budget)
        view = TopView(interval, detail, share)
        # The host signals for the live diagnosis and --detail's run-queue p99.
        host = HostOptions(interval_s=min(interval, 0.1))
        with Pipeline(PipelineOptions(Options(hold_nccl=True), host, share)) as pipe:
            agent, signals, diagnosis = pipe.agent, pipe.host, pipe.diagnosis
            assert signals is not None and diagnosis is not None
            n = 0
            with (
                keys() as wait,
                Live(view.render(agent.model, interval), console=Console(), auto_refresh=False) as live,
                pipe.running(),
            ):
                last = time.monotonic()
                # The agent drains on its own thread; this one waits for keys
                # and renders, under the model lock.
                while iterations == 0 or n < iterations:
                    if "q" in wait(max(last + interval - time.monotonic(), 0.0)).lower():
                        return
                    if time.monotonic() < last + interval:
                        continue  # another key: keep waiting for the refresh
                    with agent.locked() as model:
                        agent.sync_totals()
                        now = time.monotonic()
                        with signals.lock:
                            table = view.render(model, now - last, signals.book, diagnosis.diagnoses)
                    live.update(table, refresh=True)
                    last = now
                    n += 1
    except MemtraceError as e:
        fail(e)
    except KeyboardInterrupt:
        pass
