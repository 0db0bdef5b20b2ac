"""Megatron-LM: what it launches, and the ``pretrain_gpt.py`` flags that launch it.

The rules cite NVIDIA/Megatron-LM at commit d98e8a64ddf3 (main, August 2026) and, for the
attention kernels Megatron-Core runs through it, NVIDIA/TransformerEngine at d0067d0da6cb.
ZeRO-1 is Megatron's distributed optimizer; ZeRO-2 and ZeRO-3 are Megatron-FSDP, whose
``optim_grads`` strategy reduce-scatters the gradients on every microbatch and whose
``optim_grads_params`` also all-gathers the parameters for every forward and backward
(``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:166-169``, ``megatron_fsdp.py:761-764``),
as the planner prices them.

Its checks live in :mod:`planner.frameworks._megatron_checks` and are re-exported here:
MindSpeed, which runs Megatron-LM, reuses them with the citations of the Megatron-Core version
it runs on (:mod:`planner.frameworks.mindspeed`). This module pairs each with its source
(:data:`RULES`) and holds the short launcher that composes
:mod:`planner.frameworks._megatron_flags`, which MindSpeed's launcher shares.
"""

from __future__ import annotations

from planner.frameworks import _megatron_flags as mf
from planner.frameworks import _megatron_model_flags as mmf
from planner.frameworks._megatron_checks import (
    bf16_moments,
    context_parallel_sequence,
    deepep_with_capacity,
    expert_parallel_experts,
    fused_attention_precision,
    gpipe_schedule,
    interleaving_chunks,
    interleaving_microbatches,
    interleaving_without_pipeline,
    layer_architecture,
    linear_bias_without_qkv_bias,
    moe_bias_with_tensor_parallel,
    moe_comm_overlap,
    moe_tensor_parallel_without_sp,
    optimizer_offload_with_fsdp,
    optimizer_offload_without_distributed_optimizer,
    param_gather_without_grad_overlap,
    param_gather_without_sharding,
    rank_order,
    recompute_modules,
    sequence_parallel_split,
    sharded_gradients_with_pipeline,
    sharded_gradients_without_overlap,
    sharded_params_without_overlap,
    tp_overlap_without_sp,
    unfused_attention_with_cp,
    window_with_ring_cp,
    zero_bubble_schedule,
    zero_offload,
)
from planner.frameworks._megatron_vocab import padded_vocab, vocab_divisor
from planner.frameworks.base import Launch, Profile, Rule, without_pytorch_context_parallel
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import FUSED_LOSS_STACKS

REPO = "NVIDIA/Megatron-LM@d98e8a64ddf3"
"""The Megatron-LM source the rules and flags were checked against."""
TE = "NVIDIA/TransformerEngine@d0067d0da6cb"
"""The Transformer Engine source of Megatron-Core's fused attention."""
_ARGS = f"{REPO} megatron/training/arguments.py"
_TE_ATTENTION = f"{TE} transformer_engine/pytorch/attention/dot_product_attention/utils.py"


# --- the rules: each check with the source that establishes it ---------------------------------


RULES: tuple[Rule, ...] = (
    # Megatron's --cp-comm-type all_gather is Transformer Engine's own all-gather
    # (AttnFuncWithCPAndKVAllGather, transformer_engine/pytorch/attention/
    # dot_product_attention/context_parallel.py), not PyTorch's, and is not priced.
    Rule(name="pytorch-context-parallel",
         check=without_pytorch_context_parallel("Megatron-LM"),
         source=f"{REPO} megatron/core/extensions/transformer_engine.py:2063-2143"),
    Rule(name="gpipe", check=gpipe_schedule,
         source=f"{REPO} megatron/core/pipeline_parallel/schedules.py:161-168"),
    Rule(name="zero-bubble", check=zero_bubble_schedule,
         source=f"{REPO} megatron/core/pipeline_parallel/schedules.py:161-168; "
                f"megatron/core/transformer/transformer_config.py:3073-3077"),
    Rule(name="zero-2-3-with-pipeline", check=sharded_gradients_with_pipeline,
         source=f"{REPO} docs/user-guide/parallelism-guide.md:78; "
                f"megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:627-638"),
    Rule(name="zero-2-3-grad-overlap", reads_overlaps=True, check=sharded_gradients_without_overlap,
         source=f"{REPO} megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:"
                f"331-333"),
    Rule(name="zero-3-param-overlap", reads_overlaps=True, check=sharded_params_without_overlap,
         source=f"{REPO} megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:"
                f"328-330"),
    Rule(name="param-gather-without-sharding", reads_overlaps=True,
         check=param_gather_without_sharding,
         source=f"{_ARGS}:1024-1027"),
    Rule(name="param-gather-without-grad-overlap", reads_overlaps=True,
         check=param_gather_without_grad_overlap,
         source=f"{_ARGS}:1028-1029"),
    Rule(name="tp-comm-overlap-without-sp", check=tp_overlap_without_sp,
         source=f"{_ARGS}:1441-1442"),
    Rule(name="sp-sequence-split", check=sequence_parallel_split,
         source=f"{REPO} megatron/core/tensor_parallel/mappings.py:72-74"),
    Rule(name="cp-sequence", check=context_parallel_sequence, source=f"{_ARGS}:1335-1338"),
    Rule(name="vpp-without-pipeline", check=interleaving_without_pipeline,
         source=f"{_ARGS}:1000-1004"),
    Rule(name="vpp-microbatches", check=interleaving_microbatches,
         source=f"{REPO} megatron/core/pipeline_parallel/schedules.py:1172-1180; "
                f"megatron/core/model_parallel_config.py:567-568"),
    Rule(name="moe-comm-overlap", check=moe_comm_overlap,
         source=f"{REPO} megatron/core/transformer/transformer_config.py:3002-3037; "
                f"megatron/training/arguments.py:1466-1474"),
    Rule(name="bf16-moments", check=bf16_moments,
         source=f"{REPO} megatron/core/optimizer/__init__.py:1054-1060; "
                f"megatron/core/optimizer/distrib_optimizer.py:1007-1013"),
    Rule(name="deepep-capacity", check=deepep_with_capacity,
         source=f"{REPO} megatron/core/transformer/transformer_config.py:1754-1761"),
    Rule(name="recompute-modules", check=recompute_modules,
         source=f"{REPO} megatron/core/transformer/transformer_config.py:1964-1973, "
                f"1999-2005"),
    Rule(name="vpp-chunks", check=interleaving_chunks,
         source=f"{REPO} megatron/core/transformer/transformer_config.py:2306-2368; "
                f"megatron/core/transformer/transformer_block.py:175-178, 191-201"),
    Rule(name="expert-parallel", check=expert_parallel_experts, source=f"{_ARGS}:1654-1658"),
    Rule(name="moe-tp-without-sp", check=moe_tensor_parallel_without_sp,
         source=f"{REPO} megatron/core/transformer/moe/moe_layer.py:636-640"),
    Rule(name="moe-bias-with-tp", check=moe_bias_with_tensor_parallel,
         source=f"{REPO} megatron/core/transformer/transformer_config.py:2612-2615"),
    Rule(name="bias-without-qkv-bias", check=linear_bias_without_qkv_bias,
         source=f"{_ARGS}:1608-1610"),
    Rule(name="layer-architecture", check=layer_architecture,
         source=f"{REPO} megatron/core/transformer/transformer_layer.py:278-288; "
                f"{_ARGS}:2384-2393; {_ARGS}:2450-2453; "
                f"megatron/core/transformer/transformer_config.py:248-255; "
                f"megatron/core/transformer/multi_token_prediction.py:864-884"),
    Rule(name="rank-order", check=rank_order,
         source=f"{REPO} megatron/training/initialize.py:395"),
    Rule(name="fused-attention-precision", check=fused_attention_precision,
         source=f"{_TE_ATTENTION}:598-644"),
    Rule(name="unfused-attention-with-cp", check=unfused_attention_with_cp,
         source=f"{_TE_ATTENTION}:1169-1173; {REPO} "
                f"megatron/core/transformer/dot_product_attention.py:57-59"),
    Rule(name="window-with-ring-cp", check=window_with_ring_cp,
         source=f"{TE} transformer_engine/pytorch/attention/dot_product_attention/"
                f"context_parallel.py:5054-5060"),
    Rule(name="optimizer-offload-zero-0",
         check=optimizer_offload_without_distributed_optimizer,
         source=f"{_ARGS}:1884-1888; {REPO} megatron/core/optimizer/__init__.py:1057-1060"),
    Rule(name="optimizer-offload-fsdp", check=optimizer_offload_with_fsdp,
         source=f"{REPO} megatron/core/distributed/fsdp/src/docs/optimizer.md:42-44"),
    Rule(name="zero-offload", check=zero_offload,
         source=f"{REPO} megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:150-175"),
)  # fmt: skip
"""Everything Megatron-LM refuses, or cannot run as the planner prices it."""


# --- the launcher --------------------------------------------------------------------------------


def launch(resolved: ResolvedConfig, model: ModelSpec) -> Launch:
    """The configuration as complete ``pretrain_gpt.py`` flags, one per line.

    Only called on configurations no rule of :data:`RULES` refuses.
    """
    flags = [
        *mf.parallel_flags(resolved, model),
        *mf.split_flags(resolved, model),
        *mf.batch_flags(resolved),
        *mmf.model_flags(model, seq_length=resolved.training.seq_length,
                        dispatcher=resolved.config.moe_dispatcher),
        *mmf.grouped_gemm_flags(resolved, model),
        *vocab_flags(model, resolved),
        *mf.precision_flags(resolved),
        *mf.fp8_flags(resolved),
        *mf.loss_flags(resolved),
        *mf.recompute_flags(resolved),
        *optimizer_flags(resolved),
        *mf.offload_flags(resolved),
        *mf.overlap_flags(resolved),
        *attention_flags(resolved),
    ]
    return Launch(text=mf.render(flags), environment=mf.device_connections(resolved),
                  notes=notes(model, resolved))  # fmt: skip


def vocab_flags(model: ModelSpec, resolved: ResolvedConfig) -> list[mf.Flag]:
    """The vocabulary: NullTokenizer builds exactly ``--vocab-size`` entries, which Megatron pads
    to a multiple of ``--make-vocab-size-divisible-by`` x tp (nothing, where it can)."""
    return [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", model.vocab_size),
            ("--make-vocab-size-divisible-by",
             vocab_divisor(model.vocab_size, resolved.config.tp))]  # fmt: skip


def optimizer_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """ZeRO-1 is the distributed optimizer; ZeRO-2/3 are Megatron-FSDP (version 1, which keeps
    the distributed optimizer and checkpoints in its own format)."""
    zero = resolved.config.zero
    if zero == 0:
        return []
    if zero == 1:
        moments: list[mf.Flag] = [("--use-precision-aware-optimizer", None),
                                  ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
        return [("--use-distributed-optimizer", None),
                *(moments if resolved.config.optimizer_moments == "bf16" else [])]
    return [("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", mf.fsdp_sharding_strategy(zero)),
            ("--use-distributed-optimizer", None), ("--ckpt-format", "fsdp_dtensor")]  # fmt: skip


def attention_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """cuDNN fused attention (the backend of Megatron's own Llama-3 examples), or unfused
    attention with the s x s scores kept. Never ``auto``, which may fall back to unfused
    attention where no fused kernel fits and so run something else than was priced."""
    return [("--attention-backend", "fused" if resolved.config.flash_attention else "unfused")]


def notes(model: ModelSpec, resolved: ResolvedConfig) -> tuple[str, ...]:
    """What the user adds, and what the flags do that is worth knowing."""
    fsdp = ("leave CUDA_DEVICE_MAX_CONNECTIONS unset: Megatron-FSDP refuses 1",
            "--ckpt-format fsdp_dtensor: Megatron-FSDP saves and loads only that format "
            f"({REPO} megatron/training/arguments.py:1169-1170); a checkpoint saved under "
            "the distributed optimizer (torch_dist) needs converting before it resumes here")
    c = resolved.config
    if c.tp > 1 or c.cp > 1:
        # megatron/training/arguments.py:1453-1465: before Blackwell
        fsdp += ("Megatron-LM warns against TP or CP with Megatron-FSDP before Blackwell: "
                 "their communication wants CUDA_DEVICE_MAX_CONNECTIONS=1 (to keep its kernels "
                 "in order), which Megatron-FSDP refuses; the tensor- and context-parallel "
                 "traffic may then overlap less than priced (not measured)",)
    return (
        f"for {REPO} pretrain_gpt.py",
        "add the data: --data-path PREFIX --split 99,1,0 (or --mock-data); for real text "
        "replace NullTokenizer and --vocab-size by your tokenizer (--tokenizer-type, "
        f"--tokenizer-model) and add --padded-vocab-size "
        f"{padded_vocab(model.vocab_size, resolved.config.tp)} to keep the embedding the "
        "plan priced",
        "add the run's length, learning-rate schedule, optimizer hyper-parameters and "
        "checkpoint paths",
        "leave NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN unset: Megatron sets them "
        "from --attention-backend and refuses other values",
        *mmf.vocab_notes(model, resolved),
        *(fsdp if resolved.config.zero >= 2 else ()),
    )


PROFILE = Profile(name="megatron", title="Megatron-LM", rules=RULES, launch=launch,
                  moe_comm_overlap=True, folds_experts=True, recompute_modules=True,
                  platforms=("cuda",),
                  platform_source="its layers are Transformer Engine's, NVIDIA/"
                  "TransformerEngine@d0067d0 README.rst:37: NVIDIA GPUs; on Ascend, "
                  "MindSpeed runs Megatron",
                  stacks=("megatron-te", "megatron-te-fp8", *FUSED_LOSS_STACKS))
"""Megatron-LM as a framework target."""
