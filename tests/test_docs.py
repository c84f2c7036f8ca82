"""The README and docs/ stay true to the tree: every relative link and every
anchor resolves, every repository path they name in code exists, and the
README stays a door (about 300 lines, its blocks within 80 columns).

Paths that another change of this turn is adding are listed in PENDING; one
that exists must leave the list, so the list never outlives its reason."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from conftest import REPO

# Named by the docs before the change that adds them has landed (none now).
PENDING: set[str] = set()

# The documents whose links must resolve: the README, RELIABILITY.md and all of docs/.
LINKED = [REPO / "README.md", REPO / "RELIABILITY.md", *sorted((REPO / "docs").rglob("*.md"))]
# The documents whose code spans must name real paths: the current ones, not the dated
# records under docs/validation/*/ (they name the tree as it was) nor docs/perf/ (another
# owner's history).
CURRENT = [
    p
    for p in LINKED
    if not (p.is_relative_to(REPO / "docs" / "perf") or p.parent.parent == REPO / "docs" / "validation")
]
TOP = ("bench", "bpf", "deploy", "docs", "examples", "memtrace", "scripts", "tests", "vmlinux")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")


def prose(text: str) -> str:
    """The text outside fenced blocks (a link in a code block is no link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|\*", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def pending(rel: str) -> bool:
    return rel.rstrip("/") in PENDING


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(CODE.sub("", prose(path.read_text()))) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        rel = str(dest.relative_to(REPO)) if dest.is_relative_to(REPO) else str(dest)
        if pending(rel):
            continue
        if not dest.exists():
            broken.append(f"{target}: no {rel}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def named_paths(doc: Path) -> list[str]:
    """Repository paths in the document's code spans: `memtrace/core/apis.py`,
    `bench/stack_cost.py --python` (the first word), never a pattern
    (`bpf/<sensor>.bpf.c`) or a placeholder."""
    out = []
    for span in CODE.findall(doc.read_text()):
        word = span.split()[0].rstrip(".,:;)") if span.split() else ""
        if "/" not in word or word.split("/")[0] not in TOP:
            continue
        if re.search(r"[<>*{}$\[\]]|\.\.\.|\b[A-Z]{2,}\b", word):
            continue
        out.append(word)
    return out


@pytest.mark.parametrize("doc", CURRENT, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_named_in_code_exists(doc: Path) -> None:
    missing = [p for p in named_paths(doc) if not pending(p) and not (REPO / p).exists()]
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {sorted(set(missing))}"


def test_pending_paths_are_still_pending() -> None:
    arrived = sorted(p for p in PENDING if (REPO / p).exists())
    assert not arrived, f"{arrived} exist now: remove them from PENDING in tests/test_docs.py"


def test_the_readme_stays_a_door_of_about_300_lines() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_readmes_blocks_fit_80_columns() -> None:
    text = (REPO / "README.md").read_text()
    wide = [
        line
        for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
        for line in m.group(1).splitlines()
        if len(line) > 80
    ]
    assert not wide, f"README.md lines in code blocks over 80 columns: {wide}"
