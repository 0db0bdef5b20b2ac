"""Megatron-LM's command line for the model's architecture, as ``pretrain_gpt.py`` builds it:
the widths, norms, positions (RoPE and its scaling, sliding windows), biases, latent attention
and the experts with their router, shared by the Megatron-LM and MindSpeed launchers (and
Megatron-DeepSpeed's, which takes the same flags). The launch itself (degrees, split, batch,
precision, recomputation, overlaps) is :mod:`planner.frameworks._megatron_flags`.

Every flag is checked against ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at
d98e8a64ddf3 and at core_v0.12.1; ``benchmarks/check_megatron_args.py`` feeds the text to
Megatron-LM's own ``parse_args`` and ``validate_args``.
"""

from __future__ import annotations

from planner.frameworks._megatron_flags import Flag
from planner.frameworks._megatron_vocab import MAX_VOCAB_DIVISOR, padded_vocab, vocab_divisor
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec, MoESpec
from planner.vocabulary import MoeDispatcher

_NORMALIZATION = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
_POSITIONS = {"learned": "learned_absolute", "rope": "rope"}


def model_flags(
    model: ModelSpec, *, seq_length: int, dispatcher: MoeDispatcher = "alltoall"
) -> list[Flag]:
    """The model's architecture, as ``pretrain_gpt.py`` builds it (vocabulary aside), its
    experts' tokens exchanged by ``dispatcher`` (:func:`moe_flags`)."""
    flags: list[Flag] = [
        ("--num-layers", model.num_layers),
        ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn),
        ("--num-attention-heads", model.num_attention_heads),
    ]
    if model.mla is None:
        if model.query_groups != model.num_attention_heads:
            flags += [("--group-query-attention", None),
                      ("--num-query-groups", model.query_groups)]  # fmt: skip
        flags.append(("--kv-channels", model.head_dim))
    flags += [
        ("--max-position-embeddings", max_positions(model, seq_length)),
        ("--position-embedding-type", _POSITIONS[model.position_embedding]),
        *rope_flags(model),
        ("--normalization", _NORMALIZATION[model.normalization]),
        ("--norm-epsilon", model.norm_epsilon),
    ]
    flags += [("--swiglu", None)] * (model.activation == "swiglu")
    flags += [("--untie-embeddings-and-output-weights", None)] * (not model.tie_word_embeddings)
    flags += bias_flags(model)
    flags += [("--qk-layernorm", None)] * model.qk_layernorm
    flags += window_flags(model)
    flags += [("--hidden-dropout", model.hidden_dropout),
              ("--attention-dropout", model.attention_dropout)]  # fmt: skip
    # The MTP loss's weight stays Megatron's default (0.1), which prices nothing.
    flags += [("--mtp-num-layers", model.mtp_layers)] * (model.mtp_layers > 0)
    return flags + mla_flags(model) + moe_flags(model, dispatcher)


def window_flags(model: ModelSpec) -> list[Flag]:
    """Sliding-window attention: ``--window-size LEFT,RIGHT`` counts the keys before and after
    a query (Transformer Engine's ``window_size``), so a causal window of w keys, the query's
    own included, is ``w-1,0``; ``--window-attn-skip-freq N`` makes every N-th layer (from 1)
    global (megatron/core/transformer/utils.py:531-545)."""
    window = model.sliding_window
    if window is None:
        return []
    flags: list[Flag] = [("--window-size", f"{window.window - 1},0")]
    return flags + [("--window-attn-skip-freq", window.global_every)] * bool(window.global_every)


def rope_flags(model: ModelSpec) -> list[Flag]:
    """RoPE's base period, the share of a head it rotates (``--rotary-percent``) and
    long-context scaling: Llama 3.1's (``--use-rope-scaling``, whose
    low and high frequency factors 1 and 4 and original context 8192 Megatron fixes,
    ``megatron/core/models/common/embeddings/rotary_pos_embedding.py:92-98``) and, under MLA
    (``MLATransformerConfig``'s default ``rope_type`` yarn), YaRN's factor and mscales. What
    these flags cannot say is in :func:`rope_notes`."""
    if model.position_embedding != "rope":
        return []
    flags: list[Flag] = [("--rotary-base", round(model.rotary_base))]  # an int to argparse
    flags += [("--rotary-percent", model.rotary_percent)] * (model.rotary_percent < 1)
    scaling = model.rope_scaling
    if scaling is not None and scaling.rope_type == "llama3":
        flags += [("--use-rope-scaling", None), ("--rope-scaling-factor", scaling.factor)]
    if scaling is not None and scaling.rope_type == "yarn" and model.mla is not None:
        flags += [("--rotary-scaling-factor", scaling.factor),
                  ("--mscale", _or(scaling.mscale, 1.0)),
                  ("--mscale-all-dim", _or(scaling.mscale_all_dim, 0.0))]  # fmt: skip
    return flags


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}  # fmt: skip
_MLA_YARN_FIXED = {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096}


def rope_notes(model: ModelSpec) -> tuple[str, ...]:
    """What the RoPE flags cannot say: a fractional base, scaling settings Megatron fixes, and
    scaling types it has no flag for."""
    if model.position_embedding != "rope":
        return ()
    notes = []
    if model.rotary_base != round(model.rotary_base):
        notes.append(f"--rotary-base is an integer: the model's {model.rotary_base} is rounded")
    scaling = model.rope_scaling
    fixed = {"llama3": _LLAMA3_FIXED, "yarn": _MLA_YARN_FIXED if model.mla else None}
    if scaling is None:
        if model.mla is not None:
            notes.append("the model scales no RoPE, but Megatron's MLA applies YaRN by default: "
                         "add --rope-type rope (Megatron-LM after core_v0.12.1)")
        return tuple(notes)
    values = fixed.get(scaling.rope_type)
    if values is None:
        return (*notes, f"rope_scaling {scaling.rope_type!r} (factor {scaling.factor}) has no "
                        f"Megatron flag here: the launch applies no RoPE scaling")
    dumped = scaling.model_dump()
    differ = [f"{key} {dumped[key]} (Megatron fixes {value})" for key, value in values.items()
              if dumped[key] is not None and dumped[key] != value]  # fmt: skip
    if differ:
        notes.append(f"rope_scaling {scaling.rope_type}: " + ", ".join(differ))
    return tuple(notes)


def bias_flags(model: ModelSpec) -> list[Flag]:
    """Linear biases (Megatron's default) and the QKV bias alone (Qwen2's)."""
    if model.bias:
        return []  # --add-bias-linear also adds the QKV bias; a rule refuses bias without it
    return [("--disable-bias-linear", None)] + [("--add-qkv-bias", None)] * model.has_qkv_bias


def max_positions(model: ModelSpec, seq_length: int) -> int:
    """``--max-position-embeddings``: the model's, or the sequence length when a RoPE model
    trains longer (Megatron asserts ``max_position_embeddings >= seq_length``; with RoPE it only
    sizes the rotary table, no weights)."""
    if model.position_embedding == "rope":
        return max(model.max_position_embeddings, seq_length)
    return model.max_position_embeddings


def mla_flags(model: ModelSpec) -> list[Flag]:
    """DeepSeek's multi-head latent attention: ranks and head dims."""
    mla = model.mla
    if mla is None:
        return []
    # Megatron's default q_lora_rank is None too: queries not compressed.
    queries: list[Flag] = [] if mla.q_lora_rank is None else [("--q-lora-rank", mla.q_lora_rank)]
    return [("--multi-latent-attention", None), *queries,
            ("--kv-lora-rank", mla.kv_lora_rank), ("--qk-head-dim", mla.qk_nope_head_dim),
            ("--qk-pos-emb-head-dim", mla.qk_rope_head_dim),
            ("--v-head-dim", mla.v_head_dim)]  # fmt: skip


_DISPATCHER_FLAGS: dict[MoeDispatcher, list[Flag]] = {
    "alltoall": [("--moe-token-dispatcher-type", "alltoall")],
    "deepep": [("--moe-token-dispatcher-type", "flex"),
               ("--moe-flex-dispatcher-backend", "deepep")],
}


def moe_flags(model: ModelSpec, dispatcher: MoeDispatcher = "alltoall") -> list[Flag]:
    """Routed and shared experts, which layers have them, and the router.

    Tokens are dispatched with all-to-all, as the planner prices expert parallelism, or by
    DeepEP (``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep``,
    ``megatron/core/transformer/transformer_config.py:891-900``); with a
    capacity factor each expert is padded to its capacity (``--moe-pad-expert-input-to-capacity``,
    ``megatron/core/transformer/transformer_config.py:917-923``). Two router
    settings follow from what Megatron-Core accepts: the expert bias of aux-loss-free balancing
    needs sigmoid scores (DeepSeek-V3's), and top-1 routing needs the softmax before the top-k.
    """
    moe = model.moe
    if moe is None:
        return []
    flags: list[Flag] = [("--num-experts", moe.num_experts), ("--moe-router-topk", moe.top_k),
                         ("--moe-ffn-hidden-size", moe.ffn_hidden_size),
                         *_DISPATCHER_FLAGS[dispatcher]]  # fmt: skip
    if moe.shared_experts:
        flags.append(("--moe-shared-expert-intermediate-size", moe.shared_ffn))
    if moe.capacity_factor is not None:  # padded to it, as the planner prices every expert
        flags += [("--moe-expert-capacity-factor", moe.capacity_factor),
                  ("--moe-pad-expert-input-to-capacity", None)]  # fmt: skip
    pattern = moe_layer_pattern(model)
    if pattern is not None:
        flags.append(("--moe-layer-freq", pattern))
    return flags + router_flags(moe)


def router_flags(moe: MoESpec) -> list[Flag]:
    """The router as Megatron-Core's ``topk_routing_with_score_function`` runs it
    (``megatron/core/transformer/moe/moe_utils.py:900-934``): softmax after the top-k (the k
    weights renormalized) unless ``--moe-router-pre-softmax``, which top-1 routing needs
    (``transformer_config.py:2661-2669``); sigmoid scores always renormalized over the k; the
    expert bias (sigmoid only, ``transformer_config.py:2617``) choosing experts but not
    weighting them; then the scaling factor; experts drawn from the best groups."""
    flags: list[Flag] = []
    if moe.score_function == "sigmoid":
        flags.append(("--moe-router-score-function", "sigmoid"))
    if moe.router_expert_bias:
        flags.append(("--moe-router-enable-expert-bias", None))
    if moe.score_function == "softmax" and (moe.top_k == 1 or not moe.router_topk_normalized):
        flags.append(("--moe-router-pre-softmax", None))
    if moe.router_topk_scaling_factor is not None:
        flags.append(("--moe-router-topk-scaling-factor", moe.router_topk_scaling_factor))
    if moe.router_num_groups is not None:
        flags += [("--moe-router-num-groups", moe.router_num_groups),
                  ("--moe-router-group-topk", moe.router_group_topk)]  # fmt: skip
    if moe.router_aux_loss_coeff is not None:  # with the default aux_loss balancing
        flags.append(("--moe-aux-loss-coeff", moe.router_aux_loss_coeff))
    return flags


def grouped_gemm_flags(resolved: ResolvedConfig, model: ModelSpec) -> list[Flag]:
    """A rank's local experts as one grouped GEMM (``TEGroupedMLP``), what MoE runs use,
    rather than one GEMM per expert in turn (``SequentialMLP``, the default). bf16 only:
    core_v0.12.1 asserts it (``megatron/training/arguments.py:712-713``). The cost model
    prices it as one grouped kernel per expert projection on the device's grouped-GEMM curve
    (:func:`planner.graph.stacks.grouped_experts`, :func:`planner.cost.compute.op_time`);
    Transformer Engine launches one cuBLAS GEMM per expert over several streams instead."""
    if model.moe is None or resolved.training.precision != "bf16":
        return []
    return [("--moe-grouped-gemm", None)]


def moe_layer_pattern(model: ModelSpec) -> str | None:
    """``--moe-layer-freq`` as a Python list expression (1 = MoE layer, 0 = dense), or None when
    every layer has experts (Megatron's default).

    >>> from planner.spec import MoESpec
    >>> spec = ModelSpec(name="m", num_layers=7, hidden_size=8, num_attention_heads=2,
    ...                  vocab_size=16, max_position_embeddings=8, moe=MoESpec(
    ...                      num_experts=4, top_k=1, ffn_hidden_size=8, first_dense_layers=2,
    ...                      layer_freq=2))
    >>> moe_layer_pattern(spec)
    '[0]*2+([1]+[0]*1)*2+[1]'
    """
    moe = model.moe
    if moe is None or (moe.first_dense_layers == 0 and moe.layer_freq == 1):
        return None
    dense, freq = moe.first_dense_layers, moe.layer_freq
    repeats, tail = divmod(model.num_layers - dense, freq)
    unit = "[1]" if freq == 1 else f"([1]+[0]*{freq - 1})"
    parts = [f"[0]*{dense}"] * (dense > 0) + [f"{unit}*{repeats}"] * (repeats > 0)
    if tail:
        parts.append("[1]" + (f"+[0]*{tail - 1}" if tail > 1 else ""))
    return "+".join(parts)


def vocab_notes(model: ModelSpec, resolved: ResolvedConfig) -> tuple[str, ...]:
    """What the vocabulary and position flags do that the user should know."""
    tp, seq = resolved.config.tp, resolved.training.seq_length
    notes = []
    rows = padded_vocab(model.vocab_size, tp)
    if rows != model.vocab_size:
        notes.append(f"vocab_size({model.vocab_size}) is no multiple of tp({tp}): Megatron pads "
                     f"the embedding and output layer to {rows} rows")  # fmt: skip
    # Megatron's default divisor pads past the vocabulary: a checkpoint trained at it holds
    # more rows than this launch builds, and loads only with the default back
    default = padded_vocab(model.vocab_size, tp, divisor=MAX_VOCAB_DIVISOR)
    if vocab_divisor(model.vocab_size, tp) != MAX_VOCAB_DIVISOR and default != rows:
        notes.append(f"--make-vocab-size-divisible-by {vocab_divisor(model.vocab_size, tp)} "
                     f"builds the {rows} rows priced; Megatron's default ({MAX_VOCAB_DIVISOR}) "
                     f"pads to {default} at tp({tp}): to resume a checkpoint trained at the "
                     f"default, keep the default (its embedding and output layer "
                     f"{default - rows} rows larger than priced)")  # fmt: skip
    if max_positions(model, seq) != model.max_position_embeddings:
        notes.append(f"--max-position-embeddings is the sequence length {seq} (the model's "
                     f"{model.max_position_embeddings} is shorter): with RoPE it sizes the "
                     f"rotary table only")  # fmt: skip
    moe = model.moe
    if moe is not None and moe.score_function == "sigmoid" and not moe.router_topk_normalized:
        notes.append("Megatron renormalizes sigmoid routing weights over the top k; the model "
                     "does not (norm_topk_prob false)")
    return (*notes, *rope_notes(model))
