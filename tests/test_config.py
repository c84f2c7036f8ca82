"""Push configuration: flags over variables, and every malformed value fails
at start with a message and a fix (property-tested with hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrace.core.errors import BadOption, MemtraceError
from memtrace.export.config import HistogramKind, Protocol, Temporality, parse_kv_list, resolve


def test_flags_win_over_variables_and_specific_over_generic() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "b=2",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
    }
    c = resolve(env)
    assert c.endpoint == "http://generic:4318/v1/metrics"
    assert c.headers == {"b": "2"} and c.timeout == 2.5 and c.compression == "gzip"
    c = resolve(env, endpoint="http://flag:4318", headers="c=3", timeout=1.0)
    assert c.endpoint == "http://flag:4318/v1/metrics" and c.headers == {"c": "3"} and c.timeout == 1.0
    c = resolve({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9/custom/path"})
    assert c.endpoint == "http://m:9/custom/path"  # the signal-specific variable is verbatim
    c = resolve({}, endpoint="http://vm:8428/opentelemetry")
    assert c.endpoint == "http://vm:8428/opentelemetry/v1/metrics"
    c = resolve({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, endpoint="http://c:4317")
    assert c.protocol == Protocol.grpc and c.endpoint == "http://c:4317"
    assert c.temporality == Temporality.cumulative and c.histogram == HistogramKind.exponential


def test_resource_attributes_and_percent_decoding() -> None:
    c = resolve({"OTEL_RESOURCE_ATTRIBUTES": "team=ml%20infra,cluster=a"}, endpoint="http://x:1")
    assert c.resource_attributes == {"team": "ml infra", "cluster": "a"}
    assert parse_kv_list("Authorization=Bearer%20abc, x = y ", "headers") == {"Authorization": "Bearer abc", "x": "y"}


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({}, "no collector endpoint"),
        ({"endpoint": "localhost:4318"}, "not an http:// or https:// URL"),
        ({"endpoint": "http://:4318"}, "not an http:// or https:// URL"),
        ({"endpoint": "http://h:99999"}, "bad port"),
        ({"endpoint": "http://h:1", "protocol": "udp"}, "protocol 'udp'"),
        ({"endpoint": "http://h:1", "headers": "justakey"}, "not key=value"),
        ({"endpoint": "http://h:1", "headers": "=v"}, "bad key"),
        ({"endpoint": "http://h:1", "interval": 0.0}, "interval"),
        ({"endpoint": "http://h:1", "temporality": "sometimes"}, "temporality"),
        ({"endpoint": "http://h:1", "histogram": "linear"}, "histogram"),
        ({"endpoint": "https://h:1", "insecure": True}, "--insecure with an https"),
        ({"endpoint": "http://h:1", "certificate": "/no/such.pem"}, "certificate"),
        ({"endpoint": "http://h:1", "compression": "zstd"}, "compression"),
    ],
)
def test_malformed_options_fail_with_a_fix(kw: dict, fragment: str) -> None:
    with pytest.raises(BadOption) as e:
        resolve({}, **kw)
    assert fragment in e.value.message and e.value.fix


def test_bad_timeout_variable() -> None:
    with pytest.raises(BadOption, match="timeout"):
        resolve({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, endpoint="http://h:1")


@pytest.mark.parametrize("var", ["OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_METRICS_INSECURE"])
def test_insecure_variable_is_true_or_false_and_nothing_else(var: str) -> None:
    assert resolve({var: "TRUE"}, endpoint="http://h:1").insecure is True
    assert resolve({var: "False"}, endpoint="http://h:1").insecure is False
    assert resolve({}, endpoint="http://h:1").insecure is False
    for value in ("maybe", "1", "yes", "tru"):
        with pytest.raises(BadOption) as e:
            resolve({var: value}, endpoint="http://h:1")
        assert var in e.value.message and f"'{value}'" in e.value.message
        assert "true or false" in e.value.fix


def test_redacted_description_hides_header_values() -> None:
    c = resolve({}, endpoint="http://h:1", headers="authorization=Bearer%20SECRET,x-tenant=t1")
    d = c.redacted()
    assert "SECRET" not in d and "t1" not in d and "authorization=<redacted>" in d


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "OTEL_EXPORTER_OTLP_HEADERS",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                "OTEL_EXPORTER_OTLP_COMPRESSION",
                "OTEL_EXPORTER_OTLP_INSECURE",
                "OTEL_RESOURCE_ATTRIBUTES",
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            ]
        ),
        st.text(max_size=40),
    ),
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.text(max_size=40)),
)
@settings(max_examples=300, deadline=None)
def test_any_environment_gives_a_config_or_a_clear_error(env: dict, endpoint: str | None, headers: str | None) -> None:
    try:
        c = resolve(env, endpoint=endpoint, headers=headers)
    except MemtraceError as e:
        assert e.message and e.fix
        return
    assert c.endpoint.startswith(("http://", "https://"))
    assert all(k and v is not None for k, v in c.headers.items())


def test_each_signal_has_its_url_beside_the_metrics_or_its_own() -> None:
    """Events (logs) and profiles go where the metrics go, each at its own
    path (OTLP/HTTP) or to the same target (gRPC); a signal's own variable
    is taken verbatim, as OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is; with the
    metrics' own URL alone, the others go beside it."""
    from memtrace.export.config import OtlpSignal

    def urls(env: dict[str, str], **kw: str) -> tuple[str, str, str]:
        c = resolve(env, **kw)
        return c.url(OtlpSignal.metrics), c.url(OtlpSignal.logs), c.url(OtlpSignal.profiles)

    base = "http://c:4318"
    paths = (f"{base}/v1/metrics", f"{base}/v1/logs", f"{base}/v1development/profiles")
    assert urls({"OTEL_EXPORTER_OTLP_ENDPOINT": base}) == paths
    assert urls({}, endpoint=f"{base}/v1/metrics/") == paths  # the metrics' path names the collector above it
    own = {"OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://logs:9428/insert/otlp"}
    assert urls(own) == (paths[0], "http://logs:9428/insert/otlp", paths[2])
    assert urls(own, endpoint=base) == paths  # the flag names the collector for every signal
    assert urls({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://vm:8428/opentelemetry/v1/metrics"}) == (
        "http://vm:8428/opentelemetry/v1/metrics",
        "http://vm:8428/opentelemetry/v1/logs",
        "http://vm:8428/opentelemetry/v1development/profiles",
    )
    assert urls({}, endpoint="http://c:4317", protocol="grpc") == ("http://c:4317",) * 3
    with pytest.raises(BadOption, match="not an http"):  # a signal's own URL is checked as the metrics' is
        resolve({"OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "profiles:4040"})
