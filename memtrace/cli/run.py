"""`memtrace run -- CMD`: wiring only."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from memtrace.cli.common import Format, app, fail, ring_bytes, setup_logging
from memtrace.core.errors import MemtraceError


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    cmd: list[str] = typer.Argument(..., metavar="-- CMD [ARGS]...", help="The command to trace."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Summary format."),
    output: str | None = typer.Option(None, "--output", "-o", help="Write the summary here instead of stdout."),
    ring_size: float = typer.Option(16, "--ring-size", help="Event ring size in MiB (rounded up to a power of two)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """Trace CMD and its children from their first instruction until CMD exits,
    then print what they copied. Exits with CMD's exit code."""
    setup_logging(verbose)
    from memtrace.export.report import print_table, summary
    from memtrace.runtime.agent import Agent, Options
    from memtrace.runtime.command import run_command

    try:
        opts = Options(only_traced=True, ring_bytes=ring_bytes(ring_size))
        with Agent(opts) as agent:
            done = run_command(agent, cmd)
            doc = summary(
                agent.model,
                agent.stats(),
                agent.libraries,
                {"argv": cmd, "exit_code": done.exit_code, "wall_seconds": done.wall_seconds},
                agent.source.malformed,
                drain=agent.drain_stats().as_dict(),
            )
    except MemtraceError as e:
        fail(e)
        return
    out = open(output, "w") if output else sys.stdout
    try:
        if fmt == Format.json:
            json.dump(doc, out, indent=2)
            out.write("\n")
        else:
            print_table(doc, Console(file=out, width=160 if output else None))
    finally:
        if output:
            out.close()
    raise typer.Exit(done.exit_code)
