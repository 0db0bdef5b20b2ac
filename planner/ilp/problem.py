"""From a layer's operators to the numeric :class:`LayerProblem`: the layer graph's nodes
(:mod:`planner.sharding.assignment`: each op with the elementwise ops that only follow it folded
in, so the ILP has variables only where choices matter) with all their priced strategies, and
the resharding matrices of the edges between them, in whole nanoseconds and KiB."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner import cost
from planner.graph import lowered
from planner.graph.ops import TRANSFORMER_KINDS
from planner.graph.stacks import grouped_experts
from planner.ilp.formulation import EdgeCosts, LayerProblem, NodeCosts
from planner.ilp.prune import prune_dominated
from planner.sharding.assignment import (
    LayerGraph,
    Node,
    StrategiesFn,
    edge_seconds_matrix,
    layer_graph,
)
from planner.sharding.context import StrategyContext
from planner.sharding.layout import LogicalMesh
from planner.sharding.strategies import op_strategies
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import training_run
from planner.vocabulary import (
    GIB,
    RECOMPUTE_MODES,
    MoeDispatcher,
    OptimizerMoments,
    Precision,
    Stack,
)

NS = 1e9
KIB = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerQuery:
    """Which layer to solve, on which mesh, under which budget."""

    kind: str
    """``dense``, ``moe``, ``embedding`` or ``head``."""
    mesh: tuple[int, ...]
    """The shape of the logical mesh the layer is sharded on (the search's ``d0 x d1``: nodes,
    devices per node)."""
    mesh_micro_batch_size: int
    """Sequences per microbatch on the whole mesh, split over its data-parallel axes (the
    plan's ``micro_batch_size`` is per data-parallel rank)."""
    seq_length: int
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Compute precision."""
    stack: Stack = "megatron-te"
    """The software that runs the layer (what it keeps for the backward)."""
    memory_budget_gib: float | None = None
    """Memory one device may spend on the layer's weight states and kept activations, in GiB (None:
    no limit)."""
    in_flight: int = 1
    """Microbatches whose activations a device holds at its peak (1F1B: ``p - i``)."""
    num_microbatches: int = 1
    """Microbatches per step, among which the once-per-step gradient sync is shared."""
    flash_attention: bool = True
    """The attention core runs fused: causal FLOPs halved, no ``s x s`` tensors kept."""
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    """The recomputation modes the ILP may choose from (``dense`` and ``moe`` layers only; the
    others run ``none``)."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    """The ZeRO stages the ILP may choose for the layer's weights."""
    replicas: int = 1
    """Data-parallel copies of the pipeline the layer's stage is part of."""
    tp_comm_overlap: bool = False
    """Resharding next to a matmul hides behind it (Megatron-Core's ``--tp-comm-overlap``)."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How the experts' tokens are exchanged: NCCL's all-to-all, or DeepEP's dispatch and
    combine (then no op spreads the experts over ranks DeepEP refuses)."""
    optimizer_moments: OptimizerMoments = "fp32"
    """Adam's moments as the optimizer keeps them (bf16: Megatron-LM's precision-aware
    optimizer, which shards them: ``zero`` should be ``(1,)``)."""

# --------------------------------------------------------------------------- data


def _edge(layer: LayerGraph, edge: tuple[int, int]) -> EdgeCosts:
    """Resharding of every strategy pair on ``edge``, in whole nanoseconds
    (:func:`planner.sharding.assignment.edge_seconds_matrix`)."""
    src, dst = layer.nodes[edge[0]], layer.nodes[edge[1]]
    seconds = edge_seconds_matrix(layer, edge)
    total = tuple(tuple(round(NS * both) for both, _ in row) for row in seconds)
    forward = tuple(tuple(round(NS * fwd) for _, fwd in row) for row in seconds)
    return EdgeCosts(src=src.name, dst=dst.name, cost_ns=total, forward_ns=forward)


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
        forward_ns=tuple(round(NS * (x.forward_s + x.forward_comm_s)) for x in s),
        attention_ns=tuple(round(NS * x.selective_forward_s) for x in s),
        activation_kib=activation,
        state_kib=tuple(tuple(kib(x.state_bytes[z]) for x in s) for z in range(4)),
        sync_ns=tuple(tuple(round(NS * x.sync_s[z]) for x in s) for z in range(4)),
    )


# --------------------------------------------------------------------------- problem


def layer_graph_of(
    model: ModelSpec, cluster: ClusterSpec, query: LayerQuery, *,
    strategies: StrategiesFn = op_strategies,
) -> LayerGraph:  # fmt: skip
    """``query``'s layer on its mesh, every node with the strategies ``strategies`` gives
    (all of them, by default)."""
    training = training_run(query.seq_length, 1, query.precision, query.stack)
    graph, index = lowered(model, training, query.mesh_micro_batch_size)
    ops = index.ops_by_layer[index.layers_by_kind[query.kind][0]]
    deepep = query.moe_dispatcher == "deepep" and model.moe is not None
    ctx = StrategyContext(cluster=cluster, precision=query.precision,
                          states_precision=cost.states_precision(query.precision, query.stack,
                                                                 query.optimizer_moments),
                          deepep=cost.Routing.of(model) if deepep else None,
                          flash_attention=query.flash_attention,
                          num_microbatches=query.num_microbatches, replicas=query.replicas,
                          tp_comm_overlap=query.tp_comm_overlap,
                          grouped_experts=grouped_experts(query.stack, query.precision),
                          stack=query.stack,
                          expert_load_cv=model.moe.expert_load_cv if model.moe else 0.0)
    return layer_graph(graph, ops, LogicalMesh(query.mesh), ctx, strategies=strategies,
                       transformer=query.kind in TRANSFORMER_KINDS)  # fmt: skip


def layer_problem(
    model: ModelSpec, cluster: ClusterSpec, query: LayerQuery, *, prune: bool = True,
    layer: LayerGraph | None = None,
) -> tuple[LayerProblem, LayerGraph]:  # fmt: skip
    """The numeric problem of ``query``'s layer, without dominated strategies (unless
    ``prune`` is off), with the layer graph it was built from (its nodes hold the strategies
    left); ``layer``: :func:`layer_graph_of` the query, built already."""
    if layer is None:
        layer = layer_graph_of(model, cluster, query)
    edges = tuple(_edge(layer, edge) for edge in layer.edges)
    transformer = query.kind in TRANSFORMER_KINDS
    budget = None if query.memory_budget_gib is None else int(query.memory_budget_gib * GIB / KIB)
    problem = LayerProblem(
        nodes=tuple(_node_costs(n, query, v == 0) for v, n in enumerate(layer.nodes)),
        edges=edges,
        recompute_modes=query.recompute if transformer else ("none",),
        zero_stages=query.zero,
        budget_kib=budget,
    )
    if not prune:
        return problem, layer
    problem, kept = prune_dominated(problem)
    nodes = tuple(Node(ops=n.ops, strategies=tuple(n.strategies[i] for i in k))
                  for n, k in zip(layer.nodes, kept, strict=True))  # fmt: skip
    return problem, replace(layer, nodes=nodes)
