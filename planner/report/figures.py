"""Pictures of plans: memory per stage, where a step's time goes, methods side by side.

Figures are drawn on their own :class:`~matplotlib.figure.Figure` with the Agg canvas, so
nothing global in matplotlib (its backend, pyplot's figure list) is touched; the file's suffix
(``.png`` or ``.svg``) picks the format.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from planner.diagnose.compare import MethodResult, yardstick
from planner.plan.schema import Plan
from planner.report.bands import band_text, with_band
from planner.report.comm_lanes import stage_comm
from planner.report.gantt import COMM_COLORS, PHASE_COLORS, draw_gantt, time_unit
from planner.report.output import PLAN_REPORT, check_folder
from planner.report.pictures import FORMATS, literal_text, save
from planner.simulate.events import simulate_plan

MEMORY_PARTS = (
    ("weights_gib", "weights", "#4c72b0"),
    ("gradients_gib", "gradients", "#55a868"),
    ("optimizer_gib", "optimizer states", "#c44e52"),
    ("activations_gib", "activations", "#dd8452"),
    ("working_gib", "layer transient", "#e5ae38"),
    ("loss_workspace_gib", "loss workspace", "#8172b3"),
    ("gathered_parameters_gib", "ZeRO-3 gathered", "#64b5cd"),
    ("other_gib", "reserve", "#8c8c8c"),
)
"""The memory breakdown's parts (:class:`~planner.plan.schema.MemoryBreakdown`'s fields), in
order, as the stacked bars draw them."""
TIME_PARTS = (
    ("compute_s", "compute", PHASE_COLORS["forward"]),
    ("tensor_parallel_comm_s", "tensor parallel", COMM_COLORS["TP"]),
    ("context_parallel_comm_s", "context parallel", COMM_COLORS["CP"]),
    ("expert_parallel_comm_s", "expert parallel", COMM_COLORS["EP"]),
    ("pipeline_comm_s", "pipeline sends", COMM_COLORS["PP"]),
    ("pipeline_bubble_s", "pipeline bubble", "#d9d9d9"),
    ("data_parallel_comm_exposed_s", "data parallel (exposed)", COMM_COLORS["DP"]),
    ("optimizer_s", "optimizer step", PHASE_COLORS["optimizer"]),
)
"""Step-time parts in the order they are stacked, with their labels and the Gantt chart's
colours for the same traffic (data parallel was green here and orange there)."""
def _title(plan: Plan) -> str:
    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    return f"{plan.model.name} on {devices:,} x {plan.cluster.device}: {plan.summary()}"


def plan_title(plan: Plan) -> str:
    """The title every picture of ``plan`` carries: the model, the devices and the plan,
    broken at commas to fit the figure."""
    return _wrap(_title(plan))


def _wrap(text: str, width: int = 110) -> str:
    """Break a long title at commas so it stays inside the figure."""
    lines, line = [], ""
    for part in text.split(", "):
        candidate = f"{line}, {part}" if line else part
        if len(candidate) > width and line:
            lines.append(line + ",")
            line = part
        else:
            line = candidate
    return "\n".join([*lines, line])


@literal_text
def memory_figure(plan: Plan) -> Figure:
    """A stacked bar per stage of one device's peak memory (weights, gradients, optimizer
    states, activations, the reserve) and its headroom to the device's capacity."""
    capacity = plan.cluster.device_memory_gib
    stages = plan.stages
    width = min(14.0, max(6.0, 0.28 * len(stages) + 3))
    figure = Figure(figsize=(width, 4.8))
    ax = figure.add_subplot()
    x = [s.index for s in stages]
    bottom = [0.0] * len(stages)
    for field, label, colour in MEMORY_PARTS:
        values = [getattr(s.memory, field) for s in stages]
        if not any(values):  # no bar: nor a legend entry for it
            continue
        ax.bar(x, values, bottom=bottom, color=colour, label=label, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    headroom = [max(0.0, capacity - b) for b in bottom]
    ax.bar(x, headroom, bottom=bottom, color="white", edgecolor="#bbbbbb", hatch="//",
           linewidth=0.5, width=0.8, label="headroom")  # fmt: skip
    ax.axhline(capacity, color="black", linewidth=1, linestyle="--")
    # on a white ground: a stage filled to the margin drew its bar through the words
    ground = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0}
    ax.text(x[-1] + 0.5, capacity, f" capacity {capacity:g} GiB", va="bottom", ha="right",
            fontsize=8, bbox=ground)  # fmt: skip
    if plan.memory_margin_gib > 0:  # what the plan leaves free, under the capacity
        usable = capacity - plan.memory_margin_gib
        ax.axhline(usable, color="black", linewidth=0.8, linestyle=":")
        ax.text(x[-1] + 0.5, usable, f"margin {plan.memory_margin_gib:.1f} GiB ", va="top",
                ha="right", fontsize=8, bbox=ground)  # fmt: skip
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per device")
    ax.set_ylim(0, max(capacity, *bottom) * 1.12)
    step = max(1, len(stages) // 16)
    ax.set_xticks(x[::step])
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=6, fontsize=8, frameon=False)
    ax.set_title(plan_title(plan) + "\npeak memory per device", fontsize=9)
    return figure


@literal_text
def time_figure(plan: Plan) -> Figure:
    """One step's seconds on the critical stage as a stacked horizontal bar, each part
    labelled with its share."""
    t = plan.predicted.time
    step = plan.predicted.step_time_s
    figure = Figure(figsize=(10, 2.6))
    ax = figure.add_subplot()
    unit, scale = time_unit(step)  # a sub-second step in ms, as its Gantt chart draws it
    left = 0.0
    for field, label, colour in TIME_PARTS:
        seconds = getattr(t, field)
        if seconds <= 0:
            continue
        share = seconds / step
        ax.barh([0], [seconds * scale], left=left, color=colour, edgecolor="white", height=0.6,
                label=f"{label}: {seconds * scale:.3f} {unit} ({100 * share:.1f} %)")
        if share >= 0.06:  # the legend's share, not rounded to "100 %" beside its 99.6 %
            ax.text(left + seconds * scale / 2, 0, f"{100 * share:.1f} %", ha="center",
                    va="center", fontsize=9,
                    color="white" if colour != "#d9d9d9" else "black")  # fmt: skip
        left += seconds * scale
    ax.set_xlim(0, step * scale)
    ax.set_ylim(-0.5, 0.5)
    ax.set_yticks([])
    ax.set_xlabel(f"{'seconds' if unit == 's' else 'milliseconds'} per step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8, frameon=False)
    ax.set_title(plan_title(plan) + f"\nstep {with_band(step, plan.predicted.error_band)}: "
                 "where the time goes on the critical stage", fontsize=9)  # fmt: skip
    return figure


@literal_text
def compare_figure(results: Sequence[MethodResult], title: str = "") -> Figure:
    """The methods' predicted step times as bars (shortest is best), each labelled with its
    step, MFU and solve time; a method without a plan is marked so."""
    figure = Figure(figsize=(max(5.0, 1.6 * len(results) + 2), 4.2))
    ax = figure.add_subplot()
    found = [r.step_time_s for r in results if r.step_time_s is not None]
    best = min(found)
    top = max(found)
    against = yardstick(results)  # as the table's last column
    for i, r in enumerate(results):
        if r.plan is None:
            ax.text(i, top * 0.05, "no plan", ha="center", va="bottom", fontsize=9, color="red")
            continue
        step = r.plan.predicted.step_time_s
        colour = "#55a868" if step == best else "#4c72b0"
        ax.bar([i], [step], color=colour, width=0.6)
        solved = f"{r.solve_time_s:.1f} s" if r.solve_time_s >= 0.05 else "< 0.1 s"
        ax.text(i, step, f"{step:.2f} s {band_text(r.plan.predicted.error_band)}\n"
                f"MFU {100 * r.plan.predicted.mfu:.1f} %\n"
                f"{against.ratio(step):.3f} x {against.name},\nsolved in {solved}",
                ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(results)), [r.method for r in results])
    # every column inside, a row without a plan too (the limits followed the bars alone)
    ax.set_xlim(-0.6, len(results) - 0.4)
    ax.set_ylabel("predicted seconds per step")
    ax.set_ylim(0, top * 1.35)
    ax.set_title(f"{title}: " * bool(title) + "predicted step time (lower is better; the "
                 "fastest in green)\n" + against.meaning, fontsize=9)
    return figure


def write_report(plan: Plan, directory: str | Path) -> list[Path]:
    """Every picture of ``plan`` into ``directory`` (created if missing), as PNG and SVG:
    the simulated schedule's Gantt chart, the memory per stage and the step's time."""
    directory = Path(directory)
    check_folder(directory, option="--report", files=PLAN_REPORT)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    simulation = simulate_plan(plan)
    for suffix in FORMATS:
        written.append(draw_gantt(simulation, directory / f"gantt{suffix}",
                                  title=plan_title(plan), option="--report",
                                  comm=stage_comm(plan)))  # fmt: skip
        written.append(save(memory_figure(plan), directory / f"memory{suffix}",
                            option="--report"))
        written.append(save(time_figure(plan), directory / f"time{suffix}", option="--report"))
    return written
