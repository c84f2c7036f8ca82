"""Each diagnosis as an OTLP log record: an event named `memtrace.diagnosis`,
through the SDK's OTLP log exporter over the logs transport
(export/transport.py), to the collector `memtrace push` sends its metrics to
(its logs pipeline: deploy/otelcol). Metrics count the diagnoses
(`memtrace.diagnoses{cause}`); the event carries what a person reads: the
symptom, the evidence and the fix.

Attributes are the cause, the process (`process.pid`,
`process.creation.time`, `process.executable.name`), the onset and
detection times, the fix, and the evidence's numbers and words, each under
`memtrace.evidence.` (nested evidence as JSON text). The body is the symptom.
The record's time is the detection; its severity is WARN. Names:
export/catalog.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.core.ids import iso8601_ns
from memtrace.export import catalog as cat
from memtrace.export.config import OtlpSignal, PushConfig
from memtrace.export.transport import Transport

log = logging.getLogger("memtrace")


def _process(pid: int, start_ns: int, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"process.pid": pid}
    if start_ns:
        out["process.creation.time"] = iso8601_ns(start_ns)
    if name:
        out["process.executable.name"] = name
    return out


def _evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in evidence.items():
        key = f"memtrace.evidence.{k}"
        out[key] = v if isinstance(v, bool | int | float | str) else json.dumps(v, sort_keys=True)
    return out


def attributes(d: Diagnosis, start_ns: int = 0) -> dict[str, Any]:
    """A diagnosis's record's attributes."""
    out: dict[str, Any] = {
        "memtrace.cause": d.cause,
        "memtrace.symptom": d.symptom,
        "memtrace.ratio": float(d.ratio),
        "memtrace.onset_time_unix_nano": int(d.onset_ns),
        "memtrace.fix": d.fix,
    }
    return {**out, **_process(d.key.pid, start_ns, d.process), **_evidence(d.evidence)}


class _SayingExporter:
    """The SDK's log exporter, saying why a batch of records did not arrive
    (once per reason, in memtrace's log) in the transport's words."""

    def __init__(self, sdk: Any, transport: Transport) -> None:
        self.sdk = sdk
        self.transport = transport
        self.said: set[str] = set()

    def export(self, batch: Sequence[Any]) -> Any:
        try:
            from opentelemetry.sdk._logs.export import LogRecordExportResult as Result
        except ImportError:  # the SDK's name before 1.39
            from opentelemetry.sdk._logs.export import LogExportResult as Result  # type: ignore[assignment]

        with self.transport.request() as messages:
            try:
                result = self.sdk.export(batch)
            except Exception as e:  # noqa: BLE001 - a batch that failed is said, never raised into the SDK
                messages.append(f"{type(e).__name__}: {e}")
                result = Result.FAILURE
            if result != Result.SUCCESS:
                why = self.transport.reason(messages)
                if why not in self.said:
                    self.said.add(why)
                    log.warning("events to %s not sent: %s", self.transport.where, why)
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.sdk.force_flush(timeout_millis))

    def shutdown(self) -> None:
        self.sdk.shutdown()


class DiagnosisEvents:
    """The events' OTLP log exporter, batched, shut down (flushed) with the agent.
    `resource`: the agent's resource (each record names its process)."""

    def __init__(self, cfg: PushConfig, resource: dict[str, Any]) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        transport = Transport(cfg, OtlpSignal.logs)
        sdk: Any
        if transport.http:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs

            sdk = HttpLogs(**transport.exporter_options())
        else:
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs

            sdk = GrpcLogs(**transport.exporter_options())
        self.provider = LoggerProvider(resource=Resource(attributes=resource))
        exporter: Any = _SayingExporter(sdk, transport)
        self.provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=1000))
        self.logger = self.provider.get_logger("memtrace")
        self.sent = 0

    def _emit(self, event: cat.EventSpec, time_ns: int, body: str, attrs: dict[str, Any]) -> None:
        from opentelemetry._logs import LogRecord, SeverityNumber

        self.logger.emit(
            LogRecord(
                timestamp=time_ns,
                observed_timestamp=time.time_ns(),
                severity_number=SeverityNumber[event.severity],
                severity_text=event.severity,
                body=body,
                attributes=attrs,
                event_name=event.name,
            )
        )
        self.sent += 1

    def emit(self, d: Diagnosis, start_ns: int = 0) -> None:
        self._emit(cat.DIAGNOSIS_EVENT, d.detected_ns, d.symptom, attributes(d, start_ns))

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception as e:  # noqa: BLE001 - a last flush that fails is logged, never raised at exit
            log.warning("could not send the last events: %s", e)
