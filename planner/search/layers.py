"""The layer options a candidate offers its pipeline: each layer kind's ILP solved once per
(kind, mesh, microbatch) under a ladder of memory budgets, kept as a frontier that every
candidate needing the same layer reuses, and each solution priced as a stage option under the
candidate's pipeline (microbatches, replicas, ZeRO, recomputation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner import cost
from planner.graph.lower import decoder_layer_kind
from planner.graph.stacks import pipeline_transfers
from planner.ilp.bound import least_time_ns
from planner.ilp.formulation import LayerProblem
from planner.ilp.layer import Frontier, IlpOptions, LayerSolution, solve_frontier
from planner.ilp.problem import NS, LayerQuery, layer_graph_of, layer_problem
from planner.ilp.seeds import uniform_solutions
from planner.options import Pins, SolveOptions
from planner.pipeline.assemble import folded_etp, launchable, summarise
from planner.pipeline.options import (
    TRANSFORMER_KINDS,
    LayerOption,
    SyncContext,
    held_bytes,
    layer_options,
)
from planner.search.candidates import Candidate
from planner.sharding.assignment import LayerGraph, Node
from planner.sharding.layout import LogicalMesh
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.vocabulary import RECOMPUTE_MODES, ZERO_STAGES


@dataclass(slots=True, kw_only=True)
class SearchState:
    """What the search keeps between candidates: solved layers and their count."""

    frontiers: dict[tuple[str, tuple[int, int], int], Frontier] = field(default_factory=dict)
    """Solved layers by (layer kind, mesh, mesh microbatch): the one cache of layer ILPs,
    reused by every candidate that needs the same layer."""
    seeds: dict[tuple[str, tuple[int, int], int], tuple[LayerSolution, ...]] = field(
        default_factory=dict
    )
    """The uniform shardings offered beside each frontier, by the same key."""
    problems: dict[tuple[str, tuple[int, int], int], tuple[LayerProblem, LayerGraph]] = field(
        default_factory=dict
    )
    """The layer problems of frontiers whose walk may go on, by the same key: built once,
    kept until the walk ends."""
    graphs: dict[tuple[str, tuple[int, int], int], LayerGraph] = field(default_factory=dict)
    """The layer graphs whose problems are not built yet, by the same key."""
    least_s: dict[tuple[str, tuple[int, int], int], tuple[float, bool]] = field(
        default_factory=dict
    )
    """A lower bound on each layer's time, and whether it counts resharding, by the same key
    (:func:`kind_least_s`)."""
    memory_columns: dict[
        tuple[str, tuple[int, int], int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    ] = field(default_factory=dict)
    """Each layer's memory per node and strategy, by the same key (:func:`_memory_columns`)."""
    least_bytes: dict[tuple[str, tuple[int, int], int, int, int, bool], float] = field(
        default_factory=dict
    )
    """A lower bound on the memory of a run of layers by (layer kind, mesh, mesh microbatch,
    layers, microbatches in flight, pipelined) (:func:`kind_least_bytes`)."""
    fitting_columns: dict[tuple[str, tuple[int, int], int, bool], Any] = field(
        default_factory=dict
    )
    """Each layer's strategies as columns by (layer kind, mesh, mesh microbatch, pipelined)
    (:func:`planner.search.fitting.kind_columns`)."""
    fitting_s: dict[tuple[Any, ...], float] = field(default_factory=dict)
    """A lower bound on a layer's time when a run of them fits a stage, by its row
    (:func:`planner.search.fitting.fits_under`)."""
    reuses: int = 0
    """Frontier lookups answered without solving."""
    priced: dict[tuple[str, tuple[int, int], int, int, int, bool, bool], list[LayerOption]] = (
        field(default_factory=dict)
    )
    """Frontiers priced as layer options by (layer kind, mesh, mesh microbatch, replicas,
    microbatches, pipelined, whole frontier): every candidate that differs from another only
    in its schedule is offered the same options (:func:`kind_options`)."""
    least: tuple[float, Candidate] | None = None
    """The least per-device bytes any candidate's plans need, and that candidate: kept so
    that, when nothing fits, the error can say by how much."""

    @property
    def solutions(self) -> list[LayerSolution]:
        """Every layer solved so far."""
        return [s for key, f in self.frontiers.items()
                for s in (*f.solutions, *self.seeds.get(key, ()))]  # fmt: skip


# --------------------------------------------------------------------------- layer options


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchContext:
    """The inputs of one search and what it has found so far."""

    model: ModelSpec
    """The model searched."""
    cluster: ClusterSpec
    """The cluster it runs on."""
    training: TrainingSpec
    """Sequence length, global batch and precision, the options' over the model's."""
    options: SolveOptions
    """What the search may choose from."""
    state: SearchState
    """What it has solved so far."""
    deadline: float | None = None
    """``time.perf_counter()`` past which no layer ILP starts."""
    parameters: int = 0
    """The model's parameters (0: not counted), which the stages share out."""


LADDER_STEPS = 8
"""Budget steps after the unconstrained solve (each one a layer ILP)."""
LADDER_SHRINK = 0.7
"""Each step's budget as a share of the previous solution's memory: halving skipped shardings
between (a TP4 layer with Megatron's row-parallel output projection sits between the fastest
TP4 layer and the next halving), and the memory a stage has is rarely a power of two away."""
REFERENCE_MICROBATCHES = 64
"""The ILP sees the gradient sync spread over this many microbatches: the composer prices the
real sync, mostly hidden behind the backward, so the ILP should not shy away from it."""


def _query(ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int) -> LayerQuery:
    """The layer ILP's query for ``kind`` on ``mesh`` with a mesh microbatch of ``b``."""
    return LayerQuery(
        kind=kind, mesh=mesh, mesh_micro_batch_size=b, seq_length=ctx.training.seq_length,
        precision=ctx.training.precision, stack=ctx.training.stack,
        num_microbatches=REFERENCE_MICROBATCHES,
        flash_attention=ctx.options.flash_attention,
        zero=(1,) if moments_sharded(ctx.options.pins) else (0, 1),
        replicas=ctx.cluster.num_devices // (mesh[0] * mesh[1]),
        moe_dispatcher=ctx.options.pins.moe_dispatcher or "alltoall",
        optimizer_moments=ctx.options.pins.optimizer_moments or "fp32",
    )  # fmt: skip


def moments_sharded(pins: Pins) -> bool:
    """Whether the pins keep Adam's moments in bf16, which leaves the per-operator search's
    layers ZeRO 1 alone: Megatron-LM's precision-aware optimizer runs only under its
    distributed optimizer (``megatron/core/optimizer/__init__.py`` at d98e8a6, line 1057: a
    ``ValueError`` without ``use_distributed_optimizer``). The uniform
    space keeps its other ZeRO stages with fp32 moments (:mod:`planner.uniform.space`); their
    best is the incumbent the per-operator search must beat.

    >>> moments_sharded(Pins()), moments_sharded(Pins(optimizer_moments="bf16"))
    (False, True)
    """
    return pins.optimizer_moments == "bf16"


def _graph(ctx: SearchContext, key: tuple[str, tuple[int, int], int]) -> LayerGraph:
    """The layer graph of ``key`` (its nodes' priced strategies, no resharding yet), built
    once and kept until its problem is built."""
    graph = ctx.state.graphs.get(key)
    if graph is None:
        graph = layer_graph_of(ctx.model, ctx.cluster, _query(ctx, *key))
        ctx.state.graphs[key] = graph
    return graph


def built_problem(
    ctx: SearchContext, key: tuple[str, tuple[int, int], int]
) -> tuple[LayerProblem, LayerGraph]:
    """The layer problem of ``key``, built once and kept until its frontier's walk ends (once
    it has ended, built again for the asker and not kept)."""
    built = ctx.state.problems.get(key)
    if built is None and whole_frontier(ctx, *key):
        return layer_problem(ctx.model, ctx.cluster, _query(ctx, *key))
    if built is None:
        layer = _graph(ctx, key)
        built = layer_problem(ctx.model, ctx.cluster, _query(ctx, *key), layer=layer)
        ctx.state.problems[key] = built
        del ctx.state.graphs[key]
    return built


def kind_least_s(
    ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int, *, resharding: bool = True
) -> float:
    """A lower bound on one microbatch's time through a layer of ``kind`` on ``mesh`` under
    any sharding, recomputation and ZeRO stage, sync left out: no layer option is faster,
    so a candidate whose step this bound already puts past the incumbent needs no layer
    ILP. With ``resharding``, the LP relaxation of the layer's strategies and resharding
    (:func:`planner.ilp.bound.least_time_ns`); without, each node's fastest strategy alone
    (looser, but needs no resharding priced: the first sieve)."""
    key = (kind, mesh, b)
    known = ctx.state.least_s.get(key)
    if known is not None and (known[1] or not resharding):
        return known[0]
    if key in ctx.state.frontiers:  # solved: the options are these solutions
        solved = kind_solutions(ctx, *key, whole=False)
        least = (min((s.parts.time_s for s in solved if s.parts), default=float("inf")), True)
    elif resharding:
        least = (least_time_ns(built_problem(ctx, key)[0]) / NS, True)
    elif key in ctx.state.problems:
        least = (least_time_ns(ctx.state.problems[key][0]) / NS, True)
    else:
        nodes = _graph(ctx, key).nodes
        # Less a hair: the layer's parts add the same seconds in another order.
        least = (sum(min(s.time_s for s in n.strategies) for n in nodes) * (1 - 1e-9), False)
    ctx.state.least_s[key] = least
    return least[0]


def kind_least_bytes(
    ctx: SearchContext, kind: str, c: Candidate, *, layers: int, in_flight: int
) -> float:
    """A lower bound on what ``layers`` layers of ``kind`` hold on a device of ``c``'s mesh
    with ``in_flight`` microbatches in flight, whatever their sharding: their weight states
    and kept activations, and the transient peak of one of them, under the leanest
    recomputation mode and ZeRO stage (a pipeline allows ZeRO 1 at most), each node at its
    leanest strategy. Memory has no resharding term, so the node minima add up exactly; the
    states are priced as if the mesh were replicated over the whole cluster, no more than
    the candidate's replicas hold."""
    key = (kind, c.mesh, c.mesh_micro_batch_size, layers, in_flight, c.num_stages > 1)
    if key not in ctx.state.least_bytes:
        stages = ZERO_STAGES[:2] if c.num_stages > 1 else ZERO_STAGES
        rows = [RECOMPUTE_MODES.index(m)
                for m in (RECOMPUTE_MODES if kind in TRANSFORMER_KINDS else ("none",))]
        total = np.zeros((len(stages), len(rows)))
        for state, kept, rebuilt in _memory_columns(ctx, key[:3]):
            # As the stage table counts a layer option: kept per microbatch in flight, and
            # under full recomputation the rebuilt activations once.
            held = (held_bytes(layers, state[list(stages), None, :], kept[None, rows, :],
                               in_flight) + rebuilt[None, rows, :])  # fmt: skip
            total += held.min(axis=2)  # each node's leanest, per (ZeRO stage, mode)
        ctx.state.least_bytes[key] = float(total.min())
    return ctx.state.least_bytes[key]


def _memory_columns(
    ctx: SearchContext, key: tuple[str, tuple[int, int], int]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`memory_columns` of ``key``'s layer, built once from its layer graph (its
    problem's when built, whose dominated strategies are pruned)."""
    if key not in ctx.state.memory_columns:
        built = ctx.state.problems.get(key)
        nodes = built[1].nodes if built is not None else _graph(ctx, key).nodes
        ctx.state.memory_columns[key] = memory_columns(nodes)
    return ctx.state.memory_columns[key]


def memory_columns(nodes: Sequence[Node]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per node, per strategy (columns): the weight states per ZeRO stage (rows), the kept
    activations per recomputation mode (rows as :data:`RECOMPUTE_MODES`; full recomputation
    keeps the layer's input), and what each mode rebuilds (full recomputation: the layer's
    activations, once)."""
    columns = []
    for v, node in enumerate(nodes):
        x = node.strategies
        columns.append((
            np.array([[s.state_bytes[z] for s in x] for z in ZERO_STAGES]),
            np.array([[s.kept_bytes for s in x], [s.kept_selective_bytes for s in x],
                      [s.input_bytes * (v == 0) for s in x]]),
            np.array([[0.0] * len(x), [0.0] * len(x), [s.kept_bytes for s in x]]),
        ))  # fmt: skip
    return columns


def kind_solutions(
    ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int, *, whole: bool = True
) -> list[LayerSolution]:
    """Shardings of one layer kind on ``mesh`` along its time-memory frontier
    (:func:`planner.ilp.layer.solve_frontier`), and the uniform ones beside them. They are
    found once for every candidate with this mesh and microbatch, whatever its replicas and
    microbatch count (which :func:`layer_options` prices afterwards): as if the mesh were
    replicated over the whole cluster, with ZeRO 0 or 1 (what pipelines allow), so that a
    sharding which fits only once the distributed optimizer shards its states is on the
    frontier. Not ``whole``: only the frontier's fastest point (one ILP), enough to bound a
    candidate; the walk goes on from it when the whole frontier is asked for."""
    key = (kind, mesh, b)
    known = ctx.state.frontiers.get(key)
    steps = LADDER_STEPS if whole else 0
    if known is not None and (known.solves > steps or known.next_budget_kib is None):
        ctx.state.reuses += 1
    else:
        query = _query(ctx, kind, mesh, b)
        built = built_problem(ctx, key)
        frontier = solve_frontier(
            ctx.model, ctx.cluster, query, steps=steps, shrink=LADDER_SHRINK, start=known,
            options=IlpOptions(backend=ctx.options.backend,
                                  time_limit_s=ctx.options.ilp_time_limit_s,
                                  deadline=ctx.deadline),
            built=built,
        )  # fmt: skip
        ctx.state.frontiers[key] = frontier
        if frontier.solves > LADDER_STEPS or frontier.next_budget_kib is None:
            del ctx.state.problems[key]  # the walk ended: nothing will ask for it again
        if key not in ctx.state.seeds:
            ctx.state.seeds[key] = tuple(uniform_solutions(ctx.model, ctx.cluster, query))
    return [*ctx.state.frontiers[key].solutions, *ctx.state.seeds[key]]


def kind_solved(ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int) -> bool:
    """Whether the layer's fastest sharding on ``mesh`` is solved already (its frontier's
    first point)."""
    return (kind, mesh, b) in ctx.state.frontiers


def walk_size(ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int) -> int:
    """The strategy and edge variables of the layer program whose frontier on ``mesh`` is
    still to be walked (0 once walked, or before its program is built): what its budgeted
    solves cost grows with."""
    if whole_frontier(ctx, kind, mesh, b):
        return 0
    built = ctx.state.problems.get((kind, mesh, b))
    if built is None:
        return 0
    problem = built[0]
    return (sum(len(n.strategies) for n in problem.nodes)
            + sum(len(e.cost_ns) * len(e.cost_ns[0]) for e in problem.edges))  # fmt: skip


def whole_frontier(ctx: SearchContext, kind: str, mesh: tuple[int, int], b: int) -> bool:
    """Whether the layer's whole frontier on ``mesh`` is already solved."""
    known = ctx.state.frontiers.get((kind, mesh, b))
    return known is not None and (known.solves > LADDER_STEPS or known.next_budget_kib is None)


def kind_options(
    ctx: SearchContext, kind: str, c: Candidate, *, whole: bool = True
) -> list[LayerOption]:
    """The frontier's shardings priced for candidate ``c`` under every recomputation mode
    and ZeRO stage; with a pipeline, ZeRO-2 and 3 are left out, as DeepSpeed and
    Colossal-AI refuse them (their per-microbatch traffic defeats the pipeline). Transformer
    layers whose sharding no framework can launch (:func:`launchable`) are left out too. Not
    ``whole``: the frontier's fastest point only (:func:`kind_solutions`), unless the whole
    frontier is solved already."""
    whole = whole or whole_frontier(ctx, kind, c.mesh, c.mesh_micro_batch_size)
    key = (kind, c.mesh, c.mesh_micro_batch_size, c.replicas, c.num_microbatches,
           c.num_stages > 1, whole)  # fmt: skip
    if key in ctx.state.priced:
        ctx.state.reuses += 1  # the frontier's reuse, as kind_solutions counts it
    else:
        ctx.state.priced[key] = _priced(ctx, kind, c, whole=whole)
    return list(ctx.state.priced[key])


def _priced(ctx: SearchContext, kind: str, c: Candidate, *, whole: bool) -> list[LayerOption]:
    """:func:`kind_options` computed: everything in it depends on ``c`` only through the
    key it is kept under."""
    sync = SyncContext(mesh=LogicalMesh(c.mesh), replicas=c.replicas,
                       num_microbatches=c.num_microbatches, precision=ctx.training.precision,
                       stack=ctx.training.stack,
                       optimizer_moments=ctx.options.pins.optimizer_moments or "fp32",
                       overlap_grad_reduce=ctx.options.overlap_grad_reduce,
                       overlap_param_gather=ctx.options.overlap_param_gather)  # fmt: skip
    pins = ctx.options.pins
    options = []
    for solution in kind_solutions(ctx, kind, c.mesh, c.mesh_micro_batch_size, whole=whole):
        if kind in TRANSFORMER_KINDS and not launchable(solution, c.mesh):
            continue
        if kind in TRANSFORMER_KINDS:
            summary = summarise(solution, c.mesh)
            if not pins.admits(tp=summary["tp"], cp=summary["cp"], ep=summary["ep"],
                               sp=summary["sp"],
                               etp=folded_etp(summary) or summary["tp"]):  # fmt: skip
                continue
        options += layer_options(solution, ctx.cluster, sync)
    if c.num_stages > 1:
        options = [o for o in options if o.zero <= 1]
    if moments_sharded(pins):
        options = [o for o in options if o.zero == 1]
    options = [o for o in options if pins.admits(zero=o.zero) and (
        kind not in TRANSFORMER_KINDS or pins.admits(recompute=o.recompute))]  # fmt: skip
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


def candidate_send_s(ctx: SearchContext, c: Candidate, distance: int) -> float:
    """Per microbatch, one stage's sends (:func:`planner.cost.pipeline_send_s`): the activation
    forward and its gradient back, each device of the mesh sending its share (Megatron's
    scatter/gather), once per chunk; on DeepSpeed's engine one blocking transfer at a time
    (:func:`~planner.graph.stacks.pipeline_transfers`)."""
    hidden = cost.hidden_state_bytes(
        micro_batch_size=c.mesh_micro_batch_size, seq_length=ctx.training.seq_length,
        hidden_size=ctx.model.hidden_size, precision=ctx.training.precision,
    )  # fmt: skip
    return cost.pipeline_send_s(ctx.cluster, hidden, distance, chunks=c.vpp,
                                stages=c.num_stages, slices=c.mesh[0] * c.mesh[1],
                                transfers=pipeline_transfers(ctx.training.stack,
                                                             c.num_stages))  # fmt: skip


def decoder_kinds(model: ModelSpec) -> list[str]:
    """Each decoder layer's kind, first to last."""
    return [decoder_layer_kind(model, layer) for layer in range(1, model.num_layers + 1)]


# --------------------------------------------------------------------------- one candidate
