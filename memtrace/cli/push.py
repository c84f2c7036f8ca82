"""`memtrace push`: wiring only."""

from __future__ import annotations

import contextlib
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
    recorder: bool = typer.Option(
        True,
        "--recorder/--no-recorder",
        help="Keep the last seconds of events in memory; write them as a Perfetto trace on each diagnosis "
        "and on `memtrace snapshot` (SIGUSR1).",
    ),
    recorder_seconds: float = typer.Option(30.0, "--recorder-seconds", metavar="SECONDS", help="Seconds kept."),
    recorder_memory: float = typer.Option(64, "--recorder-memory", metavar="MIB", help="Memory kept, at most."),
    recorder_dir: str = typer.Option(
        "/var/lib/memtrace/timelines", "--recorder-dir", metavar="DIR", help="Where its traces go."
    ),
    recorder_dir_size: float = typer.Option(
        1024, "--recorder-dir-size", metavar="MIB", help="Its traces' total size, at most (the oldest go first)."
    ),
    pids: list[int] = typer.Option(
        [],
        "--pid",
        metavar="PID",
        help="Trace only this process and those it starts from now on (a container's or a host's init); "
        "repeat for more. Default: every process.",
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
    from memtrace.runtime.recorder import PIDFILE, Recorder, RecorderOptions

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
            Options(only_traced=bool(pids), ring_bytes=ring_bytes(ring_size), hold_nccl=host, stacks=stacks),
            HostOptions(interval_s=host_interval, fast_hz=host_rate, tick_s=max(host_interval, 0.5)) if host else None,
            cfg.overhead_budget,
        )
        rec = None
        if recorder:
            if not 1 <= recorder_seconds <= 3600 or not 1 <= recorder_memory <= 65536 or recorder_dir_size < 1:
                raise BadOption(
                    "--recorder-seconds, --recorder-memory or --recorder-dir-size is out of range",
                    "give 1 to 3600 seconds, 1 to 65536 MiB, and at least 1 MiB for the directory",
                )
            try:
                os.makedirs(recorder_dir, exist_ok=True)
                if not os.access(recorder_dir, os.W_OK):
                    raise PermissionError(13, "not writable")
            except OSError as e:
                raise BadOption(
                    f"cannot write the flight recorder's directory {recorder_dir}: {e.strerror or e}",
                    "give --recorder-dir a writable folder, or --no-recorder",
                ) from None
            rec = Recorder(
                RecorderOptions(
                    seconds=recorder_seconds,
                    max_bytes=int(recorder_memory * (1 << 20)),
                    directory=recorder_dir,
                    directory_bytes=int(recorder_dir_size * (1 << 20)),
                )
            )
    except MemtraceError as e:
        fail(e)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if rec is not None:
        snapshot = rec.snapshot
        # The signal's handler runs on the main thread, between its bytecodes: it only starts a thread.
        signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=snapshot, daemon=True).start())
        with open(os.path.join(recorder_dir, PIDFILE), "w") as f:  # once SIGUSR1 no longer kills it
            f.write(f"{os.getpid()}\n")
    try:
        push(opts, cfg, stop, rec, pids)
    except MemtraceError as e:
        fail(e)
    finally:
        if rec is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(recorder_dir, PIDFILE))
