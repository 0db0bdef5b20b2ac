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
    """RoPE's base and scaling and the norms' epsilon, at the family's transformers defaults:
    from ``rope_theta`` and ``rope_scaling``, or from transformers 5's ``rope_parameters``
    (:func:`_rope_parameters`), which holds both."""
    theta, eps = _ROPE_NORM_DEFAULTS.get(cfg.data["model_type"], (10000.0, 1e-6))
    params = _rope_parameters(cfg)
    if params is None:
        base, scaling = cfg.get_float("rope_theta", theta), _rope_scaling(cfg)
    else:
        base, scaling = params.get_float("rope_theta", theta), _scaling(params)
    # transformers rotates that share of each head's dims for every RoPE family it builds
    # (_compute_default_rope_parameters reads it off the config): Phi-4-mini's 0.75
    where = params if params is not None and "partial_rotary_factor" in params.data else cfg
    return {"rotary_base": base, "rope_scaling": scaling,
            "rotary_percent": where.get_float("partial_rotary_factor", 1.0),
            "norm_epsilon": cfg.get_float("rms_norm_eps", eps)}  # fmt: skip


def _rope_parameters(cfg: HFConfig) -> HFConfig | None:
    """transformers 5's ``rope_parameters``: the base (``rope_theta``) and the scaling keys in
    one object, or one object per layer type where local and global layers differ (Gemma 3),
    whose ``full_attention`` one is the model's; None when absent. Beside ``rope_theta`` or
    ``rope_scaling`` (transformers 4's keys) it must agree with them, or it is refused."""
    value = cfg.data.get("rope_parameters")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise cfg.fail(f"rope_parameters must be an object or null, got {short_repr(value)}")
    where = f"{cfg.source}: rope_parameters"
    if "full_attention" in value:
        value, where = value["full_attention"], f"{where}.full_attention"
        if not isinstance(value, Mapping):
            raise cfg.fail(f"rope_parameters.full_attention must be an object, got "
                           f"{short_repr(value)}")  # fmt: skip
    params = HFConfig(value, where)
    old = {"rope_theta": cfg.data.get("rope_theta"), "rope_scaling": cfg.data.get("rope_scaling")}
    new = {"rope_theta": value.get("rope_theta"),
           "rope_scaling": _scaling(params) if old["rope_scaling"] is not None else None}
    if old["rope_scaling"] is not None:
        old["rope_scaling"] = _rope_scaling(cfg)
    differ = [key for key in old if old[key] is not None and old[key] != new[key]]
    if differ:
        raise cfg.fail(f"{' and '.join(differ)} disagree with rope_parameters (transformers "
                       f"5's form of both): give one")  # fmt: skip
    return params


ROPE_TYPES = frozenset({"default", "linear", "dynamic", "yarn", "longrope", "llama3", "su"})
"""The RoPE types transformers computes (``ROPE_INIT_FUNCTIONS`` in
``transformers/modeling_rope_utils.py``; ``su``, Phi-3's first name for longrope): any other
would be a typo the planner passed on to the exports."""
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
    return _scaling(HFConfig(value, f"{cfg.source}: rope_scaling"))


def _scaling(scaling: HFConfig) -> dict[str, Any] | None:
    """One object of RoPE's scaling keys (``rope_scaling``, or ``rope_parameters``) as
    :class:`~planner.spec.RopeScaling` fields; None for the "default" type."""
    value = scaling.data
    kind = scaling.get_str("rope_type", "") or scaling.get_str("type", "default")
    if kind == "default":
        return None
    if kind not in ROPE_TYPES:
        raise scaling.fail(f"rope_type {kind!r} is none of transformers' "
                           f"({', '.join(sorted(ROPE_TYPES))})")  # fmt: skip
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


def reject_qwen_window(cfg: HFConfig) -> None:
    """Refuse Qwen's sliding window where a layer has it: transformers windows the layers from
    ``max_window_layers`` on (default 28) under ``use_sliding_window`` with a
    ``sliding_window`` (``layer_types``, where the file gives it, says it per layer), which
    ``sliding_window.global_every`` cannot express; without those keys no layer is windowed."""
    types = cfg.data.get("layer_types")
    if isinstance(types, list):
        windowed = "sliding_attention" in types
    else:
        windowed = (cfg.get_bool("use_sliding_window", False)
                    and cfg.get_int("sliding_window", None) is not None
                    and cfg.get_int("max_window_layers", 28) < cfg.need_int("num_hidden_layers"))
    if windowed:
        raise cfg.fail("use_sliding_window=true is not supported: Qwen's window applies from "
                       "layer max_window_layers on, which sliding_window.global_every cannot "
                       "express; set use_sliding_window to false to plan without it")


def with_window(cfg: HFConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the config's ``sliding_window`` on every layer, where it sets one
    (Mistral, Mixtral, Phi-3: their attention masks every layer by it)."""
    window = cfg.get_int("sliding_window", None)
    return fields if window is None else {**fields, "sliding_window": {"window": window}}
