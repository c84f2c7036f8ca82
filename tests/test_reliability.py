"""Faults with a known truth (RELIABILITY.md lists each with its promise):
agent restarts, misbehaving collectors, process churn, libraries reloaded
and replaced, a full ring, a bounded soak, odd names, TLS verification."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from backends import VictoriaMetrics, free_port
from conftest import FIXTURES, observed_totals, run_traced, truth_totals
from test_push import backend_by_direction, by_direction, listening_sockets, start_push, stop_push, wait_for

from memtrace.core.ids import ProcessKey

pytestmark = pytest.mark.bpf


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_agent_restart_resets_counters_with_a_new_start_and_never_double_counts(fakecuda: Path, tmp_path: Path) -> None:
    """Phase 1 under agent A, phase 2 under agent B (started while the job
    runs): B's series restart from zero at B's start, and A's last values
    plus B's equal the whole truth."""
    vm = VictoriaMetrics(tmp_path)
    truth = tmp_path / "truth.jsonl"
    w = subprocess.Popen(
        [str(fakecuda / "workload"), "-w", "-P", "2", "-n", "800", "-s", "51"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # The job starts before either agent: its unified copies cannot be
        # resolved (where its pointers came from was never seen): "default".
        env={"WORKLOAD_TRUTH": str(truth), "WORKLOAD_RAW_DIRECTIONS": "1"},
    )
    assert w.stdin and w.stdout
    try:
        assert w.stdout.readline().startswith("ready 0")
        a = start_push(["--endpoint", vm.otlp, "--interval", "0.5"])
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("ready 1")
        phase1 = json.loads(truth.read_text().splitlines()[0])
        time.sleep(1.5)
        assert stop_push(a)[0] == 0
        want1 = by_direction([phase1])
        first = wait_for(lambda: backend_by_direction(vm, [w.pid]), want1)
        assert first == want1  # agent A's final push holds exactly phase 1
        b = start_push(["--endpoint", vm.otlp, "--interval", "0.5"])
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done")
        assert w.wait(timeout=60) == 0
        both = json.loads(truth.read_text().splitlines()[1])
        time.sleep(1.5)
        assert stop_push(b)[0] == 0
        t1 = {(k[1], k[2]): v[0] for k, v in truth_totals([phase1]).items()}
        t12 = {(k[1], k[2]): v[0] for k, v in truth_totals([both]).items()}
        t2 = {k: v - t1.get(k, 0) for k, v in t12.items() if v - t1.get(k, 0)}

        def latest() -> dict[tuple[str, str], int]:
            rows = vm.query(f'gpu_memcpy_calls_total{{process_pid="{w.pid}"}}')
            return {(r["metric"]["api"], r["metric"]["direction"]): int(r["value"][1]) for r in rows}

        # B's series restart from zero at B's start: their latest values are
        # phase 2 alone; series B never reports keep A's last value until the
        # backend's lookback forgets them.
        want = {k: t2.get(k, t1.get(k)) for k in t12}
        assert wait_for(latest, want) == want
        # Across both agents, increase() (which needs the drop to be read as a
        # reset) equals the whole truth: nothing lost, nothing twice.
        got = {
            r["metric"]["direction"]: int(round(float(r["value"][1])))
            for r in vm.query(f'sum by (direction) (increase(gpu_memcpy_calls_total{{process_pid="{w.pid}"}}[10m]))')
        }
        assert got == {d: v[0] for d, v in by_direction([both]).items()}
    finally:
        w.kill()
        vm.stop()


class Misbehaving(http.server.BaseHTTPRequestHandler):
    mode = "503"

    def do_POST(self) -> None:  # noqa: N802
        if self.mode == "close":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.mode == "slow":
            time.sleep(3)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(503 if self.mode in ("503", "slow") else 200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("mode", ["503", "slow", "close"])
def test_misbehaving_collector_never_stops_tracing_and_memory_stays_bounded(
    mode: str, fakecuda: Path, tmp_path: Path
) -> None:
    handler = type(f"H{mode}", (Misbehaving,), {"mode": mode})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    push = start_push(
        ["--endpoint", f"http://127.0.0.1:{srv.server_port}", "--interval", "0.3"],
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1000"},
    )
    try:
        samples = []
        for i in range(6):
            subprocess.run(
                [str(fakecuda / "workload"), "-n", "300", "-s", str(60 + i)],
                env={"WORKLOAD_TRUTH": "/dev/null"},
                check=True,
            )
            samples.append(rss_kib(push.pid))
        assert push.poll() is None, "tracing stopped"
        rc, took, err = stop_push(push)
    finally:
        srv.shutdown()
        if push.poll() is None:
            push.kill()
    assert rc == 0 and took < 15
    assert len(re.findall(r"push to \S+ failed:", err)) == 1, err
    # Six more workloads after the first must not grow the agent (series of
    # exited processes are bounded even when no push succeeds).
    assert samples[-1] - samples[1] < 20 * 1024, samples


def test_a_thousand_short_lived_processes_stay_exact_and_leave_no_kernel_state(fakecuda: Path, tmp_path: Path) -> None:
    w = fakecuda / "workload_driver"
    script = f"i=0; while [ $i -lt 1000 ]; do {w} -n 3 -s $i -e || exit 1; i=$((i+1)); done"
    doc, lines, p = run_traced(["/bin/sh", "-c", script], tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr
    assert len(lines) == 1000
    assert observed_totals(doc) == truth_totals(lines)
    assert doc["agent"]["events"] == 3000 and doc["agent"]["dropped"] == 0


def test_churn_in_push_mode_releases_per_process_state(fakecuda: Path, tmp_path: Path) -> None:
    from memtrace.export.config import resolve
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.push import push_forever

    vm = VictoriaMetrics(tmp_path)
    stop = threading.Event()
    try:
        with Pipeline(PipelineOptions(Options(), None, measure_overhead=False)) as pipe:
            agent = pipe.agent
            t = threading.Thread(target=push_forever, args=(pipe, resolve({}, endpoint=vm.otlp, interval=0.3), stop))
            t.start()
            w = fakecuda / "workload"
            subprocess.run(
                ["/bin/sh", "-c", f"for i in $(seq 200); do {w} -n 4 -t 3 -s $i -e; done"],
                env={"WORKLOAD_TRUTH": "/dev/null"},
                check=True,
            )
            deadline = time.monotonic() + 15
            while agent.model.processes and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            t.join(timeout=20)
            assert not agent.model.processes, "per-process state kept after exit"
            assert agent.cuda.maps.lost() == [] and agent.cuda.maps.counts() == [], "kernel counts kept after exit"
            assert agent.cuda.maps.inflight_count() == 0, "in-flight entries leaked"
    finally:
        stop.set()
        vm.stop()


def test_long_outage_with_churn_keeps_memory_bounded_and_counts_what_it_drops(
    fakecuda: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from memtrace.export.config import resolve
    from memtrace.runtime.pipeline import Options, Pipeline, PipelineOptions
    from memtrace.runtime.push import push_forever

    cfg = resolve({"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}, endpoint=f"http://127.0.0.1:{free_port()}", interval=0.2)
    stop = threading.Event()
    with Pipeline(PipelineOptions(Options(), None, measure_overhead=False)) as pipe:
        agent = pipe.agent
        t = threading.Thread(target=push_forever, args=(pipe, cfg, stop), kwargs={"max_unsent_exited": 5})
        t.start()
        try:
            pids = []
            for i in range(12):
                w = subprocess.Popen(
                    [str(fakecuda / "workload_driver"), "-n", "20", "-s", str(i), "-e"],
                    env={"WORKLOAD_TRUTH": "/dev/null"},
                )
                assert w.wait() == 0
                pids.append(w.pid)
                time.sleep(0.3)
            time.sleep(1)
            exited = [p for p in agent.model.processes.values() if p.exited]
            assert len(exited) <= 5, "exited processes pile up without bound during an outage"
            # What the kernel keeps per process goes with the process's model state.
            kernel_pids = {p for p in pids if agent.cuda.maps.is_fresh(ProcessKey(p, 0))}  # `fresh` is kept per pid
            kernel_pids |= {k.pid for k, _ in agent.cuda.maps.lost() + agent.cuda.maps.counts()}
            assert kernel_pids and kernel_pids <= {k.pid for k in agent.model.processes}, (
                "kernel state kept for dropped processes"
            )
        finally:
            stop.set()
            t.join(timeout=20)
    assert any("dropped unsent" in r.getMessage() for r in caplog.records)


def test_a_process_dropped_between_pushes_leaves_no_kernel_counts(fakecuda: Path) -> None:
    """push drops exited processes between pushes (an outage): nothing has
    read their kernel totals since they ran, and every process has a trap
    count there. Forgetting them must delete those keys too (CI caught the
    outage test keeping them)."""
    from memtrace.runtime.agent import Agent
    from memtrace.sensors.cuda import Options

    with Agent(Options()) as agent:
        subprocess.run(
            [str(fakecuda / "workload_driver"), "-n", "20", "-e"], env={"WORKLOAD_TRUTH": "/dev/null"}, check=True
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(p.exited for p in agent.model.processes.values()):
            agent.poll()  # folds the exit; the kernel's totals are not read
            time.sleep(0.05)
        (key,) = [k for k, p in agent.model.processes.items() if p.exited]
        agent.forget_unread([key])
        assert key not in agent.model.processes
        left = [k for k, _ in agent.cuda.maps.lost() + agent.cuda.maps.counts() if k.pid == key.pid]
        assert left == [], left


def test_libraries_closed_replaced_on_disk_and_reopened(fakecuda: Path, tmp_path: Path) -> None:
    argv = [sys.executable, str(FIXTURES / "ctypes_workload.py"), str(fakecuda / "lib"), "--reload", "--calls", "800"]
    doc, lines, p = run_traced(argv, tmp_path)
    assert p.returncode == 0, p.stderr
    assert observed_totals(doc) == truth_totals(lines)
    runtimes = [l for l in doc["agent"]["libraries"] if l["layer"] == "runtime"]
    assert len(runtimes) == 2  # the replaced file is a new inode, attached in turn


def test_full_ring_keeps_totals_exact_and_reports_exactly_what_is_missing(fakecuda: Path, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    out = tmp_path / "summary.json"
    from conftest import memtrace_cmd

    p = subprocess.run(
        [
            *memtrace_cmd(),
            "run",
            "--ring-size",
            "0.004",
            "--format",
            "json",
            "-o",
            str(out),
            "--",
            str(fakecuda / "workload"),
            "-n",
            "3000",
            "-t",
            "4",
            "-s",
            "71",
        ],
        env=dict(os.environ, WORKLOAD_TRUTH=str(truth)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    lines = [json.loads(l) for l in truth.read_text().splitlines()]

    def unified_as_h2h(t: dict) -> dict:
        # A lost call keeps the direction the kernel saw: its unified copies
        # stay "default" (with host memory "unknown"), the seen ones resolve.
        out: dict = defaultdict(lambda: [0, 0, 0])
        for (pid, api, d), v in t.items():
            for i in range(3):
                out[(pid, api, "h2h" if d == "default" else d)][i] += v[i]
        return {k: tuple(v) for k, v in out.items()}

    assert unified_as_h2h(observed_totals(doc)) == unified_as_h2h(truth_totals(lines))
    a = doc["agent"]
    assert a["dropped"] > 0, "the 4 KiB ring never filled: the test proves nothing"
    unknown = sum(r["calls"] for r in doc["memcpy"] if r["host_memory"] == "unknown")
    # Every call whose record the ring could not take is counted, and only those.
    assert a["calls_without_event"] == 12000 - a["events"]
    assert unknown >= a["calls_without_event"]  # each lost call is reported, its host memory unknown
    # `dropped` counts records: a batch call is one record per copy (up to
    # MT_BATCH_EACH, then one summed record), so it drops more than it has calls.
    assert a["dropped"] >= a["calls_without_event"]


def test_soak_memory_and_kernel_maps_stay_flat(fakecuda: Path, tmp_path: Path) -> None:
    vm = VictoriaMetrics(tmp_path)
    push = start_push(["--endpoint", vm.otlp, "--interval", "0.5"])
    try:
        w = subprocess.Popen(
            [str(fakecuda / "workload"), "-n", "4000", "-p", "2000", "-t", "2", "-e"],
            env={"WORKLOAD_TRUTH": "/dev/null"},
        )
        rss = []
        while w.poll() is None:
            rss.append(rss_kib(push.pid))
            time.sleep(1)
        assert w.returncode == 0
        maps = subprocess.run(["bpftool", "map", "show", "-j"], capture_output=True, text=True).stdout
        rc, _, err = stop_push(push)
        assert rc == 0, err
    finally:
        if push.poll() is None:
            push.kill()
        vm.stop()
    assert len(rss) >= 6, "the soak was too short to say anything"
    warm = rss[2:]
    assert max(warm) - min(warm) < 16 * 1024, rss  # flat within 16 MiB after warm-up
    assert "inflight" in maps


@pytest.mark.parametrize("name", ["we ird\nname\x01", "ünïcødé-jöb", "x" * 250])
def test_odd_process_names_cannot_break_the_exporter(name: str, fakecuda: Path, tmp_path: Path) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / name
    shutil.copy(fakecuda / "workload_driver", exe)
    (d / "lib").symlink_to(fakecuda / "lib")
    vm = VictoriaMetrics(tmp_path)
    push = start_push(["--endpoint", vm.otlp, "--interval", "0.5"])
    try:
        truth = tmp_path / "truth.jsonl"
        subprocess.run([str(exe), "-n", "200", "-p", "3000"], env={"WORKLOAD_TRUTH": str(truth)}, check=True)
        lines = [json.loads(l) for l in truth.read_text().splitlines()]
        want = by_direction(lines)
        assert wait_for(lambda: backend_by_direction(vm, [lines[0]["pid"]]), want) == want
        series = vm.query(f'gpu_memcpy_calls_total{{process_pid="{lines[0]["pid"]}"}}')
        label = series[0]["metric"]["process_executable_name"]
        assert label.isprintable() and len(label) <= 128
        assert stop_push(push)[0] == 0
    finally:
        if push.poll() is None:
            push.kill()
        vm.stop()


def test_tls_is_verified_by_default_and_a_given_ca_is_trusted(fakecuda: Path, tmp_path: Path) -> None:
    key, crt = tmp_path / "key.pem", tmp_path / "crt.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    handler = type("Ok", (Misbehaving,), {"mode": "ok"})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{srv.server_port}"
    try:
        untrusted = start_push(["--endpoint", url, "--interval", "0.3"], env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1000"})
        time.sleep(2)
        _, _, err = stop_push(untrusted)
        assert re.search(r"push to \S+ failed:.*(CERTIFICATE_VERIFY_FAILED|certificate|SSL)", err), err
        trusted = start_push(
            ["--endpoint", url, "--interval", "0.3"],
            env={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(crt), "OTEL_EXPORTER_OTLP_TIMEOUT": "1000"},
        )
        time.sleep(2)
        _, _, err = stop_push(trusted)
        assert "failed" not in err, err
    finally:
        srv.shutdown()


def test_no_listening_socket_while_running_a_command(fakecuda: Path, tmp_path: Path) -> None:
    from conftest import memtrace_cmd

    p = subprocess.Popen(
        [*memtrace_cmd(), "run", "--", str(fakecuda / "workload"), "-n", "2000", "-p", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "WORKLOAD_TRUTH": "/dev/null"},
    )
    time.sleep(1.5)
    try:
        assert p.poll() is None
        assert listening_sockets(p.pid) == []
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


# The reads of the Python frame walk (bpf/pystack.bpf.h: py_word, take_python,
# py_str, keep_code): each by name, so that a new read fails the test below.
PYTHON_READS = {
    ("&v", "sizeof(v)", "(void *)(base + off))"),
    # a remembered thread state's first bytes (its id, its neighbour, its frame)
    ("x->win", "py->tstate_size", "(void *)ts)"),
    # a frame, or (3.11+) its page up to its end, where its callers' frames lie
    ("x->win", "len", "(void *)base)"),
    ("&len", "sizeof(len)", "(void *)(str + 16))"),
    ("&state", "sizeof(state)", "(void *)(str + 32))"),
    ("dst", "n & (2 * MT_PY_FILE_LEN - 1)", "(void *)(str + skip))"),
    ("&c->firstlineno", "sizeof(c->firstlineno)", "(void *)(code + py->code_firstlineno)"),
    ("&n", "sizeof(n)", "(void *)(table + 16)) && n <= (1 << 24)"),
    ("c->table", "n & (2 * MT_PY_TABLE_LEN - 1)", "(void *)(table + 32))"),
}


def test_bpf_reads_only_arguments_and_descriptors() -> None:
    """Every user-memory read in the BPF source is at an argument slot, a
    copy descriptor, a batch copy's pointer and size arrays or operations, a launch
    config's stream, the return
    address at a call's entry (for its stack), or the interpreter's own
    state (for Python frames): never the memory being copied."""
    bpf = Path(__file__).parent.parent / "bpf"
    # The CUDA sensor's program and every header it includes (one per concern).
    text = "\n".join(f.read_text() for f in sorted([bpf / "memtrace.bpf.c", *bpf.glob("*.h")]))
    reads = re.findall(r"bpf_probe_read_user\(([^;]*)\);?", text)
    assert reads
    for r in reads:
        dst, size, src = (x.strip() for x in r.split(",", 2))
        if re.fullmatch(r"MT_(M2D|M3D|P3D)_SIZE", size):
            # a copy descriptor (CUDA_MEMCPY2D/3D, cudaMemcpy3DParms), named by an argument
            assert dst == "&d" and "arg_at(a, n)" in src, r
        elif re.search(r"\b(dsts|srcs|sizes) \+ 8 \*", src):
            # a batch copy's argument arrays (one 8-byte pointer or size per
            # copy; the sizes a chunk of them at once): descriptors, named by
            # the call's arguments, never the memory they point at
            assert re.fullmatch(r"sizeof\((d|s|sz|chunk)\)", size), r
            assert (size == "sizeof(chunk)") == src.startswith("(void *)(sizes + 8 * base)"), r
        elif size == "MT_B3D_READ":
            # a 3D batch's operation (its operands and extent, up to the extent's end; into a per-CPU
            # buffer), one per copy in the operations array the call names: a descriptor, never the
            # memory its operands point at
            assert dst == "op" and re.match(r"\(void \*\)\(ops \+ MT_B3D_OP_SIZE \* i\)\)", src), r
        elif size == "sizeof(ret)":
            # the return address at the stack pointer, at a function's entry (x86-64): the caller's frame
            assert (dst, src) == ("&ret", "(void *)PT_REGS_SP(ctx)"), r
        elif src.startswith("(void *)(v + MT_LCFG_STREAM_OFF)"):
            # cuLaunchKernelEx's CUlaunchConfig, named by its argument: a descriptor; its stream
            # handle alone, 8 bytes
            assert (dst, size) == ("&stream", "sizeof(stream)"), r
        elif (dst, size, src) in PYTHON_READS:
            # the interpreter's own state (thread states, frames, code objects and their
            # names and line tables), at offsets user space gave: never the call's arguments
            pass
        else:
            # 8 bytes: a stack argument, or what an allocation wrote to its output argument
            assert re.fullmatch(r"sizeof\((v|dst|aux)\)", size), r
            assert "a->sp" in src or src in ("(void *)f->src", "(void *)f->stream"), r
    # the only array read whole is a chunk of the sizes array, of 8-byte sizes
    assert re.search(r"__u64 [^;]*\bchunk\[BATCH_CHUNK\];", text), "chunk must stay an array of 8-byte sizes"
    assert "bpf_probe_read_user_str" not in text


def test_container_paths_never_lead_out_of_the_container(fakecuda: Path, tmp_path: Path) -> None:
    """Inside a mount namespace the runtime is a symlink to an absolute path
    that, seen from the host, is a decoy (the driver library). memtrace
    resolves the file the process really mapped (through /proc/PID/map_files
    and /proc/PID/fd), never the path: exact totals prove it."""
    real = tmp_path / "real"  # a private tmpfs inside the namespace; the decoy outside
    real.mkdir()
    shutil.copy(fakecuda / "lib" / "libcuda.so.1", real / "libcudart.so.13.0.0")  # the decoy, host side
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(fakecuda / "lib" / "libcudart.so.13", src / "libcudart.so.13.0.0")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcudart.so.13").symlink_to(real / "libcudart.so.13.0.0")
    shutil.copy(fakecuda / "lib" / "libcuda.so.1", lib / "libcuda.so.1")
    script = (
        f"mount -t tmpfs none {real} && cp {src}/libcudart.so.13.0.0 {real}/ && "
        f"exec {sys.executable} {FIXTURES / 'ctypes_workload.py'} {lib} --calls 500"
    )
    doc, lines, p = run_traced(["unshare", "-m", "--propagation", "private", "sh", "-c", script], tmp_path)
    assert p.returncode == 0, p.stderr
    assert observed_totals(doc) == truth_totals(lines)
    layers = {l["layer"] for l in doc["agent"]["libraries"]}
    assert layers == {"runtime", "driver"}
