"""Each diagnosis as an OTLP log record: an event named `memtrace.diagnosis`,
through the SDK's OTLP log exporter to the collector `memtrace push` sends
its metrics to (its logs pipeline: deploy/otelcol). Metrics count the
diagnoses (`memtrace.diagnoses{cause}`); the event carries what a person
reads: the symptom, the evidence and the fix.

Attributes are the cause, the process (`process.pid`,
`process.creation.time`, `process.executable.name`), the onset and
detection times, the fix, and the evidence's numbers and words, each under
`memtrace.evidence.` (nested evidence as JSON text). The body is the symptom.
The record's time is the detection; its severity is WARN.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.ids import iso8601_ns
from memtrace.export.config import Protocol, PushConfig

log = logging.getLogger("memtrace")


def logs_endpoint(cfg: PushConfig) -> str:
    """The logs URL beside the metrics URL (OTLP/HTTP: .../v1/metrics -> .../v1/logs)."""
    if cfg.protocol == Protocol.http and cfg.endpoint.rstrip("/").endswith("/v1/metrics"):
        return cfg.endpoint.rstrip("/")[: -len("/v1/metrics")] + "/v1/logs"
    return cfg.endpoint


def attributes(d: Diagnosis, start_ns: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "memtrace.cause": d.cause,
        "memtrace.symptom": d.symptom,
        "memtrace.ratio": float(d.ratio),
        "memtrace.onset_time_unix_nano": int(d.onset_ns),
        "memtrace.fix": d.fix,
        "process.pid": d.key.pid,
    }
    if start_ns:
        out["process.creation.time"] = iso8601_ns(start_ns)
    if d.process:
        out["process.executable.name"] = d.process
    for k, v in d.evidence.items():
        key = f"memtrace.evidence.{k}"
        if isinstance(v, bool | int | float | str):
            out[key] = v
        else:
            out[key] = json.dumps(v, sort_keys=True)
    return out


class _OneLine(logging.Handler):
    """The SDK's own complaints (a collector that is down), as one line in
    memtrace's log the first time each is seen: no tracebacks, no flood."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage().splitlines()[0] if record.getMessage() else record.name
        if msg not in self.seen:
            self.seen.add(msg)
            log.warning("diagnosis events: %s", msg)


_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
    "opentelemetry.sdk._logs._internal.export",
    "opentelemetry.sdk._shared_internal",
)


class DiagnosisEvents:
    """An OTLP log exporter, batched, shut down (flushed) with the agent."""

    def __init__(self, cfg: PushConfig, resource: dict[str, Any]) -> None:
        from opentelemetry._logs import SeverityNumber
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        exporter: Any
        if cfg.protocol == Protocol.http:
            from opentelemetry.exporter.otlp.proto.http import Compression
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs

            exporter = HttpLogs(
                endpoint=logs_endpoint(cfg),
                certificate_file=cfg.certificate,
                client_key_file=cfg.client_key,
                client_certificate_file=cfg.client_certificate,
                headers=cfg.headers,
                timeout=cfg.timeout,
                compression=Compression.Gzip if cfg.compression else Compression.NoCompression,
            )
        else:
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs

            exporter = GrpcLogs(endpoint=cfg.endpoint, insecure=cfg.insecure, headers=cfg.headers, timeout=cfg.timeout)
        quiet = _OneLine()
        for name in _SDK_LOGGERS:
            lg = logging.getLogger(name)
            lg.addHandler(quiet)
            lg.propagate = False
        self._severity = SeverityNumber.WARN
        self.provider = LoggerProvider(resource=Resource(attributes=resource))
        self.provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=1000))
        self.logger = self.provider.get_logger("memtrace")
        self.sent = 0

    def emit(self, d: Diagnosis, start_ns: int = 0, extra: dict[str, Any] | None = None) -> None:
        """`extra`: more attributes (the flight recorder's file, memtrace.timeline.file)."""
        from opentelemetry._logs import LogRecord

        self.logger.emit(
            LogRecord(
                timestamp=d.detected_ns,
                observed_timestamp=time.time_ns(),
                severity_number=self._severity,
                severity_text="WARN",
                body=d.symptom,
                attributes={**attributes(d, start_ns), **(extra or {})},
                event_name="memtrace.diagnosis",
            )
        )
        self.sent += 1

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception as e:  # noqa: BLE001 - a last flush that fails is logged, never raised at exit
            log.warning("could not send the last diagnosis events: %s", e)
