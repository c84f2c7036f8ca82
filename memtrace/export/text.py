"""Lines people read at 80 columns: a label, then text whose continuation
lines are indented, never back at column 0 and never padded (`memtrace
doctor`, the errors every command prints)."""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.text import Text


def say(console: Console, label: str, body: str, lead: int = 0, indent: int = 6) -> None:
    """Print `label` (rich markup) and `body` wrapped to the console's width
    (80 when piped): `lead` spaces before the label, continuation lines
    `indent` spaces in. Printed as is: rich neither wraps nor pads it."""
    head = Text(" " * lead)
    head.append_text(Text.from_markup(label))
    first = len(head.plain) + 1
    lines = textwrap.wrap(
        body,
        width=max(console.width, first + 20),
        initial_indent=" " * first,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [" " * first]
    out = head + Text(" ") + Text(lines[0][first:])
    for line in lines[1:]:
        out.append("\n" + line)
    console.print(out, soft_wrap=True, highlight=False)


def pageable_share(pageable: int, unknown: int, total: int) -> str:
    """The pageable share of `total` bytes, `unknown` of which are of a kind
    memtrace cannot tell (a process it attached to while running, a copy
    with no host address): with no pageable byte known, a bound ("≤40%"),
    never a 0% the unknown bytes could belie; "unknown" when (nearly) every
    byte is. A mix never rounds to 0% or 100%."""

    def pct(share: float) -> str:
        return "<1%" if 0 < share < 0.01 else ">99%" if 0.99 < share < 1 else f"{share:.0%}"

    if total <= 0 or unknown / total > 0.99:
        return "unknown"
    if unknown and not pageable:
        return f"≤{pct(unknown / total)}"
    return pct(pageable / total)
