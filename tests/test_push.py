"""`memtrace push` end to end with real components: real probes, the real
OTLP exporters, a real OpenTelemetry Collector (ocb-built, running the agent
config from deploy/) and a real backend (VictoriaMetrics)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from backends import Collector, VictoriaMetrics, free_port, wait_port
from conftest import REPO, memtrace_cmd, truth_totals
from test_nvml import HEALTHY, gpu, script

from memtrace.core.ids import ProcessKey

pytestmark = pytest.mark.bpf
DASHBOARD = REPO / "deploy" / "grafana" / "memtrace.json"


def start_push(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # The log goes to a file: a pipe nobody reads would fill up and block the agent.
    # It is removed once read (stop_push), or kept with the failure that names it.
    log = tempfile.NamedTemporaryFile("w+", prefix="memtrace-push-", suffix=".log", delete=False)
    p = subprocess.Popen([*memtrace_cmd(), "push", *args], stderr=log, text=True, env=dict(os.environ, **(env or {})))
    p.log_path = log.name  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while "pushing to" not in Path(log.name).read_text():
        assert p.poll() is None and time.monotonic() < deadline, (log.name, Path(log.name).read_text())
        time.sleep(0.05)
    return p


def stop_push(p: subprocess.Popen) -> tuple[int, float, str]:
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    took = time.monotonic() - t
    log = Path(p.log_path)  # type: ignore[attr-defined]
    text = log.read_text()
    log.unlink()
    return p.returncode, took, text


def run_workloads(fakecuda: Path, tmp: Path, pace_us: int = 0) -> list[dict]:
    """Two jobs side by side (both layers, and driver only); pace_us > 0 makes
    them long-running (several push intervals), like training jobs."""
    truth = tmp / "truth.jsonl"
    pace = ["-p", str(pace_us)] if pace_us else []
    procs = [
        subprocess.Popen([str(fakecuda / argv[0]), *argv[1:], *pace], env={"WORKLOAD_TRUTH": str(truth)})
        for argv in (["workload", "-n", "600", "-s", "41"], ["workload_driver", "-n", "600", "-s", "42"])
    ]
    assert [p.wait() for p in procs] == [0, 0]
    return [json.loads(l) for l in truth.read_text().splitlines()]


def by_direction(lines: list[dict]) -> dict[str, tuple[int, int, int]]:
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for (_, _, d), v in truth_totals(lines).items():
        for i in range(3):
            out[d][i] += v[i]
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


def backend_by_direction(vm: VictoriaMetrics, pids: list[int]) -> dict[str, tuple[int, int, int]]:
    sel = '{process_pid=~"' + "|".join(map(str, pids)) + '"}'
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for i, name in enumerate(("calls", "bytes", "errors")):
        for r in vm.query(f"sum by (direction) (gpu_memcpy_{name}_total{sel})"):
            out[r["metric"]["direction"]][i] = int(float(r["value"][1]))
    return {k: tuple(v) for k, v in out.items()}  # type: ignore[misc]


def wait_for(fn, want, timeout: float = 40):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = fn()
        if got == want:
            return got
        time.sleep(0.5)
    return got


def listening_sockets(pid: int) -> list[str]:
    """TCP sockets in LISTEN state owned by pid."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                found.append(f"{table} {f[1]}")
    return found


def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_workload_to_collector_to_victoriametrics_exactly(
    protocol: str, fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    vm = VictoriaMetrics(tmp_path)
    col = Collector(tmp_path, REPO / "deploy" / "otelcol" / "agent.yaml", {"MEMTRACE_EXPORT_ENDPOINT": vm.otlp})
    port = col.http_port if protocol == "http/protobuf" else col.grpc_port
    # A GPU for the health, utilisation and PCIe panels: the test NVML, its driver counting PCIe bytes.
    nvml_script = tmp_path / "nvml.script"
    counters = {"pcie_tx_count": 10**12, "pcie_rx_count": 10**9}
    hopper = {"gpm": 1, "gpm_sm": 40, "gpm_occupancy": 30, "gpm_tensor": 20, "gpm_dram": 10, "nvlinks": 2}
    hopper["remapped"] = "0,0,0,0"  # for the GPU pillars' panels: GPM, NVLink, remapped rows
    nvml_script.write_text(script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, **counters, **hopper)))
    push = start_push(
        ["--endpoint", f"http://127.0.0.1:{port}", "--protocol", protocol, "--interval", "1"],
        env={
            "NODE_NAME": "node-a",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
            "LD_LIBRARY_PATH": str(fakenvml),
            "FAKE_NVML_SCRIPT": str(nvml_script),
        },
    )
    try:
        lines = run_workloads(fakecuda, tmp_path, pace_us=6000)
        # And a job the memory panels have something to say about: pinned and
        # pageable host memory, device memory, waits, launches, a finding;
        # and a stepping loop for the bottleneck and straggler panels.
        subprocess.run([str(fakecuda / "memwork_driver"), "-r", "40"], env={"WORKLOAD_TRUTH": "/dev/null"}, check=True)
        # Started as torchrun starts a rank: its job and rank reach the backend as labels.
        loop = [str(fakecuda / "steploop"), "-n", "300", "-k", "2000", "-w", "1000"]
        rank = {"TORCHELASTIC_RUN_ID": "job-e2e", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}
        subprocess.run(loop, env={"WORKLOAD_TRUTH": "/dev/null", **rank}, check=True)
        time.sleep(2.5)
        assert listening_sockets(push.pid) == [], "memtrace push must not listen"
        rc, took, err = stop_push(push)
        assert rc == 0, err
        assert took < 10, f"SIGTERM took {took:.1f}s to flush"
        pids = [l["pid"] for l in lines]
        want = by_direction(lines)
        assert wait_for(lambda: backend_by_direction(vm, pids), want) == want, (err, col.log_path.read_text()[-2000:])

        # Every query of the Grafana dashboard answers with data.
        for expr in dashboard_queries():
            e = expr.replace("$__rate_interval", "1m").replace("$host", ".*")
            # The backend makes fresh samples searchable within seconds, not at once.
            assert wait_for(lambda e=e: bool(vm.query(e)), True, timeout=30), f"dashboard query returned nothing: {e}"

        # One resource per process, with who and where it is.
        series = vm.query('gpu_memcpy_calls_total{process_pid=~"' + "|".join(map(str, pids)) + '"}')
        assert {s["metric"]["process_executable_name"] for s in series} == {"workload", "workload_driver"}
        assert {s["metric"]["process_pid"] for s in series} == {str(p) for p in pids}
        m = series[0]["metric"]
        assert m["k8s_node_name"] == "node-a" and m["host_name"] and m["deployment_environment"] == "test"
        assert {s["metric"]["mode"] for s in series} == {"sync", "async"}
        assert {s["metric"]["layer"] for s in series} == {"runtime", "driver"}
        assert not any("memtrace_job_id" in s["metric"] for s in series)  # no launcher started these
        (stepper,) = vm.query('memtrace_step_duration_seconds_count{memtrace_job_id="job-e2e"}')
        job = {k: v for k, v in stepper["metric"].items() if k.startswith("memtrace_job_")}
        assert job == {
            "memtrace_job_id": "job-e2e",
            "memtrace_job_launcher": "torchelastic",
            "memtrace_job_rank": "2",
            "memtrace_job_world_size": "4",
            "memtrace_job_local_rank": "0",
        }
        health = vm.query("memtrace_agent_events_total")
        assert health and int(float(health[0]["value"][1])) >= sum(v[0] for v in want.values())
    finally:
        if push.poll() is None:
            push.kill()
        col.stop()
        vm.stop()


def test_collector_down_for_a_minute_then_up_loses_nothing_and_logs_once(fakecuda: Path, tmp_path: Path) -> None:
    port = free_port()
    # A 1 s export timeout (the standard variable, in ms) so each attempt
    # fails fast; the outage lasts a minute with jobs running throughout.
    push = start_push(
        ["--endpoint", f"http://127.0.0.1:{port}/opentelemetry", "--interval", "0.5"],
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1000"},
    )
    vm = None
    try:
        lines: list[dict] = []
        rss = []
        end = time.monotonic() + 60
        i = 0
        while time.monotonic() < end:
            truth = tmp_path / f"truth{i}.jsonl"
            subprocess.run(
                [str(fakecuda / "workload_driver"), "-n", "200", "-s", str(100 + i)],
                env={"WORKLOAD_TRUTH": str(truth)},
                check=True,
            )
            lines += [json.loads(l) for l in truth.read_text().splitlines()]
            rss.append(int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{push.pid}/status").read_text()).group(1)))
            assert push.poll() is None, "push must keep tracing through an outage"
            time.sleep(2)
            i += 1
        # Memory stays bounded while nothing can be sent: exited processes'
        # series are kept for their final push, but each is small.
        assert rss[-1] - rss[2] < 24 * 1024, rss
        vm = VictoriaMetrics(tmp_path, port=port)
        want = by_direction(lines)
        # Backoff is capped at 30 s: the first push after recovery carries everything.
        got = wait_for(lambda: backend_by_direction(vm, [l["pid"] for l in lines]), want, timeout=60)
        assert got == want
        rc, _, err = stop_push(push)
        assert rc == 0
        assert len(re.findall(r"push to \S+ failed:", err)) == 1, err  # once per outage, with the reason
        assert "Connection refused" in err, err
        assert "works again" in err
    finally:
        if push.poll() is None:
            push.kill()
        if vm:
            vm.stop()


class Refusing(http.server.BaseHTTPRequestHandler):
    seen_headers: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        Refusing.seen_headers.append(self.headers.get("authorization", ""))
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(400)
        self.end_headers()
        self.wfile.write(b"bad request from the test collector")

    def log_message(self, *args: object) -> None:
        pass


def test_refusing_collector_keeps_tracing_and_never_logs_the_token(fakecuda: Path, tmp_path: Path) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    secret = "Bearer s3cr3t-t0ken-value"
    push = start_push(
        [
            "--endpoint",
            f"http://127.0.0.1:{srv.server_port}",
            "--interval",
            "0.5",
            "-v",
            "--headers",
            f"authorization={secret}",
        ]
    )
    try:
        run_workloads(fakecuda, tmp_path)
        time.sleep(2)
        assert push.poll() is None
        rc, _, err = stop_push(push)
    finally:
        srv.shutdown()
        if push.poll() is None:
            push.kill()
    assert rc == 0
    assert Refusing.seen_headers and Refusing.seen_headers[0] == secret  # it was sent...
    assert "s3cr3t" not in err  # ...and never written to the logs
    assert "authorization=<redacted>" in err
    outage = re.findall(r"push to \S+ failed: (.*)", err)
    assert len(outage) == 1 and "HTTP 400" in outage[0], err


def test_exited_processes_are_sent_a_final_time_then_dropped(fakecuda: Path, tmp_path: Path) -> None:
    from memtrace.export.config import resolve
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.push import push_forever

    vm = VictoriaMetrics(tmp_path)
    cfg = resolve({}, endpoint=vm.otlp, interval=0.5)
    stop = threading.Event()
    try:
        with Pipeline(PipelineOptions(Options(), None, measure_overhead=False)) as pipe:
            agent = pipe.agent
            t = threading.Thread(target=push_forever, args=(pipe, cfg, stop))
            t.start()
            lines = run_workloads(fakecuda, tmp_path)
            pids = [l["pid"] for l in lines]
            want = by_direction(lines)
            got = wait_for(lambda: backend_by_direction(vm, pids), want)
            per = {p: backend_by_direction(vm, [p]) for p in pids}
            assert got == want, (per, {l["pid"]: by_direction([l]) for l in lines})
            deadline = time.monotonic() + 10
            while any(k.pid in pids for k in agent.model.processes) and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            t.join(timeout=20)
            assert not any(k.pid in pids for k in agent.model.processes), "exited processes kept their series"
            kept = [k.pid for k, _ in agent.cuda.maps.lost() + agent.cuda.maps.counts()] + [
                p
                for p in pids
                if agent.cuda.maps.is_fresh(ProcessKey(p, 0))  # `fresh` is kept per pid
            ]
            assert not set(kept) & set(pids), "kernel state of exited pids kept"
    finally:
        stop.set()
        vm.stop()


def test_memory_intelligence_reaches_the_backend(fakecuda: Path, tmp_path: Path) -> None:
    """Host memory labels, device memory, waits and launches, through the
    collector into VictoriaMetrics, equal to the workload's truth."""
    vm = VictoriaMetrics(tmp_path)
    col = Collector(tmp_path, REPO / "deploy" / "otelcol" / "agent.yaml", {"MEMTRACE_EXPORT_ENDPOINT": vm.otlp})
    push = start_push(["--endpoint", f"http://127.0.0.1:{col.http_port}", "--interval", "1"])
    try:
        truth_path = tmp_path / "truth.jsonl"
        w = subprocess.run([str(fakecuda / "memwork_driver"), "-r", "5"], env={"WORKLOAD_TRUTH": str(truth_path)})
        assert w.returncode == 0
        (truth,) = [json.loads(l) for l in truth_path.read_text().splitlines()]
        time.sleep(2.5)
        rc, _, err = stop_push(push)
        assert rc == 0, err
        sel = f'process_pid="{truth["pid"]}"'

        want: dict[tuple[str, str], int] = defaultdict(int)
        for c in truth["copies"]:
            want[(c["direction"], c["host_memory"])] += c["bytes"]

        def copies() -> dict[tuple[str, str], int]:
            got = {}
            for r in vm.query(f"sum by (direction, host_memory) (gpu_memcpy_bytes_total{{{sel}}})"):
                got[(r["metric"]["direction"], r["metric"].get("host_memory", ""))] = int(float(r["value"][1]))
            return got

        assert wait_for(copies, dict(want)) == dict(want), col.log_path.read_text()[-2000:]

        def one(expr: str) -> int:
            # Each new series becomes searchable on its own, within seconds of the push (CI once found
            # gpu_memory_in_use but not yet gpu_memory_outstanding from the same request).
            wait_for(lambda: bool(vm.query(expr)), True, timeout=30)
            r = vm.query(expr)
            return int(float(r[0]["value"][1])) if r else -1

        mem = truth["device_memory"]
        assert one(f'{{__name__=~"gpu_memory_in_use.*",{sel}}}') == mem["in_use_bytes"]
        assert one(f'{{__name__=~"gpu_memory_outstanding.*",{sel}}}') == mem["outstanding"]
        assert one(f'sum({{__name__=~"gpu_memory_allocated.*_total",{sel}}})') == mem["allocated_bytes"]
        assert one(f'sum({{__name__=~"gpu_memory_unknown_frees.*",{sel}}})') == mem["unknown_frees"]
        assert one(f"sum(gpu_launches_total{{{sel}}})") == sum(truth["launches"].values())
        assert one(f'sum(gpu_launches_total{{{sel},kind="graph"}})') == truth["launches"]["graph"]
        assert one(f"sum(gpu_sync_calls_total{{{sel}}})") == sum(truth["sync"].values())
    finally:
        if push.poll() is None:
            push.kill()
        col.stop()
        vm.stop()


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b"404 page not found: this is no OTLP receiver\nsecond line\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def first_failure_then_sigint(endpoint: str) -> tuple[int, str]:
    """`memtrace push` until its first failed push is logged, then ^C. The
    waits are generous: a host-wide agent on a busy host (other tests' CUDA
    processes to attach to) can take a while to reach its first push."""
    log = tempfile.NamedTemporaryFile("w+", prefix="memtrace-push-", suffix=".log", delete=False)
    push = subprocess.Popen(
        [*memtrace_cmd(), "push", "--endpoint", endpoint, "--interval", "0.5"], stderr=log, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while "failed:" not in Path(log.name).read_text():
            assert push.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(0.05)
        push.send_signal(signal.SIGINT)
        push.wait(timeout=120)
    finally:
        if push.poll() is None:
            push.kill()
            push.wait()
    text = Path(log.name).read_text()
    Path(log.name).unlink()
    return push.returncode, text


def test_push_with_nothing_listening_says_cannot_connect_and_no_traceback() -> None:
    port = free_port()
    rc, err = first_failure_then_sigint(f"http://127.0.0.1:{port}")
    assert rc == 0, err
    assert (
        f"push to http://127.0.0.1:{port}/v1/metrics failed: cannot connect to 127.0.0.1:{port}: Connection refused."
        in err
    )
    assert "Traceback" not in err and "urllib3" not in err and "HTTPConnectionPool" not in err, err
    # ^C: the last push is not tried against a collector that refuses (the exporter's retries
    # would spend the whole final timeout); what that loses is said.
    assert f"the last push was not sent (cannot connect to 127.0.0.1:{port}: Connection refused)" in err, err
    assert "did not finish within" not in err, err


def test_push_refused_with_404_says_status_reason_and_body() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rc, err = first_failure_then_sigint(f"http://127.0.0.1:{srv.server_port}")
    finally:
        srv.shutdown()
    assert rc == 0, err
    assert "failed: HTTP 404 Not Found: 404 page not found: this is no OTLP receiver." in err, err
    assert "second line" not in err and "Traceback" not in err, err


def test_a_delivered_export_is_let_go_not_held_until_the_next(fakecuda: Path, tmp_path: Path) -> None:
    """An export's batch (its points: tens of MB at 1000 processes) lives
    while it is built and sent, not after: once the backend took it, nothing
    in the push loop keeps it until the next push (the agent's resident size
    would carry a whole export between pushes)."""
    import weakref

    from memtrace.export.config import resolve
    from memtrace.export.otlp import MetricsBuilder
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.push import host_attributes, push_forever

    vm = VictoriaMetrics(tmp_path)
    cfg = resolve({}, endpoint=vm.otlp, interval=2.0)
    committed: list[weakref.ref[object]] = []
    built = [0]

    class Watched(MetricsBuilder):
        def build(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            built[0] += 1
            batch = super().build(*args, **kwargs)
            commit, ref = batch.commit, weakref.ref(batch)  # no cycle through the batch: a weak reference

            def watched_commit() -> None:
                commit()
                committed.append(ref)

            batch.commit = watched_commit
            return batch

    stop = threading.Event()
    try:
        with Pipeline(PipelineOptions(Options(), None, measure_overhead=False)) as pipe:
            builder = Watched(cfg, host_attributes())
            t = threading.Thread(target=push_forever, args=(pipe, cfg, stop), kwargs={"builder": builder})
            t.start()
            run_workloads(fakecuda, tmp_path)
            deadline = time.monotonic() + 30
            while not committed and time.monotonic() < deadline:
                time.sleep(0.05)
            assert committed, "no push was delivered"
            first, builds = committed[0], built[0]
            # The next push is two seconds off: the settled one must be gone before it is built.
            while first() is not None and built[0] == builds and time.monotonic() < deadline:
                time.sleep(0.02)
            assert first() is None and built[0] == builds, "the push loop held the export it delivered"
            stop.set()
            t.join(timeout=20)
    finally:
        stop.set()
        vm.stop()


def test_a_finding_whose_figures_change_is_one_series_in_the_backend(tmp_path: Path) -> None:
    """memtrace_finding_ratio carries the finding's code, not its summary:
    three pushes whose summaries differ (more bytes copied from pageable
    memory, at another bandwidth) make one series in VictoriaMetrics, not
    three (one per wording), and its value follows the finding."""
    from test_otlp import _rows

    from memtrace.core.abi import Direction
    from memtrace.export.config import resolve
    from memtrace.export.otlp import MetricsBuilder
    from memtrace.export.transport import MetricsExporter
    from memtrace.model import Model
    from memtrace.sources.procfs import read_process

    pid = os.getpid()
    vm = VictoriaMetrics(tmp_path)
    try:
        cfg = resolve({}, endpoint=vm.otlp)
        builder, exporter = MetricsBuilder(cfg, {"host.name": "t"}), MetricsExporter(cfg)
        m = Model(identify=read_process)
        m.complete_after_ns = None  # untracked host memory is pageable
        pinned = 0x7F00_0000_0000
        m.add_events(_rows(pid, [{"api": 66, "dst": pinned, "bytes": 1 << 30}]))  # cuMemHostAlloc
        summaries, values = [], []
        for k in range(3):
            copy = {"api": 22, "direction": Direction.H2D, "bytes": 64 << 20, "duration_ns": 5_000_000 * (k + 1)}
            from_pinned = {**copy, "src": pinned, "duration_ns": 1_000_000}
            m.add_events(_rows(pid, [{**copy, "src": 0x1000}] * (k + 2) + [from_pinned]))
            batch = builder.build(m, {}, 1)
            (f,) = [f for f in batch.findings if f.code == "pageable_h2d" and f.key.pid == pid]
            summaries.append(f.summary)
            values.append(f.value)
            assert exporter.export(batch.data)[0]
            batch.commit()
        exporter.shutdown()
        assert len(set(summaries)) == 3, summaries  # the text changed at every push
        sel = f'memtrace_finding_ratio{{process_pid="{pid}",finding="pageable_h2d"}}'

        def latest() -> float | None:
            r = vm.query(sel)
            return round(float(r[0]["value"][1]), 6) if r else None

        assert wait_for(latest, round(values[-1], 6), timeout=30) == round(values[-1], 6)
        series = vm.query(f"last_over_time({sel}[1h])")
        assert len(series) == 1, [s["metric"] for s in series]
        (resource,) = [
            rm.resource.attributes
            for rm in batch.data.resource_metrics
            if rm.resource.attributes.get("process.pid") == pid
        ]
        # Its labels: the code, and the process's resource (who and where), nothing else.
        assert set(series[0]["metric"]) == {"__name__", "finding"} | {k.replace(".", "_") for k in resource}
        assert "summary" not in series[0]["metric"] and "fix" not in series[0]["metric"]
    finally:
        vm.stop()


def test_the_catalogs_prometheus_names_are_the_backends(tmp_path: Path) -> None:
    """A rich build (every metric of the catalog, test_otlp.rich_build)
    pushed to VictoriaMetrics: the names it shows are exactly those the
    catalog, and so docs/metrics.md, the rules and the dashboard, give."""
    import urllib.request

    from test_otlp import rich_build

    from memtrace.export.catalog import METRICS, prometheus_series
    from memtrace.export.config import resolve
    from memtrace.export.transport import MetricsExporter

    vm = VictoriaMetrics(tmp_path)
    try:
        _, batch = rich_build()
        exporter = MetricsExporter(resolve({}, endpoint=vm.otlp))
        assert exporter.export(batch.data)[0]
        exporter.shutdown()
        want = {n for m in METRICS for n in prometheus_series(m)}

        def names() -> set[str]:
            with urllib.request.urlopen(f"http://127.0.0.1:{vm.port}/api/v1/label/__name__/values", timeout=10) as r:
                return set(json.load(r)["data"])

        got = wait_for(names, want, timeout=30)
        assert got == want, (sorted(got - want), sorted(want - got))
    finally:
        vm.stop()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_events_and_profiles_reach_the_real_collector_over_either_protocol(protocol: str, tmp_path: Path) -> None:
    """The events' and the profiles' transport (export/transport.py) to the
    real collector (deploy/otelcol/agent.yaml), over OTLP/HTTP and over gRPC
    alike, and on from it to receivers here: a finding's record, and a call
    site's samples."""
    import yaml
    from backends import Collector, OtlpLogSink, OtlpProfileSink
    from test_otlp import _finding

    from memtrace.export.config import resolve
    from memtrace.export.events import Events
    from memtrace.export.otlp_profiles import ProfilesBuilder, ProfilesSender

    # The agent config as shipped, its own telemetry off (its default port, 8888, may be taken on this host).
    config = yaml.safe_load((REPO / "deploy" / "otelcol" / "agent.yaml").read_text())
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(config))
    logs, profiles = OtlpLogSink(), OtlpProfileSink()
    col = Collector(
        tmp_path,
        tmp_path / "agent.yaml",
        {
            "MEMTRACE_EXPORT_ENDPOINT": logs.endpoint,
            "MEMTRACE_LOGS_ENDPOINT": logs.endpoint,
            "MEMTRACE_PROFILES_ENDPOINT": profiles.endpoint,
        },
    )
    try:
        wait_port(col.grpc_port)
        port = col.http_port if protocol == "http/protobuf" else col.grpc_port
        cfg = resolve({}, endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout=5)
        job = {
            "memtrace.job.id": "job-7",
            "memtrace.job.rank": 3,
            "memtrace.nccl.comm_id": "5f1d",
            "memtrace.nccl.rank": 3,
        }
        events = Events(cfg, {"service.name": "memtrace"}, lambda key: job)
        events.findings([_finding(0.30, "30% of H2D bytes came from pageable memory")])
        events.shutdown()
        frames = [{"function": "upload", "file": "/app/train.py", "line": 42}]
        site = {"pid": 7, "kind": "copy", "api": "cudaMemcpy", "direction": "h2d", "calls": 3, "bytes": 12288}
        site["frames"] = frames
        batch = ProfilesBuilder({"host.name": "h"}).build([site], {7: {"process.pid": 7}})
        assert batch.request is not None
        assert ProfilesSender(cfg).send(batch.request) == ""

        def arrived() -> tuple[list, list]:
            return [r["body"] for r in logs.records], [(s["type"], s["value"]) for s in profiles.samples]

        want = (["30% of H2D bytes came from pageable memory"], [("copies", 3), ("copy_bytes", 12288)])
        assert wait_for(arrived, want, timeout=30) == want, col.log_path.read_text()[-3000:]
        said = logs.records[0]["attributes"]  # the process's job, rank and communicator, as its metrics carry them
        assert (said["memtrace.job.id"], said["memtrace.job.rank"]) == ("job-7", 3)
        assert (said["memtrace.nccl.comm_id"], said["memtrace.nccl.rank"]) == ("5f1d", 3)
    finally:
        col.stop()
        logs.stop()
        profiles.stop()
