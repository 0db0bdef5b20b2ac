"""Pictures of a sweep that people decide with: the Pareto front of devices (or cost)
against time to train, a heatmap of step time over two axes, and one self-contained HTML
page of both where hovering a point shows its plan and inputs.

The page draws its charts as inline SVG with a ``<title>`` on every point: a browser shows it
on hover, with no script and nothing fetched, so the page opens anywhere and thousands of
points are read by pointing rather than by a legend.

One concern at about 400 lines: the three pictures of one sweep table share its reading (the
points, their labels and units) and the page embeds the other two.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from planner.errors import InputError
from planner.report.output import check_folder, write_atomic
from planner.report.pictures import FORMATS, save
from planner.spec.messages import short_repr
from planner.sweep import SweepRow
from planner.vocabulary import counted

COST_UNIT = "price per device-hour x device-hours"
"""The cost's unit: the sweep's ``price_per_device_hour`` (in whatever currency it was given)
times devices times hours to train."""


def _time(row: SweepRow) -> float | None:
    """What the front trades against: time to train when the sweep has tokens, else the
    step time."""
    return row.time_to_train_s if row.time_to_train_s is not None else row.step_time_s


def _resource(row: SweepRow) -> float | None:
    """What the time is bought with: the cost when the sweep has a price, else devices."""
    return row.cost if row.cost is not None else float(row.devices)


def pareto_front(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """The rows no other row beats on both resource (cost, else devices) and time (to train,
    else per step), cheapest first: each is the fastest for what it costs.

    >>> from planner.sweep import SweepRow
    >>> def row(i, devices, step):
    ...     return SweepRow(index=i, values=(), summary="s", devices=devices,
    ...                     step_time_s=step, tokens_per_s=None, mfu=None, peak_memory_gib=None,
    ...                     error_band=None, time_to_train_s=None, cost=None, error=None)
    >>> [r.index for r in pareto_front([row(0, 8, 2.0), row(1, 16, 1.0), row(2, 16, 3.0)])]
    [0, 1]

    Resources a millionth apart are the same (two designs whose costs differ by cents):
    only the faster is on the front.

    >>> [r.index for r in pareto_front([row(0, 16.0, 2.0), row(1, 16.000001, 1.0)])]
    [1]
    """
    solved = sorted((r for r in rows if _time(r) is not None),
                    key=lambda r: (_resource(r), _time(r)))  # fmt: skip
    front: list[SweepRow] = []
    for row in solved:
        time = _time(row) or 0.0
        if front and math.isclose(_resource(row) or 0.0, _resource(front[-1]) or 0.0,
                                  rel_tol=SAME_RESOURCE):  # fmt: skip
            if time < (_time(front[-1]) or 0.0):
                front[-1] = row
        elif not front or time < (_time(front[-1]) or 0.0):
            front.append(row)
    return front


SAME_RESOURCE = 1e-6
"""Resources this close, relatively, are the same on the front: the bundled NIC sweep's two
designs at 7,886,188.07 and 7,886,188.54 (twice the devices for half the time) cost the same,
and the slower one drew a front of its own."""


def _labels(rows: Sequence[SweepRow]) -> tuple[str, str]:
    """The axes' names of the front: (resource, time)."""
    resource = "cost" if any(r.cost is not None for r in rows) else "devices"
    time = ("days to train" if any(r.time_to_train_s is not None for r in rows)
            else "seconds per step")  # fmt: skip
    return resource, time


def _time_value(row: SweepRow) -> float:
    """Time in the front's unit: days to train, else seconds per step."""
    if row.time_to_train_s is not None:
        return row.time_to_train_s / 86400
    return row.step_time_s or 0.0


MAX_LABELLED = 12
"""Up to this many points each carry a label; past it, only the front's do."""


def point_label(row: SweepRow, axes: Sequence[str]) -> str:
    """A point's label on the Pareto picture: its index, its parallel degrees (the plan's
    first clause) and, when the sweep varies the framework, the framework.

    >>> from planner.sweep import SweepRow
    >>> r = SweepRow(index=3, values=("megatron",), summary="TP8 x PP1 x DP16, mbs 1, 1F1B",
    ...              devices=128, step_time_s=2.5, tokens_per_s=1e6, mfu=0.4,
    ...              peak_memory_gib=60.0, error_band=None, time_to_train_s=None, cost=None,
    ...              error=None)
    >>> point_label(r, ["search.framework"])
    '3: TP8 x PP1 x DP16 (megatron)'
    """
    degrees = (row.summary or "").split(", ")[0]
    framework = [str(v) for a, v in zip(axes, row.values, strict=True)
                 if a.endswith("framework")]  # fmt: skip
    return f"{row.index}: {degrees}" + "".join(f" ({f})" for f in framework)


def _place_label(here: Sequence[SweepRow], axes: Sequence[str], *, full: bool) -> str:
    """The label of the points at one place: their indices, and with ``full`` their plan
    (:func:`point_label`) once when they share it.

    >>> from planner.sweep import SweepRow
    >>> def row(i, summary):
    ...     return SweepRow(index=i, values=(), summary=summary, devices=8, step_time_s=1.0,
    ...                     tokens_per_s=None, mfu=None, peak_memory_gib=None,
    ...                     error_band=None, time_to_train_s=None, cost=None, error=None)
    >>> tied = [row(11, "TP4 x PP1 x DP2048, mbs 1"), row(15, "TP4 x PP1 x DP2048, mbs 1")]
    >>> _place_label(tied, [], full=True), _place_label(tied, [], full=False)
    ('11, 15: TP4 x PP1 x DP2048', '11, 15')
    """
    indices = ", ".join(str(r.index) for r in here)
    if not full:
        return indices
    plans = list(dict.fromkeys(point_label(r, axes).split(": ", 1)[1] for r in here))
    return f"{indices}: {' / '.join(plans)}"


def pareto_figure(rows: Sequence[SweepRow], axes: Sequence[str], *, title: str = "") -> Figure:
    """Every point with a plan, and the front drawn through the ones nothing beats; each
    point labelled (:func:`point_label`) when there are at most :data:`MAX_LABELLED`, else the
    front's, and the others by their index alone; points at one place share one label."""
    figure = Figure(figsize=(8.0, 5.2))
    ax = figure.add_subplot()
    solved = [r for r in rows if _time(r) is not None]
    front = pareto_front(rows)
    ax.scatter([_resource(r) for r in solved], [_time_value(r) for r in solved], s=14,
               color="#9aa5b1", label="points", zorder=2)  # fmt: skip
    ax.plot([_resource(r) for r in front], [_time_value(r) for r in front], "-o", ms=5,
            color="#c44e52", label="Pareto front", zorder=3)  # fmt: skip
    on_front = {r.index for r in front}
    x_values = [_resource(r) or 0.0 for r in solved]
    middle = (min(x_values, default=0.0) + max(x_values, default=0.0)) / 2
    places: dict[tuple[float, float], list[SweepRow]] = {}
    for r in solved:  # tied designs (the same plan at another NIC) drew labels over each other
        places.setdefault((_resource(r) or 0.0, _time_value(r)), []).append(r)
    for (x, y), here in places.items():
        front_here = any(r.index in on_front for r in here)
        full = len(solved) <= MAX_LABELLED or front_here
        left = x > middle  # a label toward the middle, where it stays inside the axes
        ax.annotate(_place_label(here, axes, full=full), (x, y), xytext=(-5 if left else 5, 4),
                    textcoords="offset points", fontsize=7, ha="right" if left else "left",
                    color="#7a2a2d" if front_here else "#555555")  # fmt: skip
    resource, time = axis_labels(rows)
    ax.set_xlabel(resource)
    ax.set_ylabel(time)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    # round ticks in the step's digits (8.2M, 1,070), not a corner offset (1e8) to multiply by
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _: tick_text(v, _tick_step(ax.xaxis.get_majorticklocs()))))  # fmt: skip
    ax.margins(x=0.12, y=0.1)  # room for the labels of the points at the edges
    ax.grid(color="#e4e4e4", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(f"{title}: " * bool(title) + f"{_labels(rows)[1]} against {_labels(rows)[0]} "
                 f"({len(front)} of {counted(len(solved), 'point')} on the front)",
                 fontsize=9)  # fmt: skip
    figure.tight_layout()
    return figure


def _tick_step(ticks: Sequence[float]) -> float:
    """The distance between two ticks (1 for a lone tick)."""
    return float(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0


def heatmap_cells(
    rows: Sequence[SweepRow], axes: Sequence[str], x_axis: str, y_axis: str
) -> tuple[list[object], list[object], list[list[float | None]]]:
    """(x values, y values, grid): the shortest step time over the points at each pair of
    the two axes' values (the other axes free); None where no such point has a plan."""
    xi, yi = axes.index(x_axis), axes.index(y_axis)
    xs = list(dict.fromkeys(r.values[xi] for r in rows))
    ys = list(dict.fromkeys(r.values[yi] for r in rows))
    grid: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    for r in rows:
        if r.step_time_s is None:
            continue
        i, j = ys.index(r.values[yi]), xs.index(r.values[xi])
        current = grid[i][j]
        grid[i][j] = r.step_time_s if current is None else min(current, r.step_time_s)
    return xs, ys, grid


def heatmap_figure(
    rows: Sequence[SweepRow], axes: Sequence[str], x_axis: str, y_axis: str, *, title: str = ""
) -> Figure:
    """Step time over two axes (the best over the others), each cell labelled."""
    xs, ys, grid = heatmap_cells(rows, axes, x_axis, y_axis)
    figure = Figure(figsize=(max(4.5, 1.1 * len(xs) + 2.5), max(3.5, 0.6 * len(ys) + 2.0)))
    ax = figure.add_subplot()
    values = [[math.nan if v is None else v for v in line] for line in grid]
    image = ax.imshow(values, cmap="viridis_r", aspect="auto", origin="lower")
    known = [v for line in grid for v in line if v is not None]
    lo, hi = (min(known), max(known)) if known else (0.0, 1.0)
    for i, line in enumerate(grid):
        for j, v in enumerate(line):
            # viridis_r is light at the short end: dark text there, white on the dark end.
            light = v is None or hi == lo or (v - lo) / (hi - lo) < 0.5
            ax.text(j, i, "no plan" if v is None else cell_text(v), ha="center", va="center",
                    fontsize=8, color="black" if light else "white")  # fmt: skip
    ax.set_xticks(range(len(xs)), [short_repr(x) for x in xs])
    ax.set_yticks(range(len(ys)), [short_repr(y) for y in ys])
    ax.set_xlabel(x_axis)
    ax.set_ylabel(y_axis)
    figure.colorbar(image, ax=ax, label="seconds per step (best over other axes)")
    ax.set_title(f"{title}: " * bool(title) + "step time", fontsize=9)
    figure.tight_layout()
    return figure


def cell_text(seconds: float) -> str:
    """A heatmap cell's step time: three figures, whole seconds from 100 on (``%.3g`` wrote
    1,088 s as 1.09e+03).

    >>> [cell_text(s) for s in (1088.4, 41.85, 4.591, 0.0123)]
    ['1,088', '41.9', '4.59', '0.0123']
    """
    if seconds >= 100:
        return f"{seconds:,.0f}"
    return f"{seconds:.3g}"


def point_text(row: SweepRow, axes: Sequence[str]) -> str:
    """What hovering a point shows: its inputs, its plan and its numbers, or why it has none.

    >>> from planner.sweep import SweepRow
    >>> r = SweepRow(index=3, values=(16,), summary="TP8 x PP1 x DP16", devices=128,
    ...              step_time_s=2.5, tokens_per_s=1e6, mfu=0.4, peak_memory_gib=60.0,
    ...              error_band="+/- 10 %", time_to_train_s=None, cost=None, error=None)
    >>> print(point_text(r, ["cluster.num_nodes"]))
    point 3: cluster.num_nodes=16
    TP8 x PP1 x DP16
    step 2.500 s +/- 10 %, MFU 40.0 %, 60.0 GiB, 128 devices
    """
    inputs = ", ".join(f"{a}={short_repr(v)}" for a, v in zip(axes, row.values, strict=True))
    lines = [f"point {row.index}: {inputs}"]
    if row.step_time_s is None:
        return "\n".join([*lines, f"no plan: {row.error}"])
    numbers = (f"step {row.step_time_s:.3f} s {row.error_band or ''}".rstrip()
               + f", MFU {100 * (row.mfu or 0):.1f} %, {row.peak_memory_gib or 0:.1f} GiB, "
               f"{row.devices} devices")  # fmt: skip
    if row.time_to_train_s is not None:
        numbers += f", {row.time_to_train_s / 86400:.1f} days to train"
    if row.cost is not None:
        numbers += f", cost {row.cost:,.0f}"
    return "\n".join([*lines, row.summary or "", numbers])


def nice_ticks(lo: float, hi: float, *, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x a power of ten apart) from at or below ``lo`` to at or
    above ``hi``, about ``count`` of them (matplotlib's :class:`~matplotlib.ticker.
    MaxNLocator`); a range of one value is widened by 10 % either side.

    >>> nice_ticks(8.09e6, 9.0e6)
    [8000000.0, 8200000.0, 8400000.0, 8600000.0, 8800000.0, 9000000.0]
    >>> nice_ticks(128.0, 128.0)
    [115.0, 120.0, 125.0, 130.0, 135.0, 140.0, 145.0]
    """
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    ticks = MaxNLocator(nbins=count, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    inner = [float(t) for t in ticks]
    while len(inner) > 2 and inner[1] <= lo:  # the locator may add a tick beyond either end
        inner.pop(0)
    while len(inner) > 2 and inner[-2] >= hi:
        inner.pop()
    return inner


def tick_text(value: float, step: float) -> str:
    """A tick's label: millions with an ``M`` (to the tick step's digits), else whole numbers
    with separators, else as many decimals as the step needs.

    >>> tick_text(8200000.0, 200000.0), tick_text(1070.0, 50.0), tick_text(2.5, 0.5)
    ('8.2M', '1,070', '2.5')

    A step of 0.25M keeps its two decimals (7.75M read "7.8M" beside 8.0M, 8.2M):

    >>> [tick_text(v, 250000.0) for v in (7750000.0, 8000000.0, 8250000.0)]
    ['7.75M', '8.00M', '8.25M']
    """
    if abs(value) >= 1e6 or step >= 1e6:
        return f"{value / 1e6:,.{_decimals(step / 1e6)}f}M"
    return f"{value:,.{_decimals(step)}f}"


def _decimals(step: float) -> int:
    """The fewest decimals that write ``step`` exactly (0.25: 2, 50: 0), at most 6."""
    if step <= 0:
        return 0
    return next((d for d in range(7) if abs(round(step, d) - step) <= 1e-9 * step), 6)


def axis_labels(rows: Sequence[SweepRow]) -> tuple[str, str]:
    """The front's axis titles with their units: (resource, time)."""
    resource, time = _labels(rows)
    return (f"{resource} ({COST_UNIT})" if resource == "cost" else "devices",
            "time to train (days)" if time == "days to train" else "step time (s)")


def _svg_scatter(rows: Sequence[SweepRow], axes: Sequence[str]) -> str:
    """The front's chart as inline SVG: one circle per point with a hover title, both axes
    with ticks, tick labels and their titles with units."""
    width, height = 720, 440
    left, right, top, bottom = 90, 30, 30, 70  # room for the tick labels and axis titles
    solved = [r for r in rows if _time(r) is not None]
    if not solved:
        return "<p>No point has a plan.</p>"
    xs = [_resource(r) or 0.0 for r in solved]
    ys = [_time_value(r) for r in solved]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))

    def at_x(v: float) -> float:
        return left + (v - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * (width - left - right)

    def at_y(v: float) -> float:
        return height - bottom - (v - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * (
            height - top - bottom)

    front = {r.index for r in pareto_front(rows)}
    resource, time = axis_labels(rows)
    x0, y0, x1, y1 = left, height - bottom, width - right, top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'class="pareto" role="img" font-size="12">',
             f'<text class="axis-title" x="{(x0 + x1) / 2}" y="{height - 15}" '
             f'text-anchor="middle">{html.escape(resource)}</text>',
             f'<text class="axis-title" x="18" y="{(y0 + y1) / 2}" '
             f'transform="rotate(-90 18 {(y0 + y1) / 2})" text-anchor="middle">'
             f"{html.escape(time)}</text>"]  # fmt: skip
    for v in x_ticks:
        x = at_x(v)
        parts.append(f'<line x1="{x:.1f}" y1="{y1}" x2="{x:.1f}" y2="{y0 + 5}" stroke="#e4e4e4"/>'
                     f'<text class="tick x" x="{x:.1f}" y="{y0 + 20}" text-anchor="middle">'
                     f"{tick_text(v, x_ticks[1] - x_ticks[0])}</text>")  # fmt: skip
    for v in y_ticks:
        y = at_y(v)
        parts.append(f'<line x1="{x0 - 5}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                     f'<text class="tick y" x="{x0 - 9}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{tick_text(v, y_ticks[1] - y_ticks[0])}</text>")  # fmt: skip
    parts.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" '
                 'stroke="#888"/>')  # fmt: skip
    # The front's points last, on top of any other point at the same place.
    drawn = sorted(zip(solved, xs, ys, strict=True), key=lambda p: p[0].index in front)
    for r, x, y in drawn:
        colour, radius = ("#c44e52", 6) if r.index in front else ("#9aa5b1", 4)
        parts.append(f'<circle class="point" data-point="{r.index}" cx="{at_x(x):.1f}" '
                     f'cy="{at_y(y):.1f}" r="{radius}" fill="{colour}"><title>'
                     f"{html.escape(point_text(r, axes))}</title></circle>")  # fmt: skip
    parts.append("</svg>")
    return "\n".join(parts)


def _html_heatmap(rows: Sequence[SweepRow], axes: Sequence[str], x_axis: str,
                  y_axis: str) -> str:  # fmt: skip
    """The heatmap as an HTML table whose cells carry the best point's text on hover."""
    xs, ys, grid = heatmap_cells(rows, axes, x_axis, y_axis)
    best = {}
    xi, yi = axes.index(x_axis), axes.index(y_axis)
    for r in rows:
        if r.step_time_s is not None and grid[ys.index(r.values[yi])][xs.index(r.values[xi])] \
                == r.step_time_s:
            best[(r.values[xi], r.values[yi])] = r
    head = "".join(f"<th>{html.escape(short_repr(x))}</th>" for x in xs)
    body = []
    for y, line in zip(ys, grid, strict=True):
        cells = []
        for x, v in zip(xs, line, strict=True):
            row = best.get((x, y))
            tip = html.escape(point_text(row, axes)) if row is not None else "no plan"
            cells.append(f'<td class="cell" title="{tip}">'
                         f"{'no plan' if v is None else cell_text(v)}</td>")  # fmt: skip
        body.append(f"<tr><th>{html.escape(short_repr(y))}</th>{''.join(cells)}</tr>")
    body.reverse()  # the last value on top, as the picture's y axis runs
    return (f'<table class="heatmap"><caption>step time (s), best over the other axes: '
            f"{html.escape(y_axis)} by {html.escape(x_axis)}</caption>"
            f"<tr><th></th>{head}</tr>{''.join(body)}</table>")  # fmt: skip


def sweep_page(rows: Sequence[SweepRow], axes: Sequence[str], *, title: str,
               heatmap_axes: tuple[str, str] | None) -> str:  # fmt: skip
    """One self-contained HTML page: the front and the heatmap, every point's plan and inputs
    on hover."""
    heat = "" if heatmap_axes is None else _html_heatmap(rows, axes, *heatmap_axes)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}"
        ".heatmap td,.heatmap th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        ".heatmap{border-collapse:collapse;margin-top:2em}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{counted(len(rows), 'point')}; hover a point for its plan and inputs.</p>",
        _svg_scatter(rows, axes), heat, "</body></html>",
    ])  # fmt: skip


def default_heatmap_axes(axes: Sequence[str]) -> tuple[str, str] | None:
    """The heatmap's axes: the sweep's first two; None with fewer than two."""
    return (axes[0], axes[1]) if len(axes) >= 2 else None


def check_heatmap_axes(
    axes: Sequence[str], chosen: Sequence[str], *, option: str = "--heatmap"
) -> tuple[str, str]:
    """``chosen`` as the heatmap's (x, y): two different axes of the sweep, else an
    :class:`~planner.errors.InputError` naming what was given and the sweep's axes.

    >>> check_heatmap_axes(["cluster.num_nodes", "search.framework"],
    ...                    ["search.framework", "cluster.num_nodes"])
    ('search.framework', 'cluster.num_nodes')
    """
    given = f"{option} {','.join(chosen)}"
    known = ", ".join(axes)
    if len(chosen) != 2 or chosen[0] == chosen[1]:
        raise InputError(f"{given}: give two different axes of the sweep as X,Y; its axes are "
                         f"{known}")  # fmt: skip
    unknown = next((axis for axis in chosen if axis not in axes), None)
    if unknown is not None:
        raise InputError(f"{given}: {unknown!r} is not an axis of the sweep; its axes are "
                         f"{known}")  # fmt: skip
    return chosen[0], chosen[1]


def write_sweep_report(
    rows: Sequence[SweepRow],
    axes: Sequence[str],
    directory: str | Path,
    *,
    title: str,
    heatmap_axes: Sequence[str] | None = None,
) -> list[Path]:
    """``pareto`` and ``heatmap`` as PNG and SVG, and ``index.html``, into ``directory``; the
    heatmap over ``heatmap_axes`` (x, y), by default the sweep's first two axes."""
    directory = Path(directory)
    heat_axes = (default_heatmap_axes(axes) if heatmap_axes is None
                 else check_heatmap_axes(axes, heatmap_axes))  # fmt: skip
    check_folder(directory, option="--report")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix in FORMATS:
        written.append(save(pareto_figure(rows, axes, title=title),
                            directory / f"pareto{suffix}", option="--report"))  # fmt: skip
        if heat_axes is not None:
            written.append(save(heatmap_figure(rows, axes, *heat_axes, title=title),
                                directory / f"heatmap{suffix}", option="--report"))  # fmt: skip
    page = directory / "index.html"
    write_atomic(page, sweep_page(rows, axes, title=title, heatmap_axes=heat_axes),
                 option="--report")  # fmt: skip
    return [*written, page]
