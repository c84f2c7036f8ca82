"""A timeline (export/timeline.py) as one self-contained HTML page with an
inline SVG: no script from the network, no tool to install; a browser
opens it as a file.

Per process, one lane each for its steps (coloured by how long each took
against the process's median step: the slow ones stand out), its copies
by direction (H2D, D2H, D2D, the rest), its waits, its collectives and
its memory calls, and one lane per stream for its launches (where they
were probed: `run --timeline` records them); each diagnosis as a band
from its onset to its detection, across every lane, with its cause. A
hover names what is under the pointer. Calls narrower than a pixel are
drawn merged with their neighbours in the lane (the tooltip says how
many), so the page stays small whatever the run made. A stream with more
launches than LAUNCH_SLICES is drawn as its launch rate instead: a bar
every RATE_PX pixels, as high as its launches there against the lane's
busiest bar (the tooltip says how many, and the rate). A process whose
launches the overhead budget sampled has no slice for the launches it did
not probe: its launch rate, as the recorder's counter has it (estimated
where sampled), is drawn in a lane of its own, `launch rate (estimated)`,
a bar per counter interval as high as its rate against the lane's
highest, with the counter's note (the duty it was sampled at).
"""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field

import numpy as np

from memtrace.core.abi import Direction, Family
from memtrace.core.apis import api_name
from memtrace.core.nccl import Collective
from memtrace.export.timeline import FAMILY, CounterTrack, Timeline

WIDTH = 1200  # the time axis, px
LABEL = 170  # the lane names' column, px
LANE = 22  # px a lane
GAP = 14  # px between processes
COLOURS = {
    "steps": "#4c78a8",
    "h2d": "#f58518",
    "d2h": "#54a24b",
    "d2d": "#b279a2",
    "other copies": "#9d755d",
    "waits": "#e45756",
    "collectives": "#72b7b2",
    "memory": "#bab0ac",
}
LANES = tuple(COLOURS)
LAUNCH_COLOUR = "#8c6bb1"
LAUNCH_SLICES = 400  # a stream's launches drawn one by one up to this many; its rate above
RATE_PX = 4  # px of time per bar of a launch rate


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _secs(ns: float) -> str:
    s = ns / 1e9
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


@dataclass
class _Lane:
    name: str
    spans: list[tuple[int, int, int, str]] = field(default_factory=list)  # begin, end, bytes, tooltip
    colours: list[str] = field(default_factory=list)  # per span (steps), else the lane's
    stream: int | None = None  # a launch lane's stream


def _copy_lane(d: int) -> str:
    return {int(Direction.H2D): "h2d", int(Direction.D2H): "d2h", int(Direction.D2D): "d2d"}.get(d, "other copies")


def render(tl: Timeline, title: str = "") -> str:
    """The page's text."""
    t0 = tl.start_ns
    t1 = max(tl.end_ns, t0 + 1)
    scale = WIDTH / (t1 - t0)

    def x(ns: int) -> float:
        return LABEL + (min(max(ns, t0), t1) - t0) * scale

    ev = tl.events
    calls = tl.calls()
    nbytes = tl.call_bytes()
    lanes: dict[int, dict[str, _Lane]] = {}

    def lane(pid: int, name: str) -> _Lane:
        return lanes.setdefault(pid, {}).setdefault(name, _Lane(name))

    direction = tl.directions if len(tl.directions) == len(ev) else ev["direction"]
    for i in calls.tolist():
        pid, begin = int(ev["pid"][i]), int(ev["ts_ns"][i])
        end = begin + int(ev["duration_ns"][i])
        fam, api = int(FAMILY[ev["api"][i]]), api_name(int(ev["api"][i]))
        b = int(nbytes[i])
        if fam == Family.COPY:
            d = int(direction[i])
            label = Direction(d).label if d <= max(Direction) else str(d)
            lane(pid, _copy_lane(d)).spans.append(
                (begin, end, b, f"{label} copy {_bytes(b)}, {_secs(end - begin)}, {api}")
            )
        elif fam == Family.SYNC:
            lane(pid, "waits").spans.append((begin, end, 0, f"{api} {_secs(end - begin)}"))
        elif fam == Family.MEM:
            lane(pid, "memory").spans.append((begin, end, b, f"{api} {_bytes(b)}"))
    coll = tl.collectives
    for i in range(len(coll)):
        begin = int(coll["ts_ns"][i])
        end = begin + int(coll["duration_ns"][i])
        try:
            name = Collective(int(coll["coll"][i])).label
        except ValueError:
            name = "collective"
        b = int(coll["bytes"][i])
        lane(int(coll["pid"][i]), "collectives").spans.append(
            (begin, end, b, f"{name} {_bytes(b)}, {_secs(end - begin)}")
        )
    launches = tl.launches()
    for i in launches.tolist():
        pid, begin, stream = int(ev["pid"][i]), int(ev["ts_ns"][i]), int(ev["stream"][i])
        end = begin + int(ev["duration_ns"][i])
        name = f"launches {stream:#x}"
        ln = lane(pid, name)
        ln.stream = stream
        ln.spans.append((begin, end, 0, f"{api_name(int(ev['api'][i]))} on stream {stream:#x}, {_secs(end - begin)}"))
    by_pid: dict[int, list[int]] = {}
    for s in tl.steps:
        if s.steps == 1:
            by_pid.setdefault(s.pid, []).append(s.end_ns - s.start_ns)
    for k, s in enumerate(tl.steps):
        durations = by_pid.get(s.pid)
        median = statistics.median(durations) if durations else 0
        d = s.end_ns - s.start_ns
        tip = f"step: {_secs(d)}" if s.steps == 1 else f"{s.steps} steps: {_secs(d)}"
        if s.breakdown:
            tip += "; " + ", ".join(f"{k} {v / max(d, 1):.0%}" for k, v in s.breakdown.items())
        ln = lane(s.pid, "steps")
        ln.spans.append((s.start_ns, s.end_ns, 0, tip))
        # Slower than the median: redder, up to twice the median.
        slow = min(max(d / median - 1, 0.0), 1.0) if median and s.steps == 1 else 0.0
        # Alternate shades, so that steps side by side read as steps.
        ln.colours.append(f"hsl({210 - 210 * slow:.0f},60%,{55 - 10 * slow + 8 * (k % 2):.0f}%)")

    # Launch rates of processes whose launches were sampled: no slice for those not probed.
    estimated = {
        c.pid: c
        for c in tl.counters
        if c.pid is not None and c.name == "launch rate" and c.note.startswith("estimated") and c.points
    }
    for pid in estimated:
        lanes.setdefault(pid, {})
    rows: list[str] = []
    y = 40
    for pid in sorted(lanes):
        name = tl.processes.get(pid, "")
        rows.append(f'<text class="proc" x="4" y="{y + 14}">{html.escape(name)} ({pid})</text>')
        y += LANE
        for lname in LANES:
            drawn = lanes[pid].get(lname)
            if drawn is None:
                continue
            rows.append(_draw_lane(drawn, pid, y, x))
            y += LANE
        for ln in sorted((v for v in lanes[pid].values() if v.stream is not None), key=lambda v: v.stream or 0):
            few = len(ln.spans) <= LAUNCH_SLICES
            rows.append(_draw_lane(ln, pid, y, x) if few else _draw_rate(ln, pid, y, t0, t1))
            y += LANE
        track = estimated.get(pid)
        if track is not None:
            rows.append(_draw_counter_rate(track, pid, y, x))
            y += LANE
        y += GAP
    height = y + 30
    marks: list[str] = []
    for inst in tl.instants:
        if inst.category != "diagnosis":
            continue
        onset = int(inst.args.get("onset_ns", inst.ts_ns))
        x0, x1 = x(onset), x(inst.ts_ns)
        tip = html.escape(f"{inst.name}: {inst.args.get('symptom', '')}; fix: {inst.args.get('fix', '')}")
        marks.append(
            f'<g class="diagnosis" data-cause="{html.escape(str(inst.args.get("cause", "")))}" '
            f'data-pid="{inst.pid if inst.pid is not None else ""}"><title>{tip}</title>'
            f'<rect x="{x0:.2f}" y="30" width="{max(x1 - x0, 2):.2f}" height="{height - 60}" '
            f'fill="#e45756" fill-opacity="0.15"/>'
            f'<line x1="{x1:.2f}" x2="{x1:.2f}" y1="30" y2="{height - 30}" stroke="#c00" stroke-width="2"/>'
            f'<text x="{x1 + 3 if x1 < LABEL + 0.7 * WIDTH else x1 - 3:.2f}" y="26" fill="#c00" '
            f'text-anchor="{"start" if x1 < LABEL + 0.7 * WIDTH else "end"}">{html.escape(inst.name)}</text></g>'
        )
    axis = _axis(t0, t1, x, height)
    label = html.escape(title or tl.title or "memtrace timeline")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{label}</title>
<style>
body {{ font: 12px sans-serif; margin: 8px; }}
svg text {{ font: 11px sans-serif; }}
svg text.proc {{ font-weight: bold; }}
rect.s:hover {{ stroke: #000; }}
</style></head>
<body>
<h3 id="title">{label}</h3>
<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{LABEL + WIDTH + 20}" height="{height}"
 data-start-ns="{t0}" data-end-ns="{t1}" data-label-px="{LABEL}" data-width-px="{WIDTH}">
{axis}
{"".join(rows)}
{"".join(marks)}
</svg>
<p>Times are CLOCK_MONOTONIC, from {_secs(0)} at the left edge to {_secs(t1 - t0)}; hover for detail.
Steps are redder the slower they were than the process's median step. A launch lane is one stream's
launches: each from its call's entry to its return where few, else their rate (bars as high as the
launches they hold, against the lane's busiest). Where the overhead budget sampled a process's launches,
its launch rate lane holds what the probes did not see: estimated, at the duty its tooltip gives.</p>
</body></html>
"""


def _draw_lane(ln: _Lane, pid: int, y: int, x: object) -> str:
    """A lane's spans, those that would overlap on screen (under a pixel apart) merged into one rectangle."""
    assert callable(x)
    spans = ln.spans
    order = np.argsort(np.array([s[0] for s in spans], np.int64), kind="stable")
    out: list[str] = []
    total_bytes = sum(s[2] for s in spans)
    cur: list[int] = []
    cur_x0 = cur_x1 = 0.0

    def flush() -> None:
        if not cur:
            return
        first = spans[cur[0]]
        if len(cur) == 1:
            tip = first[3]
        else:
            b = sum(spans[j][2] for j in cur)
            tip = f"{len(cur)} {ln.name} calls" + (f", {_bytes(b)}" if b else "")
        colour = ln.colours[cur[0]] if ln.colours else COLOURS.get(ln.name, LAUNCH_COLOUR)
        width = max(cur_x1 - cur_x0, 1.0)
        if ln.name == "steps" and width > 3.0:
            width -= 1.0  # a hairline between steps wide enough to spare it
        out.append(
            f'<rect class="s" x="{cur_x0:.2f}" y="{y + 3}" width="{width:.2f}" height="{LANE - 6}" '
            f'fill="{colour}" data-n="{len(cur)}" data-begin-ns="{first[0]}" '
            f'data-end-ns="{max(spans[j][1] for j in cur)}"><title>{html.escape(tip)}</title></rect>'
        )
        cur.clear()

    for j in order.tolist():
        b, e, _n, _t = spans[j]
        x0, x1 = x(b), x(e)
        # Steps are drawn one by one (they tile the lane); calls under a pixel apart are merged.
        if cur and ln.name != "steps" and x0 - cur_x1 < 1.0:
            cur.append(j)
            cur_x1 = max(cur_x1, x1)
            continue
        flush()
        cur.append(j)
        cur_x0, cur_x1 = x0, x1
    flush()
    return (
        f'<g class="lane" data-lane="{ln.name}" data-pid="{pid}" data-calls="{len(spans)}" '
        f'data-bytes="{total_bytes}"{_stream_attrs(ln, "slices")}><text x="14" y="{y + 15}">{ln.name}</text>'
        f"{''.join(out)}</g>"
    )


def _stream_attrs(ln: _Lane, mode: str) -> str:
    return "" if ln.stream is None else f' data-stream="{ln.stream}" data-mode="{mode}"'


def _draw_rate(ln: _Lane, pid: int, y: int, t0: int, t1: int) -> str:
    """A launch lane as its rate: the launches begun in each RATE_PX pixels of
    time, a bar each (none where none), as high as its count against the busiest."""
    bins = -(-WIDTH // RATE_PX)
    per = (t1 - t0) * RATE_PX / WIDTH  # ns a bar
    edges = t0 + (np.arange(bins + 1) * per).astype(np.int64)  # a bar holds the launches begun in [its edge, the next)
    begins = np.array([s[0] for s in ln.spans], np.int64)
    k = np.clip(np.searchsorted(edges, begins, side="right") - 1, 0, bins - 1)
    counts = np.bincount(k, minlength=bins)
    peak = int(counts.max()) if len(counts) else 0
    out: list[str] = []
    full = LANE - 6
    for b in np.flatnonzero(counts).tolist():
        n = int(counts[b])
        lo, hi = int(edges[b]), int(edges[b + 1])
        rate = n / (per / 1e9)
        h = max(full * n / peak, 1.0)
        tip = f"{n} launches in {_secs(per)} on stream {ln.stream or 0:#x}: {rate:,.0f}/s"
        out.append(
            f'<rect class="s" x="{LABEL + b * RATE_PX:.2f}" y="{y + 3 + full - h:.2f}" width="{RATE_PX}" '
            f'height="{h:.2f}" fill="{LAUNCH_COLOUR}" data-n="{n}" data-begin-ns="{lo}" data-end-ns="{hi}" '
            f'data-rate="{rate:.1f}"><title>{html.escape(tip)}</title></rect>'
        )
    return (
        f'<g class="lane" data-lane="{ln.name}" data-pid="{pid}" data-calls="{len(ln.spans)}" data-bytes="0" '
        f'data-peak="{peak}"{_stream_attrs(ln, "rate")}><text x="14" y="{y + 15}">{ln.name}</text>'
        f"{''.join(out)}</g>"
    )


def _draw_counter_rate(track: CounterTrack, pid: int, y: int, x: object) -> str:
    """A process's launch rate counter as bars: each from the point before it to its own,
    as high as its rate against the highest; the lane says what the counter's note says."""
    assert callable(x)
    pts = sorted(track.points)
    peak = max((v for _t, v in pts), default=0.0)
    full = LANE - 6
    out: list[str] = []
    for (a, _), (b, rate) in zip(pts, pts[1:], strict=False):
        if rate <= 0 or peak <= 0:
            continue
        h = max(full * rate / peak, 1.0)
        x0, x1 = x(a), x(b)
        tip = f"{rate:,.0f} launches/s ({track.note})"
        out.append(
            f'<rect class="s" x="{x0:.2f}" y="{y + 3 + full - h:.2f}" width="{max(x1 - x0, 1.0):.2f}" '
            f'height="{h:.2f}" fill="{LAUNCH_COLOUR}" fill-opacity="0.55" data-begin-ns="{a}" data-end-ns="{b}" '
            f'data-rate="{rate:.1f}"><title>{html.escape(tip)}</title></rect>'
        )
    name = "launch rate (estimated)"
    return (
        f'<g class="lane" data-lane="{name}" data-pid="{pid}" data-calls="0" data-bytes="0" data-mode="estimated" '
        f'data-peak="{peak:.1f}" data-note="{html.escape(track.note)}"><title>{html.escape(track.note)}</title>'
        f'<text x="14" y="{y + 15}">{name}</text>{"".join(out)}</g>'
    )


def _axis(t0: int, t1: int, x: object, height: int) -> str:
    assert callable(x)
    span = (t1 - t0) / 1e9
    step = 10 ** np.floor(np.log10(max(span, 1e-9) / 2)) if span > 0 else 1.0
    if span / step > 10:
        step *= 2
    ticks = []
    k = 0
    while k * step <= span + 1e-12 and k < 100:
        px = x(t0 + int(k * step * 1e9))
        ticks.append(
            f'<line x1="{px:.2f}" x2="{px:.2f}" y1="30" y2="{height - 30}" stroke="#ddd"/>'
            f'<text x="{px:.2f}" y="{height - 16}" text-anchor="middle">{k * step:.3g} s</text>'
        )
        k += 1
    return '<g class="axis">' + "".join(ticks) + "</g>"
