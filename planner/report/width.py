"""Renderables that fit the console's width without cutting a value: prose wrapped at words
but never between a number and its unit, text broken only between its clauses, a title that
is never wrapped, tables whose unwrappable cells stay whole, and a choice of layouts (the
first whose every cell fits the width)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text, TextType

UNBOUNDED = 1 << 16
"""A width no layout reaches, to measure a layout's own minimum."""
INDENT = "  "
"""How far continuation lines and lists are indented."""
# "%" apart: a word boundary after it needs a word character next, which a space is not.
UNIT = re.compile(r"(?<=\d) (?=(?:GiB|GB|MiB|ms|s|nodes|devices|tokens)\b|%)")
"""The space between a number and its unit, which a line does not break at."""


def wrap(text: str, width: int, *, first: str = "", indent: str = INDENT) -> list[str]:
    """``text`` in lines of at most ``width`` cells, broken at spaces only, never between a
    number and its unit (a word longer than the line keeps its own line whole): ``first``
    before the first line, ``indent`` before the others.

    >>> wrap("leaving 126.9 GiB: not enough", 16, first="- ")
    ['- leaving', '  126.9 GiB: not', '  enough']
    >>> wrap("within 80 % of it", 10)
    ['within', '  80 % of', '  it']
    """
    lines = textwrap.wrap(_glued(text), max(width, len(indent) + 1), initial_indent=first,
                          subsequent_indent=indent, break_long_words=False,
                          break_on_hyphens=False) or [first.rstrip()]  # fmt: skip
    return [line.replace("\N{NO-BREAK SPACE}", " ") for line in lines]


def _glued(text: str) -> str:
    """``text`` with each number and its unit joined by a no-break space, which textwrap does
    not break at (it breaks at ASCII whitespace only)."""
    return UNIT.sub("\N{NO-BREAK SPACE}", text)


class Prose:
    """A sentence wrapped at words to the console's width (:func:`wrap`): never between a
    number and its unit, no line ending in a space (Rich's own wrapping does both).

    >>> from rich.console import Console
    >>> console = Console(width=16)
    >>> with console.capture() as out:
    ...     console.print(Prose("a band widened 1 % for its distance"))
    >>> print(out.get())
    a band widened
    1 % for its
    distance
    <BLANKLINE>
    """

    def __init__(self, text: str, *, style: str = "", indent: str = "") -> None:
        self.text = text
        self.style = style
        self.indent = indent
        """Before every line."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = wrap(self.text, options.max_width, first=self.indent, indent=self.indent)
        yield Text("\n".join(lines), style=self.style, no_wrap=True, overflow="fold")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        least = max((cell_len(w) for w in _glued(self.text).split(" ")), default=0)
        return Measurement(least + len(self.indent), cell_len(self.text) + len(self.indent))


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


def light_table(heading: str, *, collapse_padding: bool = False) -> Table:
    """A table in a light box (a rule under the header, no edges) under ``heading``."""
    return Table(title=title(heading), title_justify="left", box=box.SIMPLE_HEAD,
                 show_edge=False, collapse_padding=collapse_padding)  # fmt: skip
