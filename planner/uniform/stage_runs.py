"""A batch's pipeline stages: a layer split's runs of equal stages
(:func:`~planner.cost.step.equal_runs`), what a run costs that no microbatch, schedule or
switch changes (:func:`~planner.cost.stage_weights.stage_statics`), once per mesh, split and
ZeRO stage, and the runs of a group of configurations as arrays
(:class:`~planner.cost.step.StageRun`), for :func:`~planner.uniform.batch.estimate_batch`;
each stage composed as :func:`~planner.uniform.estimate.estimate` composes it
(:mod:`planner.uniform.stages`)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from planner import cost
from planner.cost.layer import LayerCost
from planner.cost.stage_weights import StageCost, StageStatics, stage_statics
from planner.cost.step import StageRun, equal_runs
from planner.graph.ops import TRANSFORMER_KINDS
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.columns import factorize
from planner.uniform.recompute_layers import Chunk
from planner.uniform.stages import (
    StageKinds,
    WeightGroups,
    stage_kinds,
    stage_params,
    stage_time,
    stage_weights,
    tied_copy,
)
from planner.vocabulary import RECOMPUTE_MODES, Offload, OptimizerMoments

LAYER_FIELDS = tuple(f.name for f in fields(LayerCost))
"""The per-microbatch costs of a layer, in the order a batch's layer table keeps them."""

SplitRuns = tuple[tuple[int, int, StageKinds, tuple[Chunk, ...] | None], ...]
"""A layer split's runs of equal stages: (first stage, stages, layer kinds and counts, and
when only some layers recompute, the stage's chunks with the layers that do)."""


def stage_runs(
    model: ModelSpec, training: TrainingSpec, layers: tuple[int, ...],
    chunks: tuple[tuple[Chunk, ...], ...] | None = None, *, head_first: bool = False,
) -> SplitRuns:  # fmt: skip
    """The runs of equal stages of a layer split; ``chunks``: each stage's, when only some
    layers recompute (:func:`~planner.uniform.recompute_layers.stage_chunks`);
    ``head_first``: a V schedule's (:func:`~planner.uniform.stages.stage_kinds`)."""
    stages = stage_kinds(model, training, 1, layers, head_first=head_first)
    keys = [(kinds, None if chunks is None else chunks[i]) for i, kinds in enumerate(stages)]
    return tuple((first, count, *keys[first]) for first, count in equal_runs(keys))


def static_costs(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, stage: Any,
    params_by_kind: dict[str, WeightGroups], split: SplitRuns, *,
    zero: int, v_shape: bool = False, offload: Offload = "none",
    moments: OptimizerMoments = "fp32",
) -> StageStatics:  # fmt: skip
    """A split's runs' weights on ``stage``'s mesh, as :func:`estimate` gathers them (no tied
    copy under a V schedule: its first stage holds the embedding and the head)."""
    stages = [StageCost(time=LayerCost.zero(), zero=zero,
                        weights=stage_weights(stage_params(kinds, params_by_kind), stage))
              for _, _, kinds, _ in split]  # fmt: skip
    tied = None if v_shape else tied_copy(model, stage)
    gathered = cost.gathered_bytes_per_param(training.precision, training.stack)
    held = cost.states_precision(training.precision, training.stack, moments)
    return stage_statics(cluster, held, stages, tied=tied, offload=offload,
                         gathered_bytes_per_param=gathered, stack=training.stack)  # fmt: skip


def run_costs(
    split: SplitRuns, by_kind: dict[str, np.ndarray], static: list[StageStatics],
    static_of: np.ndarray, layer_of: np.ndarray, recompute: np.ndarray, sends: np.ndarray,
    microbatches: np.ndarray,
) -> list[StageRun]:  # fmt: skip
    """A group's stage runs, each number an array over the group's configurations (of
    ``microbatches`` a step)."""
    used_rows, local = factorize(static_of)
    used = static_of[used_rows]
    last = split[-1][0] + split[-1][1] - 1
    costs = {k: _one(table, layer_of, recompute) for k, table in by_kind.items()}
    kept = None
    if any(chunks is not None for *_, chunks in split):  # the group recomputes fully
        kept = {k: _one(by_kind[k], layer_of, RECOMPUTE_MODES.index("none"))
                for k in TRANSFORMER_KINDS if k in by_kind}  # fmt: skip
    runs = []
    for j, (first, count, kinds, chunks) in enumerate(split):
        time = stage_time(kinds, chunks, costs, kept)
        one, several = (np.array([[getattr(getattr(static[u], kind)[j], f.name) for f in
                                   fields(cost.DataParallelSync)] for u in used])[local]
                         for kind in ("syncs", "accumulating_syncs"))  # fmt: skip
        sync = np.where((microbatches > 1)[:, None], several, one)
        held = np.array([static[u].state_bytes[j] for u in used])[local]
        tied = np.array([static[u].tied_s for u in used])[local]
        gathered = np.array([static[u].gathered_bytes_per_param for u in used])[local]
        by_static = np.array([np.broadcast_to(static[u].accumulation(j, microbatches),
                                              microbatches.shape) for u in used])  # fmt: skip
        accumulation = by_static[local, np.arange(len(local))]
        runs.append(StageRun(
            time=time.with_pipeline_comm(sends).with_weight_work(accumulation),
            sync=cost.DataParallelSync(**{f.name: sync[:, i] for i, f in
                                          enumerate(fields(cost.DataParallelSync))}),
            state_bytes=(held[:, 0], held[:, 1], held[:, 2]),
            first=first, count=count, tied_s=tied if first in (0, last) else 0.0,
            gathered_bytes=time.layer_params * gathered,
        ))  # fmt: skip
    return runs


def _one(table: np.ndarray, layer_of: np.ndarray, mode: Any) -> LayerCost:
    """One layer's costs per configuration, from a kind's ``[layer, mode, field]`` table."""
    values = table[layer_of, mode]
    return LayerCost(**{f: values[:, i] for i, f in enumerate(LAYER_FIELDS)})
