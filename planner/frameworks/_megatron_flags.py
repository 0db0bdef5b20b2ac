"""Megatron-LM's command line, shared by the Megatron-LM and MindSpeed launchers.

MindSpeed runs Megatron-LM's own ``pretrain_gpt.py`` (on Megatron-Core ``core_v0.12.1``), so both
launchers spell the degrees, the split, the batch and the recomputation with the same flags (and
the model's architecture: :mod:`planner.frameworks._megatron_model_flags`); one function here per
family of flags, each returning :data:`Flag` s in the order a launch script lists them. What
differs between the two (Megatron-FSDP's flags for ZeRO-2/3, the attention and RoPE kernels,
ring attention's algorithm, the tokenizer's vocabulary) each launcher writes itself.

Every flag is checked against ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at
d98e8a64ddf3 and at core_v0.12.1; ``benchmarks/check_megatron_args.py`` feeds the text to
Megatron-LM's own ``parse_args`` and ``validate_args``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from planner.plan.chunks import layout, slots_taken
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import FP8_STACKS, FUSED_LOSS_STACKS

Flag = tuple[str, str | int | float | tuple[str, ...] | None]
"""A flag and its value (None for a switch, a tuple for a list argparse reads word by
word)."""

_FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def render(flags: Sequence[Flag]) -> str:
    """A shell fragment: one flag per line, continued with a backslash, values quoted for the
    shell (a MoE layer pattern such as ``[0]*3+[1]*58`` would otherwise be globbed).

    >>> print(render([("--bf16", None), ("--moe-layer-freq", "[0]*1+[1]*3"),
    ...               ("--recompute-modules", ("moe_act", "layernorm"))]), end="")
    --bf16 \\
    --moe-layer-freq '[0]*1+[1]*3' \\
    --recompute-modules moe_act layernorm
    """

    def words(value: object) -> str:
        values = value if isinstance(value, tuple) else (value,)
        return " ".join(shlex.quote(str(v)) for v in values)

    lines = [name if value is None else f"{name} {words(value)}" for name, value in flags]
    return " \\\n".join(lines) + "\n"


def fsdp_sharding_strategy(zero: int) -> str:
    """Megatron-FSDP's ``--data-parallel-sharding-strategy`` for ZeRO-2 and ZeRO-3."""
    return _FSDP_SHARDING[zero]


def parallel_flags(resolved: ResolvedConfig, model: ModelSpec) -> list[Flag]:
    """Tensor, pipeline, context and expert parallelism, and sequence parallelism."""
    c = resolved.config
    flags: list[Flag] = [("--tensor-model-parallel-size", c.tp),
                         ("--pipeline-model-parallel-size", c.pp)]  # fmt: skip
    if c.cp > 1:
        flags.append(("--context-parallel-size", c.cp))
        if c.cp_algo == "ulysses":
            # Transformer Engine's all-to-all context parallelism (p2p, the ring, is the
            # default): megatron/training/arguments.py, --cp-comm-type.
            flags.append(("--cp-comm-type", "a2a"))
    if model.moe is not None:
        # Expert tensor parallelism is the dense layers' unless folded, said explicitly
        # rather than left to Megatron's default.
        flags += [("--expert-model-parallel-size", c.ep),
                  ("--expert-tensor-parallel-size", resolved.etp or c.tp)]  # fmt: skip
    if resolved.sp:  # Megatron switches sequence parallelism off itself at tp 1
        flags.append(("--sequence-parallel", None))
    return flags


def split_flags(resolved: ResolvedConfig, model: ModelSpec) -> list[Flag]:
    """Interleaving and the uneven first/last stage.

    ``--num-virtual-stages-per-pipeline-rank`` says the interleaving for even and uneven splits
    alike (``--num-layers-per-virtual-pipeline-stage`` refuses an uneven one). The first and last
    stage flags are written as the configuration gives them (Megatron-Core splits the remaining
    layers evenly over the other stages, as the planner does), except the last one of two
    stages, which the first fixes: core_v0.12.1 divides by the number of middle stages, zero.
    An interleaved split whose end stages are a layer short of their chunks' slots is said
    with ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split`` instead (Megatron asserts them exclusive of the
    first/last stage flags: ``megatron/core/transformer/transformer_block.py``
    ``get_num_layers_to_build``, at d98e8a64ddf3 and core_v0.12.1). One whose loss's end is
    short by a slot for each multi-token-prediction module too is said with
    ``--pipeline-model-parallel-layout`` (:func:`~planner.plan.chunks.layout`), which
    Megatron-LM asserts exclusive of the virtual stages' count (``arguments.py:928-939`` at
    d98e8a64ddf3).
    """
    c = resolved.config
    mtp = model.mtp_layers
    embedding, loss = slots_taken(resolved.stage_layers, c.vpp, mtp) if c.vpp > 1 else (False, 0)
    if loss > 1:
        return [("--pipeline-model-parallel-layout", layout(resolved.stage_layers, c.vpp, mtp))]
    flags: list[Flag] = []
    if c.vpp > 1:
        flags.append(("--num-virtual-stages-per-pipeline-rank", c.vpp))
    if embedding or loss:
        return (flags + [("--account-for-embedding-in-pipeline-split", None)] * embedding
                + [("--account-for-loss-in-pipeline-split", None)] * loss)  # fmt: skip
    if c.first_stage_layers is not None:
        flags.append(("--decoder-first-pipeline-num-layers", c.first_stage_layers))
    if c.last_stage_layers is not None and not (c.pp == 2 and c.first_stage_layers is not None):
        flags.append(("--decoder-last-pipeline-num-layers", c.last_stage_layers))
    return flags


def batch_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Microbatch (per data-parallel rank), global batch and sequence length; Megatron derives
    the data-parallel size from the world size and the microbatches from the three."""
    t = resolved.training
    return [("--micro-batch-size", resolved.config.mbs),
            ("--global-batch-size", t.global_batch_size),
            ("--seq-length", t.seq_length)]  # fmt: skip


def precision_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Mixed precision; fp32 is Megatron's default and has no flag."""
    return {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)]}.get(
        resolved.training.precision, []
    )


def fp8_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Transformer Engine's FP8 linears on an FP8 stack (:mod:`planner.graph.fp8`):
    ``--fp8-format hybrid`` (E4M3 forward, E5M2 gradients) and the delayed-scaling recipe the
    planner prices, Megatron-Core's default written out so a later default cannot change it
    (``fp8``, ``fp8_recipe``: ``megatron/core/transformer/transformer_config.py:587-600`` at
    d98e8a6)."""
    if resolved.training.stack not in FP8_STACKS:
        return []
    return [("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")]


def loss_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Megatron-Core's native fused cross entropy on a ``-fused-loss`` stack
    (:data:`~planner.vocabulary.FUSED_LOSS_STACKS`): ``--cross-entropy-loss-fusion``, a field of
    ``ModelParallelConfig`` (``megatron/core/model_parallel_config.py`` at d98e8a6; an argument
    of its own at core_v0.12.1, ``megatron/training/arguments.py:1697``) whose
    ``--cross-entropy-fusion-impl`` defaults to ``native``, the implementation priced
    (``te`` is refused: ``megatron/training/arguments.py:1697-1702`` at d98e8a6)."""
    return [("--cross-entropy-loss-fusion", None)] if (
        resolved.training.stack in FUSED_LOSS_STACKS) else []


def recompute_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Activation recomputation: selective is core attention only (Megatron's default
    ``--recompute-modules``) unless the configuration names its modules; full keeps each
    layer's input and recomputes the whole layer (uniform, one layer per unit), or with
    ``recompute_layers`` only each model chunk's first ones (block:
    ``megatron/core/recompute.py:167-178``, every chunk being a ``TransformerBlock`` of its own
    layers, ``transformer_block.py:334``)."""
    recompute = resolved.config.recompute
    if recompute == "selective" and resolved.config.recompute_modules is not None:
        return [("--recompute-granularity", "selective"),
                ("--recompute-modules", resolved.recompute_modules)]  # fmt: skip
    if recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if recompute == "full" and resolved.config.recompute_layers is not None:
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", resolved.config.recompute_layers)]  # fmt: skip
    if recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", 1)]  # fmt: skip
    return []


def overlap_flags(resolved: ResolvedConfig) -> list[Flag]:
    """Overlap of the data-parallel gradient reduction, the parameter all-gather, the
    tensor-parallel collectives (nothing to overlap at tp 1) and the experts' all-to-alls
    (combined 1F1B)."""
    c = resolved.config
    flags: list[Flag] = []
    if c.overlap_grad_reduce:
        flags.append(("--overlap-grad-reduce", None))
    if c.overlap_param_gather:
        flags.append(("--overlap-param-gather", None))
    if c.tp_comm_overlap and c.tp > 1:
        flags.append(("--tp-comm-overlap", None))
    if c.overlap_moe_expert_parallel_comm:
        flags.append(("--overlap-moe-expert-parallel-comm", None))
    return flags


def offload_flags(resolved: ResolvedConfig) -> list[Flag]:
    """The optimizer in host memory: Megatron-Core's ``HybridDeviceOptimizer`` with all of it
    on the CPU, through the precision-aware optimizer it requires, and its copies and CPU steps
    pipelined, as the planner prices them (:mod:`planner.cost.offload`)."""
    if resolved.config.offload != "optimizer":
        return []
    return [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", 1.0),
            ("--use-precision-aware-optimizer", None),
            ("--overlap-cpu-optimizer-d2h-h2d", None)]  # fmt: skip


def device_connections(resolved: ResolvedConfig) -> dict[str, str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS=1``, which ``validate_args`` asserts with tensor or context
    parallelism before Blackwell (and harmless after), except under Megatron-FSDP (ZeRO-2/3),
    which asserts the opposite, and with the experts' all-to-alls overlapped, which want more
    connections to run beside the compute: 32, as ``validate_args`` advises
    (``megatron/training/arguments.py:1466-1474`` at d98e8a64ddf3)."""
    c = resolved.config
    if c.overlap_moe_expert_parallel_comm:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    if (c.tp > 1 or c.cp > 1) and c.zero < 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}
