"""`memtrace snapshot`: ask the running `memtrace push` for its flight
recorder's last seconds (SIGUSR1), and say where the trace went. Wiring only."""

from __future__ import annotations

import os
import signal
import time

import typer

from memtrace.cli.common import app, fail
from memtrace.core.errors import BadOption


@app.command(short_help="Write the push agent's last seconds as a Perfetto trace.")
def snapshot(
    directory: str = typer.Option(
        "/var/lib/memtrace/timelines", "--recorder-dir", metavar="DIR", help="The agent's --recorder-dir."
    ),
    timeout: float = typer.Option(60.0, "--timeout", metavar="SECONDS", help="How long to wait for the file."),
) -> None:
    """Signal the `memtrace push` agent whose flight recorder writes to DIR
    (SIGUSR1: `kill -USR1 PID` does the same) and print the trace's path
    once it is written (open it at ui.perfetto.dev)."""
    from memtrace.runtime.recorder import PIDFILE

    pidfile = os.path.join(directory, PIDFILE)
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        fail(
            BadOption(
                f"no agent writes to {directory} ({pidfile} is missing)",
                "start `memtrace push`, or give --recorder-dir",
            )
        )
        return
    before = set(os.listdir(directory))
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as e:
        fail(
            BadOption(f"cannot signal the agent (pid {pid}): {e.strerror or e}", "run as root, or as the agent's user")
        )
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = sorted(
            n for n in set(os.listdir(directory)) - before if n.startswith("snapshot-") and n.endswith(".pftrace")
        )
        if new:
            typer.echo(os.path.join(directory, new[-1]))
            return
        time.sleep(0.1)
    fail(
        BadOption(
            f"the agent (pid {pid}) wrote no snapshot within {timeout:g} s", "see its log; --timeout waits longer"
        )
    )
