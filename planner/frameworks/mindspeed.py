"""MindSpeed (Ascend): Megatron-LM's ``pretrain_gpt.py`` with MindSpeed's adaptor imported.

MindSpeed core (Ascend/MindSpeed at 028de58ca629) patches Megatron-LM at ``core_v0.12.1`` and runs
Megatron's own ``parse_args`` and ``validate_args`` before its features' checks
(``mindspeed/core/megatron_basic/arguments_basic.py:37-58``). So it inherits Megatron's rules as
that version states them (cited there), and adds its own. The split flags pass through:
``--decoder-first/last-pipeline-num-layers`` and ``--num-virtual-stages-per-pipeline-rank`` are
core_v0.12.1's (``megatron/training/arguments.py:428-465``), which MindSpeed's basic feature
only reads (``mindspeed/features_manager/megatron_basic/megatron_basic.py:13-21``); MindSpeed-LLM's
``--num-layer-list`` is not used, as it refuses interleaving. ``--pipeline-model-parallel-layout``
is MindSpeed's own, Megatron's flag brought to core_v0.12.1 with the same grammar (its
multi-token-prediction module in a rank's last chunk:
``mindspeed/features_manager/pipeline_parallel/pipeline_model_parallel_layout_feature.py``,
``mindspeed/core/pipeline_parallel/pipeline_model_parallel_layout/layout.py:94-140``), so
DeepSeek-V3's recipe split launches here as under Megatron-LM.

ZeRO-2/3 are core_v0.12.1's Megatron-FSDP (then called custom FSDP), which MindSpeed adapts
(``docs/zh/features/custom_fsdp.md``) with gradient accumulation fusion off.
"""

from __future__ import annotations

from planner.frameworks import _megatron_flags as mf
from planner.frameworks import _megatron_model_flags as mmf
from planner.frameworks import megatron
from planner.frameworks._megatron_vocab import vocab_divisor
from planner.frameworks.base import (
    MULTI_TOKEN_PREDICTION,
    Launch,
    Profile,
    Rule,
    bf16_moments_not_written,
    deepep_not_run,
    moe_comm_in_line,
    unsupported_layers,
    without_pytorch_context_parallel,
)
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

REPO = "Ascend/MindSpeed@028de58ca629"
"""The MindSpeed source the rules and flags were checked against."""
CORE = "NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)"
"""The Megatron-LM MindSpeed runs on."""
_ARGS = f"{CORE} megatron/training/arguments.py"
_CP_FEATURE = f"{REPO} mindspeed/features_manager/context_parallel/context_parallel_feature.py"
_ULYSSES_FEATURE = (f"{REPO} mindspeed/features_manager/context_parallel/"
                    f"ulysses_context_parallel.py")


def layer_architecture(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """core_v0.12.1's TransformerLayer has no post-norms and its arguments have no sliding
    window, no soft-cap and no GeGLU but --swiglu; multi-token prediction is
    --mtp-num-layers."""
    return unsupported_layers(model, framework=f"MindSpeed on {CORE}",
                              supported=frozenset({MULTI_TOKEN_PREDICTION}))


def multi_token_prediction(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """core_v0.12.1's multi-token prediction runs without context parallelism and with rotary
    position embeddings (or none): its ``validate_args`` asserts both (Megatron-LM after it
    takes both)."""
    if model.mtp_layers == 0:
        return None
    cp = resolved.config.cp
    if cp > 1:
        return (f"mtp_layers {model.mtp_layers} with cp({cp}): the Megatron-LM under "
                f"MindSpeed (core_v0.12.1) runs multi-token prediction without context "
                f"parallelism")
    if model.position_embedding != "rope":
        return (f"mtp_layers {model.mtp_layers} with {model.position_embedding} position "
                f"embeddings: the Megatron-LM under MindSpeed (core_v0.12.1) runs "
                f"multi-token prediction with rope or none")
    return None


def moe_bias(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """core_v0.12.1 builds no biased experts at all."""
    if model.moe is None or not model.bias:
        return None
    return (f"{model.name} has experts with linear biases: the Megatron-Core MindSpeed runs on "
            f"(core_v0.12.1) builds no biased experts")


def recompute_modules(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """core_v0.12.1's recompute modules are Megatron-Core's but ``shared_experts``, with its
    checks (:func:`planner.frameworks.megatron.recompute_modules`)."""
    if "shared_experts" in resolved.recompute_modules:
        return ("recompute module shared_experts: the Megatron-Core MindSpeed runs on "
                "(core_v0.12.1) has core_attn, moe_act, layernorm, mla_up_proj, mlp and moe")
    return megatron.recompute_modules(resolved, model)


def tp_comm_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Megatron's TP overlap is Transformer Engine's userbuffers, which Ascend does not have."""
    c = resolved.config
    if not c.tp_comm_overlap or c.tp == 1:
        return None
    return (f"tp_comm_overlap with tp({c.tp}): Megatron's --tp-comm-overlap runs Transformer "
            f"Engine's userbuffers, absent on Ascend, and MindSpeed switches it off; its own TP "
            f"overlap (--use-ascend-mc2, --use-ascend-coc) is another algorithm")


def unfused_attention_with_cp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """MindSpeed's context parallelism, ring or Ulysses, always runs the NPU's fused
    attention."""
    c = resolved.config
    if c.flash_attention or c.cp == 1:
        return None
    how = "Ulysses context parallelism" if c.cp_algo == "ulysses" else "ring attention"
    return (f"context parallelism (cp={c.cp}): MindSpeed's {how} switches fused attention "
            f"on, and the configuration has flash_attention off")


RULES: tuple[Rule, ...] = (
    Rule(name="gpipe", check=megatron.gpipe_schedule,
         source=f"{CORE} megatron/core/pipeline_parallel/schedules.py:106-113"),
    Rule(name="zero-bubble", check=megatron.zero_bubble_schedule,
         source=f"{CORE} megatron/core/pipeline_parallel/schedules.py:106-113"),
    Rule(name="zero-2-3-with-pipeline", check=megatron.sharded_gradients_with_pipeline,
         source=f"{CORE} docs/source/api-guide/custom_fsdp.md:19; "
                f"{REPO} docs/zh/features/custom_fsdp.md:38"),
    Rule(name="zero-2-3-grad-overlap", reads_overlaps=True,
         check=megatron.sharded_gradients_without_overlap,
         source=f"{CORE} megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py:"
                f"146-147"),
    Rule(name="zero-3-param-overlap", reads_overlaps=True,
         check=megatron.sharded_params_without_overlap,
         source=f"{CORE} megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py:"
                f"144-145"),
    Rule(name="param-gather-without-sharding", reads_overlaps=True,
         check=megatron.param_gather_without_sharding,
         source=f"{_ARGS}:502-504"),
    Rule(name="param-gather-without-grad-overlap", reads_overlaps=True,
         check=megatron.param_gather_without_grad_overlap, source=f"{_ARGS}:505-506"),
    Rule(name="tp-comm-overlap", check=tp_comm_overlap,
         source=f"{CORE} megatron/training/initialize.py:236-243; "
                f"{REPO} mindspeed/arguments.py:695-696"),
    Rule(name="sp-sequence-split", check=megatron.sequence_parallel_split,
         source=f"{CORE} megatron/core/tensor_parallel/mappings.py:66-69"),
    Rule(name="cp-sequence", check=megatron.context_parallel_sequence,
         source=f"{_CP_FEATURE}:39-41; {_ARGS}:683-686"),
    Rule(name="vpp-without-pipeline", check=megatron.interleaving_without_pipeline,
         source=f"{_ARGS}:432-435"),
    Rule(name="vpp-microbatches", check=megatron.interleaving_microbatches,
         source=f"{CORE} megatron/core/pipeline_parallel/schedules.py:789-795; "
                f"megatron/core/model_parallel_config.py:389-390"),
    Rule(name="moe-comm-overlap", check=moe_comm_in_line,
         source=f"{CORE} megatron/core/transformer/moe/moe_layer.py:129-149"),
    Rule(name="bf16-moments", check=bf16_moments_not_written,
         source=f"{CORE} megatron/core/optimizer/optimizer_config.py:165-199 (Transformer Engine's "
                f"FusedAdam, which has no Ascend build)"),
    Rule(name="deepep", check=deepep_not_run,
         source=f"{CORE} megatron/core/transformer/moe/fused_a2a.py; deepseek-ai/DeepEP "
                f"README.md (SM80 and SM90 GPUs: no Ascend kernels)"),
    Rule(name="recompute-modules", check=recompute_modules,
         source=f"{CORE} megatron/core/transformer/transformer_config.py:726-745"),
    Rule(name="vpp-chunks", check=megatron.interleaving_chunks,
         source=f"{CORE} megatron/core/transformer/transformer_config.py:790-841; "
                f"megatron/core/transformer/transformer_block.py:136-139, 152-158"),
    Rule(name="expert-parallel", check=megatron.expert_parallel_experts,
         source=f"{_ARGS}:849-853"),
    Rule(name="moe-tp-without-sp", check=megatron.moe_tensor_parallel_without_sp,
         source=f"{CORE} megatron/core/transformer/moe/moe_layer.py:130-137"),
    Rule(name="moe-bias", check=moe_bias,
         source=f"{CORE} megatron/core/transformer/transformer_config.py:945-946"),
    Rule(name="bias-without-qkv-bias", check=megatron.linear_bias_without_qkv_bias,
         source=f"{_ARGS}:787-789"),
    Rule(name="pytorch-context-parallel", check=without_pytorch_context_parallel("MindSpeed"),
         source=f"{REPO} mindspeed/features_manager/context_parallel/"
                f"context_parallel_feature.py:106"),
    Rule(name="layer-architecture", check=layer_architecture,
         source=f"{CORE} megatron/core/transformer/transformer_layer.py:205-213; "
                f"{_ARGS}:1299; {_ARGS}:1311"),
    Rule(name="multi-token-prediction", check=multi_token_prediction,
         source=f"{_ARGS}:961-967"),
    Rule(name="rank-order", check=megatron.rank_order,
         source=f"{CORE} megatron/training/initialize.py:354"),
    Rule(name="unfused-attention-with-cp", check=unfused_attention_with_cp,
         source=f"{_CP_FEATURE}:51; {_ULYSSES_FEATURE}:34; "
                f"{REPO} docs/zh/features/ring-attention-context-parallel.md:43"),
    # Only the distributed optimizer builds its shards for the precision-aware optimizer.
    Rule(name="optimizer-offload-zero-0",
         check=megatron.optimizer_offload_without_distributed_optimizer,
         source=f"{_ARGS}:944-949; {CORE} megatron/core/optimizer/distrib_optimizer.py:"
                f"347-348"),
    # Custom FSDP skips the distributed optimizer's shards, where those are built.
    Rule(name="optimizer-offload-fsdp", check=megatron.optimizer_offload_with_fsdp,
         source=f"{CORE} megatron/core/optimizer/distrib_optimizer.py:493-494"),
    Rule(name="zero-offload", check=megatron.zero_offload,
         source=f"{CORE} megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:150-175"),
)  # fmt: skip
"""Everything MindSpeed refuses, or cannot run as the planner prices it."""


def launch(resolved: ResolvedConfig, model: ModelSpec) -> Launch:
    """The configuration as complete ``pretrain_gpt.py`` flags for MindSpeed, one per line.

    Only called on configurations no rule of :data:`RULES` refuses.
    """
    # How context parallelism attends is MindSpeed's --context-parallel-algo; Megatron's
    # --cp-comm-type selects Transformer Engine's attention, which --transformer-impl local
    # does not run.
    flags = [
        *(f for f in mf.parallel_flags(resolved, model) if f[0] != "--cp-comm-type"),
        *context_parallel_flags(resolved),
        *mf.split_flags(resolved, model),
        *mf.batch_flags(resolved),
        *mmf.model_flags(model, seq_length=resolved.training.seq_length),
        *mmf.grouped_gemm_flags(resolved, model),
        *rope_flags(model),
        *vocab_flags(model, resolved),
        *mf.precision_flags(resolved),
        *mf.recompute_flags(resolved),
        *optimizer_flags(resolved),
        *mf.offload_flags(resolved),
        *mf.overlap_flags(resolved),
        *attention_flags(resolved),
    ]
    return Launch(text=mf.render(flags), environment=mf.device_connections(resolved),
                  notes=notes(model, resolved))  # fmt: skip


def context_parallel_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """How context parallelism attends, always spelled out (the default changed between
    releases): Ulysses all-to-alls as ``ulysses_cp_algo`` (``ulysses_context_parallel.py``
    adds the choice and checks the heads over ``tp x cp``, which the pricing checks too), or
    ring attention as Megatron's (``megatron_cp_algo``), its send and receive overlapped with
    the block compute as the planner prices it."""
    c = resolved.config
    if c.cp == 1:
        return []
    if c.cp_algo == "ulysses":
        return [("--context-parallel-algo", "ulysses_cp_algo")]
    return [("--context-parallel-algo", "megatron_cp_algo"), ("--use-cp-send-recv-overlap", None)]


def rope_flags(model: ModelSpec) -> list[mf.Flag]:
    """The NPU's fused RoPE kernel, without which core_v0.12.1's configuration check refuses
    RoPE fusion (Transformer Engine's kernel is absent on Ascend; with MLA it refuses it
    outright): MindSpeed's feature bypasses that check (``mindspeed/core/fusions/
    fused_rope.py:77-88``), as MindSpeed's own MLA test runs it."""
    return [("--use-fused-rotary-pos-emb", None)] if model.position_embedding == "rope" else []


def vocab_flags(model: ModelSpec, resolved: ResolvedConfig) -> list[mf.Flag]:
    """The vocabulary: core_v0.12.1's NullTokenizer adds an end-of-document token to
    ``--vocab-size``, so one less builds the model's vocabulary exactly."""
    return [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", model.vocab_size - 1),
            ("--make-vocab-size-divisible-by",
             vocab_divisor(model.vocab_size, resolved.config.tp))]  # fmt: skip


def optimizer_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """ZeRO-1 is the distributed optimizer; ZeRO-2/3 are core_v0.12.1's Megatron-FSDP, which
    keeps the distributed optimizer and refuses gradient accumulation fusion."""
    zero = resolved.config.zero
    if zero == 0:
        return []
    if zero == 1:
        return [("--use-distributed-optimizer", None)]
    return [("--use-custom-fsdp", None),
            ("--data-parallel-sharding-strategy", mf.fsdp_sharding_strategy(zero)),
            ("--use-distributed-optimizer", None),
            ("--no-gradient-accumulation-fusion", None)]  # fmt: skip


def attention_flags(resolved: ResolvedConfig) -> list[mf.Flag]:
    """Megatron's local layers: MindSpeed runs their core attention as the NPU's fused
    attention under ``--use-flash-attn`` and unfused without it (its Transformer Engine layers
    need the flag on, ``docs/zh/features/transformer_engine.md:61``, so could not say
    unfused attention)."""
    flags: list[mf.Flag] = [("--transformer-impl", "local")]
    if resolved.config.flash_attention:
        flags.append(("--use-flash-attn", None))
    return flags


def notes(model: ModelSpec, resolved: ResolvedConfig) -> tuple[str, ...]:
    """What the user adds, and what the flags do that is worth knowing."""
    fsdp = ("unset CUDA_DEVICE_MAX_CONNECTIONS: Megatron-FSDP refuses 1",
            "MindSpeed adapts Megatron-FSDP's basic function only and advises against combining "
            f"it with its other features ({REPO} docs/zh/features/custom_fsdp.md)")
    return (
        f"for {REPO} on {CORE}: Megatron-LM's pretrain_gpt.py with "
        "'import mindspeed.megatron_adaptor' after 'import torch'",
        "add the data: --data-path PREFIX --split 99,1,0 (or --mock-data); for real text "
        "replace NullTokenizer and --vocab-size by your tokenizer (--tokenizer-type "
        f"PretrainedFromHF --tokenizer-name-or-path DIR), whose vocabulary must be the model's "
        f"{model.vocab_size}",
        "add the run's length, learning-rate schedule, optimizer hyper-parameters and "
        "checkpoint paths",
        *mmf.vocab_notes(model, resolved),
        *mla_yarn_notes(model, resolved),
        *(fsdp if resolved.config.zero >= 2 else ()),
    )


def mla_yarn_notes(model: ModelSpec, resolved: ResolvedConfig) -> tuple[str, ...]:
    """core_v0.12.1's MLA builds YaRN over ``--max-position-embeddings`` as the original
    context (``megatron/core/transformer/multi_latent_attention.py:94-98``), not the model's
    ``original_max_position_embeddings`` (Megatron-LM later reads its own field)."""
    scaling = model.rope_scaling
    if model.mla is None or scaling is None or scaling.rope_type != "yarn":
        return ()
    positions = mmf.max_positions(model, resolved.training.seq_length)
    original = scaling.original_max_position_embeddings
    if original is None or original == positions:
        return ()
    return (f"core_v0.12.1's MLA takes YaRN's original context from --max-position-embeddings "
            f"({positions}), not the model's {original}: set it to {original} where the "
            f"sequence fits, or the rotary frequencies differ from the model's",)


PROFILE = Profile(name="mindspeed", title="MindSpeed", rules=RULES, launch=launch,
                  folds_experts=True, recompute_modules=True, platforms=("ascend",),
                  platform_source=f"{REPO} mindspeed/megatron_adaptor.py:11 imports "
                  "torch_npu")
"""MindSpeed as a framework target."""
