"""Megatron-DeepSpeed's ``pretrain_gpt.py`` flags and DeepSpeed's ``ds_config.json`` for one
configuration.

Split from :mod:`planner.frameworks.deepspeed`, whose rules decide what DeepSpeed launches and
whose profile launches with :func:`launch` here; the flags are
deepspeedai/Megatron-DeepSpeed@4efb479's (``megatron/arguments.py``), the config keys
deepspeedai/DeepSpeed@edaa722's.
"""

from __future__ import annotations

import json

from planner.frameworks import _megatron_flags as mf
from planner.frameworks import _megatron_model_flags as mmf
from planner.frameworks._deepspeed_partition import partition_comment
from planner.frameworks._megatron_vocab import padded_vocab, vocab_divisor
from planner.frameworks.base import Launch
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

DS = "deepspeedai/DeepSpeed@edaa722"
"""The DeepSpeed source the rules were checked against."""
MDS = "deepspeedai/Megatron-DeepSpeed@4efb479"
"""The Megatron-DeepSpeed source of the flags."""
_ARGS = f"{MDS} megatron/arguments.py"
_ENGINE = f"{DS} deepspeed/runtime/engine.py"
_PIPE = f"{DS} deepspeed/runtime/pipe/engine.py"
_TRANSFORMER = f"{MDS} megatron/model/transformer.py"

DS_CONFIG_FILE = "ds_config.json"
"""Where the flags tell Megatron-DeepSpeed to read the DeepSpeed config."""
DS_CONFIG_MARK = f"# {DS_CONFIG_FILE}"
"""The line that starts the JSON in :attr:`Launch.text` (the flags come before it)."""


def parallel_flags(resolved: ResolvedConfig, model: ModelSpec) -> list[mf.Flag]:
    """Tensor, pipeline (or ``--no-pipeline-parallel``), DeepSpeed's sequence (Ulysses) and expert
    parallelism (Megatron's sequence parallelism is refused: ``megatron_sequence_parallel``)."""
    c = resolved.config
    flags: list[mf.Flag] = [("--tensor-model-parallel-size", c.tp),
                            ("--pipeline-model-parallel-size", c.pp)]  # fmt: skip
    if c.pp == 1:
        # Without it pp 1 is still a one-stage PipelineModule, whose engine refuses ZeRO-2/3.
        flags.append(("--no-pipeline-parallel", None))
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
        ("--max-position-embeddings", mmf.max_positions(model, resolved.training.seq_length)),
        ("--make-vocab-size-divisible-by", vocab_divisor(model.vocab_size, resolved.config.tp)),
        ("--normalization", model.normalization),
        ("--layernorm-epsilon", model.norm_epsilon),
    ]
    flags += [("--swiglu", None)] * (model.activation == "swiglu")
    if model.position_embedding == "rope":
        # An integer to argparse (megatron/arguments.py:635-637); there is no RoPE scaling
        # (megatron/model/language_model.py:437), which the launch's notes say.
        flags += [("--use-rotary-position-embeddings", None), ("--no-position-embedding", None),
                  ("--rotary-position-embeddings-theta", round(model.rotary_base))]
        # a share of each head rotated (megatron/model/language_model.py:431-432)
        flags += [("--rotary-percent", model.rotary_percent)] * (model.rotary_percent < 1)
    flags += [("--untie-embeddings-and-output-weights", None)] * (not model.tie_word_embeddings)
    flags += [("--disable-bias-linear", None)] * (not model.bias)
    # Both default to 0.1 in Megatron-DeepSpeed: always said.
    flags += [("--hidden-dropout", model.hidden_dropout),
              ("--attention-dropout", model.attention_dropout)]  # fmt: skip
    return flags + moe_flags(model)


def moe_flags(model: ModelSpec) -> list[mf.Flag]:
    """DeepSpeed's MoE layer: experts every ``--expert-interval`` layers (default 2, so always
    said), top-k routing at the model's capacity factor, 1 without one (DeepSpeed always
    drops and pads to a capacity: the balanced share the planner prices then), and the
    optimizer's separate expert parameter group that ZeRO needs."""
    moe = model.moe
    if moe is None:
        return []
    return [("--num-experts", moe.num_experts), ("--topk", moe.top_k),
            ("--expert-interval", moe.layer_freq),
            ("--moe-train-capacity-factor", moe.capacity_factor or 1.0),
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
        # grads); a rule keeps bf16 to ZeRO >= 1, where DeepSpeed accepts it. The reduction
        # runs in bf16, communication_data_type's default for a bf16 run
        # (deepspeed/runtime/engine.py), as the planner prices it (2 bytes a parameter).
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    config["zero_optimization"] = zero_block(resolved)
    if c.pp > 1:
        # The engine sends a 1/tp slice of the activation the TP ranks share and all-gathers
        # it (its default), as the planner prices tensor parallelism without sp.
        sliced = c.tp > 1
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


# --- the launcher --------------------------------------------------------------------------------


def launch(resolved: ResolvedConfig, model: ModelSpec) -> Launch:
    """The ``pretrain_gpt.py`` flags, then (after :data:`DS_CONFIG_MARK`) ``ds_config.json``.

    Only called on configurations no rule of :data:`RULES` refuses.
    """
    flags = [
        *parallel_flags(resolved, model),
        *batch_flags(resolved),
        *model_flags(model, resolved),
        *mf.precision_flags(resolved),
        *recompute_flags(resolved),
        *attention_flags(resolved),
        ("--zero-stage", resolved.config.zero),
        *offload_flags(resolved),
        ("--deepspeed", None),
        ("--deepspeed_config", DS_CONFIG_FILE),
    ]
    text = (f"# pretrain_gpt.py arguments ({MDS} with {DS}){partition_comment(resolved, model)}"
            f"\n{mf.render(flags)}\n"
            f"{DS_CONFIG_MARK}\n{json.dumps(ds_config(resolved), indent=2)}\n")  # fmt: skip
    return Launch(text=text, notes=notes(model, resolved))


def notes(model: ModelSpec, resolved: ResolvedConfig) -> tuple[str, ...]:
    """What the user adds, and what the text does that is worth knowing."""
    factor = model.moe.capacity_factor if model.moe is not None else None
    priced = ("balanced routing as the planner prices it" if factor is None
              else "each expert padded to it as the planner prices it")  # fmt: skip
    moe = (f"the MoE layers drop tokens over each expert's capacity (capacity factor "
           f"{factor or 1.0:g}, {priced})",)
    return (
        f"for {MDS} pretrain_gpt.py run by the deepspeed launcher with {DS}; save the JSON "
        f"after '{DS_CONFIG_MARK}' as {DS_CONFIG_FILE}",
        f"add the data and tokenizer (--data-path, --tokenizer-type, --vocab-file/"
        f"--tokenizer-model): a vocabulary of {model.vocab_size} tokens, which "
        f"--make-vocab-size-divisible-by pads to "
        f"{padded_vocab(model.vocab_size, resolved.config.tp)} rows",
        "add the run's length, learning-rate schedule and optimizer hyper-parameters "
        "(--train-iters, --lr, ...) and checkpoint paths",
        *(moe if model.moe is not None else ()),
        *rope_notes(model, resolved.training.seq_length),
    )


def rope_notes(model: ModelSpec, seq_len: int) -> tuple[str, ...]:
    """Megatron-DeepSpeed's rotary embedding takes a base and nothing else
    (``megatron/model/language_model.py:437``). A static scaling (linear, llama3, YaRN)
    rescales the rotary frequencies at every position (transformers'
    ``modeling_rope_utils``): the checkpoint's positions are not what this launch computes at
    any length. Dynamic NTK scaling changes nothing within the context it stretches from."""
    scaling = model.rope_scaling
    if model.position_embedding != "rope" or scaling is None:
        return ()
    head = (f"Megatron-DeepSpeed has no RoPE scaling: the model's {scaling.rope_type} x"
            f"{scaling.factor:g} is not applied")  # fmt: skip
    original = scaling.original_max_position_embeddings
    beyond = original is not None and seq_len > original
    if scaling.rope_type == "dynamic" and not beyond:
        return (f"{head} (dynamic scaling changes nothing within the original context)",)
    length = (f"; at {seq_len}-token sequences, beyond the {original} it stretches from, the "
              f"unscaled positions are ones the model never saw" if beyond else "")
    return (f"{head}: its rotary frequencies are not the checkpoint's at any length, so a run "
            f"that continues the checkpoint trains another model (one from scratch trains "
            f"plain RoPE){length}",)
