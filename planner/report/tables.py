"""Rich tables of plans, estimates, model info and validation runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from planner import cost
from planner.cost.risk import QUANTILE
from planner.diagnose.compare import MethodResult, yardstick
from planner.diagnose.validation_rows import describe
from planner.ilp import LayerSolution
from planner.plan.bands import MemoryBand
from planner.plan.config import ParallelConfig, resolve
from planner.plan.schema import Plan, Predicted
from planner.report.bands import (
    band_cell,
    band_line,
    memory_line,
    not_significant,
    ranked_line,
    with_band,
)
from planner.report.stage_tables import stage_tables
from planner.report.width import Clauses, FirstThatFits, Prose, keep_whole, light_table, title
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import Estimate
from planner.vocabulary import FP8_STACKS, GIB, counted


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "-"


def _step(p: Predicted) -> Text:
    """``step 16.900 s +/- 6 %``: the predicted step with its error band, in bold."""
    return Text(f"step {with_band(p.step_time_s, p.error_band)}", style="bold")


def _rates(step: Text, p: Estimate | Predicted, *more: str) -> Clauses:
    """The step and the rates, ``|`` between them, a line broken only between two."""
    return Clauses([step, f"{p.tokens_per_s:,.0f} tokens/s",
                    f"model {p.model_tflops_per_gpu:.1f} TFLOP/s/GPU (hardware "
                    f"{p.hardware_tflops_per_gpu:.1f})",
                    mfu_text(p.mfu, p.model_tflops_per_gpu > 1.2 * p.hardware_tflops_per_gpu),
                    *more],
                   sep=" | ", tail="")  # fmt: skip


def mfu_text(mfu: float, above_executed: bool = False) -> str:
    """``MFU 58.7 %``; past 100 %, or where the model FLOPs exceed those executed by more than
    a fifth (``above_executed``: long sequences, whose attention scores dominate), it says why:
    model
    FLOPs count every attention score (:func:`planner.cost.throughput`, the convention MFU is
    published in), which a causal kernel halves, as Megatron-LM's log counts them.

    >>> mfu_text(0.587), mfu_text(1.153)
    ('MFU 58.7 %', 'MFU 115.3 % (counting full attention; causal kernels run half)')
    >>> mfu_text(0.823, above_executed=True)  # Qwen3-235B at 128K tokens: 814 model, 507 run
    'MFU 82.3 % (counting full attention; causal kernels run half)'
    """
    why = " (counting full attention; causal kernels run half)" if (
        mfu > 1 or above_executed) else ""
    return f"MFU {100 * mfu:.1f} %{why}"


def _memory(band: MemoryBand | None) -> list[Prose]:
    """The memory band's line, where the plan has one."""
    line = memory_line(band)
    return [] if line is None else [Prose(line)]


def _profiled(p: Predicted) -> list[Prose]:
    """What a layer profile measured of the price, where one was given."""
    return [Prose(f"profile: {'; '.join(p.profiled)}")] if p.profiled else []


def _software(config: ParallelConfig, stack: str, precision: str) -> list[str]:
    """What the configuration's summary leaves out and its price turns on: a stack other
    than Megatron-Core's with Transformer Engine (whose FP8, fused-loss and compiled forms the
    summary names), a precision other than bf16, attention without the fused kernel, the
    communication overlapped (each off by default, each worth seconds)."""
    overlaps = [name for name, on in (("grad reduce", config.overlap_grad_reduce),
                                      ("param gather", config.overlap_param_gather),
                                      ("TP comm", config.tp_comm_overlap)) if on]
    return [*([f"stack {stack}"] * (not stack.startswith("megatron-te"))),
            *([precision] * (precision != "bf16")),
            *(["unfused attention"] * (not config.flash_attention)),
            *([f"overlapped: {', '.join(overlaps)}"] * bool(overlaps))]


def estimate_tables(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, result: Estimate,
    memory_margin_gib: float | None = None,
) -> list[RenderableType]:
    """A headline and the time and memory breakdowns of one estimate; the memory's total
    against what a device may use, its memory less the margin it was priced with
    (``memory_margin_gib``, else the stack's)."""
    config = config.model_copy(update={"dp": result.dp})
    what = Text.assemble((f"{model.name} on {result.num_devices} x {cluster.device.name}: ",
                          "bold"), describe(config))  # fmt: skip
    training = resolve(model, cluster, config).training
    head = Group(
        Clauses([what, *_software(config, training.stack, training.precision),
                 f"global batch {training.global_batch_size} x {training.seq_length} tokens",
                 counted(result.num_microbatches, "microbatch", "microbatches")]),
        _rates(_step(result), result, f"bubble {100 * result.bubble_fraction:.1f} %"),
        Prose(band_line(result.error_band)),
        *_memory(result.memory_band),
        *_profiled(result),
    )  # fmt: skip
    memory = light_table("memory per device (most loaded stage)")
    memory.add_column("part", no_wrap=True)
    memory.add_column("GiB", justify="right", no_wrap=True)
    for name, gib in result.memory.model_dump().items():
        memory.add_row(_PART_NAMES.get(name, name.removesuffix("_gib").replace("_", " ")),
                       f"{gib:.2f}")  # fmt: skip
    stack = training.stack
    usable = cost.usable_bytes(cluster.device, memory_margin_gib, stack) / GIB
    host = cluster.host
    over = host is not None and result.host_memory_gib > host.memory_gib
    # When the host is short the device's own verdict is not known here (the margin is not)
    verdict = "" if over else " (fits)" if result.fits else " (DOES NOT FIT)"
    memory.add_row(Text("total", style="bold"),
                   Text(f"{result.peak_memory_gib:.2f} / {usable:.2f} usable{verdict}",
                        style="bold" if result.fits or over else "bold red"))  # fmt: skip
    if result.host_memory_gib > 0 and host is not None:  # only what was offloaded
        memory.add_row("host, per node",
                       Text(f"{result.host_memory_gib:.2f} / {host.memory_gib:g}"
                            + (" (DOES NOT FIT)" if over else ""), style="bold red" * over))
    return [head, keep_whole(_time_table(result)), keep_whole(memory)]


_PART_NAMES = {"other_gib": "other: CUDA, NCCL, cache"}
"""What the memory table calls a part other than by its field: the reserve (the CUDA context,
NCCL's buffers, which an all-to-all's peers grow, and the allocator's cache)."""


def info_tables(info: dict[str, Any]) -> list[RenderableType]:
    """The model's shape, counts and layer kinds."""
    table = Table(title=title(info["name"]), title_justify="left", show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", justify="right")
    for key, value in info["architecture"].items():
        if isinstance(value, dict):  # a block (moe, mla): its fields, a line broken between two
            table.add_row(key, Clauses([f"{k}={v}" for k, v in value.items()]))
        elif value is not None:
            table.add_row(key, str(value))
    table.add_row("params_total", f"{info['params_total']:,}")
    table.add_row("params_active", f"{info['params_active']:,}")
    if info["params_mtp"]:
        table.add_row("params_mtp", f"{info['params_mtp']:,}")
    seq = info["seq_length"]
    table.add_row("seq_length", f"{seq} ({info['seq_length_from']})")
    # FLOPs per token grow with the sequence (the attention scores): say at which they are.
    for key in ("forward_flops_per_token", "training_flops_per_token"):
        table.add_row(key, f"{info[key]:.4g} at {seq} tokens")
    table.add_row("layer_kinds",
                  Clauses([f"{k} x{n}" for k, n in info["layer_kinds"].items()]))  # fmt: skip
    graph = info["graph"]
    table.add_row("operator graph", f"{graph['operators']} ops, {graph['edges']} edges")
    return [keep_whole(table)]


def layer_tables(solution: LayerSolution) -> list[RenderableType]:
    """One solved layer: the strategy per operator, the reshardings, the solver's report."""
    r = solution.report
    if solution.time_s is None:
        least = solution.min_memory_bytes
        text = f"{solution.kind} layer on {solution.mesh[0]}x{solution.mesh[1]}: {r.status}"
        if least is not None:
            text += f"; the least memory any choice needs is {least / 2**30:.2f} GiB"
        return [Text(text, style="bold red")]
    mesh = f"{solution.mesh[0]}x{solution.mesh[1]}"
    head = Group(
        Clauses([Text(f"{solution.kind} layer on a {mesh} mesh: ", style="bold").append(
                     f"{1e3 * solution.time_s:.3f} ms per microbatch (forward + backward)"),
                 f"{solution.memory_bytes / 2**30:.2f} GiB", f"recompute {solution.recompute}",
                 f"ZeRO-{solution.zero}"]),
        Clauses([f"solver {r.backend}: {r.status}", f"{r.num_variables} variables",
                 f"{r.num_constraints} constraints", f"{r.wall_s:.3f} s",
                 f"gap {r.gap if r.gap is not None else '-'}"]),
    )  # fmt: skip
    ops = Table(title=title("strategy per operator (axis 0, axis 1)"), title_justify="left")
    for col in ("operator", "split", "output layout"):
        ops.add_column(col, no_wrap=True)
    ops.add_column("folded in")
    for c in solution.choices:
        ops.add_row(c.op, c.strategy, ",".join(c.output),
                    Clauses([f.split(".")[-1] for f in c.followers]))  # fmt: skip
    return [head, keep_whole(ops), _resharding(solution)]


def _resharding(solution: LayerSolution) -> RenderableType:
    """The reshardings between operators: a row each, or when that is too wide for the
    console, each edge's ends and collectives stacked in two lines."""
    edges = [e for e in solution.resharding if e.forward or e.backward]
    wide = Table(title=title("resharding"), title_justify="left")
    for col in ("from", "to", "forward", "backward", "ms"):
        wide.add_column(col, no_wrap=True)
    stacked = Table(title=title("resharding"), title_justify="left", show_lines=True)
    stacked.add_column("from\nto", no_wrap=True)
    stacked.add_column("forward\nbackward")
    stacked.add_column("ms", no_wrap=True)
    for e in edges:
        forward, backward, ms = " ".join(e.forward), " ".join(e.backward), f"{1e3 * e.seconds:.3f}"
        wide.add_row(e.src, e.dst, forward, backward, ms)
        stacked.add_row(f"{e.src}\n{e.dst}", f"{forward or '-'}\n{backward or '-'}", ms)
    return FirstThatFits(keep_whole(wide), keep_whole(stacked))


def plan_tables(plan: Plan, *, mtp_layers: int = 0) -> list[RenderableType]:
    """A plan: its one-line summary and predictions, a row per stage (runs of identical
    middle stages folded into one row; an interleaved stage's chunks of layers, which need the
    model's ``mtp_layers`` where its multi-token-prediction modules take a chunk's slots), and
    how it was found."""
    p = plan.predicted
    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    head = Group(
        plan_summary(plan, style="bold"),
        Clauses([f"{plan.model.name} on {devices} x {plan.cluster.device}",
                 f"global batch {plan.global_batch_size} x {plan.seq_length} tokens",
                 f"{counted(plan.num_microbatches, 'microbatch', 'microbatches')} of "
                 f"{plan.micro_batch_size}"]),
        _rates(_step(p), p, f"peak memory {p.peak_memory_gib:.1f} GiB",
               f"bubble {100 * p.bubble_fraction:.1f} %"),
        Prose(band_line(p.error_band)),
        *(Prose(line) for line in [ranked_line(plan.solver.ranked_by, plan.solver.objective,
                                               p.step_time_s)] if line),
        *_memory(p.memory_band),
        *_profiled(p),
    )  # fmt: skip
    s = plan.solver
    solver = [f"solver: {plan.method} for {plan.framework}", f"{s.time_s:.2f} s", s.status]
    if s.gap:
        solver.append(f"gap {100 * s.gap:.2g} %")
    if s.ilp_count:
        solver += [f"{s.ilp_count} ILPs", f"{s.cache_hits} reuses"]
    return [head, keep_whole(_time_table(plan.predicted)), stage_tables(plan, mtp_layers),
            _groups(plan),
            Clauses(solver, style="dim")]  # fmt: skip


def plan_summary(plan: Plan, *, style: str = "") -> Clauses:
    """:meth:`Plan.summary`, a line broken only between its clauses (``interleaved 1F1B
    (v=6)`` stays whole)."""
    return Clauses(plan.summary().split(", "), style=style)


def _time_table(p: Estimate | Predicted) -> Table:
    """Where the step's seconds go on the critical stage, the parts it has, to the step's own
    three decimals: one table for a plan and an estimate."""
    table = light_table("time per step (critical stage)")
    table.add_column("part", no_wrap=True)
    table.add_column("seconds", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for name, seconds in p.time.model_dump().items():
        if seconds > 0:
            table.add_row(name.removesuffix("_s").replace("_", " "), f"{seconds:.3f}",
                          _pct(seconds, p.step_time_s))  # fmt: skip
    return table


def group_spans(plan: Plan) -> dict[str, tuple[int, int, int]]:
    """Per group of the first stage, its ranks and how many nodes and scale-up domains they
    span: the mesh's axes (``TP``, ``CP`` for a uniform plan; ``axis 0``, ``axis 1``
    otherwise), the data-parallel replicas, a uniform plan's expert-parallel ranks and the
    pipeline's stages."""
    per_node = plan.cluster.devices_per_node
    per_domain = plan.cluster.scale_up_devices or per_node
    stage = plan.stages[0]
    first = stage.ranks[0]
    inner = stage.mesh[-1]

    def span(ranks: Sequence[int]) -> tuple[int, int, int]:
        return (len(ranks), len({r // per_node for r in ranks}),
                len({r // per_domain for r in ranks}))  # fmt: skip

    uniform = plan.configuration is not None
    out = {("TP" if uniform else f"axis {len(stage.mesh) - 1}"): span(first[:inner])}
    if len(first) > inner:
        out["CP" if uniform else "axis 0"] = span(first[::inner])
    out["DP"] = span([replica[0] for replica in stage.ranks])
    if (config := plan.configuration) is not None and config.ep > 1:
        # Megatron-Core's expert RankGenerator (megatron/core/parallel_state.py, at
        # NVIDIA/Megatron-LM@d98e8a64dd: tp=etp, cp=1, order tp-cp-ep-dp-pp) spaces an
        # expert-parallel group's ranks etp apart from the stage's first, in the dense order
        # (tensor fastest, then context, then data): consecutive ranks when folded (etp 1).
        flat = [rank for replica in stage.ranks for rank in replica]
        folded = config.etp == 1
        out["EP"] = span(flat[::1 if folded else inner][:config.ep])
    out["PP"] = span([s.ranks[0][0] for s in plan.stages])
    return {name: v for name, v in out.items() if v[0] > 1}


def _groups(plan: Plan) -> Clauses:
    """Where the groups sit: how many nodes each spans."""
    parts = []
    wide = plan.cluster.scale_up_devices is not None
    for name, (ranks, nodes, domains) in group_spans(plan).items():
        where = "in 1 node" if nodes == 1 else f"across {nodes} nodes"
        if wide and nodes > 1:
            where += (" of 1 scale-up domain" if domains == 1
                      else f" in {domains} scale-up domains")  # fmt: skip
        parts.append(f"{name} {ranks} ranks {where}")
    parts = parts or ["one device"]
    return Clauses([f"groups: {parts[0]}", *parts[1:]], sep="; ")


_COMPARE_MIN_PLAN = 36
"""The plan column of ``compare``'s one table keeps this many cells at least (a summary in
two or three lines); narrower, the plans go under the numbers."""


def compare_tables(results: Sequence[MethodResult]) -> list[RenderableType]:
    """One row per method: its plan in one line, the predicted step with its error band
    (``+/-``) and rates, peak memory, the time it took to find, and its step relative to the
    comparison's :func:`~planner.diagnose.compare.yardstick` (``x any`` or ``x best``, as the
    picture's); under them what each band rests on, and which rows lie inside the fastest's
    band (:func:`~planner.report.bands.not_significant`). When that is too wide for the
    console, the numbers in one table and the plans in another."""
    against = yardstick(results)
    plan = next(r.plan for r in results if r.plan is not None)
    label = results[0].label
    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    head = Clauses([f"{plan.model.name} on {devices} x {plan.cluster.device}",
                    f"global batch {plan.global_batch_size} x {plan.seq_length} tokens",
                    plan.precision + " with FP8 linears" * (plan.stack in FP8_STACKS)],
                   style="bold")  # fmt: skip
    # padding collapsed: at 120 columns a plan takes two lines
    one = light_table(f"{label}s compared (same cost model)", collapse_padding=True)
    numbers = light_table(f"{label}s compared (same cost model)", collapse_padding=True)
    plans = light_table("plans", collapse_padding=True)
    for table in (one, numbers, plans):
        table.add_column(label, no_wrap=True)
    one.add_column("plan", min_width=_COMPARE_MIN_PLAN)
    plans.add_column("plan")
    for col in ("step s", "+/-", "tokens/s", "MFU", "peak GiB", "solve s", f"x {against.name}"):
        for table in (one, numbers):
            table.add_column(col, justify="right", no_wrap=True)
    for r in results:
        if r.plan is None:
            summary: RenderableType = Text(f"no plan: {r.error}", style="red")
            cells = ("-", "-", "-", "-", "-", f"{r.solve_time_s:.2f}", "-")
        else:
            p = r.plan.predicted
            ratio = against.ratio(p.step_time_s)
            summary = plan_summary(r.plan)
            cells = (f"{p.step_time_s:.3f}", band_cell(p.error_band), f"{p.tokens_per_s:,.0f}",
                     f"{100 * p.mfu:.1f} %",
                     f"{p.peak_memory_gib:.1f}", f"{r.solve_time_s:.2f}",
                     Text(f"{ratio:.3f}", style="bold green" if ratio == 1 else ""))  # fmt: skip
        one.add_row(r.method, summary, *cells)
        numbers.add_row(r.method, *cells)
        plans.add_row(r.method, summary)
    steps = {r.method: (r.plan.predicted.step_time_s, r.plan.predicted.error_band)
             for r in results if r.plan is not None}  # fmt: skip
    # what any row ranked by (the baselines rank by the expected step whatever was asked)
    ranked_by = next((r.plan.solver.ranked_by for r in results if r.plan is not None
                      and r.plan.solver.ranked_by != "expected"), "expected")  # fmt: skip
    order = not_significant(steps, quantile=QUANTILE[ranked_by] or 0.8)
    ranked = [f"{r.method} {r.plan.solver.objective:.3f} s" for r in results
              if r.plan is not None and r.plan.solver.ranked_by == ranked_by
              and r.plan.solver.objective is not None
              and r.plan.solver.objective > r.plan.predicted.step_time_s]  # fmt: skip
    # a per-operator plan can read as a framework's and price otherwise: its operators'
    # shardings are not in the summary
    alike = [f"{r.method} and {o.method} read alike but differ in "
             f"{(r if r.plan.configuration is None else o).method}'s per-operator shardings"
             for i, r in enumerate(results) for o in results[i + 1:]
             if r.plan is not None and o.plan is not None
             and r.plan.summary() == o.plan.summary()
             and (r.plan.configuration is None) != (o.plan.configuration is None)
             and r.plan.predicted.step_time_s != o.plan.predicted.step_time_s]  # fmt: skip
    lines = [*alike, *_band_lines(results),
             *([f"ranked by the step at its band's {ranked_by} end: "
                + ", ".join(ranked)] if ranked_by != "expected" and ranked else []),
             *([order] if order is not None else [])]  # fmt: skip
    return [head, FirstThatFits(keep_whole(one), Group(keep_whole(numbers), keep_whole(plans))),
            *(Prose(line) for line in lines)]


def _band_lines(results: Sequence[MethodResult]) -> list[str]:
    """What each row's band rests on, each basis said once; when the rows rest on more than
    one, each line names its rows (``band (heuristic): ...``)."""
    bands = {r.method: r.plan.predicted.error_band for r in results if r.plan is not None}
    rows: dict[str, list[str]] = {}
    for method, band in bands.items():
        rows.setdefault(band_line(band), []).append(method)
    if len(rows) == 1:
        return list(rows)
    return [band_line(bands[names[0]], rows=names) for names in rows.values()]
