"""The summary users read: a JSON document (schema in README.md) and a
rich table built from it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from memtrace.analysis.findings import DEFAULT, Thresholds, compute
from memtrace.core import apis
from memtrace.core.abi import BATCH_MAX, Direction, Layer, Stat
from memtrace.core.units import human_bytes, human_seconds
from memtrace.model import Model, describe

SCHEMA_VERSION = 1


class Library(Protocol):
    """A file memtrace attached probes to, as the report names it."""

    @property
    def name(self) -> str: ...
    @property
    def layer(self) -> Layer: ...
    @property
    def symbols(self) -> dict[str, int]: ...


def summary(
    model: Model,
    stats: dict[Stat, int],
    libraries: Sequence[Library],
    command: dict[str, Any] | None = None,
    malformed: int = 0,
    thresholds: Thresholds = DEFAULT,
) -> dict[str, Any]:
    rows = []
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0, "errors": 0})
    copies = model.copy_view()
    for key in sorted(copies):
        st = copies[key]
        if st.calls == 0:
            continue
        layer, api, direction, sync, host = describe(key)
        proc = model.processes.get(key[0])
        h = st.durations
        seconds = st.duration_ns / 1e9
        rows.append(
            {
                "pid": key[0],
                "process": proc.name if proc else "",
                "layer": layer,
                "api": api,
                "direction": direction,
                "host_memory": host,
                "synchronous": sync,
                "calls": st.calls,
                "bytes": st.bytes,
                "errors": st.errors,
                "duration_seconds": {
                    "p50": h.quantile(0.50),
                    "p95": h.quantile(0.95),
                    "p99": h.quantile(0.99),
                    "max": h.max if h.count else 0.0,
                    "sum": seconds,
                },
                "bandwidth_bytes_per_second": st.bytes / seconds if seconds > 0 else None,
            }
        )
        t = totals[direction]
        t["calls"] += st.calls
        t["bytes"] += st.bytes
        t["errors"] += st.errors
    return {
        "schema": SCHEMA_VERSION,
        "memcpy": rows,
        "totals": {d.label: totals[d.label] for d in Direction if d.label in totals},
        "device_memory": device_memory(model),
        "synchronization": synchronization(model),
        "launches": launches(model),
        "findings": [f.as_dict() for f in compute(model, thresholds)],
        "agent": {
            "events": stats.get(Stat.EVENTS, 0),
            "dropped": stats.get(Stat.DROPPED, 0),
            "calls_without_event": sum(v[0] for v in model.lost.values()) + stats.get(Stat.TOTALS_FULL, 0),
            "abandoned_calls": stats.get(Stat.ABANDONED, 0),
            "untracked_calls": stats.get(Stat.INFLIGHT_FULL, 0)
            + stats.get(Stat.TOTALS_FULL, 0)
            + stats.get(Stat.COUNTS_FULL, 0),
            "nested_driver_calls": stats.get(Stat.NESTED, 0),
            # Calls made inside a probed call of the same layer: the outer call's work, counted once as it.
            "nested_same_layer_calls": stats.get(Stat.NESTED_SAME, 0),
            # Calls whose return was never seen (probes attached mid-call): not counted.
            "unreturned_calls": stats.get(Stat.UNRETURNED, 0),
            # Batch copies with more copies than BPF reads: the bytes past the bound are missing.
            "batch_truncated_calls": stats.get(Stat.BATCH_TRUNCATED, 0),
            "holds": stats.get(Stat.HOLDS, 0),
            "hold_missed": stats.get(Stat.HOLD_MISSED, 0),
            "malformed_records": malformed,
            "libraries": [
                {"path": a.name, "layer": a.layer.label, "probes": len(a.symbols), "symbols": sorted(a.symbols)}
                for a in libraries
            ],
        },
        **({"command": command} if command else {}),
    }


def device_memory(model: Model) -> list[dict[str, Any]]:
    out = []
    for pid, p in sorted(model.processes.items()):
        m = p.memory
        if not (m.allocations or m.frees or m.unknown_frees or m.failed_allocations or p.book.pinned_bytes):
            continue
        out.append(
            {
                "pid": pid,
                "process": p.name,
                "allocations": m.allocations,
                "allocated_bytes": m.allocated_bytes,
                "frees": m.frees,
                "freed_bytes": m.freed_bytes,
                "unknown_frees": m.unknown_frees,
                "failed_allocations": m.failed_allocations,
                "in_use_bytes": m.in_use_bytes,
                "peak_bytes": m.peak_bytes,
                "outstanding": m.outstanding,
                "exited": p.exited,
                "allocation_size_bytes": {"p50": m.sizes.quantile(0.5), "max": m.sizes.max if m.sizes.count else 0.0},
                "pinned_host_bytes": p.book.pinned_bytes,
                "lost_calls": model.lost_memory_calls(pid),
            }
        )
    return out


def synchronization(model: Model) -> list[dict[str, Any]]:
    out = []
    syncs = model.sync_view()
    waited: dict[int, int] = defaultdict(int)
    for (pid, _api), st in syncs.items():
        waited[pid] += st.duration_ns
    for (pid, api), st in sorted(syncs.items()):
        a = apis.BY_ID.get(api)
        p = model.processes.get(pid)
        wall = p.wall_ns() if p else 0
        h = st.durations
        out.append(
            {
                "pid": pid,
                "process": p.name if p else "",
                "layer": a.layer.label if a else "driver",
                "api": apis.api_name(api),
                "kind": a.sync.value if a and a.sync else "other",
                "calls": st.calls,
                "errors": st.errors,
                "duration_seconds": {
                    "p50": h.quantile(0.50),
                    "p99": h.quantile(0.99),
                    "max": h.max if h.count else 0.0,
                    "sum": st.duration_ns / 1e9,
                },
                "share_of_wall_time": waited[pid] / wall if wall else None,
            }
        )
    return out


def launches(model: Model) -> list[dict[str, Any]]:
    out = []
    for (pid, api), n in sorted(model.launches.items()):
        a = apis.BY_ID.get(api)
        p = model.processes.get(pid)
        out.append(
            {
                "pid": pid,
                "process": p.name if p else "",
                "api": apis.api_name(api),
                "kind": a.launch.value if a and a.launch else "kernel",
                "launches": n,
            }
        )
    return out


def print_table(doc: dict[str, Any], console: Console) -> None:
    t = Table(title="memtrace: CUDA memory copies", title_justify="left")
    for col, kw in (
        ("pid", {"justify": "right"}),
        ("process", {}),
        ("layer", {}),
        ("api", {}),
        ("dir", {}),
        ("host", {}),
        ("calls", {"justify": "right"}),
        ("bytes", {"justify": "right"}),
        ("err", {"justify": "right"}),
        ("p50", {"justify": "right"}),
        ("p99", {"justify": "right"}),
        ("max", {"justify": "right"}),
        ("GB/s", {"justify": "right"}),
    ):
        t.add_column(col, **kw)
    for r in doc["memcpy"]:
        d = r["duration_seconds"]
        bw = r["bandwidth_bytes_per_second"]
        bws = "-" if bw is None else f"{bw / 1e9:.2f}"
        if not r["synchronous"] and bw is not None:
            bws = f"[dim]{bws}*[/dim]"
        t.add_row(
            str(r["pid"]),
            r["process"],
            r["layer"],
            r["api"],
            r["direction"],
            r["host_memory"] or "",
            f"{r['calls']:,}",
            human_bytes(r["bytes"]),
            str(r["errors"]) if r["errors"] else "",
            human_seconds(d["p50"]),
            human_seconds(d["p99"]),
            human_seconds(d["max"]),
            bws,
        )
    console.print(t)
    tt = Table(title="totals by direction", title_justify="left")
    for col in ("direction", "calls", "bytes", "errors"):
        tt.add_column(col, justify="right" if col != "direction" else "left")
    for d, v in doc["totals"].items():
        tt.add_row(d, f"{v['calls']:,}", f"{human_bytes(v['bytes'])} ({v['bytes']:,})", str(v["errors"]))
    console.print(tt)
    print_sections(doc, console)
    a = doc["agent"]
    libs = ", ".join(f"{l['path']} ({l['layer']}, {l['probes']} symbols)" for l in a["libraries"]) or "none"
    console.print(f"[bold]libraries[/bold]: {libs}")
    line = f"events {a['events']:,}, dropped {a['dropped']:,}"
    if a["abandoned_calls"] or a["untracked_calls"]:
        line += f", abandoned {a['abandoned_calls']}, untracked {a['untracked_calls']}"
    if a.get("unreturned_calls"):
        line += f", unreturned {a['unreturned_calls']}"
    console.print(f"[bold]agent[/bold]: {line}")
    if a.get("batch_truncated_calls"):
        console.print(
            f"[yellow]{a['batch_truncated_calls']:,} batch copy calls had more than {BATCH_MAX} copies: "
            f"the bytes of the copies past the first {BATCH_MAX} are not counted.[/yellow]"
        )
    if any(not r["synchronous"] for r in doc["memcpy"]):
        console.print(
            "[dim]* asynchronous calls: bytes ÷ call time; the call may return before the transfer ends[/dim]"
        )
    if a["dropped"]:
        console.print(
            f"[yellow]{a['dropped']:,} events were dropped (ring full): totals stay exact, "
            "duration percentiles cover the rest. Raise --ring-size.[/yellow]"
        )


def print_sections(doc: dict[str, Any], console: Console) -> None:
    """Device memory, waits, launches and findings, under the copy table."""
    if doc.get("device_memory"):
        t = Table(title="device memory", title_justify="left")
        for col in (
            "pid",
            "process",
            "allocs",
            "allocated",
            "frees",
            "unknown frees",
            "in use",
            "peak",
            "outstanding",
            "pinned host",
        ):
            t.add_column(col, justify="left" if col == "process" else "right")
        for m in doc["device_memory"]:
            t.add_row(
                str(m["pid"]),
                m["process"],
                f"{m['allocations']:,}",
                human_bytes(m["allocated_bytes"]),
                f"{m['frees']:,}",
                str(m["unknown_frees"]) if m["unknown_frees"] else "",
                human_bytes(m["in_use_bytes"]),
                human_bytes(m["peak_bytes"]),
                f"{m['outstanding']:,}",
                human_bytes(m["pinned_host_bytes"]),
            )
        console.print(t)
    if doc.get("synchronization"):
        t = Table(title="synchronisation waits", title_justify="left")
        for col in ("pid", "process", "api", "calls", "p50", "p99", "total", "share of wall"):
            t.add_column(col, justify="left" if col in ("process", "api") else "right")
        for w in doc["synchronization"]:
            d = w["duration_seconds"]
            share = w["share_of_wall_time"]
            t.add_row(
                str(w["pid"]),
                w["process"],
                w["api"],
                f"{w['calls']:,}",
                human_seconds(d["p50"]),
                human_seconds(d["p99"]),
                human_seconds(d["sum"]),
                "-" if share is None else f"{share:.0%}",
            )
        console.print(t)
    if doc.get("launches"):
        per: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for l in doc["launches"]:
            per[(l["pid"], l["process"])][l["kind"]] += l["launches"]
        line = "; ".join(
            f"{proc or pid}: " + ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items()))
            for (pid, proc), kinds in sorted(per.items())
        )
        console.print(f"[bold]launches[/bold]: {line}")
    for f in doc.get("findings", []):
        console.print(
            f"[bold yellow]finding[/bold yellow] ({f['process'] or f['pid']}): {f['summary']}.\n"
            f"  [bold]fix[/bold]: {f['fix']}"
        )
