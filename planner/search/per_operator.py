"""``planner.solve``: the search that turns a model and a cluster into a :class:`Plan`.

The outer loop enumerates what the dynamic program does not choose: data-parallel replicas of
the whole pipeline, the submesh every stage runs on (hence the number of stages), the
pipeline's microbatch and the schedule (1F1B, or interleaved with ``v`` chunks). Candidates are
visited in order of a lower bound on their step (their compute at the best GEMM efficiency,
stretched by the pipeline's fill and drain) and the loop stops once no candidate left can
beat the best plan found. For each candidate, the layer ILP (:mod:`planner.ilp`) shards every
layer kind on the stage's mesh, the pipeline pass (:mod:`planner.pipeline`) splits the layers
into stages, and the one step composer prices the result under each rank order.

All stages of a pipeline share one submesh shape: Alpa's dynamic program may mix shapes, but
Megatron-LM, DeepSpeed, Colossal-AI and torchtitan all launch stages of equal size.
GPipe is not searched: under the cost model it runs as long as 1F1B and holds more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import cost
from planner.cost.step import PipelineKnobs, StepCost
from planner.errors import InfeasibleError, TimeLimitError
from planner.graph import lowered, parameter_count
from planner.options import DEFAULT_OPTIONS, Progress, ProgressFn, SolveOptions, training_of
from planner.pipeline.assemble import (
    FoundStage,
    compose,
    plan_stages,
    predicted,
)
from planner.pipeline.options import LayerOption, stage_table
from planner.pipeline.split import least_peak, split_layers
from planner.placement.ranks import ORDERS, PipelinePlacement
from planner.plan.inputs import cluster_ref, model_ref
from planner.plan.invariants import check_plan
from planner.plan.schema import (
    Plan,
    RunFlags,
    ScheduleSpec,
    SolverSummary,
)
from planner.search.bounds import bounded_out, walk_options
from planner.search.candidates import (
    Candidate,
    candidate_communicators,
    candidates,
    describe,
    model_flops_per_sequence,
)
from planner.search.layers import (
    SearchContext,
    SearchState,
    candidate_send_s,
    decoder_kinds,
)
from planner.sharding.layout import LogicalMesh
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.leanest import infeasible_message
from planner.vocabulary import GIB, schedule_name


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """The best pipeline of one candidate, priced."""

    candidate: Candidate
    """The outer knobs it was found under."""
    stages: tuple[FoundStage, ...]
    """Each stage's layers and its choice of layer options."""
    placement: PipelinePlacement
    """Where its stages and replicas sit (the faster of the two orders)."""
    step: StepCost
    """The step composed from the stages."""
    objective_s: float
    """The dynamic program's step (:func:`planner.cost.fill_and_drain` of the stages)."""
    bounds_tried: int
    """Bounds on the slowest stage the dynamic program tried."""


def evaluate(
    ctx: SearchContext, c: Candidate, kinds: list[str], *, bound_s: float = float("inf")
) -> Found | None:
    """Shard each layer kind on ``c``'s mesh, split the layers into stages, and price the
    result under each rank order; None when nothing fits, or when the layers' fastest
    options already make the step reach ``bound_s`` (:func:`options_bound_s`)."""
    p = c.num_stages
    in_flight = [cost.in_flight_microbatches("1f1b", stage=i, pp=p, vpp=c.vpp,
                                             num_microbatches=c.num_microbatches)
                 for i in range(p)]  # fmt: skip
    mesh = LogicalMesh(c.mesh)
    near = PipelinePlacement(mesh=mesh, num_stages=p, replicas=c.replicas, order="stages-inner")
    send = candidate_send_s(ctx, c, near.pipeline_distance)
    held = (*dict.fromkeys(kinds), "embedding", "head")
    device = ctx.cluster.device
    usable = ctx.options.usable_bytes(device, ctx.training.stack)
    comms = candidate_communicators(ctx.model, ctx.cluster, c, deepep=_deepep(ctx),
                                    precision=ctx.training.precision).bytes
    stage_bytes = cost.allocatable_bytes(device, usable, communicators=comms)
    if bound_s < float("inf") and bounded_out(ctx, c, kinds, held, send_s=send,
                                              in_flight=in_flight, stage_bytes=stage_bytes,
                                              bound_s=bound_s):  # fmt: skip
        return None
    options = walk_options(ctx, c, kinds, held, send_s=send, in_flight=min(in_flight),
                           stage_bytes=stage_bytes, bound_s=bound_s)  # fmt: skip
    if options is None:
        return None
    # The stage table prices memory per layer option; the composed step adds what only whole
    # stages have (the tied copy, the largest transient of all): a split it composes over the
    # device is tried again on a budget less the overshoot.
    for _ in range(RETRIES):
        best, over = _split_and_compose(ctx, c, kinds, options, in_flight=in_flight, send_s=send,
                                        stage_bytes=stage_bytes, comms=comms)  # fmt: skip
        if best is not None or over is None:
            return best
        usable -= over
        stage_bytes = cost.allocatable_bytes(device, usable, communicators=comms)
    return None


RETRIES = 3
"""Splits a candidate tries when the composed step of the stage table's split overshoots."""


def _split_and_compose(
    ctx: SearchContext, c: Candidate, kinds: list[str], options: dict[str, list[LayerOption]], *,
    in_flight: list[Any], send_s: float, stage_bytes: float, comms: float,
) -> tuple[Found | None, float | None]:  # fmt: skip
    """The stage table's fastest split of ``c`` within ``stage_bytes`` a device, composed under
    each rank order: the fastest that fits, and when none does by how much the leanest
    composed step overshoots the usable memory (None: the table has no split at all)."""
    p, n, device = c.num_stages, len(kinds), ctx.cluster.device
    usable = ctx.options.usable_bytes(device, ctx.training.stack)
    table = stage_table(
        kinds, options, in_flight=in_flight, fixed_latency_s=[send_s] * p,
        allowed=_whole_chunks(n, p, c.vpp) if c.vpp > 1 else None, memory_bytes=stage_bytes,
    )  # fmt: skip
    try:
        split = split_layers(table.latency, c.num_microbatches)
    except InfeasibleError:
        least = least_peak(table.memory)
        if least is not None:
            _note_least(ctx, c, least[0] + cost.reserve_bytes(device, allocated=least[0],
                                                              communicators=comms))
        return None, None
    stages = tuple(
        FoundStage(first=a + 1, last=b, choice=table.choices[int(table.choice[i, a, b])])
        for i, (a, b) in enumerate(zip(split.bounds, split.bounds[1:], strict=False))
    )  # fmt: skip
    knobs = PipelineKnobs(
        num_microbatches=c.num_microbatches, schedule="1f1b", vpp=c.vpp,
        states_precision=cost.states_precision(ctx.training.precision, ctx.training.stack,
                                               ctx.options.pins.optimizer_moments or "fp32"),
        deepep=_deepep(ctx),
        gathered_bytes_per_param=cost.gathered_bytes_per_param(ctx.training.precision,
                                                               ctx.training.stack),
        stack=ctx.training.stack, overlap_grad_reduce=ctx.options.overlap_grad_reduce,
        overlap_param_gather=ctx.options.overlap_param_gather, communicator_bytes=comms,
    )  # fmt: skip
    best: Found | None = None
    over = float("inf")
    for order in ORDERS:
        placement = PipelinePlacement(mesh=LogicalMesh(c.mesh), num_stages=p,
                                      replicas=c.replicas, order=order)  # fmt: skip
        send = candidate_send_s(ctx, c, placement.pipeline_distance)
        step = compose(stages, kinds, model=ctx.model, cluster=ctx.cluster, knobs=knobs,
                       placement=placement, pipeline_comm_s=send)  # fmt: skip
        if step.peak_memory_bytes.total > usable:
            _note_least(ctx, c, step.peak_memory_bytes.total)
            over = min(over, step.peak_memory_bytes.total - usable)
            continue
        if best is None or step.step_s < best.step.step_s:
            best = Found(candidate=c, stages=stages, placement=placement, step=step,
                         objective_s=split.step_s, bounds_tried=split.bounds_tried)
    return best, over


def _deepep(ctx: SearchContext) -> bool:
    """Whether DeepEP exchanges the experts' tokens (pinned, for a model with experts)."""
    return ctx.options.pins.moe_dispatcher == "deepep" and ctx.model.moe is not None


def _note_least(ctx: SearchContext, c: Candidate, need_bytes: float) -> None:
    """Keep the least memory a candidate that does not fit needs."""
    if ctx.state.least is None or need_bytes < ctx.state.least[0]:
        ctx.state.least = (need_bytes, c)


def _whole_chunks(n: int, p: int, v: int) -> np.ndarray:
    """Ranges whose layers split into ``v`` equal chunks (interleaved 1F1B: each stage runs
    ``v`` chunks; Megatron-Core lets the first and last stage differ from the others)."""
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    allowed = (b > a) & ((b - a) % v == 0)
    return np.broadcast_to(allowed, (p, n + 1, n + 1))


# --------------------------------------------------------------------------- the search


def solve_per_operator(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest per-operator plan found for training ``model`` on ``cluster`` within
    memory: the plan is for ``any`` whatever ``options.framework`` says
    (:func:`planner.search.targets.solve` sends framework targets to their own search, and
    ``any`` to :func:`planner.search.superset.solve_any`, which bounds this one).

    Raises :class:`~planner.errors.InfeasibleError` when nothing fits, naming the least
    memory a device would need and what would make a plan fit, and
    :class:`~planner.errors.TimeLimitError` when ``options.time_limit_s`` passes before any
    plan is found.
    """
    found = search(model, cluster, options, progress=progress)
    assert found.plan is not None  # without an incumbent, search raises rather than miss
    return found.plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Searched:
    """What the per-operator search found under an incumbent's bound."""

    plan: Plan | None
    """Its plan, None when none is faster than the incumbent."""
    cut_bound_s: float | None
    """Where the time limit cut the search: the lower bound of the first candidate not
    searched (None: the search ran to its end)."""
    searched: int
    """Candidates searched."""


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    incumbent_s: float | None = None,
    progress: ProgressFn | None = None,
) -> Searched:
    """:func:`solve`'s search, bounded by an incumbent's step ``incumbent_s``: candidates
    whose lower bound reaches it are not searched, and only a plan strictly faster is
    returned (None otherwise, where :func:`solve` would raise)."""
    started = time.perf_counter()
    training = training_of(model, options)
    kinds = decoder_kinds(model)
    todo = candidates(model, cluster, training, options)
    deadline = None if options.time_limit_s is None else started + options.time_limit_s
    ctx = SearchContext(model=model, cluster=cluster, training=training, options=options,
                        state=SearchState(), deadline=deadline,
                        parameters=parameter_count(lowered(model, training, 1)[0]).total)
    bound_s = float("inf") if incumbent_s is None else incumbent_s
    best: Found | None = None
    cut_at: Candidate | None = None
    searched = 0
    for c in todo:
        if c.lower_bound_s >= bound_s:
            break  # sorted by bound: nothing left can win
        if deadline is not None and time.perf_counter() >= deadline:
            cut_at = c
            break
        if progress is not None:
            progress(Progress(done=searched, total=len(todo), best_step_s=_best_s(best),
                              searching=describe(c)))  # fmt: skip
        try:
            found = evaluate(ctx, c, kinds, bound_s=bound_s)
        except TimeLimitError:
            cut_at = c
            break
        searched += 1
        if found is not None and found.step.step_s < bound_s:
            best, bound_s = found, found.step.step_s
    if progress is not None:
        progress(Progress(done=len(todo), total=len(todo), best_step_s=_best_s(best)))
    cut_s = None if cut_at is None else cut_at.lower_bound_s
    if best is None and incumbent_s is not None:
        return Searched(plan=None, cut_bound_s=cut_s, searched=searched)
    if best is None and cut_at is not None:
        raise TimeLimitError(
            f"the time limit ({options.time_limit_s:g} s) passed after {searched} of "
            f"{len(todo)} candidates and none of them fits yet; raise --time-limit"
        )
    if best is None:
        raise InfeasibleError(_nothing_fits(ctx))
    gap = None if cut_s is None else max(0.0, 1 - cut_s / best.step.step_s)
    plan = _plan(ctx, best, kinds, time.perf_counter() - started, searched, gap)
    return Searched(plan=check_plan(plan, model), cut_bound_s=cut_s, searched=searched)


def _best_s(best: Found | None) -> float | None:
    return None if best is None else best.step.step_s


def _nothing_fits(ctx: SearchContext) -> str:
    """Why nothing fits, in the numbers a user can act on: the least memory any plan in the
    space needs (from the candidates' stage tables, or the states alone when no layer has a
    sharding at all) and what would make one fit."""
    model, cluster, training = ctx.model, ctx.cluster, ctx.training
    if ctx.state.least is None:
        params = parameter_count(lowered(model, training, 1)[0]).total
        n = cluster.num_devices
        precision = cost.states_precision(training.precision, training.stack)
        states = params * cost.state_bytes_per_param(precision, zero=3, shards=n).total
        need = states + cost.reserve_bytes(cluster.device, allocated=states, communicators=0.0)
        leanest = "the weights, gradients and optimizer states alone, sharded over every device"
    else:
        need, c = ctx.state.least
        smallest = min(ctx.options.micro_batch_sizes)
        leanest = (f"{describe(c)}, over stage choices that include a microbatch of "
                   f"{smallest} per rank, full recompute and ZeRO-3 (ZeRO-1 with a "
                   f"pipeline)")  # fmt: skip
    return infeasible_message(model, cluster, training, ctx.options,
                              searched="no plan of the ILP search", least_gib=need / GIB,
                              leanest=leanest)  # fmt: skip


def _plan(
    ctx: SearchContext,
    best: Found,
    kinds: list[str],
    wall_s: float,
    searched: int,
    search_gap: float | None,
) -> Plan:
    c, training = best.candidate, ctx.training
    stages = plan_stages(best.stages, kinds, placement=best.placement, step=best.step)
    deepep = _deepep(ctx) and any(s.parallel.ep > 1 for s in stages)
    solutions = ctx.state.solutions
    statuses = {s.report.status for s in solutions}
    gaps = [s.report.gap for s in solutions if s.report.gap is not None]
    return Plan(
        method="ilp",
        framework="any",
        memory_margin_gib=ctx.options.margin_bytes(ctx.cluster.device,
                                                   training.stack) / GIB,
        model=model_ref(ctx.model),
        cluster=cluster_ref(ctx.cluster),
        precision=training.precision,
        stack=training.stack,
        global_batch_size=training.global_batch_size,
        seq_length=training.seq_length,
        # Per data-parallel rank, as frameworks count it: the pipeline's microbatch is split
        # over the data-parallel ways inside a stage.
        micro_batch_size=max(1, c.mesh_micro_batch_size // stages[0].parallel.dp),
        num_microbatches=c.num_microbatches,
        schedule=ScheduleSpec(name=schedule_name(c.schedule, c.vpp), virtual_stages=c.vpp),
        data_parallel_replicas=c.replicas,
        flags=RunFlags(
            flash_attention=ctx.options.flash_attention,
            overlap_grad_reduce=ctx.options.overlap_grad_reduce,
            overlap_param_gather=ctx.options.overlap_param_gather,
            moe_dispatcher="deepep" if deepep else "alltoall",
            optimizer_moments=ctx.options.pins.optimizer_moments or "fp32",
        ),
        stages=stages,
        predicted=predicted(
            best.step,
            best.stages,
            kinds,
            cluster=ctx.cluster,
            training=training,
            forward_flops_per_sequence=model_flops_per_sequence(ctx.model, training.seq_length),
            executed_flops_per_sequence=cost.executed_training_flops(
                ctx.model, training, 1, flash_attention=ctx.options.flash_attention),
            micro_batch_size=c.mesh_micro_batch_size,
            parallel=[s.parallel for s in stages],
            moe=ctx.model.moe,
            deepep=deepep,
        ),
        solver=SolverSummary(
            time_s=wall_s,
            status="time_limit" if search_gap is not None
            else "optimal" if statuses <= {"optimal", "infeasible"} else "feasible",
            objective=best.objective_s,
            gap=max([*gaps, search_gap] if search_gap is not None else gaps, default=None),
            ilp_count=sum(f.solves for f in ctx.state.frontiers.values()),
            cache_hits=ctx.state.reuses,
            configurations=searched,
        ),
    )
