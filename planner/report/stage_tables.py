"""The plan's stage tables: a row per run of alike stages, its layers (an interleaved stage's
chunks), devices, parallel degrees, and its costs per microbatch.

Split from :mod:`planner.report.tables`, whose plan report shows them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType

from planner.plan.chunks import chunk_layers
from planner.plan.schema import Plan, PlanStage
from planner.report.width import FirstThatFits, keep_whole, light_table

_STAGE_LAYOUT = (("devices", "right"), ("TP/DP/CP/EP", "right"), ("SP", "left"),
                 ("ZeRO", "right"), ("recompute", "left"))  # fmt: skip
_STAGE_COSTS = (("compute", "right"), ("comm", "right"), ("pipeline", "right"),
                ("memory", "right"))  # fmt: skip


def stage_tables(plan: Plan, mtp_layers: int) -> RenderableType:
    """A row per run of stages: one table of eleven columns, or when it is too wide for the
    console, two (the stages' devices and parallelism; their costs)."""
    held = _held_layers(plan, mtp_layers)
    # a light box, padding collapsed: eleven columns fit a 100-column terminal
    one = light_table("stages: ms per microbatch, GiB per device", collapse_padding=True)
    layout = light_table("stages: devices and parallelism", collapse_padding=True)
    costs = light_table("stages: ms per microbatch, GiB per device", collapse_padding=True)
    split = len(_STAGE_LAYOUT)
    for table, columns, part in ((one, _STAGE_LAYOUT + _STAGE_COSTS, slice(None)),
                                 (layout, _STAGE_LAYOUT, slice(split)),
                                 (costs, _STAGE_COSTS, slice(split, None))):  # fmt: skip
        for col, justify in (("stage", "right"), ("layers", "right"), *columns):
            table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        # each table folds the runs of stages that are alike in its own columns; stages of
        # chunks fold only as the whole pipeline (a V's middle stages hold other layers alike)
        runs = _stage_runs(plan.stages, part, plan.data_parallel_replicas)
        if held is not None:
            whole = (0, len(plan.stages) - 1)
            runs = [r for first, last, cells in runs for r in (
                [(first, last, cells)] if (first.index, last.index) == whole else
                [(s, s, cells) for s in plan.stages[first.index:last.index + 1]])]
        for first, last, cells in runs:
            stage = str(first.index) if first is last else f"{first.index}-{last.index}"
            table.add_row(stage, _layers_cell(first, last, held, plan), *cells)
    return FirstThatFits(keep_whole(one), Group(keep_whole(layout), keep_whole(costs)))


def _held_layers(plan: Plan, mtp_layers: int) -> tuple[tuple[tuple[int, int], ...], ...] | None:
    """Each stage's chunks as layer ranges where it holds several (interleaved or V
    schedules), or None: then a stage holds the one range its ``layers`` say."""
    schedule = plan.schedule
    if schedule.virtual_stages == 1 or len(plan.stages) == 1:
        return None
    counts = tuple(s.num_layers for s in plan.stages)
    try:
        return chunk_layers(counts, schedule.virtual_stages, v_shape=schedule.name == "zb-v",
                            mtp=mtp_layers)  # fmt: skip
    except ValueError:  # a cut that needs the model's modules, which the caller did not give
        return None


def _layers_cell(first: PlanStage, last: PlanStage,
                 held: tuple[tuple[tuple[int, int], ...], ...] | None, plan: Plan) -> str:
    """The decoder layers a run of stages holds: one range a stage, or its chunks' (the first
    two, which show the stride, and an ellipsis where there are more), or for a run of several
    stages the count each holds (and its range where the stages' layers are contiguous: a run
    without chunks, or the whole pipeline)."""
    if first is last and held is not None:
        chunks = [f"{a}-{b}" if a != b else str(a) for a, b in held[first.index]]
        return ", ".join(chunks if len(chunks) <= 2 else [*chunks[:2], "..."])
    if first is last:
        return f"{first.layers[0]}-{first.layers[1]}"
    whole = held is None or (first.index, last.index) == (0, len(plan.stages) - 1)
    span = f"{first.layers[0]}-{last.layers[1]} " if whole else ""
    return f"{span}({first.num_layers} each)"


def _stage_cells(stage: PlanStage, replicas: int = 1) -> tuple[str, ...]:
    """A stage's row, without its index and layers: its devices over all ``replicas`` of the
    pipeline (as a stage of Megatron-LM holds TP x CP x DP of them), its mesh's shape times
    the replicas, and its data-parallel degree over them too (the plan's summary's DP)."""
    q, t = stage.parallel, stage.time
    mesh = f"{stage.mesh[0]}x{stage.mesh[1]}"
    return (f"{stage.num_devices * replicas} ({f'{replicas} x ' * (replicas > 1)}{mesh})",
            f"{q.tp}/{q.dp * replicas}/{q.cp}/{q.ep}", "on" if q.sp else "-", str(q.zero),
            q.recompute, f"{1e3 * t.compute_s:.1f}", f"{1e3 * t.communication_s:.1f}",
            f"{1e3 * t.pipeline_s:.1f}", f"{stage.memory.total_gib:.1f}")  # fmt: skip


def _stage_runs(
    stages: Sequence[PlanStage], columns: slice = slice(None), replicas: int = 1
) -> list[tuple[PlanStage, PlanStage, tuple[str, ...]]]:
    """Consecutive stages that print alike in ``columns`` of :func:`_stage_cells` and hold as
    many layers, as (first, last, row)."""
    runs: list[tuple[PlanStage, PlanStage, tuple[str, ...]]] = []
    for stage in stages:
        cells = _stage_cells(stage, replicas)[columns]
        if runs and runs[-1][2] == cells and runs[-1][0].num_layers == stage.num_layers:
            runs[-1] = (runs[-1][0], stage, cells)
        else:
            runs.append((stage, stage, cells))
    return runs
