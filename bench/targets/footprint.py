"""Agent footprint at 1, 10, 100 and 1000 traced processes (issue 6, target 3).

    sudo .venv/bin/python bench/targets/footprint.py [--seconds S] [--counts 1,10,100,1000] [--soak N]

For each count, that many processes of the test workload run side by side,
each making 50 copies a second through real uprobes (three copy APIs, a few
series each, and a training step's four copy sizes, like the recorded
PyTorch job's copy mix), while the agent (in this process, host-wide, as
`memtrace push` runs it) drains and aggregates, then exports (cumulative,
the default, in requests of a few processes each). Printed per count: events/s received, agent CPU per 10k events/s,
resident memory (the whole agent process) sampled through the run, the
time to build and encode one OTLP export of everything, and the worst drain
gap (the longest interval between the starts of two ring drains, while an
export is built) in the previous design (git cc9270d: drains and exports on
one thread, reproduced here) and in this one (a drain thread of its own),
first at the process's priority, then at the niceness the agent gives it
(DRAIN_NICE): on a host whose CPUs the traced processes keep busy, a drain
mostly waits for a CPU.

Memory must stay under 150 MB at 1000 processes, grow no faster than
linearly in processes, and not at all in events. At 50 copies a second a
process, a live run fills each series' histograms only so far;
the soak then folds N more events (default 20M) into the same series of
the same agent, with copy durations spread over a lognormal of sigma 1 (the
widest real spread: the recorded traces' copies span about 6 powers of two),
exporting every million, and prints the resident memory as it goes.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import harness
from bench.harness import Record, Target, pss_mb, rss_mb


def rss_parts() -> str:
    """Where the resident memory lies (/proc/self/smaps), RSS / PSS: BPF
    maps mapped into the agent (the event rings: kernel memory, resident
    from the start), files mapped (the interpreter, libraries: shared), and
    the anonymous rest (the Python heap, numpy's arrays, malloc)."""
    parts = {k: [0, 0] for k in ("bpf maps", "files", "anonymous")}
    kind = "anonymous"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            kind = "bpf maps" if "bpf" in name else "files" if name.startswith("/") else "anonymous"
        elif head and head[0] in ("Rss:", "Pss:"):
            parts[kind][head[0] == "Pss:"] += int(head[1])
    return ", ".join(f"{k} {r / 1024:.1f} / {p / 1024:.1f} MB" for k, (r, p) in parts.items())


def export(builder: object, agent: object) -> tuple[int, int, float]:
    """One export as `memtrace push` makes it: built, encoded in requests of
    a few processes each, committed, dropped, and the freed memory given back.
    Returns the points, the bytes encoded, and the RSS (MB) while the batch
    was still held (before 2026-11-26 the push loop held it until the next)."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from memtrace.export.transport import REQUEST_POINTS, split_by_resource
    from memtrace.runtime.memory import give_back_free_memory, no_cyclic_gc

    with no_cyclic_gc():
        batch = builder.build(agent.model, agent.stats(), len(agent.libraries))  # type: ignore[attr-defined]
    size = sum(len(encode_metrics(part).SerializeToString()) for part in split_by_resource(batch.data, REQUEST_POINTS))
    batch.commit()
    points = sum(
        len(m.data.data_points) for rm in batch.data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    )
    give_back_free_memory()
    held = rss_mb()
    del batch
    give_back_free_memory()
    return points, size, held


def drain_gap_one_thread(agent: object, builder: object, window: float) -> float:
    """The previous design (cc9270d's push loop): drain every 5 ms and, when
    an export is due, build it on the same thread. Worst gap, seconds."""
    agent.reset_drain_stats()  # type: ignore[attr-defined]
    t_end, exported = time.monotonic() + window, False
    while time.monotonic() < t_end:
        agent.poll()  # type: ignore[attr-defined]
        if not exported and time.monotonic() >= t_end - window / 2:
            export(builder, agent)
            exported = True
        time.sleep(0.005)
    # A last drain start: an export longer than the window still counts in full.
    agent.poll()  # type: ignore[attr-defined]
    return agent.drain_stats().gap_max_seconds  # type: ignore[attr-defined,no-any-return]


def drain_gap_drain_thread(agent: object, builder: object, window: float) -> float:
    """This design: the agent drains on its own thread while this one builds
    an export under the model lock. Worst gap, seconds."""
    agent.reset_drain_stats()  # type: ignore[attr-defined]
    with agent.draining():  # type: ignore[attr-defined]
        time.sleep(window / 2)
        with agent.lock:  # type: ignore[attr-defined]
            export(builder, agent)
        time.sleep(window / 2)
        # A last drain start: a drain still running counts in full.
        agent.poll()  # type: ignore[attr-defined]
    return agent.drain_stats().gap_max_seconds  # type: ignore[attr-defined,no-any-return]


def soak(agent: object, builder: object, total: int, rec: Record) -> None:
    """Fold `total` more events into the series the live run made, exporting
    every million: the memory must not move."""
    import numpy as np

    from memtrace.core.abi import EVENT_DTYPE

    model = agent.model  # type: ignore[attr-defined]
    # pid, start, api, direction of each series
    keys = np.array([(k.process.pid, k.process.start_ns, k.api, k.direction) for k in model.copies], dtype=np.int64)
    series0 = len(model.copies)
    rng = np.random.default_rng(1)
    sizes = np.array([4 << 10, 64 << 10, 1 << 20, 16 << 20], dtype=np.uint64)
    batch = np.zeros(4096, dtype=EVENT_DTYPE)
    print(f"soak: {total:,} events into the {series0:,} series above, an export every million")
    t0, done, marks = time.process_time(), 0, []
    while done < total:
        # A batch holds the events of a few processes, as a drained ring does.
        pick = keys[rng.choice(rng.integers(0, len(keys), 16), len(batch))]
        for j, name in enumerate(("pid", "start_ns", "api", "direction")):
            batch[name] = pick[:, j]
        # An untracked pointer in a process seen whole: pageable, as the live copies were.
        batch["src"] = batch["dst"] = 0x10000
        batch["bytes"] = sizes[rng.integers(0, 4, len(batch))]
        batch["duration_ns"] = rng.lognormal(np.log(20e3), 1.0, len(batch)).astype(np.uint64) + 1
        model.add_events(batch)
        done += len(batch)
        if done // 1_000_000 != (done - len(batch)) // 1_000_000:
            export(builder, agent)
            marks.append((done, rss_mb()))
    rate = done / (time.process_time() - t0)
    trail = ", ".join(f"{mb:.1f} MB at {ev / 1e6:.0f}M" for ev, mb in marks[:: max(len(marks) // 5, 1)] + marks[-1:])
    print(f"soak: RSS {trail}; {len(model.copies):,} series; {rate:,.0f} events/s folded, exports included")
    # Histograms widen until each reaches its bucket bound; from the soak's
    # middle on, every series is there: what follows must not grow.
    if len(marks) < 2:
        return
    mid = marks[len(marks) // 2]
    grow = marks[-1][1] - mid[1]
    what = f"{mid[1]:.1f} MB at {mid[0] / 1e6:.0f}M events, {marks[-1][1]:.1f} MB at {marks[-1][0] / 1e6:.0f}M"
    print(f"soak: {what} ({grow:+.1f} MB)")
    rec.add(
        f"resident memory growth over the soak's second half ({len(model.copies):,} series)",
        grow,
        "MB",
        "+.1f",
        Target("<", 1),
        note=what,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--counts", default="1,10,100,1000")
    ap.add_argument("--soak", type=int, default=20_000_000, help="events folded into the last count's series")
    ap.add_argument("--gap-window", type=float, default=2.0, help="seconds each drain-gap phase runs, export included")
    a = ap.parse_args()
    harness.need_root("footprint")
    rec = Record()
    from memtrace.export.config import resolve
    from memtrace.export.otlp import MetricsBuilder
    from memtrace.runtime.agent import DRAIN_NICE

    fx = harness.build_fixtures(Path(tempfile.mkdtemp(prefix="memtrace-footprint-")))
    print(f"machine: {harness.describe()}")
    print(
        f"{'processes':>10} {'events/s':>10} {'CPU/10k ev/s':>13} {'RSS MB':>8} {'export ms':>10} {'series':>7}"
        f" {'drain gap ms (1 thread / drain thread / at nice -10)':>52}"
    )
    base_rss = rss_mb()
    for n in [int(x) for x in a.counts.split(",")]:
        # Still copying through the drain-gap phases (exports included) that follow the measurement.
        calls = int((a.seconds + 3 * a.gap_window + 12) * 50) + 50
        with harness.cuda_agent() as agent:
            agent.scan()
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
            builder = MetricsBuilder(resolve({}, endpoint="http://127.0.0.1:1"), {"host.name": "bench"})
            ev0, cpu0, t0 = agent.model.events, time.process_time(), time.monotonic()
            t_end, next_sample = t0 + a.seconds, t0 + 1.0
            samples = []  # (events, RSS MB) each second
            while time.monotonic() < t_end:
                agent.poll()
                if time.monotonic() >= next_sample:
                    samples.append((agent.model.events - ev0, rss_mb()))
                    next_sample += 1.0
                time.sleep(0.005)
            agent.poll()
            agent.sync_totals()
            cpu, wall, events = time.process_time() - cpu0, time.monotonic() - t0, agent.model.events - ev0
            te = time.perf_counter()
            series, encoded, held_mb = export(builder, agent)
            export_ms = (time.perf_counter() - te) * 1e3
            gap_before = drain_gap_one_thread(agent, builder, a.gap_window)
            agent.drain_nice = 0
            gap_plain = drain_gap_drain_thread(agent, builder, a.gap_window)
            agent.drain_nice = DRAIN_NICE
            gap_after = drain_gap_drain_thread(agent, builder, a.gap_window)
            gaps = f"{gap_before * 1e3:,.1f} / {gap_plain * 1e3:,.1f} / {gap_after * 1e3:,.1f}"
            rate = events / wall
            per10k = cpu / wall / (rate / 10_000) if rate else float("nan")
            trail = ", ".join(f"{mb:.1f} MB at {ev:,}" for ev, mb in samples[:: max(len(samples) // 4, 1)])
            print(
                f"{n:>10} {rate:>10,.0f} {per10k:>12.3f}s {rss_mb():>8.1f} {export_ms:>10.1f} {series:>7} {gaps:>52}"
                f"  ({encoded:,} B encoded; RSS {trail}, {rss_mb():.1f} MB at {events:,} events and three exports,"
                f" {held_mb:.1f} MB while the first export's batch was still held)"
            )
            print(f"{'':>10} resident (RSS / PSS): {rss_parts()}; PSS in all {pss_mb():.1f} MB")
            if n == int(a.counts.split(",")[-1]) and a.soak:
                soak(agent, builder, a.soak, rec)
            last = (n, rss_mb(), pss_mb(), per10k, gap_before, gap_after)  # the agent as shipped: at DRAIN_NICE
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
        # Exports freeze what lives on (memtrace.runtime.memory): whatever cyclic
        # garbage that kept from the collector, this agent's whole life, is found here.
        gc.unfreeze()
        print(f"{'':>10} cyclic garbage the freezes kept from the collector: {gc.collect()} objects")
    print(f"(RSS of this process before the first agent: {base_rss:.1f} MB; CPU is the whole process, drain included)")
    n, rss, pss, per10k, gap_before, gap_after = last
    rec.add(f"memory at {n} processes, PSS", pss, "MB", ".1f", Target("<", 150))
    rec.add(f"memory at {n} processes, RSS", rss, "MB", ".1f", note="RSS counts the event ring's pages twice")
    rec.add(f"agent CPU at {n} processes", per10k, "CPU-s per 10k events/s", ".3f")
    # Late by at most two drain periods.
    rec.add(
        f"worst drain gap at {n} processes, an export built meanwhile", gap_after * 1e3, "ms", ".1f", Target("<=", 15)
    )
    rec.add(
        f"worst drain gap at {n} processes, drains and exports on one thread (cc9270d)", gap_before * 1e3, "ms", ".1f"
    )
    rec.write()


if __name__ == "__main__":
    main()
