"""From a layer's operators to the numeric :class:`LayerProblem`: the ILP's nodes (each op
with the elementwise ops that only follow it folded in, so the ILP has variables only where
choices matter), their priced strategies, and the resharding matrices of the edges between
them. Decoder layers repeat, so a layer's output feeds the next identical layer's input: that
wrap-around edge keeps one solved layer valid when tiled."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.graph import lowered
from planner.graph.layout import Layout, LogicalMesh, canonical, reshard, transfer_time_s
from planner.graph.ops import Op, Tensor
from planner.graph.strategies import Strategy, StrategyContext, follow, op_strategies
from planner.ilp.formulation import RECOMPUTE_MODES, EdgeCosts, LayerProblem, NodeCosts
from planner.ilp.prune import prune_dominated
from planner.reading import training_run
from planner.spec import GIB, ClusterSpec, ModelSpec, Precision

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
    replicas: int = 1
    """Data-parallel copies of the pipeline the layer's stage is part of."""



# --------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Node:
    """An ILP node: its ops (the first leads) and their merged strategies."""

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
        weights=a.weights + b.weights,
        state_bytes=tuple(x + y for x, y in zip(a.state_bytes, b.state_bytes, strict=True)),
        sync_s=tuple(x + y for x, y in zip(a.sync_s, b.sync_s, strict=True)),
        kept_bytes=a.kept_bytes + b.kept_bytes,
        kept_selective_bytes=a.kept_selective_bytes + b.kept_selective_bytes,
    )  # type: ignore[arg-type]


def layer_nodes(
    ops: Sequence[Op], producers: dict[str, list[str]], mesh: LogicalMesh, ctx: StrategyContext
) -> list[Node]:
    """The ILP's nodes: each op with the followers folded into it, and their strategies."""
    nodes: list[Node] = []
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
            nodes[v] = Node((*node.ops, op), tuple(merged))
            owner[op.name] = v
            continue
        owner[op.name] = len(nodes)
        nodes.append(Node((op,), tuple(op_strategies(op, mesh, ctx))))
    return nodes


def input_index(consumer: Op, tensor: Tensor) -> int | None:
    """Which of ``consumer``'s inputs ``tensor`` feeds (matched by canonical dim names)."""
    names = [canonical(n) for n, _ in tensor.dims]
    for k, t in enumerate(consumer.inputs):
        if [canonical(n) for n, _ in t.dims] == names:
            return k
    return None


def _edge(src: Node, dst: Node, mesh: LogicalMesh, cluster: ClusterSpec) -> EdgeCosts:
    """Forward resharding of the producer's output into the consumer's input, and backward
    resharding of the input gradient into the output gradient, for every strategy pair."""
    index = input_index(dst.ops[0], src.output)
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


def _node_costs(node: Node, query: LayerQuery, first: bool) -> NodeCosts:
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
) -> tuple[LayerProblem, list[Node], LogicalMesh]:
    """The numeric problem of ``query``'s layer, without dominated strategies, with the nodes
    it was built from."""
    training = training_run(query.seq_length, 1, query.precision)
    graph, index = lowered(model, training, query.micro_batch_size)
    layer = index.layers_by_kind[query.kind][0]
    ops = index.ops_by_layer[layer]
    names = {op.name for op in ops}
    producers = {op.name: [p for p in graph.predecessors(op.name) if p in names] for op in ops}
    mesh = LogicalMesh(query.mesh)
    ctx = StrategyContext(cluster, query.precision, query.flash_attention,
                          query.num_microbatches, query.replicas)  # fmt: skip
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
    nodes = [Node(n.ops, tuple(n.strategies[i] for i in k))
             for n, k in zip(nodes, kept, strict=True)]  # fmt: skip
    return problem, nodes, mesh


