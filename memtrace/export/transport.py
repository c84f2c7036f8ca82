"""The OTLP transport `memtrace push` sends all three signals through: the
metrics (MetricsExporter, here), the events (export/events.py) and the
profiles (export/otlp_profiles.py).

One `Transport` per signal holds what they share: the signal's URL or gRPC
target (resolved in export/config.py), the headers, TLS (the CA, a client
key and certificate, or plaintext), the timeout and compression, as the
SDK's OTLP exporters take them as keyword arguments and as memtrace's own
profiles requests use them; and the reason a request failed, in words the
user can act on ("cannot connect to host:4318: Connection refused", "HTTP
404 Not Found: <the body's first line>"), not the SDK's generic line.

Over HTTP every request goes through a recording requests session (the
SDK exporters' public `session=` argument) that keeps each request's first
failure. What the SDK exporters log while a request is under way is kept
for its reason instead of being logged at every retry; what they log
outside one is logged once per message.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from memtrace.export.config import OtlpSignal, Protocol, PushConfig

log = logging.getLogger("memtrace")

REQUEST_POINTS = 2000  # data points per metrics request (whole processes each): memory stays bounded
BODY_CHARS = 200  # of a refusal's body, in a reason
GENERIC = ("due to timeout, max retries or shutdown", "Failed to export")  # the SDK's lines that say no cause
SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.proto.grpc",
    "opentelemetry.exporter.otlp.common",
    "opentelemetry.sdk._logs._internal.export",
    "opentelemetry.sdk._shared_internal",
)


class _SdkComplaints(logging.Handler):
    """What the SDK's exporters log: kept for the request under way on this
    thread (its reason), else said once per message in memtrace's log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.local = threading.local()
        self.said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a logging handler must not raise
            msg = str(record.msg)
        kept: list[str] | None = getattr(self.local, "messages", None)
        if kept is not None:
            kept.append(msg)
            return
        line = msg.splitlines()[0] if msg else record.name
        if line not in self.said and record.levelno >= logging.WARNING:
            self.said.add(line)
            log.warning("OTLP exporter: %s", line)

    @contextmanager
    def keeping(self) -> Iterator[list[str]]:
        messages: list[str] = []
        self.local.messages = messages
        try:
            yield messages
        finally:
            self.local.messages = None


_COMPLAINTS = _SdkComplaints()


def _keep_sdk_complaints() -> None:
    """Route the SDK exporters' logs to _COMPLAINTS (once)."""
    for name in SDK_LOGGERS:
        sdk_log = logging.getLogger(name)
        if _COMPLAINTS not in sdk_log.handlers:
            sdk_log.addHandler(_COMPLAINTS)
            sdk_log.propagate = False


def split_by_resource(data: MetricsData, max_points: int) -> list[MetricsData]:
    """The export's resources (a process each) in groups of about max_points
    data points; a resource is never split."""
    parts: list[MetricsData] = []
    group: list[Any] = []
    points = 0
    for rm in data.resource_metrics:
        n = sum(len(m.data.data_points) for sm in rm.scope_metrics for m in sm.metrics)
        if group and points + n > max_points:
            parts.append(MetricsData(resource_metrics=group))
            group, points = [], 0
        group.append(rm)
        points += n
    if group or not parts:
        parts.append(MetricsData(resource_metrics=group))
    return parts


def first_line(body: bytes, content_type: str) -> str:
    """What a refusal's body says, in one bounded line: an OTLP collector's
    protobuf google.rpc.Status gives its message; text gives its first line."""
    text = ""
    if "protobuf" in content_type:
        try:
            from google.rpc.status_pb2 import Status

            text = Status.FromString(body).message
        except Exception:  # noqa: BLE001 - a body that is not a Status is said as it is
            text = ""
    if not text:
        text = body.decode("utf-8", errors="replace")
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= BODY_CHARS else line[: BODY_CHARS - 3] + "..."


def _os_cause(e: BaseException) -> OSError | None:
    """The operating system's error under a requests/urllib3 one (refused,
    unreachable, unknown host), found through their chains of causes."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.strerror:
            return x
        nxt = [x.__cause__, x.__context__, getattr(x, "reason", None), *x.args]
        todo.extend(n for n in nxt if isinstance(n, BaseException))
    return None


def _recording_session(pin_ca: bool) -> Any:
    """A requests session that keeps the first failure of each request: the
    SDK logs only a generic line. With `pin_ca` it also keeps the configured
    CA: requests otherwise lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the
    environment replace it."""
    import requests

    class RecordingSession(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            self.failure: str = ""
            self.failed_error: BaseException | None = None

        def reset(self) -> None:
            self.failure, self.failed_error = "", None

        def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
            try:
                resp = super().request(method, url, *args, **kwargs)
            except Exception as e:
                # The first failure is the cause; later retries may only fail for lack of time left.
                if not self.failure:
                    self.failure, self.failed_error = "error", e
                raise
            if resp.status_code >= 400 and not self.failure:
                line = first_line(resp.content or b"", resp.headers.get("content-type", ""))
                self.failure = f"HTTP {resp.status_code}" + (f" {resp.reason}" if resp.reason else "")
                self.failure += f": {line}" if line else ""
            return resp

        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if pin_ca:
                settings["verify"] = self.verify
            return settings

    return RecordingSession()


class Transport:
    """One signal's way to the collector, and why a request on it failed."""

    def __init__(self, cfg: PushConfig, signal: OtlpSignal) -> None:
        self.cfg = cfg
        self.signal = signal
        self.url = cfg.url(signal)
        self.http = cfg.protocol == Protocol.http
        self.session: Any = None
        if self.http:
            self.session = _recording_session(pin_ca=bool(cfg.certificate))
            self.session.verify = cfg.certificate or True
            if cfg.client_certificate and cfg.client_key:
                self.session.cert = (cfg.client_certificate, cfg.client_key)
        _keep_sdk_complaints()
        u = urllib.parse.urlsplit(self.url if "://" in self.url else f"//{self.url}")
        self.host, self.port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)

    @property
    def where(self) -> str:
        """The URL (OTLP/HTTP) or host:port (gRPC) requests go to, for the log."""
        return self.url if self.http else self.target

    @property
    def target(self) -> str:
        return self.url.split("://", 1)[-1].rstrip("/")

    @property
    def insecure(self) -> bool:
        """Plaintext gRPC: asked for, or an http:// endpoint."""
        return self.cfg.insecure or self.url.startswith("http://")

    def credentials(self) -> Any:
        """TLS credentials for gRPC from the configured CA and client key and certificate (None: plaintext)."""
        import grpc

        if self.insecure:
            return None
        cfg = self.cfg
        root = open(cfg.certificate, "rb").read() if cfg.certificate else None
        key = open(cfg.client_key, "rb").read() if cfg.client_key else None
        chain = open(cfg.client_certificate, "rb").read() if cfg.client_certificate else None
        return grpc.ssl_channel_credentials(root, key, chain)

    def exporter_options(self) -> dict[str, Any]:
        """The keyword arguments an SDK OTLP exporter (metrics or logs) of this protocol takes."""
        cfg = self.cfg
        if self.http:
            from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

            return {
                "session": self.session,
                "endpoint": self.url,
                "certificate_file": cfg.certificate,
                "client_key_file": cfg.client_key,
                "client_certificate_file": cfg.client_certificate,
                "headers": cfg.headers,
                "timeout": cfg.timeout,
                "compression": HttpCompression.Gzip if cfg.compression else HttpCompression.NoCompression,
            }
        import grpc

        return {
            "endpoint": self.url,
            "insecure": self.insecure,
            "credentials": self.credentials(),
            "headers": cfg.headers,
            "timeout": cfg.timeout,
            "compression": grpc.Compression.Gzip if cfg.compression else None,
        }

    def channel(self) -> Any:
        """A gRPC channel to the collector, for a service the SDK has no exporter for."""
        import grpc

        if self.insecure:
            return grpc.insecure_channel(self.target)
        return grpc.secure_channel(self.target, self.credentials())

    @contextmanager
    def request(self) -> Iterator[list[str]]:
        """One request (with the SDK's retries): what the SDK says meanwhile is kept for its reason."""
        if self.session is not None:
            self.session.reset()
        with _COMPLAINTS.keeping() as messages:
            yield messages

    def reason(self, messages: list[str]) -> str:
        """Why the request failed, as the user can act on it: what the HTTP
        session saw, else the SDK's specific complaint, else what connecting
        says, else the SDK's generic line."""
        specific = [m for m in messages if not any(g in m for g in GENERIC)]
        why = self._session_failure() or (specific[0] if specific else "") or self._probe()
        return why or (messages[0] if messages else "") or "the collector refused the push"

    def _session_failure(self) -> str:
        s = self.session
        if s is None or not s.failure:
            return ""
        if s.failed_error is None:
            return str(s.failure)
        return self.failure_of(s.failed_error)

    def failure_of(self, e: BaseException) -> str:
        """An exception of a request, in words."""
        import requests

        hp = f"{self.host}:{self.port}"
        if isinstance(e, requests.exceptions.SSLError):
            return f"TLS handshake with {hp} failed: {_os_cause(e) or e}"
        if isinstance(e, requests.exceptions.Timeout):
            return f"no answer from {hp} within {self.cfg.timeout:g}s"
        cause = _os_cause(e)
        if isinstance(e, requests.exceptions.ConnectionError) and cause is not None:
            return f"cannot connect to {hp}: {cause.strerror}"
        text = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {text}"

    def _probe(self, timeout: float = 2.0) -> str:
        """Name a connection failure ourselves when the exporter did not."""
        try:
            socket.create_connection((self.host, self.port), timeout=timeout).close()
        except OSError as e:
            return f"cannot connect to {self.host}:{self.port}: {e.strerror or e}"
        return ""

    def refused(self) -> str:
        """Why the collector refuses connections now ('' if it takes one, or
        does not answer at once): a last push to it would only spend its
        timeout in the exporter's retries."""
        why = self._probe(timeout=0.5)
        return why if "refused" in why.lower() or "unreachable" in why.lower() else ""

    def post(self, body: bytes) -> str:
        """POST one protobuf request (OTLP/HTTP) to the signal's URL: '' when it arrived, else why not."""
        cfg = self.cfg
        headers = {"Content-Type": "application/x-protobuf", **cfg.headers}
        if cfg.compression:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        with self.request() as messages:
            try:
                self.session.post(self.url, data=body, headers=headers, timeout=cfg.timeout)
            except Exception:  # noqa: BLE001 - the session kept it: said below
                pass
            return self.reason(messages) if self.session.failure else ""

    def call(self, method: Callable[..., Any], request: Any) -> str:
        """Call one unary gRPC method with the headers and timeout: '' when it arrived, else why not."""
        try:
            method(request, metadata=list(self.cfg.headers.items()), timeout=self.cfg.timeout)
        except Exception as e:  # noqa: BLE001 - a failed request is a reason, retried with the next
            details = getattr(e, "details", None)
            text = details() if callable(details) else str(e)
            code = getattr(e, "code", None)
            name = code().name if callable(code) else type(e).__name__
            return f"{name}: {text.splitlines()[0] if text else ''}"
        return ""


class MetricsExporter:
    """The SDK's OTLP metric exporter for the configured protocol, over the
    transport; an export goes in requests of whole processes."""

    def __init__(self, cfg: PushConfig) -> None:
        self.cfg = cfg
        self.transport = Transport(cfg, OtlpSignal.metrics)
        if self.transport.http:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

            self._exp: Any = HttpExporter(**self.transport.exporter_options())
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

            self._exp = GrpcExporter(**self.transport.exporter_options())

    def export(self, data: MetricsData) -> tuple[bool, str, int]:
        """Push one export, in requests of at most REQUEST_POINTS points
        (whole processes each): encoding a whole export at once costs tens of
        MB at a thousand processes (bench/footprint.py). Returns success, the
        reason of a failure, and how many resources (from the first) were
        delivered: a delta export delivered in part must advance those
        processes alone."""
        delivered = 0
        for part in split_by_resource(data, REQUEST_POINTS):
            ok, why = self._export(part)
            if not ok:
                return False, why, delivered
            delivered += len(part.resource_metrics)
        return True, "", delivered

    def _export(self, data: MetricsData) -> tuple[bool, str]:
        with self.transport.request() as messages:
            try:
                result = self._exp.export(data, timeout_millis=self.cfg.timeout * 1000)
            except Exception as e:  # noqa: BLE001 - any exporter failure is an outage, not a crash
                return False, f"{type(e).__name__}: {e}"
            if result == MetricExportResult.SUCCESS:
                return True, ""
            return False, self.transport.reason(messages)

    def shutdown(self) -> None:
        try:
            self._exp.shutdown(timeout_millis=1000)
        except Exception:  # noqa: BLE001 - a last shutdown that fails changes nothing
            pass
