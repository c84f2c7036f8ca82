"""Diagnosis accuracy (issue 16): faults injected into a simulated training
job at random times, against healthy runs; a confusion matrix, precision
and recall per cause, detection and naming latency, false diagnoses per
hour of healthy running, and the agent's CPU.

    sudo .venv/bin/python bench/targets/diagnose.py [--trials-per-fault N] [--seconds S] [--seed N] [--faults A,B]

With MEMTRACE_BENCH_LOGS=DIR, each trial's agent runs with -v and its log
(every window's step time and baseline, per process) is kept in DIR.

The job is tests/fixtures/trainjob.c through the test CUDA libraries: a
fixed amount of real CPU work per step (data loading and host work),
host-to-device copies over an emulated PCIe link shared between processes
(the test driver's FAKE_PCIE token bucket: a copy waits for its bytes to
go through), and kernels on the fake GPU. Each trial runs it under
`memtrace run` (pinned to one CPU) for S seconds; a fault starts at a
random time between 35% and 65% of the job's run (from its first
instruction) and lasts to the end:

  cpu_hog           two busy loops on the job's CPU (a neighbour's
                    parallel build)                           -> cpu_interference
  cpu_quota         the job moved into a cgroup at half the CPU it used
                    over half a second (at most 20% of one; trainjob uses
                    about 40%)                                -> cpu_interference
  gpu_thermal       the test NVML reports thermal throttling and the
                    fake GPU's kernels take 2x as long        -> gpu_throttling
  pcie_degraded     the test NVML reports the link at x8 of x16 and the
                    emulated link's rate halves               -> pcie_contention
  competing_copier  another process (in the job's tree) floods the
                    emulated link with copies                 -> pcie_contention
  untraced_copier   the same copier started outside `memtrace run` (another
                    container's job): memtrace sees none of its calls, only
                    the link's bytes as the test NVML's driver counts them
                                                              -> pcie_contention
  slow_loader       the job's data loading does 4x the work   -> input_starvation
  nic_contention    the job sends 1 MiB a step (its gradient exchange) to a
                    peer in another network namespace over a veth whose
                    sending end a tbf qdisc holds to 400 Mbit/s (its NIC);
                    a bulk TCP flow from the job's namespace to the same
                    peer starts at onset                      -> nic_contention
  memory_pressure   the job reads a 64 MiB data set each step (from the page
                    cache); at onset it is moved into a memory cgroup
                    limited to 16 MiB and the file's cache is dropped, so
                    each step's reads reclaim and refault  -> host_memory_pressure
  slow_rank         a data-parallel job of three ranks (each pinned to no
                    CPU) that all-reduce their gradients every step through
                    the test NCCL, whose barrier holds each rank's next wait
                    until all have arrived; one rank's loading does 4x the
                    work, and the others wait for it      -> straggler
                    (on the slowed rank; its peers may be named stragglers'
                    waiters, which is right, not false)
  nvlink_contention slow_rank's data-parallel job, its GPU with two NVLinks
                    whose driver counters (the test NVML's, rewritten every
                    0.2 s) carry its gradients at 2 GiB/s; at onset others'
                    peer traffic adds 4 GiB/s on them and every rank's wait
                    for its all-reduce grows (the control file's gpu=2 on
                    every rank: the fake GPU's work before the barrier, which
                    memtrace sees as the collective's wait) -> nvlink_contention
  none              nothing (healthy control)                 -> no diagnosis

In every trial the emulated link counts the bytes through it and the test
NVML answers its PCIe byte counters from them (a driver of 555 or later).

Only the nic_contention trials run the job in a network namespace with the
exchange; the other faults' job sends nothing. Only the memory_pressure
trials read a data set.

The faults are simulations of what the hardware and neighbours do, driven
through the same interfaces memtrace reads in production (the scheduler,
cgroups, NVML through nvidia-ml-py, the copy calls' own times, the NCCL
calls and the waits after them).

A trial's prediction is the first diagnosis of the job's process at or
after the fault's onset ("none" if there is none); a diagnosis before the
onset, or any in a healthy run, is a false diagnosis.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, CpuWindow, Reading, Record, Target
from memtrace.sources.steal import Steal

sys.path.insert(0, str(REPO / "tests"))
from cgroups import make_limited
from peers import DRAIN
from test_nvml import HEALTHY, gpu, script

EXPECTED = {
    "cpu_hog": "cpu_interference",
    "cpu_quota": "cpu_interference",
    "gpu_thermal": "gpu_throttling",
    "pcie_degraded": "pcie_contention",
    "competing_copier": "pcie_contention",
    "untraced_copier": "pcie_contention",
    "slow_loader": "input_starvation",
    "nic_contention": "nic_contention",
    "memory_pressure": "host_memory_pressure",
    "slow_rank": "straggler",
    "nvlink_contention": "nvlink_contention",
    "none": "none",
}
# Faults run only when asked for (--faults): the zoo's (diagnose_zoo.py).
#   nic_late  nic_contention's, with the job entering its network namespace
#             after `memtrace run` started it (`ip netns exec` under the agent,
#             as container runtimes and nsenter do): memtrace must follow it
#   nic_setns the same, the job itself entering the namespace (setns) after
#             its first steps, before its first exchange (a zoo job's ZOO_NETNS)
CAUSE = {**EXPECTED, "nic_late": "nic_contention", "nic_setns": "nic_contention"}
DATA_BYTES = 64 << 20  # memory_pressure: the job's data set, read whole each step
MEMORY_LIMIT = 16 << 20  # and the limit it is moved under at onset
LINK_RATE = 2 << 30  # the emulated link, bytes per second
# The job's step, in thirds or so, so that a fault that halves one resource
# slows it by a quarter or more: CPU work (loading, then host work after the
# wait), copies over the emulated link, and the fake GPU's three kernels.
LOAD_MS, HOST_MS = 8.0, 4.0  # 12 ms of CPU
COPIES, COPY_BYTES = 4, 4 << 20  # 16 MiB at LINK_RATE: 7.8 ms
KERNEL_US = 3000  # 9 ms of GPU
_shape: list[str] = []


def job_shape(fc: Path) -> list[str]:
    """trainjob's flags for the step above."""
    if not _shape:
        _shape.extend(
            ["-L", str(harness.work_iterations(fc, LOAD_MS)), "-w", str(harness.work_iterations(fc, HOST_MS))]
            + ["-k", str(KERNEL_US), "-c", str(COPIES), "-b", str(COPY_BYTES)]
        )
        print(f"job: trainjob {' '.join(_shape)}", flush=True)
    return _shape


# slow_rank: a data-parallel job of RANKS processes. Each step: 3 ms of loading
# and 1 ms of host work, two 1 MiB copies, three 2 ms kernels, and an
# all-reduce of 4 MiB of gradients through the test NCCL, whose barrier makes
# every rank's next wait last until all have arrived (as NCCL's ranks wait).
RANKS = 3
RANK_LOAD_MS, RANK_HOST_MS, RANK_KERNEL_US = 3.0, 1.0, 2000
SLOW_LOADER = 4  # the slowed rank's loading, times its own


def rank_shape(fc: Path) -> list[str]:
    load, host = harness.work_iterations(fc, RANK_LOAD_MS), harness.work_iterations(fc, RANK_HOST_MS)
    return ["-L", str(load), "-w", str(host)] + [
        "-k",
        str(RANK_KERNEL_US),
        "-c",
        "2",
        "-b",
        str(1 << 20),
        "-a",
        str(4 << 20),
    ]


@dataclass
class Job:
    """A trial's job: trainjob at job_shape here; the zoo's shapes in
    diagnose_zoo.py (which hooks its faults through ZOO_ variables instead
    of flags, and may choose its own onset)."""

    comm: str  # its process's name (one trial runs at a time)
    argv: list[str]  # pinned to CPU
    rank: list[str] | None = None  # one rank of slow_rank's job (pinned to no CPU); None: it has none
    env: dict[str, str] = field(default_factory=dict)  # added to its environment
    shape: str = "trainjob"

    def reading(self, data: Path) -> None:
        """memory_pressure: it reads the data set each step."""
        self.argv += ["-d", str(data)]

    def exchanging(self, n: int) -> None:
        """nic_contention: it sends n bytes to PEER each step."""
        self.argv += ["-n", str(n)]

    def entering(self, netns: Path) -> None:
        """nic_setns: it enters netns itself, after its first steps."""
        raise SystemExit(f"nic_setns: {self.shape} cannot enter a namespace itself")

    def onset_at(self, at: float) -> float:
        """The fault's onset, seconds after the job began: the one drawn, or the job's own."""
        return at

    def onset(self, began: float, at: float) -> None:
        """Sleep until the fault's onset: `at` seconds after the job began."""
        time.sleep(max(0.0, began + at - time.monotonic()))

    def main(self, truth: list[dict]) -> dict:
        """The job's truth line among the copier's (competing_copier): it started first."""
        return min(truth, key=lambda x: x["start_ns"])

    def ends(self, line: dict) -> list[int]:
        return list(line["step_end_ns"])

    def slowdown(self, line: dict, onset_mono_ns: int) -> float | None:
        return job_slowdown(self.ends(line), onset_mono_ns)


def trainjob(fc: Path, seconds: float) -> Job:
    rank = [str(fc / "trainjob"), "-t", str(seconds), *rank_shape(fc)]
    return Job("trainjob", ["taskset", "-c", CPU, str(fc / "trainjob"), "-t", str(seconds), *job_shape(fc)], rank)


def pid_with_env(name: str, value: str, comm: str = "trainjob") -> int | None:
    """The process whose environment has name=value (one trial runs at a time)."""
    want = f"{name}={value}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == comm and want in (d / "environ").read_bytes().split(b"\0"):
                    return int(d.name)
            except OSError:
                continue
    return None


CPU = str(harness.LAST_CPU)
LOGS = Path(os.environ["MEMTRACE_BENCH_LOGS"]) if os.environ.get("MEMTRACE_BENCH_LOGS") else None  # agents' stderr
# The agent has loaded its programs, attached and calibrated this long after
# the job first ran (its start-up ends soon after it lets the job go, and
# from its own start takes seconds: docs/perf/notes.md). Its steady CPU is
# read from then until this long before the job ends: after that come the
# summary and the report, `run`'s last work.
SETTLED_S = 1.0
ENDING_S = 0.5


def nvml_script(link: Path, **over: object) -> str:
    """The test NVML's script: one healthy GPU (tests/test_nvml.py's), its PCIe byte counters
    those of the emulated link, with `over` changed."""
    return script(count=1, driver="580.0", **gpu(0, uuid="GPU-bench", **{**HEALTHY, "pcie_link": link, **over}))


NVLINK_JOB, NVLINK_OTHERS = 2 << 30, 4 << 30  # nvlink_contention: bytes a second on the links, the job's and others'


class NvLinkTraffic:
    """nvlink_contention: rewrites the test NVML's script every 0.2 s, GPU 0 with two NVLinks whose
    driver counters (KiB each way, split over the links) grow at the job's rate plus `others`."""

    def __init__(self, script: Path, link: Path) -> None:
        self.others = 0
        self._script, self._link = script, link
        self._kib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._write()
        self._thread.start()

    def _write(self) -> None:
        per_link = int(self._kib) // 2
        counters = {f"nvlink{n}__{d}": per_link for n in (0, 1) for d in ("tx", "rx")}
        write_atomic(self._script, nvml_script(self._link, nvlinks=2, **counters))

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.2):
            now = time.monotonic()
            self._kib += (NVLINK_JOB + self.others) * (now - last) / 1024
            last = now
            self._write()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def set_link(path: Path, rate: int) -> None:
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(rate.to_bytes(8, "little"))


@dataclass
class Trial:
    fault: str
    shape: str = "trainjob"
    job: str = ""  # the job's command (its parameters), where not trainjob's
    onset_ns: int = 0
    onset_mono_ns: int = 0  # CLOCK_MONOTONIC, the job's step clock
    slowdown: float | None = None  # the job's own median step after the onset (1 s on) over before it
    evidence: dict | None = None  # the prediction's
    spread: float | None = None  # healthy runs: the job's slowest half-second window over its median one
    predicted: str = "none"
    detect_s: float | None = None
    name_s: float | None = None
    false: list[str] = field(default_factory=list)
    false_evidence: list[dict] = field(default_factory=list)  # each false diagnosis's evidence, in order
    # The share of the VM's CPUs the hypervisor ran other VMs on (steal), from the job's start to the
    # onset and from the onset to the job's end: a noisy neighbour the benchmark did not inject.
    steal_before: float | None = None
    steal_after: float | None = None
    agent_cpu_s: float = 0.0
    wall_s: float = 0.0
    steady_cpu_s: float = 0.0  # the agent's CPU from SETTLED_S after its start to its last reading
    steady_wall_s: float = 0.0
    fast_hz: float | None = None  # the agent's fast host sampler's rate (None: it was off)
    host_interval_s: float | None = None  # the agent's host sample interval
    steady_threads: dict[str, float] = field(default_factory=dict)  # each agent thread's CPU over steady_wall_s


def cpu_quota_cgroup(share: float = 0.2) -> BenchCgroup:
    """A cpu cgroup at `share` of one CPU (trainjob uses about 40% of one)."""
    q = str(max(int(share * 100_000), 1000))
    return BenchCgroup("cpu", {"cpu.max": f"{q} 100000"}, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": q})


def cpu_used(pid: int, seconds: float = 0.5) -> float | None:
    """The share of one CPU a process's threads ran on over the next `seconds` (their
    schedstat on-CPU ns); None if it is gone."""

    def on_cpu() -> int:
        total = 0
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((t / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total

    try:
        before = on_cpu()
        time.sleep(seconds)
        return (on_cpu() - before) / (seconds * 1e9)
    except OSError:
        return None


def memory_cgroup() -> BenchCgroup:
    """A memory cgroup limited to MEMORY_LIMIT (page cache included; no swap is needed: the data set is clean)."""
    return BenchCgroup("memory", {"memory.max": str(MEMORY_LIMIT)}, {"memory.limit_in_bytes": str(MEMORY_LIMIT)})


def drop_cache(path: Path) -> None:
    """Drop a file's pages from the page cache (charged to the cgroup the job
    left), so its next reads are charged to the one it is in now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class BenchCgroup:
    """A cgroup of one controller for a fault, v2 or v1: `v2` and `v1` are
    the limit files to write in each."""

    def __init__(self, controller: str, v2: dict[str, str], v1: dict[str, str]) -> None:
        d = make_limited(controller, v2, v1, f"memtrace-bench-{controller}-{os.getpid()}")
        if d is None:
            raise SystemExit(f"no {controller} cgroup controller: cannot inject this fault")
        self.dir = d

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))  # the whole process, every thread

    def close(self) -> None:
        procs = (self.dir / "cgroup.procs").read_text().split()
        parent = self.dir.parent / "cgroup.procs"
        for p in procs:
            try:
                parent.write_text(p)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.05)


BULK = """
import socket
s = socket.create_connection(("10.201.0.2", 5301))
b = bytes(1 << 20)
while True:
    s.sendall(b)
"""
PEER = "10.201.0.2:5301"
NIC_RATE = "400mbit"
NET_BYTES = 1 << 20


class NetPair:
    """The job's network namespace and its peer's, joined by a veth pair; the
    job's end is its NIC: a tbf qdisc holds it to NIC_RATE. A sink in the
    peer's namespace reads and discards every connection."""

    def __init__(self) -> None:
        tag = str(os.getpid() % 100000)
        self.a, self.b = f"mtb-a{tag}", f"mtb-b{tag}"
        va, vb = f"mtba{tag}", f"mtbb{tag}"
        self.sink: subprocess.Popen[str] | None = None
        for cmd in (
            f"ip netns add {self.a}",
            f"ip netns add {self.b}",
            f"ip link add {va} netns {self.a} type veth peer name {vb} netns {self.b}",
            f"ip -n {self.a} addr add 10.201.0.1/24 dev {va}",
            f"ip -n {self.b} addr add 10.201.0.2/24 dev {vb}",
            f"ip -n {self.a} link set {va} up",
            f"ip -n {self.b} link set {vb} up",
            f"ip -n {self.a} link set lo up",
            f"ip -n {self.b} link set lo up",
            f"tc -n {self.a} qdisc add dev {va} root tbf rate {NIC_RATE} burst 256kb latency 100ms",
        ):
            subprocess.run(cmd.split(), check=True)
        self.sink = subprocess.Popen(
            ["ip", "netns", "exec", self.b, "taskset", "-c", "0", sys.executable, "-c", DRAIN, *PEER.split(":")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.sink.stdout is not None and self.sink.stdout.readline().strip() == "ready"

    def in_a(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.a, *argv]

    def close(self) -> None:
        if self.sink is not None:
            self.sink.kill()
            self.sink.wait()
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def job_started(agent: subprocess.Popen[bytes], deadline: float, comm: str = "trainjob") -> float:
    """When the job's process under the agent first ran (used CPU time)."""
    while time.monotonic() < deadline and agent.poll() is None:
        pid = job_pid(comm)
        if pid is not None and (harness.process_cpu_seconds(pid) or 0) > 0:
            return time.monotonic()
        time.sleep(0.01)
    return time.monotonic()


def host_steal_ns() -> int | None:
    """Every CPU's steal time so far (ns), as the agent reads it (sources/steal.py); None where
    /proc/stat has none."""
    per_cpu = Steal().read()
    return sum(per_cpu.values()) if per_cpu else None


def steal_shares(stolen: list[tuple[float, int | None]]) -> tuple[float | None, float | None]:
    """The share of the CPUs stolen between the readings (start, onset, end): before and after the onset."""
    out: list[float | None] = []
    for (t0, a), (t1, b) in zip(stolen, stolen[1:], strict=False):
        if a is None or b is None or t1 <= t0:
            out.append(None)
        else:
            out.append(round((b - a) / ((t1 - t0) * 1e9 * (os.cpu_count() or 1)), 4))
    out += [None, None]
    return out[0], out[1]


def start_copier(fifo: Path) -> None:
    """Let the copier waiting on `fifo` go (its shell reads a line); never blocks: a copier
    whose shell is gone has no reader (ENXIO), and then nothing starts."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


def job_pid(comm: str = "trainjob") -> int | None:
    """The job's process under `memtrace run` (one trial runs at a time)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() == comm:
                return int(d.name)
        except OSError:
            continue
    return None


def trial(
    fault: str, fc: Path, nvml: Path, tmp: Path, seconds: float, rnd: random.Random, made: Job | None = None
) -> Trial:
    """One trial of `fault` on trainjob, or on the job `made`."""
    t = Trial(fault)
    link = tmp / "pcie"
    link.write_bytes((0).to_bytes(8, "little") + LINK_RATE.to_bytes(8, "little") + bytes(16))  # and its counts
    control = tmp / "control"
    control.write_text("gpu=1 loader=1\n")
    script = tmp / "nvml.script"
    write_atomic(script, nvml_script(link))
    out = tmp / "summary.json"
    at = rnd.uniform(0.35, 0.65) * seconds
    spec = made or trainjob(fc, seconds)
    at = spec.onset_at(at)
    t.shape = spec.shape
    net: NetPair | None = None
    data = tmp / "dataset"
    if fault == "memory_pressure":
        if not data.exists():
            with open(data, "wb") as f:  # on tmp's filesystem: a disk, not tmpfs (its pages could not be reclaimed)
                for _ in range(DATA_BYTES >> 20):
                    f.write(os.urandom(1 << 20))
        spec.reading(data)
    if fault in ("nic_contention", "nic_late", "nic_setns"):
        net = NetPair()
        spec.exchanging(NET_BYTES)
        if fault == "nic_setns":
            spec.entering(Path("/run/netns") / net.a)
    job = spec.argv if fault != "nic_late" or net is None else net.in_a(spec.argv)
    t.job = "" if made is None else " ".join(Path(a).name if "/" in a else a for a in spec.argv)
    libs = str(nvml)
    if fault == "competing_copier":
        # Started at the onset, whenever the job's own schedule puts it (a checkpoint's start, a
        # load change): it waits on a FIFO the benchmark writes to then (a drawn sleep started it
        # before a checkpoint shape's onset, and its right diagnosis counted as false).
        copier = f"{fc / 'trainjob'} -t {seconds} -L 0 -w 0 -k 0 -c 16 -b 8388608"
        go = tmp / "go"
        if go.exists():
            go.unlink()
        os.mkfifo(go)
        argv = ["sh", "-c", f'"$@" & (read _ < {go}; exec {copier}) & wait', "sh", *job]
    elif fault in ("slow_rank", "nvlink_contention"):
        (tmp / "barrier").write_bytes(bytes(8))
        ranks = []
        if spec.rank is None:
            raise SystemExit(f"{fault}: {spec.shape} has no data-parallel job")
        for r in range(RANKS):
            (tmp / f"control{r}").write_text("gpu=1 loader=1\n")
            ctl = tmp / f"control{r}"
            ranks.append(" ".join(["env", f"TRAINJOB_CONTROL={ctl}", f"ZOO_CONTROL={ctl}", *spec.rank]) + " &")
        argv = ["sh", "-c", " ".join(ranks) + " wait"]
        libs += f":{fc / 'nccl'}"
    else:
        argv = job
    env = dict(
        os.environ,
        FAKE_PCIE=str(link),
        TRAINJOB_CONTROL=str(control),
        LD_LIBRARY_PATH=libs,
        FAKE_NCCL_BARRIER=str(tmp / "barrier"),
        FAKE_NCCL_RANKS=str(RANKS),
        FAKE_NVML_SCRIPT=str(script),
        WORKLOAD_TRUTH=str(tmp / "truth.jsonl"),
        TRAINJOB_PEER=PEER,
        **spec.env,
    )
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "memtrace", "run", "--format", "json", "-o", str(out)]
    cmd += ["-v"] if LOGS else []  # each window's step time and baseline in the log
    cmd += ["--", *argv]
    start = time.monotonic()
    log = open(LOGS / f"{fault}-{time.strftime('%H%M%S')}.log", "w") if LOGS else subprocess.DEVNULL
    agent = subprocess.Popen(net.in_a(cmd) if net and fault == "nic_contention" else cmd, env=env, stderr=log, cwd=REPO)
    hog: subprocess.Popen[bytes] | None = None
    slowed: int | None = None
    quota: BenchCgroup | None = None
    last_cpu = [0.0]
    settled: list[tuple[float, float]] = []  # (time, CPU) once started, and last
    settle_at = [float("inf"), float("inf")]  # SETTLED_S after the job first ran, ENDING_S before it ends
    threads: list[Reading] = []  # each thread's CPU once started, and last

    def watch() -> None:
        while agent.poll() is None:
            c = harness.agent_cpu_seconds(agent.pid)
            if c is not None:
                last_cpu[0] = c
                if settle_at[0] <= time.monotonic() <= settle_at[1]:
                    settled[1:] = [(time.monotonic(), c)]
                    now = Reading.of(agent.pid)
                    threads[1:] = [now.keeping(threads[1]) if len(threads) > 1 else now]  # ended threads kept
                    if len(settled) == 1:
                        settled.append(settled[0])
                        threads.append(threads[0])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    links = NvLinkTraffic(script, link) if fault == "nvlink_contention" else None
    try:
        # From the job's start, not the agent's: the agent takes a second or
        # so to load and attach, and a fault before the engine's baseline
        # (MIN_BASELINE windows) would be learnt as the job's normal.
        began = job_started(agent, start + 30, spec.comm)
        stolen = [(time.monotonic(), host_steal_ns())]
        settle_at[:] = [began + SETTLED_S, began + seconds - ENDING_S]
        if fault == "cpu_quota":
            # Half of what it uses, measured before the onset (the zoo's jobs use 10-60% of a
            # CPU: a fixed 20% left some unthrottled).
            pid = job_pid(spec.comm)
            used = cpu_used(pid) if pid is not None else None
        spec.onset(began, at)
        t.onset_ns = time.time_ns()
        t.onset_mono_ns = time.monotonic_ns()
        stolen.append((time.monotonic(), host_steal_ns()))
        if fault == "competing_copier":
            start_copier(tmp / "go")
        elif fault == "cpu_hog":
            hog = subprocess.Popen(
                ["taskset", "-c", CPU, "sh", "-c", "while :; do :; done & while :; do :; done"], start_new_session=True
            )
        elif fault == "cpu_quota":
            if pid is not None and used is not None:
                quota = cpu_quota_cgroup(min(used / 2, 0.2))
                quota.add(pid)
        elif fault == "memory_pressure":
            pid = job_pid(spec.comm)
            if pid is not None:
                quota = memory_cgroup()
                quota.add(pid)
                drop_cache(data)
        elif fault == "gpu_thermal":
            write_atomic(script, nvml_script(link, reasons=0x20 | 0x40, temp=92))
            control.write_text("gpu=2 loader=1\n")
        elif fault == "pcie_degraded":
            write_atomic(script, nvml_script(link, link_width=8))
            set_link(link, LINK_RATE // 2)
        elif fault == "untraced_copier":
            argv = [str(fc / "trainjob"), "-t", str(seconds - at), "-L", "0", "-w", "0", "-k", "0", "-c", "16"]
            copier_env = dict(env, WORKLOAD_TRUTH="/dev/null")
            hog = subprocess.Popen([*argv, "-b", str(8 << 20)], env=copier_env, start_new_session=True)
        elif fault == "slow_loader":
            control.write_text("gpu=1 loader=4\n")
        elif fault == "slow_rank":
            slowed = pid_with_env("TRAINJOB_CONTROL", str(tmp / "control0"), spec.comm)
            (tmp / "control0").write_text(f"gpu=1 loader={SLOW_LOADER}\n")
        elif fault == "nvlink_contention" and links is not None:
            links.others = NVLINK_OTHERS
            for r in range(RANKS):
                (tmp / f"control{r}").write_text("gpu=2 loader=1\n")
        elif fault in ("nic_contention", "nic_late", "nic_setns") and net is not None:
            hog = subprocess.Popen(net.in_a(["taskset", "-c", "0", sys.executable, "-c", BULK]), start_new_session=True)
        agent.wait(timeout=seconds * 3 + 60)
        stolen.append((time.monotonic(), host_steal_ns()))
        t.steal_before, t.steal_after = steal_shares(stolen)
    finally:
        if links is not None:
            links.close()
        if hog is not None:
            os.killpg(hog.pid, signal.SIGKILL)  # the shell and its loops
            hog.wait()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if quota is not None:
            quota.close()
        if net is not None:
            net.close()
    watcher.join()
    if LOGS:
        log.close()  # type: ignore[union-attr]
    t.wall_s = time.monotonic() - start
    t.agent_cpu_s = last_cpu[0]
    if len(settled) == 2 and settled[1][0] > settled[0][0]:
        t.steady_cpu_s = settled[1][1] - settled[0][1]
        t.steady_wall_s = settled[1][0] - settled[0][0]
        t.steady_threads = CpuWindow.between(threads[0], threads[1]).by_name
    doc = json.loads(out.read_text())
    fast = (doc.get("host") or {}).get("fast_sampler") or {}
    t.fast_hz = fast.get("rate_hz") if fast.get("state") == "on" else None
    t.host_interval_s = (doc.get("host") or {}).get("sample_interval_seconds")
    truth = [json.loads(line) for line in (tmp / "truth.jsonl").read_text().splitlines()]
    (tmp / "truth.jsonl").unlink()
    pids = {x["pid"] for x in truth}
    job_pids = set(pids)
    if fault == "competing_copier":
        job_pids = {spec.main(truth)["pid"]}  # not the copier started at onset
    if fault == "slow_rank":
        job_pids = {slowed} if slowed is not None else set()
        if not job_pids:
            raise SystemExit("slow_rank: the rank to slow was not found")
    job_truth = next(x for x in truth if x["pid"] in job_pids)
    t.slowdown = spec.slowdown(job_truth, t.onset_mono_ns)
    if fault == "none":
        t.spread = window_spread(spec.ends(job_truth))
    for d in doc.get("diagnoses", []):
        if d["pid"] not in pids:
            continue
        if fault == "slow_rank" and d["pid"] not in job_pids and d["cause"] == "straggler":
            continue  # a rank that waits for the slowed one, named so: right
        if fault == "none" or d["detected_time_unix_nano"] < t.onset_ns or d["pid"] not in job_pids:
            t.false.append(d["cause"])
            t.false_evidence.append(d["evidence"])
            continue
        if t.predicted == "none":
            t.predicted = d["cause"]
            t.evidence = d["evidence"]
            t.detect_s = (d["detected_time_unix_nano"] - t.onset_ns) / 1e9
            t.name_s = (d["named_time_unix_nano"] - d["detected_time_unix_nano"]) / 1e9
    return t


def window_spread(ends: list[int], window_ns: int = 500_000_000) -> float | None:
    """A healthy job's noise as the engine sees it: its largest mean step
    over a half-second window (the engine's) against the median of those
    means, from its third window on (the engine has no baseline before)."""
    means: dict[int, list[int]] = {}
    for a, b in zip(ends, ends[1:], strict=False):
        means.setdefault((b - ends[0]) // window_ns, []).append(b - a)
    ms = [statistics.mean(v) for k, v in sorted(means.items()) if k >= 2]
    return max(ms) / statistics.median(ms) if len(ms) > 2 else None


def job_slowdown(ends: list[int], onset_mono_ns: int) -> float | None:
    """What the fault did to the job, by its own clock: its median step from
    a second after the onset over its median step before it (so a miss can
    be told from a fault that did not slow the job)."""
    before = [b - a for a, b in zip(ends, ends[1:], strict=False) if b < onset_mono_ns]
    after = [b - a for a, b in zip(ends, ends[1:], strict=False) if a > onset_mono_ns + 1_000_000_000]
    if not before or not after:
        return None
    return statistics.median(after) / statistics.median(before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials-per-fault", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", default=",".join(EXPECTED))
    args = ap.parse_args()
    harness.need_root("diagnose")
    rec = Record()
    rnd = random.Random(args.seed)
    faults = [f for f in args.faults.split(",") for _ in range(args.trials_per_fault)]
    rnd.shuffle(faults)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:  # a disk: memory_pressure reads from it
        tmp = Path(d)
        fc = tmp / "fc"
        harness.build_fixtures(fc)
        trials = []
        for i, fault in enumerate(faults):
            t = trial(fault, fc, fc / "nvml", tmp, args.seconds, rnd)
            trials.append(t)
            print(
                f"[{i + 1}/{len(faults)}] {fault:17s} -> {t.predicted:20s}"
                + (f" job {t.slowdown:.2f}x" if t.slowdown is not None else "")
                + (f" detected {t.detect_s:.2f} s after onset" if t.detect_s is not None else "")
                + (f"; false: {t.false}" if t.false else "")
                + (f"\n    evidence: {json.dumps(t.evidence)}" if t.evidence and t.predicted != CAUSE[fault] else ""),
                flush=True,
            )
    report(trials, args, rec)
    rec.write()


Matrix = dict[str, dict[str, int]]


def confusion(trials: list[Trial]) -> tuple[Matrix, list[str]]:
    """Trials counted by the cause injected (rows) and the one diagnosed
    (columns); and the causes injected, "none" last."""
    causes = sorted({CAUSE[t.fault] for t in trials} - {"none"})
    cols = [*causes, *sorted({t.predicted for t in trials} - set(causes) - {"none"}), "none"]
    m = {r: dict.fromkeys(cols, 0) for r in [*causes, "none"]}
    for t in trials:
        m[CAUSE[t.fault]][t.predicted] += 1
    return m, [*causes, "none"]


def print_confusion(
    m: Matrix, rows: list[str], title: str = "confusion matrix", names: dict[str, str] | None = None
) -> None:
    """The matrix, each cause shown by its name in `names` where it has one (a short one: 80 columns)."""
    cols = list(next(iter(m.values())))
    shown = {c: (names or {}).get(c, c) for c in cols}
    w = max(len(shown[c]) for c in cols) + 2
    left = max(len(shown[r]) for r in rows) + 1
    print(f"{title} (rows: injected, columns: diagnosed)")
    print(" " * left + "".join(f"{shown[c]:>{w}}" for c in cols))
    for r in rows:
        print(f"{shown[r]:{left}s}" + "".join(f"{m[r][c]:>{w}}" for c in cols))


def recall(m: Matrix, cause: str) -> float:
    n = sum(m[cause].values())
    return m[cause][cause] / n if n else float("nan")


def detection(trials: list[Trial]) -> tuple[list[float], list[float]]:
    """The right diagnoses' detection after onset, and naming after detection, sorted."""
    right = [t for t in trials if t.predicted == CAUSE[t.fault] and t.detect_s is not None]
    return sorted(t.detect_s for t in right if t.detect_s is not None), sorted(
        t.name_s for t in right if t.name_s is not None
    )


def p95(xs: list[float]) -> float:
    """The 95th percentile of sorted xs (the nearest rank below)."""
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def report(trials: list[Trial], args: argparse.Namespace, rec: Record) -> None:
    m, rows = confusion(trials)
    causes = rows[:-1]
    print()
    print(f"machine: {harness.describe()}; {len(trials)} trials of {args.seconds:g} s, seed {args.seed}")
    print_confusion(m, rows)
    print()
    correct = sum(m[r][r] for r in rows)
    print(f"accuracy: {correct}/{len(trials)} = {correct / len(trials):.0%}")
    what = f"{len(trials)} trials, seed {args.seed}"
    rec.add("diagnosis accuracy", 100 * correct / len(trials), "%", ".0f", Target(">=", 95), note=what)
    recalls = []
    for c in causes:
        tp = m[c][c]
        fp = sum(m[r][c] for r in rows if r != c)
        fn = sum(v for k, v in m[c].items() if k != c)
        prec = tp / (tp + fp) if tp + fp else float("nan")
        got = tp / (tp + fn) if tp + fn else float("nan")
        print(f"  {c:20s} precision {prec:.2f}  recall {got:.2f}")
        recalls.append((got, c))
    if recalls:
        lowest, cause = min(recalls)
        rec.add("diagnosis, lowest recall of a cause", lowest, "", ".2f", Target(">=", 0.9), note=cause)
    det, name = detection(trials)
    if det:
        print(f"detection after onset: p50 {statistics.median(det):.2f} s, p95 {p95(det):.2f} s")
        print(f"cause named after detection: p50 {statistics.median(name):.2f} s, max {max(name):.2f} s")
        rec.add("diagnosis, detection after the fault's onset, p95", p95(det), "s", ".2f", Target("<=", 2))
        rec.add("diagnosis, cause named after detection, max", max(name), "s", ".2f", Target("<=", 1))
    healthy = [t for t in trials if t.fault == "none"]
    spreads = [t.spread for t in healthy if t.spread is not None]
    if spreads:
        print(
            f"healthy jobs' slowest half-second window against their median window: at most {max(spreads):.3f}x "
            f"(the engine's threshold is 1.2x, two windows in a row)"
        )
    healthy_s = sum(t.wall_s for t in healthy)
    false = sum(len(t.false) for t in trials)
    false_healthy = sum(len(t.false) for t in healthy)
    if healthy_s:
        print(
            f"false diagnoses: {false} in all trials; {false_healthy} in {healthy_s / 60:.1f} min of healthy runs "
            f"({false_healthy / (healthy_s / 3600):.1f} per hour)"
        )
        rec.add(
            "false diagnoses per hour of healthy runs",
            false_healthy / (healthy_s / 3600),
            "per hour",
            ".1f",
            Target("<=", 1),
            note=f"{false_healthy} in {healthy_s / 60:.1f} min",
        )
    rec.add("false diagnoses in all trials", false, "", ".0f")
    cpu = sum(t.agent_cpu_s for t in trials) / sum(t.wall_s for t in trials)
    wall = sum(t.steady_wall_s for t in trials)
    steady = sum(t.steady_cpu_s for t in trials) / wall if wall else float("nan")
    rates = {t.fast_hz for t in trials}
    every = ", ".join(f"{i:g} s" for i in sorted({t.host_interval_s for t in trials if t.host_interval_s}))
    sampling = (
        f"NICs and GPUs at {rates.pop():g} Hz (C thread), the rest every {every}"
        if len(rates) == 1 and None not in rates
        else f"host sampling every {every} (fast sampler at {sorted(rates, key=str)} Hz)"
    )
    print(
        f"agent CPU (memtrace run, {sampling}, diagnosis every 0.5 s): {steady:.1%} of one core "
        f"while the job ran (from {SETTLED_S:g} s after it started to {ENDING_S:g} s before it ended); {cpu:.1%} "
        "over whole trials, start-up (BPF load, attach, calibration) and the summary included"
    )
    if wall:
        rec.add(
            "memtrace run's agent CPU while the job ran",
            steady * 100,
            "% of a core",
            ".1f",
            Target("<=", 1),
            note=sampling,
        )
    if wall:
        per: dict[str, float] = {}
        for t in trials:
            for k, v in t.steady_threads.items():
                per[k] = per.get(k, 0.0) + v
        top = sorted(per.items(), key=lambda kv: -kv[1])
        print("  by thread: " + ", ".join(f"{k} {v / wall:.2%}" for k, v in top if v / wall >= 0.0005))


if __name__ == "__main__":
    main()
