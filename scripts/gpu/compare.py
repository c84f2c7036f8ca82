"""Truth against memtrace, from what scripts/gpu/run.sh brought back.

    python3 scripts/gpu/compare.py RAW_DIR [RAW_DIR...]

Each RAW_DIR is one run's raw/ folder (unpacked from OUT/raw.tar.gz). Every
row sets what the workload itself knows (its own counts, CUPTI's through the
PyTorch profiler, torch.cuda.memory_stats, nvidia-smi) beside memtrace's
JSON, and says whether they agree. Differences are printed, never hidden:
each is a bug until explained. A workload a run did not make is skipped.
Standard library only (the timeline's rows need the perfetto package, memtrace's own):
it runs wherever the raw files are.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

rows: list[tuple[str, str, str, str, str]] = []  # workload, what, truth, memtrace, verdict


def row(workload: str, what: str, truth: Any, got: Any, same: bool | None = None, note: str = "") -> None:
    ok = (truth == got) if same is None else same
    verdict = ("equal" if truth == got else "agrees") if ok else "DIFFERS"
    rows.append((workload, what, str(truth), str(got), verdict + (f": {note}" if note else "")))


def load(raw: Path, name: str) -> Any | None:
    p = raw / name
    return json.loads(p.read_text()) if p.exists() else None


def last_json_line(raw: Path, name: str) -> dict[str, Any] | None:
    """A workload's own truth: the last JSON line of its stderr (NAME.err),
    or that line alone (NAME.workload.json, as kept in docs/validation)."""
    p = raw / name
    if not p.exists():
        p = raw / name.replace(".err", ".workload.json")
    if not p.exists():
        return None
    for line in reversed(p.read_text().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return None


def copies(doc: dict[str, Any]) -> dict[tuple[str, str | None], list[int]]:
    out: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])
    for r in doc["memcpy"]:
        out[(r["direction"], r["host_memory"])][0] += r["calls"]
        out[(r["direction"], r["host_memory"])][1] += r["bytes"]
    return out


def torch_truth(raw: Path) -> None:
    doc, truth = load(raw, "truth.mt.json"), load(raw, "truth.truth.json")
    if doc is None or truth is None:
        return
    w = "PyTorch (CUPTI)"
    trace = json.load(gzip.open(raw / "truth.trace.json.gz"))["traceEvents"]
    api = Counter(e["name"] for e in trace if e.get("cat") == "cuda_runtime")
    gpu: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in trace:
        if e.get("cat") == "gpu_memcpy":
            gpu[e["name"]][0] += 1
            gpu[e["name"]][1] += e["args"]["bytes"]
    got = copies(doc)
    for name, key in (
        ("Memcpy HtoD (Pageable -> Device)", ("h2d", "pageable")),
        ("Memcpy HtoD (Pinned -> Device)", ("h2d", "pinned")),
        ("Memcpy DtoH (Device -> Pageable)", ("d2h", "pageable")),
        ("Memcpy DtoD (Device -> Device)", ("d2d", None)),
    ):
        row(w, f"{key[0]} {key[1] or ''} calls, bytes".replace("  ", " "), tuple(gpu[name]), tuple(got[key]))
    launches = Counter()
    for r in doc["launches"]:
        launches[r["kind"]] += r["launches"]
    row(w, "kernel launches", api["cudaLaunchKernel"] + api["cudaLaunchKernelExC"], launches["kernel"])
    row(w, "graph launches", api["cudaGraphLaunch"], launches["graph"])
    syncs = Counter()
    for r in doc["synchronization"]:
        syncs[r["kind"]] += r["calls"]
    row(w, "stream waits", api["cudaStreamSynchronize"], syncs["stream"])
    row(w, "device waits", api["cudaDeviceSynchronize"], syncs["device"])
    row(w, "event waits", api["cudaEventSynchronize"], syncs["event"])
    (mem,) = [m for m in doc["device_memory"] if m["process"] == "python3"] or [None]
    if mem is not None:
        row(
            w,
            "device allocations",
            api["cudaMalloc"],
            mem["allocations"],
            note="cuBLAS's own allocate through its static runtime: CUPTI sees cudaMalloc, memtrace cuMemAlloc_v2",
        )
        cublas = sum(s["bytes"] for s in doc.get("stacks", []) if s["kind"] == "alloc" and s["api"] == "cuMemAlloc_v2")
        row(
            w,
            "device memory in use at exit",
            f"{truth['memory']['reserved_bytes']} reserved + {cublas} cuBLAS",
            mem["in_use_bytes"],
            truth["memory"]["reserved_bytes"] + cublas == mem["in_use_bytes"],
        )
    for site, line in truth["sites"].items():
        found = [
            s
            for s in doc.get("stacks", [])
            if any(f.get("function") == site and f.get("line") == line for f in s["frames"])
        ]
        row(w, f"call site {site} (line {line}): calls", 100, sum(s["calls"] for s in found))
    for f in doc["findings"]:
        if f["code"] == "pageable_h2d":
            want = f"torch_truth.py:{truth['sites']['upload_pageable']}"
            said = f["summary"].rsplit("from ", 1)[-1]
            row(w, "pageable finding names", want, said, said.startswith(want))


def loaders(raw: Path) -> None:
    for name, host in (("loader_pageable", "pageable"), ("loader_pinned", "pinned")):
        doc, truth = load(raw, f"{name}.mt.json"), last_json_line(raw, f"{name}.err")
        if doc is None:
            continue
        got = copies(doc)
        if truth is not None:
            # The model's weights go up once too (Linear(3*64*64, 10): 491,560 bytes in 2 pageable copies).
            row(
                f"DataLoader {host}",
                f"batch H2D bytes, {host}",
                truth["batch_bytes"],
                got[("h2d", host)][1] - (491_560 if host == "pageable" else 0),
            )
        fired = [f for f in doc["findings"] if f["code"] == "pageable_h2d"]
        row(
            f"DataLoader {host}",
            "pageable finding",
            host == "pageable",
            bool(fired),
            note=fired[0]["summary"].rsplit("from ", 1)[-1] if fired else "",
        )


def simple(raw: Path) -> None:
    doc = load(raw, "leak.mt.json") or load(raw, "leak_timed.mt.json")
    truth = last_json_line(raw, "leak.err") or last_json_line(raw, "leak_plain.err")
    if doc is not None and truth is not None:
        (mem,) = [m for m in doc["device_memory"] if m["process"] == "python3"]
        row(
            "torch leak",
            "bytes kept, allocations",
            (truth["kept_bytes"], truth["allocations"]),
            (mem["in_use_bytes"], mem["outstanding"]),
        )
    doc, truth = load(raw, "cupy.mt.json"), last_json_line(raw, "cupy.err")
    if doc is not None and truth is not None:
        got = copies(doc)
        for d in ("h2d", "d2h"):
            t = truth["truth"][d]
            mine = [v for k, v in got.items() if k[0] == d]
            row(
                "CuPy",
                f"{d} calls, bytes",
                (t["calls"], t["bytes"]),
                (sum(v[0] for v in mine), sum(v[1] for v in mine)),
            )
        row("CuPy", "device copies resolved d2d (calls, bytes)", (300, 300 * (4 << 20)), tuple(got[("d2d", None)]))
    doc, truth = load(raw, "jax.mt.json"), last_json_line(raw, "jax.err")
    if doc is not None and truth is not None:
        got = copies(doc)
        row(
            "JAX",
            "batch bytes staged pinned",
            truth["batch_bytes"],
            got[("h2d", "pinned")][1],
            got[("h2d", "pinned")][1] - truth["batch_bytes"] < 16,
            "plus one 4-byte copy of JAX's own",
        )
    doc, truth = load(raw, "nccl.mt.json"), load(raw, "nccl.truth.json")
    if doc is not None and truth is not None:
        got = {c["collective"]: (c["calls"], c["bytes"]) for c in doc["collectives"]}
        for name in ("all_reduce", "broadcast", "all_gather"):
            row(
                f"NCCL {truth['nccl']}",
                f"{name} calls, bytes",
                (truth[name]["calls"], truth[name]["bytes"]),
                got.get(name),
            )
        (mem,) = [m for m in doc["device_memory"] if m["process"] == "python3"]
        row(f"NCCL {truth['nccl']}", "frees of memory never seen allocated", 0, mem["unknown_frees"])


def nvml(raw: Path) -> None:
    doc, smi = load(raw, "truth.mt.json"), raw / "smi.csv"
    if doc is None or not smi.exists() or not doc.get("host") or not doc["host"].get("gpus"):
        return
    g = doc["host"]["gpus"][0]
    lines = [[x.strip() for x in line.split(",")] for line in smi.read_text().splitlines() if line.count(",") >= 13]
    first = lines[0]
    row("NVML", "uuid, name, bus id", tuple(first[1:4]), (g["uuid"], g["name"], g["bus_id"]))
    row("NVML", "memory total (MiB)", int(first[4]), g["memory_total_bytes"] // (1 << 20))
    row(
        "NVML",
        "PCIe gen x width (now, max)",
        (int(first[8]), int(first[9]), int(first[10]), int(first[11])),
        (
            g["pcie_link"]["generation"],
            g["pcie_link"]["width"],
            g["pcie_link"]["max_generation"],
            g["pcie_link"]["max_width"],
        ),
    )
    temps = [float(x[6]) for x in lines]
    row(
        "NVML",
        "temperature (C), range",
        (min(temps), max(temps)),
        (g["temperature_celsius"]["mean"], g["temperature_celsius"]["max"]),
        min(temps) - 2 <= g["temperature_celsius"]["mean"] <= max(temps) + 2,
        "nvidia-smi every 250 ms around the run; memtrace's mean and max during it",
    )
    if g.get("pcie_throughput_from") == "byte_counters":
        moved = copies(doc)
        h2d = sum(v[1] for (d, _), v in moved.items() if d == "h2d")
        d2h = sum(v[1] for (d, _), v in moved.items() if d == "d2h")
        row(
            "NVML",
            "PCIe bytes: the copies (h2d, d2h) against the driver's counters (rx, tx)",
            (h2d, d2h),
            (g["pcie_rx_bytes"], g["pcie_tx_bytes"]),
            g["pcie_rx_bytes"] >= h2d and g["pcie_tx_bytes"] >= d2h,
            "the driver counts all of the link's traffic (launches, other processes): at least the copies",
        )
    elif "pcie_throughput_from" in g:  # recorded by a memtrace that reads them, on an older driver
        what = ("NVML", "PCIe bytes against the driver's counters", "", str(g["pcie_throughput_from"]))
        rows.append((*what, "not compared: the driver has no PCIe byte counters (they need 555 or later)"))


def steps(raw: Path) -> None:
    for name in ("train_traced", "train_traced_1"):
        doc, truth = load(raw, f"{name}.mt.json"), last_json_line(raw, f"{name}.err")
        if doc is None or truth is None:
            continue
        st = [s for s in doc["steps"] if s["process"] == "python3"]
        row("PyTorch train loop", "steps (iterations - 1)", truth["steps"] - 1, st[0]["steps"] if st else None)
        if st and "median_iteration_s" in truth:
            t, g = truth["median_iteration_s"], st[0]["duration_seconds"]["p50"]
            row(
                "PyTorch train loop",
                "median step (s)",
                f"{t:.5f}",
                f"{g:.5f}",
                abs(g / t - 1) < 0.03,
                "histogram buckets are 2.2% wide",
            )
        elif st:
            rows.append(
                (
                    "PyTorch train loop",
                    "median step (s)",
                    f"{truth['median_step_s']:.4f} (compute only)",
                    f"{st[0]['duration_seconds']['p50']:.4f} (whole iteration)",
                    "not compared: the loop timed from batch in hand to loss.item();"
                    " a step holds the batch's loading too",
                )
            )


def overhead(raw: Path) -> None:
    text = (raw / "overhead_bench.txt").read_text() if (raw / "overhead_bench.txt").exists() else ""
    for line in text.splitlines():
        if line.startswith("the probes added"):
            rows.append(
                (
                    "launch loop (test libcuda)",
                    "trap cost: measured vs calibrated",
                    line.split("(")[1].split(",")[0],
                    line.rsplit(": ", 1)[1],
                    "agrees within 13%" if "1.13" in line else "see text",
                )
            )
    plain = [last_json_line(raw, f"train_plain_{r}.err") for r in (1, 2)]
    traced = [last_json_line(raw, f"train_traced_{r}.err") for r in (1, 2)]
    if all(plain) and all(traced):
        ratios = [t["median_step_s"] / p["median_step_s"] for p, t in zip(plain, traced, strict=True)]  # type: ignore[index]
        rows.append(
            (
                "PyTorch train loop",
                "traced/untraced median step, 2 rounds",
                "1.00",
                ", ".join(f"{r:.3f}" for r in ratios),
                "over the 1.01 target" if statistics.median(ratios) > 1.01 else "within 1.01",
            )
        )


def diagnosis(raw: Path) -> None:
    doc, truth = load(raw, "diag_copier.mt.json"), load(raw, "diag_copier.truth.json")
    if doc is None or truth is None:
        return
    m = truth["job_median_step_seconds"]
    diag = [d for d in doc["diagnoses"] if d["process"] == "python3"]
    if diag:
        d = diag[0]
        row("competing copier", "cause", "pcie_contention", d["cause"])
        truth_ratio = m["during"] / m["before"]
        row(
            "competing copier",
            "slowdown",
            f"{truth_ratio:.2f}x (job's own median steps)",
            f"{d['ratio']:.2f}x",
            abs(d["ratio"] / truth_ratio - 1) < 0.1,
            "memtrace's is the mean over its first slow windows",
        )
        row(
            "competing copier",
            "detected after the fault began (s)",
            "-",
            f"{(d['detected_time_unix_nano'] - truth['onset_unix_nano']) / 1e9:.2f}",
            True,
        )


def untraced_copier(raw: Path) -> None:
    """A copier outside memtrace run's command (scripts/gpu/run.sh, stage diag): named from the
    driver's PCIe byte counters alone, after it began."""
    doc, onset = load(raw, "diag_untraced.mt.json"), raw / "diag_untraced.onset"
    if doc is None or not onset.exists():
        return
    diag = [d for d in doc["diagnoses"] if d["process"] == "python3"]
    row("untraced copier", "cause", "pcie_contention", diag[0]["cause"] if diag else "none")
    if diag:
        ev = diag[0]["evidence"]
        row(
            "untraced copier",
            "untraced PCIe bytes/s (before, after)",
            "rose",
            (ev.get("untraced_pcie_bytes_per_second_before"), ev.get("untraced_pcie_bytes_per_second")),
            ev.get("untraced_pcie_bytes_per_second", 0) > ev.get("untraced_pcie_bytes_per_second_before", 0),
        )
        took = (diag[0]["detected_time_unix_nano"] - int(onset.read_text())) / 1e9
        row("untraced copier", "detected after the copier began (s)", "-", f"{took:.2f}", took >= 0)


def habits(raw: Path) -> None:
    """examples/torch_habits.py: steps of a loop that logs, checkpoints, evaluates or accumulates,
    against the loop's own count and clock (docs/steps.md: the count within 1%, the median within 5%)."""
    for truth_path in sorted(raw.glob("habits_*.truth.json")):
        name = truth_path.name.removesuffix(".truth.json")
        doc, truth = load(raw, f"{name}.mt.json"), json.loads(truth_path.read_text())
        if doc is None:
            continue
        st = [s for s in doc["steps"] if s["process"] == "python3"]
        got = st[0]["steps"] if st else 0
        w = f"PyTorch loop, {truth['habit']}"
        row(
            w, "steps (waits - 1)", truth["steps"], got, abs(got - truth["steps"]) <= 0.01 * truth["steps"], "within 1%"
        )
        if st:
            t, g = truth["median_step_s"], st[0]["duration_seconds"]["p50"]
            row(w, "median step (s)", f"{t:.5f}", f"{g:.5f}", abs(g / t - 1) <= 0.05, "within 5%")
            row(w, "loop", "training", st[0]["loop"])
        diag = [d["cause"] for d in doc.get("diagnoses", []) if d["process"] == "python3"]
        row(w, "diagnoses (a healthy loop)", [], diag)


def _perfetto_slices(path: Path) -> tuple[list[dict[str, Any]], int | None]:
    """The slices of a memtrace timeline (name, category, args, ts, dur in ns), and CLOCK_REALTIME
    minus CLOCK_MONOTONIC from its clock snapshot. Needs the perfetto package (memtrace's own)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    open_: dict[int, list[dict[str, Any]]] = defaultdict(list)
    out: list[dict[str, Any]] = []
    real_minus_mono = None
    for p in trace.packet:
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c.timestamp for c in p.clock_snapshot.clocks}
            if 1 in clocks and 3 in clocks:  # REALTIME, MONOTONIC
                real_minus_mono = clocks[1] - clocks[3]
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        if te.type == TrackEvent.TYPE_SLICE_BEGIN:
            args = {a.name: (a.string_value or a.uint_value or a.int_value) for a in te.debug_annotations}
            open_[te.track_uuid].append(
                {"name": te.name, "category": list(te.categories), "args": args, "ts": p.timestamp}
            )
        elif te.type == TrackEvent.TYPE_SLICE_END:
            s = open_[te.track_uuid].pop()
            s["dur"] = p.timestamp - s["ts"]
            out.append(s)
    return sorted(out, key=lambda s: s["ts"]), real_minus_mono


def q(xs: list[float], p: float) -> float:
    """The p quantile of sorted xs (nearest rank)."""
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def _line_up(w: str, what: str, mine: list[dict[str, Any]], theirs: list[dict[str, Any]], shift: int | None) -> None:
    """Pair memtrace's slices with the profiler's events of the same calls, in order: the same
    number, a constant clock offset (its spread says how well they line up), and durations."""
    row(w, f"{what}: calls", len(theirs), len(mine))
    if not mine or len(mine) != len(theirs):
        return
    offsets = sorted(m["ts"] - round(t["ts"] * 1000) for m, t in zip(mine, theirs, strict=True))
    mid = offsets[len(offsets) // 2]
    spread = max(abs(q(offsets, 0.05) - mid), abs(q(offsets, 0.95) - mid))
    row(w, f"{what}: start, 90% within (us) of one offset", "-", f"{spread / 1000:.1f}", spread < 200_000)
    if shift is not None:  # memtrace's start in CLOCK_REALTIME minus the profiler's, by the two traces' own clocks
        lag = (mid + shift) / 1000
        rows.append(
            (w, f"{what}: memtrace's start minus the profiler's, wall clock (us)", "-", f"{lag:.1f}", "reported")
        )
    ratios = sorted(m["dur"] / max(1.0, t["dur"] * 1000) for m, t in zip(mine, theirs, strict=True))
    diffs = sorted((m["dur"] - t["dur"] * 1000) / 1000 for m, t in zip(mine, theirs, strict=True))
    # memtrace's slice runs from its entry probe to its return probe, the profiler's inside
    # CUPTI's callbacks: they differ by about the probes' own traps (doctor: a pair 1-1.5 us),
    # which are a large share of a wait of a few us on an idle GPU.
    row(
        w,
        f"{what}: duration memtrace/profiler, median (p5-p95); memtrace minus profiler, median (p5-p95) us",
        "1.00; within a trap pair (2 us)",
        f"{q(ratios, 0.5):.3f} ({q(ratios, 0.05):.3f}-{q(ratios, 0.95):.3f});"
        f" {q(diffs, 0.5):.1f} ({q(diffs, 0.05):.1f}-{q(diffs, 0.95):.1f})",
        abs(q(ratios, 0.5) - 1) < 0.2 or abs(q(diffs, 0.5)) <= 2.0,
    )


def timeline(raw: Path) -> None:
    """memtrace run --timeline of torch_truth.py beside the PyTorch profiler's trace of the same
    calls (issue 43): do the copies and the waits line up?"""
    mt, prof = raw / "truth.pftrace", raw / "truth.trace.json.gz"
    if not mt.exists() or not prof.exists():
        return
    slices, real_minus_mono = _perfetto_slices(mt)
    with gzip.open(prof) as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    base = doc.get("baseTimeNanoseconds")  # the profiler's ts are us after this CLOCK_REALTIME instant
    shift = real_minus_mono - base if real_minus_mono is not None and base is not None else None
    events.sort(key=lambda e: e["ts"])
    w = "timeline vs PyTorch profiler"
    copies_ = [s for s in slices if "copy" in s["category"]]
    row(w, "copy slices' apis", "cudaMemcpyAsync", ", ".join(sorted({s["args"].get("api", "?") for s in copies_})))
    _line_up(w, "copies", copies_, [e for e in events if e["name"] == "cudaMemcpyAsync"], shift)
    waits = [s for s in slices if "wait" in s["category"]]
    names = Counter(s["name"] for s in waits)
    rows.append((w, "wait slices by api", "-", ", ".join(f"{k} {v}" for k, v in names.most_common()), "reported"))
    syncs = [
        e for e in events if e["name"] in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
    ]
    rows.append(
        (
            w,
            "profiler's waits by api",
            "-",
            ", ".join(f"{k} {v}" for k, v in Counter(e["name"] for e in syncs).most_common()),
            "reported",
        )
    )
    for api in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
        _line_up(w, api, [s for s in waits if s["name"] == api], [e for e in syncs if e["name"] == api], shift)
    launches = [s for s in slices if "launch" in s["category"] or s["name"].endswith("launch")]
    their = [e for e in events if e["name"] in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")]
    rows.append((w, "launch slices; profiler's launch calls", "-", f"{len(launches)}; {len(their)}", "reported"))


def identity(raw: Path) -> None:
    """The NCCL run's identity (issue 42): its launcher's variables and its communicator."""
    doc = load(raw, "nccl.mt.json")
    if doc is None or "processes" not in doc:  # before issue 42
        return
    procs = [p for p in doc.get("processes", []) if p["process"] == "python3" and (p.get("job") or p.get("nccl"))]
    row("NCCL identity", "processes with a job or communicator", 1, len(procs))
    if not procs:
        return
    p = procs[0]
    job, comm = p.get("job") or {}, p.get("nccl") or {}
    env = raw / "env.txt"  # a loopback rendezvous is one host's alone: its id is prefixed with the host's name
    host = env.read_text().split()[1] if env.exists() else "?"
    row(
        "NCCL identity",
        "job id, launcher, rank, world size",
        (f"{host}/127.0.0.1:29517", "rendezvous", 0, 1),
        (job.get("id"), job.get("launcher"), job.get("rank"), job.get("world_size")),
    )
    row(
        "NCCL identity",
        "communicator: rank, ranks; id is 16 hex digits",
        (0, 1, True),
        (comm.get("rank"), comm.get("nranks"), len(comm.get("comm_id", "")) == 16),
    )


def onoff(raw: Path) -> None:
    """bench/targets/agent_onoff.py beside a real PyTorch loop (issue 41): printed as it came."""
    for job in ("steady", "launch"):
        p = raw / f"onoff_{job}.txt"
        if p.exists():
            lines = [x for x in p.read_text().splitlines() if x.strip()]
            rows.append(
                (f"agent on/off, {job} loop", "its own report", "<= 1.01", " / ".join(lines[-3:])[:300], "reported")
            )


def main() -> None:
    for arg in sys.argv[1:]:
        raw = Path(arg)
        for check in (
            torch_truth,
            loaders,
            simple,
            nvml,
            steps,
            habits,
            timeline,
            identity,
            onoff,
            overhead,
            diagnosis,
            untraced_copier,
        ):
            check(raw)
    print("| workload | what | truth | memtrace | |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if any("DIFFERS" in r[4] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
