"""The Hugging Face readers of the mixture-of-experts families: Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2 and DeepSeek-V3 (with their multi-head latent attention). Each maps one ``model_type``'s
``config.json`` onto :class:`~planner.spec.ModelSpec` fields, placing the sparse layers as
``transformers`` does where ModelSpec can say so.

Split from :mod:`planner.spec.hf`, whose entry point dispatches through :data:`MOE_READERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.spec._hf_config import (
    HFConfig,
    gated_activation,
    reject_attention_bias,
    reject_qwen_window,
    rope_and_norm,
    rope_decoder,
    with_window,
)
from planner.spec.messages import short_repr


def _mixtral(cfg: HFConfig) -> dict[str, Any]:
    fields = rope_decoder(cfg)
    # In Mixtral intermediate_size is the width of each expert; every layer is sparse.
    fields["moe"] = {
        "num_experts": cfg.need_int("num_local_experts"),
        "top_k": cfg.need_int("num_experts_per_tok"),
        "ffn_hidden_size": fields["ffn_hidden_size"],
        "router_aux_loss_coeff": cfg.get_float("router_aux_loss_coef", 0.001),
    }
    # A window (Mixtral's first configs set 4096) is carried so that the spec refuses it
    # beside experts in its own words rather than the window being dropped.
    return with_window(cfg, fields)


def _qwen2_moe(cfg: HFConfig) -> dict[str, Any]:
    # Not modelled: the shared expert's sigmoid gate, a hidden_size x 1 weight per MoE layer.
    reject_qwen_window(cfg)
    fields = {**rope_decoder(cfg), "qkv_bias": True}
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


def _qwen3_moe(cfg: HFConfig) -> dict[str, Any]:
    reject_attention_bias(cfg)
    reject_qwen_window(cfg)
    fields = {**rope_decoder(cfg), "qk_layernorm": True}
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


def _deepseek_v3(cfg: HFConfig) -> dict[str, Any]:
    # num_nextn_predict_layers: the multi-token-prediction modules the checkpoint was trained
    # with (transformers' DeepseekV3 builds none; Megatron-Core trains them: mtp_layers).
    fields = _deepseek(cfg, _deepseek_v3_router)
    return fields | {"mtp_layers": cfg.get_int("num_nextn_predict_layers", 0) or 0}


def _deepseek_v2(cfg: HFConfig) -> dict[str, Any]:
    # DeepSeek-V2 (and V2-Lite) is V3's layer without the routing bias or the
    # multi-token-prediction modules: the same MLA, shared experts and dense prefix.
    return _deepseek(cfg, _deepseek_v2_router)


def _deepseek(cfg: HFConfig, router: Callable[[HFConfig], dict[str, Any]]) -> dict[str, Any]:
    reject_attention_bias(cfg)
    gated_activation(cfg)
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
        **rope_and_norm(cfg),
        "mla": {
            "q_lora_rank": cfg.get_int("q_lora_rank", None),
            "kv_lora_rank": cfg.need_int("kv_lora_rank"),
            "qk_nope_head_dim": cfg.need_int("qk_nope_head_dim"),
            "qk_rope_head_dim": cfg.need_int("qk_rope_head_dim"),
            "v_head_dim": cfg.need_int("v_head_dim"),
        },
        "moe": _deepseek_moe(cfg, num_layers, router),
    }


def _deepseek_moe(cfg: HFConfig, num_layers: int,
                  router: Callable[[HFConfig], dict[str, Any]]) -> dict[str, Any] | None:
    # DeepSeek's modeling makes layer i sparse when i >= first_k_dense_replace and
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
        **router(cfg),
    }
    if shared:
        # DeepSeek fuses its shared experts into one MLP of n_shared_experts x the expert width.
        experts |= {"shared_experts": shared, "shared_ffn_hidden_size": shared * expert_width}
    return _moe_fields(layout, experts)


def _deepseek_v3_router(cfg: HFConfig) -> dict[str, Any]:
    """Sigmoid (or softmax) scores, renormalized and scaled top-k weights, and group-limited
    routing, at transformers' DeepseekV3Config defaults (it hard-codes sigmoid scores; the
    released config says scoring_func); aux-loss-free balancing (``noaux_tc``) learns a
    per-expert bias on the routing scores."""
    score = cfg.get_str("scoring_func", "sigmoid")
    if score not in ("softmax", "sigmoid"):
        raise cfg.fail(f"scoring_func {short_repr(score)} is not supported; supported: "
                       f"sigmoid, softmax")  # fmt: skip
    groups, chosen = cfg.positive_int("n_group", 8), cfg.positive_int("topk_group", 4)
    grouped = {"router_num_groups": groups, "router_group_topk": chosen} if groups > 1 else {}
    return {"router_score_function": score,
            "router_expert_bias": cfg.get_str("topk_method", "") == "noaux_tc",
            "router_topk_normalized": cfg.get_bool("norm_topk_prob", True),
            "router_topk_scaling_factor": cfg.get_float("routed_scaling_factor", 2.5),
            **grouped}  # fmt: skip


_V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def _deepseek_v2_router(cfg: HFConfig) -> dict[str, Any]:
    """Softmax scores (DeepSeek-V2's gate knows no other), top-k weights scaled by
    ``routed_scaling_factor`` or, with ``norm_topk_prob``, renormalized and not scaled (its
    MoEGate.forward: one or the other), at DeepseekV2Config's defaults; ``group_limited_greedy``
    draws the k experts from the ``topk_group`` best of ``n_group`` groups (the device-limited
    routing of the V2 paper), ``greedy`` from all of them; ``aux_loss_alpha`` its balancing
    loss."""
    score = cfg.get_str("scoring_func", "softmax")
    if score != "softmax":
        raise cfg.fail(f"scoring_func {short_repr(score)} is not supported; DeepSeek-V2's gate "
                       "scores with softmax")  # fmt: skip
    method = cfg.get_str("topk_method", "greedy")
    if method not in _V2_TOPK_METHODS:
        raise cfg.fail(f"topk_method {short_repr(method)} is not supported; supported: "
                       f"{', '.join(_V2_TOPK_METHODS)}")  # fmt: skip
    grouped: dict[str, int] = {}
    if method == "group_limited_greedy":
        if cfg.data.get("n_group") is None or cfg.data.get("topk_group") is None:
            raise cfg.fail("topk_method 'group_limited_greedy' needs n_group and topk_group "
                           "(DeepSeek-V2's gate groups the experts by them)")  # fmt: skip
        groups, chosen = cfg.positive_int("n_group", 1), cfg.positive_int("topk_group", 1)
        if groups > 1:
            grouped = {"router_num_groups": groups, "router_group_topk": chosen}
    normalized = cfg.get_bool("norm_topk_prob", False) and cfg.need_int("num_experts_per_tok") > 1
    # the gate scales the weights only where it does not renormalize them
    scale = 1.0 if normalized else cfg.get_float("routed_scaling_factor", 1.0)
    # aux_loss_alpha: its balancing loss (seq_aux: per sequence), which a model without the
    # routing bias trains with; Megatron-Core's default aux_loss balances per microbatch
    return {"router_score_function": score, "router_topk_normalized": normalized,
            "router_topk_scaling_factor": scale,
            "router_aux_loss_coeff": cfg.get_float("aux_loss_alpha", 0.001),
            **grouped}  # fmt: skip


def _qwen_moe_layout(cfg: HFConfig, num_layers: int) -> tuple[int, int] | None:
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


def _qwen_moe(cfg: HFConfig, num_layers: int, experts: dict[str, Any]) -> dict[str, Any] | None:
    if experts["num_experts"] == 0:  # transformers builds no sparse layer then
        return None
    return _moe_fields(_qwen_moe_layout(cfg, num_layers), experts)


def _moe_fields(layout: tuple[int, int] | None, experts: dict[str, Any]) -> dict[str, Any] | None:
    if layout is None:
        return None
    first_dense, freq = layout
    return {**experts, "first_dense_layers": first_dense, "layer_freq": freq}


MOE_READERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = {
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
}
"""The reader of each mixture-of-experts ``model_type``."""
