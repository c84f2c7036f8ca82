"""`memtrace run -- CMD`: wiring only."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

import typer
from rich.console import Console
from typer.core import TyperCommand

from memtrace.cli.common import (
    BUDGET_HELP,
    HOST_RATE_HELP,
    Format,
    app,
    check_host_rate,
    err,
    fail,
    overhead_budget,
    ring_bytes,
    setup_logging,
)
from memtrace.core.errors import BadOption, MemtraceError

log = logging.getLogger("memtrace")

# How long the summary waits for a probe's trap cost (measured at start, on a thread).
CALIBRATION_WAIT_S = 10.0


def open_output(path: str) -> tuple[IO[str], bool]:
    """Open -o's file before CMD starts: a bad path fails now, not after the
    run. Opened for append so that a run that fails leaves an existing file as
    it was; returns the file and whether this created it."""
    existed = os.path.lexists(path)
    try:
        return open(path, "a"), not existed
    except OSError as e:
        raise BadOption(
            f"cannot write the summary to {path}: {e.strerror or e}", "give -o a path in a writable directory"
        ) from None


def write_file(path: str, data: bytes, what: str) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        err.print(f"[bold red]memtrace:[/bold red] could not write {what} to {path}: {e}", highlight=False)


class SummaryConsole(Console):
    """rich turns a broken pipe into SystemExit(1); the code must stay CMD's."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


class RunCommand(TyperCommand):
    """Usage reads `memtrace run [OPTIONS] -- CMD [ARGS]...`."""

    def collect_usage_pieces(self, ctx: object) -> list[str]:
        return ["[OPTIONS] -- CMD [ARGS]..."]


@app.command(
    cls=RunCommand,
    short_help="Trace a command; print what it copied.",
    context_settings={"allow_interspersed_args": False},
)
def run(
    cmd: list[str] = typer.Argument(..., metavar="CMD [ARGS]...", hidden=True),
    fmt: Format = typer.Option(
        Format.table, "--format", "-f", metavar="table|json", help="Summary format: table or json."
    ),
    output: str | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="FILE",
        help="Write the summary to FILE (default: table to stderr, json to stdout).",
    ),
    detail: bool = typer.Option(False, "--detail", "-d", help="Table: one row per API, not per direction."),
    ring_size: float = typer.Option(
        16, "--ring-size", metavar="MIB", help="Event ring size in MiB (rounded up to a power of two)."
    ),
    host: bool = typer.Option(
        True, "--host/--no-host", help="Also measure CPU waits, NICs, GPUs (NVML) and NCCL collectives."
    ),
    host_interval: float = typer.Option(
        0.5, "--host-interval", metavar="SECONDS", help="How often the host signals are sampled."
    ),
    host_rate: float = typer.Option(100, "--host-rate", metavar="HZ", help=HOST_RATE_HELP),
    budget: str | None = typer.Option(None, "--overhead-budget", metavar="SHARE", help=BUDGET_HELP),
    stacks: bool = typer.Option(
        False, "--stacks", help="Take the call stack of each copy and allocation: the top call sites."
    ),
    folded: str | None = typer.Option(
        None,
        "--folded",
        metavar="FILE",
        help="With --stacks: write copy bytes as folded stacks to FILE (flamegraph.pl, speedscope).",
    ),
    pprof: str | None = typer.Option(
        None,
        "--pprof",
        metavar="FILE",
        help="With --stacks: write the call sites as a gzipped pprof profile to FILE (go tool pprof).",
    ),
    flamegraph: str | None = typer.Option(
        None,
        "--flamegraph",
        metavar="FILE",
        help="With --stacks: write an interactive SVG flame graph of copy bytes to FILE.",
    ),
    timeline: str | None = typer.Option(
        None,
        "--timeline",
        metavar="FILE",
        help="Write what happened when as a Perfetto trace to FILE (ui.perfetto.dev), or, for FILE.html, "
        "as a self-contained HTML timeline.",
    ),
    timeline_memory: float = typer.Option(
        1024, "--timeline-memory", metavar="MIB", help="With --timeline: events kept, at most (the oldest go first)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments and libbpf messages."),
) -> None:
    """Trace CMD (a program and its arguments, after --) and its children from
    their first instruction until CMD exits, then print what they copied.
    Exits with CMD's exit code.

    The table goes to stderr and JSON to stdout; with JSON on stdout, CMD's own
    stdout is sent to stderr so the two never mix. -o FILE takes either."""
    trace_and_report(
        cmd,
        fmt,
        output,
        detail,
        ring_size,
        host,
        host_interval,
        budget,
        stacks,
        folded,
        pprof,
        flamegraph,
        verbose,
        host_rate=host_rate,
        timeline=timeline,
        timeline_memory=timeline_memory,
    )


def trace_and_report(
    cmd: list[str],
    fmt: Format,
    output: str | None,
    detail: bool,
    ring_size: float,
    host: bool,
    host_interval: float,
    budget: str | None,
    stacks: bool,
    folded: str | None,
    pprof: str | None,
    flamegraph: str | None,
    verbose: bool,
    pid: int | None = None,
    seconds: float = 0.0,
    host_rate: float = 100.0,
    timeline: str | None = None,
    timeline_memory: float = 1024,
    tell_files: bool = False,
) -> None:
    """`run`'s work: trace CMD until it exits, or (`pid`) a running process
    for `seconds`, then write the summary and the profiles asked for.
    `tell_files` (`profile`): the table goes to stderr as well, then a list
    of the files written."""
    setup_logging(verbose)
    from memtrace.export import profiles
    from memtrace.export.callsites import call_sites
    from memtrace.export.callsites import folded as fold_stacks
    from memtrace.export.report import summary
    from memtrace.export.schema import Command
    from memtrace.runtime.command import run_command, watch_pid
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.recorder import Recorder, RecorderOptions

    out: IO[str] | None = None
    created = written = False
    json_fd: int | None = None
    try:
        for flag, value in (("--folded", folded), ("--pprof", pprof), ("--flamegraph", flamegraph)):
            if value is not None and not stacks:
                raise BadOption(f"{flag} needs --stacks", f"add --stacks, or leave {flag} out")
        opts = Options(
            only_traced=True,
            ring_bytes=ring_bytes(ring_size),
            hold_nccl=host,
            stacks=stacks,
            # each launch a slice (docs/timeline.md): in a Perfetto trace, and in the HTML page's launch lanes
            launch_events=timeline is not None,
        )
        budget_share = overhead_budget(budget)
        if not 0.001 <= host_interval <= 60:
            raise BadOption(f"--host-interval {host_interval} is out of range", "give 0.001 to 60 seconds")
        check_host_rate(host_rate)
        recorder = None
        if timeline is not None:
            where = os.path.dirname(os.path.abspath(timeline))
            if not os.access(where, os.W_OK):
                raise BadOption(
                    f"cannot write the timeline to {timeline}", "give --timeline a path in a writable folder"
                )
            if not 1 <= timeline_memory <= 65536:
                raise BadOption(f"--timeline-memory {timeline_memory} is out of range", "give 1 to 65536 MiB")
            recorder = Recorder(RecorderOptions(seconds=math.inf, max_bytes=int(timeline_memory * (1 << 20))))
        if output:
            out, created = open_output(output)
        elif fmt == Format.json:
            # stdout carries the JSON alone: CMD (and anything the agent
            # starts) gets stderr as its stdout.
            sys.stdout.flush()
            json_fd = os.dup(1)
            os.dup2(2, 1)
        hopts = HostOptions(interval_s=host_interval, fast_hz=host_rate) if host else None
        began = time.monotonic_ns()
        with Pipeline(PipelineOptions(opts, hopts, budget_share, from_exec=pid is None), recorder=recorder) as pipe:
            agent, signals, diagnosis = pipe.agent, pipe.host, pipe.diagnosis
            if pid is None:
                done = run_command(pipe, cmd)
                command = Command(argv=cmd, exit_code=done.exit_code, wall_seconds=done.wall_seconds)
                if done.signal is not None:
                    command["signal"] = done.signal  # it did not exit: a signal ended it
                if done.interrupted:
                    command["interrupted"] = True  # ^C or SIGTERM reached it through memtrace
            else:
                done = watch_pid(pipe, pid, seconds)
                command = Command(pid=pid, exit_code=None, wall_seconds=done.wall_seconds)
            if not agent.wait_calibrated(CALIBRATION_WAIT_S):
                log.warning("a probe's trap cost is not measured yet: the summary has no overhead")
            doc = summary(
                agent.model,
                agent.stats(),
                agent.libraries,
                command,
                agent.cuda.malformed,
                drain=agent.drain_stats().as_dict(),
                host=signals.view(agent.names()) if signals else None,
                collectives=signals.collectives_view(agent.model.collective_wait_totals()) if signals else None,
                diagnoses=diagnosis.diagnoses if diagnosis else None,
                overhead_budget=budget_share,
                stacks=call_sites(agent.model, agent.stack_frames()) if stacks else None,
                stack_counts=agent.stack_counts(),
                book=signals.book if signals else None,
            )
            copies = fold_stacks(doc["stacks"]) if folded is not None or flamegraph is not None else ""
            if folded is not None:
                write_file(folded, copies.encode(), "the folded stacks")
            if pprof is not None:
                write_file(pprof, profiles.pprof(doc["stacks"]), "the pprof profile")
            if flamegraph is not None:
                what = " ".join([os.path.basename(cmd[0]), *cmd[1:]]) if cmd else f"pid {pid}"
                if len(what) > 100:
                    what = what[:97] + "..."
                svg = profiles.flame_graph(copies, f"memtrace: bytes copied by {what}")
                write_file(flamegraph, svg.encode(), "the flame graph")
            if recorder is not None and timeline is not None:
                write_timeline(recorder, pipe, timeline, began, doc, cmd, pid)
            # Said before the agent closes: removing its probes and tracepoints
            # waits out the kernel's grace periods (bench/exit_time.py).
            emit_summary(doc, fmt, out, json_fd, detail)
            written = True
            if tell_files:
                tell(doc, [f for f in (output, pprof, flamegraph, folded, timeline) if f], detail)
    except MemtraceError as e:
        if out is not None and not written:
            out.close()
            if created and output:
                os.unlink(output)
        fail(e)
        return
    raise typer.Exit(done.exit_code)


def tell(doc: Mapping[str, Any], files: list[str], detail: bool) -> None:
    """The summary's table on stderr, then each file written and its size."""
    from memtrace.export.report import print_table

    try:
        print_table(doc, SummaryConsole(file=sys.stderr), detail=detail)
        for f in files:
            if os.path.exists(f):
                err.print(f"memtrace: wrote {f} ({os.path.getsize(f):,} bytes)", highlight=False, soft_wrap=True)
    except BrokenPipeError:
        pass


def write_timeline(
    recorder: Any, pipe: Any, path: str, began: int, doc: Mapping[str, Any], cmd: list[str], pid: int | None
) -> None:
    """--timeline: the whole run, its counters' last readings taken now (they are the summary's)."""
    recorder.tick(pipe.agent, pipe.host)
    tl = recorder.timeline(pipe.agent, pipe.host, began, time.monotonic_ns(), findings=doc.get("findings"))
    tl.title = "memtrace: " + (" ".join([os.path.basename(cmd[0]), *cmd[1:]])[:100] if cmd else f"pid {pid}")
    try:
        recorder.write(tl, path)
    except OSError as e:
        err.print(f"[bold red]memtrace:[/bold red] could not write the timeline to {path}: {e}", highlight=False)


def emit_summary(doc: Mapping[str, Any], fmt: Format, out: IO[str] | None, json_fd: int | None, detail: bool) -> None:
    """Write the summary: to `out` (-o), else JSON to stdout (its saved
    descriptor `json_fd`) or the table to stderr; then stdout goes to
    /dev/null, so nothing is left to flush into a closed pipe at exit."""
    from memtrace.export.report import print_table

    if out is not None and stat.S_ISREG(os.fstat(out.fileno()).st_mode):
        # A file's old content goes now the summary is ready (not /dev/null,
        # a pipe or a terminal: those cannot be truncated).
        out.seek(0)
        out.truncate()
    try:
        if fmt == Format.json:
            target = out if out is not None else os.fdopen(json_fd if json_fd is not None else 1, "w")
            json.dump(doc, target, indent=2)
            target.write("\n")
            target.flush()
        else:
            target = out if out is not None else sys.stderr
            print_table(doc, SummaryConsole(file=target), detail=detail)
            target.flush()
    except BrokenPipeError:
        # The reader left (`| head -1`): not memtrace's failure, nor CMD's.
        pass
    except OSError as e:
        err.print(f"[bold red]memtrace:[/bold red] could not write the summary: {e}", highlight=False)
    finally:
        if out is not None:
            try:
                out.close()
            except OSError as e:
                err.print(f"[bold red]memtrace:[/bold red] could not write the summary: {e}", highlight=False)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
