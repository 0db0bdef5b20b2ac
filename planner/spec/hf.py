"""Translation of Hugging Face ``config.json`` files into :class:`~planner.spec.ModelSpec`.

Each supported ``model_type`` has one small reader that maps the file's keys, as written, onto
Megatron's vocabulary. Where a key is absent the reader uses the default of the matching
``transformers`` configuration class, so the result describes the model that ``transformers``
would build from the same file; where that default is a size picked for one particular
checkpoint, the key is required instead, since guessing it would silently change the model.

Everything that can be wrong with a file (unknown family, missing key, a string where a number
belongs, a layout ``ModelSpec`` cannot express) is reported as an :class:`InputError` naming the
file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import InputError
from planner.spec import ModelSpec
from planner.spec.messages import describe_validation_error, short_repr

# Every spelling transformers accepts for GPT-2's GELU; they differ only in the approximation.
_GELU_NAMES = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate"})
# Gated families: HF's ``hidden_act`` is the gate's activation, so SiLU means SwiGLU.
_SILU_NAMES = frozenset({"silu", "swish"})

# Which config.json key each ModelSpec field is read from, so that a size ModelSpec refuses is
# reported under the name the file uses. The Llama-shaped families and DeepSeek share these.
_KEYS = {
    "name": "_name_or_path",
    "num_layers": "num_hidden_layers",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "ffn_hidden_size": "intermediate_size",
    "moe.top_k": "num_experts_per_tok",
    "moe.ffn_hidden_size": "moe_intermediate_size",
    "moe.num_experts": "num_experts",
    "moe.shared_ffn_hidden_size": "shared_expert_intermediate_size",
    "sliding_window.window": "sliding_window",
    "rotary_base": "rope_theta",
    "norm_epsilon": "rms_norm_eps",
    "moe.router_topk_scaling_factor": "routed_scaling_factor",
    "moe.router_num_groups": "n_group",
    "moe.router_group_topk": "topk_group",
    "moe.router_aux_loss_coeff": "router_aux_loss_coef",
    **{f"mla.{key}": key for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                      "qk_rope_head_dim", "v_head_dim")},
}  # fmt: skip
_FAMILY_KEYS: dict[str, dict[str, str]] = {
    "mixtral": {"moe.num_experts": "num_local_experts", "moe.ffn_hidden_size": "intermediate_size"},
    "deepseek_v3": {"moe.num_experts": "n_routed_experts", "moe.shared_experts": "n_shared_experts",
                    "moe.shared_ffn_hidden_size": "n_shared_experts"},
    "gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
             "ffn_hidden_size": "n_inner", "max_position_embeddings": "n_positions",
             "hidden_dropout": "resid_pdrop", "attention_dropout": "attn_pdrop",
             "norm_epsilon": "layer_norm_epsilon"},
}  # fmt: skip


class _HFConfig:
    """Typed, error-reporting access to the keys of one ``config.json``."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def fail(self, message: str) -> InputError:
        """An error about this file."""
        return InputError(f"{self.source}: {message}")

    def need_int(self, key: str) -> int:
        """An integer that must be present."""
        if key not in self.data:
            raise self.fail(f"required key {key!r} is missing")
        return self._as_int(key, self.data[key])

    def get_int(self, key: str, default: int | None) -> int | None:
        """An integer that may be absent or null (then ``default``)."""
        value = self.data.get(key)
        return default if value is None else self._as_int(key, value)

    def positive_int(self, key: str, default: int) -> int:
        """A step or frequency: absent or null means ``default``; zero would divide by zero."""
        value = self.get_int(key, default)
        if value is None or value <= 0:
            raise self.fail(f"{key} must be a positive integer, got {short_repr(value)}")
        return value

    def get_float(self, key: str, default: float) -> float:
        """A number that may be absent or null (then ``default``)."""
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{key} must be a number, got {short_repr(value)}")
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        """A flag that may be absent or null (then ``default``)."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key} must be true or false, got {short_repr(value)}")
        return value

    def get_str(self, key: str, default: str) -> str:
        """A string that may be absent or null (then ``default``)."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string, got {short_repr(value)}")
        return value

    def get_int_list(self, key: str) -> list[int]:
        """A list of integers that may be absent or null (then empty)."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(f"{key} must be a list of integers, got {short_repr(value)}")
        return [self._as_int(key, item) for item in value]

    def _as_int(self, key: str, value: Any) -> int:
        # bool is an int subclass in Python, but `true` for a layer count is a mistake.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{key} must be an integer, got {short_repr(value)}")
        return value


def model_from_hf_config(data: Mapping[str, Any], *, source: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dict.

    ``source`` names the file in error messages and, when the config has no
    ``_name_or_path``, gives the model its name. Raises :class:`InputError` for an
    unsupported ``model_type``, a missing or mistyped key, or sizes ``ModelSpec`` rejects.
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in _NESTED and isinstance(
            data.get("text_config"), Mapping):
        # A multimodal checkpoint (Gemma 3 4B-27B) keeps its decoder in text_config, which
        # transformers builds as the text model's own config class; its name is the outer one.
        text = {**data["text_config"], "model_type": _NESTED[model_type],
                "_name_or_path": _model_name(_HFConfig(data, source))}
        return model_from_hf_config(text, source=f"{source} text_config")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise InputError(
            f"{source}: model_type {short_repr(model_type)} is not supported; "
            f"supported: {', '.join(sorted({*_READERS, *_NESTED}))}"
        )
    cfg = _HFConfig(data, source)
    fields = reader(cfg)
    fields["name"] = _model_name(cfg)
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        keys = _KEYS | _FAMILY_KEYS.get(model_type, {})
        raise InputError(describe_validation_error(source, exc, keys=keys)) from None


def _model_name(cfg: _HFConfig) -> str:
    name = cfg.get_str("_name_or_path", "")
    if name:
        return name
    file_name = Path(cfg.source).name
    for suffix in (".config.json", ".json"):
        if file_name.endswith(suffix) and len(file_name) > len(suffix):
            return file_name[: -len(suffix)]
    return file_name or cfg.source


# --- Shared pieces ------------------------------------------------------------------------------


def _gated_activation(cfg: _HFConfig) -> str:
    act = cfg.get_str("hidden_act", "silu")
    if act not in _SILU_NAMES:
        raise cfg.fail(
            f"hidden_act {short_repr(act)} is not supported for model_type "
            f"{cfg.data['model_type']!r}; "
            f"supported: {', '.join(sorted(_SILU_NAMES))} (SwiGLU)"
        )
    return "swiglu"


def _query_groups(cfg: _HFConfig, heads: int, *, may_be_absent: bool) -> int:
    # transformers reads an explicit null as "one key/value head per query head" in every
    # family, but an absent key as the class default, which outside Llama is a GQA size picked
    # for one checkpoint (Mistral: 8, Qwen3-MoE: 4): require the key there rather than guess.
    if "num_key_value_heads" not in cfg.data and not may_be_absent:
        raise cfg.fail("required key 'num_key_value_heads' is missing")
    groups = cfg.get_int("num_key_value_heads", heads)
    return heads if groups is None else groups


def _rope_decoder(cfg: _HFConfig, *, kv_heads_may_be_absent: bool = False) -> dict[str, Any]:
    """The fields common to the Llama-shaped families (pre-norm RMSNorm, RoPE, SwiGLU)."""
    heads = cfg.need_int("num_attention_heads")
    return {
        "num_layers": cfg.need_int("num_hidden_layers"),
        "hidden_size": cfg.need_int("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": _query_groups(cfg, heads, may_be_absent=kv_heads_may_be_absent),
        # Only some configs carry head_dim (Qwen3, Mistral-Nemo); without it transformers uses
        # hidden_size / heads, which is also ModelSpec's default.
        "kv_channels": cfg.get_int("head_dim", None),
        "ffn_hidden_size": cfg.need_int("intermediate_size"),
        "vocab_size": cfg.need_int("vocab_size"),
        "max_position_embeddings": cfg.need_int("max_position_embeddings"),
        "activation": _gated_activation(cfg),
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        # False is the default of every Llama-shaped config class in transformers.
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "bias": False,
        # These families have no residual dropout in transformers, only on attention weights.
        "attention_dropout": cfg.get_float("attention_dropout", 0.0),
        **_rope_and_norm(cfg),
    }


def _gelu_gated(cfg: _HFConfig, key: str) -> str:
    # Gemma's MLP is gate_proj/up_proj/down_proj with GeLU on the gate: GeGLU.
    act = cfg.get_str(key, "gelu_pytorch_tanh")
    if act not in _GELU_NAMES:
        raise cfg.fail(f"{key} {short_repr(act)} is not supported for model_type "
                       f"{cfg.data['model_type']!r}; supported: {', '.join(sorted(_GELU_NAMES))} "
                       f"(GeGLU)")  # fmt: skip
    return "geglu"


def _window_every(cfg: _HFConfig, num_layers: int, default_every: int) -> int:
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


# transformers' defaults for rope_theta and rms_norm_eps where they are not (10000, 1e-6).
_ROPE_NORM_DEFAULTS = {"mixtral": (1e6, 1e-5), "phi3": (10000.0, 1e-5),
                       "gemma3_text": (1e6, 1e-6)}


def _rope_and_norm(cfg: _HFConfig) -> dict[str, Any]:
    """RoPE's base and scaling and the norms' epsilon, at the family's transformers defaults."""
    theta, eps = _ROPE_NORM_DEFAULTS.get(cfg.data["model_type"], (10000.0, 1e-6))
    return {"rotary_base": cfg.get_float("rope_theta", theta),
            "rope_scaling": _rope_scaling(cfg),
            "norm_epsilon": cfg.get_float("rms_norm_eps", eps)}  # fmt: skip


_ROPE_SCALING_KEYS = ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                      "beta_fast", "beta_slow", "mscale", "mscale_all_dim")  # fmt: skip


def _rope_scaling(cfg: _HFConfig) -> dict[str, Any] | None:
    """``rope_scaling`` as :class:`~planner.spec.RopeScaling` fields; None when absent or
    "default". transformers requires ``factor`` for llama3 and yarn; a type the planner does
    not export (longrope's factors are lists) is kept with factor 1 when it has none."""
    value = cfg.data.get("rope_scaling")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise cfg.fail(f"rope_scaling must be an object or null, got {short_repr(value)}")
    scaling = _HFConfig(value, f"{cfg.source}: rope_scaling")
    kind = scaling.get_str("rope_type", "") or scaling.get_str("type", "default")
    if kind == "default":
        return None
    factor = scaling.get_float("factor", 0.0 if kind in ("llama3", "yarn") else 1.0)
    if factor <= 0:
        raise scaling.fail(f"factor must be a positive number for rope_type {kind!r}")
    keys = {key: scaling.get_float(key, 0.0) for key in _ROPE_SCALING_KEYS
            if value.get(key) is not None}  # fmt: skip
    if "original_max_position_embeddings" in keys:
        keys["original_max_position_embeddings"] = scaling.need_int(
            "original_max_position_embeddings")
    return {"rope_type": kind, "factor": factor, **keys}


def _reject_attention_bias(cfg: _HFConfig) -> None:
    # attention_bias puts a bias on the output projection too, while the MLP stays bias-free:
    # ModelSpec can say "bias everywhere" or "bias on QKV only", not that.
    if cfg.get_bool("attention_bias", False):
        raise cfg.fail(
            "attention_bias=true is not supported for this model_type: it adds biases to the "
            "QKV and output projections but not the MLP, which ModelSpec cannot express"
        )


def _qwen_moe_layout(cfg: _HFConfig, num_layers: int) -> tuple[int, int] | None:
    """(first_dense_layers, layer_freq) for Qwen's MoE placement, or None without MoE layers.

    transformers makes layer i sparse when ``(i + 1) % decoder_sparse_step == 0`` and i is not
    in ``mlp_only_layers``. ModelSpec can express that only if ``mlp_only_layers`` removes a
    leading run of the would-be MoE layers.
    """
    step = cfg.positive_int("decoder_sparse_step", 1)
    candidates = range(step - 1, num_layers, step)
    dense_only = set(cfg.get_int_list("mlp_only_layers"))
    removed = sorted(i for i in dense_only if i in candidates)
    if removed != list(candidates[: len(removed)]):
        raise cfg.fail(
            f"mlp_only_layers {sorted(dense_only)} cannot be expressed: ModelSpec only allows "
            "dense layers as a prefix (first_dense_layers) followed by evenly spaced MoE layers"
        )
    sparse = candidates[len(removed) :]
    return (sparse[0], step) if sparse else None


def _qwen_moe(cfg: _HFConfig, num_layers: int, experts: dict[str, Any]) -> dict[str, Any] | None:
    if experts["num_experts"] == 0:  # transformers builds no sparse layer then
        return None
    return _moe_fields(_qwen_moe_layout(cfg, num_layers), experts)


def _moe_fields(layout: tuple[int, int] | None, experts: dict[str, Any]) -> dict[str, Any] | None:
    if layout is None:
        return None
    first_dense, freq = layout
    return {**experts, "first_dense_layers": first_dense, "layer_freq": freq}


# --- One reader per family ----------------------------------------------------------------------


def _llama(cfg: _HFConfig) -> dict[str, Any]:
    fields = _rope_decoder(cfg, kv_heads_may_be_absent=True)
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


def _mistral(cfg: _HFConfig) -> dict[str, Any]:
    # Sliding-window attention (Mistral 7B v0.1) changes attention FLOPs at long sequences only
    # and no parameter; it is not modelled.
    return _rope_decoder(cfg)


def _qwen2(cfg: _HFConfig) -> dict[str, Any]:
    # Qwen2 hard-codes biases on the q/k/v projections (not on o_proj or the MLP).
    return {**_rope_decoder(cfg), "qkv_bias": True}


def _qwen3(cfg: _HFConfig) -> dict[str, Any]:
    # Qwen3's per-head RMSNorm on queries and keys; head_dim is its own key (128 at every size).
    _reject_attention_bias(cfg)
    if cfg.get_bool("use_sliding_window", False):
        raise cfg.fail("use_sliding_window=true is not supported: Qwen's window applies from "
                       "layer max_window_layers on, which sliding_window.global_every cannot "
                       "express")  # fmt: skip
    return {**_rope_decoder(cfg), "qk_layernorm": True}


def _phi3(cfg: _HFConfig) -> dict[str, Any]:
    # Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj: the same matrices as
    # Llama's, concatenated. Its sliding window (2047 in the 4K checkpoints) covers every layer;
    # the LongRoPE scaling of the 128K checkpoints changes no FLOP.
    _reject_attention_bias(cfg)
    fields = _rope_decoder(cfg, kv_heads_may_be_absent=True)
    fields["hidden_dropout"] = cfg.get_float("resid_pdrop", 0.0)
    window = cfg.get_int("sliding_window", None)
    if window is not None:
        fields["sliding_window"] = {"window": window}
    return fields


def _gemma(cfg: _HFConfig, *, every: int, window: int | None, act_key: str) -> dict[str, Any]:
    """Gemma 2 and 3: GeGLU, sandwich RMSNorms, embeddings scaled by sqrt(hidden) and tied,
    local layers alternating with global ones."""
    _reject_attention_bias(cfg)
    heads = cfg.need_int("num_attention_heads")
    num_layers = cfg.need_int("num_hidden_layers")
    width = cfg.get_int("sliding_window", window) if window else cfg.need_int("sliding_window")
    return {
        "num_layers": num_layers,
        "hidden_size": cfg.need_int("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": _query_groups(cfg, heads, may_be_absent=False),
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
        **_rope_and_norm(cfg),
    }


def _cap(cfg: _HFConfig, key: str, default: float | None) -> float | None:
    # An explicit null turns soft-capping off; only an absent key takes the class default.
    if key not in cfg.data:
        return default
    value = cfg.get_float(key, 0.0)
    return value or None


def _gemma2(cfg: _HFConfig) -> dict[str, Any]:
    # Gemma2DecoderLayer: layer i is sliding when i is even, so every 2nd layer is global;
    # Gemma2Config's defaults: vocabulary 256000, 8192 positions, window 4096, caps 50 and 30.
    fields = _gemma(cfg, every=2, window=4096, act_key="hidden_activation")
    return {**fields, "vocab_size": cfg.get_int("vocab_size", 256000),
            "max_position_embeddings": cfg.get_int("max_position_embeddings", 8192),
            "attn_logit_softcapping": _cap(cfg, "attn_logit_softcapping", 50.0),
            "final_logit_softcapping": _cap(cfg, "final_logit_softcapping", 30.0)}


def _gemma3(cfg: _HFConfig) -> dict[str, Any]:
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


def _mixtral(cfg: _HFConfig) -> dict[str, Any]:
    fields = _rope_decoder(cfg)
    # In Mixtral intermediate_size is the width of each expert; every layer is sparse.
    fields["moe"] = {
        "num_experts": cfg.need_int("num_local_experts"),
        "top_k": cfg.need_int("num_experts_per_tok"),
        "ffn_hidden_size": fields["ffn_hidden_size"],
        "router_aux_loss_coeff": cfg.get_float("router_aux_loss_coef", 0.001),
    }
    return fields


def _qwen2_moe(cfg: _HFConfig) -> dict[str, Any]:
    # Not modelled: the shared expert's sigmoid gate, a hidden_size x 1 weight per MoE layer.
    fields = {**_rope_decoder(cfg), "qkv_bias": True}
    shared = cfg.need_int("shared_expert_intermediate_size")
    experts: dict[str, Any] = {
        "num_experts": cfg.need_int("num_experts"),
        "top_k": cfg.need_int("num_experts_per_tok"),
        "ffn_hidden_size": cfg.need_int("moe_intermediate_size"),
        "router_topk_normalized": cfg.get_bool("norm_topk_prob", False),
        "router_aux_loss_coeff": cfg.get_float("router_aux_loss_coef", 0.001),
    }
    if shared:
        experts |= {"shared_experts": 1, "shared_ffn_hidden_size": shared}
    fields["moe"] = _qwen_moe(cfg, fields["num_layers"], experts)
    return fields


def _qwen3_moe(cfg: _HFConfig) -> dict[str, Any]:
    _reject_attention_bias(cfg)
    fields = {**_rope_decoder(cfg), "qk_layernorm": True}
    experts = {
        "num_experts": cfg.need_int("num_experts"),
        "top_k": cfg.need_int("num_experts_per_tok"),
        "ffn_hidden_size": cfg.need_int("moe_intermediate_size"),
        # transformers' Qwen3MoeConfig defaults norm_topk_prob to false; the released
        # checkpoints' configs set it true.
        "router_topk_normalized": cfg.get_bool("norm_topk_prob", False),
        "router_aux_loss_coeff": cfg.get_float("router_aux_loss_coef", 0.001),
    }
    fields["moe"] = _qwen_moe(cfg, fields["num_layers"], experts)
    return fields


def _deepseek_v3(cfg: _HFConfig) -> dict[str, Any]:
    # The multi-token-prediction module (num_nextn_predict_layers) is left out on purpose: it is
    # an extra training-time layer, and the published 671B total excludes it.
    _reject_attention_bias(cfg)
    _gated_activation(cfg)
    num_layers = cfg.need_int("num_hidden_layers")
    if "q_lora_rank" not in cfg.data:  # null is valid (no query compression), absent is not
        raise cfg.fail("required key 'q_lora_rank' is missing")
    return {
        "num_layers": num_layers,
        "hidden_size": cfg.need_int("hidden_size"),
        "num_attention_heads": cfg.need_int("num_attention_heads"),
        "ffn_hidden_size": cfg.need_int("intermediate_size"),
        "vocab_size": cfg.need_int("vocab_size"),
        "max_position_embeddings": cfg.need_int("max_position_embeddings"),
        "activation": "swiglu",
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "bias": False,
        "attention_dropout": cfg.get_float("attention_dropout", 0.0),
        **_rope_and_norm(cfg),
        "mla": {
            "q_lora_rank": cfg.get_int("q_lora_rank", None),
            "kv_lora_rank": cfg.need_int("kv_lora_rank"),
            "qk_nope_head_dim": cfg.need_int("qk_nope_head_dim"),
            "qk_rope_head_dim": cfg.need_int("qk_rope_head_dim"),
            "v_head_dim": cfg.need_int("v_head_dim"),
        },
        "moe": _deepseek_moe(cfg, num_layers),
    }


def _deepseek_moe(cfg: _HFConfig, num_layers: int) -> dict[str, Any] | None:
    # transformers makes layer i sparse when i >= first_k_dense_replace and
    # i % moe_layer_freq == 0, so the first sparse layer is first_k rounded up to the frequency.
    routed = cfg.get_int("n_routed_experts", None)
    if routed is None:
        return None
    freq = cfg.positive_int("moe_layer_freq", 1)
    first_k = cfg.need_int("first_k_dense_replace")
    first_sparse = -(-max(first_k, 0) // freq) * freq
    layout = (first_sparse, freq) if first_sparse < num_layers else None
    expert_width = cfg.need_int("moe_intermediate_size")
    shared = cfg.get_int("n_shared_experts", 0) or 0
    experts: dict[str, Any] = {
        "num_experts": routed,
        "top_k": cfg.need_int("num_experts_per_tok"),
        "ffn_hidden_size": expert_width,
        # Aux-loss-free balancing learns a per-expert bias on the routing scores.
        "router_expert_bias": cfg.get_str("topk_method", "") == "noaux_tc",
        **_deepseek_router(cfg),
    }
    if shared:
        # DeepSeek fuses its shared experts into one MLP of n_shared_experts x the expert width.
        experts |= {"shared_experts": shared, "shared_ffn_hidden_size": shared * expert_width}
    return _moe_fields(layout, experts)


def _deepseek_router(cfg: _HFConfig) -> dict[str, Any]:
    """Sigmoid (or softmax) scores, renormalized and scaled top-k weights, and group-limited
    routing, at transformers' DeepseekV3Config defaults (it hard-codes sigmoid scores; the
    released config says scoring_func)."""
    score = cfg.get_str("scoring_func", "sigmoid")
    if score not in ("softmax", "sigmoid"):
        raise cfg.fail(f"scoring_func {short_repr(score)} is not supported; supported: "
                       f"sigmoid, softmax")  # fmt: skip
    groups, chosen = cfg.positive_int("n_group", 8), cfg.positive_int("topk_group", 4)
    grouped = {"router_num_groups": groups, "router_group_topk": chosen} if groups > 1 else {}
    return {"router_score_function": score,
            "router_topk_normalized": cfg.get_bool("norm_topk_prob", True),
            "router_topk_scaling_factor": cfg.get_float("routed_scaling_factor", 2.5),
            **grouped}  # fmt: skip


def _gpt2(cfg: _HFConfig) -> dict[str, Any]:
    hidden = cfg.need_int("n_embd")
    act = cfg.get_str("activation_function", "gelu_new")
    if act not in _GELU_NAMES:
        raise cfg.fail(
            f"activation_function {short_repr(act)} is not supported for model_type 'gpt2'; "
            f"supported: {', '.join(sorted(_GELU_NAMES))}"
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


_READERS: dict[str, Callable[[_HFConfig], dict[str, Any]]] = {
    "deepseek_v3": _deepseek_v3,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "phi3": _phi3,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
}
# Multimodal families whose decoder is a text family's config under "text_config".
_NESTED = {"gemma3": "gemma3_text"}
