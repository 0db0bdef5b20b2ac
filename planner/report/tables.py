"""Rich tables of plans, estimates, model info and validation runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from planner.cost import in_flight_microbatches
from planner.diagnose.calibration import CalibrationFit, ValidationRow, describe
from planner.diagnose.compare import MethodResult, best_step_s
from planner.ilp import LayerSolution
from planner.plan.config import ParallelConfig
from planner.plan.schema import Plan, PlanStage
from planner.simulate.events import Simulation
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import Estimate


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "-"


def estimate_tables(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, result: Estimate
) -> list[RenderableType]:
    """A headline and the time and memory breakdowns of one estimate."""
    config = config.model_copy(update={"dp": result.dp})
    head = Text.assemble(
        (f"{model.name} on {result.num_devices} x {cluster.device.name}: ", "bold"),
        describe(config),
        f", {result.num_microbatches} microbatches\n",
        (f"step {result.step_time_s:.3f} s", "bold"),
        f" | {result.tokens_per_s:,.0f} tokens/s | model {result.model_tflops_per_gpu:.1f} "
        f"TFLOP/s/GPU (hardware {result.hardware_tflops_per_gpu:.1f}) | MFU "
        f"{100 * result.mfu:.1f} % | bubble {100 * result.bubble_fraction:.1f} %",
    )
    times = Table(title="time per step (critical stage)", title_justify="left")
    times.add_column("part")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for name, seconds in result.time.model_dump().items():
        times.add_row(name.removesuffix("_s").replace("_", " "), f"{seconds:.4f}",
                      _pct(seconds, result.step_time_s))  # fmt: skip
    memory = Table(title="memory per device (most loaded stage)", title_justify="left")
    memory.add_column("part")
    memory.add_column("GiB", justify="right")
    for name, gib in result.memory.model_dump().items():
        memory.add_row(name.removesuffix("_gib"), f"{gib:.2f}")
    capacity = cluster.device.memory_gib
    verdict = "fits" if result.fits else "DOES NOT FIT"
    memory.add_row(Text("total", style="bold"),
                   Text(f"{result.peak_memory_gib:.2f} / {capacity:g} ({verdict})",
                        style="bold" if result.fits else "bold red"))  # fmt: skip
    return [head, times, memory]


def info_tables(info: dict[str, Any]) -> list[RenderableType]:
    """The model's shape, counts and layer kinds."""
    table = Table(title=info["name"], title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in info["architecture"].items():
        if value is not None:
            table.add_row(key, str(value))
    table.add_row("params_total", f"{info['params_total']:,}")
    table.add_row("params_active", f"{info['params_active']:,}")
    table.add_row("seq_length", str(info["seq_length"]))
    table.add_row("forward_flops_per_token", f"{info['forward_flops_per_token']:.4g}")
    table.add_row("training_flops_per_token", f"{info['training_flops_per_token']:.4g}")
    table.add_row("layer_kinds", ", ".join(f"{k} x{n}" for k, n in info["layer_kinds"].items()))
    graph = info["graph"]
    table.add_row("operator graph", f"{graph['operators']} ops, {graph['edges']} edges")
    return [table]


def validation_tables(rows: Sequence[ValidationRow]) -> list[RenderableType]:
    """Predicted against measured step times, with the error statistics."""
    table = Table(title="published runs: predicted vs measured step time", title_justify="left")
    for col, justify in (("run", "left"), ("GPUs", "right"), ("configuration", "left"),
                         ("measured s", "right"), ("predicted s", "right"),
                         ("error", "right"), ("memory GiB", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        style = "red" if abs(r.error) > 0.15 else None
        table.add_row(r.id, str(r.num_devices), r.config, f"{r.measured_s:.2f}",
                      f"{r.predicted_s:.2f}", Text(f"{100 * r.error:+.1f} %", style=style or ""),
                      f"{r.peak_memory_gib:.1f}")  # fmt: skip
    errors = [abs(r.error) for r in rows]
    summary = Text(
        f"{len(rows)} runs: median |error| {100 * statistics.median(errors):.1f} %, "
        f"max {100 * max(errors):.1f} %"
    )
    return [table, summary]


def calibration_tables(fit: CalibrationFit, *, written: bool) -> list[RenderableType]:
    """The fitted parameters and the runs before and after."""
    g = fit.gemm
    head = Text(
        f"fitted gemm efficiency: max_fraction {g.max_fraction}, half_saturation_gflop "
        f"{g.half_saturation_gflop}" + (" (written)" if written else " (not written: --write)")
    )
    return [head, *validation_tables(fit.after)]


def layer_tables(solution: LayerSolution) -> list[RenderableType]:
    """One solved layer: the strategy per operator, the reshardings, the solver's report."""
    r = solution.report
    if solution.time_s is None:
        least = solution.min_memory_bytes
        text = f"{solution.kind} layer on {solution.mesh[0]}x{solution.mesh[1]}: {r.status}"
        if least is not None:
            text += f"; the least memory any choice needs is {least / 2**30:.2f} GiB"
        return [Text(text, style="bold red")]
    head = Text.assemble(
        (f"{solution.kind} layer on a {solution.mesh[0]}x{solution.mesh[1]} mesh: ", "bold"),
        f"{1e3 * solution.time_s:.3f} ms per microbatch (forward + backward), "
        f"{solution.memory_bytes / 2**30:.2f} GiB, recompute {solution.recompute}, "
        f"ZeRO-{solution.zero}\n",
        f"solver {r.backend}: {r.status}, {r.num_variables} variables, {r.num_constraints} "
        f"constraints, {r.wall_s:.3f} s, gap {r.gap if r.gap is not None else '-'}",
    )  # fmt: skip
    ops = Table(title="strategy per operator (axis 0, axis 1)", title_justify="left")
    for col in ("operator", "split", "output layout", "folded in"):
        ops.add_column(col)
    for c in solution.choices:
        ops.add_row(c.op, c.strategy, ",".join(c.output),
                    ", ".join(f.split(".")[-1] for f in c.followers))  # fmt: skip
    edges = Table(title="resharding", title_justify="left")
    for col in ("from", "to", "forward", "backward", "ms"):
        edges.add_column(col)
    for e in solution.resharding:
        if e.forward or e.backward:
            edges.add_row(e.src, e.dst, " ".join(e.forward), " ".join(e.backward),
                          f"{1e3 * e.seconds:.3f}")  # fmt: skip
    return [head, ops, edges]


def plan_tables(plan: Plan) -> list[RenderableType]:
    """A plan: its one-line summary and predictions, a row per stage (runs of identical
    middle stages folded into one row), and how it was found."""
    p = plan.predicted
    head = Text.assemble(
        (plan.summary(), "bold"),
        f"\n{plan.model.name} on {plan.cluster.num_nodes * plan.cluster.devices_per_node} x "
        f"{plan.cluster.device}, global batch {plan.global_batch_size} x {plan.seq_length} "
        f"tokens, {plan.num_microbatches} microbatches of {plan.micro_batch_size}\n",
        (f"step {p.step_time_s:.3f} s", "bold"),
        f" | {p.tokens_per_s:,.0f} tokens/s | model {p.model_tflops_per_gpu:.1f} TFLOP/s/GPU "
        f"(hardware {p.hardware_tflops_per_gpu:.1f}) | MFU {100 * p.mfu:.1f} % | peak memory "
        f"{p.peak_memory_gib:.1f} GiB | bubble {100 * p.bubble_fraction:.1f} %",
    )  # fmt: skip
    # a light box: eleven columns should fit a 100-column terminal
    table = Table(title="stages: ms per microbatch, GiB per device", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)  # fmt: skip
    for col, justify in (("stage", "right"), ("layers", "right"), ("devices", "right"),
                         ("TP/DP/CP/EP", "right"), ("SP", "left"), ("ZeRO", "right"),
                         ("recompute", "left"), ("compute", "right"), ("comm", "right"),
                         ("pipeline", "right"), ("memory", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for first, last, cells in _stage_runs(plan.stages):
        stage = str(first.index) if first is last else f"{first.index}-{last.index}"
        layers = f"{first.layers[0]}-{last.layers[1]}"
        if first is not last:
            layers += f" ({first.num_layers} each)"
        table.add_row(stage, layers, *cells)
    s = plan.solver
    gap = f", gap {100 * s.gap:.2g} %" if s.gap else ""
    ilps = f", {s.ilp_count} ILPs, {s.cache_hits} reuses" if s.ilp_count else ""
    solver = Text(f"solver: {plan.method} for {plan.framework}, {s.time_s:.2f} s, {s.status}"
                  f"{gap}{ilps}", style="dim")  # fmt: skip
    return [head, _time_table(plan), table, _groups(plan), solver]


def _time_table(plan: Plan) -> Table:
    """Where the step's seconds go on the critical stage (as ``planner estimate`` prints)."""
    step = plan.predicted.step_time_s
    table = Table(title="time per step (critical stage)", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False)  # fmt: skip
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for name, seconds in plan.predicted.time.model_dump().items():
        if seconds > 0:
            table.add_row(name.removesuffix("_s").replace("_", " "), f"{seconds:.3f}",
                          _pct(seconds, step))  # fmt: skip
    return table


def group_spans(plan: Plan) -> dict[str, tuple[int, int]]:
    """Per group of the first stage, its ranks and how many nodes they span: the mesh's axes
    (``TP``, ``CP`` for a uniform plan; ``axis 0``, ``axis 1`` otherwise), the data-parallel
    replicas and the pipeline's stages."""
    per_node = plan.cluster.devices_per_node
    stage = plan.stages[0]
    first = stage.ranks[0]
    inner = stage.mesh[-1]

    def span(ranks: Sequence[int]) -> tuple[int, int]:
        return len(ranks), len({r // per_node for r in ranks})

    uniform = plan.configuration is not None
    out = {("TP" if uniform else f"axis {len(stage.mesh) - 1}"): span(first[:inner])}
    if len(first) > inner:
        out["CP" if uniform else "axis 0"] = span(first[::inner])
    out["DP"] = span([replica[0] for replica in stage.ranks])
    out["PP"] = span([s.ranks[0][0] for s in plan.stages])
    return {name: v for name, v in out.items() if v[0] > 1}


def _groups(plan: Plan) -> Text:
    """Where the groups sit: how many nodes each spans."""
    parts = []
    for name, (ranks, nodes) in group_spans(plan).items():
        where = "in 1 node" if nodes == 1 else f"across {nodes} nodes"
        parts.append(f"{name} {ranks} ranks {where}")
    return Text("groups: " + ("; ".join(parts) if parts else "one device"))


def _stage_cells(stage: PlanStage) -> tuple[str, ...]:
    """A stage's row, without its index and layers."""
    q, t = stage.parallel, stage.time
    return (f"{stage.num_devices} ({stage.mesh[0]}x{stage.mesh[1]})",
            f"{q.tp}/{q.dp}/{q.cp}/{q.ep}", "on" if q.sp else "-", str(q.zero),
            q.recompute, f"{1e3 * t.compute_s:.1f}", f"{1e3 * t.communication_s:.1f}",
            f"{1e3 * t.pipeline_s:.1f}", f"{stage.memory.total_gib:.1f}")  # fmt: skip


def _stage_runs(
    stages: Sequence[PlanStage],
) -> list[tuple[PlanStage, PlanStage, tuple[str, ...]]]:
    """Consecutive stages that print alike and hold as many layers, as (first, last, row)."""
    runs: list[tuple[PlanStage, PlanStage, tuple[str, ...]]] = []
    for stage in stages:
        cells = _stage_cells(stage)
        if runs and runs[-1][2] == cells and runs[-1][0].num_layers == stage.num_layers:
            runs[-1] = (runs[-1][0], stage, cells)
        else:
            runs.append((stage, stage, cells))
    return runs


def compare_tables(results: Sequence[MethodResult]) -> list[RenderableType]:
    """One row per method: its plan in one line, the predicted step and rates, peak memory,
    the time it took to find, and its step relative to the best."""
    best = best_step_s(results)
    plan = next(r.plan for r in results if r.plan is not None)
    label = results[0].label
    # Frameworks are measured against per-operator sharding (any), when it is in the table.
    yardstick = next((r.plan.predicted.step_time_s for r in results
                      if r.method == "any" and r.plan is not None), None)  # fmt: skip
    against = "x any" if label == "framework" and yardstick is not None else "x best"
    best = yardstick if against == "x any" else best
    head = Text(f"{plan.model.name} on {plan.cluster.num_nodes * plan.cluster.devices_per_node} "
                f"x {plan.cluster.device}, global batch {plan.global_batch_size} x "
                f"{plan.seq_length} tokens, {plan.precision}", style="bold")  # fmt: skip
    table = Table(title=f"{label}s compared (same cost model)", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False)  # fmt: skip
    for col, justify in ((label, "left"), ("plan", "left"), ("step s", "right"),
                         ("tokens/s", "right"), ("MFU", "right"), ("peak GiB", "right"),
                         ("solve s", "right"), (against, "right")):  # fmt: skip
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in results:
        if r.plan is None:
            table.add_row(r.method, Text(f"no plan: {r.error}", style="red"), "-", "-", "-",
                          "-", f"{r.solve_time_s:.2f}", "-")  # fmt: skip
            continue
        p = r.plan.predicted
        ratio = p.step_time_s / best
        table.add_row(r.method, r.plan.summary(), f"{p.step_time_s:.3f}",
                      f"{p.tokens_per_s:,.0f}", f"{100 * p.mfu:.1f} %",
                      f"{p.peak_memory_gib:.1f}", f"{r.solve_time_s:.2f}",
                      Text(f"{ratio:.3f}", style="bold green" if ratio == 1 else ""))  # fmt: skip
    return [head, table]


def simulation_json(plan: Plan, sim: Simulation) -> dict[str, object]:
    """The ``planner simulate --json`` object: the simulated step beside the plan's closed
    form, and per stage the busy and idle seconds and the activations held at the peak."""
    schedule = "gpipe" if plan.schedule.name == "gpipe" else "1f1b"  # cost's names
    closed = [in_flight_microbatches(schedule, stage=s.index, pp=len(plan.stages),
                                     vpp=plan.schedule.virtual_stages,
                                     num_microbatches=plan.num_microbatches)
              for s in plan.stages]  # fmt: skip
    return {
        "simulated_step_s": sim.step_s,
        "predicted_step_s": plan.predicted.step_time_s,
        "simulated_bubble_fraction": sim.bubble_fraction,
        "predicted_bubble_fraction": plan.predicted.bubble_fraction,
        "stages": [
            {
                "stage": i,
                "busy_s": sim.busy_s[i],
                "idle_s": sim.bubble_s[i],
                "peak_in_flight": sim.peak_in_flight[i],
                "closed_form_in_flight": closed[i],
            }
            for i in range(sim.num_stages)
        ],
    }


def simulation_tables(plan: Plan, sim: Simulation) -> list[RenderableType]:
    """The simulated step against the plan's prediction, and a row per stage."""
    data = simulation_json(plan, sim)
    predicted = plan.predicted.step_time_s
    head = Text.assemble(
        (plan.summary(), "bold"),
        f"\nsimulated step {sim.step_s:.3f} s, predicted {predicted:.3f} s "
        f"({100 * (sim.step_s / predicted - 1):+.2f} %); bubble simulated "
        f"{100 * sim.bubble_fraction:.1f} %, predicted {100 * plan.predicted.bubble_fraction:.1f} "
        f"%; {len(sim.events):,} operations",
    )  # fmt: skip
    table = Table(title="stages", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("stage", "busy s", "idle s", "in flight (simulated)", "in flight (closed form)"):
        table.add_column(col, justify="right")
    for row in data["stages"]:  # type: ignore[attr-defined]
        cells = (row["busy_s"], row["idle_s"], row["peak_in_flight"], row["closed_form_in_flight"])
        table.add_row(str(row["stage"]), *(f"{x:.3f}" for x in cells[:2]),
                      *(f"{x:g}" for x in cells[2:]))  # fmt: skip
    return [head, table]
