"""Renderables that fit the console's width without cutting a value: text broken only between
its clauses, a title that is never wrapped, tables whose unwrappable cells stay whole, and a
choice of layouts (the first whose every cell fits the width)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text, TextType

UNBOUNDED = 1 << 16
"""A width no layout reaches, to measure a layout's own minimum."""


class Clauses:
    """Parts joined by ``sep``, a line broken only between two parts; a broken line ends with
    ``tail`` (``","`` after ``", "``; nothing after ``" | "``). A part longer than the width
    is wrapped at its words.

    >>> from rich.console import Console
    >>> console = Console(width=24)
    >>> with console.capture() as out:
    ...     console.print(Clauses(["TP4 x PP16", "interleaved 1F1B (v=6)", "mbs 2"]))
    >>> print(out.get())
    TP4 x PP16,
    interleaved 1F1B (v=6),
    mbs 2
    <BLANKLINE>
    """

    def __init__(self, parts: Sequence[TextType], *, sep: str = ", ", tail: str | None = None,
                 style: str = "") -> None:  # fmt: skip
        self.parts = [Text(p, style=style) if isinstance(p, str) else p for p in parts]
        self.sep = sep
        self.tail = sep.rstrip() if tail is None else tail
        self.style = style
        """The style of the separators and of the parts given as strings."""

    def lines(self, width: int) -> list[Text]:
        """The parts packed into lines of at most ``width`` cells (a lone part may be longer)."""
        lines: list[Text] = []
        line: Text | None = None
        for i, part in enumerate(self.parts):
            tail = len(self.tail) if i < len(self.parts) - 1 else 0
            if line is not None and line.cell_len + len(self.sep) + part.cell_len + tail <= width:
                line.append(self.sep, style=self.style)
                line.append_text(part)
                continue
            if line is not None:
                line.append(self.tail, style=self.style)
                lines.append(line)
            line = part.copy()
        if line is not None:
            lines.append(line)
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Lines within the width pass through unchanged; a longer one wraps at its words.
        yield Text("\n").join(self.lines(options.max_width))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((p.cell_len for p in self.parts), default=0) + len(self.tail)
        whole = sum(p.cell_len for p in self.parts) + len(self.sep) * (len(self.parts) - 1)
        return Measurement(min(widest, whole), whole)


class FirstThatFits:
    """The first layout whose narrowest rendering (every table cell kept whole, see
    :func:`keep_whole`) fits the width; else the last, the narrowest."""

    def __init__(self, *layouts: RenderableType) -> None:
        self.layouts = layouts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Measured without the width's bound, which would clamp the minimum to it.
        unbounded = options.update_width(UNBOUNDED)
        for layout in self.layouts[:-1]:
            if Measurement.get(console, unbounded, layout).minimum <= options.max_width:
                yield layout
                return
        yield self.layouts[-1]


def title(text: str) -> Text:
    """A table's title, never wrapped to the table's width (it may be wider than the table;
    the console still crops it at the terminal's width)."""
    return Text(text, no_wrap=True, overflow="ignore")


def keep_whole(table: Table) -> Table:
    """``table`` with each unwrappable column (``no_wrap``) at least as wide as its widest
    cell, header included: measured, the table's minimum then keeps every such cell whole,
    and :class:`FirstThatFits` picks another layout rather than cut one."""
    for column in table.columns:
        if column.no_wrap:
            widths = [_cell_width(c) for c in (column.header, *column.cells)]
            column.min_width = max([column.min_width or 0, *widths])
    return table


def _cell_width(cell: RenderableType) -> int:
    if isinstance(cell, str):
        return max(cell_len(line) for line in cell.split("\n"))
    if isinstance(cell, Text):
        return max(cell_len(line) for line in cell.plain.split("\n"))
    return 0
