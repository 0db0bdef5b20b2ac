"""Which Hugging Face architecture Colossal-AI builds a model as: Shardformer shards a model
through the policy of its ``transformers`` class, so a model is launchable only as one of the
classes that have a policy and build it exactly.

Split from :mod:`planner.frameworks.colossalai`; its rules
(:mod:`planner.frameworks._colossalai_rules`) and its launcher both ask :func:`family`.
"""

from __future__ import annotations

from typing import Literal

from planner.spec import ModelSpec

REPO = "hpcaitech/ColossalAI@4f9953b"
"""The Colossal-AI source the rules and keywords were checked against."""

Family = Literal["gpt2", "llama", "qwen2", "qwen3", "mixtral", "deepseek_v3"]
HF_CLASSES: dict[Family, str] = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                 "mixtral": "MixtralForCausalLM",
                                 "deepseek_v3": "DeepseekV3ForCausalLM"}  # fmt: skip
"""The ``transformers`` class each architecture is built as; ``auto_policy.py`` maps it to its
Shardformer policy (lines 59, 76, 207, 217, 227; DeepSeek-V3's is the checkpoint's own
``modeling_deepseek.py``, loaded with ``trust_remote_code``, lines 170-176)."""


def family(model: ModelSpec) -> Family | None:
    """The Hugging Face architecture that builds ``model`` exactly, or None."""
    shape = (model.activation, model.normalization, model.position_embedding)
    modern = shape == ("swiglu", "rmsnorm", "rope") and not model.bias
    if model.mla is not None:
        # DeepSeek-V3's modeling: MLA, and experts with shared ones, a dense prefix and the
        # aux-loss-free bias, on the Llama-shaped rest. Its gate (MoEGate.forward of
        # modeling_deepseek.py in deepseek-ai/DeepSeek-V3 on the Hugging Face Hub, the file
        # auto_policy.py:170-176 loads with trust_remote_code) raises NotImplementedError for any
        # scoring but sigmoid and any top-k method but noaux_tc: DeepSeek-V2's softmax routing
        # is not it.
        plain = not (model.qk_layernorm or model.has_qkv_bias)
        moe = model.moe
        v3_gate = moe is not None and moe.score_function == "sigmoid" and moe.router_expert_bias
        return "deepseek_v3" if modern and plain and v3_gate else None
    if model.moe is not None:
        moe = model.moe
        plain = (moe.shared_experts, moe.first_dense_layers, moe.layer_freq) == (0, 0, 1)
        extras = moe.router_expert_bias or model.qk_layernorm or model.has_qkv_bias
        return "mixtral" if modern and plain and not extras else None
    if modern:
        if model.qk_layernorm:
            return None if model.has_qkv_bias else "qwen3"
        return "qwen2" if model.has_qkv_bias else "llama"
    gpt2 = shape == ("gelu", "layernorm", "learned") and model.tie_word_embeddings
    mha = model.query_groups == model.num_attention_heads
    biases = model.bias and model.has_qkv_bias and not model.qk_layernorm
    return "gpt2" if gpt2 and mha and biases else None
