"""memtrace's events as OTLP log records, through the SDK's OTLP log
exporter over the logs transport (export/transport.py), to the collector
`memtrace push` sends its metrics to (its logs pipeline: deploy/otelcol).
Metrics carry the numbers with bounded attributes; the events carry what a
person reads, whose figures change from push to push.

- `memtrace.diagnosis`, one per diagnosed slowdown: the body is the
  symptom; attributes the cause, the onset, the fix and the evidence. Its
  time is the detection; severity WARN. Counted in `memtrace.diagnoses{cause}`.
- `memtrace.finding`, for a finding (`memtrace.finding{finding}` carries its
  headline number): the body is its summary; attributes its code, value, fix
  and evidence; severity INFO. Sent when the finding first appears in a
  process, and again only when its text changes materially (FindingNotes):
  its words change (its figures aside: "75% of H2D bytes (192.0 MiB ...)"
  and "80% of H2D bytes (1.2 GiB ...)" say the same) or its fix does, or its
  headline number has doubled or halved since the last record; at most
  MAX_RECORDS per finding and process.

Both carry the process (`process.pid`, `process.creation.time`,
`process.executable.name`) and the evidence's numbers and words, each under
`memtrace.evidence.` (nested evidence as JSON text). Names: export/catalog.py.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memtrace.analysis.diagnosis import Diagnosis
from memtrace.analysis.findings import Finding
from memtrace.core.ids import ProcessKey, iso8601_ns
from memtrace.export import catalog as cat
from memtrace.export.config import OtlpSignal, PushConfig
from memtrace.export.transport import Transport

log = logging.getLogger("memtrace")

MAX_RECORDS = 4  # per finding and process: a figure that keeps doubling is said a few times, not forever
MAX_NOTED = 8192  # (process, finding) pairs remembered: the oldest go first (exited processes are forgotten)
_FIGURE = re.compile(r"\d[\d,.]*(?:\s?(?:B|KiB|MiB|GiB|TiB|min|s)\b)?")


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


def finding_attributes(f: Finding) -> dict[str, Any]:
    """A finding's record's attributes."""
    out: dict[str, Any] = {"memtrace.finding": f.code, "memtrace.value": float(f.value), "memtrace.fix": f.fix}
    return {**out, **_process(f.key.pid, f.start_ns, f.process), **_evidence(f.evidence)}


def words(text: str) -> str:
    """The text with its figures masked: what it says, not how much."""
    return _FIGURE.sub("#", text)


@dataclass
class _Note:
    words: str
    fix: str
    value: float
    records: int


class FindingNotes:
    """Which findings are due a record: new ones, and those whose text changed
    materially since their last record (the module's docstring gives the rule)."""

    def __init__(self, max_records: int = MAX_RECORDS, max_noted: int = MAX_NOTED) -> None:
        self.max_records = max_records
        self.max_noted = max_noted
        self.notes: dict[tuple[ProcessKey, str], _Note] = {}

    def due(self, found: Iterable[Finding]) -> list[Finding]:
        out = []
        for f in found:
            k = (f.key, f.code)
            note = self.notes.get(k)
            said = words(f.summary)
            if note is not None:
                if note.records >= self.max_records or not self._material(note, said, f):
                    continue
                note.words, note.fix, note.value, note.records = said, f.fix, f.value, note.records + 1
            else:
                self.notes[k] = _Note(said, f.fix, f.value, 1)
                while len(self.notes) > self.max_noted:
                    del self.notes[next(iter(self.notes))]
            out.append(f)
        return out

    @staticmethod
    def _material(note: _Note, said: str, f: Finding) -> bool:
        if said != note.words or f.fix != note.fix:
            return True
        lo, hi = sorted((abs(note.value), abs(f.value)))
        return hi >= 2 * lo if lo else hi > 0

    def forget(self, keys: Iterable[ProcessKey]) -> None:
        gone = set(keys)
        self.notes = {k: v for k, v in self.notes.items() if k[0] not in gone}


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


class Events:
    """The events' OTLP log exporter, batched, shut down (flushed) with the agent.
    `resource`: the agent's resource (each record names its process)."""

    def __init__(
        self,
        cfg: PushConfig,
        resource: dict[str, Any],
        identity: Callable[[ProcessKey], Mapping[str, Any]] | None = None,
    ) -> None:
        """`identity`: a process's job attributes (memtrace.job.*), added to
        each record of it, so that a fleet's logs name the job and rank as
        its metrics do."""
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
        self.notes = FindingNotes()
        self.sent = 0
        self._identity = identity

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

    def diagnosis(self, d: Diagnosis, start_ns: int = 0, extra: dict[str, Any] | None = None) -> None:
        """`extra`: more attributes (the flight recorder's file, memtrace.timeline.file)."""
        attrs = {**attributes(d, start_ns), **self._job(d.key), **(extra or {})}
        self._emit(cat.DIAGNOSIS_EVENT, d.detected_ns, d.symptom, attrs)

    def _job(self, key: ProcessKey) -> Mapping[str, Any]:
        return self._identity(key) if self._identity is not None else {}

    def findings(self, found: Iterable[Finding]) -> None:
        """A push's findings (all of them): records for those due one."""
        now = time.time_ns()
        for f in self.notes.due(found):
            self._emit(cat.FINDING_EVENT, now, f.summary, {**finding_attributes(f), **self._job(f.key)})

    def forget(self, keys: Iterable[ProcessKey]) -> None:
        """Processes gone and sent a final time."""
        self.notes.forget(keys)

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception as e:  # noqa: BLE001 - a last flush that fails is logged, never raised at exit
            log.warning("could not send the last events: %s", e)
