"""The Hugging Face readers of the dense families: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2
and 3, GPT-2. Each maps one ``model_type``'s ``config.json`` onto :class:`~planner.spec.ModelSpec`
fields at the defaults of its ``transformers`` configuration class.

Split from :mod:`planner.spec.hf`, whose entry point dispatches through :data:`DENSE_READERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.spec._hf_config import (
    GELU_NAMES,
    HFConfig,
    query_groups,
    reject_attention_bias,
    reject_qwen_window,
    rope_and_norm,
    rope_decoder,
    with_window,
)
from planner.spec.messages import short_repr


def _llama(cfg: HFConfig) -> dict[str, Any]:
    fields = rope_decoder(cfg, kv_heads_may_be_absent=True)
    attention_bias = cfg.get_bool("attention_bias", False)
    mlp_bias = cfg.get_bool("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise cfg.fail(
            f"attention_bias={str(attention_bias).lower()} with "
            f"mlp_bias={str(mlp_bias).lower()} is not supported: ModelSpec has one bias "
            "switch for all linear layers (and qkv_bias for the QKV projection alone)"
        )
    fields["bias"] = attention_bias
    return fields


def _mistral(cfg: HFConfig) -> dict[str, Any]:
    # Mistral 7B v0.1's window (4096) covers every layer, as transformers' MistralAttention
    # masks it; later checkpoints set it to null.
    return with_window(cfg, rope_decoder(cfg))



def _qwen2(cfg: HFConfig) -> dict[str, Any]:
    # Qwen2 hard-codes biases on the q/k/v projections (not on o_proj or the MLP).
    reject_qwen_window(cfg)
    return {**rope_decoder(cfg), "qkv_bias": True}


def _qwen3(cfg: HFConfig) -> dict[str, Any]:
    # Qwen3's per-head RMSNorm on queries and keys; head_dim is its own key (128 at every size).
    reject_attention_bias(cfg)
    reject_qwen_window(cfg)
    return {**rope_decoder(cfg), "qk_layernorm": True}


def _phi3(cfg: HFConfig) -> dict[str, Any]:
    # Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj: the same matrices as
    # Llama's, concatenated. Its sliding window (2047 in the 4K checkpoints) covers every layer;
    # the LongRoPE scaling of the 128K checkpoints changes no FLOP.
    reject_attention_bias(cfg)
    fields = rope_decoder(cfg, kv_heads_may_be_absent=True)
    fields["hidden_dropout"] = cfg.get_float("resid_pdrop", 0.0)
    return with_window(cfg, fields)


def _gemma(cfg: HFConfig, *, every: int, window: int | None, act_key: str) -> dict[str, Any]:
    """Gemma 2 and 3: GeGLU, sandwich RMSNorms, embeddings scaled by sqrt(hidden) and tied,
    local layers alternating with global ones."""
    reject_attention_bias(cfg)
    heads = cfg.need_int("num_attention_heads")
    num_layers = cfg.need_int("num_hidden_layers")
    width = cfg.get_int("sliding_window", window) if window else cfg.need_int("sliding_window")
    return {
        "num_layers": num_layers,
        "hidden_size": cfg.need_int("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": query_groups(cfg, heads, may_be_absent=False),
        # head_dim is independent of hidden / heads (256 for 9B, 128 for the 27Bs).
        "kv_channels": cfg.need_int("head_dim"),
        "ffn_hidden_size": cfg.need_int("intermediate_size"),
        "activation": _gelu_gated(cfg, act_key),
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        "bias": False,
        "attention_dropout": cfg.get_float("attention_dropout", 0.0),
        "sliding_window": {"window": width,
                           "global_every": _window_every(cfg, num_layers, every)},
        "post_norms": True,
        "scale_embeddings": True,
        **rope_and_norm(cfg),
    }


def _cap(cfg: HFConfig, key: str, default: float | None) -> float | None:
    # An explicit null turns soft-capping off; only an absent key takes the class default.
    if key not in cfg.data:
        return default
    value = cfg.get_float(key, 0.0)
    return value or None


def _gemma2(cfg: HFConfig) -> dict[str, Any]:
    # Gemma2DecoderLayer: layer i is sliding when i is even, so every 2nd layer is global;
    # Gemma2Config's defaults: vocabulary 256000, 8192 positions, window 4096, caps 50 and 30.
    fields = _gemma(cfg, every=2, window=4096, act_key="hidden_activation")
    return {**fields, "vocab_size": cfg.get_int("vocab_size", 256000),
            "max_position_embeddings": cfg.get_int("max_position_embeddings", 8192),
            "attn_logit_softcapping": _cap(cfg, "attn_logit_softcapping", 50.0),
            "final_logit_softcapping": _cap(cfg, "final_logit_softcapping", 30.0)}


def _gemma3(cfg: HFConfig) -> dict[str, Any]:
    # Gemma3Attention: layer i is sliding when (i + 1) % sliding_window_pattern != 0; q_norm and
    # k_norm replace Gemma 2's attention soft-capping. Gemma3TextConfig's defaults: vocabulary
    # 262208, 131072 positions, pattern 6, no caps; its default window (4096) is no
    # checkpoint's (1B-27B use 512 or 1024), so the file must say it.
    every = cfg.positive_int("sliding_window_pattern", 6)
    fields = _gemma(cfg, every=every, window=None, act_key="hidden_activation")
    return {**fields, "qk_layernorm": True, "vocab_size": cfg.get_int("vocab_size", 262208),
            "max_position_embeddings": cfg.get_int("max_position_embeddings", 131072),
            "attn_logit_softcapping": _cap(cfg, "attn_logit_softcapping", None),
            "final_logit_softcapping": _cap(cfg, "final_logit_softcapping", None)}


def _gelu_gated(cfg: HFConfig, key: str) -> str:
    # Gemma's MLP is gate_proj/up_proj/down_proj with GeLU on the gate: GeGLU.
    act = cfg.get_str(key, "gelu_pytorch_tanh")
    if act not in GELU_NAMES:
        raise cfg.fail(f"{key} {short_repr(act)} is not supported for model_type "
                       f"{cfg.data['model_type']!r}; supported: {', '.join(sorted(GELU_NAMES))} "
                       f"(GeGLU)")  # fmt: skip
    return "geglu"


def _window_every(cfg: HFConfig, num_layers: int, default_every: int) -> int:
    """How often a layer is global (SlidingWindowSpec.global_every): from ``layer_types``
    where the file lists them (transformers 4.53 and later), else the family's pattern."""
    types = cfg.data.get("layer_types")
    if types is None:
        return default_every
    if not isinstance(types, list) or len(types) != num_layers:
        raise cfg.fail(f"layer_types must list one type per layer ({num_layers}), got "
                       f"{short_repr(types)}")  # fmt: skip
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    every = full[0] + 1 if full else 0
    expected = ["sliding_attention" if every == 0 or (i + 1) % every else "full_attention"
                for i in range(num_layers)]  # fmt: skip
    if types != expected:
        raise cfg.fail("layer_types cannot be expressed: ModelSpec's local layers are all but "
                       "every n-th (sliding_window.global_every)")  # fmt: skip
    return every


def _gpt2(cfg: HFConfig) -> dict[str, Any]:
    hidden = cfg.need_int("n_embd")
    act = cfg.get_str("activation_function", "gelu_new")
    if act not in GELU_NAMES:
        raise cfg.fail(
            f"activation_function {short_repr(act)} is not supported for model_type 'gpt2'; "
            f"supported: {', '.join(sorted(GELU_NAMES))}"
        )
    return {
        "num_layers": cfg.need_int("n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": cfg.need_int("n_head"),
        "ffn_hidden_size": cfg.get_int("n_inner", 4 * hidden),
        "vocab_size": cfg.need_int("vocab_size"),
        "max_position_embeddings": cfg.need_int("n_positions"),
        "activation": "gelu",
        "normalization": "layernorm",
        "position_embedding": "learned",
        # GPT2LMHeadModel ties its head to the embedding unless the file says otherwise.
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        "bias": True,
        # embd_pdrop (dropout on the embeddings' output) has no ModelSpec field.
        "hidden_dropout": cfg.get_float("resid_pdrop", 0.1),
        "attention_dropout": cfg.get_float("attn_pdrop", 0.1),
        "norm_epsilon": cfg.get_float("layer_norm_epsilon", 1e-5),
    }


DENSE_READERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = {
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "phi3": _phi3,
    "qwen3": _qwen3,
}
"""The reader of each dense ``model_type``."""
