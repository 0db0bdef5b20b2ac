"""Full recomputation of some of a stage's layers: ``recompute_layers`` of a
:class:`~planner.plan.config.ParallelConfig`, Megatron-LM's ``--recompute-method block
--recompute-num-layers N``.

Megatron builds one ``TransformerBlock`` per model chunk (virtual stage) and counts its layers
as ``num_layers_per_pipeline_rank = len(self.layers)``
(``NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/transformer_block.py:334``); under
``block`` the first ``N`` of them are checkpointed one layer at a time and the rest run
without (``megatron/core/recompute.py:167-178``): every chunk of every stage recomputes
``min(N, its layers)`` layers, its first. (``uniform`` with ``N > 1`` instead checkpoints
runs of ``N`` layers as one unit, ``megatron/core/recompute.py:157-166``: every layer still
reruns, the chunk keeps one input per run and rebuilds ``N`` layers' activations at once; it
saves memory past full recomputation at no time, which no search here needs, so it is not
priced.)

A stage's layers are contiguous in the layer order, as :func:`~planner.uniform.estimate.
stage_kinds` counts them, its chunks equal contiguous parts of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from planner.cost.layer import LayerCost, partly_recomputed
from planner.graph import lowered
from planner.plan.chunks import chunk_sizes
from planner.spec import ModelSpec, TrainingSpec

Chunk = tuple[tuple[str, int, int], ...]
"""A model chunk's decoder layers by kind: (kind, layers, of which recomputed), sorted."""


@lru_cache(maxsize=1024)
def stage_chunks(
    model: ModelSpec, training: TrainingSpec, layers: tuple[int, ...], *, vpp: int,
    recompute_layers: int,
) -> tuple[tuple[Chunk, ...], ...]:  # fmt: skip
    """Each stage's chunks (``layers[i]`` decoder layers per stage, cut into ``vpp`` chunks
    as Megatron-Core cuts them: :func:`~planner.plan.chunks.chunk_sizes`), with how
    many layers of each kind recompute when each chunk's first ``recompute_layers`` do.

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt3-175b.json")
    >>> training = planner.spec.reading.fill_training(model)
    >>> stage_chunks(model, training, (48, 48), vpp=2, recompute_layers=5)[0]
    ((('dense', 24, 5),), (('dense', 24, 5),))
    """
    index = lowered(model, training, 1)[1]
    kind_of = {layer: kind for kind, of in index.layers_by_kind.items() for layer in of}
    stages = []
    start = 1
    for sizes in chunk_sizes(layers, vpp, model.mtp_layers):
        chunks = []
        for size in sizes:
            tally: dict[str, list[int]] = {}
            for position, layer in enumerate(range(start, start + size)):
                held = tally.setdefault(kind_of[layer], [0, 0])
                held[0] += 1
                held[1] += position < recompute_layers
            chunks.append(tuple(sorted((k, n, r) for k, (n, r) in tally.items())))
            start += size
        stages.append(tuple(chunks))
    return tuple(stages)


def recomputed_counts(chunks: tuple[tuple[Chunk, ...], ...]) -> dict[str, int]:
    """Layers of each kind that recompute, over all the stages."""
    counts: dict[str, int] = {}
    for stage in chunks:
        for chunk in stage:
            for kind, _, recomputed in chunk:
                counts[kind] = counts.get(kind, 0) + recomputed
    return counts


def chunks_cost(
    chunks: tuple[Chunk, ...], *, every: Mapping[str, LayerCost], kept: Mapping[str, LayerCost]
) -> LayerCost:
    """One stage's decoder layers, chunk by chunk (:func:`~planner.cost.layer.
    partly_recomputed`; its numbers floats or arrays, as ``every`` and ``kept``'s): ``every``
    a layer of each kind under full recomputation, ``kept`` under none. A rebuilt layer's
    transient is counted against its own kind's freed activations only (a chunk that mixes
    kinds, as DeepSeek's first dense layers do, is charged at most one layer more)."""
    total = LayerCost.zero()
    for chunk in chunks:
        for kind, layers, recomputed in chunk:
            total = total + partly_recomputed(every[kind], kept[kind], layers=layers,
                                              recomputed=recomputed)  # fmt: skip
    return total
