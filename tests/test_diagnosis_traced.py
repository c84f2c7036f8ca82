"""Diagnosis end to end: `memtrace run` around a training-like job
(tests/fixtures/trainjob.c) into which a fault is scripted part-way, through
the real kernel (uprobes, the sched sensor), the test NVML and the
emulated PCIe link of the test driver. Each fault must be diagnosed with
its cause after its onset; a healthy run must get no diagnosis and no
finding. Not timed: bench/diagnose/run.py measures latency and accuracy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import memtrace_cmd
from test_nvml import HEALTHY, gpu, script

pytestmark = pytest.mark.bpf

CPU = str((os.cpu_count() or 1) - 1)
SECONDS = 9.0
FAULT_AT = 4.5  # after the job started: a baseline of a few seconds first


def nvml(**over: object) -> str:
    """The test NVML's script: one healthy GPU (tests/test_nvml.py's), with `over` changed."""
    return script(count=1, **gpu(0, uuid="GPU-diag", **{**HEALTHY, **over}))


def scenario(
    fakecuda: Path,
    fakenvml: Path,
    tmp_path: Path,
    fault: Callable[[dict[str, Path]], object] | None,
    *job_args: str,
    link_counted: bool = False,
) -> tuple[dict[str, Any], int, int]:
    """Run the job under memtrace for SECONDS, calling fault(paths) at FAULT_AT;
    returns (summary, the job's pid, the fault's onset in wall-clock ns).
    link_counted: the emulated link counts its bytes, and the test NVML's
    driver answers its PCIe byte counters from them."""
    paths = {"link": tmp_path / "pcie", "control": tmp_path / "control", "nvml": tmp_path / "nvml.script"}
    counts = bytes(16) if link_counted else b""
    paths["link"].write_bytes((0).to_bytes(8, "little") + (4 << 30).to_bytes(8, "little") + counts)
    paths["control"].write_text("gpu=1 loader=1\n")
    paths["nvml"].write_text(nvml(**({"pcie_link": paths["link"]} if link_counted else {})))
    out, truth = tmp_path / "summary.json", tmp_path / "truth.jsonl"
    env = dict(
        os.environ,
        FAKE_PCIE=str(paths["link"]),
        TRAINJOB_CONTROL=str(paths["control"]),
        LD_LIBRARY_PATH=str(fakenvml),
        FAKE_NVML_SCRIPT=str(paths["nvml"]),
        WORKLOAD_TRUTH=str(truth),
    )
    job = ["taskset", "-c", CPU, str(fakecuda / "trainjob"), "-t", str(SECONDS), "-L", "3000000", "-w", "1500000"]
    job += job_args
    # The agent on another CPU than the job's, so that its own work is not a noisy neighbour.
    agent_cpu = ["taskset", "-c", "0"] if CPU != "0" else []
    log = tmp_path / "agent.log"
    p = started([*agent_cpu, *memtrace_cmd(), "run", "-v", "--format", "json", "-o", str(out), "--", *job], env, log)
    wait_for_job(p.pid)
    time.sleep(FAULT_AT)
    onset = time.time_ns()
    undo = fault(paths) if fault is not None else None
    try:
        p.wait(timeout=SECONDS * 4 + 60)
        err = log.read_text()
    finally:
        if isinstance(undo, subprocess.Popen):
            undo.send_signal(signal.SIGKILL)
            undo.wait()
    assert p.returncode == 0, err
    (line,) = truth.read_text().splitlines()
    return json.loads(out.read_text()), json.loads(line)["pid"], onset


def started(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`memtrace run` with its stderr in a file. Not a pipe read at the end: -v writes libbpf's
    lines, more for every process on the host with CUDA mapped, and a pipe nobody reads yet
    fills and stops the agent before it starts the job."""
    with log.open("wb") as f:
        return subprocess.Popen(argv, env=env, stderr=f)


def wait_for_job(parent: int, timeout: float = 60, comm: str = "trainjob") -> int:
    """The pid of the job's process (trainjob, or comm) once it runs (a child of `parent`, or
    `parent` itself): it has used CPU time, so it is past any hold while its
    CUDA libraries were attached (which can last seconds while an earlier
    agent's probes are still being removed), and the fault comes after a
    baseline of the job really running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in [parent, *_children(parent)]:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != comm:
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[11]) + int(fields[12]) >= 5:  # utime + stime, in clock ticks (50 ms)
                    return pid
            except (OSError, IndexError, ValueError):
                pass
        time.sleep(0.02)
    raise AssertionError("the job never started")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _ran_as_rank(pid: int, control: Path) -> bool:
    """A trainjob process with this control file, that has run (used 50 ms of CPU)."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != "trainjob":
            return False
        if f"TRAINJOB_CONTROL={control}".encode() not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return False
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]) >= 5
    except (OSError, IndexError, ValueError):
        return False


def replace_file(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def diagnosed(doc: dict[str, Any], pid: int) -> list[dict[str, Any]]:
    return [d for d in doc["diagnoses"] if d["pid"] == pid]


def test_a_healthy_job_gets_no_diagnosis_and_no_finding(fakecuda: Path, fakenvml: Path, tmp_path: Path) -> None:
    doc, pid, _ = scenario(fakecuda, fakenvml, tmp_path, None)
    assert [s for s in doc["steps"] if s["pid"] == pid][0]["steps"] > 100
    # What memtrace's own probes cost the job (a trap is ~10 us on a small VM)
    # is not a fault of the job: that finding is tests/test_overhead.py's.
    about_the_job = [f for f in doc["findings"] if f["code"] != "overhead_budget_exceeded"]
    assert doc["diagnoses"] == [] and about_the_job == [], (doc["diagnoses"], doc["findings"])


def test_thermal_throttling_is_diagnosed_as_gpu_throttling(fakecuda: Path, fakenvml: Path, tmp_path: Path) -> None:
    def throttle(paths: dict[str, Path]) -> None:
        replace_file(paths["nvml"], nvml(reasons=0x20 | 0x40, temp=92))
        paths["control"].write_text("gpu=2.5 loader=1\n")  # what the clocks do to the kernels

    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, throttle)
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "gpu_throttling", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset and d["ratio"] > 1.3
    assert "hw_thermal_slowdown" in d["evidence"]["clock_event_reasons"]


def test_a_cpu_hog_on_the_jobs_cpu_is_diagnosed_as_cpu_interference(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    def hog(_paths: dict[str, Path]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["taskset", "-c", CPU, sys.executable, "-c", "while True: pass"])

    # A CPU-bound step (short kernels): the hog takes half of what the job needs.
    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, hog, "-k", "300")
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "cpu_interference", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset
    assert d["evidence"]["run_queue_share"] > d["evidence"]["run_queue_share_before"]
    who = d["evidence"].get("taken_by")
    assert isinstance(who, dict) and "python" in who["process"], d["evidence"]  # the hog, by its command name
    assert d["evidence"]["taken_by"]["memtrace"] is False


def test_a_narrower_pcie_link_is_diagnosed_as_pcie_contention(fakecuda: Path, fakenvml: Path, tmp_path: Path) -> None:
    def degrade(paths: dict[str, Path]) -> None:
        replace_file(paths["nvml"], nvml(link_width=4))
        with open(paths["link"], "r+b") as f:
            f.seek(8)
            f.write((256 << 20).to_bytes(8, "little"))  # the link at a sixteenth of its rate

    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, degrade)
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "pcie_contention", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset and d["evidence"]["link"] == "gen5 x4"


def test_a_copier_memtrace_does_not_trace_is_pcie_contention_by_the_drivers_counters(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    """A copier outside `memtrace run`'s command (another container, another user's job) floods
    the job's emulated PCIe link: memtrace never sees its calls, only the link's bytes as the
    test NVML's driver counts them, past every copy it traced."""
    copier: list[subprocess.Popen[bytes]] = []

    def flood(paths: dict[str, Path]) -> subprocess.Popen[bytes]:
        argv = [str(fakecuda / "trainjob"), "-t", str(SECONDS), "-L", "0", "-w", "0", "-k", "0", "-c", "16"]
        env = dict(os.environ, FAKE_PCIE=str(paths["link"]), WORKLOAD_TRUTH="/dev/null")
        copier.append(subprocess.Popen([*argv, "-b", str(8 << 20)], env=env))
        return copier[0]

    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, flood, link_counted=True)
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "pcie_contention", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset
    ev = d["evidence"]
    assert ev["other_processes_copy_bytes_per_second"] == 0  # the copier is not traced
    assert ev["untraced_pcie_bytes_per_second"] > ev["untraced_pcie_bytes_per_second_before"], ev
    assert {r["pid"] for r in doc["memcpy"]} == {pid}, "memtrace traced the copier"
    (g,) = doc["host"]["gpus"]
    assert g["pcie_throughput_from"] == "byte_counters" and g["pcie_rx_bytes"] > 0


def test_a_slower_data_pipeline_is_diagnosed_as_input_starvation(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    def slow_loader(paths: dict[str, Path]) -> None:
        paths["control"].write_text("gpu=1 loader=4\n")

    doc, pid, onset = scenario(fakecuda, fakenvml, tmp_path, slow_loader)
    (d, *_) = diagnosed(doc, pid)
    assert d["cause"] == "input_starvation", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset
    assert d["evidence"]["gpu_idle_share"] > d["evidence"]["gpu_idle_share_before"]


def test_push_sends_a_diagnosis_as_an_otlp_event_through_the_collector(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    """`memtrace push` host-wide: the job throttles part-way; the diagnosis
    goes out as a log record (event memtrace.diagnosis) through the real
    collector's logs pipeline (deploy/otelcol/agent.yaml), and is counted in
    memtrace.diagnoses{cause} in the metrics backend."""
    from backends import Collector, OtlpLogSink, VictoriaMetrics
    from conftest import REPO
    from test_push import start_push, stop_push, wait_for

    vm = VictoriaMetrics(tmp_path)
    sink = OtlpLogSink()
    col = Collector(
        tmp_path,
        REPO / "deploy" / "otelcol" / "agent.yaml",
        {"MEMTRACE_EXPORT_ENDPOINT": vm.otlp, "MEMTRACE_LOGS_ENDPOINT": sink.endpoint},
    )
    script_path, control = tmp_path / "nvml.script", tmp_path / "control"
    script_path.write_text(nvml())
    control.write_text("gpu=1 loader=1\n")
    push = start_push(
        ["--endpoint", f"http://127.0.0.1:{col.http_port}", "--interval", "1"],
        env={"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(script_path)},
    )
    try:
        job = subprocess.Popen(
            ["taskset", "-c", CPU, str(fakecuda / "trainjob"), "-t", str(SECONDS), "-L", "3000000", "-w", "1500000"],
            env={"TRAINJOB_CONTROL": str(control), "WORKLOAD_TRUTH": "/dev/null"},
        )
        wait_for_job(job.pid)
        time.sleep(FAULT_AT)
        replace_file(script_path, nvml(reasons=0x20 | 0x40, temp=92))
        control.write_text("gpu=2.5 loader=1\n")
        assert job.wait(timeout=SECONDS * 4 + 60) == 0

        def events() -> list[dict[str, Any]]:
            return [r for r in sink.records if r["event_name"] == "memtrace.diagnosis"]

        assert wait_for(lambda: bool(events()), True, timeout=30), col.log_path.read_text()[-2000:]
        # The job's events: the throttling must be among them. (On a loaded machine the agent has
        # diagnosed an earlier wobble of the job as `unknown` too; a re-named diagnosis is sent again.)
        mine = [r for r in events() if r["attributes"]["process.pid"] == job.pid]
        named = [r for r in mine if r["attributes"]["memtrace.cause"] == "gpu_throttling"]
        if not named:

            def throttled() -> list[dict[str, Any]]:
                return [
                    r
                    for r in events()
                    if r["attributes"]["process.pid"] == job.pid
                    and r["attributes"]["memtrace.cause"] == "gpu_throttling"
                ]

            said = [(r["attributes"]["process.pid"], r["attributes"]["memtrace.cause"], r["body"]) for r in events()]
            assert wait_for(lambda: bool(throttled()), True, timeout=15), (job.pid, said)
            named = throttled()
        e = named[0]
        assert e["body"].startswith("step time") and e["severity"] == "WARN"
        assert "hw_thermal_slowdown" in e["attributes"]["memtrace.evidence.clock_event_reasons"]
        assert e["attributes"]["process.executable.name"] == "trainjob" and e["resource"]["service.name"] == "memtrace"
        sel = f'process_pid="{job.pid}",cause="gpu_throttling"'
        counted = lambda: bool(vm.query(f"memtrace_diagnoses_total{{{sel}}}"))  # noqa: E731
        assert wait_for(counted, True, timeout=30)
        rc, _, err = stop_push(push)
        assert rc == 0, err
    finally:
        if push.poll() is None:
            push.kill()
        col.stop()
        sink.stop()
        vm.stop()


def test_a_slow_rank_is_diagnosed_as_a_straggler_and_its_peers_wait_for_it(
    fakecuda: Path, fakenvml: Path, tmp_path: Path
) -> None:
    """A data-parallel job of three ranks that all-reduce through the test
    NCCL every step; its barrier holds each rank's next wait until all have
    arrived (NCCL returns at once; the ranks wait in the synchronisation
    after). Part-way, rank 0's loading does 4x the work: it is the straggler,
    and its peers, if diagnosed, wait for it. Every all-reduce is counted."""
    (tmp_path / "barrier").write_bytes(bytes(8))
    out, truth = tmp_path / "summary.json", tmp_path / "truth.jsonl"
    ranks = []
    for r in range(3):
        (tmp_path / f"control{r}").write_text("gpu=1 loader=1\n")
        ranks.append(
            f"env TRAINJOB_CONTROL={tmp_path / f'control{r}'} {fakecuda / 'trainjob'} -t {SECONDS} "
            f"-L 3000000 -w 1000000 -k 2000 -c 2 -b {1 << 20} -a {4 << 20} &"
        )
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=f"{fakenvml}:{fakecuda / 'nccl'}",
        FAKE_NVML_SCRIPT=str(tmp_path / "nvml.script"),
        FAKE_NCCL_BARRIER=str(tmp_path / "barrier"),
        FAKE_NCCL_RANKS="3",
        WORKLOAD_TRUTH=str(truth),
    )
    (tmp_path / "nvml.script").write_text(nvml())
    log = tmp_path / "agent.log"
    argv = [*memtrace_cmd(), "run", "--format", "json", "-o", str(out), "--", "sh", "-c", " ".join(ranks) + " wait"]
    p = started(argv, env, log)
    slow = None
    deadline = time.monotonic() + 60
    while slow is None and time.monotonic() < deadline:
        slow = next((pid for pid in _descendants(p.pid) if _ran_as_rank(pid, tmp_path / "control0")), None)
        time.sleep(0.02)
    assert slow is not None, "rank 0 never started"
    time.sleep(FAULT_AT)
    onset = time.time_ns()
    (tmp_path / "control0").write_text("gpu=1 loader=4\n")
    p.wait(timeout=SECONDS * 4 + 60)
    assert p.returncode == 0, log.read_text()
    doc = json.loads(out.read_text())
    steps = {x["pid"]: x["steps"] for x in map(json.loads, truth.read_text().splitlines())}
    assert slow in steps and len(steps) == 3
    # Exact: one all-reduce of 4 MiB a step, every rank.
    reduces = {c["pid"]: c for c in doc["collectives"] if c["collective"] == "all_reduce"}
    assert {pid: c["calls"] for pid, c in reduces.items()} == steps
    assert all(c["bytes"] == (4 << 20) * steps[pid] for pid, c in reduces.items())
    (d, *_) = diagnosed(doc, slow)
    assert d["cause"] == "straggler", doc["diagnoses"]
    assert d["detected_time_unix_nano"] >= onset
    assert d["evidence"]["peers_collective_share"] > d["evidence"]["collective_share"]
    for peer in set(steps) - {slow}:
        for x in diagnosed(doc, peer):  # a peer that slowed waits for the straggler
            assert x["cause"] == "straggler" and x["evidence"]["waits_for_pid"] == slow, x


# ---- a server: judged per unit of work ----

SERVER_SECONDS = 14.0
SERVER_FAULT_AT = 7.0  # its classes of work and a baseline of them first


def served(fakecuda: Path, tmp_path: Path, fault: bool, *args: str) -> tuple[dict[str, Any], int, str]:
    """An inference server from the zoo (random arrivals, batches as they come, 1 ms of host work
    per request in each iteration) under `memtrace run -v` for SERVER_SECONDS, with a CPU hog on
    its CPU from SERVER_FAULT_AT if `fault`; returns (summary, the server's pid, the engine's
    judgement of each of its windows, from the log: what a failure shows)."""
    out, truth = tmp_path / "summary.json", tmp_path / "truth.jsonl"
    rate = 200
    job = ["taskset", "-c", CPU, str(fakecuda / "zoo" / "server"), "-R", str(rate), "-c", "1000", "-B", "16"]
    job += ["-r", str(int(rate * SERVER_SECONDS)), *args]
    agent_cpu = ["taskset", "-c", "0"] if CPU != "0" else []
    log = tmp_path / "agent.log"
    argv = [*agent_cpu, *memtrace_cmd(), "run", "-v", "--format", "json", "-o", str(out), "--", *job]
    p = started(argv, dict(os.environ, WORKLOAD_TRUTH=str(truth)), log)
    wait_for_job(p.pid, comm="server")
    hog = None
    if fault:
        time.sleep(SERVER_FAULT_AT)
        hog = subprocess.Popen(["taskset", "-c", CPU, sys.executable, "-c", "while True: pass"])
    try:
        p.wait(timeout=SERVER_SECONDS * 4 + 60)
        err = log.read_text()
    finally:
        if hog is not None:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
    assert p.returncode == 0, err
    (line,) = truth.read_text().splitlines()
    pid = json.loads(line)["pid"]
    windows = "\n".join(x for x in err.splitlines() if f"diagnosis window: pid {pid} " in x)
    return json.loads(out.read_text()), pid, windows


def test_a_cpu_hog_on_a_servers_cpu_is_diagnosed_per_unit_of_work(fakecuda: Path, tmp_path: Path) -> None:
    """An inference server has no training steps: its iterations follow its load. A CPU hog on
    its CPU stretches the same work: diagnosed as cpu_interference, its symptom per iteration
    at equal work. (A load that triples or falls, traced, is not here: in a full CI run the
    server's own time per class of work rose 1.3x for 3.5 s before the change, with no host
    signal, and was told `unknown`; the engine's tests hold load changes,
    tests/test_diagnosis.py.)"""
    doc, pid, windows = served(fakecuda, tmp_path, True)
    (row,) = [r for r in doc["steps"] if r["pid"] == pid]
    assert row["loop"] == "serving"
    (d, *_) = diagnosed(doc, pid) or [None]
    assert d is not None and d["cause"] == "cpu_interference", (doc["diagnoses"], windows)
    assert d["evidence"]["unit"] == "iteration" and "at equal work" in d["symptom"]
    # Who held its CPU: the hog, whether it preempted the server or held the CPU while the
    # server, woken by a request, waited (bpf/sched.bpf.c charges both).
    who = d["evidence"].get("taken_by")
    assert isinstance(who, dict) and "python" in who["process"], (d["evidence"], windows)
