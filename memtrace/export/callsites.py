"""Call sites: copies and device allocations by the stack that made them,
as the summary's `stacks` list and as folded stacks (flamegraph.pl,
speedscope, inferno)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from memtrace.core import apis
from memtrace.core.stacks import NO_STACK, Frame, PythonFrame, Stack
from memtrace.core.units import human_bytes
from memtrace.export import schema
from memtrace.model import Model


def frame_row(f: Frame) -> schema.Frame:
    """A frame as the summary's `stacks` rows carry it."""
    if isinstance(f, PythonFrame):
        return schema.Frame(function=f.function, file=f.file, line=f.line)
    row = schema.Frame(module=f.module, function=f.function, offset=f.offset)
    if f.build_id:
        row["build_id"] = f.build_id
    return row


def call_sites(model: Model, frames: Mapping[int, Stack]) -> list[schema.CallSite]:
    """Every (process, stack, kind, api, direction, host memory) with its
    calls and bytes, most bytes first. Calls without a stack (none taken,
    or not kept: the agent's `stacks` counts say why) are listed too, with
    no frames, so the list adds up to the copies and allocations seen as
    events."""
    out: list[schema.CallSite] = []
    for p in model.processes.values():
        in_use = p.in_use_by_stack()
        for key, st in p.sites.items():
            stack = frames.get(key.stack)
            row = schema.CallSite(
                pid=p.pid,
                process=p.name,
                kind=key.kind,
                api=apis.api_name(key.api),
                direction=key.direction.label if key.direction is not None else None,
                host_memory=key.host.label,
                calls=st.calls,
                bytes=st.bytes,
                errors=st.errors,
                frames=[frame_row(f) for f in stack.frames] if stack else [],
            )
            if stack is not None and stack.python is not None:
                row["python_frames"] = stack.python
            if key.kind == "alloc":
                row["in_use_bytes"] = in_use.get(key.stack, 0)
            if stack is None:
                row["frames_missing"] = "no stack taken" if key.stack == NO_STACK else "stack not kept"
            out.append(row)
    out.sort(key=lambda r: (-r["bytes"], -r["calls"], r["pid"], r["kind"], r["api"]))
    return out


def folded(sites: Sequence[Mapping[str, Any]], weight: str = "bytes", kind: str | None = "copy") -> str:
    """Folded stacks, outermost frame first, weighted by `weight` (a
    site's `bytes`, `calls` or `in_use_bytes`), for sites of `kind`
    (None: all). The process and the api are the two outermost frames,
    so one graph holds every process and call."""
    lines: dict[str, int] = {}
    for s in sites:
        if kind is not None and s["kind"] != kind:
            continue
        w = int(s.get(weight) or 0)
        if w <= 0:
            continue
        head = f"{s['process'] or 'pid'} ({s['pid']})"
        leaf = s["api"] if s["direction"] is None else f"{s['api']} {s['direction']} {s['host_memory'] or ''}".strip()
        # The innermost frame is the CUDA call itself: its label says what it moved.
        callers = [_label(f) for f in reversed(s["frames"][1:])] if s["frames"] else ["[no stack]"]
        key = ";".join(n.replace(";", ":") for n in (head, *callers, leaf))
        lines[key] = lines.get(key, 0) + w
    return "".join(f"{k} {v}\n" for k, v in sorted(lines.items()))


def _short(f: Mapping[str, Any]) -> str:
    """A frame for a line of text: the function (a Python frame's with its
    file and line; a C++ function without its parameter list), or the file
    and offset."""
    if "file" in f:
        return _label(f)
    return without_parameters(str(f["function"])) if f.get("function") else _label(f)


def without_parameters(name: str) -> str:
    """A demangled C++ name without its parameter list and qualifiers, for a
    line of text (the JSON keeps it whole): `at::native::copy_(at::Tensor&,
    at::Tensor const&, bool)` is `at::native::copy_`."""
    end = name.rfind(")")
    if end < 0 or "(" not in name:
        return name
    depth = 0
    for i in range(end, -1, -1):
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                return name[:i] if i > 0 else name
    return name


def _label(f: Mapping[str, Any]) -> str:
    if "file" in f:  # a Python frame: where in the user's code
        where = str(f["file"]).rsplit("/", 1)[-1]
        return f"{f['function']} ({where}:{f['line']})" if f["line"] is not None else f"{f['function']} ({where})"
    base = str(f["module"]).rsplit("/", 1)[-1]
    return f"{f['function']} ({base})" if f.get("function") else f"{base}+{f['offset']:#x}"


TOP_SITES = 5


def print_call_sites(doc: Mapping[str, Any], console: Console, top: int = TOP_SITES) -> None:
    """The call sites that moved and allocated the most, a line each: what
    was called, then its callers, innermost first (the frames in the
    program's own files; the CUDA call itself is the first word)."""
    sites = doc.get("stacks")
    if not sites:
        return
    for kind, title, weight in (("copy", "copied", "bytes"), ("alloc", "allocated", "bytes")):
        rows = [s for s in sites if s["kind"] == kind and s[weight]]
        if not rows:
            continue
        total = sum(s[weight] for s in rows)
        console.print(f"[bold]call sites[/bold]: most bytes {title}", highlight=False)
        for s in rows[:top]:
            what = s["api"] if s["direction"] is None else f"{s['api']} {s['direction']} {s['host_memory'] or ''}"
            extra = f", {human_bytes(s['in_use_bytes'])} in use" if kind == "alloc" else ""
            calls = f"{s['calls']:,} call{'s' if s['calls'] != 1 else ''}"
            console.print(
                escape(f"  {s[weight] / total:4.0%} {human_bytes(s[weight]):>10} {calls}{extra}: {what.strip()}"),
                highlight=False,
            )
            # The callers, innermost first: on one line when it fits, else one a line.
            callers = [_short(f) for f in s["frames"][1:]] or ["[no stack]"]
            line = "        <- " + " <- ".join(callers)
            if len(line) <= console.width:
                console.print(escape(line), highlight=False, soft_wrap=True)
            else:
                for c in callers:
                    console.print(escape(f"        <- {c}"), highlight=False, soft_wrap=True)
        if len(rows) > top:
            console.print(f"  [dim]{len(rows) - top} more: --format json[/dim]", highlight=False)


def site_label(site: Mapping[str, Any]) -> str | None:
    """Where in the user's code a site's call was made: its innermost Python
    frame (file:line in function), or else the CUDA call's native caller."""
    for f in site["frames"]:
        if "file" in f and f["function"] != "[python]":
            where = str(f["file"]).rsplit("/", 1)[-1]
            return f"{where}:{f['line']} in {f['function']}" if f["line"] is not None else f"{where} in {f['function']}"
    if len(site["frames"]) > 1:
        f = site["frames"][1]
        return _label({**f, "function": without_parameters(str(f["function"]))} if f.get("function") else f)
    return None


TOP_FINDING_SITES = 3


def name_the_lines(findings: Sequence[schema.Finding], sites: Sequence[Mapping[str, Any]]) -> None:
    """Say where a finding's bytes came from, in its summary and its evidence
    (`sites`): for pageable_h2d the call sites (the Python line where there
    is one) that copied most of its pageable bytes; for
    device_memory_growth those that allocated most of what is still in use."""
    for f in findings:
        want: tuple[str, str | None, str | None]  # the sites' (kind, direction, host memory)
        if f["code"] == "pageable_h2d":
            want, weight, total = ("copy", "h2d", "pageable"), "bytes", f["evidence"].get("pageable_bytes")
            say = "of them from"
        elif f["code"] == "device_memory_growth":
            want, weight, total = ("alloc", None, None), "in_use_bytes", f["evidence"].get("in_use_bytes")
            say = "of what is in use allocated at"
        else:
            continue
        by: dict[str, int] = {}
        for s in sites:
            if (s["pid"], s["kind"], s["direction"], s["host_memory"]) != (f["pid"], *want):
                continue
            label = site_label(s)
            if label is not None and s.get(weight):
                by[label] = by.get(label, 0) + s[weight]
        total = total or sum(by.values())
        if not by or not total:
            continue
        top = sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FINDING_SITES]
        f["evidence"]["sites"] = [{"site": k, weight: v, "share": v / total} for k, v in top]
        f["summary"] += f"; {top[0][1] / total:.0%} {say} {top[0][0]}"
