"""What a node costs the fleet, and what many nodes cost the collector and
the backend (issue 42), from real agents' pushes replayed at a fleet's rate:

    sudo .venv/bin/python bench/targets/fleet_scale.py [--nodes 50,100,200,400,700,1000] [--seconds S]
        [--ranks R] [--interval I] [--at-default N] [--save DIR | --capture DIR] [--only-record]

1. Record. One simulated host of the fleet rig (tests/fleet.py: its
   namespace, cgroup, R ranks of a torchrun-like job through the test CUDA
   and NCCL libraries, its own `memtrace push --interval I`) pushes through a
   recorder on loopback that keeps each OTLP/HTTP request's body as sent and
   forwards it to the rig's collector. From the recorded requests: bytes per
   push (as sent, protobuf, uncompressed: the agent's default; and gzipped as
   `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` sends it), pushes per second, data
   points per push; from the backend: series per node and per traced rank
   (as bench/targets/fleet.py counts them). Every attribute pushed, with how
   many values it took: a label that grows without bound shows here.
2. Replay. The collector of deploy/otelcol/builder.yaml, run with
   deploy/otelcol/gateway.yaml's metrics pipeline (memory_limiter, batch,
   otlphttp to the backend with its queue and retries; k8sattributes left
   out: there is no cluster here), and VictoriaMetrics behind it. N nodes
   push the recorded requests in turn, each once per I seconds at its own
   phase, with host.name (and every string holding it, the cgroup's path)
   rewritten to the node's own name, the job id to one job per 8 nodes, and
   every point's timestamps to the time of sending (the bytes rewritten in
   place: same lengths, so the requests stay valid protobuf). Each size
   runs S seconds with a fresh collector; over the last S - 10 s the
   collector's and the backend's CPU (cores) and peak RSS are read from
   /proc. It kept up where every push was answered 2xx at the rate asked
   (at least 95% of it), the collector's own metrics show no refused, failed
   or dropped points, and its sending queue drained within 20 s after the
   replay. Sizes go up until one does not keep up; then --at-default N
   nodes (1,000) push every 5 s, the agent's default interval: as many
   nodes' series as the fleet, a fifth of the pushes of `--interval 1`.
3. Query. With the backend holding the last size's series, every query of
   deploy/grafana/memtrace.json (each panel's target as a range query over
   the last 5 minutes at a 15 s step, `$host` all hosts, `$__rate_interval`
   1m; the host variable's label_values) and every rule of
   deploy/prometheus/ (an instant query, as a rule engine evaluates it),
   each timed 3 times (p50, max).

Figures are from a shared 2-vCPU VM: the replayer (Python), the collector
and the backend share its two CPUs with each other and with other work, so
what stops a size is this machine's CPU; the per-node costs are what scale.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import http.server
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Target

sys.path.insert(0, str(REPO / "tests"))
from backends import Collector, VictoriaMetrics, free_port
from fleet import Fleet

JOB = "scalejob-0000"  # the recorded job's id; each replayed job's is as long
NODES_PER_JOB = 8
GATEWAY = REPO / "deploy" / "otelcol" / "gateway.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "memtrace.json"
RULES = sorted((REPO / "deploy" / "prometheus").glob("*.yaml"))
T_MARK = 0x7E57_7E57_7E57_7E51  # a point's time in a template; rewritten to the send time
S_MARK = 0x7E57_7E57_7E57_7E53  # its start time
RATE_INTERVAL = "1m"
QUERY_RANGE_S, QUERY_STEP_S, QUERY_TIMES, SLOW_S, QUERY_TIMEOUT_S = 300, 15, 3, 5.0, 30.0
DRAIN_S = 20.0
WARM_S = 10.0  # of each size, before CPU and memory are read


# ---- 1. record ----


@dataclass
class Push:
    at: float
    path: str
    body: bytes  # as sent (the agent's encoding: uncompressed unless told otherwise)
    encoding: str


class Recorder:
    """An OTLP/HTTP receiver on loopback: keeps every request and forwards it to the collector."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.lock = threading.Lock()
        self.forward = ""
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self, collector: str) -> str:
        self.forward = collector
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                enc = self.headers.get("content-encoding", "")
                with rec.lock:
                    rec.pushes.append(Push(time.time(), self.path, body, enc))
                headers = {"Content-Type": self.headers.get("content-type", "application/x-protobuf")}
                if enc:
                    headers["Content-Encoding"] = enc
                req = urllib.request.Request(rec.forward + self.path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        status, out = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, out = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{port}"

    def take(self) -> list[Push]:
        with self.lock:
            out, self.pushes = self.pushes, []
        return out

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def save(pushes: list[Push], meta: dict, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    index = []
    for i, p in enumerate(pushes):
        (where / f"{i:05d}.pb").write_bytes(p.body)
        index.append({"at": p.at, "path": p.path, "encoding": p.encoding, "file": f"{i:05d}.pb"})
    (where / "capture.json").write_text(json.dumps({**meta, "pushes": index}, indent=1))


def load(where: Path) -> tuple[list[Push], dict]:
    doc = json.loads((where / "capture.json").read_text())
    pushes = [Push(x["at"], x["path"], (where / x["file"]).read_bytes(), x["encoding"]) for x in doc.pop("pushes")]
    return pushes, doc


def record(fx: Path, ranks: int, interval: float, warm_s: float, seconds: float) -> tuple[list[Push], dict]:
    """A host of the fleet rig, its pushes recorded: (the pushes, what the backend counted)."""
    rec = Recorder()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="memtrace-scale-") as tmp,
            Fleet(fx, Path(tmp), 1, ranks, interval, job=JOB, tap=rec.start) as f,
        ):
            f.start_job()
            time.sleep(warm_s)
            rec.take()
            time.sleep(seconds)
            pushes = rec.take()
            host = f.hosts[0].name
            per_node = f.query(f'count({{host_name="{host}"}})')
            per_proc = f.query(f'count by (process_pid) ({{host_name="{host}", process_pid!=""}})')
            meta = {
                "host": host,
                "interval_s": interval,
                "seconds": seconds,
                "ranks": ranks,
                "series_per_node": float(per_node[0]["value"][1]) if per_node else float("nan"),
                "series_per_rank": statistics.median(float(x["value"][1]) for x in per_proc)
                if per_proc
                else float("nan"),
            }
    finally:
        rec.stop()
    return pushes, meta


def metrics_request(body: bytes):  # type: ignore[no-untyped-def]
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    return ExportMetricsServiceRequest.FromString(body)


def points(req) -> list:  # type: ignore[no-untyped-def]
    out = []
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                out += [(m.name, p) for p in getattr(m, kind).data_points] if kind else []
    return out


def _value(v) -> str:  # type: ignore[no-untyped-def]
    kind = v.WhichOneof("value")
    return str(getattr(v, kind)) if kind else ""


def labels(reqs: list) -> dict[str, set[str]]:  # type: ignore[type-arg]
    """Every attribute pushed (resource and point), with the values it took."""
    seen: dict[str, set[str]] = {}
    for req in reqs:
        for rm in req.resource_metrics:
            for a in rm.resource.attributes:
                seen.setdefault(a.key, set()).add(_value(a.value))
        for _, p in points(req):
            for a in p.attributes:
                seen.setdefault(a.key, set()).add(_value(a.value))
    return seen


PER_PROCESS = ("process.pid", "process.creation.time")  # a new value with each traced process
PER_NAMESPACE = ("memtrace.netns", "memtrace.qdisc.handle")  # a new value with each network namespace


def unbounded(seen: dict[str, set[str]]) -> list[str]:
    """Attributes whose values come and go with processes or namespaces, and any that look like free text."""
    out = []
    for key, vals in sorted(seen.items()):
        if key in PER_PROCESS or key.endswith("pid"):
            out.append(f"{key}: one value per traced process ({len(vals)} here)")
        elif key in PER_NAMESPACE:
            out.append(f"{key}: one value per network namespace ({len(vals)} here)")
        elif any(" " in v or len(v) > 64 for v in vals):
            longest = max(vals, key=len)
            out.append(f"{key}: free text? ({len(vals)} values, e.g. {longest[:60]!r})")
    return out


# ---- 2. replay ----


def gateway_config(tmp: Path, telemetry_port: int) -> Path:
    """deploy/otelcol/gateway.yaml's metrics pipeline (k8sattributes out: no cluster), its own metrics on a port."""
    d = yaml.safe_load(GATEWAY.read_text())
    d["processors"].pop("k8sattributes", None)
    pipes = d["service"]["pipelines"]
    keep = pipes["metrics"]
    keep["processors"] = [p for p in keep["processors"] if p != "k8sattributes"]
    d["service"]["pipelines"] = {"metrics": keep}
    d["exporters"] = {k: v for k, v in d["exporters"].items() if k in keep["exporters"]}
    d["service"]["telemetry"] = {
        "metrics": {
            "level": "detailed",
            "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": telemetry_port}}}}],
        }
    }
    out = tmp / "gateway-scale.yaml"
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


def templates(bodies: list[bytes]) -> list[bytes]:
    """Each recorded metrics request with its points' times set to the marks."""
    out = []
    for body in bodies:
        req = metrics_request(body)
        n = 0
        for _, p in points(req):
            p.time_unix_nano = T_MARK
            if p.start_time_unix_nano:
                p.start_time_unix_nano = S_MARK
            n += 1
        b = req.SerializeToString()
        assert b.count(T_MARK.to_bytes(8, "little")) == n, "a time mark is not unique in the request"
        out.append(b)
    return out


def node_name(i: int, like: str) -> str:
    return f"n{i:0{len(like) - 1}d}"


def job_name(i: int) -> str:
    return f"{JOB[:-4]}{i // NODES_PER_JOB % 10000:04d}"


def as_node(tpl: bytes, host: str, i: int, now_ns: int, start_ns: int) -> bytes:
    """A template as node `i` sends it now: its host name and job, its points' times (same lengths)."""
    body = tpl.replace(host.encode(), node_name(i, host).encode()).replace(JOB.encode(), job_name(i).encode())
    body = body.replace(T_MARK.to_bytes(8, "little"), now_ns.to_bytes(8, "little"))
    return body.replace(S_MARK.to_bytes(8, "little"), start_ns.to_bytes(8, "little"))


@dataclass
class ReplayResult:
    sent: int = 0
    failed: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    lag_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the replayer's own


def replay(port: int, tpls: list[bytes], host: str, nodes: int, period: float, seconds: float) -> ReplayResult:
    """`nodes` nodes, each pushing once per `period` at its own phase, for `seconds`."""
    res = ReplayResult()
    lock = threading.Lock()
    start_ns = time.time_ns() - 3600 * 10**9
    workers = max(1, min(64, nodes))
    t0 = time.monotonic() + 0.5
    end = t0 + seconds
    cpu0 = harness.process_cpu_seconds(os.getpid()) or 0.0

    def work(w: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = range(w, nodes, workers)
        r = 0
        while True:
            for i in mine:
                due = t0 + r * period + i * period / nodes
                if due >= end:
                    conn.close()
                    return
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                lag = time.monotonic() - due
                body = as_node(tpls[(r + i) % len(tpls)], host, i, time.time_ns(), start_ns)
                try:
                    conn.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf"})
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    status = 0
                with lock:
                    res.sent += 1
                    res.failed += not 200 <= status < 300
                    res.statuses[status] = res.statuses.get(status, 0) + 1
                    res.lag_s.append(lag)
            r += 1

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.wall_s = time.monotonic() - t0
    res.cpu_s = (harness.process_cpu_seconds(os.getpid()) or 0.0) - cpu0
    return res


def stop(part: Collector | VictoriaMetrics) -> None:
    """Stopped; killed where it takes over 30 s (a collector with a backlog sends it first)."""
    try:
        part.stop()
    except subprocess.TimeoutExpired:
        part.proc.kill()
        part.proc.wait()
        part.log.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Watch:
    """A process's CPU (cores) and peak RSS (MiB) from /proc, read each second once started."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop_ = pid, 0.0, threading.Event()
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None
        threading.Thread(target=self.run, daemon=True).start()

    def begin(self) -> None:
        self.first = (time.monotonic(), harness.process_cpu_seconds(self.pid) or 0.0)
        self.peak = 0.0

    def run(self) -> None:
        while not self.stop_.wait(1.0):
            if self.first is not None:
                self.peak = max(self.peak, rss_mib(self.pid))

    def end(self) -> tuple[float, float]:
        self.last = (time.monotonic(), harness.process_cpu_seconds(self.pid) or 0.0)
        self.stop_.set()
        assert self.first is not None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0]), max(self.peak, rss_mib(self.pid))


def selfmetrics(port: int) -> dict[str, float]:
    """The collector's own metrics (otelcol_*), each name summed over its labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(otelcol_[a-z_]+)(?:\{[^}]*\})? (\S+)$", line)
        if m:
            out[m[1].removesuffix("_total")] = out.get(m[1].removesuffix("_total"), 0.0) + float(m[2])
    return out


def losses(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What was refused, failed or dropped between two readings of the collector's own metrics."""
    out = {}
    for name, v in after.items():
        if re.search(r"refused|failed|dropped|rejected", name) and v - before.get(name, 0.0):
            out[name] = v - before.get(name, 0.0)
    return out


@dataclass
class Size:
    nodes: int
    period: float
    pushes_per_s: float
    asked_per_s: float
    points_per_s: float
    col_cores: float
    col_rss: float
    vm_cores: float
    vm_rss: float
    replayer_cores: float
    lag_p95: float
    failed: int
    lost: dict[str, float]
    drained_s: float | None

    @property
    def kept_up(self) -> bool:
        return (
            self.failed == 0
            and not self.lost
            and self.drained_s is not None
            and self.pushes_per_s >= 0.95 * self.asked_per_s
        )


def run_size(
    tmp: Path,
    vm: VictoriaMetrics,
    vm_watch_pid: int,
    tpls: list[bytes],
    host: str,
    nodes: int,
    period: float,
    seconds: float,
    dps: float,
) -> Size:
    tport = free_port()
    col = Collector(tmp, gateway_config(tmp, tport), {"BACKEND_OTLP_ENDPOINT": vm.otlp})
    try:
        time.sleep(1.0)
        before = selfmetrics(tport)
        cw, vw = Watch(col.proc.pid), Watch(vm_watch_pid)
        timer = threading.Timer(WARM_S, lambda: (cw.begin(), vw.begin()))
        timer.start()
        res = replay(col.http_port, tpls, host, nodes, period, seconds)
        timer.join()
        col_cores, col_rss = cw.end()
        vm_cores, vm_rss = vw.end()
        drained = None
        t = time.monotonic()
        while time.monotonic() - t < DRAIN_S:
            m = selfmetrics(tport)
            if m.get("otelcol_exporter_queue_size", 0.0) == 0 and m.get(
                "otelcol_exporter_sent_metric_points", 0.0
            ) >= m.get("otelcol_receiver_accepted_metric_points", 0.0):
                drained = time.monotonic() - t
                break
            time.sleep(0.5)
        after = selfmetrics(tport)
    finally:
        stop(col)
    lags = sorted(res.lag_s) or [0.0]
    size = Size(
        nodes=nodes,
        period=period,
        pushes_per_s=res.sent / res.wall_s,
        asked_per_s=nodes / period,
        points_per_s=res.sent / res.wall_s * dps,
        col_cores=col_cores,
        col_rss=col_rss,
        vm_cores=vm_cores,
        vm_rss=vm_rss,
        replayer_cores=res.cpu_s / res.wall_s,
        lag_p95=lags[int(0.95 * (len(lags) - 1))],
        failed=res.failed,
        lost=losses(before, after),
        drained_s=drained,
    )
    print(
        f"  {nodes} nodes every {period:g} s: {size.pushes_per_s:.0f} pushes/s of {size.asked_per_s:.0f} asked "
        f"({size.points_per_s:.0f} points/s), collector {col_cores:.2f} cores {col_rss:.0f} MiB, "
        f"backend {vm_cores:.2f} cores {vm_rss:.0f} MiB, replayer {size.replayer_cores:.2f} cores, "
        f"lag p95 {size.lag_p95:.2f} s, not 2xx {res.failed} {res.statuses}, lost {size.lost}, "
        f"drained {drained}: {'kept up' if size.kept_up else 'did NOT keep up'}",
        flush=True,
    )
    return size


# ---- 3. query ----


def dashboard_queries() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list) -> None:  # type: ignore[type-arg]
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    expr = t["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$host", ".*")
                    out.append((f"panel {p.get('title', '?')} [{t.get('refId', '')}]", expr))

    walk(d["panels"])
    return out


def rule_queries() -> list[tuple[str, str]]:
    out = []
    for f in RULES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                out.append((f"rule {r.get('alert') or r.get('record')}", r["expr"].strip()))  # its # comments too
    return out


def query(vm: VictoriaMetrics, expr: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"http://127.0.0.1:{vm.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.load(r)["data"]["result"]  # type: ignore[no-any-return]


def times(url: str) -> list[tuple[float, str]]:
    """A query's times, QUERY_TIMES of them; once where it took over SLOW_S (the run's time is finite)."""
    runs = [timed(url)]
    while len(runs) < QUERY_TIMES and runs[0][0] < SLOW_S:
        runs.append(timed(url))
    return runs


def timed(url: str) -> tuple[float, str]:
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT_S) as r:
            doc = json.load(r)
        err = "" if doc.get("status") == "success" else str(doc.get("error"))
    except urllib.error.HTTPError as e:
        err = e.read().decode()[:1000]
    except OSError as e:  # a timeout: no answer in QUERY_TIMEOUT_S
        err = f"no answer: {e}"
    return time.perf_counter() - t, err


def query_times(vm: VictoriaMetrics) -> tuple[list[tuple[str, list[float], str]], list[tuple[str, list[float], str]]]:
    base = f"http://127.0.0.1:{vm.port}/api/v1"
    now = time.time()
    panels = []
    label = f"{base}/label/host_name/values?" + urllib.parse.urlencode({"match[]": "gpu_memcpy_calls_total"})
    runs = times(label)
    panels.append(("variable host (label_values)", [t for t, _ in runs], runs[-1][1]))
    for name, expr in dashboard_queries():
        q = {"query": expr, "start": now - QUERY_RANGE_S, "end": now, "step": QUERY_STEP_S}
        runs = times(f"{base}/query_range?" + urllib.parse.urlencode(q))
        panels.append((name, [t for t, _ in runs], runs[-1][1]))
    rules = []
    for name, expr in rule_queries():
        runs = times(f"{base}/query?" + urllib.parse.urlencode({"query": expr, "time": now}))
        rules.append((name, [t for t, _ in runs], runs[-1][1]))
    for name, ts, err in panels + rules:
        bad = f"  ERROR {err[:400]}" if err else ""
        print(f"    {statistics.median(ts) * 1e3:7.1f} ms (max {max(ts) * 1e3:7.1f})  {name}{bad}")
    return panels, rules


# ---- the figures ----


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="50,100,200,400,700,1000", help="the sizes replayed, in order (comma-separated)")
    ap.add_argument("--seconds", type=float, default=30.0, help="each size's replay")
    ap.add_argument("--ranks", type=int, default=4, help="ranks on the recorded host")
    ap.add_argument("--interval", type=float, default=1.0, help="the recorded agent's push interval (the fleet rule's)")
    ap.add_argument("--warm", type=float, default=30.0, help="seconds of the job before recording")
    ap.add_argument("--record-seconds", type=float, default=30.0)
    ap.add_argument("--save", type=Path, help="keep the recorded pushes in DIR")
    ap.add_argument("--capture", type=Path, help="replay the pushes saved in DIR (--save) instead of recording")
    ap.add_argument("--at-default", type=int, default=1000, help="then this many nodes every 5 s (0: none)")
    ap.add_argument("--only-record", action="store_true")
    args = ap.parse_args()
    harness.need_root("fleet_scale")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    print(f"machine: {harness.describe()} (shared: figures are this VM's)", flush=True)
    rec = Record()
    if args.capture:
        pushes, meta = load(args.capture)
    else:
        fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-scale-fx-")), quiet=True)
        pushes, meta = record(fx, args.ranks, args.interval, args.warm, args.record_seconds)
        if args.save:
            save(pushes, meta, args.save)
    mpushes = [p for p in pushes if p.path.endswith("/v1/metrics")]
    assert mpushes, f"no metrics pushes recorded: {sorted({p.path for p in pushes})}"
    assert all(not p.encoding for p in mpushes), "the recorded pushes are compressed: record with the default"
    reqs = [metrics_request(p.body) for p in mpushes]
    sizes = [len(p.body) for p in mpushes]
    gz = [len(gzip.compress(p.body)) for p in mpushes]
    dps = statistics.median(len(points(r)) for r in reqs)
    span = max(meta["seconds"], mpushes[-1].at - mpushes[0].at)
    other = sorted({p.path for p in pushes} - {"/v1/metrics"})
    print(
        f"recorded {meta['host']} ({meta['ranks']} ranks, --interval {meta['interval_s']}): "
        f"{len(mpushes)} metrics pushes in {span:.0f} s, {statistics.median(sizes)} B each "
        f"({statistics.median(gz)} B gzipped), {dps:.0f} points; other pushes: "
        f"{ {o: sum(p.path == o for p in pushes) for o in other} }",
        flush=True,
    )
    seen = labels(reqs)
    print("attributes pushed (values seen):")
    for key, vals in sorted(seen.items()):
        print(f"    {key}: {len(vals)}  e.g. {sorted(vals, key=len)[-1][:60]!r}")
    flagged = unbounded(seen)
    print("values that come and go, or free text:", *flagged, sep="\n    ")
    n = meta["ranks"]
    rec.add(f"series per node, {n} ranks", meta["series_per_node"], "1", ".0f")
    rec.add("series per traced rank", meta["series_per_rank"], "1", ".0f")
    rec.add("data points per push", dps, "1", ".0f")
    rec.add(f"bytes per push, {n} ranks (protobuf, as sent)", statistics.median(sizes), "B", ".0f")
    rec.add(f"bytes per push, {n} ranks (gzip)", statistics.median(gz), "B", ".0f")
    rec.add(
        "metrics pushes per second per node", len(mpushes) / span, "1/s", ".2f", note=f"--interval {meta['interval_s']}"
    )
    if args.only_record:
        rec.write()
        return
    tpls = templates([p.body for p in mpushes])
    done: list[Size] = []
    with tempfile.TemporaryDirectory(prefix="memtrace-scale-") as tmp:
        vm = VictoriaMetrics(Path(tmp))
        try:
            for nodes in [int(x) for x in args.nodes.split(",")]:
                s = run_size(
                    Path(tmp), vm, vm.proc.pid, tpls, meta["host"], nodes, meta["interval_s"], args.seconds, dps
                )
                done.append(s)
                if not s.kept_up:
                    break
            if args.at_default:
                # The agent's default interval: as many nodes' series, a fifth of the pushes.
                s = run_size(Path(tmp), vm, vm.proc.pid, tpls, meta["host"], args.at_default, 5.0, args.seconds, dps)
                done.append(s)
            # Queries without a metric name over every node's series take the backend minutes here: one node's each.
            hosts = query(vm, 'count(count by (host_name) (memtrace_agent_libraries{host_name=~"n[0-9]+"}))')
            held = int(float(hosts[0]["value"][1])) if hosts else 0
            counts = [
                query(vm, f'count({{host_name="{node_name(i, meta["host"])}"}})') for i in (0, held // 2, held - 1)
            ]
            each = statistics.median(float(x[0]["value"][1]) for x in counts if x) if any(counts) else float("nan")
            rec.add("series per replayed node (the backend's, last 5 min)", each, "1", ".0f")
            print(f"backend holds {held} nodes' series; per node (median) {each:.0f}")
            one = node_name(0, meta["host"])
            names = query(vm, f'sort_desc(count by (__name__) ({{host_name="{one}"}}))')
            print(f"{one}'s series by metric (the most first):")
            for x in names[:15]:
                print(f"    {x['value'][1]:>5}  {x['metric'].get('__name__')}")
            print(f"queries against {held} nodes (ms, p50 and max of up to {QUERY_TIMES}):", flush=True)
            panels, rules = query_times(vm)
        finally:
            stop(vm)
    every = meta["interval_s"]
    fit = max((s.nodes for s in done if s.kept_up and s.period == every), default=0)
    for s in done:
        tag = f"{s.nodes} nodes every {s.period:g} s" + ("" if s.kept_up else ", did not keep up")
        rec.add(f"collector CPU, {tag}", s.col_cores, "cores", ".2f")
        rec.add(f"collector peak RSS, {tag}", s.col_rss, "MiB", ".0f")
        rec.add(f"backend CPU, {tag}", s.vm_cores, "cores", ".2f")
        rec.add(f"backend peak RSS, {tag}", s.vm_rss, "MiB", ".0f")
        rec.add(f"pushes per second taken, {tag}", s.pushes_per_s, "1/s", ".0f")
    rec.add(f"nodes the collector kept up with, every {every:g} s", fit, "1", ".0f", Target(">=", 1000))
    five = [s for s in done if s.period == 5.0]
    if five:
        rec.add(
            f"nodes the collector kept up with, every 5 s (of {five[0].nodes})",
            five[0].nodes if five[0].kept_up else 0,
            "1",
            ".0f",
            Target(">=", 1000),
        )
    for kind, qs in (("dashboard queries", panels), ("rule queries", rules)):
        med = [statistics.median(ts) for _, ts, _ in qs]
        worst = max(qs, key=lambda q: max(q[1]))
        errs = [name for name, _, err in qs if err]
        rec.add(f"{kind} ({len(qs)}), p50 at {held} nodes", statistics.median(med), "s", ".3f")
        rec.add(f"{kind}, slowest at {held} nodes", max(worst[1]), "s", ".3f", note=worst[0])
        rec.add(f"{kind} that failed at {held} nodes", len(errs), "1", ".0f", note=", ".join(errs)[:300])
    rec.write()


if __name__ == "__main__":
    main()
