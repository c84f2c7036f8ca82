"""`memtrace push`: wiring only."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import typer

from memtrace.cli.common import (
    BUDGET_HELP,
    HOST_RATE_HELP,
    app,
    check_host_rate,
    fail,
    overhead_budget,
    ring_bytes,
    setup_logging,
)
from memtrace.core.errors import BadOption, MemtraceError


@app.command(short_help="Trace the host; push OTLP metrics.")
def push(
    endpoint: str | None = typer.Option(
        None, "--endpoint", "-e", metavar="URL", help="Collector URL (OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT)."
    ),
    protocol: str | None = typer.Option(
        None, "--protocol", metavar="PROTOCOL", help="http/protobuf or grpc (OTEL_EXPORTER_OTLP_PROTOCOL)."
    ),
    interval: float = typer.Option(5.0, "--interval", "-i", metavar="SECONDS", help="Seconds between pushes."),
    headers: str | None = typer.Option(
        None,
        "--headers",
        metavar="K=V,...|@FILE",
        help="K=V,... sent with each push, or @FILE holding them (OTEL_EXPORTER_OTLP_HEADERS). Never logged.",
    ),
    insecure: bool | None = typer.Option(None, "--insecure/--secure", help="Plaintext gRPC (TLS is the default)."),
    temporality: str = typer.Option(
        "cumulative", "--temporality", metavar="cumulative|delta", help="cumulative or delta."
    ),
    histogram: str = typer.Option(
        "exponential",
        "--histogram",
        metavar="exponential|explicit",
        help="exponential, or explicit (fixed power-of-two buckets).",
    ),
    ring_size: float = typer.Option(16, "--ring-size", metavar="MIB", help="Event ring size in MiB."),
    host: bool = typer.Option(
        True, "--host/--no-host", help="Also push CPU waits, GPU (NVML) readings and NCCL collectives."
    ),
    host_interval: float = typer.Option(
        0.5, "--host-interval", metavar="SECONDS", help="How often the host signals are sampled."
    ),
    host_rate: float = typer.Option(100, "--host-rate", metavar="HZ", help=HOST_RATE_HELP),
    budget: str | None = typer.Option(None, "--overhead-budget", metavar="SHARE", help=BUDGET_HELP),
    stacks: bool = typer.Option(
        False,
        "--stacks",
        help="Take the call stack of each copy and allocation and push the call sites as OTLP profiles "
        "(the collector's profiles pipeline: deploy/otelcol).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log attachments, pushes and libbpf messages."),
) -> None:
    """Trace every CUDA process on this host and push OTLP metrics to a collector.
    Flags win over the standard OTEL_EXPORTER_OTLP_* variables. No listening port."""
    setup_logging(verbose)
    from memtrace.export.config import resolve
    from memtrace.runtime.hostsignals import HostOptions
    from memtrace.runtime.pipeline import Options, PipelineOptions
    from memtrace.runtime.push import push

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
        cfg = dataclasses.replace(cfg, overhead_budget=overhead_budget(budget))
        if not 0.001 <= host_interval <= 60:
            raise BadOption(f"--host-interval {host_interval} is out of range", "give 0.001 to 60 seconds")
        check_host_rate(host_rate)
        opts = PipelineOptions(
            Options(ring_bytes=ring_bytes(ring_size), hold_nccl=host, stacks=stacks),
            HostOptions(interval_s=host_interval, fast_hz=host_rate, tick_s=max(host_interval, 0.5)) if host else None,
            cfg.overhead_budget,
        )
    except MemtraceError as e:
        fail(e)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        push(opts, cfg, stop)
    except MemtraceError as e:
        fail(e)
