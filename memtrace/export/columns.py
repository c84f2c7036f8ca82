"""A table for a screen narrower than it: its columns in groups that each
fit, every group led by the columns that name a row, rather than cells
folded to a few characters (`1.0/1e+/03m/s`) or a number cut in two
(`48,308,4` / `94`). Wide enough, or written to a file or a pipe (where
export/report.fit widens the console), it is one table."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table

GAP = 2  # no box, no edge padding: two spaces between columns


class SplitTable:
    """`columns`, the first `keys` of which name a row (repeated in each
    group); `left`: the columns aligned left (the rest are numbers, right)."""

    def __init__(self, columns: Sequence[str], keys: int, left: Sequence[str] = (), title: str | None = None) -> None:
        self.columns = list(columns)
        self.keys = keys
        self.left = set(left)
        self.title = title
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def column(self, name: str) -> list[str]:
        """The cells of one column, in row order."""
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def _widths(self) -> list[int]:
        return [max([cell_len(c), *(cell_len(r[i]) for r in self.rows)]) for i, c in enumerate(self.columns)]

    def _need(self, widths: list[int], cols: Sequence[int]) -> int:
        return sum(widths[i] for i in cols) + GAP * (len(cols) - 1)

    def groups(self, width: int) -> list[list[int]]:
        """The columns of each table at `width`: all in one where they fit."""
        widths = self._widths()
        every = list(range(len(self.columns)))
        if self._need(widths, every) <= width:
            return [every]
        key = every[: self.keys]
        out: list[list[int]] = []
        cur: list[int] = []
        for i in every[self.keys :]:
            if cur and self._need(widths, key + cur + [i]) > width:
                out.append(key + cur)
                cur = []
            cur.append(i)
        out.append(key + cur)
        return out

    def _table(self, cols: list[int], title: str | None) -> Table:
        t = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold underline")
        for i in cols:
            c = self.columns[i]
            # The naming columns may fold on a very narrow screen; a number never does.
            t.add_column(c, justify="left" if c in self.left else "right", no_wrap=i >= self.keys, overflow="fold")
        for r in self.rows:
            t.add_row(*(r[i] for i in cols))
        return t

    def tables(self, width: int) -> Iterator[Table]:
        for n, cols in enumerate(self.groups(width)):
            yield self._table(cols, self.title if n == 0 else None)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.tables(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = self._widths()
        every = list(range(len(self.columns)))
        narrowest = max(
            (self._need(widths, every[: self.keys] + [i]) for i in every[self.keys :]),
            default=self._need(widths, every),
        )
        return Measurement(narrowest, self._need(widths, every))
