"""A sweep's table as the terminal shows it: every point, best first, in lines that fit the
width, each point's numbers on one line and its plan (or why it has none) under them.

A table of a dozen columns does not fit 80 columns beside a plan's one-line summary, so the
plan goes under its numbers, broken between its clauses (:class:`~planner.report.width.
Clauses`); when even the numbers with the axes do not fit, the axes' values go under them too.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from planner.report.width import Clauses
from planner.spec.messages import short_repr
from planner.sweep import SweepRow

MAX_ROWS = 40
"""Points listed before the rest are counted in one line (the Parquet file has them all)."""
INDENT = " " * 7
"""Before a point's plan, under its numbers (past the point's index)."""


def axis_headers(axes: Sequence[str]) -> list[str]:
    """Each axis by the shortest tail of its dotted path that no other axis ends with.

    >>> axis_headers(["cluster.num_nodes", "cluster.network.1.bandwidth_gb_s",
    ...               "cluster.network.0.bandwidth_gb_s"])
    ['num_nodes', '1.bandwidth_gb_s', '0.bandwidth_gb_s']
    """
    headers = []
    for axis in axes:
        parts = axis.split(".")
        for k in range(1, len(parts) + 1):
            tail = ".".join(parts[-k:])
            if not any(o != axis and (o == tail or o.endswith("." + tail)) for o in axes):
                break
        headers.append(tail)
    return headers


def ranked(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """The points best first: by tokens a second, the step time's order when every point
    trains as many tokens a step, and the right one when the batch or the sequence is an axis
    (a step of twice the tokens is not twice as slow to train on: it ranked below a faster
    step of half of them); it orders time to train, and at one price cost, the same way. Then
    those without a plan, by index."""
    solved = sorted((r for r in rows if r.step_time_s is not None),
                    key=lambda r: (-(r.tokens_per_s or 0.0), r.index))  # fmt: skip
    return [*solved, *(r for r in rows if r.step_time_s is None)]


def _numbers(row: SweepRow, *, days: bool, cost: bool) -> list[str]:
    """The row's numbers as the table prints them ("-" where it has none)."""
    if row.step_time_s is None:
        return ["-"] * (4 + days + cost)
    band = row.error_band or ""
    cells = [f"{row.step_time_s:.3f}", band.removeprefix("+/- ") if band.startswith("+/- ")
             else "-", f"{100 * (row.mfu or 0.0):.1f}", f"{row.peak_memory_gib or 0.0:.1f}"]
    if days:
        days_s = row.time_to_train_s
        cells.append("-" if days_s is None else f"{days_s / 86400:,.0f}")
    if cost:
        cells.append("-" if row.cost is None else f"{row.cost:,.0f}")
    return cells


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells flush right in columns of ``widths``, two spaces apart."""
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def value_text(value: object) -> str:
    """An axis value as the table, the pictures and the page show it: text as it is,
    anything else as its short ``repr``.

    >>> value_text("megatron"), value_text(16), value_text(2.5)
    ('megatron', '16', '2.5')
    """
    return value if isinstance(value, str) and value.isprintable() else short_repr(value)


def _under(parts: list[str], row: SweepRow, width: int) -> list[str]:
    """What goes under a point's numbers: ``parts`` (its axes' values, when they are not in
    columns) and its plan, broken between clauses, or why it has none, broken at words."""
    if row.step_time_s is None:  # its first clause; the whole reason is in the table
        reason = (row.error or "").split("; ")[0]
        text = ", ".join([*parts, f"no plan: {reason}"])
        return textwrap.wrap(text, width, initial_indent=INDENT, subsequent_indent=INDENT,
                             break_long_words=False, break_on_hyphens=False)  # fmt: skip
    clauses = Clauses([*parts, *(row.summary or "").split(", ")]).lines(width)
    return [INDENT + line.plain for line in clauses]


def sweep_table_lines(
    rows: Sequence[SweepRow], axes: Sequence[str], *, width: int, out: str,
    max_rows: int = MAX_ROWS,
) -> list[str]:  # fmt: skip
    """Every point of the sweep, best first (:func:`ranked`), at most ``max_rows`` of them
    and a line counting the rest in ``out``: per point a line of its index, axis values,
    step (s), its error band (``-`` uncalibrated), MFU (%), peak memory (GiB), days to train
    and cost (when the sweep has tokens and a price), and under it its plan or ``no plan:``
    and the first clause of why (the whole reason is in the table's ``error`` column)."""
    days = any(r.time_to_train_s is not None for r in rows)
    cost = any(r.cost is not None for r in rows)
    numbers_head = ["step s", "+/-", "MFU %", "GiB", *(["days"] * days), *(["cost"] * cost)]
    shown = ranked(rows)[:max_rows]
    values = [[value_text(v) for v in r.values] for r in shown]
    body = [[str(r.index), *v, *_numbers(r, days=days, cost=cost)]
            for r, v in zip(shown, values, strict=True)]  # fmt: skip
    names = axis_headers(axes)
    head = ["point", *names, *numbers_head]
    widths = [max(len(c) for c in column) for column in zip(head, *body, strict=True)]
    axes_in_columns = sum(widths) + 2 * (len(widths) - 1) <= width
    if not axes_in_columns:  # the axes' values go under the numbers, with the plan
        keep = [0, *range(1 + len(axes), len(head))]
        head, body = [head[k] for k in keep], [[line[k] for k in keep] for line in body]
        widths = [widths[k] for k in keep]
    lines = [_line(head, widths)]
    for r, v, cells in zip(shown, values, body, strict=True):
        lines.append(_line(cells, widths))
        parts = [] if axes_in_columns else [f"{a}={x}" for a, x in zip(names, v, strict=True)]
        lines += _under(parts, r, width - len(INDENT))
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more in {out}")
    return lines
