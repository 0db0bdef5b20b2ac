"""A Gantt chart of a simulated pipeline step: one row per stage, one bar per operation.

Idle time is left blank, so the bubbles show as gaps. Drawn on a private
:class:`~matplotlib.figure.Figure` with the Agg canvas: no pyplot, no global backend switch,
safe to call from any program that uses matplotlib itself.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.report.pictures import save
from planner.simulate.events import Phase, Simulation

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
PHASE_COLORS: dict[Phase, str] = {
    "forward": "#0072B2",
    "backward": "#009E73",
    "weight": "#F0E442",  # weight gradients, a pass of their own under zero-bubble schedules
    "recompute": "#E69F00",
    "send": "#999999",
    "sync": "#D55E00",
    "optimizer": "#CC79A7",
}
WIDTH_IN = 13.0
# Row height by pipeline depth, so that 64 stages still fit on a page (about 13 in tall).
MAX_HEIGHT_IN = 14.0
# A label is drawn inside a bar only if the bar is this much wider than the text.
LABEL_MARGIN = 1.3
MIN_FONT_PT = 5.0
# Past this many bars, edges and labels would only blur the picture.
MAX_DETAILED_BARS = 6000
# How much lighter each further model chunk is drawn (the last chunk: this much of white).
CHUNK_LIGHTEN = 0.55


def _lighten(color: str, chunk: int | None, chunks: int) -> tuple[float, float, float]:
    """``color`` lightened toward white for later model chunks (chunk 0 as is)."""
    r, g, b = to_rgb(color)
    mix = CHUNK_LIGHTEN * chunk / (chunks - 1) if chunk is not None and chunks > 1 else 0.0
    return (r + (1 - r) * mix, g + (1 - g) * mix, b + (1 - b) * mix)


def _shade(phase: Phase, chunk: int | None, chunks: int) -> tuple[float, float, float]:
    """The phase's colour, lighter for later model chunks."""
    return _lighten(PHASE_COLORS[phase], chunk, chunks)


def _text_color(rgb: tuple[float, float, float]) -> str:
    """Black on light bars, white on dark ones (relative luminance, ITU-R BT.709)."""
    r, g, b = rgb
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "white"


def _time_unit(step_s: float) -> tuple[str, float]:
    """Seconds for long steps, milliseconds for short ones."""
    return ("ms", 1e3) if step_s < 1.0 else ("s", 1.0)


def _figure_height_in(stages: int) -> float:
    """Taller rows for short pipelines, thinner ones for deep pipelines."""
    row_in = 0.45 if stages <= 8 else 0.3 if stages <= 24 else 0.19
    return min(MAX_HEIGHT_IN, 1.9 + row_in * stages)


def _draw_bars(ax: Axes, sim: Simulation, scale: float, *, detailed: bool) -> None:
    """One collection of rectangles per (phase, chunk), built as arrays: a handful of artists
    even for a million events."""
    columns: dict[tuple[Phase, int | None], list[tuple[int, float, float]]] = defaultdict(list)
    for e in sim.events:
        columns[(e.phase, e.chunk)].append((e.stage, e.start_s, e.end_s))
    for (phase, chunk), rows in columns.items():
        stage, start, end = (np.array(col, dtype=float) for col in zip(*rows, strict=True))
        x0, x1 = start * scale, end * scale
        y0, y1 = stage - 0.4, stage + 0.4
        corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        verts = np.stack([np.stack(corner, axis=-1) for corner in corners], axis=1)
        ax.add_collection(PolyCollection(
            verts, facecolors=[_shade(phase, chunk, sim.virtual_stages)], edgecolors="white",
            linewidths=0.4 if detailed else 0.0,
        ))  # fmt: skip


def _draw_labels(ax: Axes, fig: Figure, sim: Simulation, scale: float) -> None:
    """Microbatch numbers inside forward, backward and recompute bars wide enough to hold
    them, in a font sized to the rows and shrunk (to a legible minimum) to fit the bar."""
    width_pt = fig.get_figwidth() * 72 * 0.86  # the axes take about this much of the width
    height_pt = fig.get_figheight() * 72 * 0.75
    fontsize = min(8.0, 0.5 * height_pt / sim.num_stages)
    pt_per_unit = width_pt / (sim.step_s * scale)
    for e in sim.events:
        if e.microbatch is None or e.phase == "send":
            continue
        text = str(e.microbatch)
        bar_pt = (e.end_s - e.start_s) * scale * pt_per_unit
        # A digit is about 0.6 em wide.
        size = min(fontsize, (bar_pt - 2) / (LABEL_MARGIN * 0.6 * len(text)))
        if size < MIN_FONT_PT:
            continue
        color = _text_color(_shade(e.phase, e.chunk, sim.virtual_stages))
        ax.text((e.start_s + e.end_s) / 2 * scale, e.stage, text, ha="center", va="center",
                fontsize=size, color=color)  # fmt: skip


def _legend(fig: Figure, sim: Simulation) -> None:
    """The phases that occur, and for interleaving the chunk shades, below the chart."""
    present = {e.phase for e in sim.events}
    handles = [Patch(facecolor=PHASE_COLORS[p], label=p) for p in PHASE_COLORS if p in present]
    v = sim.virtual_stages
    if v > 1:
        forward = PHASE_COLORS["forward"]
        handles += [Patch(facecolor=_lighten(forward, c, v), label=f"chunk {c}") for c in range(v)]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False,
               fontsize=8, handlelength=1.2)  # fmt: skip


def _idle_notes(ax: Axes, sim: Simulation) -> None:
    """Each stage's idle share of the forward-backward part, right of its row."""
    if sim.num_stages > 32 or sim.pipeline_s <= 0:
        return
    for i, idle in enumerate(sim.bubble_s):
        ax.annotate(f"idle {100 * idle / sim.pipeline_s:.0f} %", (1.005, i),
                    xycoords=("axes fraction", "data"), va="center", fontsize=7,
                    color="#444444")  # fmt: skip


def _summary(sim: Simulation, unit: str, scale: float) -> str:
    """The pipeline's shape and what the simulation adds up to, in one line."""
    chunks = f", {sim.virtual_stages} chunks per stage" if sim.virtual_stages > 1 else ""
    return (
        f"{sim.num_stages} stages, {sim.num_microbatches} microbatches{chunks}: "
        f"step {sim.step_s * scale:.4g} {unit}, forward-backward {sim.pipeline_s * scale:.4g} "
        f"{unit}, bubble {100 * sim.bubble_fraction:.1f} %"
    )


def draw_gantt(
    sim: Simulation, path: str | Path, *, title: str = "", option: str = "--gantt"
) -> Path:
    """Write ``sim`` as a Gantt chart to ``path`` (.png or .svg, by its suffix)."""
    return save(gantt_figure(sim, title=title), path, option=option)


def gantt_figure(sim: Simulation, *, title: str = "") -> Figure:
    """``sim`` as a Gantt chart.

    Stage 0 is the top row; bars are coloured by phase, later model chunks drawn lighter;
    microbatch numbers are written inside the bars wide enough for them.
    """
    unit, scale = _time_unit(sim.step_s)
    fig = Figure(figsize=(WIDTH_IN, _figure_height_in(sim.num_stages)), layout="constrained")
    ax = fig.add_subplot()
    detailed = len(sim.events) <= MAX_DETAILED_BARS
    _draw_bars(ax, sim, scale, detailed=detailed)
    if detailed:
        _draw_labels(ax, fig, sim, scale)
    p = sim.num_stages
    ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top
    step = max(1, p // 16)  # at most about 16 stage names on the axis
    ax.set_yticks(range(0, p, step), [f"stage {i}" for i in range(0, p, step)], fontsize=8)
    ax.set_xlim(0, sim.step_s * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    _idle_notes(ax, sim)
    _legend(fig, sim)
    summary = _summary(sim, unit, scale)
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=10, loc="left")
    # Many bars as vectors make a huge SVG; the text and axes stay vectors.
    if not detailed:
        for collection in ax.collections:
            collection.set_rasterized(True)
    return fig
