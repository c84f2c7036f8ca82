"""What every command shares: the app, the error console, option parsing."""

from __future__ import annotations

import enum
import logging
import math
import sys

import typer
from rich.console import Console

from memtrace import __version__
from memtrace.core.errors import BadOption, MemtraceError
from memtrace.export.text import say

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="memtrace: zero-code, always-on eBPF measurement of CUDA jobs: their copies, memory, "
    "launches and waits, the host around them, and why they slow down.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
err = Console(stderr=True)

BUDGET_HELP = (
    "The share of a process's CPU time memtrace's probes may cost it (1%, 0.01, or off). "
    "A process that would exceed it has its launch probes sampled (launch counts estimated; "
    "bytes stay exact); one over it anyway is reported (finding overhead_budget_exceeded). "
    "Default: $MEMTRACE_OVERHEAD_BUDGET, else 1%."
)

HOST_RATE_HELP = (
    "How often a C thread reads the NIC counters and the GPUs' utilisation and clock events, for "
    "the busiest 1/HZ second's rates and the share of readings throttled (0: read at each "
    "--host-interval instead)."
)

MIN_RING = 4096
MAX_RING = 1 << 30


class Format(str, enum.Enum):
    table = "table"
    json = "json"


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="memtrace: %(message)s",
        stream=sys.stderr,
    )


def ring_bytes(mib: float) -> int:
    # nan and inf parse as floats; int() of them would be a traceback.
    n = int(mib * (1 << 20)) if math.isfinite(mib) else -1
    if n < MIN_RING or n > MAX_RING:
        raise BadOption(f"--ring-size {mib} MiB is out of range", "give a size between 0.004 and 1024 MiB")
    # A ring's size must be a power of two multiple of the page size.
    size = 4096
    while size < n:
        size <<= 1
    return size


def fail(e: MemtraceError) -> None:
    say(err, "[bold red]memtrace:[/bold red]", e.message, indent=2)
    if e.fix:
        say(err, "[bold]fix:[/bold]", e.fix, lead=2, indent=7)
    raise typer.Exit(2)


def version_cb(value: bool) -> None:
    if value:
        print(f"memtrace {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=version_cb, is_eager=True, help="Print the version."),
) -> None:
    pass


def check_host_rate(hz: float) -> None:
    if hz != 0 and not 1 <= hz <= 1000:
        raise BadOption(f"--host-rate {hz:g} is out of range", "give 1 to 1000 Hz, or 0 for no fast sampling")


def overhead_budget(text: str | None) -> float | None:
    """--overhead-budget (or its environment variable) as a share; None: off."""
    from memtrace.core.overhead import parse_budget

    return parse_budget(text)
