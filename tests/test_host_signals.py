"""`memtrace run`'s host signals end to end: the summary's `host` section
against what the traced command itself knows (its own context switches and
CPU time), against the kernel's own counters of a veth pair between two
network namespaces the test makes, and against the scripted test NVML
(tests/fixtures/nvml.c) that the command changes mid-run."""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import memtrace_cmd
from test_netdev import CLIENT, SERVER, Pair, pair  # noqa: F401 - the fixture, used by name
from test_nvml import HEALTHY, gpu, script

from memtrace.core.ids import ProcessKey

pytestmark = pytest.mark.bpf

GIB = 1 << 30


def run(
    argv: list[str],
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    prefix: list[str] = (),
    opts: list[str] = (),
) -> dict[str, Any]:
    out = tmp_path / "summary.json"
    p = subprocess.run(
        [*prefix, *memtrace_cmd(), "run", *opts, "--format", "json", "-o", str(out), "--", *argv],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


SLEEPER = textwrap.dedent(
    """
    import json, os, sys, time
    c0 = time.process_time_ns()
    def switches():
        st = dict(l.split(":\\t") for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
        return int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"])
    v0, i0 = switches()  # since the fork: memtrace's child waiting at its gate, then the exec
    for _ in range(int(sys.argv[1])):
        time.sleep(0.01)
    t = time.process_time_ns()
    while time.process_time_ns() - t < 200_000_000:  # 200 ms on CPU
        pass
    v, i = switches()
    print(json.dumps({"pid": os.getpid(), "voluntary": v, "involuntary": i, "voluntary_here": v - v0,
                      "involuntary_here": i - i0, "cpu_ns": time.process_time_ns(), "cpu_ns_at_start": c0}),
          file=sys.stderr, flush=True)
    os._exit(0)  # no interpreter teardown after the last read: only the write and the exit follow it
    """
)


def test_run_reports_the_cpu_its_command_got(tmp_path: Path) -> None:
    truth_file = tmp_path / "truth.json"
    doc = run(["sh", "-c", f'exec {sys.executable} -c "$0" 100 2>{truth_file}', SLEEPER], tmp_path)
    truth = json.loads(truth_file.read_text())
    host = doc["host"]
    assert host["sensors"]["cpu"] == {"state": "on"}
    (row,) = [r for r in host["cpu"] if r["pid"] == truth["pid"]]
    report = {"row": row, "truth": truth, "cpu_sensor": host["cpu_sensor"]}
    # Traced from before its first instruction (the gate) to its exit: at
    # least the switches it made while its script ran, at most the kernel's
    # count since the fork (memtrace's child before the gate opened may be
    # preempted before the sensor is told its pid: CI saw that once) and a
    # few after its last read: a last block flushing stderr, and its exit
    # waking the agent's threads (the parent's wait, the control ring's exit
    # notice), which preempt it where they share its CPU (two more, every
    # time, with the test pinned to one CPU).
    # A switch the kernel's tracepoint never delivered (a VM showed a few, to
    # perf as well) is still counted, from the thread's own counts.
    for kind in ("voluntary", "involuntary"):
        assert truth[f"{kind}_here"] <= row[f"{kind}_switches"] <= truth[kind] + 3, report
    # The hundred sleeps at least, as intervals, but for those that began at a
    # switch never delivered (counted: their time is in the total only).
    assert row["off_cpu_us"]["count"] >= 100 - host["cpu_sensor"]["switch_gaps"], report
    # 200 ms of spinning and the interpreter's start are on CPU: the CPU time
    # the script measured from its first line bounds the sensor's from below
    # (not the process's total: its first milliseconds, memtrace's forked
    # child before the gate opened, are not the command's).
    assert row["on_cpu_seconds"] * 1e9 >= truth["cpu_ns"] - truth["cpu_ns_at_start"], report
    assert row["on_cpu_seconds"] >= 0.2, report
    alive = row["on_cpu_seconds"] + row["off_cpu_seconds"] + row["run_queue_seconds"]
    assert alive <= doc["command"]["wall_seconds"] + 0.05, report


def test_run_reports_the_traffic_of_its_network_namespace_exactly(pair: Pair, tmp_path: Path) -> None:  # noqa: F811
    """memtrace runs inside namespace a (its own namespace is always sampled,
    from before the command starts until after it exits), the command sends
    a known payload to a server in namespace b: the veth's counters over the
    run are the kernel's, read by the test before and after."""
    server = pair.run(pair.b, SERVER, "tcp", "5201")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    try:
        before = pair.sysfs(pair.a, pair.va)
        payload = 3 << 20
        doc = run(
            [sys.executable, "-c", CLIENT, "tcp", pair.ip_b, "5201", str(payload), "65536"],
            tmp_path,
            prefix=["ip", "netns", "exec", pair.a],
        )
        after = pair.sysfs(pair.a, pair.va)
        assert server.stdin is not None
        server.stdin.close()
        assert int(server.stdout.readline()) == payload
    finally:
        server.kill()
        server.wait()
    net = doc["host"]["network"]
    assert doc["host"]["sensors"]["network"] == {"state": "on"}
    (veth,) = [i for i in net["interfaces"] if i["interface"] == pair.va]
    assert veth["host_namespace"] is True  # memtrace's own namespace: a
    for counter in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets", "tx_dropped", "rx_dropped"):
        assert veth[counter] == after[counter] - before[counter], (counter, veth, before, after)
    assert veth["tx_bytes"] > payload  # the payload and its headers
    # The fast sampler read the counters at 100 Hz: the busiest tick ran at the tbf's rate, far above
    # the mean over the run (the command's start and exit were quiet).
    assert doc["host"]["fast_sampler"]["state"] == "on" and doc["host"]["fast_sampler"]["ticks"] > 0
    assert veth["peak_tx_bytes_per_second"] > veth["tx_bytes_per_second"] > 0, veth
    (tbf,) = [q for q in net["qdiscs"] if q["interface"] == pair.va and q["kind"] == "tbf"]
    assert tbf["bytes"] >= payload and tbf["overlimits"] > 0  # 3 MiB through a 50 Mbit/s bucket waits


TEN_HZ = ["--host-interval", "0.1"]  # samples 0.6 s apart hold several each
GPU_SCRIPT = """
import os, sys, time
time.sleep(0.6)
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(sys.argv[2].replace("PID", str(os.getpid())))
os.rename(tmp, sys.argv[1])
time.sleep(0.6)
"""


def test_run_reports_the_gpus_as_nvml_gave_them(tmp_path: Path, fakenvml: Path) -> None:
    """Healthy, then (the command rewrites the test NVML's script) replays,
    an x8 link, thermal and power throttling, XIDs and the command's own
    GPU memory: every figure is the scripted one."""
    nvml_script = tmp_path / "nvml.script"
    counters = {"pcie_tx_count": 10**12, "pcie_rx_count": 0}  # the driver counts PCIe bytes
    nvml_script.write_text(script(count=1, driver="580.65.06", **gpu(0, uuid="GPU-aaaa", **HEALTHY, **counters)))
    faulty = script(
        count=1,
        driver="580.65.06",
        **gpu(
            0,
            uuid="GPU-aaaa",
            **{**HEALTHY, "replay": 7 + 130, "link_width": 8, "reasons": 0x20 | 0x4, "temp": 88},
            xids="79,48",
            procs=f"PID:{3 * GIB}",
            pcie_tx_count=10**12 + 3 * GIB,
            pcie_rx_count=5 * GIB + 1,
        ),
    )
    env = {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(nvml_script)}
    doc = run([sys.executable, "-c", GPU_SCRIPT, str(nvml_script), faulty], tmp_path, env=env, opts=TEN_HZ)
    host = doc["host"]
    assert host["sensors"]["gpu"] == {"state": "on"}
    assert host["nvidia_driver"] == "580.65.06"
    (g,) = host["gpus"]
    assert (g["index"], g["uuid"], g["name"], g["bus_id"]) == (0, "GPU-aaaa", HEALTHY["name"], HEALTHY["bus"])
    assert g["lost_samples"] == 0 and g["samples"] >= 10  # 1.2 s at 10 Hz, and a last one
    assert g["sm_utilization_percent"] == {"mean": 97.0, "max": 97.0}
    assert g["temperature_celsius"]["max"] == 88.0 and g["temperature_celsius"]["mean"] < 88
    assert g["power_watts"]["max"] == pytest.approx(412.345)
    assert g["memory_used_bytes"]["max"] == 20 * GIB and g["memory_total_bytes"] == 80 * GIB
    assert g["pcie_replays"] == 130
    # The bytes between the first and last samples, exactly; the busiest interval above the mean.
    assert g["pcie_throughput_from"] == "byte_counters" and g["pcie_counter_resets"] == 0
    assert (g["pcie_tx_bytes"], g["pcie_rx_bytes"]) == (3 * GIB, 5 * GIB + 1)
    for d in ("tx", "rx"):
        rate = g[f"pcie_{d}_bytes_per_second"]
        assert rate["max"] > rate["mean"] > 0, rate
    assert g["pcie_link"]["width"] == 8 and g["pcie_link"]["max_width"] == 16
    assert g["pcie_link"]["lowest_seen"] == {"generation": 5, "width": 8}
    assert g["clock_event_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert 0 < g["throttled_share"] < 1
    assert g["xids"] == [79, 48]
    (traced,) = [r["pid"] for r in host["cpu"]]
    assert g["processes"] == [{"pid": traced, "used_memory_bytes": 3 * GIB, "mig_uuid": None, "sm_percent": None}]


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has an NVIDIA driver")
def test_no_driver_turns_the_gpu_signals_off_and_says_why(tmp_path: Path) -> None:
    doc = run(["true"], tmp_path, env={"LD_LIBRARY_PATH": str(tmp_path)})
    gpu_state = doc["host"]["sensors"]["gpu"]
    assert gpu_state["state"] == "off" and "libnvidia-ml.so.1" in gpu_state["reason"] and gpu_state["fix"]
    assert doc["host"]["gpus"] == [] and doc["host"]["sensors"]["cpu"] == {"state": "on"}


def test_no_host_leaves_the_section_out(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--no-host", "--format", "json", "-o", str(out), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["host"] is None and doc["collectives"] == []


def test_host_rate_zero_reads_in_python_and_says_so(pair: Pair, tmp_path: Path) -> None:  # noqa: F811
    """--host-rate 0: no C thread; the counters are read at each sample, as exact, with no tick peaks."""
    server = pair.run(pair.b, SERVER, "tcp", "5202")
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    try:
        before = pair.sysfs(pair.a, pair.va)
        out = tmp_path / "summary.json"
        client = [sys.executable, "-c", CLIENT, "tcp", pair.ip_b, "5202", str(1 << 20), "65536"]
        p = subprocess.run(
            ["ip", "netns", "exec", pair.a, *memtrace_cmd(), "run", "--host-rate", "0", "--format", "json"]
            + ["-o", str(out), "--", *client],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        after = pair.sysfs(pair.a, pair.va)
    finally:
        server.kill()
        server.wait()
    doc = json.loads(out.read_text())
    fast = doc["host"]["fast_sampler"]
    assert fast["state"] == "off" and "--host-rate 0" in fast["reason"], fast
    (veth,) = [i for i in doc["host"]["network"]["interfaces"] if i["interface"] == pair.va]
    assert veth["tx_bytes"] == after["tx_bytes"] - before["tx_bytes"] > 1 << 20
    assert veth["peak_tx_bytes_per_second"] is None and veth["peak_utilization"] is not None


@pytest.mark.parametrize("value", ["0.5", "-1", "5000"])
def test_a_bad_host_rate_is_refused_with_the_range(value: str) -> None:
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--host-rate", value, "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "--host-rate" in p.stderr and "1 to 1000 Hz" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("value", ["0", "-1", "100"])
def test_a_bad_host_interval_is_refused_with_the_range(value: str) -> None:
    p = subprocess.run(
        [*memtrace_cmd(), "run", "--host-interval", value, "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "--host-interval" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_push_sends_cpu_time_and_gpu_readings(fakecuda: Path, fakenvml: Path, tmp_path: Path) -> None:
    """`memtrace push` (host-wide) with the test NVML: the GPU's readings on
    the agent's resource, and each CUDA process's CPU time and context
    switches on its own, through a real OTLP backend; and every metric the
    shipped Prometheus rules read is one the backend has."""
    from backends import VictoriaMetrics
    from test_push import start_push, stop_push, wait_for
    from test_rules import rule_metrics

    nvml_script = tmp_path / "nvml.script"
    counts = {"pcie_tx_count": 10**12, "pcie_rx_count": 10**9}  # the driver counts PCIe bytes
    hopper = {
        "gpm": 1,
        "gpm_sm": 40,
        "gpm_occupancy": 30,
        "gpm_tensor": 20,
        "gpm_dram": 10,
        "nvlinks": 2,
        "remapped": "0,0,0,0",
    }  # GPM, NVLink and row remapping to read
    clocks = {"clock_sm": 1755, "clock_mem": 2619}  # MHz, as the timeline's tracks and the JSON rows have them
    nvml_script.write_text(script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, **counts, **hopper, **clocks)))
    env = {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(nvml_script)}
    vm = VictoriaMetrics(tmp_path)
    push = start_push(["--endpoint", vm.otlp, "--interval", "0.5", "--host-interval", "0.1"], env=env)
    try:
        w = subprocess.run(
            [str(fakecuda / "workload"), "-n", "400", "-p", "3000", "-t", "1"],
            env={"WORKLOAD_TRUTH": str(tmp_path / "truth.jsonl")},
        )
        assert w.returncode == 0
        (pid,) = {json.loads(l)["pid"] for l in (tmp_path / "truth.jsonl").read_text().splitlines()}
        sel = f'process_pid="{pid}"'

        def one(expr: str) -> float | None:
            r = vm.query(expr)
            return float(r[0]["value"][1]) if r else None

        def types() -> list[str]:
            r = vm.query(f'{{__name__=~"process_context_switches.*",{sel}}}')
            return sorted(x["metric"]["process_context_switch_type"] for x in r)

        assert wait_for(types, ["involuntary", "voluntary"]) == ["involuntary", "voluntary"]
        on_cpu = one(f'{{__name__=~"memtrace_process_on_cpu_time.*",{sel}}}')
        assert on_cpu is not None and on_cpu > 0
        g = 'hw_id="GPU-aaaa"'
        assert wait_for(lambda: one(f'{{__name__=~"hw_gpu_utilization.*",{g}}}'), 0.97) == 0.97
        assert one(f'{{__name__=~"hw_gpu_memory_usage.*",{g}}}') == 20 * GIB
        assert one(f'{{__name__=~"hw_gpu_memory_limit.*",{g}}}') == 80 * GIB
        assert one(f'{{__name__=~"hw_power.*",{g}}}') == pytest.approx(412.345)
        assert one(f'{{__name__=~"memtrace_gpu_pcie_link_width.*",{g}}}') == 16
        assert one(f'{{__name__=~"memtrace_gpu_throttled.*",{g}}}') == 0
        assert one(f'{{__name__=~"memtrace_gpu_pcie_replays.*",{g}}}') == 0
        assert one(f'{{__name__=~"memtrace_gpu_sm_clock.*",{g}}}') == 1755
        assert one(f'{{__name__=~"memtrace_gpu_memory_clock.*",{g}}}') == 2619
        # The GPU moves 7 GiB out and 5 bytes in: hw.gpu.io carries exactly that since the agent started.
        moved = {"pcie_tx_count": 10**12 + 7 * GIB, "pcie_rx_count": 10**9 + 5}
        tmp = nvml_script.with_suffix(".tmp")
        tmp.write_text(script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, **moved)))
        os.replace(tmp, nvml_script)
        io = f'{{__name__=~"hw_gpu_io.*",{g},network_io_direction='
        assert wait_for(lambda: one(io + '"transmit"}'), 7 * GIB) == 7 * GIB
        assert one(io + '"receive"}') == 5
        # A stepping loop and a job with a finding, so that every rule has its input.
        loop = [str(fakecuda / "steploop"), "-n", "200", "-k", "1000", "-w", "1000"]
        subprocess.run(loop, env={"WORKLOAD_TRUTH": "/dev/null"}, check=True)
        subprocess.run([str(fakecuda / "memwork_driver"), "-r", "5"], env={"WORKLOAD_TRUTH": "/dev/null"}, check=True)
        # memtrace_diagnoses_total exists once a slowdown was diagnosed (none in this healthy run).
        for name in sorted(rule_metrics() - {"memtrace_diagnoses_total"}):
            assert wait_for(lambda n=name: bool(vm.query(n)), True), f"the rules read {name}; the backend has none"
        rc, _, err = stop_push(push)
        assert rc == 0, err
    finally:
        if push.poll() is None:
            push.kill()
        vm.stop()


def test_top_detail_shows_step_time_gpu_idle_and_run_queue(fakecuda: Path, tmp_path: Path) -> None:
    """`memtrace top --detail`: a stepping loop's row carries its median step
    time, the GPU's idle share and its run-queue p99 since the last refresh."""
    from conftest import top_once_attached

    # The loop first: top attaches the library it has mapped (its steps from then on count).
    loop = subprocess.Popen(
        [str(fakecuda / "steploop"), "-n", "800", "-k", "2000", "-w", "1000"],
        env={"WORKLOAD_TRUTH": str(tmp_path / "truth.jsonl")},
    )
    top = top_once_attached(fakecuda, 250, refreshes=4, extra=("--detail",))
    try:
        out, err = top.communicate(timeout=90)
    finally:
        loop.wait(timeout=90)
    assert top.returncode == 0, err
    assert loop.returncode == 0
    last = out.split("memtrace top:")[-1]
    assert "step p50" in last and "gpu idle" in last and "runq p99" in last, last
    (line,) = [l for l in last.splitlines() if l.strip().startswith(f"{loop.pid} ")]
    # step p50, gpu idle, runq p99, then what the probes cost the loop (once the trap cost is timed; ! over budget)
    m = re.search(r"(\S+)ms\s+(\d+)%\s+(\S+)ms(?:\s+(\d+\.\d)%!?)?\s*$", line)
    assert m is not None, line
    truth = json.loads((tmp_path / "truth.jsonl").read_text())
    median_ms = statistics.median(truth["step_ns"]) / 1e6
    assert float(m.group(1)) == pytest.approx(median_ms, rel=0.1), (line, median_ms)
    assert 0 <= int(m.group(2)) <= 100 and float(m.group(3)) > 0


def test_a_gpu_that_falls_off_the_bus_mid_run_is_reported_not_raised(tmp_path: Path, fakenvml: Path) -> None:
    nvml_script = tmp_path / "nvml.script"
    nvml_script.write_text(script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY)))
    lost = script(count=1, **gpu(0, uuid="GPU-aaaa", **HEALTHY, lost=1), xids="79")
    env = {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(nvml_script)}
    doc = run([sys.executable, "-c", GPU_SCRIPT, str(nvml_script), lost], tmp_path, env=env, opts=TEN_HZ)
    (g,) = doc["host"]["gpus"]
    assert 0 < g["lost_samples"] < g["samples"]  # healthy for 0.6 s, then lost to the end
    assert doc["host"]["sample_errors"] == 0 and doc["host"]["sensors"]["gpu"] == {"state": "on"}
    assert g["sm_utilization_percent"]["mean"] == 97.0  # the readings before it was lost, never zeros after


THREAD_NAMES = textwrap.dedent(
    """
    import os, sys, time
    want = set(sys.argv[2].split(","))
    deadline = time.monotonic() + 20
    while True:  # the agent that runs this command is its parent; its threads start around the exec
        names = set()
        for tid in os.listdir(f"/proc/{os.getppid()}/task"):
            try:
                names.add(open(f"/proc/{os.getppid()}/task/{tid}/comm").read().strip())
            except OSError:
                pass
        if want <= names or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    open(sys.argv[1], "w").write(",".join(sorted(names)))
    """
)


def test_the_agents_threads_carry_their_names_where_operators_look(tmp_path: Path, fakenvml: Path) -> None:
    """`top -H` and `ps -L` show each of the agent's threads by its role (the
    kernel's comm), so an operator sees which one costs CPU: the command
    reads its parent's threads' names, as an operator's tools would."""
    seen = tmp_path / "names"
    want = ["memtrace-ctl", "memtrace-drain", "memtrace-fold", "memtrace-host", "memtrace-fast"]
    nvml_script = tmp_path / "nvml.script"
    nvml_script.write_text(script(count=1, driver="580.65.06", **gpu(0, uuid="GPU-aaaa", **HEALTHY)))
    env = {"LD_LIBRARY_PATH": str(fakenvml), "FAKE_NVML_SCRIPT": str(nvml_script)}
    doc = run([sys.executable, "-c", THREAD_NAMES, str(seen), ",".join(want)], tmp_path, env=env)
    assert doc["host"]["fast_sampler"]["state"] == "on"
    names = set(seen.read_text().split(","))
    assert set(want) <= names, names


@pytest.mark.parametrize(("interval", "every"), [(0.05, 20), (0.1, 10), (0.5, 2), (1.0, 1), (5.0, 1)])
def test_the_slow_readings_keep_their_period_in_seconds_at_any_interval(interval: float, every: int) -> None:
    """GPU details, link names, quotas and the NCCL scan come about once a
    second whatever the sample interval (push samples every 0.5 s: ten
    samples were five seconds there), and at every sample once it is a
    second or more."""
    from memtrace.runtime.hostsignals import HostOptions

    o = HostOptions(interval_s=interval)
    assert [o.every(s) for s in (o.gpu_detail_s, o.link_s, o.quota_s, o.scan_s)] == [every] * 4


def test_the_diagnosis_ticks_keep_the_samples_schedule_when_samples_take_turns_long_and_short() -> None:
    """A tick at every sample when both have the same period (push: 0.5 s),
    whatever each sample cost: a sample that ran long (push's GPU detail read,
    every other sample) then one that ran short once made the next tick look
    early, and it was skipped (1 s windows where the diagnosis expects 0.5 s)."""
    import threading
    import time

    from memtrace.runtime.hostsignals import HostOptions, HostSignals

    opts = HostOptions(cpu=False, nccl=False, gpu=False, network=False, interval_s=0.05, fast_hz=0, tick_s=0.05)
    samples, ticks = [0], [0]
    host = HostSignals(opts, on_tick=lambda: ticks.__setitem__(0, ticks[0] + 1))
    host._tracked = {7: ProcessKey(7, 1)}  # a process traced: samples at interval_s (nothing traced: 1 s)
    enough = threading.Event()

    def sample(final: bool = False) -> None:
        samples[0] += 1
        if samples[0] % 2:
            time.sleep(0.02)  # the long one
        if samples[0] >= 40:
            enough.set()

    host.sample = sample  # type: ignore[method-assign]
    with host.sampling():
        enough.wait(30)
    assert samples[0] >= 40
    assert ticks[0] >= samples[0] - 2, (ticks, samples)


def test_the_samples_come_once_a_tick_while_nothing_is_traced_and_at_their_rate_once_a_process_is_met() -> None:
    """An idle node's agent samples every quiet_s (a tick each), not each interval_s:
    nothing traced, the samples come that far apart (the loop never wakes early). The agent
    meeting a process nudges it back to interval_s at once (its first windows are read at the
    rate its diagnosis needs), and it stays there while the process is traced."""
    import itertools
    import threading
    import time

    from memtrace.runtime.hostsignals import HostOptions, HostSignals

    # Quiet every 0.2 s (1 s in the agent): five samples in a second.
    opts = HostOptions(
        cpu=False, nccl=False, gpu=False, network=False, interval_s=0.02, fast_hz=0, tick_s=0.1, quiet_s=0.2
    )
    host = HostSignals(opts, on_tick=lambda: None)
    at: list[tuple[float, bool]] = []
    quiet_seen, traced_seen = threading.Event(), threading.Event()

    def sample(final: bool = False) -> None:
        at.append((time.monotonic(), bool(host._tracked)))
        if len(at) == 5:
            quiet_seen.set()
        if sum(traced for _, traced in at) >= 20:
            traced_seen.set()

    host.sample = sample  # type: ignore[method-assign]
    with host.sampling():
        assert quiet_seen.wait(30)
        assert host.quiet()
        host._tracked = {7: ProcessKey(7, 1)}  # what the sample after the nudge finds: a traced process
        host.nudge(ProcessKey(7, 1))
        assert not host.quiet()
        assert traced_seen.wait(30)
    quiet = [b - a for (a, _), (b, _) in itertools.pairwise(at[:5])]
    # Samples start on a schedule of ticks (a late one is followed by an earlier one, not a tick later).
    assert sum(quiet) >= 4 * 0.2 * 0.9, quiet
    traced = [b - a for (a, ta), (b, tb) in itertools.pairwise(at) if ta and tb]
    assert len(traced) >= 19
    # At interval_s, not a tick: twenty samples traced in less time than five ticks (1 s, not 4 s).
    assert sum(traced) < 5 * 0.2, traced


def test_the_fast_sampler_slows_down_while_no_process_is_traced() -> None:
    """An idle node's agent (push, top: nothing traced yet) ticks its C sampler at QUIET_FAST_HZ,
    reading the interfaces and GPUs at QUIET_READ_HZ; the first sample that traces a process puts
    it back at --host-rate, reading at every tick, and it slows again once the agent has let every
    process go. `memtrace run` names its command at start: always fast."""
    from memtrace.runtime.hostsignals import QUIET_FAST_HZ, QUIET_READ_HZ, HostOptions, HostSignals

    traced: set[ProcessKey] = set()
    opts = HostOptions(cpu=False, nccl=False, gpu=False, network=True, fast_hz=200.0)

    def rates(hs: HostSignals) -> tuple[float, float, float, float]:
        """The rates the view reports (ticks, reads), and the ones the C side holds."""
        view = hs.view()["fast_sampler"]
        return view["rate_hz"], hs._fast.rate_hz, view["read_hz"], hs._fast.read_hz

    quiet = (QUIET_FAST_HZ, pytest.approx(QUIET_FAST_HZ), pytest.approx(QUIET_READ_HZ), pytest.approx(QUIET_READ_HZ))
    fast = (200.0, pytest.approx(200.0), pytest.approx(200.0), pytest.approx(200.0))
    hs = HostSignals(opts, lambda: set(traced))
    hs.start()
    try:
        assert hs.view()["fast_sampler"]["state"] == "on"
        assert rates(hs) == quiet
        traced.add(ProcessKey(os.getpid(), 1))
        hs.sample()
        assert rates(hs) == fast
        traced.clear()
        hs.sample()
        assert rates(hs) == quiet
    finally:
        hs.close()
    named = HostSignals(opts)
    named.start([os.getpid()])
    try:
        named.sample()
        assert rates(named) == fast
    finally:
        named.close()


def test_a_process_read_before_the_agent_met_it_keeps_one_cpu_row() -> None:
    """`run` traces its command from its first instruction, before the CUDA
    model meets it at its first CUDA call: the CPU sensor, asked for its pid
    alone, reads its start itself (BPF, at the task), so its row has the
    process's start from the first reading, and stays that one row once the
    CUDA model names the process."""
    import time

    from memtrace.runtime.hostsignals import HostOptions, HostSignals
    from memtrace.sources.procfs import boot_wall_ns, start_ticks_of

    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    met: set[ProcessKey] = set()
    hs = HostSignals(HostOptions(nccl=False, gpu=False, network=False, fast_hz=0), lambda: set(met))
    try:
        hs.start([sleeper.pid])
        for _ in range(500):  # until its first switch since it was traced
            hs.sample()
            if hs.view()["cpu"]:
                break
            time.sleep(0.01)
        ((pid, start),) = [(r["pid"], r["start_time_unix_nano"]) for r in hs.view()["cpu"]]
        key = ProcessKey(sleeper.pid, start - boot_wall_ns())  # as the CUDA model names it (BPF's start too)
        ticks = int(open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        assert pid == sleeper.pid and start_ticks_of(key) == ticks  # the process's own start, to /proc's tick
        met.add(key)
        hs.sample()
        rows = hs.view()["cpu"]
        assert [(r["pid"], r["start_time_unix_nano"]) for r in rows] == [(sleeper.pid, boot_wall_ns() + key.start_ns)]
        assert rows[0]["voluntary_switches"] > 0
    finally:
        hs.close()
        sleeper.kill()
        sleeper.wait()
