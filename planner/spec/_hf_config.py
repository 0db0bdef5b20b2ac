"""Reading one Hugging Face ``config.json``: typed, error-reporting access to its keys, and the
translations of the key groups the families share (activations, key/value heads, RoPE and its
scaling, the norms' epsilon) into :class:`~planner.spec.ModelSpec` fields.

Split from :mod:`planner.spec.hf`, whose entry point dispatches to the family readers of
:mod:`planner.spec._hf_dense` and :mod:`planner.spec._hf_moe`, which build on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.errors import InputError
from planner.spec.messages import short_repr

# Every spelling transformers accepts for GPT-2's GELU; they differ only in the approximation.
GELU_NAMES = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate"})
# Gated families: HF's ``hidden_act`` is the gate's activation, so SiLU means SwiGLU.
_SILU_NAMES = frozenset({"silu", "swish"})


class HFConfig:
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


def gated_activation(cfg: HFConfig) -> str:
    """The MLP of a gated family: ``hidden_act`` is the gate's activation, and SiLU is SwiGLU."""
    act = cfg.get_str("hidden_act", "silu")
    if act not in _SILU_NAMES:
        raise cfg.fail(
            f"hidden_act {short_repr(act)} is not supported for model_type "
            f"{cfg.data['model_type']!r}; "
            f"supported: {', '.join(sorted(_SILU_NAMES))} (SwiGLU)"
        )
    return "swiglu"


def query_groups(cfg: HFConfig, heads: int, *, may_be_absent: bool) -> int:
    """The number of key/value heads (``num_key_value_heads``) for ``heads`` query heads."""
    # transformers reads an explicit null as "one key/value head per query head" in every
    # family, but an absent key as the class default, which outside Llama is a GQA size picked
    # for one checkpoint (Mistral: 8, Qwen3-MoE: 4): require the key there rather than guess.
    if "num_key_value_heads" not in cfg.data and not may_be_absent:
        raise cfg.fail("required key 'num_key_value_heads' is missing")
    groups = cfg.get_int("num_key_value_heads", heads)
    return heads if groups is None else groups


def rope_decoder(cfg: HFConfig, *, kv_heads_may_be_absent: bool = False) -> dict[str, Any]:
    """The fields common to the Llama-shaped families (pre-norm RMSNorm, RoPE, SwiGLU)."""
    heads = cfg.need_int("num_attention_heads")
    return {
        "num_layers": cfg.need_int("num_hidden_layers"),
        "hidden_size": cfg.need_int("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": query_groups(cfg, heads, may_be_absent=kv_heads_may_be_absent),
        # Only some configs carry head_dim (Qwen3, Mistral-Nemo); without it transformers uses
        # hidden_size / heads, which is also ModelSpec's default.
        "kv_channels": cfg.get_int("head_dim", None),
        "ffn_hidden_size": cfg.need_int("intermediate_size"),
        "vocab_size": cfg.need_int("vocab_size"),
        "max_position_embeddings": cfg.need_int("max_position_embeddings"),
        "activation": gated_activation(cfg),
        "normalization": "rmsnorm",
        "position_embedding": "rope",
        # False is the default of every Llama-shaped config class in transformers.
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "bias": False,
        # These families have no residual dropout in transformers, only on attention weights.
        "attention_dropout": cfg.get_float("attention_dropout", 0.0),
        **rope_and_norm(cfg),
    }


# transformers' defaults for rope_theta and rms_norm_eps where they are not (10000, 1e-6).
_ROPE_NORM_DEFAULTS = {"mixtral": (1e6, 1e-5), "phi3": (10000.0, 1e-5),
                       "gemma3_text": (1e6, 1e-6)}


def rope_and_norm(cfg: HFConfig) -> dict[str, Any]:
    """RoPE's base and scaling and the norms' epsilon, at the family's transformers defaults."""
    theta, eps = _ROPE_NORM_DEFAULTS.get(cfg.data["model_type"], (10000.0, 1e-6))
    return {"rotary_base": cfg.get_float("rope_theta", theta),
            "rope_scaling": _rope_scaling(cfg),
            "norm_epsilon": cfg.get_float("rms_norm_eps", eps)}  # fmt: skip


_ROPE_SCALING_KEYS = ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                      "beta_fast", "beta_slow", "mscale", "mscale_all_dim")  # fmt: skip


def _rope_scaling(cfg: HFConfig) -> dict[str, Any] | None:
    """``rope_scaling`` as :class:`~planner.spec.RopeScaling` fields; None when absent or
    "default". transformers requires ``factor`` for llama3 and yarn; a type the planner does
    not export (longrope's factors are lists) is kept with factor 1 when it has none."""
    value = cfg.data.get("rope_scaling")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise cfg.fail(f"rope_scaling must be an object or null, got {short_repr(value)}")
    scaling = HFConfig(value, f"{cfg.source}: rope_scaling")
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


def reject_attention_bias(cfg: HFConfig) -> None:
    """Refuse ``attention_bias=true``, which ModelSpec cannot express for this family."""
    # attention_bias puts a bias on the output projection too, while the MLP stays bias-free:
    # ModelSpec can say "bias everywhere" or "bias on QKV only", not that.
    if cfg.get_bool("attention_bias", False):
        raise cfg.fail(
            "attention_bias=true is not supported for this model_type: it adds biases to the "
            "QKV and output projections but not the MLP, which ModelSpec cannot express"
        )


def with_window(cfg: HFConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the config's ``sliding_window`` on every layer, where it sets one
    (Mistral, Mixtral, Phi-3: their attention masks every layer by it)."""
    window = cfg.get_int("sliding_window", None)
    return fields if window is None else {**fields, "sliding_window": {"window": window}}
