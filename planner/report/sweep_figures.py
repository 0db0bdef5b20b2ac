"""Pictures of a sweep that people decide with: the Pareto front of devices (or cost)
against time to train, a heatmap of step time over two axes, and one self-contained HTML
page of both where hovering a point shows its plan and inputs.

The page draws its charts as inline SVG with a ``<title>`` on every point: a browser shows it
on hover, with no script and nothing fetched, so the page opens anywhere and thousands of
points are read by pointing rather than by a legend.

How the points are read (the front, labels, cells, ticks) is :mod:`planner.report.sweep_reading`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from planner.errors import InputError
from planner.report.output import SWEEP_REPORT, check_folder, write_atomic
from planner.report.pictures import FORMATS, literal_text, save
from planner.report.sweep_reading import (
    MAX_LABELLED,
    axis_labels,
    cell_text,
    front_labels,
    heatmap_cells,
    nice_ticks,
    pareto_front,
    place_label,
    point_text,
    resource_of,
    tick_step,
    tick_text,
    time_of,
    time_value,
)
from planner.report.sweep_table import value_text
from planner.sweep import SweepRow
from planner.vocabulary import counted


@literal_text
def pareto_figure(rows: Sequence[SweepRow], axes: Sequence[str], *, title: str = "") -> Figure:
    """Every point with a plan, and the front drawn through the ones nothing beats; each
    point labelled (:func:`point_label`) when there are at most :data:`MAX_LABELLED`, else the
    front's, and the others by their index alone; points at one place share one label."""
    figure = Figure(figsize=(8.0, 5.2))
    ax = figure.add_subplot()
    solved = [r for r in rows if time_of(r) is not None]
    front = pareto_front(rows)
    ax.scatter([resource_of(r) for r in solved], [time_value(r) for r in solved], s=14,
               color="#9aa5b1", label="points", zorder=2)  # fmt: skip
    ax.plot([resource_of(r) for r in front], [time_value(r) for r in front], "-o", ms=5,
            color="#c44e52", label="Pareto front", zorder=3)  # fmt: skip
    on_front = {r.index for r in front}
    x_values = [resource_of(r) or 0.0 for r in solved]
    middle = (min(x_values, default=0.0) + max(x_values, default=0.0)) / 2
    places: dict[tuple[float, float], list[SweepRow]] = {}
    for r in solved:  # tied designs (the same plan at another NIC) drew labels over each other
        places.setdefault((resource_of(r) or 0.0, time_value(r)), []).append(r)
    for (x, y), here in places.items():
        front_here = any(r.index in on_front for r in here)
        full = len(solved) <= MAX_LABELLED or front_here
        left = x > middle  # a label toward the middle, where it stays inside the axes
        ax.annotate(place_label(here, axes, full=full), (x, y), xytext=(-5 if left else 5, 4),
                    textcoords="offset points", fontsize=7, ha="right" if left else "left",
                    color="#7a2a2d" if front_here else "#555555")  # fmt: skip
    x_title, y_title = axis_labels(rows)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    # round ticks in the step's digits (8.2M, 1,070), not a corner offset (1e8) to multiply by
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _: tick_text(v, tick_step(ax.xaxis.get_majorticklocs()))))  # fmt: skip
    ax.margins(x=0.12, y=0.1)  # room for the labels of the points at the edges
    ax.grid(color="#e4e4e4", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False)
    resource, time = front_labels(rows)
    ax.set_title(f"{title}: " * bool(title) + f"{time} against {resource} "
                 f"({len(front)} of {counted(len(solved), 'point')} on the front)",
                 fontsize=9)  # fmt: skip
    figure.tight_layout()
    return figure


@literal_text
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
    ax.set_xticks(range(len(xs)), [value_text(x) for x in xs])
    ax.set_yticks(range(len(ys)), [value_text(y) for y in ys])
    ax.set_xlabel(x_axis)
    ax.set_ylabel(y_axis)
    figure.colorbar(image, ax=ax, label="seconds per step (best over other axes)")
    ax.set_title(f"{title}: " * bool(title) + "step time", fontsize=9)
    figure.tight_layout()
    return figure


def _svg_scatter(rows: Sequence[SweepRow], axes: Sequence[str]) -> str:
    """The front's chart as inline SVG: one circle per point with a hover title, both axes
    with ticks, tick labels and their titles with units."""
    width, height = 720, 440
    left, right, top, bottom = 90, 30, 30, 70  # room for the tick labels and axis titles
    solved = [r for r in rows if time_of(r) is not None]
    if not solved:
        return "<p>No point has a plan.</p>"
    xs = [resource_of(r) or 0.0 for r in solved]
    ys = [time_value(r) for r in solved]
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
    head = "".join(f"<th>{html.escape(value_text(x))}</th>" for x in xs)
    body = []
    for y, line in zip(ys, grid, strict=True):
        cells = []
        for x, v in zip(xs, line, strict=True):
            row = best.get((x, y))
            tip = html.escape(point_text(row, axes)) if row is not None else "no plan"
            cells.append(f'<td class="cell" title="{tip}">'
                         f"{'no plan' if v is None else cell_text(v)}</td>")  # fmt: skip
        body.append(f"<tr><th>{html.escape(value_text(y))}</th>{''.join(cells)}</tr>")
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
    check_folder(directory, option="--report", files=SWEEP_REPORT)
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
