"""Megatron-LM's checks: why it cannot launch a configuration as the planner prices it, or
None. :data:`planner.frameworks.megatron.RULES` pairs each with the Megatron-LM source that
establishes it; MindSpeed, which runs Megatron-LM, reuses them with the citations of the
Megatron-Core version it runs on (:mod:`planner.frameworks.mindspeed`)."""

from __future__ import annotations

from planner.frameworks import _megatron_model_flags as mmf
from planner.frameworks.base import MULTI_TOKEN_PREDICTION, unsupported_layers
from planner.plan.chunks import cuts_into
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import DEFAULT_RANK_ORDER, FP8_STACKS, OP_SAC, RECOMPUTE_MODULES


def gpipe_schedule(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """GPipe (all forwards, then all backwards) is none of Megatron's schedules."""
    if resolved.config.schedule != "gpipe":
        return None
    return (f"schedule gpipe: Megatron-LM has no GPipe schedule; with pp({resolved.config.pp}) "
            f"it runs 1F1B, interleaved 1F1B or, at pp 1, one microbatch's forward and "
            f"backward at a time")  # fmt: skip


def zero_bubble_schedule(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-Core picks between 1F1B and interleaved 1F1B only; its ``delay_wgrad_compute``
    defers weight gradients to overlap the MoE all-to-all, not to fill the pipeline bubble."""
    schedule = resolved.config.schedule
    if schedule not in ("zb-h1", "zb-v") or resolved.config.pp == 1:
        return None
    return (f"schedule {schedule}: Megatron-LM has no zero-bubble pipeline schedule; with "
            f"pp({resolved.config.pp}) it runs 1F1B or interleaved 1F1B")


def sharded_gradients_with_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZeRO-2/3 is Megatron-FSDP, documented with TP, CP and EP but not pipelines."""
    c = resolved.config
    if c.zero < 2 or c.pp == 1:
        return None
    return (f"ZeRO-{c.zero} runs as Megatron-FSDP, which does not run with pipeline "
            f"parallelism: pp({c.pp}) > 1")  # fmt: skip


def sharded_gradients_without_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-FSDP always overlaps the per-microbatch gradient reduce-scatter."""
    c = resolved.config
    if c.zero < 2 or c.overlap_grad_reduce:
        return None
    return (f"ZeRO-{c.zero} runs as Megatron-FSDP, which always overlaps its per-microbatch "
            f"gradient reduce-scatter: the configuration has overlap_grad_reduce off")


def sharded_params_without_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-FSDP always overlaps ZeRO-3's parameter all-gathers."""
    c = resolved.config
    if c.zero != 3 or c.overlap_param_gather:
        return None
    return ("ZeRO-3 runs as Megatron-FSDP, which always overlaps its per-microbatch parameter "
            "all-gathers: the configuration has overlap_param_gather off")


def param_gather_without_sharding(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``--overlap-param-gather`` needs the distributed optimizer (or Megatron-FSDP)."""
    c = resolved.config
    if not c.overlap_param_gather or c.zero > 0:
        return None
    return ("overlap_param_gather with zero(0): a replicated optimizer has no parameter "
            "all-gather to overlap (Megatron needs the distributed optimizer, zero >= 1)")


def param_gather_without_grad_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``--overlap-param-gather`` only runs with ``--overlap-grad-reduce``."""
    c = resolved.config
    if not c.overlap_param_gather or c.overlap_grad_reduce:
        return None
    return "overlap_param_gather without overlap_grad_reduce: Megatron-LM needs both"


def tp_overlap_without_sp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Overlapping TP collectives with GEMMs needs sequence parallelism."""
    c = resolved.config
    if not c.tp_comm_overlap or c.tp == 1 or resolved.sp:
        return None
    return f"tp_comm_overlap with tp({c.tp}) needs sequence parallelism (sp)"


def sequence_parallel_split(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Sequence parallelism splits each rank's tokens evenly over the TP group."""
    c, seq = resolved.config, resolved.training.seq_length
    tokens = seq // c.cp
    if not resolved.sp or tokens % c.tp == 0:
        return None
    return (f"sequence parallelism splits seq_len({seq}) / cp({c.cp}) = {tokens} tokens over "
            f"tp({c.tp}): {tokens} is not divisible by {c.tp}")  # fmt: skip


def context_parallel_sequence(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Load-balanced ring attention cuts the sequence into 2 x cp chunks."""
    c, seq = resolved.config, resolved.training.seq_length
    if c.cp == 1 or seq % (2 * c.cp) == 0:
        return None
    return f"seq_len({seq}) is not divisible by 2 x cp({c.cp}) = {2 * c.cp}"


def interleaving_without_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Virtual stages need pipeline stages."""
    c = resolved.config
    if c.vpp == 1 or c.pp > 1:
        return None
    return f"vpp({c.vpp}) > 1 needs pipeline parallelism: pp({c.pp})"


def interleaving_microbatches(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Interleaved 1F1B runs microbatches in groups of pp (the default group size)."""
    c, m = resolved.config, resolved.num_microbatches
    if c.vpp == 1 or m % c.pp == 0:
        return None
    return (f"interleaved 1F1B runs microbatches in groups of pp({c.pp}): "
            f"num_microbatches({m}) is not a multiple of {c.pp}")


def moe_comm_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Combined 1F1B's conditions (``--overlap-moe-expert-parallel-comm``) beyond a 1F1B
    schedule without full recomputation (the configuration's own rule): interleaving with a
    pipeline, 16-bit compute; and not with Transformer Engine's
    tensor-parallel overlap, which needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` where the
    all-to-alls want more to run beside the compute."""
    c = resolved.config
    if not c.overlap_moe_expert_parallel_comm:
        return None
    if c.pp > 1 and c.vpp == 1:
        return (f"overlap_moe_expert_parallel_comm with pp({c.pp}) needs interleaving "
                f"(vpp > 1)")
    if resolved.training.precision == "fp32":
        return "overlap_moe_expert_parallel_comm needs bf16 or fp16"
    if c.tp_comm_overlap and c.tp > 1:
        return ("overlap_moe_expert_parallel_comm with tp_comm_overlap: the two want "
                "CUDA_DEVICE_MAX_CONNECTIONS 32 and 1")
    return None


def bf16_moments(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The precision-aware optimizer runs inside the distributed optimizer only, and is priced
    there alone: not under Megatron-FSDP (its own main-parameter dtypes) nor with the
    optimizer offloaded (HybridDeviceOptimizer's host states)."""
    c = resolved.config
    if c.optimizer_moments != "bf16":
        return None
    if c.zero == 0:
        return "optimizer_moments bf16 needs the distributed optimizer (zero 1)"
    if c.zero >= 2:
        return (f"optimizer_moments bf16 with zero {c.zero}: Megatron-FSDP keeps its own main "
                f"parameters; the precision-aware optimizer is priced for zero 1")
    if c.offload != "none":
        return "optimizer_moments bf16 with the optimizer offloaded: its host states in bf16 " \
               "are not priced"
    return None


def deepep_with_capacity(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DeepEP's dispatcher does not pad the experts to a capacity, which the launch writes
    for a model with a capacity factor (``--moe-pad-expert-input-to-capacity``)."""
    if resolved.config.moe_dispatcher != "deepep" or model.moe is None:
        return None
    if model.moe.capacity_factor is None:
        return None
    return (f"moe_dispatcher deepep with capacity_factor({model.moe.capacity_factor}): "
            f"Megatron-Core's flex dispatcher on DeepEP does not pad experts to capacity")


def recompute_modules(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-Core's checks on ``--recompute-modules``: ``moe_act`` only with grouped GEMM
    (which the launch turns on for experts in bf16: :func:`~planner.frameworks._megatron_flags.
    grouped_gemm_flags`), ``mla_up_proj`` only with latent attention, neither ``moe_act`` nor
    ``layernorm`` in FP8 with delayed scaling (the recipe the FP8 stack launches)."""
    if resolved.config.recompute_modules is None:
        return None
    modules = resolved.recompute_modules
    if OP_SAC in modules:
        return ("recompute module op: torchtitan's per-operator policy; Megatron-Core's "
                f"--recompute-modules are {', '.join(m for m in RECOMPUTE_MODULES if m != OP_SAC)}")
    discarded = sorted({"moe_act", "layernorm"} & set(modules))
    if discarded and resolved.training.stack in FP8_STACKS:
        return (f"recompute module{'s' * (len(discarded) > 1)} {' and '.join(discarded)} in "
                "FP8: Megatron-Core refuses them with delayed scaling (--fp8-recipe delayed)")
    if "moe_act" in modules and not mmf.grouped_gemm_flags(resolved, model):
        return ("recompute module moe_act needs --moe-grouped-gemm, which runs experts in bf16 "
                f"only: {model.name} in {resolved.training.precision}"
                f"{'' if model.moe else ' has no experts'}")
    if "mla_up_proj" in modules and model.mla is None:
        return f"recompute module mla_up_proj needs latent attention, which {model.name} lacks"
    return None


def interleaving_chunks(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Every stage's layers split into vpp equal model chunks, or every stage's slots with
    the embedding's and the loss's a layer short (``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split``: ``get_num_layers_to_build``)."""
    vpp = resolved.config.vpp
    if cuts_into(resolved.stage_layers, vpp, model.mtp_layers):
        return None
    uneven = sorted({n for n in resolved.stage_layers if n % vpp})
    return (f"interleaved 1F1B splits every stage into vpp({vpp}) equal chunks, the "
            f"embedding's and the loss's slots a layer short: stages of "
            f"{' and '.join(map(str, uneven))} layers do not cut so")


def expert_parallel_experts(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Expert parallelism needs experts, a whole number of them per rank."""
    ep = resolved.config.ep
    if ep == 1:
        return None
    if model.moe is None:
        return f"ep({ep}) > 1 but {model.name} has no experts"
    if model.moe.num_experts % ep:
        return f"num_experts({model.moe.num_experts}) is not divisible by ep({ep})"
    return None


def moe_tensor_parallel_without_sp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-Core trains MoE layers under tensor parallelism only with sequence parallelism."""
    tp = resolved.config.tp
    if model.moe is None or tp == 1 or resolved.sp:
        return None
    return (f"{model.name} has experts and tp({tp}) > 1: Megatron-Core trains MoE layers with "
            f"tensor parallelism only under sequence parallelism (sp)")


def moe_bias_with_tensor_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Biased experts only without expert tensor parallelism (tp, unless folded)."""
    etp = resolved.etp or resolved.config.tp
    if model.moe is None or not model.bias or etp == 1:
        return None
    return (f"{model.name} has experts with linear biases: Megatron-Core supports them only "
            f"with expert tensor parallelism 1, here etp({etp}) (etp 1 folds them)")


def linear_bias_without_qkv_bias(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``--add-bias-linear`` (the default) always adds the QKV bias too."""
    if not model.bias or model.has_qkv_bias:
        return None
    return (f"{model.name} has linear biases but none on QKV: Megatron-LM's linear biases "
            f"always include the QKV projection's")


def layer_architecture(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """A TransformerLayer has input and pre-MLP norms only (no post-norms), the activations
    are GeLU, --swiglu and --quick-geglu (not GeLU-tanh's GeGLU), attention has no soft-cap;
    sliding windows are --window-size with --window-attn-skip-freq; multi-token prediction is
    --mtp-num-layers."""
    return unsupported_layers(model, framework="Megatron-LM", supported=frozenset(
        {"sliding-window attention", MULTI_TOKEN_PREDICTION}))



def rank_order(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron numbers ranks tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp, which the planner forbids)."""
    order = resolved.config.rank_order
    if order == DEFAULT_RANK_ORDER:
        return None
    return f"rank_order {order!r}: Megatron-LM numbers ranks {DEFAULT_RANK_ORDER}"


def fused_attention_precision(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Transformer Engine's flash and fused attention take bf16 or fp16 only."""
    precision = resolved.training.precision
    if not resolved.config.flash_attention or precision != "fp32":
        return None
    return (f"fused attention with precision {precision}: Transformer Engine's flash and fused "
            f"attention take bf16 or fp16 only")


def unfused_attention_with_cp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Context parallelism runs only inside fused attention."""
    cp = resolved.config.cp
    if resolved.config.flash_attention or cp == 1:
        return None
    return (f"context parallelism (cp={cp}) runs only with fused attention: "
            f"flash_attention is off")


def window_with_ring_cp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Transformer Engine's ring (p2p) context parallelism does not attend a sliding window."""
    c = resolved.config
    if model.sliding_window is None or c.cp == 1 or c.cp_algo != "ring":
        return None
    return (f"{model.name} has sliding-window attention: Transformer Engine's context "
            f"parallelism attends a window only with --cp-comm-type a2a or all_gather, not the "
            f"ring (cp={c.cp}, cp_algo ring)")


def optimizer_offload_without_distributed_optimizer(
    resolved: ResolvedConfig, model: ModelSpec
) -> str | None:
    """``--optimizer-cpu-offload`` needs the precision-aware optimizer, which runs only inside
    the distributed optimizer (ZeRO >= 1)."""
    c = resolved.config
    if c.offload != "optimizer" or c.zero >= 1:
        return None
    return ("optimizer offload (--optimizer-cpu-offload) needs --use-precision-aware-optimizer, "
            "which runs only with the distributed optimizer: the configuration has ZeRO-0")


def optimizer_offload_with_fsdp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron-FSDP (ZeRO-2/3) keeps its own optimizer buffers and calls offloading a case
    its optimizer path must coordinate itself: the offload is launched with the distributed
    optimizer (ZeRO-1) only."""
    c = resolved.config
    if c.offload != "optimizer" or c.zero < 2:
        return None
    return (f"optimizer offload runs with the distributed optimizer (ZeRO-1) only: ZeRO-{c.zero} "
            f"is Megatron-FSDP, whose own optimizer buffers the hybrid device optimizer does "
            f"not drive")


def zero_offload(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The hybrid device optimizer copies the gradients to the host in its ``step``, after the
    backward: DeepSpeed's ZeRO-Offload, which copies them as the backward reduces them, is
    not how Megatron-LM runs an offload."""
    if resolved.config.offload != "zero-offload":
        return None
    return ("offload zero-offload (DeepSpeed's): Megatron-LM's --optimizer-cpu-offload copies "
            "the gradients to the host in the optimizer's step, after the backward, not as "
            "they are reduced: use offload optimizer")
