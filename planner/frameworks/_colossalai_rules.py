"""Colossal-AI's rules: why a configuration cannot be launched, or cannot run as the planner
prices it, each check citing the Colossal-AI source that establishes it.

Split from :mod:`planner.frameworks.colossalai`, whose profile restricts the search with
:data:`RULES`; the rules cite hpcaitech/ColossalAI at 4f9953b (main, v0.5.1 + 149 commits).
"""

from __future__ import annotations

from planner.frameworks._colossalai_models import HF_CLASSES, REPO, Family, family
from planner.frameworks.base import (
    Rule,
    bf16_moments_not_written,
    data_parallel_sync,
    deepep_not_run,
    moe_comm_in_line,
    ranks_in_order,
    sequence_split_over_tp,
    unsupported_layers,
    without_pytorch_context_parallel,
)
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import counted

_PLUGIN = f"{REPO} colossalai/booster/plugin/hybrid_parallel_plugin.py"
_MOE_PLUGIN = f"{REPO} colossalai/booster/plugin/moe_hybrid_parallel_plugin.py"

_RING_ATTENTION: frozenset[Family] = frozenset({"llama", "gpt2"})
"""Architectures whose attention forward calls ``RingAttention.attention``."""
_ALL_TO_ALL: frozenset[Family] = frozenset({"llama", "qwen2", "qwen3"})
"""Dense architectures whose attention forward runs the ``all_to_all`` mode (GPT-2's policy
asserts it away; Mixtral's runs under ``MoeHybridParallelPlugin``)."""
_EVERY_LAYER_CHECKPOINTED: frozenset[Family] = frozenset({"gpt2", "mixtral"})
"""Architectures whose forward checkpoints every layer, ignoring ``num_ckpt_layers_per_stage``."""
_SPLIT_GATHER_RING: frozenset[Family] = frozenset({"llama", "qwen2", "qwen3"})
"""Policies that hand the sequence-parallel mode to every projection (so ``ring`` runs)."""


# --- checks: why a configuration cannot be launched, or None --------------------------------


def architecture(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Shardformer needs a policy for the model's Hugging Face class; auto_policy.py has none
    for Gemma 2/3 or Phi-3, and the classes the planner builds attend globally."""
    layers = unsupported_layers(model, framework="Colossal-AI's Shardformer policies the "
                                "planner exports")  # fmt: skip
    if layers is not None:
        return layers
    if family(model) is not None:
        return None
    qwen3_moe = model.moe is not None and model.qk_layernorm
    what = " (none for Qwen3-MoE)" if qwen3_moe else ""
    return (f"{model.name}: no Shardformer policy builds this architecture{what}; the policies "
            f"are GPT-2's, Llama's, Qwen2's and Qwen3's (dense), Mixtral's (experts on every "
            f"layer, no shared experts) and DeepSeek-V3's (latent attention and experts "
            f"routed by sigmoid scores with the aux-loss-free bias)")


def deepseek_v3_tensor_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The DeepSeek-V3 policy asserts no tensor and no sequence parallelism."""
    tp = resolved.config.tp
    if tp == 1 or family(model) != "deepseek_v3":
        return None
    return (f"tp({tp}): Colossal-AI's DeepSeek-V3 policy refuses tensor (and sequence) "
            f"parallelism; it shards experts (ep) and stages (pp) only")


def deepseek_v3_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The DeepSeek-V3 forward checkpoints every layer but the model's first."""
    if resolved.config.recompute == "none" or family(model) != "deepseek_v3":
        return None
    return ("recompute with DeepSeek-V3: Colossal-AI's forward checkpoints every layer but the "
            "model's first (i > 0) and reads no per-stage count, which the planner does not "
            "price")


def zero_stage_3(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The plugin's ZeRO stops at stage 2."""
    if resolved.config.zero != 3:
        return None
    return "ZeRO-3: HybridParallelPlugin takes zero_stage 0, 1 or 2"


def zero_with_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """With a pipeline the plugin allows ZeRO-0 and ZeRO-1 only."""
    c = resolved.config
    if c.pp == 1 or c.zero != 2:
        return None
    return f"ZeRO-2 with pp({c.pp}): the plugin takes zero_stage 0 or 1 with pipelines"


def zero_precision(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZeRO runs in fp16 or bf16 only."""
    c = resolved.config
    if c.zero == 0 or resolved.training.precision != "fp32":
        return None
    return f"ZeRO-{c.zero} with fp32: the plugin's ZeRO optimizer takes fp16 or bf16 only"


def gpipe(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The plugin's pipeline styles are 1F1B, interleaved 1F1B and zero-bubble V."""
    c = resolved.config
    if c.pp == 1 or c.schedule != "gpipe":
        return None
    return f"GPipe with pp({c.pp}): Colossal-AI pipelines with 1f1b or interleaved 1F1B only"


def one_f_one_b_microbatches(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``OneForwardOneBackwardSchedule.load_batch`` asserts at least as many microbatches as
    stages (the interleaved schedule asks for a multiple of them, as every plan's rule does)."""
    c, m = resolved.config, resolved.num_microbatches
    if c.pp == 1 or c.vpp > 1 or m >= c.pp:
        return None
    return (f"1f1b with pp({c.pp}) and {counted(m, 'microbatch', 'microbatches')}: "
            f"Colossal-AI's 1F1B schedule asserts "
            f"at least as many microbatches as stages")


def zero_bubble(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """There is no ZB-H1 style; ``pp_style="zbv"`` runs the order ``scheduler_nodes`` gives,
    which ``PipelineGraph.get_v_schedule()`` searches for from profiled pass costs and a
    memory limit, not PyTorch's fixed ZB-V order that the planner prices."""
    c = resolved.config
    if c.pp == 1 or c.schedule not in ("zb-h1", "zb-v"):
        return None
    if c.schedule == "zb-h1":
        return (f"zb-h1 with pp({c.pp}): Colossal-AI's pipeline styles are 1f1b, interleaved "
                f"and zbv")
    return (f"zb-v with pp({c.pp}): Colossal-AI's zbv runs the order PipelineGraph searches "
            f"for from measured pass costs, not the fixed ZB-V order the planner prices")


def interleaved_uneven_split(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """num_layers_per_stage takes one count per rank but is read per model chunk: with
    interleaving only the default even split runs, equal chunks (not the embedding's and the
    loss's slots short, as Megatron-Core cuts them)."""
    c, layers = resolved.config, resolved.stage_layers
    if c.vpp == 1 or (len(set(layers)) <= 1 and all(n % c.vpp == 0 for n in layers)):
        return None
    return (f"interleaving (vpp={c.vpp}) with stages of {list(layers)} layers: Colossal-AI "
            f"splits interleaved pipelines evenly only (num_layers_per_stage must have pp "
            f"entries but is indexed per model chunk)")  # fmt: skip


def selective_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Gradient checkpointing recomputes whole decoder layers."""
    if resolved.config.recompute != "selective":
        return None
    return ("selective recompute: Colossal-AI checkpoints whole decoder layers; it cannot "
            "recompute core attention alone")


def partial_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Some layers per (virtual) stage checkpoint only under pipelines (the count is read
    through the stage manager) and only where the modeling reads the count."""
    n, fam = resolved.config.recompute_layers, family(model)
    if n is None:
        return None
    if resolved.config.pp == 1:
        return (f"recompute_layers({n}) without a pipeline: Colossal-AI reads the count per "
                f"stage through the pipeline's stage manager")
    if fam in _EVERY_LAYER_CHECKPOINTED:
        return (f"recompute_layers({n}): {HF_CLASSES[fam]}'s Colossal-AI forward checkpoints "
                f"every layer; it reads no count")
    return None


def context_parallel_model(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Ring attention runs in the Llama and GPT-2 attention forwards only; the all-to-all
    mode (Ulysses) in Llama's, Qwen2's and Qwen3's."""
    c, fam = resolved.config, family(model)
    if c.cp == 1 or fam is None or model.moe is not None:
        return None
    if c.cp_algo == "ulysses" and fam not in _ALL_TO_ALL:
        return (f"cp({c.cp}) as Ulysses all-to-alls: Colossal-AI's all_to_all mode runs in the "
                f"Llama, Qwen2 and Qwen3 attention only, not in {HF_CLASSES[fam]}'s")
    if c.cp_algo == "ring" and fam not in _RING_ATTENTION:
        return (f"cp({c.cp}): Colossal-AI's ring attention (ring_attn) runs in the Llama and "
                f"GPT-2 attention only, not in {HF_CLASSES[fam]}'s")
    return None


def ring_attention_with_sp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """One sequence-parallel mode at a time: ring_attn or all_to_all for cp, or split_gather
    for sp, not both."""
    c = resolved.config
    if c.cp == 1 or not resolved.sp:
        return None
    mode = "all_to_all" if c.cp_algo == "ulysses" else "ring_attn"
    return (f"cp({c.cp}) with sp: the plugin runs one sequence_parallelism_mode, {mode} for "
            f"cp or split_gather for sp, not both")  # fmt: skip


def ring_attention_unfused(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ring_attn switches flash attention on (all_to_all leaves it as given)."""
    c = resolved.config
    if c.cp == 1 or c.cp_algo != "ring" or c.flash_attention:
        return None
    return f"cp({c.cp}) without flash attention: Colossal-AI's ring attention is flash attention"


def moe_capacity(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The expert-parallel MoE blocks send every routed token, however many an expert gets
    (``all_to_all_uneven`` of per-expert counts): no capacity to pad or drop to."""
    if model.moe is None or model.moe.capacity_factor is None:
        return None
    return (f"moe capacity_factor {model.moe.capacity_factor:g}: Colossal-AI's expert-parallel "
            f"MoE blocks are dropless (no capacity factor)")


def moe_zero_2(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """MoeHybridParallelPlugin turns ZeRO-2 into ZeRO-1."""
    if model.moe is None or resolved.config.zero != 2:
        return None
    return "ZeRO-2 with experts: MoeHybridParallelPlugin turns zero_stage 2 into 1"


def moe_grad_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """MoeHybridParallelPlugin turns overlap_communication off."""
    c = resolved.config
    if (model.moe is None or c.zero == 0 or not c.overlap_grad_reduce
            or not data_parallel_sync(resolved)):  # fmt: skip
        return None
    return ("overlap_grad_reduce with experts: MoeHybridParallelPlugin turns "
            "overlap_communication off (it can hang when an expert gets no tokens)")


def moe_ring_attention(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """MoeHybridParallelPlugin has no ring_attn mode; its all_to_all mode numbers ranks ep,
    tp, sp around its own data-parallel groups, which this launcher does not write."""
    c = resolved.config
    if model.moe is None or c.cp == 1:
        return None
    if c.cp_algo == "ulysses":
        return (f"cp({c.cp}) as Ulysses all-to-alls with experts: MoeHybridParallelPlugin's "
                f"all_to_all mode is not written by the planner's Colossal-AI launch yet")
    return f"cp({c.cp}) with experts: MoeHybridParallelPlugin has no ring_attn mode"


def moe_sequence_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Mixtral's policy builds its projections without the sequence-parallel mode and refuses
    it with pipelines."""
    if model.moe is None or not resolved.sp:
        return None
    return ("sp with experts: Colossal-AI's Mixtral policy does not run Megatron-style "
            "sequence parallelism (its projections get no sequence-parallel mode, and it "
            "refuses sequence parallelism with pipelines)")


def moe_ddp_with_ep(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Without ZeRO or pipelines the MoE plugin wraps the model in DDP, which cannot reduce
    experts over their own (smaller) data-parallel group."""
    c = resolved.config
    if model.moe is None or c.zero > 0 or c.pp > 1 or c.ep == 1 or resolved.dp == 1:
        return None
    return (f"zero(0) without pipelines and ep({c.ep}): MoeHybridParallelPlugin then uses "
            f"PyTorch DDP, which refuses experts reduced over dp({resolved.dp}) / ep({c.ep})")


def tp_comm_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """TP overlap is the ``ring`` mode, which only the Llama and Qwen policies run."""
    c = resolved.config
    if not c.tp_comm_overlap or c.tp == 1 or family(model) in _SPLIT_GATHER_RING:
        return None
    return (f"tp_comm_overlap with tp({c.tp}): Colossal-AI overlaps TP communication with the "
            f"GEMMs in sequence_parallelism_mode 'ring', which the Llama and Qwen policies run "
            f"and this model's does not")  # fmt: skip


def pipeline_send_without_sp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Stages send their whole output: without sp every TP rank sends the full hidden state,
    where the planner prices a 1/tp slice and an all-gather (or, with sp, the shard)."""
    c = resolved.config
    if c.pp == 1 or c.tp == 1 or resolved.sp:
        return None
    return (f"pp({c.pp}) with tp({c.tp}) and no sp: Colossal-AI's stages send the whole hidden "
            f"state from every TP rank, not a 1/tp slice gathered after the send")


def grad_overlap_with_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """With pipelines the plugin reduces gradients after the whole schedule."""
    c = resolved.config
    if c.pp == 1 or not c.overlap_grad_reduce or not data_parallel_sync(resolved):
        return None
    return (f"overlap_grad_reduce with pp({c.pp}): Colossal-AI reduces gradients after the "
            f"pipeline schedule, not during the last backward")


def ddp_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Without ZeRO or pipelines the plugin is PyTorch DDP, whose bucketed all-reduce always
    overlaps the backward."""
    c = resolved.config
    if c.zero > 0 or c.pp > 1 or c.overlap_grad_reduce or not data_parallel_sync(resolved):
        return None
    return ("zero(0) without pipelines is PyTorch DDP, which always overlaps its gradient "
            "all-reduce with the backward: overlap_grad_reduce is off")


def rank_order(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``dp_outside=False`` numbers ranks tp fastest, then cp (sp_size), dp, pp; under the
    all_to_all mode sp_size fastest, then tp, which splits the context-, expert- and
    data-parallel block the planner's rank orders keep whole
    (:func:`planner.placement.ranks.megatron_order`): Ulysses only without tp."""
    c = resolved.config
    if c.cp > 1 and c.cp_algo == "ulysses" and c.tp > 1:
        return (f"cp({c.cp}) as Ulysses all-to-alls with tp({c.tp}): Colossal-AI's all_to_all "
                f"mode numbers its sp_size ranks fastest, then tp, an order the planner does "
                f"not price (it keeps the context-, expert- and data-parallel ranks together)")
    if ranks_in_order(resolved, ("tp", "cp", "dp", "pp")):
        return None
    return f"rank_order {c.rank_order!r}: Colossal-AI numbers ranks tp, then cp, dp, pp"



def optimizer_offload(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``HybridParallelPlugin(cpu_offload=True)`` hands the offload to its ZeRO optimizer,
    whose CPU step is not the pipelined one the planner prices; not written yet."""
    if resolved.config.offload == "none":
        return None
    return ("optimizer offload: Colossal-AI's cpu_offload (its ZeRO optimizer's) is not "
            "priced; Megatron-LM's pipelined offload is")


RULES: tuple[Rule, ...] = (
    Rule(name="architecture", check=architecture,
         source=f"{REPO} colossalai/shardformer/policies/auto_policy.py:59-229"),
    Rule(name="moe-comm-overlap", check=moe_comm_in_line,
         source=f"{REPO} colossalai/shardformer/modeling/mixtral.py:123-200"),
    Rule(name="bf16-moments", check=bf16_moments_not_written,
         source=f"{REPO} colossalai/nn/optimizer/hybrid_adam.py (fp32 moments)"),
    Rule(name="deepep", check=deepep_not_run,
         source=f"{REPO} colossalai/shardformer/modeling/mixtral.py:123-200"),
    Rule(name="moe-capacity", check=moe_capacity,
         source=f"{REPO} colossalai/shardformer/modeling/mixtral.py:123-158; "
                f"colossalai/shardformer/modeling/deepseek_v3.py:86-100"),
    Rule(name="deepseek-v3-tensor-parallel", check=deepseek_v3_tensor_parallel,
         source=f"{REPO} colossalai/shardformer/policies/deepseek_v3.py:18-22"),
    Rule(name="deepseek-v3-recompute", check=deepseek_v3_recompute,
         source=f"{REPO} colossalai/shardformer/modeling/deepseek_v3.py:245-254"),
    Rule(name="zero-3", check=zero_stage_3, source=f"{_PLUGIN}:1122"),
    Rule(name="zero-2-with-pipeline", check=zero_with_pipeline, source=f"{_PLUGIN}:1134-1136"),
    Rule(name="zero-precision", check=zero_precision, source=f"{_PLUGIN}:1361"),
    Rule(name="gpipe", check=gpipe, source=f"{_PLUGIN}:1124"),
    Rule(name="one-f-one-b-microbatches", check=one_f_one_b_microbatches,
         source=f"{REPO} colossalai/pipeline/schedule/one_f_one_b.py:93-95"),
    Rule(name="zero-bubble", check=zero_bubble,
         source=f"{_PLUGIN}:1056-1058; {_PLUGIN}:1124; {_PLUGIN}:1169-1175; "
                f"{REPO} colossalai/pipeline/schedule/v_schedule.py:46-60"),
    Rule(name="interleaved-uneven-split", check=interleaved_uneven_split,
         source=f"{REPO} colossalai/pipeline/stage_manager.py:41-42; "
                f"colossalai/pipeline/stage_manager.py:100-102"),
    Rule(name="selective-recompute", check=selective_recompute,
         source=f"{REPO} colossalai/shardformer/modeling/llama.py:183-209"),
    Rule(name="partial-recompute", check=partial_recompute,
         source=f"{REPO} colossalai/shardformer/modeling/llama.py:183-199; "
                f"colossalai/shardformer/shard/grad_ckpt_config.py:67-78; "
                f"colossalai/shardformer/modeling/gpt2.py:267; "
                f"colossalai/shardformer/modeling/mixtral.py:364"),
    Rule(name="context-parallel-model", check=context_parallel_model,
         source=f"{REPO} colossalai/shardformer/modeling/llama.py:555; "
                f"colossalai/shardformer/modeling/gpt2.py:864; "
                f"colossalai/shardformer/modeling/llama.py:522-525; "
                f"colossalai/shardformer/policies/gpt2.py:56"),
    Rule(name="ring-attention-with-sp", check=ring_attention_with_sp,
         source=f"{_PLUGIN}:1059-1087"),
    Rule(name="ring-attention-unfused", check=ring_attention_unfused,
         source=f"{_PLUGIN}:1080-1081"),
    Rule(name="moe-zero-2", check=moe_zero_2, source=f"{_MOE_PLUGIN}:227-233"),
    Rule(name="moe-grad-overlap", reads_overlaps=True,
         check=moe_grad_overlap, source=f"{_MOE_PLUGIN}:227-233"),
    Rule(name="moe-ring-attention", check=moe_ring_attention,
         source=f"{_MOE_PLUGIN}:240-262, 283"),
    Rule(name="moe-sequence-parallel", check=moe_sequence_parallel,
         source=f"{REPO} colossalai/shardformer/policies/mixtral.py:70-74; "
                f"colossalai/shardformer/policies/mixtral.py:121-150"),
    Rule(name="moe-ddp-with-ep", check=moe_ddp_with_ep, source=f"{_MOE_PLUGIN}:438-455"),
    Rule(name="tp-comm-overlap", check=tp_comm_overlap,
         source=f"{REPO} colossalai/shardformer/layer/linear.py:344-352; "
                f"colossalai/shardformer/policies/gpt2.py:57-61"),
    Rule(name="pipeline-send-without-sp", check=pipeline_send_without_sp,
         source=f"{REPO} colossalai/pipeline/p2p.py:594-614"),
    Rule(name="grad-overlap-with-pipeline", reads_overlaps=True, check=grad_overlap_with_pipeline,
         source=f"{_PLUGIN}:1404-1434"),
    Rule(name="ddp-overlap", reads_overlaps=True, check=ddp_overlap, source=f"{_PLUGIN}:1311-1313"),
    Rule(name="sp-sequence-split", check=sequence_split_over_tp,
         source=f"{REPO} colossalai/shardformer/layer/_operation.py:1191-1202"),
    Rule(name="pytorch-context-parallel", check=without_pytorch_context_parallel("Colossal-AI"),
         source=f"{_PLUGIN}:48"),
    Rule(name="rank-order", check=rank_order, source=f"{_PLUGIN}:1110-1117"),
    Rule(name="optimizer-offload", check=optimizer_offload, source=f"{_PLUGIN}:1093, 1247"),
)  # fmt: skip
"""Everything Colossal-AI refuses, or cannot run as the planner prices it."""
