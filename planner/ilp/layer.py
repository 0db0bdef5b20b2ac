"""``solve_layer``: the best sharding of one layer on a logical mesh.

Data (the layer's ops and their priced strategies) -> problem (:func:`layer_problem`) ->
model (:func:`build_layer_milp`) -> solve (:func:`solve_milp`) -> read back
(:func:`read_solution`), each step its own function.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.errors import InputError, TimeLimitError
from planner.graph.lower import decoder_layer_kind
from planner.ilp.backends import Backend, MilpSolution, SolverReport, solve_milp
from planner.ilp.formulation import (
    LayerProblem,
    build_layer_milp,
    edge_classes,
    edge_var,
    evaluate_ns,
    least_memory_kib,
    memory_kib,
    strategy_var,
)
from planner.ilp.milp import Milp
from planner.ilp.modes import mode_floors, solve_by_mode
from planner.ilp.problem import KIB, NS, LayerQuery, layer_problem
from planner.sharding.assignment import (
    LayerGraph,
    LayerParts,
    edge_seconds,
    input_index,
    layer_parts,
)
from planner.sharding.layout import Layout, Transfer, reshard
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import fill_training
from planner.vocabulary import GIB, MoeDispatcher, Precision


@dataclass(frozen=True, slots=True, kw_only=True)
class IlpOptions:
    """Which backend, and how long it may take."""

    backend: Backend = "ortools"
    """The MILP solver: ``ortools`` (CBC in process), ``pulp`` (CBC as a subprocess) or
    ``cpsat``."""
    time_limit_s: float = 10.0
    """Seconds each solve may take (a frontier takes several solves)."""
    deadline: float | None = None
    """``time.perf_counter()`` past which no solve starts and a cut-short one is abandoned
    (:class:`~planner.errors.TimeLimitError`): a search's own limit, passed down."""


def _solve(milp: Milp, options: IlpOptions) -> MilpSolution:
    """Solve within ``options``' limit and what is left before its deadline. A solve the
    deadline cut short raises rather than pass for the layer's answer (a frontier cut short
    would be kept and reused as if complete)."""
    limit = options.time_limit_s
    if options.deadline is not None:
        left = options.deadline - time.perf_counter()
        if left <= 0:
            raise TimeLimitError("the time limit passed before this layer ILP started")
        limit = min(limit, left)
    result = solve_milp(milp, backend=options.backend, time_limit_s=limit)
    cut_short = result.report.status in ("feasible", "timed_out")
    if cut_short and limit < options.time_limit_s:
        raise TimeLimitError("the time limit passed during a layer ILP")
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class OpChoice:
    """The strategy chosen for one ILP node."""

    op: str
    """The node's leading op's name."""
    strategy: str
    """The chosen strategy's name: per mesh axis the dim it splits or ``R``, e.g. ``R,ffn``."""
    output: Layout
    """The layout the node's output comes out in (after its followers)."""
    followers: tuple[str, ...]
    """The names of the ops folded into the node, run in the layout the leading op's output comes
    out in."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resharding:
    """The layout conversion chosen on one edge."""

    src: str
    """The producer node's name."""
    dst: str
    """The consumer node's name."""
    forward: tuple[str, ...]
    """Collectives (``kind@axis<n>``) that turn the producer's output into the consumer's input
    layout."""
    backward: tuple[str, ...]
    """Collectives (``kind@axis<n>``) that turn the consumer's input gradient into the producer's
    output-gradient layout."""
    seconds: float
    """Both directions' collectives on one device for one microbatch, after what ``tp_comm_overlap``
    hides (full recomputation's rerun apart)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSolution:
    """The solved layer: one strategy per op, resharding per edge, the per-layer choices."""

    kind: str
    """The layer kind: ``dense``, ``moe``, ``embedding`` or ``head``."""
    mesh: tuple[int, ...]
    """The shape of the logical mesh it was solved on."""
    choices: tuple[OpChoice, ...]
    """One per ILP node, in layer order (empty when infeasible)."""
    resharding: tuple[Resharding, ...]
    """One per edge, in the layer graph's edge order (empty when infeasible)."""
    recompute: str | None
    """The layer's recomputation mode, the least among ties (None when infeasible)."""
    zero: int | None
    """The ZeRO stage of the layer's weights, the lowest among ties (None when infeasible)."""
    time_s: float | None
    """One microbatch, forward and backward, on one device (the ILP's objective)."""
    memory_bytes: float | None
    """Weight states and kept activations (in-flight microbatches included) on one device, in bytes
    (None when infeasible)."""
    min_memory_bytes: float | None
    """When infeasible: the least memory any choice in the space needs."""
    report: SolverReport
    """The solver's report (of the budgeted solve when infeasible)."""
    parts: LayerParts | None = None
    """The chosen sharding's costs by part (None when infeasible)."""

    def strategy(self, op_suffix: str) -> str:
        """The strategy of the node whose op name ends with ``op_suffix``."""
        for choice in self.choices:
            if choice.op.endswith(op_suffix) or any(f.endswith(op_suffix)
                                                    for f in choice.followers):  # fmt: skip
                return choice.strategy
        raise KeyError(op_suffix)


def layer_query(
    model: ModelSpec,
    *,
    kind: str,
    mesh: str | tuple[int, int],
    mbs: int = 1,
    seq_len: int | None = None,
    precision: Precision | None = None,
    budget_gib: float | None = None,
    in_flight: int = 1,
    microbatches: int = 1,
    flash_attention: bool = True,
    moe_dispatcher: MoeDispatcher = "alltoall",
) -> LayerQuery:
    """A checked :class:`LayerQuery` from user-facing options (``mesh`` as ``"2x4"``);
    sequence length and precision default to the model's training block; DeepEP
    (``moe_dispatcher``) only for a model with experts."""
    if isinstance(mesh, str):
        parts = mesh.lower().split("x")
        # ASCII digits only, and few: str.isdigit accepts '²' and 5,000-digit strings, which
        # int() then refuses.
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]{1,7}", p) and int(p) > 0
                                      for p in parts):  # fmt: skip
            raise InputError(f"--mesh must look like 2x4 (two positive sizes), got {mesh!r}")
        mesh = (int(parts[0]), int(parts[1]))
    kinds = tuple(dict.fromkeys(decoder_layer_kind(model, layer)
                                for layer in range(1, model.num_layers + 1)))  # fmt: skip
    if kind not in (*kinds, "embedding", "head"):
        raise InputError(f"{model.name} has no {kind!r} layer; it has "
                         f"{', '.join((*kinds, 'embedding', 'head'))}")  # fmt: skip
    for name, value in (("--mbs", mbs), ("--seq-len", seq_len), ("--in-flight", in_flight),
                        ("--microbatches", microbatches)):  # fmt: skip
        if value is not None and value <= 0:
            raise InputError(f"{name} must be positive, got {value}")
    if moe_dispatcher == "deepep" and model.moe is None:
        raise InputError(f"--moe-dispatcher deepep: {model.name} has no experts to exchange")
    if budget_gib is not None and budget_gib <= 0:
        raise InputError(f"--budget-gib must be positive, got {budget_gib}")
    # A layer query prices one microbatch: the global batch plays no part, and one sequence
    # stands in for it so that only a missing sequence length is refused.
    training = fill_training(model, seq_length=seq_len, global_batch_size=1, precision=precision)
    return LayerQuery(
        kind=kind, mesh=mesh, mesh_micro_batch_size=mbs, seq_length=training.seq_length,
        precision=training.precision,
        memory_budget_gib=budget_gib, in_flight=in_flight, num_microbatches=microbatches,
        flash_attention=flash_attention, moe_dispatcher=moe_dispatcher,
    )  # fmt: skip


# --------------------------------------------------------------------------- solve


def solve_layer(
    model: ModelSpec,
    cluster: ClusterSpec,
    query: LayerQuery,
    *,
    options: IlpOptions = IlpOptions(),
) -> LayerSolution:
    """The cheapest sharding of one layer of ``query.kind`` on ``query.mesh`` that fits the
    budget, with the solver's report; infeasible budgets come back with the least memory any
    choice needs (:func:`least_memory_kib`, exact without a solve).
    """
    problem, layer = layer_problem(model, cluster, query)
    result = _solve(build_layer_milp(problem), options)
    if result.report.status in ("infeasible", "timed_out"):
        min_memory = min(least_memory_kib(problem).values()) * KIB
        solution = LayerSolution(kind=query.kind, mesh=query.mesh, choices=(), resharding=(),
                                 recompute=None, zero=None, time_s=None, memory_bytes=None,
                                 min_memory_bytes=min_memory, report=result.report)  # fmt: skip
    else:
        solution = read_solution(problem, layer, result.values, result.report, query)
    return solution


@dataclass(frozen=True, slots=True, kw_only=True)
class Frontier:
    """Solutions along a layer's time-memory frontier, fastest first, and the solves taken."""

    solutions: tuple[LayerSolution, ...]
    """The shardings found, fastest first, each followed by its sequence-parallel storage form when
    it has one."""
    solves: int
    """Layer ILPs solved: one per budget tried, the last infeasible one included."""
    next_budget_kib: int | None = None
    """The budget the walk would try next (None: it ended, nothing fits below the last)."""


def solve_frontier(
    model: ModelSpec,
    cluster: ClusterSpec,
    query: LayerQuery,
    *,
    steps: int,
    shrink: float = 0.5,
    options: IlpOptions = IlpOptions(),
    start: Frontier | None = None,
    built: tuple[LayerProblem, LayerGraph] | None = None,
) -> Frontier:
    """Shardings along the layer's time-memory frontier: the fastest (within
    ``query``'s budget, if any), then the fastest within ``shrink`` times the previous one's
    memory, and so on for up to ``steps`` steps or until nothing fits (the epsilon-constraint
    method).
    Each comes also in its sequence-parallel storage form when it has one (tensor-parallel
    matmuls keeping their input's sequence slice, as Megatron does), a point between two
    steps that Megatron users rely on. The problem is built once; only its budget changes.
    With ``start``, the same query's frontier walked for fewer steps, the walk goes on from
    where it stopped. With ``built``, ``query``'s :func:`layer_problem` built already (a walk
    going on need not build it again).
    """
    problem, layer = built if built is not None else layer_problem(model, cluster, query)
    found: list[LayerSolution] = []
    budget = problem.budget_kib
    solves = 0
    if start is not None:
        if start.next_budget_kib is None:
            return start
        found, solves, budget = list(start.solutions), start.solves, start.next_budget_kib
    floors: dict[str, float] | None = None
    for _ in range(steps + 1 - solves):
        solves += 1
        step = replace(problem, budget_kib=budget)
        if budget is not None and budget < min(least_memory_kib(step).values()):
            break  # nothing fits: memory adds up node by node, so no solve is needed to know
        if budget is None and "none" in step.recompute_modes:
            # Without a budget a rerun only adds time: the fastest point recomputes nothing,
            # and its program without the recomputation variables has half the variables.
            result = _solve(build_layer_milp(replace(step, recompute_modes=("none",))),
                            options)  # fmt: skip
            unset = {f"recompute_{m}": 0 for m in step.recompute_modes}
            result = replace(result, values=unset | result.values)
        elif len(step.recompute_modes) > 1:
            if floors is None:
                # The walk's first point is the fastest without recomputation when it began
                # without a budget.
                unbounded = (problem.budget_kib is None and "none" in problem.recompute_modes
                             and found)  # fmt: skip
                floors = mode_floors(problem, fastest_ns=found[0].time_s * NS if unbounded
                                     else None)  # fmt: skip
            result = solve_by_mode(step, floors, lambda milp: _solve(milp, options))
        else:
            result = _solve(build_layer_milp(step), options)
        if result.report.status in ("infeasible", "timed_out"):
            break
        asked = replace(query, memory_budget_gib=None if budget is None else budget * KIB / GIB)
        solution = read_solution(step, layer, result.values, result.report, asked)
        found.append(solution)
        stored = _sequence_parallel_storage(step, layer, result.values)
        if stored is not None:
            found.append(read_solution(step, layer, stored, result.report, asked))
        assert solution.memory_bytes is not None  # a feasible solution has a memory
        budget = math.floor(solution.memory_bytes * shrink / KIB)
        if budget <= 0:
            break
    else:
        return Frontier(solutions=tuple(found), solves=solves, next_budget_kib=budget)
    return Frontier(solutions=tuple(found), solves=solves)


def _sequence_parallel_storage(
    problem: LayerProblem, layer: LayerGraph, values: dict[str, int]
) -> dict[str, int] | None:
    """The solution ``values`` with every node that can keep its input's sequence slice doing
    so (the ``+kept-seq`` variants of :mod:`planner.sharding.strategies`), or None if none can."""
    chosen = [next(i for i in range(len(n.strategies)) if values[strategy_var(v, i)])
              for v, n in enumerate(problem.nodes)]  # fmt: skip
    changed = list(chosen)
    for v, node in enumerate(layer.nodes):
        names = [s.name for s in node.strategies]
        variant = next((k for k, name in enumerate(names)
                        if name.startswith(names[chosen[v]] + "+kept-seq@")), None)  # fmt: skip
        if variant is not None:
            changed[v] = variant
    if changed == chosen:
        return None
    out = {k: val for k, val in values.items() if k.startswith(("recompute_", "zero_"))}
    for v, node in enumerate(problem.nodes):
        for i in range(len(node.strategies)):
            out[strategy_var(v, i)] = int(i == changed[v])
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    for k, edge in enumerate(problem.edges):
        rows, cols = edge_classes(edge)
        chosen_pair = (rows[changed[index[edge.src]]], cols[changed[index[edge.dst]]])
        for a in range(max(rows) + 1):
            for b in range(max(cols) + 1):
                out[edge_var(k, a, b)] = int((a, b) == chosen_pair)
    return out


def read_solution(
    problem: LayerProblem,
    layer: LayerGraph,
    values: dict[str, int],
    report: SolverReport,
    query: LayerQuery,
) -> LayerSolution:
    """Turn variable values back into strategies, reshardings and choices."""
    nodes, mesh = layer.nodes, layer.mesh
    chosen = []
    for v, node in enumerate(problem.nodes):
        chosen.append(next(i for i in range(len(node.strategies)) if values[strategy_var(v, i)]))
    choices = tuple(
        OpChoice(op=n.name, strategy=n.strategies[i].name, output=n.strategies[i].output,
                 followers=tuple(op.name for op in n.ops[1:]))
        for n, i in zip(nodes, chosen, strict=True)
    )  # fmt: skip
    resharding = []
    for k, (edge, (u, v)) in enumerate(zip(problem.edges, layer.edges, strict=True)):
        i, j = chosen[u], chosen[v]
        rows, cols = edge_classes(edge)
        assert values[edge_var(k, rows[i], cols[j])] == 1  # e is tied to both choices
        src, dst = nodes[u], nodes[v]
        at = input_index(dst.ops[0], src.output)
        fwd: tuple[str, ...] = ()
        bwd: tuple[str, ...] = ()
        if at is not None:
            p, c = src.strategies[i], dst.strategies[j]
            fwd = _describe(reshard(p.output, c.inputs[at], src.output, mesh))
            bwd = _describe(reshard(c.input_grads[at], p.output_grad, src.output, mesh))
        seconds = edge_seconds(layer, (u, v), src=i, dst=j)[0]
        resharding.append(Resharding(src=edge.src, dst=edge.dst, forward=fwd, backward=bwd,
                                     seconds=seconds))
    recompute = next(m for m in problem.recompute_modes if values[f"recompute_{m}"])
    zero = next(z for z in problem.zero_stages if values[f"zero_{z}"])
    recompute, zero = _canonical_choice(problem, chosen, recompute, zero)
    return LayerSolution(
        kind=query.kind, mesh=mesh.shape, choices=choices,
        resharding=tuple(resharding), recompute=recompute, zero=zero,
        time_s=evaluate_ns(problem, chosen, recompute, zero) / NS,
        memory_bytes=memory_kib(problem, chosen, recompute, zero) * KIB,
        min_memory_bytes=None, report=report, parts=layer_parts(layer, chosen),
    )  # fmt: skip


def _canonical_choice(
    problem: LayerProblem, chosen: Sequence[int], recompute: str, zero: int
) -> tuple[str, int]:
    """Among choices that tie with the solver's (same time, within the budget), the least
    recomputation and the lowest ZeRO stage: ties are common (a weight split on every axis has
    nothing for ZeRO to shard) and the simplest configuration is the one to report."""
    target = evaluate_ns(problem, chosen, recompute, zero)
    budget = problem.budget_kib
    for mode in problem.recompute_modes:
        for stage in sorted(problem.zero_stages):
            fits = budget is None or memory_kib(problem, chosen, mode, stage) <= budget
            if fits and evaluate_ns(problem, chosen, mode, stage) == target:
                return mode, stage
    return recompute, zero


def _describe(transfers: Sequence[Transfer]) -> tuple[str, ...]:
    return tuple(f"{t.kind}@axis{t.axis}" for t in transfers)
