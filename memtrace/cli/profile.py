"""`memtrace profile -- CMD`: wiring only (`memtrace run --stacks` with
every profile written to one folder)."""

from __future__ import annotations

import os

import typer

from memtrace.cli.common import Format, app, err, fail, setup_logging
from memtrace.cli.run import RunCommand, run
from memtrace.core.errors import BadOption

FILES = {
    "summary": "summary.json",
    "pprof": "memtrace.pb.gz",
    "flamegraph": "copies.svg",
    "folded": "copies.folded",
}


@app.command(
    cls=RunCommand,
    short_help="Trace a command; write its call sites as profiles.",
    context_settings={"allow_interspersed_args": False},
)
def profile(
    cmd: list[str] = typer.Argument(..., metavar="CMD [ARGS]...", hidden=True),
    out_dir: str = typer.Option(
        "memtrace-profile", "--output", "-o", metavar="DIR", help="The folder the profiles go to (made if missing)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """Trace CMD with call stacks (native and Python frames) and write, in
    DIR: memtrace.pb.gz (pprof: copies, copy bytes, allocations, allocated
    and in-use bytes; `go tool pprof`), copies.svg (an interactive flame
    graph of copy bytes, self-contained), copies.folded (flamegraph.pl,
    speedscope) and summary.json (`memtrace run --format json`). Exits with
    CMD's exit code."""
    setup_logging(verbose)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        fail(BadOption(f"cannot make {out_dir}: {e.strerror or e}", "give -o a folder you can write"))
    path = {k: os.path.join(out_dir, v) for k, v in FILES.items()}
    err.print(f"memtrace: profiles of {' '.join(cmd)} go to {out_dir}/", highlight=False)
    run(
        cmd=cmd,
        fmt=Format.json,
        output=path["summary"],
        detail=False,
        ring_size=16,
        host=False,
        host_interval=0.1,
        budget=None,
        stacks=True,
        folded=path["folded"],
        pprof=path["pprof"],
        flamegraph=path["flamegraph"],
        verbose=verbose,
    )
