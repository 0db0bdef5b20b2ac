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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner import cost
from planner.config import Schedule, check_sequence
from planner.errors import InfeasibleError, InputError
from planner.graph import lowered, parameter_count
from planner.graph.layout import LogicalMesh
from planner.graph.lower import ACTIVATION_BYTES, decoder_layer_kind
from planner.ilp.backends import Backend
from planner.ilp.layer import Frontier, LayerSolution, SolverOptions, solve_frontier
from planner.ilp.problem import LayerQuery
from planner.pipeline.assemble import FoundStage, compose, plan_stages, predicted
from planner.pipeline.options import LayerOption, SyncContext, layer_options, stage_table
from planner.pipeline.split import split_layers
from planner.pipeline.stages import submesh_shapes
from planner.placement import ORDERS, PipelinePlacement
from planner.plan import (
    Plan,
    RunFlags,
    ScheduleSpec,
    SolverSummary,
    cluster_ref,
    model_ref,
)
from planner.spec import GIB, ClusterSpec, ModelSpec, Precision, TrainingSpec
from planner.step import PipelineKnobs, StepCost


@dataclass(frozen=True, slots=True)
class SolveOptions:
    """What the search may choose from, and how hard it tries."""

    global_batch_size: int | None = None
    seq_length: int | None = None
    precision: Precision | None = None
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Sequences per data-parallel rank and microbatch (Megatron's ``--micro-batch-size``);
    a mesh takes this times the data-parallel ways inside it (:func:`mesh_microbatches`)."""
    interleaved: bool = True
    max_mesh_nodes: int | None = None
    """A stage's mesh spans part of a node or 1, 2, 4, ... nodes up to this (Alpa allows any
    count). None: one node for dense models, two for mixtures of experts. Across nodes a mesh
    axis is mostly data parallel, which replicas of the pipeline already give; expert
    parallelism is the common reason to span nodes. Each wider mesh makes its layer ILPs
    slower (a second instead of milliseconds)."""
    backend: Backend = "ortools"
    time_limit_s: float = 10.0
    """Per layer ILP."""
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True


@dataclass(frozen=True, slots=True)
class Candidate:
    """One setting of the outer knobs."""

    replicas: int
    mesh: tuple[int, int]
    num_stages: int
    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    vpp: int
    lower_bound_s: float


@dataclass(frozen=True, slots=True)
class Progress:
    """Reported after each candidate: how far the search is and the best step so far."""

    done: int
    total: int
    best_step_s: float | None


ProgressFn = Callable[[Progress], None]


@dataclass(slots=True)
class SearchState:
    """What the search keeps between candidates: solved layers and their count."""

    frontiers: dict[tuple[str, tuple[int, int], int], Frontier] = field(default_factory=dict)
    reuses: int = 0
    """Frontier lookups answered without solving."""

    @property
    def solutions(self) -> list[LayerSolution]:
        """Every layer solved so far."""
        return [s for f in self.frontiers.values() for s in f.solutions]


def training_of(model: ModelSpec, options: SolveOptions) -> TrainingSpec:
    """The run's sequence length, global batch and precision: the options, else the model's
    training block."""
    defaults = model.training
    seq = options.seq_length or (defaults.seq_length if defaults else None)
    gbs = options.global_batch_size or (defaults.global_batch_size if defaults else None)
    if seq is None or gbs is None:
        raise InputError(f"{model.name}: no training block: pass --seq-len and --global-batch")
    precision = options.precision or (defaults.precision if defaults else "bf16")
    check_sequence(model, seq)
    return TrainingSpec(seq_length=seq, global_batch_size=gbs, precision=precision)


def candidates(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[Candidate]:
    """Every outer setting that divides, cheapest lower bound first."""
    n_dev = cluster.num_devices
    per_node = cluster.devices_per_node
    layers = model.num_layers
    gbs = training.global_batch_size
    flops = _model_flops_per_sequence(model, training.seq_length)
    max_nodes = options.max_mesh_nodes or (2 if model.moe else 1)
    out = []
    for replicas in divisors(n_dev):
        devices = n_dev // replicas
        nodes = max(1, devices // per_node)
        for mesh in submesh_shapes(nodes, per_node):
            size = mesh[0] * mesh[1]
            if size > devices or devices % size or (mesh[0] > 1 and devices % per_node):
                continue
            if mesh[0] & (mesh[0] - 1) or mesh[0] > max_nodes:
                continue
            stages = devices // size
            if stages > layers:
                continue
            for b in mesh_microbatches(options.micro_batch_sizes, size):
                if gbs % (replicas * b):
                    continue
                m = gbs // (replicas * b)
                per_microbatch = cost.compute_lower_bound_s(
                    cluster.device, training.precision, flops=3 * flops * b / devices
                )
                for schedule, v in _schedules(layers, stages, m, options.interleaved):
                    bound = (m + (stages - 1) / v) * per_microbatch
                    out.append(Candidate(replicas, mesh, stages, b, m, schedule, v, bound))
    out.sort(key=lambda c: (c.lower_bound_s, -c.replicas, c.num_stages, c.micro_batch_size,
                            c.vpp))  # fmt: skip
    return out


def mesh_microbatches(per_rank: Sequence[int], mesh_size: int) -> list[int]:
    """Sequences one mesh takes per microbatch: a per-rank microbatch times the ways the
    layer ILP may split the batch inside the mesh (which it decides), so that a stage whose
    mesh is all data parallel can still run the per-rank microbatches a user would try.

    >>> mesh_microbatches((1, 2), 4)
    [1, 2, 4, 8]
    """
    ways = [d for d in divisors(mesh_size) if d & (d - 1) == 0 or d == mesh_size]
    return sorted({b * d for b in per_rank for d in ways})


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(layers: int, stages: int, m: int, interleaved: bool) -> list[tuple[Schedule, int]]:
    """1F1B, and interleaved 1F1B with ``v`` chunks per stage (Megatron needs the
    microbatches to be a multiple of the stages; the split must give each stage a multiple of
    ``v`` layers, which the dynamic program enforces)."""
    out: list[tuple[Schedule, int]] = [("1f1b", 1)]
    if interleaved and stages > 1 and m % stages == 0:
        out += [("1f1b", v) for v in range(2, layers // stages + 1)]
    return out


def _model_flops_per_sequence(model: ModelSpec, seq: int) -> float:
    """Forward FLOPs of one sequence through the whole model."""
    from planner.estimate import _forward_flops  # one definition of the model's FLOPs

    return _forward_flops(model, TrainingSpec(seq_length=seq, global_batch_size=1), 1)


# --------------------------------------------------------------------------- layer options


@dataclass(frozen=True, slots=True)
class SearchContext:
    """The inputs of one search and what it has found so far."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: SolveOptions
    state: SearchState


LADDER_STEPS = 8
"""Budget steps after the unconstrained solve (each one a layer ILP)."""
LADDER_SHRINK = 0.7
"""Each step's budget as a share of the previous solution's memory: halving skipped shardings
between (a TP4 layer with Megatron's row-parallel output projection sits between the fastest
TP4 layer and the next halving), and the memory a stage has is rarely a power of two away."""
REFERENCE_MICROBATCHES = 64
"""The ILP sees the gradient sync spread over this many microbatches: the composer prices the
real sync, mostly hidden behind the backward, so the ILP should not shy away from it."""


def kind_solutions(
    ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int
) -> list[LayerSolution]:
    """Shardings of one layer kind on ``mesh`` along its time-memory frontier
    (:func:`planner.ilp.layer.solve_frontier`). They are found once for every candidate with
    this mesh and microbatch, whatever its replicas and microbatch count (which
    :func:`layer_options` prices afterwards): as if the mesh were replicated over the whole
    cluster, with ZeRO 0 or 1 (what pipelines allow), so that a sharding which fits only
    once the distributed optimizer shards its states is on the frontier."""
    key = (kind, mesh, b)
    if key in ctx.state.frontiers:
        ctx.state.reuses += 1
    else:
        query = LayerQuery(
            kind=kind, mesh=mesh, micro_batch_size=b, seq_length=ctx.training.seq_length,
            precision=ctx.training.precision, num_microbatches=REFERENCE_MICROBATCHES,
            flash_attention=ctx.options.flash_attention, zero=(0, 1),
            replicas=ctx.cluster.num_devices // (mesh[0] * mesh[1]),
        )  # fmt: skip
        ctx.state.frontiers[key] = solve_frontier(
            ctx.model, ctx.cluster, query, steps=LADDER_STEPS, shrink=LADDER_SHRINK,
            options=SolverOptions(ctx.options.backend, ctx.options.time_limit_s),
        )  # fmt: skip
    return list(ctx.state.frontiers[key].solutions)


def kind_options(ctx: SearchContext, kind: str, c: Candidate) -> list[LayerOption]:
    """The frontier's shardings priced for candidate ``c`` under every recomputation mode
    and ZeRO stage; with a pipeline, ZeRO-2 and 3 are left out, as DeepSpeed and
    Colossal-AI refuse them (their per-microbatch traffic defeats the pipeline)."""
    sync = SyncContext(LogicalMesh(c.mesh), c.replicas, c.num_microbatches,
                       ctx.training.precision, ctx.options.overlap_grad_reduce,
                       ctx.options.overlap_param_gather)  # fmt: skip
    options = []
    for solution in kind_solutions(ctx, kind, c.mesh, c.micro_batch_size):
        options += layer_options(solution, ctx.cluster, sync)
    if c.num_stages > 1:
        options = [o for o in options if o.zero <= 1]
    return _pareto(options)


def _pareto(options: list[LayerOption]) -> list[LayerOption]:
    """Drop options another option with the same (recompute, ZeRO) beats on every count."""

    def key(o: LayerOption) -> tuple[float, float, float, float]:
        return (o.latency_s, o.state_bytes, o.kept_bytes, o.working_bytes)

    kept: list[LayerOption] = []
    for o in sorted(options, key=key):
        if not any(k.recompute == o.recompute and k.zero == o.zero
                   and all(x <= y for x, y in zip(key(k), key(o), strict=True))
                   for k in kept):  # fmt: skip
            kept.append(o)
    return kept


def pipeline_send_s(ctx: SearchContext, c: Candidate, distance: int) -> float:
    """Per microbatch, one stage's sends: the activation forward and its gradient back, each
    device sending its share (Megatron's scatter/gather), once per chunk."""
    act = ACTIVATION_BYTES[ctx.training.precision]
    full = c.micro_batch_size * ctx.training.seq_length * ctx.model.hidden_size * act
    return cost.pipeline_send_s(ctx.cluster, full / (c.mesh[0] * c.mesh[1]), distance,
                                chunks=c.vpp)  # fmt: skip


def decoder_kinds(model: ModelSpec) -> list[str]:
    """Each decoder layer's kind, first to last."""
    return [decoder_layer_kind(model, layer) for layer in range(1, model.num_layers + 1)]


# --------------------------------------------------------------------------- one candidate


@dataclass(frozen=True, slots=True)
class Found:
    """The best pipeline of one candidate, priced."""

    candidate: Candidate
    stages: tuple[FoundStage, ...]
    placement: PipelinePlacement
    step: StepCost
    objective_s: float
    """The dynamic program's ``sum t + (B - 1) max t``."""
    bounds_tried: int


def evaluate(ctx: SearchContext, c: Candidate, kinds: list[str]) -> Found | None:
    """Shard each layer kind on ``c``'s mesh, split the layers into stages, and price the
    result under each rank order; None when nothing fits."""
    p, n = c.num_stages, len(kinds)
    in_flight = [cost.in_flight_microbatches("1f1b", stage=i, pp=p, vpp=c.vpp,
                                             num_microbatches=c.num_microbatches)
                 for i in range(p)]  # fmt: skip
    options = {kind: kind_options(ctx, kind, c)
               for kind in (*dict.fromkeys(kinds), "embedding", "head")}  # fmt: skip
    if not all(options.values()):
        return None
    mesh = LogicalMesh(c.mesh)
    near = PipelinePlacement(mesh, p, c.replicas, "stages-inner")
    send = pipeline_send_s(ctx, c, near.pipeline_distance) if p > 1 else 0.0
    device = ctx.cluster.device
    table = stage_table(
        kinds, options, in_flight=in_flight, fixed_latency_s=[send] * p,
        allowed=_whole_chunks(n, p, c.vpp) if c.vpp > 1 else None,
        memory_bytes=device.memory_bytes - device.reserved_memory_gib * GIB,
    )  # fmt: skip
    try:
        split = split_layers(table.latency, c.num_microbatches)
    except InfeasibleError:
        return None
    stages = tuple(
        FoundStage(a + 1, b, table.choices[int(table.choice[i, a, b])])
        for i, (a, b) in enumerate(zip(split.bounds, split.bounds[1:], strict=False))
    )  # fmt: skip
    knobs = PipelineKnobs(
        num_microbatches=c.num_microbatches, schedule="1f1b", vpp=c.vpp,
        precision=ctx.training.precision, overlap_grad_reduce=ctx.options.overlap_grad_reduce,
        overlap_param_gather=ctx.options.overlap_param_gather,
    )  # fmt: skip
    best: Found | None = None
    for order in ORDERS:
        placement = PipelinePlacement(mesh, p, c.replicas, order)
        send = pipeline_send_s(ctx, c, placement.pipeline_distance) if p > 1 else 0.0
        step = compose(stages, kinds, ctx.model, ctx.cluster, knobs, placement, send)
        if sum(step.peak_memory_bytes) > device.memory_bytes:
            continue
        if best is None or step.step_s < best.step.step_s:
            best = Found(c, stages, placement, step, split.step_s, split.bounds_tried)
    return best


def _whole_chunks(n: int, p: int, v: int) -> np.ndarray:
    """Ranges whose layers split into ``v`` equal chunks (interleaved 1F1B: each stage runs
    ``v`` chunks; Megatron-Core lets the first and last stage differ from the others)."""
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    allowed = (b > a) & ((b - a) % v == 0)
    return np.broadcast_to(allowed, (p, n + 1, n + 1))


# --------------------------------------------------------------------------- the search


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = SolveOptions(),
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest plan found for training ``model`` on ``cluster`` within memory.

    Raises :class:`~planner.errors.InfeasibleError` when nothing fits, naming the least
    memory a device would need.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    kinds = decoder_kinds(model)
    todo = candidates(model, cluster, training, options)
    ctx = SearchContext(model, cluster, training, options, SearchState())
    best: Found | None = None
    for visited, c in enumerate(todo, start=1):
        if best is not None and c.lower_bound_s >= best.step.step_s:
            break  # sorted by bound: nothing left can win
        found = evaluate(ctx, c, kinds)
        if found is not None and (best is None or found.step.step_s < best.step.step_s):
            best = found
        if progress is not None:
            progress(Progress(visited, len(todo), best.step.step_s if best else None))
    if progress is not None:
        progress(Progress(len(todo), len(todo), best.step.step_s if best else None))
    if best is None:
        raise InfeasibleError(_nothing_fits(model, cluster, training))
    return _plan(ctx, best, kinds, time.perf_counter() - started)


def _nothing_fits(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> str:
    """Why nothing fits, in the one number a user can act on: the weights, gradients and Adam
    states alone, sharded over every device (ZeRO-3, the leanest there is)."""
    params = parameter_count(lowered(model, training, 1)[0]).total
    n = cluster.num_devices
    states = params * cost.state_bytes_per_param(training.precision, zero=3, shards=n).total
    return (f"no plan for {model.name} fits {n} x {cluster.device.name} "
            f"({cluster.device.memory_gib:g} GiB) at global batch {training.global_batch_size}, "
            f"sequence {training.seq_length}: its weights, gradients and optimizer states "
            f"alone need {states / GIB:.1f} GiB per device even sharded over all {n} devices, "
            f"before activations; add nodes or shorten the sequence")  # fmt: skip


def _plan(ctx: SearchContext, best: Found, kinds: list[str], wall_s: float) -> Plan:
    c, training = best.candidate, ctx.training
    stages = plan_stages(best.stages, kinds, best.placement, best.step)
    solutions = ctx.state.solutions
    statuses = {s.report.status for s in solutions}
    gaps = [s.report.gap for s in solutions if s.report.gap is not None]
    return Plan(
        method="ilp",
        model=model_ref(ctx.model),
        cluster=cluster_ref(ctx.cluster),
        precision=training.precision,
        global_batch_size=training.global_batch_size,
        seq_length=training.seq_length,
        # Per data-parallel rank, as frameworks count it: the pipeline's microbatch is split
        # over the data-parallel ways inside a stage.
        micro_batch_size=max(1, c.micro_batch_size // stages[0].parallel.dp),
        num_microbatches=c.num_microbatches,
        schedule=ScheduleSpec(name="interleaved" if c.vpp > 1 else "1f1b", virtual_stages=c.vpp),
        data_parallel_replicas=c.replicas,
        flags=RunFlags(
            flash_attention=ctx.options.flash_attention,
            overlap_grad_reduce=ctx.options.overlap_grad_reduce,
            overlap_param_gather=ctx.options.overlap_param_gather,
        ),
        stages=stages,
        predicted=predicted(
            best.step,
            best.stages,
            kinds,
            cluster=ctx.cluster,
            training=training,
            forward_flops_per_sequence=_model_flops_per_sequence(ctx.model, training.seq_length),
            micro_batch_size=c.micro_batch_size,
        ),
        solver=SolverSummary(
            time_s=wall_s,
            status="optimal" if statuses <= {"optimal", "infeasible"} else "feasible",
            objective=best.objective_s,
            gap=max(gaps, default=None),
            ilp_count=sum(f.solves for f in ctx.state.frontiers.values()),
            cache_hits=ctx.state.reuses,
        ),
    )
