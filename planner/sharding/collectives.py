"""An operator's own collectives under a sharding, beside its compute: context-parallel
attention (ring, or K/V all-gathered as PyTorch runs it), the vocab-parallel loss's
all-reduces, and the experts' all-to-alls or DeepEP's dispatch and combine. The resharding
between operators is :mod:`planner.sharding.assignment`'s."""

from __future__ import annotations

from planner import cost
from planner.graph.ops import Op
from planner.sharding.context import StrategyContext
from planner.sharding.layout import LogicalMesh, tensor_degrees
from planner.sharding.splits import (
    EXPERTS_BY_BATCH,
    Assignment,
    axes_of,
    is_routing,
    routing_sides,
    without,
)


def own_collectives(
    op: Op, pair: Assignment, mesh: LogicalMesh, ctx: StrategyContext, times: cost.OpTime
) -> tuple[float, float, float, float]:
    """Collectives inside the op, each over the group of all the axes that split its dim.

    - Ring attention (context parallelism; PyTorch's all-gathers K/V instead where
      ``ctx.kv_allgather``: :func:`cost.allgather_attention_exposed_s`): each rank passes its
      K/V block around the ring
      while it computes on the block it holds, an all-gather's traffic in forward; backward
      passes K/V around again with their gradients, a reduce-scatter's on top (Transformer
      Engine's ``AttnFuncWithCPAndKVP2P``, ``transformer_engine/pytorch/attention/
      dot_product_attention/context_parallel.py``, which Megatron-Core's context parallelism
      calls), priced per ring step (:func:`cost.ring_attention_exposed_s`): each step's
      transfer hides behind that step's attention compute only.
    - The vocab-parallel cross-entropy: three all-reduces of one fp32 value per token (the
      logits' max, the target logit, the sum of exponentials; Megatron-Core's
      ``megatron/core/tensor_parallel/cross_entropy.py``), none in backward.
    - The experts' all-to-all, forward and backward, or DeepEP's dispatch and combine where
      it runs them (``ctx.deepep``).

    Returns (forward and backward, forward) seconds exposed, then the same two hidden.
    """
    total = forward = 0.0
    hidden = (0.0, 0.0)
    if op.kind == "attention" and "seq" in pair:
        group = mesh.axes_group(axes_of(pair, "seq"))
        kv = _whole_sequence_kv_bytes(op, pair, mesh)
        exposed, hides = ((cost.allgather_attention_exposed_s, cost.allgather_attention_hidden_s)
                          if ctx.kv_allgather else
                          (cost.ring_attention_exposed_s, cost.ring_attention_hidden_s))
        total, forward = exposed(ctx.cluster, kv, group, forward_s=times.forward_s,
                                 backward_s=times.backward_s)  # fmt: skip
        hidden = hides(ctx.cluster, kv, group, forward_s=times.forward_s,
                       backward_s=times.backward_s)  # fmt: skip
    elif op.kind == "loss" and "vocab" in pair:
        axes = axes_of(pair, "vocab")
        per_token = cost.sharded_bytes(op.output, tensor_degrees(op.output, without(pair, axes),
                                                                 mesh))  # fmt: skip
        group = mesh.axes_group(axes)
        total = forward = 3 * cost.collective_time_s(ctx.cluster, "all_reduce", per_token, group)
    elif is_routing(op) and any(d in ("experts", EXPERTS_BY_BATCH) for d in pair):
        axes = axes_of(pair, "experts", EXPERTS_BY_BATCH)
        routed = op.output if op.kind == "dispatch" else op.inputs[0]
        _, routed_layout = routing_sides(pair)
        # One rank's send buffer: its share of the routed tokens (balanced routing).
        per_rank = cost.sharded_bytes(routed, tensor_degrees(routed, routed_layout, mesh))
        group = mesh.axes_group(axes)
        if ctx.deepep is None:
            forward = cost.collective_time_s(ctx.cluster, "all_to_all", per_rank, group)
        else:
            forward = cost.deepep_time_s(ctx.cluster, per_rank, group, ctx.deepep)
        total = 2 * forward
    return total, forward, *hidden


def gathered_kv_bytes(op: Op, pair: Assignment, mesh: LogicalMesh,
                      ctx: StrategyContext) -> float:  # fmt: skip
    """What an attention core holds beyond its kept tensors under PyTorch's context
    parallelism: the whole sequence's K/V its all-gather rotater gathers (held from the first
    attention step to the last, forward and backward), and in backward the K/V gradient
    block it receives beside the one it sends, each in fp32 (twice a bf16 block of ``1/n``
    of the sequence). A ring holds a block or two, which is not counted. The fp32
    accumulators of the rank's own gradients are not counted either."""
    if not ctx.kv_allgather or op.kind != "attention" or "seq" not in pair:
        return 0.0
    cp = mesh.axes_group(axes_of(pair, "seq")).size
    # the gathered sequence, and two fp32 gradient blocks of 1/cp of it in flight
    return _whole_sequence_kv_bytes(op, pair, mesh) * (1 + 2 * cost.GRADIENT_WIDENING / cp)


def _whole_sequence_kv_bytes(op: Op, pair: Assignment, mesh: LogicalMesh) -> float:
    """An attention core's K and V over the whole sequence, as one rank of the axes that split
    the sequence would hold them unsharded (its other splits, heads among them, kept)."""
    axes = axes_of(pair, "seq")
    return sum(cost.sharded_bytes(t, tensor_degrees(t, without(pair, axes), mesh))
               for t in op.inputs[1:])  # fmt: skip
