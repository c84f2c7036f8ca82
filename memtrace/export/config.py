"""`memtrace push` configuration: flags over OTEL_EXPORTER_OTLP_* variables,
validated before anything starts, so a typo fails at once with a fix."""

from __future__ import annotations

import enum
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from memtrace.core.errors import BadOption
from memtrace.core.overhead import DEFAULT_BUDGET


class Protocol(str, enum.Enum):
    http = "http/protobuf"
    grpc = "grpc"


class Temporality(str, enum.Enum):
    cumulative = "cumulative"
    delta = "delta"


class HistogramKind(str, enum.Enum):
    exponential = "exponential"
    explicit = "explicit"


class OtlpSignal(str, enum.Enum):
    """What memtrace sends: metrics, events (log records) and profiles (`--stacks`)."""

    metrics = "metrics"
    logs = "logs"
    profiles = "profiles"

    @property
    def path(self) -> str:
        """Its path under an OTLP/HTTP collector's URL (gRPC tells them apart by service)."""
        return {"metrics": "/v1/metrics", "logs": "/v1/logs", "profiles": "/v1development/profiles"}[self.value]


@dataclass(frozen=True)
class PushConfig:
    endpoint: str
    protocol: Protocol
    headers: dict[str, str] = field(default_factory=dict)
    interval: float = 5.0
    timeout: float = 10.0
    compression: str | None = None  # "gzip" or None
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    insecure: bool = False
    temporality: Temporality = Temporality.cumulative
    histogram: HistogramKind = HistogramKind.exponential
    resource_attributes: dict[str, str] = field(default_factory=dict)
    overhead_budget: float | None = DEFAULT_BUDGET  # a share of each process's CPU time; None: no budget
    # Each signal's URL (OTLP/HTTP) or target (gRPC); the metrics' is `endpoint`.
    endpoints: dict[OtlpSignal, str] = field(default_factory=dict)

    def url(self, signal: OtlpSignal) -> str:
        return self.endpoints.get(signal, self.endpoint)

    def redacted(self) -> str:
        """A description safe for logs: header names, never their values."""
        hdrs = ",".join(f"{k}=<redacted>" for k in self.headers) or "none"
        return f"{self.protocol.value} {self.endpoint} (headers: {hdrs}, every {self.interval:g}s)"


def parse_kv_list(text: str, what: str) -> dict[str, str]:
    """W3C-baggage-like `k=v,k2=v2` as OTEL_EXPORTER_OTLP_HEADERS and
    OTEL_RESOURCE_ATTRIBUTES use it; values are percent-decoded."""
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise BadOption(f"{what}: '{_safe(item)}' is not key=value", f"write {what} as key=value,key2=value2")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k or any(c.isspace() or ord(c) < 32 for c in k):
            raise BadOption(f"{what}: bad key '{_safe(k)}'", "keys are non-empty tokens without spaces")
        v = urllib.parse.unquote(v.strip())
        if any(ord(c) < 32 and c != "\t" for c in v):
            raise BadOption(f"{what}: the value of '{_safe(k)}' holds control characters", "remove them")
        out[k] = v
    return out


def _safe(s: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in s)[:80]


def _endpoint(url: str, protocol: Protocol, signal_specific: bool, signal: OtlpSignal = OtlpSignal.metrics) -> str:
    """A signal's URL: a signal-specific one as given, else the collector's
    (OTLP/HTTP: with the signal's path; a collector URL that ends in the
    metrics path names the collector above it)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadOption(
            f"endpoint '{_safe(url)}' is not an http:// or https:// URL with a host",
            "give the collector's URL, e.g. --endpoint http://otel-collector:4318",
        )
    try:
        _ = u.port  # raises on a bad port
    except ValueError:
        raise BadOption(f"endpoint '{_safe(url)}' has a bad port", "use host:port with a number") from None
    if protocol == Protocol.http and not signal_specific:
        path = u.path.rstrip("/")
        path = path.removesuffix(OtlpSignal.metrics.path) + signal.path
        return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, ""))
    return url


def _float(value: str, what: str, lo: float, hi: float) -> float:
    try:
        v = float(value)
    except ValueError:
        raise BadOption(
            f"{what} '{_safe(value)}' is not a number", f"give a number between {lo:g} and {hi:g}"
        ) from None
    if not lo <= v <= hi:
        raise BadOption(f"{what} {v:g} is out of range", f"give a number between {lo:g} and {hi:g}")
    return v


def _file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise BadOption(f"{what} '{_safe(path)}' is not a readable file", "give the path of a PEM file")
    return path


def _bool_var(found: tuple[str, str] | None) -> bool:
    """A boolean variable: true or false (any case), as the OTel spec says;
    anything else is refused, not read as false."""
    if found is None:
        return False
    key, value = found
    if value.lower() not in ("true", "false"):
        raise BadOption(f"{key}='{_safe(value)}' is not a boolean", f"set {key} to true or false")
    return value.lower() == "true"


def resolve(
    env: Mapping[str, str],
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: str | None = None,
    interval: float | None = None,
    insecure: bool | None = None,
    temporality: str | None = None,
    histogram: str | None = None,
    timeout: float | None = None,
    compression: str | None = None,
    certificate: str | None = None,
) -> PushConfig:
    """Flags win over OTEL_EXPORTER_OTLP_METRICS_*, which win over OTEL_EXPORTER_OTLP_*."""

    def var_named(name: str) -> tuple[str, str] | None:
        """The variable that gives `name` (its full name) and its value."""
        for key in (f"OTEL_EXPORTER_OTLP_METRICS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
            if env.get(key, "").strip():
                return key, env[key].strip()
        return None

    def var(name: str) -> str | None:
        found = var_named(name)
        return found[1] if found else None

    proto_s = protocol or var("PROTOCOL") or Protocol.http.value
    try:
        proto = Protocol(proto_s)
    except ValueError:
        raise BadOption(f"protocol '{_safe(proto_s)}' is not supported", "use http/protobuf or grpc") from None

    # A signal's own variable (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, ..._LOGS_,
    # ..._PROFILES_) is taken verbatim (the spec's rule); --endpoint, like
    # OTEL_EXPORTER_OTLP_ENDPOINT, names the collector, each signal at its path.
    collector = endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    endpoints: dict[OtlpSignal, str] = {}
    for sig in OtlpSignal:
        own = "" if endpoint else env.get(f"OTEL_EXPORTER_OTLP_{sig.name.upper()}_ENDPOINT", "").strip()
        if own:
            endpoints[sig] = _endpoint(own, proto, True, sig)
        elif collector:
            endpoints[sig] = _endpoint(collector, proto, False, sig)
        elif sig == OtlpSignal.metrics:
            raise BadOption(
                "no collector endpoint",
                "give --endpoint http://COLLECTOR:4318 or set OTEL_EXPORTER_OTLP_ENDPOINT",
            )
        else:  # only the metrics' own URL: the others beside it
            endpoints[sig] = _endpoint(endpoints[OtlpSignal.metrics], proto, False, sig)
    url = endpoints[OtlpSignal.metrics]

    hdr_text = headers if headers is not None else (var("HEADERS") or "")
    if hdr_text.startswith("@"):
        # Tokens from a file (a mounted Kubernetes Secret): k=v per line or comma.
        try:
            hdr_text = ",".join(open(hdr_text[1:]).read().split())
        except OSError as e:
            raise BadOption(
                f"headers file '{_safe(hdr_text[1:])}': {e.strerror}", "give a readable file of key=value lines"
            ) from None
    hdrs = parse_kv_list(hdr_text, "headers")
    comp = (compression or var("COMPRESSION") or "none").lower()
    if comp not in ("gzip", "none"):
        raise BadOption(f"compression '{_safe(comp)}' is not supported", "use gzip or none")
    timeout_ms = var("TIMEOUT")
    t = timeout if timeout is not None else (_float(timeout_ms, "timeout", 0.001, 1e9) / 1000 if timeout_ms else 10.0)
    cert = certificate or var("CERTIFICATE")
    key = var("CLIENT_KEY")
    ccert = var("CLIENT_CERTIFICATE")
    ins = insecure if insecure is not None else _bool_var(var_named("INSECURE"))
    if ins and url.startswith("https://"):
        raise BadOption(
            "--insecure with an https:// endpoint", "use http:// for a plaintext collector, or drop --insecure"
        )
    try:
        temp = Temporality(
            temporality or env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "cumulative").lower()
        )
    except ValueError:
        raise BadOption(
            f"temporality '{_safe(str(temporality))}' is not supported", "use cumulative or delta"
        ) from None
    try:
        hist = HistogramKind(histogram or "exponential")
    except ValueError:
        raise BadOption(
            f"histogram '{_safe(str(histogram))}' is not supported", "use exponential or explicit"
        ) from None
    iv = interval if interval is not None else 5.0
    if not 0.1 <= iv <= 3600:
        raise BadOption(f"interval {iv:g}s is out of range", "give an interval between 0.1 and 3600 seconds")
    if not 0.001 <= t <= 600:
        raise BadOption(f"timeout {t:g}s is out of range", "give a timeout between 1 ms and 600 s")
    return PushConfig(
        endpoint=url,
        protocol=proto,
        headers=hdrs,
        interval=iv,
        timeout=t,
        compression=None if comp == "none" else "gzip",
        certificate=_file(cert, "certificate") if cert else None,
        client_key=_file(key, "client key") if key else None,
        client_certificate=_file(ccert, "client certificate") if ccert else None,
        insecure=ins,
        temporality=temp,
        histogram=hist,
        resource_attributes=parse_kv_list(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"),
        endpoints=endpoints,
    )
