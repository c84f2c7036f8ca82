"""`memtrace profile -- CMD` and `memtrace profile --pid PID`: wiring only
(`memtrace run --stacks` with every profile written to one folder)."""

from __future__ import annotations

import os

import typer

from memtrace.cli.common import Format, app, err, fail, setup_logging
from memtrace.cli.run import RunCommand, trace_and_report
from memtrace.core.errors import BadOption

FILES = {
    "summary": "summary.json",
    "pprof": "memtrace.pb.gz",
    "flamegraph": "copies.svg",
    "folded": "copies.folded",
    "timeline": "timeline.html",
}


@app.command(
    cls=RunCommand,
    short_help="Trace a command; write its call sites as profiles.",
    context_settings={"allow_interspersed_args": False},
)
def profile(
    cmd: list[str] = typer.Argument(None, metavar="CMD [ARGS]...", hidden=True),
    out_dir: str = typer.Option(
        "memtrace-profile", "--output", "-o", metavar="DIR", help="The folder the profiles go to (made if missing)."
    ),
    pid: int | None = typer.Option(
        None, "--pid", "-p", metavar="PID", help="Profile this running process (and its new children) instead of CMD."
    ),
    duration: float = typer.Option(
        30.0, "--duration", metavar="SECONDS", help="With --pid: how long (it ends sooner if the process exits, or ^C)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """Trace CMD, or a running process (--pid) for a while, with call stacks
    (native and Python frames) and write, in DIR: memtrace.pb.gz (pprof:
    copies, copy bytes, allocations, allocated and in-use bytes; `go tool
    pprof`), copies.svg (an interactive flame graph of copy bytes,
    self-contained), copies.folded (flamegraph.pl, speedscope), timeline.html
    (when each step, copy, wait and diagnosis happened; self-contained) and
    summary.json (`memtrace run --format json`). Exits with CMD's exit code
    (0 with --pid)."""
    setup_logging(verbose)
    if (pid is None) == (not cmd):
        fail(
            BadOption(
                "give a command after --, or --pid, not both", "memtrace profile -- CMD, or memtrace profile --pid PID"
            )
        )
    if pid is not None and not 0 < duration <= 86400:
        fail(BadOption(f"--duration {duration} is out of range", "give 0 to 86400 seconds"))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        fail(BadOption(f"cannot make {out_dir}: {e.strerror or e}", "give -o a folder you can write"))
    path = {k: os.path.join(out_dir, v) for k, v in FILES.items()}
    what = " ".join(cmd) if cmd else f"pid {pid} (for up to {duration:g} s)"
    err.print(f"memtrace: profiles of {what} go to {out_dir}/", highlight=False)
    trace_and_report(
        cmd=cmd or [],
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
        pid=pid,
        seconds=duration,
        timeline=path["timeline"],
        tell_files=True,
    )
