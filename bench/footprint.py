"""Agent footprint at 1, 10, 100 and 1000 traced processes (issue 6, target 3).

    sudo .venv/bin/python bench/footprint.py [--seconds S] [--counts 1,10,100,1000]

For each count, that many processes of the test workload run side by side,
each making 50 copies a second through real uprobes (three copy APIs, a few
series each, and a training step's four copy sizes, like the recorded
PyTorch job's copy mix), while the agent (in
this process, host-wide, as `memtrace push` runs it) drains and aggregates.
Printed per count: events/s received, agent CPU per 10k events/s, resident
memory (the whole agent process), and the time to build and encode one OTLP
export of everything. Memory must stay under 150 MB at 1000 processes and
grow no faster than linearly in processes.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--counts", default="1,10,100,1000")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("footprint: run as root (it loads BPF programs)")
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from memtrace.agent import Agent
    from memtrace.bpfsource import Options
    from memtrace.config import resolve
    from memtrace.otlp import MetricsBuilder

    fx = Path(tempfile.mkdtemp(prefix="memtrace-footprint-"))
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "fixtures"), f"OUT={fx}"], check=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, kernel {platform.release()}")
    print(f"{'processes':>10} {'events/s':>10} {'CPU/10k ev/s':>13} {'RSS MB':>8} {'export ms':>10} {'series':>7}")
    base_rss = rss_mb()
    for n in [int(x) for x in a.counts.split(",")]:
        calls = int(a.seconds * 50) + 50
        with Agent(Options()) as agent:
            agent.source.scan()
            procs = [
                subprocess.Popen(
                    [str(fx / "workload_driver"), "-n", str(calls), "-p", "20000", "-e", "-a", "3", "-z", "-s", str(i)],
                    env={"WORKLOAD_TRUTH": "/dev/null"},
                )
                for i in range(n)
            ]
            # Warm up: every process started and attached.
            t_end = time.monotonic() + 1.0
            while time.monotonic() < t_end:
                agent.poll()
                time.sleep(0.005)
            ev0, cpu0, t0 = agent.model.events, time.process_time(), time.monotonic()
            t_end = t0 + a.seconds
            rss_mid = None
            while time.monotonic() < t_end:
                agent.poll()
                if rss_mid is None and time.monotonic() > t0 + a.seconds / 2:
                    agent.sync_totals()
                    rss_mid = (rss_mb(), agent.model.events - ev0)
                time.sleep(0.005)
            agent.poll()
            agent.sync_totals()
            cpu, wall, events = time.process_time() - cpu0, time.monotonic() - t0, agent.model.events - ev0
            builder = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "bench"})
            te = time.perf_counter()
            batch = builder.build(agent.model, agent.stats(), len(agent.libraries))
            encoded = encode_metrics(batch.data).SerializeToString()
            export_ms = (time.perf_counter() - te) * 1e3
            series = sum(
                len(m.data.data_points)
                for rm in batch.data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            )
            rate = events / wall
            per10k = cpu / wall / (rate / 10_000) if rate else float("nan")
            print(
                f"{n:>10} {rate:>10,.0f} {per10k:>12.3f}s {rss_mb():>8.1f} {export_ms:>10.1f} {series:>7}"
                f"  ({len(encoded):,} B encoded; RSS {rss_mid[0]:.1f} MB after {rss_mid[1]:,} events,"
                f" {rss_mb():.1f} MB after {events:,})"
            )
            last = (n, rss_mb(), per10k)
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
    print(f"(RSS of this process before the first agent: {base_rss:.1f} MB; CPU is the whole process, drain included)")
    n, rss, per10k = last
    print(f"SUMMARY | resident memory at {n} processes | {rss:.1f} MB | < 150 MB | {'met' if rss < 150 else 'not met'}")
    print(f"SUMMARY | agent CPU at {n} processes | {per10k:.3f} CPU-s per 10k events/s | - | -")


if __name__ == "__main__":
    main()
