"""A layer as the ILP and uniform configurations both see it: its nodes (each operator with
the elementwise operators that only follow it folded in), the edges between them, and what
one choice of strategy per node costs, by part.

The ILP (:mod:`planner.ilp.problem`) gives every node all its strategies and turns the edges
into resharding matrices; a uniform configuration (:mod:`planner.sharding.uniform`) gives every
node the one strategy its framework convention assigns. Both are priced here, by the same
functions: :func:`edge_seconds` for resharding, :func:`layer_parts` for the layer. Decoder
layers repeat, so a layer's output feeds the next identical layer's input: that wrap-around
edge keeps one layer valid when tiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from planner import cost
from planner.cost.layer import LayerParts
from planner.graph.fp8 import fp8_copy_ratio
from planner.graph.ops import Op, Tensor
from planner.sharding.context import StrategyContext
from planner.sharding.layout import (
    Layout,
    LogicalMesh,
    Transfer,
    canonical,
    reshard,
    tensor_degrees,
    transfer_time_s,
)
from planner.sharding.strategies import Strategy, follow
from planner.vocabulary import OP_SAC

StrategiesFn = Callable[[Op, LogicalMesh, StrategyContext], list[Strategy]]
"""The strategies a node's leading op may take (all of them, or one assigned)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A node: its ops (the first leads) and their merged strategies."""

    ops: tuple[Op, ...]
    """The leading op, then the ops folded into it (elementwise ops and per-head norms with it as
    their only producer), in order."""
    strategies: tuple[Strategy, ...]
    """The leading op's strategies, each merged with its followers run in its output layout
    (those a follower cannot run in dropped)."""

    @property
    def name(self) -> str:
        """The leading op's name."""
        return self.ops[0].name

    @property
    def output(self) -> Tensor:
        """The last folded op's output."""
        return self.ops[-1].output


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerGraph:
    """One layer's nodes and the producer -> consumer edges between them (by node index)."""

    nodes: tuple[Node, ...]
    """The layer's nodes in topological order; edges and ILP variables index them by position."""
    edges: tuple[tuple[int, int], ...]
    """(producer, consumer) node indices, with a transformer layer's wrap-around edge from its last
    node to the nodes that read the layer's input."""
    mesh: LogicalMesh
    """The logical mesh the strategies run on."""
    context: StrategyContext
    """What the strategies were priced with; resharding on the edges is priced with it too."""


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
        weight_s=a.weight_s + b.weight_s,
        comm_s=a.comm_s + b.comm_s,
        forward_comm_s=a.forward_comm_s + b.forward_comm_s,
        hidden_comm_s=a.hidden_comm_s + b.hidden_comm_s,
        hidden_forward_comm_s=a.hidden_forward_comm_s + b.hidden_forward_comm_s,
        selective_forward_s=a.selective_forward_s + b.selective_forward_s,
        weights=a.weights + b.weights,
        state_bytes=tuple(x + y for x, y in zip(a.state_bytes, b.state_bytes, strict=True)),
        sync_s=tuple(x + y for x, y in zip(a.sync_s, b.sync_s, strict=True)),
        kept_bytes=a.kept_bytes + b.kept_bytes,
        kept_selective_bytes=a.kept_selective_bytes + b.kept_selective_bytes,
        working_bytes=max(a.working_bytes, b.working_bytes),
        gathered_bytes=max(a.gathered_bytes, b.gathered_bytes),
    )  # type: ignore[arg-type]


def layer_graph(
    graph: nx.DiGraph,
    ops: Sequence[Op],
    mesh: LogicalMesh,
    ctx: StrategyContext,
    *,
    strategies: StrategiesFn,
    transformer: bool,
) -> LayerGraph:
    """The nodes of one layer's ``ops`` (of the lowered ``graph``), each leading op with the
    strategies ``strategies`` gives it and its followers run in each one's output layout,
    and the edges between them (with the wrap-around edge of a ``transformer`` layer)."""
    names = {op.name for op in ops}
    producers = {op.name: [p for p in graph.predecessors(op.name) if p in names] for op in ops}
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
            nodes[v] = Node(ops=(*node.ops, op), strategies=tuple(merged))
            owner[op.name] = v
            continue
        owner[op.name] = len(nodes)
        nodes.append(Node(ops=(op,), strategies=tuple(strategies(op, mesh, ctx))))
    edges: list[tuple[int, int]] = []
    for op in ops:
        for p in producers[op.name]:
            pair = (owner[p], owner[op.name])
            if pair[0] != pair[1] and pair not in edges:
                edges.append(pair)
    if transformer:  # the next identical layer consumes this one's output
        outside = [op.name for op in ops
                   if any(q not in names for q in graph.predecessors(op.name))]  # fmt: skip
        last = owner[ops[-1].name]
        edges += [(last, owner[n]) for n in outside if (last, owner[n]) not in edges]
    return LayerGraph(nodes=tuple(nodes), edges=tuple(edges), mesh=mesh, context=ctx)


def input_index(consumer: Op, tensor: Tensor) -> int | None:
    """Which of ``consumer``'s inputs ``tensor`` feeds (matched by canonical dim names)."""
    names = [canonical(n) for n, _ in tensor.dims]
    for k, t in enumerate(consumer.inputs):
        if [canonical(n) for n, _ in t.dims] == names:
            return k
    return None


def edge_seconds(
    layer: LayerGraph, edge: tuple[int, int], *, src: int, dst: int
) -> tuple[float, float]:
    """(forward + backward, forward) seconds of the resharding on ``edge`` when its producer
    runs strategy ``src`` and its consumer strategy ``dst`` (indices into their nodes'
    strategies): the producer's output into the
    consumer's input, and back, the consumer's input gradient into the producer's output
    gradient. Under ``tp_comm_overlap`` a conversion next to a matmul hides behind that
    matmul's compute of the same phase (Megatron-Core's ``--tp-comm-overlap``)."""
    return _total_and_forward(_edge_transfers(layer, edge, src=src, dst=dst))


def edge_hidden_seconds(
    layer: LayerGraph, edge: tuple[int, int], *, src: int, dst: int
) -> tuple[float, float]:
    """(forward + backward, forward) seconds of the resharding on ``edge`` hidden behind a
    matmul under ``tp_comm_overlap`` (:func:`edge_seconds` has the rest)."""
    forward, backward, raw_forward, raw_backward = _edge_transfers(layer, edge, src=src, dst=dst)
    hidden_forward = raw_forward - forward
    return hidden_forward + raw_backward - backward, hidden_forward


def edge_seconds_matrix(
    layer: LayerGraph, edge: tuple[int, int]
) -> list[list[tuple[float, float]]]:
    """:func:`edge_seconds` of every strategy pair on ``edge`` (row: the producer's strategy,
    column: the consumer's). Many pairs convert between the same two layouts, so each
    conversion is priced once."""
    seconds: dict[tuple[Layout, Layout, bool], float] = {}
    return [[_total_and_forward(_edge_transfers(layer, edge, src=i, dst=j, seconds=seconds))
             for j in range(len(layer.nodes[edge[1]].strategies))]
            for i in range(len(layer.nodes[edge[0]].strategies))]  # fmt: skip


def _total_and_forward(transfers: tuple[float, float, float, float]) -> tuple[float, float]:
    forward, backward, _, _ = transfers
    return forward + backward, forward


def _edge_transfers(
    layer: LayerGraph, edge: tuple[int, int], *, src: int, dst: int,
    seconds: dict[tuple[Layout, Layout, bool], float] | None = None,
) -> tuple[float, float, float, float]:  # fmt: skip
    """The resharding on ``edge``: (forward, backward) seconds exposed, then the same two
    as transferred (:func:`edge_seconds`). ``seconds`` keeps each (from, to, in FP8) layout
    conversion's seconds on this edge, for callers pricing many pairs of it."""
    producer, consumer = layer.nodes[edge[0]], layer.nodes[edge[1]]
    at = input_index(consumer.ops[0], producer.output)
    if at is None:  # routing scores: small, moved with the tokens
        return 0.0, 0.0, 0.0, 0.0
    p, c = producer.strategies[src], consumer.strategies[dst]
    mesh, ctx = layer.mesh, layer.context
    known = {} if seconds is None else seconds

    def converted_s(a: Layout, b: Layout, fp8: bool) -> float:
        if (a, b, fp8) not in known:
            transfers = reshard(a, b, producer.output, mesh)
            if fp8:
                transfers = fp8_gathers(transfers, producer.output.element_bytes)
            known[(a, b, fp8)] = transfer_time_s(transfers, ctx.cluster, mesh)
        return known[(a, b, fp8)]

    # Transformer Engine gathers an FP8 linear's input in FP8, and in the backward the
    # gradient of its output (planner.graph.fp8).
    raw_forward = converted_s(p.output, c.inputs[at], consumer.ops[0].fp8)
    raw_backward = converted_s(c.input_grads[at], p.output_grad, producer.ops[-1].fp8)
    forward, backward = raw_forward, raw_backward
    if ctx.tp_comm_overlap:
        matmuls = [s for s, n in ((p, producer), (c, consumer)) if n.ops[0].kind == "linear"]
        forward = cost.exposed_s(raw_forward, sum(s.forward_s for s in matmuls))
        backward = cost.exposed_s(raw_backward, sum(s.backward_s for s in matmuls))
    return forward, backward, raw_forward, raw_backward


def fp8_gathers(transfers: tuple[Transfer, ...], element_bytes: float) -> tuple[Transfer, ...]:
    """``transfers`` of a tensor of ``element_bytes`` an element with their all-gathers in FP8,
    as Transformer Engine runs an FP8 linear's under sequence parallelism
    (``gather_along_first_dim`` with the quantizer: ``transformer_engine/pytorch/module/
    linear.py`` for the input, ``base.py`` ``grad_output_preprocess`` for the output's
    gradient); reductions stay in the compute precision."""
    ratio = fp8_copy_ratio(element_bytes)
    return tuple(replace(t, nbytes=t.nbytes * ratio) if t.kind == "all_gather" else t
                 for t in transfers)  # fmt: skip


def saved_reduction_bytes(layer: LayerGraph, edge: tuple[int, int], *, src: int,
                          dst: int) -> float:
    """The bytes torchtitan's per-operator policy saves of the reduce-scatter on ``edge`` (a
    partial sum scattered along another dim, ``reduce_scatter_tensor`` in its save list), one
    device's share: then neither rerun nor rebuilt for the backward; 0 on any other edge."""
    producer, consumer = layer.nodes[edge[0]], layer.nodes[edge[1]]
    at = input_index(consumer.ops[0], producer.output)
    if at is None:
        return 0.0
    out, into = producer.strategies[src].output, consumer.strategies[dst].inputs[at]
    if not any(a == "P" and b not in ("R", "P") for a, b in zip(out, into, strict=True)):
        return 0.0
    return cost.sharded_bytes(producer.output, tensor_degrees(producer.output, into, layer.mesh))


def context_share(layer: LayerGraph, edge: tuple[int, int], *, src: int, dst: int) -> float:
    """The share of the resharding on ``edge`` (:func:`edge_seconds`) that trades a sequence
    shard for another dim's on an axis, Ulysses's all-to-alls around attention: context-parallel
    communication, where the rest (gathers and reductions of the tensor-parallel splits) is
    tensor-parallel. Weighed on the forward's conversion, whose backward is its mirror."""
    producer, consumer = layer.nodes[edge[0]], layer.nodes[edge[1]]
    at = input_index(consumer.ops[0], producer.output)
    if at is None:
        return 0.0
    a, b = producer.strategies[src].output, consumer.strategies[dst].inputs[at]
    traded = {i for i, (x, y) in enumerate(zip(a, b, strict=True))
              if x != y and "seq" in (x, y) and not {x, y} & {"R", "P"}}  # fmt: skip
    if not traded:
        return 0.0
    transfers = reshard(a, b, producer.output, layer.mesh)
    whole = transfer_time_s(transfers, layer.context.cluster, layer.mesh)
    context = transfer_time_s(tuple(t for t in transfers if t.axis in traded),
                              layer.context.cluster, layer.mesh)  # fmt: skip
    return context / whole if whole > 0 else 0.0


def _checkpointed(node: Node, modules: tuple[str, ...]) -> bool:
    """Whether the node's ops run inside a checkpointed recompute module among ``modules``."""
    return any(op.checkpointed(modules) for op in node.ops)


def _own_comm_axis(node: Node, strategy: Strategy) -> str:
    """Which category an op's own collectives belong to."""
    kind = node.ops[0].kind
    if kind == "attention" and "seq" in strategy.assignment:
        return "cp"
    if kind in ("dispatch", "combine"):
        return "ep"
    return "tp"


def layer_parts(layer: LayerGraph, chosen: Sequence[int]) -> LayerParts:
    """The parts of ``layer`` when node ``v`` runs strategy ``chosen[v]``; they add up to the
    ILP's objective without the gradient sync (:func:`planner.ilp.formulation.evaluate_ns`,
    in seconds rather than whole nanoseconds)."""
    comm = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    rerun = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    hidden = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    hidden_rerun = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    modules = layer.context.recompute_modules
    selective_rerun = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    forward = backward = weight = rerun_selective = kept = selective = layer_input = loss = 0.0
    flops = selective_flops = gathered = 0.0
    weights: list[tuple[float, tuple[int, ...]]] = []
    for v, (node, i) in enumerate(zip(layer.nodes, chosen, strict=True)):
        s = node.strategies[i]
        forward += s.forward_s
        backward += s.backward_s
        weight += s.weight_s
        comm[_own_comm_axis(node, s)] += s.comm_s
        rerun[_own_comm_axis(node, s)] += s.forward_comm_s
        hidden[_own_comm_axis(node, s)] += s.hidden_comm_s
        hidden_rerun[_own_comm_axis(node, s)] += s.hidden_forward_comm_s
        if _checkpointed(node, modules):
            selective_rerun[_own_comm_axis(node, s)] += s.forward_comm_s
        rerun_selective += s.selective_forward_s
        kept += s.kept_bytes
        selective += s.kept_selective_bytes
        loss = max(loss, s.working_bytes)  # only the loss has a backward workspace today
        gathered = max(gathered, s.gathered_bytes)
        if v == 0:
            layer_input = s.input_bytes
        weights += s.weights
        executed = [cost.executed_flops(op, flash_attention=layer.context.flash_attention)
                    for op in node.ops]  # fmt: skip
        flops += sum(e.forward for e in executed)
        selective_flops += sum(e.forward * (1 - op.output_saved(modules))
                               for op, e in zip(node.ops, executed, strict=True)
                               if op.reruns(modules))  # fmt: skip
    for edge in layer.edges:
        total, fwd = edge_seconds(layer, edge, src=chosen[edge[0]], dst=chosen[edge[1]])
        share = context_share(layer, edge, src=chosen[edge[0]], dst=chosen[edge[1]])
        for axis, part in (("tp", 1.0 - share), ("cp", share)):
            comm[axis] += total * part
            rerun[axis] += fwd * part
        inside = [_checkpointed(layer.nodes[v], modules) for v in edge]
        saved = saved_reduction_bytes(layer, edge, src=chosen[edge[0]], dst=chosen[edge[1]]) \
            if OP_SAC in modules and all(inside) else 0.0  # fmt: skip
        selective += saved
        if any(inside) and not saved:
            selective_rerun["tp"] += fwd * (1.0 - share)
            selective_rerun["cp"] += fwd * share
        total, fwd = edge_hidden_seconds(layer, edge, src=chosen[edge[0]], dst=chosen[edge[1]])
        hidden["tp"] += total
        hidden_rerun["tp"] += fwd
    return LayerParts(
        forward_s=forward,
        backward_s=backward,
        weight_s=weight,
        tp_comm_s=comm["tp"],
        cp_comm_s=comm["cp"],
        ep_comm_s=comm["ep"],
        rerun_s=(0.0, rerun_selective, forward),
        rerun_comm_s=(rerun["tp"], rerun["cp"], rerun["ep"]),
        hidden_comm_s=(hidden["tp"], hidden["cp"], hidden["ep"]),
        rerun_hidden_comm_s=(hidden_rerun["tp"], hidden_rerun["cp"], hidden_rerun["ep"]),
        selective_rerun_comm_s=(selective_rerun["tp"], selective_rerun["cp"],
                                selective_rerun["ep"]),
        kept_bytes=(kept, selective, layer_input),
        # the per-operator policy's rerun rebuilds the block's other activations at once;
        # gathered inputs (all-gathered K/V) are held on top while their op runs
        working_bytes=(gathered,
                       gathered + (max(0.0, kept - selective) if OP_SAC in modules else 0.0),
                       gathered + kept),
        loss_bytes=loss,
        rerun_flops=(0.0, selective_flops, flops),
        weights=tuple(weights),
    )
