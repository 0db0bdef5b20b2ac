"""``planner info``: what the planner understood of a model."""

from __future__ import annotations

from typing import Any

from planner.errors import ConfigError
from planner.graph import index_layers, lower, parameter_count
from planner.spec import ModelSpec
from planner.spec.reading import fill_training


def model_info(model: ModelSpec, *, seq_len: int | None = None) -> dict[str, Any]:
    """Architecture, parameter counts, FLOPs per token and the operator graph's size.

    FLOPs are matrix-multiply FLOPs of one token's forward pass at ``seq_len`` (default: the
    model's training sequence length, else its maximum position), counting the full ``s x s``
    attention scores as Narayanan et al. (Eq. 3) do; training costs three times that.
    ``seq_length`` is the length they are counted at and ``seq_length_from`` where it came
    from: ``--seq-len``, ``training.seq_length`` or ``max_position_embeddings``.
    """
    if seq_len is not None and seq_len <= 0:
        raise ConfigError(f"--seq-len must be positive, got {seq_len}")
    source = "--seq-len" if seq_len is not None else "training.seq_length"
    if seq_len is None and model.training is None:
        seq_len = model.max_position_embeddings  # no run to describe: the longest sequence
        source = "max_position_embeddings"
    # FLOPs per token do not depend on the batch: one sequence stands in for it.
    training = fill_training(model, seq_length=seq_len, global_batch_size=1)
    seq = training.seq_length
    graph = lower(model, training, micro_batch_size=1)
    params = parameter_count(graph)
    # The multi-token-prediction modules apart: published totals (DeepSeek-V3's 671B) leave
    # them out.
    main_params = params.total if model.mtp_layers == 0 else parameter_count(lower(
        model.model_copy(update={"mtp_layers": 0}), training, micro_batch_size=1)).total
    index = index_layers(graph)
    forward = sum(graph.nodes[n]["op"].flops for n in graph) / seq
    attention = "mla" if model.mla else ("gqa" if model.query_groups < model.num_attention_heads
                                          else "mha")  # fmt: skip
    return {
        "name": model.name,
        "architecture": {
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "num_query_groups": model.query_groups,
            "kv_channels": model.head_dim if model.mla is None else None,
            "ffn_hidden_size": model.ffn,
            "vocab_size": model.vocab_size,
            "attention": attention,
            "activation": model.activation,
            "normalization": model.normalization,
            "position_embedding": model.position_embedding,
            "tie_word_embeddings": model.tie_word_embeddings,
            "moe": model.moe.model_dump() if model.moe else None,
            "mla": model.mla.model_dump() if model.mla else None,
            "mtp_layers": model.mtp_layers,
        },
        "params_total": params.total,
        "params_active": params.active,
        "params_mtp": params.total - main_params,
        "seq_length": seq,
        "seq_length_from": source,
        "forward_flops_per_token": forward,
        "training_flops_per_token": 3 * forward,
        "layer_kinds": {kind: len(layers) for kind, layers in index.layers_by_kind.items()},
        "graph": {"operators": graph.number_of_nodes(), "edges": graph.number_of_edges()},
    }

