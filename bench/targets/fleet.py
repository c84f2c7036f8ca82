"""The slow rank across hosts (issue 42): on the fleet rig of tests/fleet.py
(simulated hosts, each a network namespace and a cgroup with its own
`memtrace push --interval 1 --pid`, one collector, VictoriaMetrics, vmalert
evaluating deploy/prometheus/memtrace-fleet-rules.yaml every second),
faults injected on one host in turn, a healthy stretch before them:

    sudo .venv/bin/python bench/targets/fleet.py [--hosts H] [--ranks R] [--trials N] [--healthy S]
        [--faults cpu,nic,gpu]

With MEMTRACE_BENCH_LOGS=DIR, each host's agent runs with -v and its log
(its windows, diagnoses and their evidence) is copied to DIR/HOST.push.log,
with vmalert's, when the run ends.

  cpu  a busy loop at nice -19 on the CPU one rank is pinned to -> that
       rank, cpu_interference
  nic  eight bulk TCP streams from a host to the next over its NIC (a tbf
       at 80 Mbit/s) -> that host's ranks, nic_contention
  gpu  the host's GPU throttled: its agent's test NVML reports thermal and
       power throttling at 92 C, its ranks' kernels take twice as long ->
       that host's ranks, gpu_throttling (the agents read the test NVML only
       when this fault is asked for)

Figures: the time from the fault's onset to the rule naming the slow rank
(p50, p95; vmalert's activeAt of the alert, against the onset's wall
clock), to its naming the rank with its own cause, the share of trials
where exactly the right ranks (and no rank that only waits) were named with
the right cause, and the alerts over the healthy stretch (per hour).

A 2-vCPU machine holds 4 hosts x 4 ranks (16 ranks, their four agents and
the backends); 8 x 8 needs about four times the CPU (README, "Fleet").
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import REPO, Record, Target

sys.path.insert(0, str(REPO / "tests"))
from fleet import Fleet

LOGS = Path(os.environ["MEMTRACE_BENCH_LOGS"]) if os.environ.get("MEMTRACE_BENCH_LOGS") else None
GIVE_UP_S = 60.0  # a trial whose rank is not named by then counts as missed
SETTLE_S = 35.0  # after a fault: the job back to its pace, the rule's 30 s diagnosis window past


def wall(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def alerts(fleet: Fleet) -> list[dict]:
    assert fleet.alert is not None
    return [a for a in fleet.alert.alerts() if a["name"] == "MemtraceJobStraggler"]


def diagnosed(fleet: Fleet, host: str = "fleet-.*") -> dict[tuple[str, str, str, str], float]:
    """The agents' own diagnoses so far (memtrace_diagnoses_total counts up): by host, process,
    cause and the process's own cause."""
    got = fleet.query(f'memtrace_diagnoses_total{{host_name=~"{host}"}}')
    keys = ("host_name", "process_pid", "cause", "own_cause")
    return {tuple(x["metric"].get(k, "") for k in keys): float(x["value"][1]) for x in got}


def trial(fleet: Fleet, fault: str, host: int) -> dict:
    expect_cause = {"cpu": "cpu_interference", "nic": "nic_contention", "gpu": "gpu_throttling"}[fault]
    if fault == "cpu":
        want = {str(fleet.victim.rank)}
        host = fleet.victim.host
    else:
        want = {str(r.rank) for r in fleet.ranks if r.host == host}

    name = fleet.hosts[host].name
    before = diagnosed(fleet, name)
    onset = time.time()
    fleet.onset(fault, host)
    named_at = cause_at = None
    seen: set[tuple[str, str, str]] = set()
    # What the host's agent diagnosed, first seen since the onset (what it said before is an earlier word).
    said: dict[tuple[str, str, str, str], float] = {}
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline and cause_at is None:
        for k, n in diagnosed(fleet, name).items():
            if n > before.get(k, 0.0):
                said.setdefault(k, time.time() - onset)
        for a in alerts(fleet):
            lab = a["labels"]
            seen.add((lab["memtrace_job_rank"], lab["host_name"], lab["slow_cause"]))
            at = wall(a["activeAt"]) - onset
            if lab["memtrace_job_rank"] in want:
                named_at = at if named_at is None else min(named_at, at)
                if lab["slow_cause"] == expect_cause:
                    cause_at = at if cause_at is None else min(cause_at, at)
        time.sleep(0.25)
    fleet.end_fault()
    ranks = {r for r, _, _ in seen}
    right = cause_at is not None and ranks <= want
    print(
        f"  {fault} on host {host}: named {named_at}, cause {cause_at}, seen {sorted(seen)}, right {right}", flush=True
    )
    # When the host's agent's diagnoses reached the backend (pid, cause, own cause): the local part of the latency.
    print(f"    its agent said: {sorted(said.items(), key=lambda kv: kv[1])}", flush=True)
    time.sleep(SETTLE_S)
    return {"fault": fault, "named_s": named_at, "cause_s": cause_at, "right": right}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--trials", type=int, default=3, help="trials per fault")
    ap.add_argument("--healthy", type=float, default=120.0, help="seconds of healthy running watched")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", default="cpu,nic", help="injected in turn, each --trials times: cpu, nic, gpu")
    args = ap.parse_args()
    faults = args.faults.split(",")
    if set(faults) - {"cpu", "nic", "gpu"}:
        ap.error(f"no fault {args.faults}")
    harness.need_root("fleet")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))  # the rig is taken down on the way out
    rnd = random.Random(args.seed)
    rec = Record()
    fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-fleet-fx-")), quiet=True)
    with tempfile.TemporaryDirectory(prefix="memtrace-fleet-") as tmp:
        try:
            with Fleet(fx, Path(tmp), args.hosts, args.ranks, gpus="gpu" in faults, verbose=LOGS is not None) as f:
                f.start_job()
                time.sleep(30)  # warm-up: the agents' baselines and the rule's recent best
                started = time.monotonic()
                keys: set[tuple[str, str]] = set()
                # The agents' own word over the stretch: a diagnosis no rule turned into an alert is
                # still a false one for that host's user (memtrace run, the diagnosis logs).
                said_before = diagnosed(f)
                said = 0.0
                while time.monotonic() - started < args.healthy:
                    for a in alerts(f):
                        key = (a["labels"]["memtrace_job_rank"], a["activeAt"])
                        if key not in keys:
                            keys.add(key)
                            print(f"  healthy alert: {a['labels']}", flush=True)
                    now = diagnosed(f)
                    for k, n in now.items():
                        if (new := n - said_before.get(k, 0.0)) > 0:
                            print(f"  healthy, an agent diagnosed: {k} x{new:.0f}", flush=True)
                            said += new
                    said_before |= now  # a series gone stale and back is not counted again
                    time.sleep(0.5)
                false = len(keys)
                healthy_h = (time.monotonic() - started) / 3600
                print(f"healthy: {false} alerts, {said:.0f} agents' diagnoses in {healthy_h * 3600:.0f} s", flush=True)
                # What a node and a traced process cost the backend: their live series.
                per_node = [float(x["value"][1]) for x in f.query('count by (host_name) ({host_name=~"fleet-.*"})')]
                per_proc = [
                    float(x["value"][1])
                    for x in f.query('count by (host_name, process_pid) ({host_name=~"fleet-.*", process_pid!=""})')
                ]
                trials = []
                for _ in range(args.trials):
                    for fault in faults:
                        trials.append(trial(f, fault, rnd.choice([h for h in range(args.hosts) if h != f.victim.host])))
        finally:
            if LOGS is not None:  # the agents have stopped: their logs are whole
                LOGS.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, LOGS / log.name)
    named = [t["named_s"] for t in trials if t["named_s"] is not None]
    caused = [t["cause_s"] for t in trials if t["cause_s"] is not None]

    def q(xs: list[float], p: int) -> float:
        return (
            statistics.quantiles(xs, n=100, method="inclusive")[p - 1]
            if len(xs) > 1
            else (xs[0] if xs else float("nan"))
        )

    size = f"{args.hosts}x{args.ranks}" + ("" if faults == ["cpu", "nic"] else f", {'+'.join(faults)}")
    if trials:  # --trials 0: the healthy stretch alone
        rec.add(f"slow rank named, p50 ({size})", q(named, 50), "s", ".1f")
        rec.add(f"slow rank named, p95 ({size})", q(named, 95), "s", ".1f")
        rec.add(f"named with its cause, p50 ({size})", q(caused, 50), "s", ".1f")
        rec.add(f"named with its cause, p95 ({size})", q(caused, 95), "s", ".1f", Target("<=", 10.0))
        right = sum(t["right"] for t in trials) / len(trials)
        rec.add(f"right rank and cause ({size})", right, "1", ".2f", Target(">=", 0.95))
    rec.add(f"false alarms per hour healthy ({size})", false / healthy_h, "1/h", ".1f", Target("<=", 0.0))
    rec.add(f"agents' diagnoses per hour healthy ({size})", said / healthy_h, "1/h", ".1f")
    if per_node and per_proc:
        rec.add(f"series per node, {args.ranks} ranks ({size})", statistics.median(per_node), "1", ".0f")
        rec.add(f"series per traced rank ({size})", statistics.median(per_proc), "1", ".0f")
    rec.write()


if __name__ == "__main__":
    main()
