"""A fleet on one machine (issue 42): simulated hosts, each a network
namespace and a cgroup with its own `memtrace push` (its own host.name,
scoped with --pid to that host's processes), one real collector, one
VictoriaMetrics and vmalert evaluating deploy/prometheus/memtrace-fleet-rules.yaml
every second. Used by tests/test_fleet.py (4 x 4) and bench/targets/fleet.py.

Each host: a spawner (its "init") in the host's network namespace and
cgroup; everything on the host (ranks, a sink, faults) is its child, so
the host's push, given the spawner's pid, traces exactly them. Hosts are
joined by veth pairs to a bridge in a fabric namespace; each host's end
is its NIC, held by a tbf qdisc to NIC_RATE.

A rank is tests/fixtures/trainjob through the test CUDA libraries, started
as torchrun starts one (TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, LOCAL_RANK):
CPU work, kernels on the fake GPU, an all-reduce through the test NCCL
whose barrier (a file every rank maps) holds each rank's next wait until
every rank of the job arrived, then its gradients sent over TCP to a sink
on the next host (a real exchange over the veths).

Faults, on one host, from `onset()`:
  cpu  CPU_HOGS busy loop at nice HOG_NICE pinned to the CPU one of its
       ranks is pinned to (a neighbour of higher priority; a rank that
       uses less than its fair share of a CPU is not slowed by hogs of equal
       weight: the scheduler places a woken task by its lag) -> that rank,
       cpu_interference
  nic  BULK_STREAMS bulk TCP streams from the host to a storage server on
       the fabric (a data set copy) over its NIC -> its ranks, nic_contention
  gpu  (a Fleet made with gpus=True) the host's GPU throttled: the test NVML
       its agent reads reports thermal and power throttling at 92 C, and its
       ranks' kernels take twice as long (trainjob's control file) -> its
       ranks, gpu_throttling
  none nothing (a healthy control) -> nobody named
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backends import CACHE, Collector, VictoriaMetrics, free_port, wait_port
from cgroups import make_limited
from conftest import REPO
from peers import ACK_SINK, DRAIN
from test_nvml import HEALTHY, gpu, script

RULES = REPO / "deploy" / "prometheus" / "memtrace-fleet-rules.yaml"
OTELCOL = Path(__file__).with_name("fleet-otelcol.yaml")
VMALERT_VERSION = "v1.148.9"  # the newest whose module builds with this Go and the module proxy alone
NIC_RATE = "80mbit"
JOB = '{memtrace_job_id!=""}'
NET_BYTES = 128 << 10  # sent by each rank each step
CPU_HOGS = 1
HOG_NICE = "-19"
BULK_STREAMS = 8
PORT = 5301
# A rank's step: about 3 ms of CPU (2.5 loading, 0.5 after the wait), three
# 25 ms kernels, a 4 MiB all-reduce, 128 KiB sent: ~80 ms, mostly asleep, so
# that 16 ranks fit on two CPUs beside their agents and the backends.
LOAD_ITERS, HOST_ITERS, KERNEL_US = 1_250_000, 250_000, 25_000


def vmalert() -> Path:
    """vmalert, built once from VictoriaMetrics's module (go build; the module proxy)."""
    out = CACHE / "vmalert" / "vmalert"
    if out.exists():
        return out
    mod = f"github.com/VictoriaMetrics/VictoriaMetrics@{VMALERT_VERSION}"
    env = dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0")
    subprocess.run(["go", "mod", "download", mod], check=True, env=env, cwd="/")
    cache = subprocess.run(["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True).stdout.strip()
    src = Path(cache) / "github.com" / "!victoria!metrics" / f"!victoria!metrics@{VMALERT_VERSION}"
    work = CACHE / "vmalert-src"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    subprocess.run(["chmod", "-R", "u+w", str(work)], check=True)
    shutil.rmtree(work / "vendor", ignore_errors=True)  # the module's zip has no whole vendor folder
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(out), "./app/vmalert"], check=True, env=env, cwd=work)
    shutil.rmtree(work, ignore_errors=True)
    return out


class VmAlert:
    """vmalert over `vm`, evaluating `rules` every second; its alerts read from its API."""

    def __init__(self, tmp: Path, vm: VictoriaMetrics, rules: Path = RULES) -> None:
        self.port = free_port()
        self.log = open(tmp / "vmalert.log", "w")
        self.proc = subprocess.Popen(
            [
                str(vmalert()),
                f"-rule={rules}",
                f"-datasource.url=http://127.0.0.1:{vm.port}",
                "-evaluationInterval=1s",
                "-rule.evalDelay=0s",  # the backend makes samples searchable at once (-search.latencyOffset=0s)
                "-notifier.blackhole",
                f"-httpListenAddr=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port)

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/alerts", timeout=5) as r:
            return json.load(r)["data"]["alerts"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


SPAWNER = r"""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
procs = {}
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "kill" in req:
        p = procs.pop(req["kill"], None)
        if p is not None:
            p.kill()
            p.wait()
        print("killed", flush=True)
        continue
    def slack(ns=req.get("timer_slack_ns", 0)):
        if ns:
            libc.prctl(29, ns, 0, 0, 0)  # PR_SET_TIMERSLACK: a waiting rank polls less often
    p = subprocess.Popen(req["argv"], env=req["env"], preexec_fn=slack, stdout=subprocess.DEVNULL,
                         stderr=open(req["stderr"], "ab"))
    procs[req["id"]] = p
    print("pid", p.pid, flush=True)
"""

BULK = """
import socket, sys, threading
def send():
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    b = bytes(1 << 20)
    while True:
        s.sendall(b)
ts = [threading.Thread(target=send, daemon=True) for _ in range(int(sys.argv[3]))]
[t.start() for t in ts]
[t.join() for t in ts]
"""


@dataclass
class Rank:
    host: int
    local: int
    rank: int
    pid: int = 0


class Host:
    """One simulated host: its namespace, cgroup, spawner and push."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet, self.index = fleet, index
        self.name = f"fleet-{fleet.tag}-h{index}"
        self.ns = f"mtf{fleet.tag}h{index}"
        self.ip = f"10.78.{fleet.net}.{10 + index}"
        cg = make_limited("cpu", {}, {}, f"memtrace-fleet-{fleet.tag}-h{index}")
        if cg is None:
            raise RuntimeError("no cpu cgroup hierarchy to put a host in")
        self.cgroup = cg
        self.spawner: subprocess.Popen[str] | None = None
        self.push: subprocess.Popen[bytes] | None = None
        self.ids = 0
        # With gpus: its GPU as the test NVML reports it, and how slow its kernels are.
        self.nvml = fleet.tmp / f"{self.name}.nvml"
        self.control = fleet.tmp / f"{self.name}.control"

    def set_gpu(self, throttled: bool) -> None:
        over = {"reasons": 0x20 | 0x40, "temp": 92} if throttled else {}
        text = script(count=1, driver="580.0", **gpu(0, uuid=f"GPU-{self.name}", **{**HEALTHY, **over}))
        for path, body in ((self.nvml, text), (self.control, f"gpu={2 if throttled else 1} loader=1\n")):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(body)
            tmp.replace(path)  # whole, never half-written, to the readers that re-read it

    def wire(self) -> None:
        f = self.fleet
        host_end, sw_end = f"mtf{f.tag}e{self.index}", f"mtf{f.tag}s{self.index}"
        for cmd in (
            f"ip netns add {self.ns}",
            f"ip link add {host_end} netns {self.ns} type veth peer name {sw_end} netns {f.fabric}",
            f"ip -n {f.fabric} link set {sw_end} master br0 up",
            f"ip -n {self.ns} link set {host_end} name eth0",
            f"ip -n {self.ns} addr add {self.ip}/24 dev eth0",
            f"ip -n {self.ns} link set eth0 up",
            f"ip -n {self.ns} link set lo up",
            f"tc -n {self.ns} qdisc add dev eth0 root tbf rate {NIC_RATE} burst 64kb latency 50ms",
        ):
            subprocess.run(cmd.split(), check=True)

    def start_spawner(self) -> None:
        cg = self.cgroup / "cgroup.procs"
        self.spawner = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns}", sys.executable, "-c", SPAWNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: cg.write_text(str(os.getpid())),
        )
        assert self.spawner.stdout is not None
        line = self.spawner.stdout.readline().split()
        assert line[:1] == ["ready"], line
        self.spawner_pid = int(line[1])

    def run(self, argv: list[str], env: dict[str, str] | None = None, timer_slack_ns: int = 0) -> tuple[int, int]:
        """Start argv on this host; returns (its id here, its pid)."""
        assert self.spawner is not None and self.spawner.stdin is not None and self.spawner.stdout is not None
        self.ids += 1
        req = {
            "id": self.ids,
            "argv": argv,
            "env": {"PATH": os.environ["PATH"], **(env or {})},
            "stderr": str(self.fleet.tmp / f"{self.name}.stderr"),
            "timer_slack_ns": timer_slack_ns,
        }
        self.spawner.stdin.write(json.dumps(req) + "\n")
        self.spawner.stdin.flush()
        line = self.spawner.stdout.readline().split()
        assert line[:1] == ["pid"], line
        return self.ids, int(line[1])

    def kill(self, ident: int) -> None:
        assert self.spawner is not None and self.spawner.stdin is not None and self.spawner.stdout is not None
        self.spawner.stdin.write(json.dumps({"kill": ident}) + "\n")
        self.spawner.stdin.flush()
        self.spawner.stdout.readline()

    def start_push(self, endpoint: str, interval: float) -> None:
        """Its own agent: its host name (a UTS namespace of its own), the host's processes only."""
        log = open(self.fleet.tmp / f"{self.name}.push.log", "wb")
        gpus = {"LD_LIBRARY_PATH": str(self.fleet.fx / "nvml"), "FAKE_NVML_SCRIPT": str(self.nvml)}
        memtrace = [sys.executable, "-m", "memtrace", "push", "--endpoint", endpoint, "--interval", str(interval)]
        memtrace += ["--no-recorder", "--pid", str(self.spawner_pid)] + (["-v"] if self.fleet.verbose else [])
        self.push = subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", f'hostname {self.name} && exec "$@"', "sh", *memtrace],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), **(gpus if self.fleet.gpus else {})},
        )

    def close(self) -> None:
        if self.push is not None and self.push.poll() is None:
            self.push.send_signal(signal.SIGTERM)
            try:
                self.push.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.push.kill()
                self.push.wait()
        if self.spawner is not None:
            # Everything the host ran is in its cgroup (the spawner's children, theirs).
            for _ in range(3):
                for pid in (self.cgroup / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            self.spawner.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", self.ns], check=False)
        deadline = time.monotonic() + 10
        while self.cgroup.exists() and time.monotonic() < deadline:
            try:
                self.cgroup.rmdir()
            except OSError:
                time.sleep(0.1)


class Fleet:
    """`hosts` x `ranks` ranks of one job on simulated hosts, with their
    agents, a collector, VictoriaMetrics and vmalert. A context manager."""

    def __init__(
        self,
        fx: Path,
        tmp: Path,
        hosts: int = 4,
        ranks: int = 4,
        interval: float = 1.0,
        job: str = "fleet-job",
        tap: Callable[[str], str] | None = None,
        gpus: bool = False,
        verbose: bool = False,
    ) -> None:
        # verbose: each agent runs with -v (its windows and diagnoses in tmp/HOST.push.log).
        # tap: given the collector's OTLP/HTTP endpoint, where the agents push instead (a recorder that
        # forwards to it: bench/targets/fleet_scale.py).
        self.fx, self.tmp, self.job, self.tap, self.gpus = fx, tmp, job, tap, gpus
        self.verbose = verbose
        self.throttled: list[Host] = []
        self.tag = str(os.getpid() % 10000)
        self.net = os.getpid() % 200 + 20
        self.fabric = f"mtf{self.tag}sw"
        self.storage_ip = f"10.78.{self.net}.2"
        self.storage: subprocess.Popen[bytes] | None = None
        self.nhosts, self.nranks, self.interval = hosts, ranks, interval
        self.hosts: list[Host] = []
        self.ranks: list[Rank] = []
        self.vm: VictoriaMetrics | None = None
        self.col: Collector | None = None
        self.alert: VmAlert | None = None
        self.faults: list[tuple[Host, int]] = []
        self.victim = Rank(1 % hosts, 1 % ranks, (1 % hosts) * ranks + 1 % ranks)

    def __enter__(self) -> Fleet:
        # A run stopped with SIGTERM (a timeout) still takes the hosts down: their processes outlive it otherwise.
        self._old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            signal.signal(signal.SIGTERM, self._old_term)

    def start(self) -> None:
        self.vm = VictoriaMetrics(self.tmp)
        self.col = Collector(self.tmp, OTELCOL, {"MEMTRACE_EXPORT_ENDPOINT": self.vm.otlp})
        self.alert = VmAlert(self.tmp, self.vm)
        subprocess.run(["ip", "netns", "add", self.fabric], check=True)
        subprocess.run(["ip", "-n", self.fabric, "link", "add", "br0", "type", "bridge"], check=True)
        subprocess.run(["ip", "-n", self.fabric, "link", "set", "br0", "up"], check=True)
        # A storage server on the fabric: where a bulk flow goes (no host's own traffic).
        subprocess.run(["ip", "-n", self.fabric, "addr", "add", f"{self.storage_ip}/24", "dev", "br0"], check=True)
        self.storage = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.fabric}", sys.executable, "-c", DRAIN, self.storage_ip, str(PORT)],
            stdout=subprocess.DEVNULL,
        )
        for h in range(self.nhosts):
            host = Host(self, h)
            self.hosts.append(host)
            host.wire()
            if self.gpus:
                host.set_gpu(False)
            host.start_spawner()
            # Its ranks' peer: answers each step's exchange once it has it all (TRAINJOB_ACK).
            host.run([sys.executable, "-c", ACK_SINK, host.ip, str(PORT), str(NET_BYTES)])
        endpoint = f"http://127.0.0.1:{self.col.http_port}"
        for host in self.hosts:
            host.start_push(self.tap(endpoint) if self.tap else endpoint, self.interval)
        self.wait_agents()

    def wait_agents(self, timeout: float = 120) -> None:
        """Until every host's agent has pushed (its probes are attached by then)."""
        assert self.vm is not None
        deadline = time.monotonic() + timeout
        names = {h.name for h in self.hosts}
        while time.monotonic() < deadline:
            got = {s["metric"].get("host_name") for s in self.vm.query("memtrace_agent_libraries")}
            if names <= got:
                return
            for h in self.hosts:
                assert h.push is not None
                if h.push.poll() is not None:
                    raise RuntimeError(
                        f"{h.name}'s push exited: {(self.tmp / f'{h.name}.push.log').read_text()[-3000:]}"
                    )
            time.sleep(0.5)
        raise TimeoutError(f"agents not pushing: {names - got}")

    def start_job(self) -> None:
        barrier = self.tmp / "nccl-barrier"
        barrier.write_bytes(bytes(8))
        world = self.nhosts * self.nranks
        for host in self.hosts:
            peer = self.hosts[(host.index + 1) % self.nhosts]
            for local in range(self.nranks):
                r = Rank(host.index, local, host.index * self.nranks + local)
                argv = [str(self.fx / "trainjob"), "-t", "100000", "-L", str(LOAD_ITERS), "-w", str(HOST_ITERS)]
                argv += ["-k", str(KERNEL_US), "-c", "1", "-b", str(64 << 10), "-a", str(4 << 20)]
                argv += ["-n", str(NET_BYTES)]
                if (r.host, r.local) == (self.victim.host, self.victim.local):
                    argv = ["taskset", "-c", "1", *argv]
                env = {
                    "TORCHELASTIC_RUN_ID": self.job,
                    "RANK": str(r.rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(local),
                    "LD_LIBRARY_PATH": str(self.fx / "nccl"),
                    "FAKE_NCCL_BARRIER": str(barrier),
                    "FAKE_NCCL_RANKS": str(world),
                    "TRAINJOB_PEER": f"{peer.ip}:{PORT}",
                    "TRAINJOB_ACK": "1",
                    "WORKLOAD_TRUTH": "/dev/null",
                    **({"TRAINJOB_CONTROL": str(host.control)} if self.gpus else {}),
                }
                _, r.pid = host.run(argv, env, timer_slack_ns=500_000)
                self.ranks.append(r)
                if r.rank == self.victim.rank:
                    self.victim.pid = r.pid

    def onset(self, fault: str, host_index: int | None = None) -> None:
        """Start `fault` on the victim's host (the cpu fault), or on `host_index`'s."""
        host = self.hosts[self.victim.host if host_index is None else host_index]
        if fault == "cpu":
            for _ in range(CPU_HOGS):
                hog = ["nice", "-n", HOG_NICE, "taskset", "-c", "1", "sh", "-c", "while :; do :; done"]
                self.faults.append((host, host.run(hog)[0]))
        elif fault == "nic":
            bulk = [sys.executable, "-c", BULK, self.storage_ip, str(PORT), str(BULK_STREAMS)]
            self.faults.append((host, host.run(bulk)[0]))
        elif fault == "gpu" and self.gpus:
            host.set_gpu(True)
            self.throttled.append(host)
        elif fault != "none":
            raise ValueError(fault)

    def end_fault(self) -> None:
        for host, ident in self.faults:
            host.kill(ident)
        self.faults.clear()
        for host in self.throttled:
            host.set_gpu(False)
        self.throttled.clear()

    def named(self) -> list[dict[str, str]]:
        """The ranks the fleet rule names now: each alert's labels."""
        assert self.alert is not None
        return [a["labels"] for a in self.alert.alerts() if a["name"] == "MemtraceJobStraggler"]

    def query(self, expr: str) -> list[dict]:
        assert self.vm is not None
        return self.vm.query(expr)

    def evidence(self, since: float) -> str:
        """What the rule read, each second from `since` (wall clock) to now, by rank: run-queue
        seconds a second, wait share, step seconds; and every diagnosis its agents pushed,
        with when it was first and last pushed. For a test's failure message: a rig that named
        the wrong rank once in a dozen CI runs says why in that run's log."""
        assert self.vm is not None
        exprs = {
            "run queue s/s": f"rate(memtrace_process_run_queue_time_seconds_total{JOB}[5s])",
            "wait share": f"sum without (collective) (rate(memtrace_nccl_wait_time_seconds_total{JOB}[5s]))"
            f" / rate(memtrace_step_duration_seconds_sum{JOB}[5s])",
            "step s": f"rate(memtrace_step_duration_seconds_sum{JOB}[5s])"
            f" / rate(memtrace_step_duration_seconds_count{JOB}[5s])",
        }
        end = time.time()
        lines = []
        for name, expr in exprs.items():
            rows = {}
            for series in self.vm.query_range(expr, since, end, 1.0):
                rank = int(series["metric"].get("memtrace_job_rank", -1))
                rows[rank] = " ".join(f"{float(v):.2f}" for _, v in series["values"])
            lines.append(f"{name}, rank: each second from the onset")
            lines += [f"  {r:>3} {rows[r]}" for r in sorted(rows)]
        lines.append("diagnoses (host, pid, cause, own_cause: count, first and last push, s from the onset)")
        for series in self.vm.query(f"memtrace_diagnoses_total[{int(end - since) + 60}s]"):  # the samples pushed
            m, values = series["metric"], series["values"]
            lines.append(
                f"  {m.get('host_name')} {m.get('process_pid')} {m.get('cause')} {m.get('own_cause', '')}: "
                f"{values[-1][1]}, {float(values[0][0]) - since:+.0f} {float(values[-1][0]) - since:+.0f}"
            )
        return "\n".join(lines)

    def close(self) -> None:
        self.faults.clear()  # killed with their hosts
        for host in self.hosts:
            host.close()
        if self.storage is not None:
            self.storage.kill()
            self.storage.wait()
        subprocess.run(["ip", "netns", "del", self.fabric], check=False)
        for part in (self.alert, self.col, self.vm):
            if part is not None:
                part.stop()
