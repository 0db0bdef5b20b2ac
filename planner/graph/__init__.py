"""The operator graph: lowering, per-layer views and counts over it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from planner.graph.lower import decoder_layer_kind, lower
from planner.graph.ops import EXPERT_PARALLEL_DIMS, TENSOR_PARALLEL_DIMS, Op, OpKind, Tensor
from planner.spec import ModelSpec, TrainingSpec

__all__ = [
    "EXPERT_PARALLEL_DIMS",
    "TENSOR_PARALLEL_DIMS",
    "LayerIndex",
    "Op",
    "OpKind",
    "ParameterCount",
    "Tensor",
    "decoder_layer_kind",
    "index_layers",
    "lower",
    "parameter_count",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCount:
    """Trainable parameters: all of them, and those one token uses (MoE)."""

    total: int
    """Every trainable parameter (a tied weight counted once)."""
    active: int
    """Parameters one token uses: routed experts weighted by top_k / num_experts, rounded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerIndex:
    """The graph's ops grouped by layer, and layers grouped by kind."""

    ops_by_layer: dict[int, tuple[Op, ...]]
    """Each layer's ops in topological order, by layer index (0 embedding, 1..L decoder
    layers, L + 1 head)."""
    layers_by_kind: dict[str, tuple[int, ...]]
    """The indices of the layers of each kind (``embedding``, ``dense``, ``moe``, ``head``), in
    graph order."""

    def representative(self, kind: str) -> tuple[Op, ...]:
        """The ops of the first layer of ``kind`` (all layers of a kind are identical)."""
        return self.ops_by_layer[self.layers_by_kind[kind][0]]


def _module(op: Op) -> int:
    """``d`` for an op of the head's ``d``-th multi-token-prediction module (``mtp<d>.*``), 0
    for any other."""
    first = op.name.partition(".")[0]
    return int(first[3:]) if first.startswith("mtp") and first[3:].isdigit() else 0


def index_layers(graph: nx.DiGraph) -> LayerIndex:
    """Group ``graph``'s ops by layer (in topological order, a head's multi-token-prediction
    modules after its own loss) and layers by kind, in the layers' order."""
    ops: dict[int, list[Op]] = {}
    for name in nx.topological_sort(graph):
        op: Op = graph.nodes[name]["op"]
        ops.setdefault(op.layer, []).append(op)
    for layer_ops in ops.values():
        layer_ops.sort(key=_module)  # stable: each module's ops stay in topological order
    kinds: dict[str, list[int]] = {}
    for layer in sorted(ops):
        kinds.setdefault(ops[layer][0].layer_kind, []).append(layer)
    return LayerIndex(
        ops_by_layer={layer: tuple(v) for layer, v in ops.items()},
        layers_by_kind={kind: tuple(v) for kind, v in kinds.items()},
    )


def lowered(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int
) -> tuple[nx.DiGraph, LayerIndex]:
    """The operator graph and its layer index, computed once per input: the estimator and the
    search ask for the same model again and again. Callers must not modify the graph.

    The graph does not depend on the global batch (only on the microbatch, the sequence and
    the precision), so runs that differ only in it share one graph."""
    return _lowered(model, _per_microbatch(training), micro_batch_size)


def _per_microbatch(training: TrainingSpec) -> TrainingSpec:
    """``training`` with the global batch left out (set to 1): what a graph depends on."""
    return training.model_copy(update={"global_batch_size": 1})


# Validating MPT's FSDP runs and the calibration runs asks for 78 graphs: an LRU smaller than
# a pass lowers every graph again on every pass (calibrate's fit makes many). An entry holds
# 0.6 MB for a typical model, 2.4 MB for the largest bundled ones.
@lru_cache(maxsize=128)
def _lowered(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int
) -> tuple[nx.DiGraph, LayerIndex]:
    graph = lower(model, training, micro_batch_size=micro_batch_size)
    return graph, index_layers(graph)


def forward_flops(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> float:
    """Model FLOPs of one microbatch's forward pass through the whole model (the one count
    that model FLOP/s, MFU and the search's bounds are made of)."""
    return _forward_flops(model, _per_microbatch(training), micro_batch_size)


@lru_cache(maxsize=128)
def _forward_flops(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> float:
    index = _lowered(model, training, micro_batch_size)[1]
    return sum(op.flops for ops in index.ops_by_layer.values() for op in ops)


def parameter_count(graph: nx.DiGraph) -> ParameterCount:
    """Sum of the ops' parameters; ``active`` weighs routed experts by top_k / experts.

    >>> from planner.spec import ModelSpec, TrainingSpec
    >>> m = ModelSpec(name="tiny", num_layers=1, hidden_size=8, num_attention_heads=2,
    ...               vocab_size=10, max_position_embeddings=4)
    >>> parameter_count(lower(m, TrainingSpec(seq_length=4, global_batch_size=1))).total
    1000
    """
    total = 0
    active = 0.0
    for name in graph:
        op: Op = graph.nodes[name]["op"]
        total += op.params
        active += op.params * op.active_fraction
    return ParameterCount(total=total, active=round(active))
