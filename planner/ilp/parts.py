"""A solved layer taken apart: what its chosen strategies cost, by part, so that the pipeline
pass can price the same sharding under any recomputation mode, ZeRO stage and number of
in-flight microbatches without solving again (the ILP chose the sharding; these choices only
move time and memory between known parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.graph.strategies import Strategy
from planner.ilp.formulation import LayerProblem
from planner.ilp.problem import NS, Node

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class LayerParts:
    """One microbatch through one layer on one device, by part (seconds, bytes, FLOPs)."""

    forward_s: float
    backward_s: float
    tp_comm_s: float
    """Resharding between ops (forward and backward) and the ops' own collectives other than
    the two below (the vocab-parallel loss)."""
    cp_comm_s: float
    """Ring attention's exposed K/V exchange."""
    ep_comm_s: float
    """The experts' all-to-all."""
    rerun_s: tuple[float, float, float]
    """Extra backward time per recomputation mode (none, selective, full): the attention core,
    or the whole forward and its resharding."""
    kept_bytes: tuple[float, float, float]
    """Activations kept per in-flight microbatch, per mode."""
    working_bytes: tuple[float, float, float]
    """The transient peak on top, per mode (one microbatch's activations, rebuilt)."""
    rerun_flops: tuple[float, float, float]
    """FLOPs recomputed per mode (the whole microbatch, not one device's share)."""
    weights: tuple[tuple[float, tuple[int, ...]], ...]
    """Local parameters and the mesh axes holding copies of them."""

    def mode(self, recompute: str) -> int:
        """Index of a recomputation mode in the per-mode tuples."""
        return RECOMPUTE.index(recompute)

    def weight_groups(self) -> tuple[tuple[tuple[int, ...], float], ...]:
        """Parameters summed by the mesh axes holding their copies (one gradient bucket per
        group, as frameworks bucket them)."""
        totals: dict[tuple[int, ...], float] = {}
        for params, axes in self.weights:
            totals[axes] = totals.get(axes, 0.0) + params
        return tuple(sorted(totals.items()))


def _own_comm_axis(node: Node, strategy: Strategy) -> str:
    """Which category an op's own collectives belong to."""
    kind = node.ops[0].kind
    if kind == "attention" and "seq" in strategy.assignment:
        return "cp"
    if kind in ("dispatch", "combine"):
        return "ep"
    return "tp"


def layer_parts(problem: LayerProblem, nodes: Sequence[Node], chosen: Sequence[int]) -> LayerParts:
    """The parts of the layer whose node ``v`` runs strategy ``chosen[v]``; the rerun terms
    are the ones :func:`planner.ilp.formulation.evaluate_ns` adds, so that the parts add up
    to the ILP's objective without the gradient sync."""
    comm = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    forward = backward = attention = kept = selective = layer_input = 0.0
    flops = attention_flops = 0.0
    weights: list[tuple[float, tuple[int, ...]]] = []
    for v, (node, i) in enumerate(zip(nodes, chosen, strict=True)):
        s = node.strategies[i]
        forward += s.forward_s
        backward += s.backward_s
        comm[_own_comm_axis(node, s)] += s.comm_s
        attention += s.attention_forward_s
        kept += s.kept_bytes
        selective += s.kept_selective_bytes
        if v == 0:
            layer_input = s.input_bytes
        weights += s.weights
        flops += sum(op.flops for op in node.ops)
        attention_flops += sum(op.flops for op in node.ops if op.kind == "attention")
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    reshard = reshard_forward = 0
    for edge in problem.edges:
        i, j = chosen[index[edge.src]], chosen[index[edge.dst]]
        reshard += edge.cost_ns[i][j]
        reshard_forward += edge.forward_ns[i][j]
    return LayerParts(
        forward_s=forward,
        backward_s=backward,
        tp_comm_s=comm["tp"] + reshard / NS,
        cp_comm_s=comm["cp"],
        ep_comm_s=comm["ep"],
        rerun_s=(0.0, attention, forward + reshard_forward / NS),
        kept_bytes=(kept, selective, layer_input),
        working_bytes=(0.0, 0.0, kept),
        rerun_flops=(0.0, attention_flops, flops),
        weights=tuple(weights),
    )
