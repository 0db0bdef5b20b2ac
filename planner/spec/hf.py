"""Translation of Hugging Face ``config.json`` files into :class:`~planner.spec.ModelSpec`.

Each supported ``model_type`` has one small reader (the dense families' in
:mod:`planner.spec._hf_dense`, the mixture-of-experts families' in :mod:`planner.spec._hf_moe`,
both reading through :mod:`planner.spec._hf_config`) that maps the file's keys, as written, onto
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
from planner.spec._hf_config import HFConfig
from planner.spec._hf_dense import DENSE_READERS
from planner.spec._hf_moe import MOE_READERS
from planner.spec.messages import describe_validation_error, short_repr

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
    "rotary_percent": "partial_rotary_factor",
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
    **{family: {"moe.num_experts": "n_routed_experts", "moe.shared_experts": "n_shared_experts",
                "moe.shared_ffn_hidden_size": "n_shared_experts"}
       for family in ("deepseek_v2", "deepseek_v3")},
    "gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
             "ffn_hidden_size": "n_inner", "max_position_embeddings": "n_positions",
             "hidden_dropout": "resid_pdrop", "attention_dropout": "attn_pdrop",
             "norm_epsilon": "layer_norm_epsilon"},
}  # fmt: skip

_READERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = DENSE_READERS | MOE_READERS
# Multimodal families whose decoder is a text family's config under "text_config".
_NESTED = {"gemma3": "gemma3_text"}


def model_from_hf_config(data: Mapping[str, Any], *, source: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dict.

    ``source`` names the file in error messages and, when the config has no
    ``_name_or_path``, gives the model its name. Raises :class:`InputError` for an
    unsupported ``model_type``, a missing or mistyped key, or sizes ``ModelSpec`` rejects.
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in _NESTED:
        if not isinstance(data.get("text_config"), Mapping):
            raise InputError(f"{source}: model_type {model_type!r} keeps its decoder in "
                             f"text_config, an object; got "
                             f"{short_repr(data.get('text_config'))}")  # fmt: skip
        # A multimodal checkpoint (Gemma 3 4B-27B) keeps its decoder in text_config, which
        # transformers builds as the text model's own config class; its name is the outer one.
        text = {**data["text_config"], "model_type": _NESTED[model_type],
                "_name_or_path": _model_name(HFConfig(data, source))}
        return model_from_hf_config(text, source=f"{source} text_config")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise InputError(
            f"{source}: model_type {short_repr(model_type)} is not supported; "
            f"supported: {', '.join(sorted({*_READERS, *_NESTED}))}"
        )
    cfg = HFConfig(data, source)
    fields = reader(cfg)
    fields["name"] = _model_name(cfg)
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        keys = _KEYS | _FAMILY_KEYS.get(model_type, {})
        raise InputError(describe_validation_error(source, exc, keys=keys)) from None


def hf_key(model_type: str, field: str) -> str:
    """The ``config.json`` key a :class:`ModelSpec` field (dotted for a sub-block) is read
    from in ``model_type``'s files.

    >>> hf_key("mixtral", "moe.num_experts"), hf_key("llama", "num_query_groups")
    ('num_local_experts', 'num_key_value_heads')
    >>> hf_key("llama", "num_attention_heads")
    'num_attention_heads'
    """
    return (_KEYS | _FAMILY_KEYS.get(model_type, {})).get(field, field.rsplit(".", 1)[-1])


def _model_name(cfg: HFConfig) -> str:
    name = cfg.get_str("_name_or_path", "")
    if name:
        return name
    file_name = Path(cfg.source).name
    for suffix in (".config.json", ".json"):
        if file_name.endswith(suffix) and len(file_name) > len(suffix):
            return file_name[: -len(suffix)]
    return file_name or cfg.source

