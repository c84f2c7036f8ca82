"""`memtrace doctor`: wiring only."""

from __future__ import annotations

import typer
from rich.console import Console

from memtrace.cli.common import app


@app.command(short_help="Can this host run memtrace? What to fix.")
def doctor() -> None:
    """Check this host: kernel, BTF, privileges, libbpf, tracefs, CUDA libraries."""
    from memtrace.runtime.doctor import run_checks

    raise typer.Exit(0 if run_checks(Console()) else 1)
