"""The summary users read: a JSON document (schema in README.md) and a
rich table built from it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from .abi import Direction, Stat
from .bpfsource import Attachment
from .model import Model, describe

SCHEMA_VERSION = 1


def summary(
    model: Model,
    stats: dict[Stat, int],
    libraries: list[Attachment],
    command: dict[str, Any] | None = None,
    malformed: int = 0,
) -> dict[str, Any]:
    rows = []
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0, "errors": 0})
    for key in sorted(model.copies):
        st = model.copies[key]
        if st.calls == 0:
            continue
        layer, api, direction, sync = describe(key)
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
    calls = sum(r["calls"] for r in rows)
    return {
        "schema": SCHEMA_VERSION,
        "memcpy": rows,
        "totals": {d.label: totals[d.label] for d in Direction if d.label in totals},
        "agent": {
            "events": stats.get(Stat.EVENTS, 0),
            "dropped": stats.get(Stat.DROPPED, 0),
            "calls_without_event": calls - model.events,
            "abandoned_calls": stats.get(Stat.ABANDONED, 0),
            "untracked_calls": stats.get(Stat.INFLIGHT_FULL, 0) + stats.get(Stat.TOTALS_FULL, 0),
            "nested_driver_calls": stats.get(Stat.NESTED, 0),
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


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def print_table(doc: dict[str, Any], console: Console) -> None:
    t = Table(title="memtrace: CUDA memory copies", title_justify="left")
    for col, kw in (
        ("pid", {"justify": "right"}),
        ("process", {}),
        ("layer", {}),
        ("api", {}),
        ("dir", {}),
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
    a = doc["agent"]
    libs = ", ".join(f"{l['path']} ({l['layer']}, {l['probes']} symbols)" for l in a["libraries"]) or "none"
    console.print(f"[bold]libraries[/bold]: {libs}")
    line = f"events {a['events']:,}, dropped {a['dropped']:,}"
    if a["abandoned_calls"] or a["untracked_calls"]:
        line += f", abandoned {a['abandoned_calls']}, untracked {a['untracked_calls']}"
    console.print(f"[bold]agent[/bold]: {line}")
    if any(not r["synchronous"] for r in doc["memcpy"]):
        console.print(
            "[dim]* asynchronous calls: bytes ÷ call time; the call may return before the transfer ends[/dim]"
        )
    if a["dropped"]:
        console.print(
            f"[yellow]{a['dropped']:,} events were dropped (ring full): totals stay exact, "
            "duration percentiles cover the rest. Raise --ring-size.[/yellow]"
        )
