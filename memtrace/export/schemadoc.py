"""docs/json.md, rendered from the JSON summary's schema (export/schema.py):
its short introduction is written here, every section and field comes
from the schema's classes, their docstrings and their fields'
descriptions. A test renders it again and fails when the committed file
differs.

    python -m memtrace.export.schemadoc > docs/json.md
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union

# typing_extensions: its get_origin knows its NotRequired on Python 3.10 too.
from typing_extensions import NotRequired, get_args, get_origin, get_type_hints, is_typeddict  # noqa: UP035

from memtrace.export import schema

INTRO = """\
# JSON output (`--format json`)

`memtrace run --format json` writes one document when the command exits:
the copies, device memory, waits, launches, steps and collectives of every
process it traced, the host around them, what it found and diagnosed, and
its own account. This is schema version {version}: later versions add
fields and never rename these. A field that is not always present (marked
optional) says when it is.

A process is its `pid` and its `start_time_unix_nano` (the kernel's start
time of its thread group leader, as wall-clock ns since the Unix epoch; 0
if unknown): pids are reused, start times are not, so a pid reused during
the run is two processes and two rows, in every per-process section.

This page is generated from `memtrace/export/schema.py`, where every
field is typed and described once, and the code that builds the document
is checked against it: change the schema there, then run
`python -m memtrace.export.schemadoc > docs/json.md`.
"""


_NOT_REQUIRED: Any = NotRequired  # special forms, compared as values
_ANNOTATED: Any = Annotated


@dataclass(frozen=True)
class Field:
    """One field of a schema class."""

    name: str
    type: Any  # the field's type, its description and NotRequired taken off
    description: str
    required: bool


def fields(cls: type) -> list[Field]:
    """A schema class's fields, in their order."""
    out: list[Field] = []
    for name, hint in get_type_hints(cls, include_extras=True).items():
        required = name in cls.__required_keys__  # type: ignore[attr-defined]
        if get_origin(hint) is _NOT_REQUIRED:
            (hint,) = get_args(hint)
        assert get_origin(hint) is _ANNOTATED, f"{cls.__name__}.{name} has no description"
        tp, description = get_args(hint)
        out.append(Field(name, tp, description, required))
    return out


def members(tp: Any) -> tuple[Any, ...]:
    """The types a union allows (a type that is no union: itself)."""
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def sections(root: type = schema.Summary) -> dict[type, list[str]]:
    """Every schema class the document holds, in reading order, with each
    path where it appears (`host.cpu[]`: a row of the list host.cpu;
    `totals.*`: a value of the object totals)."""
    out: dict[type, list[str]] = {root: [""]}

    def visit(tp: Any, path: str) -> None:
        for t in members(tp):
            origin = get_origin(t)
            if origin is list:
                visit(get_args(t)[0], path + "[]")
            elif origin is dict:
                visit(get_args(t)[1], path + ".*")
            elif is_typeddict(t):
                first = t not in out
                out.setdefault(t, []).append(path)
                if first:
                    for f in fields(t):
                        visit(f.type, f"{path}.{f.name}")

    for f in fields(root):
        visit(f.type, f.name)
    return out


def _title(cls: type, paths: list[str]) -> str:
    if paths == [""]:
        return "The document"
    return f"`{paths[0]}`" if len(paths) == 1 else cls.__name__


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _type(tp: Any, links: dict[type, str]) -> str:
    parts = []
    for t in members(tp):
        origin = get_origin(t)
        if t is type(None):
            parts.append("null")
        elif origin is list:
            parts.append("array of " + _type(get_args(t)[0], links))
        elif origin is dict:
            parts.append("object of " + _type(get_args(t)[1], links))
        elif is_typeddict(t):
            parts.append(links[t])
        else:
            parts.append({int: "integer", float: "number", str: "string", bool: "boolean"}.get(t, "any"))
    return " or ".join(parts)


def render() -> str:
    found = sections()
    titles = {cls: _title(cls, paths) for cls, paths in found.items()}
    anchors = [_anchor(t) for t in titles.values()]
    assert len(set(anchors)) == len(anchors), "two sections of docs/json.md would share an anchor"
    links = {cls: f"[{t}](#{_anchor(t)})" for cls, t in titles.items()}
    out = [INTRO.format(version=schema.SCHEMA_VERSION)]
    for cls, paths in found.items():
        out.append(f"\n## {titles[cls]}\n")
        if len(paths) > 1:
            out.append("In " + ", ".join(f"`{p}`" for p in paths) + ".\n")
        out.append(inspect.cleandoc(cls.__doc__ or "") + "\n")
        out.append("| field | type | description |\n|---|---|---|")
        for f in fields(cls):
            kind = _type(f.type, links) + ("" if f.required else ", optional")
            said = f.description.replace("|", "\\|")
            out.append(f"| `{f.name}` | {kind} | {said} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
