"""memtrace's command line."""

from __future__ import annotations

import enum
import json
import logging
import sys
import time
from typing import Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from . import __version__
from .errors import BadOption, MemtraceError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="memtrace: always-on eBPF tracing of CUDA memory copies.",
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)

MIN_RING = 4096
MAX_RING = 1 << 30


class Format(str, enum.Enum):
    table = "table"
    json = "json"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="memtrace: %(message)s",
        stream=sys.stderr,
    )


def _ring_bytes(mib: float) -> int:
    n = int(mib * (1 << 20))
    if n < MIN_RING or n > MAX_RING:
        raise BadOption(f"--ring-size {mib} MiB is out of range", "give a size between 0.004 and 1024 MiB")
    # A ring's size must be a power of two multiple of the page size.
    size = 4096
    while size < n:
        size <<= 1
    return size


def _fail(e: MemtraceError) -> None:
    err.print(f"[bold red]memtrace:[/bold red] {e.message}", highlight=False)
    if e.fix:
        err.print(f"  [bold]fix:[/bold] {e.fix}", highlight=False)
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
    _setup_logging(verbose)
    from .agent import Agent, run_command
    from .bpfsource import Options
    from .report import print_table, summary

    try:
        opts = Options(only_traced=True, ring_bytes=_ring_bytes(ring_size))
        with Agent(opts) as agent:
            done = run_command(agent, cmd)
            doc = summary(
                agent.model,
                agent.stats(),
                agent.libraries,
                {"argv": cmd, "exit_code": done.exit_code, "wall_seconds": done.wall_seconds},
                agent.source.malformed,
            )
    except MemtraceError as e:
        _fail(e)
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


@app.command()
def top(
    interval: float = typer.Option(1.0, "--interval", "-i", min=0.1, help="Refresh period in seconds."),
    iterations: int = typer.Option(0, "--iterations", "-n", min=0, help="Stop after N refreshes (0: run until ^C)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """A live view of every CUDA process on the host: copies, bytes and rates."""
    _setup_logging(verbose)
    from .agent import DRAIN_INTERVAL_S, Agent
    from .bpfsource import Options
    from .report import human_bytes

    console = Console()
    prev: dict[int, tuple[int, int, int]] = {}

    def render(dt: float) -> Group:
        from .findings import compute
        from .model import HostMemory

        model = agent.model
        t = Table(title=f"memtrace top: CUDA processes (every {interval:g}s)", title_justify="left")
        cols = ("pid", "process", "copies/s", "bytes/s", "bytes", "h2d", "pageable h2d", "d2h", "d2d", "errors")
        for c in (*cols, "dev mem", "sync wait", "launches/s"):
            t.add_column(c, justify="left" if c == "process" else "right")
        per: dict[int, dict[Any, int]] = {}
        for (pid, _api, d, host), st in model.copy_view().items():
            p = per.setdefault(pid, {"calls": 0, "bytes": 0, "errors": 0, 1: 0, 2: 0, 3: 0, "pageable": 0})
            p["calls"] += st.calls
            p["bytes"] += st.bytes
            p["errors"] += st.errors
            if d in (1, 2, 3):
                p[d] += st.bytes
            if d == 1 and host == HostMemory.PAGEABLE:
                p["pageable"] += st.bytes
        waits: dict[int, int] = {}
        for (pid, _api), st in model.sync_view().items():
            waits[pid] = waits.get(pid, 0) + st.duration_ns
        launches: dict[int, int] = {}
        for (pid, _api), n in model.launches.items():
            launches[pid] = launches.get(pid, 0) + n
        empty = {"calls": 0, "bytes": 0, "errors": 0, 1: 0, 2: 0, 3: 0, "pageable": 0}
        shown = set(per) | set(waits) | set(launches)
        shown |= {pid for pid, pr in model.processes.items() if pr.memory.allocations}
        for pid in sorted(shown, key=lambda q: -per.get(q, empty)["bytes"]):
            p = per.get(pid, empty)
            pc, pb, pl = prev.get(pid, (p["calls"], p["bytes"], launches.get(pid, 0)))
            proc = model.processes.get(pid)
            name = (proc.name if proc else "") + (" (exited)" if proc and proc.exited else "")
            wall = proc.wall_ns() if proc else 0
            t.add_row(
                str(pid),
                name,
                f"{(p['calls'] - pc) / dt:,.0f}",
                human_bytes((p["bytes"] - pb) / dt) + "/s",
                human_bytes(p["bytes"]),
                human_bytes(p[1]),
                f"{p['pageable'] / p[1]:.0%}" if p[1] else "",
                human_bytes(p[2]),
                human_bytes(p[3]),
                str(p["errors"]) if p["errors"] else "",
                human_bytes(proc.memory.in_use_bytes) if proc and proc.memory.allocations else "",
                f"{waits[pid] / wall:.0%}" if pid in waits and wall else "",
                f"{(launches.get(pid, 0) - pl) / dt:,.0f}" if pid in launches else "",
            )
            prev[pid] = (p["calls"], p["bytes"], launches.get(pid, 0))
        notes = [
            f"[bold yellow]finding[/bold yellow] ({f.process or f.pid}): {f.summary}. [bold]fix[/bold]: {f.fix}"
            for f in compute(model)
        ]
        return Group(t, *notes)

    try:
        with Agent(Options()) as agent:
            agent.source.scan()
            n = 0
            with Live(render(interval), console=console, auto_refresh=False) as live:
                last = time.monotonic()
                while iterations == 0 or n < iterations:
                    deadline = last + interval
                    while time.monotonic() < deadline:
                        agent.poll()
                        time.sleep(DRAIN_INTERVAL_S)
                    agent.poll()
                    agent.sync_totals()
                    now = time.monotonic()
                    live.update(render(now - last), refresh=True)
                    last = now
                    n += 1
    except MemtraceError as e:
        _fail(e)
    except KeyboardInterrupt:
        pass


@app.command()
def push(
    endpoint: str | None = typer.Option(
        None, "--endpoint", "-e", help="Collector URL (OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT)."
    ),
    protocol: str | None = typer.Option(
        None, "--protocol", help="http/protobuf or grpc (OTEL_EXPORTER_OTLP_PROTOCOL)."
    ),
    interval: float = typer.Option(5.0, "--interval", "-i", help="Seconds between pushes."),
    headers: str | None = typer.Option(
        None,
        "--headers",
        help="K=V,... sent with each push, or @FILE holding them (OTEL_EXPORTER_OTLP_HEADERS). Never logged.",
    ),
    insecure: bool | None = typer.Option(None, "--insecure/--secure", help="Plaintext gRPC (TLS is the default)."),
    temporality: str = typer.Option("cumulative", "--temporality", help="cumulative or delta."),
    histogram: str = typer.Option(
        "exponential", "--histogram", help="exponential, or explicit (fixed power-of-two buckets)."
    ),
    ring_size: float = typer.Option(16, "--ring-size", help="Event ring size in MiB."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Trace every CUDA process on this host and push OTLP metrics to a collector.
    Flags win over the standard OTEL_EXPORTER_OTLP_* variables. No listening port."""
    import os
    import signal
    import threading

    _setup_logging(verbose)
    from .agent import Agent, push_forever
    from .bpfsource import Options
    from .config import resolve

    try:
        cfg = resolve(
            os.environ,
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            interval=interval,
            insecure=insecure,
            temporality=temporality,
            histogram=histogram,
        )
        opts = Options(ring_bytes=_ring_bytes(ring_size))
    except MemtraceError as e:
        _fail(e)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with Agent(opts) as agent:
            agent.source.scan()
            push_forever(agent, cfg, stop)
    except MemtraceError as e:
        _fail(e)


@app.command()
def doctor() -> None:
    """Check this host: kernel, BTF, privileges, libbpf, tracefs, CUDA libraries."""
    from .doctor import run_checks

    raise typer.Exit(0 if run_checks(Console()) else 1)


def entry() -> None:
    app()
