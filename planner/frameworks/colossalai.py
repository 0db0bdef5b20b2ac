"""Colossal-AI: what it launches, and the ``HybridParallelPlugin(...)`` that launches it.

Colossal-AI shards a Hugging Face model through a per-architecture Shardformer policy, so the
launch names the ``transformers`` class the model is built as (GPT-2, Llama, Qwen2, Qwen3 or,
with experts, Mixtral) and constructs the plugin: ``HybridParallelPlugin`` for dense models,
``MoeHybridParallelPlugin`` for models with experts (the only one whose experts are
tensor-parallel, as the planner prices them). ``split_gather`` sequence parallelism is the
planner's sp (``ring``, its decomposed-GEMM variant, is sp with tp_comm_overlap);
``ring_attn`` over ``sp_size`` ranks is the planner's cp as a ring, ``all_to_all`` its cp as
Ulysses all-to-alls.

The rules (:mod:`planner.frameworks._colossalai_rules`) cite hpcaitech/ColossalAI at 4f9953b
(main, v0.5.1 + 149 commits); which class builds a model is
:mod:`planner.frameworks._colossalai_models`'s, and the plugin's keywords
:mod:`planner.frameworks._colossalai_plugin`'s.
"""

from __future__ import annotations

from planner.frameworks._colossalai_models import HF_CLASSES, REPO, family
from planner.frameworks._colossalai_plugin import (
    Kwargs,
    checkpoint_config,
    hf_config_keys,
    overlap_kwargs,
    pipeline_kwargs,
    render,
    sequence_kwargs,
)
from planner.frameworks._colossalai_rules import RULES
from planner.frameworks._megatron_vocab import vocab_divisor
from planner.frameworks.base import Launch, Profile
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

# --- the launcher --------------------------------------------------------------------------------


def launch(resolved: ResolvedConfig, model: ModelSpec) -> Launch:
    """The plugin's construction in Python, with the few settings the training script needs.

    Only called on configurations no rule of :data:`RULES` refuses.
    """
    moe = model.moe is not None
    plugin = "MoeHybridParallelPlugin" if moe else "HybridParallelPlugin"
    kwargs: Kwargs = {"tp_size": resolved.config.tp, "pp_size": resolved.config.pp}
    kwargs |= {"ep_size": resolved.config.ep, "moe_dp_outside": False} if moe else {}
    kwargs |= sequence_kwargs(resolved)
    kwargs |= {"precision": resolved.training.precision, "zero_stage": resolved.config.zero}
    kwargs |= pipeline_kwargs(resolved)
    kwargs |= overlap_kwargs(resolved, moe=moe)
    kwargs |= {"enable_flash_attention": resolved.config.flash_attention,
               "make_vocab_size_divisible_by": vocab_divisor(model.vocab_size,
                                                                resolved.config.tp)}  # fmt: skip
    kwargs |= {} if moe else {"dp_outside": False}  # ranks tp, cp, dp, pp as the planner's
    text = render(plugin, kwargs, settings=script_settings(resolved, model),
                  checkpointing=checkpoint_config(resolved), source=REPO)  # fmt: skip
    return Launch(text=text, notes=notes(model))


def script_settings(resolved: ResolvedConfig, model: ModelSpec) -> Kwargs:
    """What the training script sets beside the plugin: the model class and attention kernel,
    checkpointing, and how a step's microbatches reach the plugin."""
    c, n = resolved.config, resolved.num_microbatches
    fam = family(model) or "llama"
    # DeepSeek-V3's own modeling has flash_attention_2 and eager only
    fused = "flash_attention_2" if fam == "deepseek_v3" else "sdpa"
    return {
        "HF_MODEL_CLASS": HF_CLASSES[fam],
        "HF_CONFIG": hf_config_keys(model, deepseek=fam == "deepseek_v3"),
        # eager keeps the s x s scores the planner prices for unfused attention
        "ATTN_IMPLEMENTATION": fused if c.flash_attention else "eager",
        "GRADIENT_CHECKPOINTING": c.recompute == "full",
        "BATCH_SIZE_PER_RANK": c.mbs * n if c.pp > 1 else c.mbs,
        "ACCUMULATION_STEPS": 1 if c.pp > 1 else n,
        # ZeRO-2 reduce-scatters every backward (booster.no_sync refuses it); the others
        # reduce once, in the last backward of the step.
        "NO_SYNC_BEFORE_LAST": c.pp == 1 and n > 1 and c.zero != 2,
    }


def notes(model: ModelSpec) -> tuple[str, ...]:
    """What the user adds."""
    fam = family(model) or "llama"
    remote = ("DeepSeek-V3's policy is registered for the checkpoint's own modeling "
              "(transformers_modules.modeling_deepseek): load it with trust_remote_code=True",)
    return (
        f"for {REPO}, with a transformers version its Shardformer policies support",
        f"build the model as {HF_CLASSES[fam]} from a config with {model.name}'s shape and "
        f"HF_CONFIG's keys, then booster = Booster(plugin=plugin) and booster.boost(...)",
        *(remote if fam == "deepseek_v3" else ()),
        "add the data, tokenizer, optimizer and learning-rate schedule; with pp_size > 1 "
        "step with booster.execute_pipeline(...)",
    )


PROFILE = Profile(name="colossalai", title="Colossal-AI", rules=RULES, launch=launch,
                  stacks=("colossalai-hf",),
                  # Mixtral's policy runs no sequence parallelism: rules.moe_sequence_parallel
                  sequence_parallel=lambda model: model.moe is None)
"""Colossal-AI as a framework target."""
