"""A Gantt chart of a simulated pipeline step: one row per stage, one bar per operation, and
under each stage its communication in lanes (:mod:`planner.report.comm_lanes`): solid where
it is exposed, pale (and hatched, when the bars are few enough to outline) where compute
hides it.

Idle time is left blank, so the bubbles show as gaps. Drawn on a private
:class:`~matplotlib.figure.Figure` with the Agg canvas: no pyplot, no global backend switch,
safe to call from any program that uses matplotlib itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.report.comm_lanes import (
    COMM_NAMES,
    CommKind,
    Segment,
    StageComm,
    comm_segments,
    lane_kinds,
)
from planner.report.pictures import literal_text, save
from planner.simulate.events import Phase, Simulation
from planner.vocabulary import counted

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
# Communication: colours apart from the phases', except that data-parallel traffic is the
# sync phase's colour (a sync is exposed data-parallel traffic) and pipeline sends a darker
# grey than the send phase's.
COMM_COLORS: dict[CommKind, str] = {
    "TP": "#8C510A",
    "CP": "#6A3D9A",
    "EP": "#C51B7D",
    "DP": "#D55E00",
    "PP": "#555555",
    "other": "#1B7837",
}
HIDDEN_LIGHTEN = 0.72
"""How much of white a hidden stretch's fill is (it is also hatched in its kind's colour)."""
MAX_LANE_ROWS = 48
"""Lanes per kind while stages x kinds stays within this; past it, one lane of all kinds."""
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
    mix = CHUNK_LIGHTEN * chunk / (chunks - 1) if chunk is not None and chunks > 1 else 0.0
    return _lighten_by(color, mix)


def _lighten_by(color: str, mix: float) -> tuple[float, float, float]:
    """``color`` mixed with ``mix`` of white."""
    r, g, b = to_rgb(color)
    return (r + (1 - r) * mix, g + (1 - g) * mix, b + (1 - b) * mix)


def _shade(phase: Phase, chunk: int | None, chunks: int) -> tuple[float, float, float]:
    """The phase's colour, lighter for later model chunks."""
    return _lighten(PHASE_COLORS[phase], chunk, chunks)


def _text_color(rgb: tuple[float, float, float]) -> str:
    """Black on light bars, white on dark ones (relative luminance, ITU-R BT.709)."""
    r, g, b = rgb
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "white"


def time_unit(step_s: float) -> tuple[str, float]:
    """Seconds for long steps, milliseconds for short ones: the unit and its seconds' scale."""
    return ("ms", 1e3) if step_s < 1.0 else ("s", 1.0)


def _figure_height_in(stages: int, lanes: int) -> float:
    """Taller rows for short pipelines, thinner ones for deep pipelines; each lane adds
    about half a compute row."""
    row_in = 0.45 if stages <= 8 else 0.3 if stages <= 24 else 0.19
    return min(MAX_HEIGHT_IN, 2.1 + row_in * stages * (1 + 0.45 * lanes))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rows:
    """Where a stage's compute bar and its lanes sit, as offsets from the stage's index on
    the y axis (stage 0 on top: larger offsets are lower)."""

    compute: tuple[float, float]
    """The compute bar's top and bottom."""
    lanes: tuple[tuple[float, float], ...]
    """Each lane's top and bottom, in lane order."""

    @classmethod
    def of(cls, lanes: int) -> _Rows:
        """The compute bar over ``lanes`` equal lanes (none: the bar fills the row)."""
        if lanes == 0:
            return cls(compute=(-0.4, 0.4), lanes=())
        top, bottom = 0.06, 0.46
        h = (bottom - top) / lanes
        return cls(compute=(-0.46, 0.02),
                   lanes=tuple((top + j * h, top + (j + 1) * h - 0.15 * h)
                               for j in range(lanes)))  # fmt: skip


def _rectangles(rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                y: tuple[float, float]) -> np.ndarray:  # fmt: skip
    """Rectangles from ``start`` to ``end`` on rows at ``rows + y[0]`` to ``rows + y[1]``,
    as PolyCollection's vertices."""
    y0, y1 = rows + y[0], rows + y[1]
    corners = [(start, y0), (end, y0), (end, y1), (start, y1)]
    return np.stack([np.stack(corner, axis=-1) for corner in corners], axis=1)


def _draw_bars(ax: Axes, sim: Simulation, scale: float, *, detailed: bool, rows: _Rows) -> None:
    """One collection of rectangles per (phase, chunk), built as arrays: a handful of artists
    even for a million events."""
    columns: dict[tuple[Phase, int | None], list[tuple[int, float, float]]] = defaultdict(list)
    for e in sim.events:
        columns[(e.phase, e.chunk)].append((e.stage, e.start_s, e.end_s))
    for (phase, chunk), events in columns.items():
        stage, start, end = (np.array(col, dtype=float) for col in zip(*events, strict=True))
        verts = _rectangles(stage, start * scale, end * scale, rows.compute)
        ax.add_collection(PolyCollection(
            verts, facecolors=[_shade(phase, chunk, sim.virtual_stages)], edgecolors="white",
            linewidths=0.4 if detailed else 0.0,
        ))  # fmt: skip


def _draw_lanes(ax: Axes, segments: Sequence[Segment], lanes: Sequence[CommKind], scale: float,
                rows: _Rows, *, detailed: bool) -> None:  # fmt: skip
    """One collection per (kind, hidden or exposed), each stretch in its kind's lane (or the
    one lane of all kinds); each collection labelled ``KIND exposed`` or ``KIND hidden``.
    ``detailed``: few enough stretches to outline each (thousands of outlined sends would
    paint a lane grey)."""
    columns: dict[tuple[CommKind, bool], list[Segment]] = defaultdict(list)
    for seg in segments:
        if seg.end_s > seg.start_s:
            columns[(seg.kind, seg.hidden)].append(seg)
    for (kind, hidden), found in sorted(columns.items(), key=lambda kv: kv[0][1], reverse=True):
        stage = np.array([seg.stage for seg in found], dtype=float)
        start = np.array([seg.start_s for seg in found]) * scale
        end = np.array([seg.end_s for seg in found]) * scale
        lane = rows.lanes[lanes.index(kind) if len(lanes) > 1 else 0]
        colour = COMM_COLORS[kind]
        face = _lighten_by(colour, HIDDEN_LIGHTEN) if hidden else to_rgb(colour)
        # Outlined in the kind's colour, so that a send or a collective far shorter than a
        # pixel still shows (about a third of a point wide at least).
        # Hatching is drawn per polygon: thousands of hatched stretches took Agg 30 s (Llama
        # 3.1 405B on 32 stages, 64 microbatches), where the pale fill alone tells them apart.
        collection = PolyCollection(_rectangles(stage, start, end, lane), facecolors=[face],
                                    edgecolors=[colour], linewidths=0.3 if detailed else 0.0,
                                    hatch="////" if hidden and detailed else None)  # fmt: skip
        collection.set_label(f"{kind} {'hidden' if hidden else 'exposed'}")
        ax.add_collection(collection)


def _draw_labels(ax: Axes, fig: Figure, sim: Simulation, scale: float, rows: _Rows) -> None:
    """Microbatch numbers inside forward, backward and recompute bars wide enough to hold
    them, in a font sized to the rows and shrunk (to a legible minimum) to fit the bar."""
    width_pt = fig.get_figwidth() * 72 * 0.86  # the axes take about this much of the width
    height_pt = fig.get_figheight() * 72 * 0.75
    bar = (rows.compute[1] - rows.compute[0]) / 0.8  # of the bar without lanes
    fontsize = min(8.0, 0.5 * bar * height_pt / sim.num_stages)
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
        ax.text((e.start_s + e.end_s) / 2 * scale, e.stage + sum(rows.compute) / 2, text,
                ha="center", va="center", fontsize=size, color=color)  # fmt: skip


def _legend(
    fig: Figure, sim: Simulation, segments: Sequence[Segment], *, detailed: bool
) -> None:
    """Below the chart, a row of the phases that occur (and for interleaving the chunk
    shades), and a row of the communication's kinds and how a hidden stretch looks (hatched
    only when ``detailed``, as the lanes draw it)."""
    present = {e.phase for e in sim.events}
    phases = [Patch(facecolor=PHASE_COLORS[p], label=p) for p in PHASE_COLORS if p in present]
    v = sim.virtual_stages
    if v > 1:
        forward = PHASE_COLORS["forward"]
        phases += [Patch(facecolor=_lighten(forward, c, v), label=f"chunk {c}") for c in range(v)]
    comm = [Patch(facecolor=COMM_COLORS[k], label=COMM_NAMES[k]) for k in lane_kinds(segments)]
    if any(seg.hidden for seg in segments):
        comm.append(Patch(facecolor=_lighten_by("#555555", HIDDEN_LIGHTEN), edgecolor="#555555",
                          hatch="////" if detailed else None, linewidth=0.0,
                          label="hidden behind compute"))  # fmt: skip
    rows = [phases, comm] if comm else [phases]
    ncol = max(len(r) for r in rows)
    blank = Patch(facecolor="none", edgecolor="none", label=" ")
    padded = [r + [blank] * (ncol - len(r)) for r in rows]
    # The legend fills column by column: interleave the rows to read them across.
    handles = [row[c] for c in range(ncol) for row in padded]
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False,
               fontsize=8, handlelength=1.2)


def _idle_notes(ax: Axes, sim: Simulation, rows: _Rows) -> None:
    """Each stage's idle share of the forward-backward part, right of its compute bar."""
    if sim.num_stages > 32 or sim.pipeline_s <= 0:
        return
    middle = sum(rows.compute) / 2
    for i, idle in enumerate(sim.bubble_s):
        ax.annotate(f"idle {100 * idle / sim.pipeline_s:.0f} %", (1.005, i + middle),
                    xycoords=("axes fraction", "data"), va="center", fontsize=7,
                    color="#444444")  # fmt: skip


def _summary(sim: Simulation, unit: str, scale: float) -> str:
    """The pipeline's shape and what the simulation adds up to, in one line: the simulated
    step, said so beside the priced one it differs from (the closed forms price every stage
    as the slowest and charge sends both ways: 18.01 against 18.034 s on the quickstart's
    plan, ``docs/simulate.md``)."""
    chunks = f", {sim.virtual_stages} chunks per stage" if sim.virtual_stages > 1 else ""
    return (
        f"{counted(sim.num_stages, 'stage')}, "
        f"{counted(sim.num_microbatches, 'microbatch', 'microbatches')}{chunks}: "
        f"simulated step {sim.step_s * scale:.4g} {unit}, forward-backward "
        f"{sim.pipeline_s * scale:.4g} "
        f"{unit}, bubble {100 * sim.bubble_fraction:.1f} %"
    )


def comm_totals_s(segments: Sequence[Segment], stage: int) -> tuple[float, float]:
    """(exposed, hidden) seconds of communication on ``stage`` over the step."""
    exposed = sum(s.end_s - s.start_s for s in segments if s.stage == stage and not s.hidden)
    hidden = sum(s.end_s - s.start_s for s in segments if s.stage == stage and s.hidden)
    return exposed, hidden


def _comm_summary(sim: Simulation, segments: Sequence[Segment], unit: str,
                  scale: float) -> str:  # fmt: skip
    """The busiest stage's communication over the step, exposed and hidden, in one line."""
    critical = max(range(sim.num_stages), key=lambda i: sim.busy_s[i])
    exposed, hidden = comm_totals_s(segments, critical)
    digits = 3 if unit == "s" else 1
    return (f"communication on stage {critical} (the busiest): {exposed * scale:.{digits}f} "
            f"{unit} exposed, {hidden * scale:.{digits}f} {unit} hidden behind compute")


def draw_gantt(
    sim: Simulation, path: str | Path, *, title: str = "", option: str = "--gantt",
    comm: Sequence[StageComm] = (),
) -> Path:  # fmt: skip
    """Write ``sim`` as a Gantt chart to ``path`` (.png or .svg, by its suffix), with the
    stages' communication ``comm`` in lanes (none: no lanes)."""
    return save(gantt_figure(sim, title=title, comm=comm), path, option=option)


@literal_text
def gantt_figure(sim: Simulation, *, title: str = "", comm: Sequence[StageComm] = ()) -> Figure:
    """``sim`` as a Gantt chart, with each stage's communication ``comm``
    (:func:`planner.report.comm_lanes.stage_comm`) in lanes under its compute.

    Stage 0 is the top row; bars are coloured by phase, later model chunks drawn lighter;
    microbatch numbers are written inside the bars wide enough for them. Each kind of
    communication that occurs has a lane of its own under every stage (``TP``, ``CP``, ...
    as the lanes' tick labels up to 8 stages), or past :data:`MAX_LANE_ROWS` lanes one lane
    of all kinds (``comm``); exposed stretches are solid, hidden ones pale and hatched.
    """
    segments = comm_segments(sim, comm) if comm else []
    kinds = lane_kinds(segments)
    p = sim.num_stages
    lanes: list[CommKind] = kinds if p * len(kinds) <= MAX_LANE_ROWS else kinds[:1]
    rows = _Rows.of(len(lanes))
    unit, scale = time_unit(sim.step_s)
    fig = Figure(figsize=(WIDTH_IN, _figure_height_in(p, len(lanes))), layout="constrained")
    ax = fig.add_subplot()
    detailed = len(sim.events) <= MAX_DETAILED_BARS
    _draw_bars(ax, sim, scale, detailed=detailed, rows=rows)
    if segments:
        _draw_lanes(ax, segments, kinds if len(lanes) > 1 else [], scale, rows,
                    detailed=detailed)
    if detailed:
        _draw_labels(ax, fig, sim, scale, rows)
    ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top
    step = max(1, p // 16)  # at most about 16 stage names on the axis
    middle = sum(rows.compute) / 2
    ax.set_yticks([i + middle for i in range(0, p, step)],
                  [f"stage {i}" for i in range(0, p, step)], fontsize=8)  # fmt: skip
    if lanes and p <= 8:
        names = lanes if len(lanes) > 1 or len(kinds) == 1 else ["comm"]
        ax.set_yticks([i + sum(y) / 2 for i in range(p) for y in rows.lanes],
                      [n for _ in range(p) for n in names], minor=True, fontsize=6)  # fmt: skip
        ax.tick_params(axis="y", which="minor", length=0, labelcolor="#555555")
    ax.set_xlim(0, sim.step_s * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    _idle_notes(ax, sim, rows)
    _legend(fig, sim, segments, detailed=detailed)
    summary = _summary(sim, unit, scale)
    if segments:
        summary += "\n" + _comm_summary(sim, segments, unit, scale)
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=10, loc="left")
    # Many bars as vectors make a huge SVG; the text and axes stay vectors.
    if not detailed:
        for collection in ax.collections:
            collection.set_rasterized(True)
    return fig
