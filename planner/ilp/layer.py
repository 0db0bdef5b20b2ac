"""``solve_layer``: the best sharding of one layer on a logical mesh.

Data (the layer's ops and their priced strategies) -> problem (:class:`LayerProblem`) ->
model (:func:`build_layer_milp`) -> solve (:func:`solve_milp`) -> read back
(:class:`LayerSolution`), each step its own function. Elementwise ops that only follow their
producer (activations, per-head norms) are folded into it, so the ILP has variables only where
choices matter. Decoder layers repeat, so a layer's output feeds the next identical layer's
input: that wrap-around edge keeps one solved layer valid when tiled.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from planner.errors import InputError
from planner.graph import index_layers, lower
from planner.graph.layout import (
    Layout,
    LogicalMesh,
    Transfer,
    canonical,
    reshard,
    transfer_time_s,
)
from planner.graph.ops import Op, Tensor
from planner.graph.strategies import Strategy, StrategyContext, follow, op_strategies
from planner.ilp.backends import Backend, SolverReport, solve_milp
from planner.ilp.formulation import (
    RECOMPUTE_MODES,
    EdgeCosts,
    LayerProblem,
    NodeCosts,
    build_layer_milp,
    edge_var,
    strategy_var,
)
from planner.ilp.prune import prune_dominated
from planner.spec import GIB, ClusterSpec, ModelSpec, Precision, TrainingSpec

NS = 1e9
KIB = 1024


@dataclass(frozen=True, slots=True)
class LayerQuery:
    """Which layer to solve, on which mesh, under which budget."""

    kind: str
    """``dense``, ``moe``, ``embedding`` or ``head``."""
    mesh: tuple[int, int]
    micro_batch_size: int
    seq_length: int
    precision: Precision = "bf16"
    memory_budget_gib: float | None = None
    in_flight: int = 1
    """Microbatches whose activations a device holds at its peak (1F1B: ``p - i``)."""
    num_microbatches: int = 1
    flash_attention: bool = True
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero: tuple[int, ...] = (0, 1, 2, 3)


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """Which backend, and how long it may take."""

    backend: Backend = "ortools"
    time_limit_s: float = 10.0


@dataclass(frozen=True, slots=True)
class OpChoice:
    """The strategy chosen for one ILP node."""

    op: str
    strategy: str
    output: Layout
    followers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Resharding:
    """The layout conversion chosen on one edge."""

    src: str
    dst: str
    forward: tuple[str, ...]
    backward: tuple[str, ...]
    seconds: float


@dataclass(frozen=True, slots=True)
class LayerSolution:
    """The solved layer: one strategy per op, resharding per edge, the per-layer choices."""

    kind: str
    mesh: tuple[int, int]
    choices: tuple[OpChoice, ...]
    resharding: tuple[Resharding, ...]
    recompute: str | None
    zero: int | None
    time_s: float | None
    """One microbatch, forward and backward, on one device (the ILP's objective)."""
    memory_bytes: float | None
    min_memory_bytes: float | None
    """When infeasible: the least memory any choice in the space needs."""
    report: SolverReport

    def strategy(self, op_suffix: str) -> str:
        """The strategy of the node whose op name ends with ``op_suffix``."""
        for choice in self.choices:
            if choice.op.endswith(op_suffix) or any(f.endswith(op_suffix)
                                                    for f in choice.followers):  # fmt: skip
                return choice.strategy
        raise KeyError(op_suffix)


@dataclass(slots=True)
class SolutionCache:
    """Solved layers by a stable key of their inputs (model, cluster, query, backend)."""

    entries: dict[str, LayerSolution] = field(default_factory=dict)
    hits: int = 0

    @staticmethod
    def key(model: ModelSpec, cluster: ClusterSpec, query: LayerQuery, backend: str) -> str:
        """SHA-256 of the canonical JSON of everything the solution depends on."""
        data = [model.model_dump(mode="json"), cluster.model_dump(mode="json"),
                asdict(query), backend]  # fmt: skip
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


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
) -> LayerQuery:
    """A checked :class:`LayerQuery` from user-facing options (``mesh`` as ``"2x4"``);
    sequence length and precision default to the model's training block."""
    if isinstance(mesh, str):
        parts = mesh.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise InputError(f"--mesh must look like 2x4 (two positive sizes), got {mesh!r}")
        mesh = (int(parts[0]), int(parts[1]))
    training = model.training
    seq = seq_len or (training.seq_length if training else None)
    if seq is None:
        raise InputError(f"{model.name}: no sequence length: pass --seq-len")
    kinds = ("dense", "moe") if model.moe else ("dense",)
    if kind not in (*kinds, "embedding", "head") or (kind == "dense" and model.moe and not any(
            not model.is_moe_layer(i) for i in range(model.num_layers))):  # fmt: skip
        raise InputError(f"{model.name} has no {kind!r} layer; it has "
                         f"{', '.join((*kinds, 'embedding', 'head'))}")  # fmt: skip
    for name, value in (("--mbs", mbs), ("--seq-len", seq), ("--in-flight", in_flight),
                        ("--microbatches", microbatches)):  # fmt: skip
        if value <= 0:
            raise InputError(f"{name} must be positive, got {value}")
    if budget_gib is not None and budget_gib <= 0:
        raise InputError(f"--budget-gib must be positive, got {budget_gib}")
    return LayerQuery(
        kind=kind, mesh=mesh, micro_batch_size=mbs, seq_length=seq,
        precision=precision or (training.precision if training else "bf16"),
        memory_budget_gib=budget_gib, in_flight=in_flight, num_microbatches=microbatches,
        flash_attention=flash_attention,
    )  # fmt: skip


# --------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class _Node:
    ops: tuple[Op, ...]
    strategies: tuple[Strategy, ...]

    @property
    def name(self) -> str:
        return self.ops[0].name

    @property
    def output(self) -> Tensor:
        return self.ops[-1].output


def _is_follower(op: Op, producers: Sequence[str]) -> bool:
    per_head_norm = op.kind == "norm" and "heads" in op.output.dim_names
    return len(producers) == 1 and (op.kind == "elementwise" or per_head_norm)


def _merge(a: Strategy, b: Strategy) -> Strategy:
    return replace(
        a,
        output=b.output,
        output_grad=b.output_grad,
        forward_s=a.forward_s + b.forward_s,
        backward_s=a.backward_s + b.backward_s,
        comm_s=a.comm_s + b.comm_s,
        state_bytes=tuple(x + y for x, y in zip(a.state_bytes, b.state_bytes, strict=True)),
        sync_s=tuple(x + y for x, y in zip(a.sync_s, b.sync_s, strict=True)),
        kept_bytes=a.kept_bytes + b.kept_bytes,
        kept_selective_bytes=a.kept_selective_bytes + b.kept_selective_bytes,
    )  # type: ignore[arg-type]


def layer_nodes(
    ops: Sequence[Op], producers: dict[str, list[str]], mesh: LogicalMesh, ctx: StrategyContext
) -> list[_Node]:
    """The ILP's nodes: each op with the followers folded into it, and their strategies."""
    nodes: list[_Node] = []
    owner: dict[str, int] = {}
    for op in ops:
        preds = [p for p in producers[op.name] if p in owner]
        if _is_follower(op, preds) and preds:
            v = owner[preds[0]]
            node = nodes[v]
            merged = []
            for s in node.strategies:
                follower = follow(op, s.output, mesh, ctx)
                if follower is not None:
                    merged.append(_merge(s, follower))
            nodes[v] = _Node((*node.ops, op), tuple(merged))
            owner[op.name] = v
            continue
        owner[op.name] = len(nodes)
        nodes.append(_Node((op,), tuple(op_strategies(op, mesh, ctx))))
    return nodes


def _input_index(consumer: Op, tensor: Tensor) -> int | None:
    """Which of ``consumer``'s inputs ``tensor`` feeds (matched by canonical dim names)."""
    names = [canonical(n) for n, _ in tensor.dims]
    for k, t in enumerate(consumer.inputs):
        if [canonical(n) for n, _ in t.dims] == names:
            return k
    return None


def _edge(src: _Node, dst: _Node, mesh: LogicalMesh, cluster: ClusterSpec) -> EdgeCosts:
    """Forward resharding of the producer's output into the consumer's input, and backward
    resharding of the input gradient into the output gradient, for every strategy pair."""
    index = _input_index(dst.ops[0], src.output)
    memo: dict[tuple[Layout, Layout], int] = {}

    def ns(a: Layout, b: Layout) -> int:
        if (a, b) not in memo:
            memo[a, b] = round(NS * transfer_time_s(reshard(a, b, src.output, mesh), cluster, mesh))
        return memo[a, b]

    total, forward = [], []
    for p in src.strategies:
        row, frow = [], []
        for c in dst.strategies:
            if index is None:  # routing scores: small, moved with the tokens
                row.append(0)
                frow.append(0)
                continue
            f = ns(p.output, c.inputs[index])
            row.append(f + ns(c.input_grads[index], p.output_grad))
            frow.append(f)
        total.append(tuple(row))
        forward.append(tuple(frow))
    return EdgeCosts(src.name, dst.name, tuple(total), tuple(forward))


def _node_costs(node: _Node, query: LayerQuery, first: bool) -> NodeCosts:
    """Integer costs of one node; ``first`` marks the node whose input full recomputation
    keeps (the layer's input)."""
    s = node.strategies

    def kib(x: float) -> int:
        return math.ceil(x / KIB)

    working = [kib(x.kept_bytes) for x in s]
    activation = {
        "none": tuple(kib(query.in_flight * x.kept_bytes) for x in s),
        "selective": tuple(kib(query.in_flight * x.kept_selective_bytes) for x in s),
        # Full recomputation keeps only the layer input per in-flight microbatch, and holds one
        # microbatch's activations while it reruns the layer.
        "full": tuple(
            kib(query.in_flight * x.input_bytes * first) + w
            for x, w in zip(s, working, strict=True)
        ),
    }
    return NodeCosts(
        name=node.name,
        strategies=tuple(x.name for x in s),
        time_ns=tuple(round(NS * x.time_s) for x in s),
        forward_ns=tuple(round(NS * x.forward_s) for x in s),
        attention_ns=tuple(round(NS * x.attention_forward_s) for x in s),
        activation_kib=activation,
        state_kib=tuple(tuple(kib(x.state_bytes[z]) for x in s) for z in range(4)),
        sync_ns=tuple(tuple(round(NS * x.sync_s[z]) for x in s) for z in range(4)),
    )


# --------------------------------------------------------------------------- problem


def layer_problem(
    model: ModelSpec, cluster: ClusterSpec, query: LayerQuery
) -> tuple[LayerProblem, list[_Node], LogicalMesh]:
    """The numeric problem of ``query``'s layer, without dominated strategies, with the nodes
    it was built from."""
    training = TrainingSpec(seq_length=query.seq_length, global_batch_size=1,
                            precision=query.precision)  # fmt: skip
    graph = lower(model, training, micro_batch_size=query.micro_batch_size)
    index = index_layers(graph)
    layer = index.layers_by_kind[query.kind][0]
    ops = index.ops_by_layer[layer]
    names = {op.name for op in ops}
    producers = {op.name: [p for p in graph.predecessors(op.name) if p in names] for op in ops}
    mesh = LogicalMesh(query.mesh)
    ctx = StrategyContext(cluster, query.precision, query.flash_attention,
                          query.num_microbatches)  # fmt: skip
    nodes = layer_nodes(ops, producers, mesh, ctx)
    owner = {op.name: v for v, node in enumerate(nodes) for op in node.ops}
    pairs: list[tuple[int, int]] = []
    for op in ops:
        for p in producers[op.name]:
            pair = (owner[p], owner[op.name])
            if pair[0] != pair[1] and pair not in pairs:
                pairs.append(pair)
    transformer = query.kind in ("dense", "moe")
    if transformer:  # the next identical layer consumes this one's output
        outside = [
            op.name for op in ops if any(q not in names for q in graph.predecessors(op.name))
        ]
        last = owner[ops[-1].name]
        pairs += [(last, owner[n]) for n in outside if (last, owner[n]) not in pairs]
    edges = tuple(_edge(nodes[u], nodes[v], mesh, cluster) for u, v in pairs)
    first = owner[ops[0].name]
    budget = None if query.memory_budget_gib is None else int(query.memory_budget_gib * GIB / KIB)
    problem = LayerProblem(
        nodes=tuple(_node_costs(n, query, v == first) for v, n in enumerate(nodes)),
        edges=edges,
        recompute_modes=query.recompute if transformer else ("none",),
        zero_stages=query.zero,
        budget_kib=budget,
    )
    problem, kept = prune_dominated(problem)
    nodes = [_Node(n.ops, tuple(n.strategies[i] for i in k))
             for n, k in zip(nodes, kept, strict=True)]  # fmt: skip
    return problem, nodes, mesh


# --------------------------------------------------------------------------- solve


def solve_layer(
    model: ModelSpec,
    cluster: ClusterSpec,
    query: LayerQuery,
    *,
    options: SolverOptions = SolverOptions(),
    cache: SolutionCache | None = None,
) -> LayerSolution:
    """The cheapest sharding of one layer of ``query.kind`` on ``query.mesh`` that fits the
    budget, with the solver's report; infeasible budgets come back with the least memory any
    choice needs.
    """
    key = SolutionCache.key(model, cluster, query, options.backend) if cache else ""
    if cache is not None and key in cache.entries:
        cache.hits += 1
        return cache.entries[key]
    problem, nodes, mesh = layer_problem(model, cluster, query)
    result = solve_milp(build_layer_milp(problem), backend=options.backend,
                        time_limit_s=options.time_limit_s)  # fmt: skip
    if result.report.status in ("infeasible", "timed_out"):
        least = solve_milp(build_layer_milp(problem, minimise_memory=True),
                           backend=options.backend, time_limit_s=options.time_limit_s)  # fmt: skip
        min_memory = least.report.objective * KIB if least.report.objective is not None else None
        solution = LayerSolution(query.kind, query.mesh, (), (), None, None, None, None,
                                 min_memory, result.report)  # fmt: skip
    else:
        solution = read_solution(problem, nodes, mesh, cluster, result.values, result.report,
                                 query)  # fmt: skip
    if cache is not None:
        cache.entries[key] = solution
    return solution


def read_solution(
    problem: LayerProblem,
    nodes: list[_Node],
    mesh: LogicalMesh,
    cluster: ClusterSpec,
    values: dict[str, int],
    report: SolverReport,
    query: LayerQuery,
) -> LayerSolution:
    """Turn variable values back into strategies, reshardings and choices."""
    chosen = []
    for v, node in enumerate(problem.nodes):
        chosen.append(next(i for i in range(len(node.strategies)) if values[strategy_var(v, i)]))
    choices = tuple(
        OpChoice(n.name, n.strategies[i].name, n.strategies[i].output,
                 tuple(op.name for op in n.ops[1:]))
        for n, i in zip(nodes, chosen, strict=True)
    )  # fmt: skip
    index = {n.name: v for v, n in enumerate(nodes)}
    resharding = []
    for k, edge in enumerate(problem.edges):
        u, v = index[edge.src], index[edge.dst]
        i, j = chosen[u], chosen[v]
        assert values[edge_var(k, i, j)] == 1  # the linearisation ties e to both choices
        src, dst = nodes[u], nodes[v]
        at = _input_index(dst.ops[0], src.output)
        fwd: tuple[str, ...] = ()
        bwd: tuple[str, ...] = ()
        if at is not None:
            p, c = src.strategies[i], dst.strategies[j]
            fwd = _describe(reshard(p.output, c.inputs[at], src.output, mesh))
            bwd = _describe(reshard(c.input_grads[at], p.output_grad, src.output, mesh))
        resharding.append(Resharding(edge.src, edge.dst, fwd, bwd, edge.cost_ns[i][j] / NS))
    recompute = next(m for m in problem.recompute_modes if values[f"recompute_{m}"])
    zero = next(z for z in problem.zero_stages if values[f"zero_{z}"])
    recompute, zero = _canonical_choice(problem, chosen, recompute, zero)
    del cluster  # the reshardings were priced when the problem was built
    return LayerSolution(
        kind=query.kind, mesh=mesh.shape, choices=choices,
        resharding=tuple(resharding), recompute=recompute, zero=zero,
        time_s=evaluate_ns(problem, chosen, recompute, zero) / NS,
        memory_bytes=memory_kib(problem, chosen, recompute, zero) * KIB,
        min_memory_bytes=None, report=report,
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


def evaluate_ns(problem: LayerProblem, chosen: Sequence[int], recompute: str, zero: int) -> int:
    """The objective of one complete choice, computed directly (the aggregates of the
    program are only bounded, so a solution's value is recomputed from its choices)."""
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    total = sum(node.time_ns[i] + node.sync_ns[zero][i]
                for node, i in zip(problem.nodes, chosen, strict=True))  # fmt: skip
    for edge in problem.edges:
        i, j = chosen[index[edge.src]], chosen[index[edge.dst]]
        total += edge.cost_ns[i][j]
        if recompute == "full":
            total += edge.forward_ns[i][j]
    for node, i in zip(problem.nodes, chosen, strict=True):
        total += {"full": node.forward_ns[i], "selective": node.attention_ns[i]}.get(recompute, 0)
    return total


def memory_kib(problem: LayerProblem, chosen: Sequence[int], recompute: str, zero: int) -> int:
    """Weight states plus kept activations of one complete choice."""
    return sum(node.state_kib[zero][i] + node.activation_kib[recompute][i]
               for node, i in zip(problem.nodes, chosen, strict=True))  # fmt: skip
