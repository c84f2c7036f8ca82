"""`memtrace top`: wiring only; the view is export/top.py."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.live import Live

from memtrace.cli.common import app, fail, setup_logging
from memtrace.core.errors import MemtraceError


@app.command(short_help="Live view of every CUDA process.")
def top(
    interval: float = typer.Option(
        1.0, "--interval", "-i", min=0.1, metavar="SECONDS", help="Refresh period in seconds."
    ),
    iterations: int = typer.Option(
        0, "--iterations", "-n", min=0, metavar="N", help="Stop after N refreshes (0: run until ^C)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """A live view of every CUDA process on the host: copies, bytes and rates."""
    setup_logging(verbose)
    from memtrace.export.top import TopView
    from memtrace.runtime.agent import DRAIN_INTERVAL_S, Agent, Options

    view = TopView(interval)
    try:
        with Agent(Options()) as agent:
            agent.source.scan()
            n = 0
            with Live(view.render(agent.model, interval), console=Console(), auto_refresh=False) as live:
                last = time.monotonic()
                while iterations == 0 or n < iterations:
                    deadline = last + interval
                    while time.monotonic() < deadline:
                        agent.poll()
                        time.sleep(DRAIN_INTERVAL_S)
                    agent.poll()
                    agent.sync_totals()
                    now = time.monotonic()
                    live.update(view.render(agent.model, now - last), refresh=True)
                    last = now
                    n += 1
    except MemtraceError as e:
        fail(e)
    except KeyboardInterrupt:
        pass
