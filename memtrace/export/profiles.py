"""Call sites as profiles: pprof (profile.proto, gzipped) and a
self-contained interactive SVG flame graph.

pprof: one sample per call site, its frames innermost first (the CUDA call
itself is the leaf), with five values: copies, copy bytes, allocations,
allocated bytes, and bytes still in use; the process, api, direction and
host memory are labels. `go tool pprof -sample_index=copy_bytes FILE`
reads it. The message is written field by field from profile.proto's
wire format (github.com/google/pprof/proto/profile.proto): a few varints
and length-delimited fields, where a generated module would need protoc.

The flame graph is an SVG with its script inside: no network is needed to
view it; a click zooms to a frame, a hover names it with its bytes.
"""

from __future__ import annotations

import gzip
import html
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SAMPLE_TYPES = (
    ("copies", "count"),
    ("copy_bytes", "bytes"),
    ("allocations", "count"),
    ("allocated_bytes", "bytes"),
    ("in_use_bytes", "bytes"),
)


# ---- protobuf wire format ----


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf does
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_varint(num: int, n: int) -> bytes:
    return _varint(num << 3) + _varint(n) if n else b""


def _field_bytes(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _packed(num: int, values: Iterable[int]) -> bytes:
    data = b"".join(_varint(v) for v in values)
    return _field_bytes(num, data) if data else b""


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def pprof(sites: Sequence[Mapping[str, Any]], time_ns: int | None = None) -> bytes:
    """The call sites (the summary's `stacks`) as a gzipped pprof profile."""
    s = _Strings()
    mappings: dict[tuple[str, str], int] = {}
    functions: dict[tuple[str, str, int], int] = {}
    locations: dict[tuple[Any, ...], int] = {}
    mapping_msgs: list[bytes] = []
    function_msgs: list[bytes] = []
    location_msgs: list[bytes] = []
    samples: list[bytes] = []

    def function_id(name: str, filename: str, start: int = 0) -> int:
        key = (name, filename, start)
        if key not in functions:
            fid = functions[key] = len(functions) + 1
            msg = _field_varint(1, fid) + _field_varint(2, s(name)) + _field_varint(3, s(name))
            msg += _field_varint(4, s(filename)) + _field_varint(5, start)
            function_msgs.append(msg)
        return functions[key]

    def location_id(f: dict[str, Any]) -> int:
        if "file" in f:  # a Python frame: its function at its line
            key: tuple[Any, ...] = ("py", f["function"], f["file"], f["line"])
        else:
            key = ("native", f["module"], f["offset"], f.get("function"))
        if key in locations:
            return locations[key]
        lid = locations[key] = len(locations) + 1
        msg = _field_varint(1, lid)
        if "file" in f:
            name = str(f["function"])
            if name.startswith("<") and name.endswith(">"):
                name = f"[{name[1:-1]}]"  # pprof drops a name wholly in <> (C++ template arguments)
            line = _field_varint(1, function_id(name, f["file"])) + _field_varint(2, f["line"] or 0)
        else:
            mkey = (f["module"], f.get("build_id", ""))
            if mkey not in mappings:
                mid = mappings[mkey] = len(mappings) + 1
                # has_functions: named here already, so pprof does not symbolize (the file may be gone)
                head = _field_varint(1, mid) + _field_varint(5, s(mkey[0]))
                mapping_msgs.append(head + _field_varint(6, s(mkey[1])) + _field_varint(7, 1))
            msg += _field_varint(2, mappings[mkey]) + _field_varint(3, f["offset"])
            name = f.get("function") or f"{f['module'].rsplit('/', 1)[-1]}+{f['offset']:#x}"
            line = _field_varint(1, function_id(name, f["module"]))
        location_msgs.append(msg + _field_bytes(4, line))
        return lid

    for site in sites:
        frames = site["frames"] or [{"module": "[no stack]", "offset": 0, "function": site["api"]}]
        locs = [location_id(f) for f in frames]  # innermost first, as pprof wants
        if site["kind"] == "copy":
            values = [site["calls"], site["bytes"], 0, 0, 0]
        else:
            values = [0, 0, site["calls"], site["bytes"], site.get("in_use_bytes", 0)]
        labels = [("process", f"{site['process'] or 'pid'} ({site['pid']})"), ("api", site["api"])]
        labels += [(k, site[k]) for k in ("direction", "host_memory") if site.get(k)]
        msg = _packed(1, locs) + _packed(2, values)
        for k, v in labels:
            msg += _field_bytes(3, _field_varint(1, s(k)) + _field_varint(2, s(str(v))))
        msg += _field_bytes(3, _field_varint(1, s("pid")) + _field_varint(3, site["pid"]))
        samples.append(msg)

    out = b"".join(_field_bytes(1, _field_varint(1, s(t)) + _field_varint(2, s(u))) for t, u in SAMPLE_TYPES)
    out += b"".join(_field_bytes(2, m) for m in samples)
    out += b"".join(_field_bytes(3, m) for m in mapping_msgs)
    out += b"".join(_field_bytes(4, m) for m in location_msgs)
    out += b"".join(_field_bytes(5, m) for m in function_msgs)
    out += b"".join(_field_bytes(6, x.encode()) for x in s.table)
    out += _field_varint(9, time_ns if time_ns is not None else time.time_ns())
    out += _field_varint(14, 1 + SAMPLE_TYPES.index(("copy_bytes", "bytes")))  # default_sample_type
    return gzip.compress(out, mtime=0)


# ---- flame graph ----


class _Node:
    __slots__ = ("children", "name", "value")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0
        self.children: dict[str, _Node] = {}


def _tree(folded_text: str) -> _Node:
    root = _Node("all")
    for line in folded_text.splitlines():
        path, _, weight = line.rpartition(" ")
        w = int(weight)
        root.value += w
        node = root
        for name in path.split(";"):
            node = node.children.setdefault(name, _Node(name))
            node.value += w
    return root


ROW = 17
WIDTH = 1200


def flame_graph(folded_text: str, title: str, unit: str = "bytes") -> str:
    """An SVG flame graph of folded stacks (outermost first), widths by
    weight, with its own script: click a frame to zoom to it, click the
    title to reset; each frame's tooltip says its weight and share."""
    root = _tree(folded_text)
    rects: list[str] = []

    def depth(n: _Node) -> int:
        return 1 + max((depth(c) for c in n.children.values()), default=0)

    levels = depth(root)
    height = (levels + 3) * ROW + 10
    total = root.value or 1

    def draw(n: _Node, x: float, level: int) -> None:
        w = n.value / total
        y = height - (level + 1) * ROW - 5
        share = n.value / total
        label = html.escape(n.name)
        tip = html.escape(f"{n.name}: {n.value:,} {unit} ({share:.1%})")
        # Python frames green, native frames orange ("function (module)", or
        # "module+0x..." unnamed), the process (level 1: "name (pid)"), the root
        # and the call itself blue.
        native = level > 1 and (" (" in n.name or "+0x" in n.name)
        base = 90 if ".py:" in n.name else 20 if native else 210
        hue = base + zlib.crc32(n.name.encode()) % 30
        rects.append(
            f'<g class="f" data-x="{x:.6f}" data-w="{w:.6f}" data-n="{label}"><title>{tip}</title>'
            f'<rect x="{x * 100:.4f}%" y="{y}" width="{w * 100:.4f}%" height="{ROW - 1}" '
            f'fill="hsl({hue},80%,60%)" rx="2"/>'
            f'<text x="{x * 100:.4f}%" y="{y + ROW - 5}" dx="3">{label}</text></g>'
        )
        cx = x
        for c in sorted(n.children.values(), key=lambda c: c.name):
            draw(c, cx, level + 1)
            cx += c.value / total

    draw(root, 0.0, 0)
    script = """
var fs=[].slice.call(document.querySelectorAll('g.f'));
function show(x0,w0){fs.forEach(function(g){var x=+g.dataset.x,w=+g.dataset.w;
var on=x+w>x0+1e-9&&x<x0+w0-1e-9, nx=(x-x0)/w0, nw=w/w0;
g.style.display=on?'':'none';if(!on)return;
var r=g.querySelector('rect'),t=g.querySelector('text');
r.setAttribute('x',(nx*100)+'%');r.setAttribute('width',(nw*100)+'%');t.setAttribute('x',(nx*100)+'%');
var px=nw*document.documentElement.getBoundingClientRect().width, n=g.dataset.n;
t.textContent=px<30?'':(n.length*7>px-6?n.slice(0,Math.max(0,Math.floor((px-6)/7)-2))+'..':n);});}
fs.forEach(function(g){g.addEventListener('click',function(){show(+g.dataset.x,+g.dataset.w);});});
document.getElementById('title').addEventListener('click',function(){show(0,1);});
show(0,1);
"""
    return (
        f'<?xml version="1.0" standalone="no"?>\n'
        f'<svg version="1.1" width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">\n'
        "<style>text{font:12px monospace;fill:#000;pointer-events:none}g.f{cursor:pointer}"
        "#title{font:bold 15px sans-serif;cursor:pointer;pointer-events:auto}</style>\n"
        f'<rect width="100%" height="100%" fill="#fdfdf6"/>\n'
        f'<text id="title" x="6" y="20">{html.escape(title)}</text>\n'
        '<text x="6" y="36" style="font:11px sans-serif;fill:#555">click a frame to zoom; the title to reset; '
        "hover for bytes</text>\n" + "\n".join(rects) + f"\n<script><![CDATA[{script}]]></script>\n</svg>\n"
    )
