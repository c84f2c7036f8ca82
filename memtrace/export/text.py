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
