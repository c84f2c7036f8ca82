"""Real backends for the end-to-end tests: VictoriaMetrics (Debian trixie's
package) and an OpenTelemetry Collector built with ocb from
deploy/otelcol/builder.yaml. Both are cached between runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import REPO

CACHE = Path(os.environ.get("MEMTRACE_BACKEND_CACHE", Path.home() / ".cache" / "memtrace-backends"))
BUILDER = REPO / "deploy" / "otelcol" / "builder.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def victoria_metrics() -> Path:
    dest = CACHE / "victoria-metrics"
    if not (dest / "victoria-metrics").exists():
        subprocess.run([str(REPO / "tests" / "backends" / "fetch-victoria-metrics.sh"), str(dest)], check=True)
    return dest / "victoria-metrics"


def promtool() -> Path:
    """Prometheus's rule checker, from Debian's prometheus package (unpacked, not installed)."""
    dest = CACHE / "promtool"
    if not (dest / "promtool").exists():
        subprocess.run([str(REPO / "tests" / "backends" / "fetch-promtool.sh"), str(dest)], check=True)
    return dest / "promtool"


def otelcol() -> Path:
    """The collector of deploy/otelcol/builder.yaml, built once per manifest."""
    text = BUILDER.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    out = CACHE / f"otelcol-{digest}" / "otelcol-memtrace"
    if out.exists():
        return out
    version = re.search(r"^\s*version:\s*(\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    gobin = CACHE / "gobin"
    env = dict(os.environ, GOBIN=str(gobin), GOFLAGS="-mod=mod")
    subprocess.run(["go", "install", f"go.opentelemetry.io/collector/cmd/builder@v{version}"], check=True, env=env)
    work = CACHE / f"build-{digest}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copy(BUILDER, work / "builder.yaml")
    subprocess.run(
        [str(gobin / "builder"), "--config", "builder.yaml"], check=True, cwd=work, env=env, capture_output=True
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(work / "_build" / "otelcol-memtrace"), out)
    shutil.rmtree(work, ignore_errors=True)
    return out


class VictoriaMetrics:
    def __init__(self, tmp: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log = open(tmp / f"vm-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [
                str(victoria_metrics()),
                f"-storageDataPath={tmp / f'vm-{self.port}'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-opentelemetry.usePrometheusNaming",
                "-search.latencyOffset=0s",
                "-search.disableCache",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port)

    @property
    def otlp(self) -> str:
        return f"http://127.0.0.1:{self.port}/opentelemetry"

    def _api(self, path: str, params: dict[str, object], timeout: float) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def query(self, expr: str) -> list[dict]:
        return self._api("query", {"query": expr}, 10)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._api("query_range", {"query": expr, "start": start, "end": end, "step": f"{step}s"}, 30)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class Collector:
    def __init__(self, tmp: Path, config: Path, env: dict[str, str]) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.log_path = tmp / "otelcol.log"
        self.log = open(self.log_path, "w")
        e = dict(
            os.environ,
            OTLP_HTTP_ENDPOINT=f"127.0.0.1:{self.http_port}",
            OTLP_GRPC_ENDPOINT=f"127.0.0.1:{self.grpc_port}",
            HEALTH_ENDPOINT=f"127.0.0.1:{free_port()}",
            **env,
        )
        self.proc = subprocess.Popen(
            # As deploy/kubernetes runs it: the profiles signal is behind a feature gate.
            [str(otelcol()), "--config", str(config), "--feature-gates=service.profilesSupport"],
            env=e,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.http_port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class _OtlpReceiver:
    """An OTLP/HTTP receiver on loopback: each POST's body (gunzipped) goes to
    `take(path, body)`, whose reply (a protobuf response) is sent back."""

    def __init__(self) -> None:
        import gzip
        import http.server
        import threading

        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                out = receiver.take(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, path: str, body: bytes) -> bytes:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OtlpLogSink(_OtlpReceiver):
    """An OTLP/HTTP logs receiver (POST /v1/logs, protobuf, gzip or not):
    the records it got, decoded with the OTLP protobuf definitions."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        super().__init__()

    def take(self, path: str, body: bytes) -> bytes:
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
            ExportLogsServiceRequest,
            ExportLogsServiceResponse,
        )

        req = ExportLogsServiceRequest()
        req.ParseFromString(body)
        for rl in req.resource_logs:
            res = {a.key: _any(a.value) for a in rl.resource.attributes}
            for sl in rl.scope_logs:
                for r in sl.log_records:
                    self.records.append(
                        {
                            "resource": res,
                            "event_name": r.event_name,
                            "body": _any(r.body),
                            "severity": r.severity_text,
                            "time_unix_nano": r.time_unix_nano,
                            "attributes": {a.key: _any(a.value) for a in r.attributes},
                        }
                    )
        return ExportLogsServiceResponse().SerializeToString()


def _any(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


class OtlpProfileSink(_OtlpReceiver):
    """An OTLP/HTTP receiver that keeps the profiles it gets (POST
    /v1development/profiles, protobuf, gzip or not), decoded with the OTLP
    protobuf definitions; any other signal is answered and dropped. Each
    sample as a dict: its process, its type, its value, its attributes and
    its frames (innermost first: a Python frame's function, file and line;
    a native frame's module, offset and function)."""

    def __init__(self) -> None:
        self.samples: list[dict] = []
        self.requests = 0
        super().__init__()

    def take(self, path: str, body: bytes) -> bytes:
        from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
            ExportProfilesServiceRequest,
            ExportProfilesServiceResponse,
        )

        if path.endswith("/profiles"):
            req = ExportProfilesServiceRequest()
            req.ParseFromString(body)
            self.requests += 1
            self.samples.extend(_profile_samples(req))
        return ExportProfilesServiceResponse().SerializeToString()


def _profile_samples(req) -> list[dict]:  # type: ignore[no-untyped-def]
    d = req.dictionary
    st = d.string_table

    def frame(loc_index: int) -> dict:
        loc = d.location_table[loc_index]
        line = loc.lines[0]
        fn = d.function_table[line.function_index]
        if loc.mapping_index:
            return {
                "module": st[d.mapping_table[loc.mapping_index].filename_strindex],
                "offset": loc.address,
                "function": st[fn.name_strindex],
            }
        return {"function": st[fn.name_strindex], "file": st[fn.filename_strindex], "line": line.line}

    out = []
    for rp in req.resource_profiles:
        res = {a.key: _any(a.value) for a in rp.resource.attributes}
        for sp in rp.scope_profiles:
            for prof in sp.profiles:
                kind = st[prof.sample_type.type_strindex]
                for s in prof.samples:
                    attrs = {}
                    for i in s.attribute_indices:
                        kv = d.attribute_table[i]
                        attrs[st[kv.key_strindex]] = _any(kv.value)
                    out.append(
                        {
                            "resource": res,
                            "type": kind,
                            "unit": st[prof.sample_type.unit_strindex],
                            "value": sum(s.values),
                            "attributes": attrs,
                            "frames": [frame(i) for i in d.stack_table[s.stack_index].location_indices],
                            "time_unix_nano": prof.time_unix_nano,
                        }
                    )
    return out
