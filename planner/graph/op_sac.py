"""torchtitan's per-operator selective activation checkpointing on the operator graph: which
ops of a dense or MoE block it checkpoints and what share of each op's output it saves
(:data:`~planner.vocabulary.OP_SAC`); what that keeps and reruns is priced by
:mod:`planner.cost.activations` and :mod:`planner.sharding.strategies` like any recompute
module."""

from __future__ import annotations

from dataclasses import replace

from planner.graph.builder import LayerBuilder
from planner.vocabulary import COMPILED_STACKS, OP_SAC


def per_operator_checkpoint(b: LayerBuilder, first: int) -> None:
    """Tag the block's ops (``b.ops[first:]``) for torchtitan's per-operator policy
    (:data:`~planner.vocabulary.OP_SAC`): the block is checkpointed, its input kept, and the
    policy saves the attention core's output and every other matmul's, the first, third, ...
    of the block's in the order it runs them (``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w3``,
    ``w2``): the outputs of ``_op_sac_save_list``'s ops but the even-numbered ``mm``s
    (``torchtitan/distributed/activation_checkpoint.py:98-122`` and
    ``torchtitan/models/llama3/infra/parallelize.py:36-51`` at v0.2.2). A fused projection
    saves the share of its output its saved matmuls write.

    In an MoE block nothing of the MoE layer is saved but its shared experts' odd matmuls:
    the router's gate is forced to recompute and left out of the count
    (``per_op_sac_force_recompute_mm_shapes_by_fqns``' default, ``moe.router.gate``,
    ``torchtitan/config/job_config.py:661``), the routed experts run ``torch._grouped_mm`` and
    their dispatch ``all_to_all_single``, neither in Qwen3's save list
    (``torchtitan/models/qwen3/infra/parallelize.py:39-55``), so they and the combine run
    again; the shared experts run after the routed ones (``torchtitan/models/moe/moe.py:
    521-523``), their ``w1``, ``w3``, ``w2`` the block's fifth to seventh ``mm``.

    Compiled (:data:`~planner.vocabulary.COMPILED_STACKS`), the policy marks what may be saved
    and Inductor's partitioner saves only what the backward reads: not ``w2``'s output, which
    only the residual add after it takes, and which the backward does not run again either
    (:attr:`~planner.graph.ops.Op.output_unread`; ``benchmarks/compiled_layer_kept.py
    --op-sac``: the compiled block keeps 2h bytes a token less than the eager one's cache)."""
    m = b.model
    glu = 2 if m.gated_mlp else 1
    heads, groups, d = m.num_attention_heads, m.query_groups, m.head_dim
    shared = m.moe.shared_ffn if m.moe is not None else 0
    # each projection's matmuls, by output width, in torchtitan's order
    matmuls = {"qkv_proj": (heads * d, groups * d, groups * d), "out_proj": (m.hidden_size,),
               "mlp_up": (m.ffn,) * glu, "mlp_down": (m.hidden_size,),
               "shared_up": (shared,) * glu, "shared_down": (m.hidden_size,)}  # fmt: skip
    # compiled, what the backward never reads is not saved: the down projections' outputs
    unread = ("mlp_down", "shared_down") if b.stack in COMPILED_STACKS else ()
    count = 0
    for i in range(first, len(b.ops)):
        op, sources = b.ops[i]
        local = op.name.removeprefix(b.name(""))
        saved = 1.0 if op.kind == "attention" else 0.0
        if local in matmuls:
            widths = matmuls[local]
            odd = sum(w for j, w in enumerate(widths, start=count + 1) if j % 2 == 1)
            count += len(widths)
            saved = odd / sum(widths)
        b.ops[i] = (replace(op, checkpointed_by=(*op.checkpointed_by, OP_SAC),
                             checkpoint_input_of=(*op.checkpoint_input_of, OP_SAC)
                             if i == first else op.checkpoint_input_of,
                             saves_output=saved, output_unread=local in unread),
                     sources)  # fmt: skip
