"""Megatron-DeepSpeed's ``pretrain_gpt.py`` flags and DeepSpeed's ``ds_config.json`` for one
configuration.

Split from :mod:`planner.frameworks.deepspeed`, whose rules decide what DeepSpeed launches and
whose :func:`~planner.frameworks.deepspeed.launch` puts these together; the flags are
deepspeedai/Megatron-DeepSpeed@4efb479's (``megatron/arguments.py``), the config keys
deepspeedai/DeepSpeed@edaa722's.
"""

from __future__ import annotations

from planner.frameworks import _megatron_flags as mf
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec


def parallel_flags(resolved: ResolvedConfig, model: ModelSpec) -> list[mf.Flag]:
    """Tensor, pipeline (or ``--no-pipeline-parallel``), sequence and expert parallelism."""
    c = resolved.config
    flags: list[mf.Flag] = [("--tensor-model-parallel-size", c.tp),
                            ("--pipeline-model-parallel-size", c.pp)]  # fmt: skip
    if c.pp == 1:
        # Without it pp 1 is still a one-stage PipelineModule, whose engine refuses ZeRO-2/3.
        flags.append(("--no-pipeline-parallel", None))
    if resolved.sp:
        flags.append(("--sequence-parallel", None))
    if c.cp > 1:
        # Ulysses: the data-parallel size is then world / (tp x pp x cp), as the plan counts.
        flags.append(("--ds-sequence-parallel-size", c.cp))
    if model.moe is not None:
        flags.append(("--moe-expert-parallel-size", c.ep))
    return flags


def batch_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """Microbatch per data-parallel rank, global batch, sequence length (the data-parallel
    size and the microbatches follow from the world size, as ds_config says them too)."""
    t = resolved.training
    return [("--micro-batch-size", resolved.config.mbs),
            ("--global-batch-size", t.global_batch_size), ("--seq-length", t.seq_length)]


def model_flags(model: ModelSpec, resolved: ResolvedConfig) -> list[mf.Flag]:
    """The architecture GPTModel builds; every default that differs from the model is said."""
    flags: list[mf.Flag] = [
        ("--num-layers", model.num_layers),
        ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn),
        ("--num-attention-heads", model.num_attention_heads),
        ("--num-key-value-heads", model.query_groups),
        ("--kv-channels", model.head_dim),
        ("--max-position-embeddings", mf.max_positions(model, resolved.training.seq_length)),
        ("--make-vocab-size-divisible-by", mf.vocab_divisor(model.vocab_size, resolved.config.tp)),
        ("--normalization", model.normalization),
        ("--layernorm-epsilon", model.norm_epsilon),
    ]
    flags += [("--swiglu", None)] * (model.activation == "swiglu")
    if model.position_embedding == "rope":
        # An integer to argparse (megatron/arguments.py:635-637); there is no RoPE scaling
        # (megatron/model/language_model.py:437), which the launch's notes say.
        flags += [("--use-rotary-position-embeddings", None), ("--no-position-embedding", None),
                  ("--rotary-position-embeddings-theta", round(model.rotary_base))]
    flags += [("--untie-embeddings-and-output-weights", None)] * (not model.tie_word_embeddings)
    flags += [("--disable-bias-linear", None)] * (not model.bias)
    # Both default to 0.1 in Megatron-DeepSpeed: always said.
    flags += [("--hidden-dropout", model.hidden_dropout),
              ("--attention-dropout", model.attention_dropout)]  # fmt: skip
    return flags + moe_flags(model)


def moe_flags(model: ModelSpec) -> list[mf.Flag]:
    """DeepSpeed's MoE layer: experts every ``--expert-interval`` layers (default 2, so always
    said), top-k routing at capacity factor 1 (the tokens-per-expert the planner prices), and
    the optimizer's separate expert parameter group that ZeRO needs."""
    moe = model.moe
    if moe is None:
        return []
    return [("--num-experts", moe.num_experts), ("--topk", moe.top_k),
            ("--expert-interval", moe.layer_freq), ("--moe-train-capacity-factor", 1.0),
            ("--create-moe-param-group", None)]  # fmt: skip


def recompute_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """Selective: core attention (unfused path). Full: DeepSpeed's activation checkpointing of
    every transformer layer, each one's input kept (one layer per checkpoint), in both the
    pipeline and the plain model, with the TP-aware RNG tracker DeepSpeed's checkpoint needs."""
    recompute = resolved.config.recompute
    if recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if recompute == "full":
        return [("--checkpoint-activations", None), ("--checkpoint-num-layers", 1),
                ("--deepspeed-activation-checkpointing", None)]  # fmt: skip
    return []


def attention_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """FlashAttention-2 for fused attention; the unfused CoreAttention is the default."""
    return [("--use-flash-attn-v2", None)] if resolved.config.flash_attention else []


def offload_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """ZeRO-Offload's optimizer: ``--cpu-optimizer`` makes Megatron-DeepSpeed build
    DeepSpeedCPUAdam (megatron/optimizer/__init__.py:83-90), the CPU Adam the engine requires
    of a ZeRO-Offload (it raises on another client optimizer: engine.py:2040-2044)."""
    return [("--cpu-optimizer", None)] if resolved.config.offload == "zero-offload" else []


def ds_config(resolved: ResolvedConfig) -> dict[str, object]:
    """``ds_config.json``: batch arithmetic, precision, ZeRO and the pipeline's sends
    (``deepspeed/runtime/config.py:428-441``)."""
    c, t = resolved.config, resolved.training
    config: dict[str, object] = {
        # DeepSpeed checks train_batch_size = micro x accumulation x data-parallel size.
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": c.mbs,
        "gradient_accumulation_steps": resolved.num_microbatches,
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
    }
    if t.precision == "bf16":
        # fp32 gradient accumulation, as the planner prices bf16 training (Megatron's main
        # grads); a rule keeps bf16 to ZeRO >= 1, where DeepSpeed accepts it.
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    config["zero_optimization"] = zero_block(resolved)
    if c.pp > 1:
        # The engine sends a 1/tp slice and all-gathers it (its default), as the planner prices
        # tensor parallelism without sp; with sp each rank's sequence shard goes as it is (a
        # slice of tensors that differ over the TP group could not be gathered back).
        sliced = c.tp > 1 and not resolved.sp
        config["pipeline"] = {"pipe_partitioned": sliced, "grad_partitioned": sliced}
    return config


def zero_block(resolved: ResolvedConfig) -> dict[str, object]:
    """``zero_optimization``: the stage, its overlap said explicitly (ZeRO-3 defaults it on, the
    others off; the pipeline engine turns it off), and ZeRO-Offload's ``offload_optimizer``."""
    c = resolved.config
    block: dict[str, object] = {"stage": c.zero}
    if c.zero == 0:
        return block
    overlap = c.overlap_grad_reduce or (c.zero == 3 and c.overlap_param_gather)
    block["overlap_comm"] = overlap and c.pp == 1
    if c.offload == "zero-offload":
        # Pinned host buffers, as the copies are priced (DeepSpeed's default, said anyway).
        block["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if c.zero == 3 and not c.overlap_param_gather:
        block["stage3_prefetch_bucket_size"] = 0  # no prefetch: the gathers stay exposed
    return block
