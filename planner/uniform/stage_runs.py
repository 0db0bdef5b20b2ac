"""A batch's pipeline stages: a layer split's runs of equal stages
(:class:`~planner.cost.step.StageRun`), what a run costs that no microbatch, schedule or switch
changes (its data-parallel traffic, state bytes, the optimizer step), once per mesh, split and
ZeRO stage, and the runs of a group of configurations as arrays, for
:func:`~planner.uniform.batch.estimate_batch`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from planner import cost
from planner.cost.layer import LayerCost
from planner.cost.offload import gradient_copy_sync, host_state_bytes, optimizer_time_s
from planner.cost.stage_weights import (
    StageCost,
    optimizer_params,
    stage_state_bytes,
    stage_sync,
    tied_sync_s,
    with_tied_copy,
)
from planner.cost.step import StageRun
from planner.pipeline.options import TRANSFORMER_KINDS
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.columns import factorize
from planner.uniform.estimate import stage_kinds, stage_weights, tied_copy
from planner.uniform.recompute_layers import Chunk, chunks_cost
from planner.vocabulary import RECOMPUTE_MODES, Offload

LAYER_FIELDS = tuple(f.name for f in fields(LayerCost))
"""The per-microbatch costs of a layer, in the order a batch's layer table keeps them."""

Split = tuple[tuple[int, int, tuple[tuple[str, int], ...], tuple[Chunk, ...] | None], ...]
"""A layer split's runs of equal stages: (first stage, stages, layer kinds and counts, and
when only some layers recompute, the stage's chunks with the layers that do)."""


def split_layers(x: Any, r: int) -> tuple[int, ...]:
    """Configuration ``r``'s decoder layers per stage, from the derived columns ``x``."""
    pp = int(x.pp[r])
    if pp == 1:
        return (int(x.first_layers[r]),)
    return (int(x.first_layers[r]), *[int(x.middle_layers[r])] * (pp - 2), int(x.last_layers[r]))


def stage_runs(
    model: ModelSpec, training: TrainingSpec, layers: tuple[int, ...],
    chunks: tuple[tuple[Chunk, ...], ...] | None = None, *, head_first: bool = False,
) -> Split:  # fmt: skip
    """The runs of equal stages of a layer split, the first and the last stage alone (as the
    step composer runs them); ``chunks``: each stage's, when only some layers recompute
    (:func:`~planner.uniform.recompute_layers.stage_chunks`); ``head_first``: a V schedule's
    (:func:`~planner.uniform.estimate.stage_kinds`)."""
    stages = stage_kinds(model, training, 1, layers, head_first=head_first)
    runs: list[tuple[int, int, tuple[tuple[str, int], ...], tuple[Chunk, ...] | None]] = []
    for i, kinds in enumerate(stages):
        mine = None if chunks is None else chunks[i]
        if (runs and 0 < i < len(stages) - 1 and runs[-1][0] > 0 and runs[-1][2] == kinds
                and runs[-1][3] == mine):  # fmt: skip
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, kinds, mine)
        else:
            runs.append((i, 1, kinds, mine))
    return tuple(runs)


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticCosts:
    """What a stage run costs that no microbatch, schedule or switch changes."""

    syncs: tuple[cost.DataParallelSync, ...]
    """Each run's data-parallel traffic with one microbatch a step."""
    accumulating_syncs: tuple[cost.DataParallelSync, ...]
    """The same with several microbatches a step (ZeRO-Offload's gradient copies differ:
    :func:`~planner.cost.offload.gradient_copy_sync`)."""
    state_bytes: tuple[tuple[float, float, float], ...]
    """Each run's weights, gradients and optimizer states per device."""
    tied_s: float
    """The tied embedding copies' all-reduce (first and last stages)."""
    optimizer_s: float
    """The optimizer step of the busiest stage."""
    host_bytes: float = 0.0
    """Host memory one device's offloaded states take, on the stage that offloads most, with
    one microbatch a step."""
    accumulating_host_bytes: float = 0.0
    """The same with several (ZeRO-Offload accumulates the gradients on the host)."""


def static_costs(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, stage: Any,
    params_by_kind: dict[str, tuple[tuple[tuple[int, ...], float], ...]], split: Split, *,
    zero: int, tp: int, pp: int, v_shape: bool = False, offload: Offload = "none",
) -> StaticCosts:  # fmt: skip
    """A split's runs' weights on ``stage``'s mesh, as :func:`estimate` gathers them (no tied
    copy under a V schedule: its first stage holds the embedding and the head)."""
    stages = []
    for _, _, kinds, _ in split:
        params: dict[tuple[int, ...], float] = {}
        for kind, count in kinds:
            for axes, n in params_by_kind[kind]:
                params[axes] = params.get(axes, 0.0) + n * count
        stages.append(StageCost(time=LayerCost.zero(), weights=stage_weights(params, stage),
                                zero=zero))  # fmt: skip
    tied = None if v_shape else tied_copy(model, stage, tp=tp, pp=pp)
    stages = with_tied_copy(stages, tied)
    precision = training.precision
    params = max(optimizer_params(s.weights, zero) for s in stages)

    def _sync(s: StageCost, accumulating: bool) -> cost.DataParallelSync:
        copies = gradient_copy_sync(cluster, precision, params=optimizer_params(s.weights, zero),
                                    zero=zero, offload=offload, accumulating=accumulating)
        return stage_sync(s.weights, zero, cluster, precision) + copies

    return StaticCosts(
        syncs=tuple(_sync(s, False) for s in stages),
        accumulating_syncs=tuple(_sync(s, True) for s in stages),
        state_bytes=tuple(stage_state_bytes(s.weights, zero, precision, offload)
                          for s in stages),
        tied_s=tied_sync_s(cluster, tied, precision),
        optimizer_s=optimizer_time_s(cluster, precision, params=params, offload=offload),
        host_bytes=host_state_bytes(precision, params=params, offload=offload),
        accumulating_host_bytes=host_state_bytes(precision, params=params, offload=offload,
                                                 accumulating=True),
    )  # fmt: skip


def run_costs(
    split: Split, by_kind: dict[str, np.ndarray], static: list[StaticCosts], static_of: np.ndarray,
    layer_of: np.ndarray, recompute: np.ndarray, sends: np.ndarray, microbatches: np.ndarray,
) -> list[StageRun]:  # fmt: skip
    """A group's stage runs, each number an array over the group's configurations (of
    ``microbatches`` a step)."""
    used_rows, local = factorize(static_of)
    used = static_of[used_rows]
    last = split[-1][0] + split[-1][1] - 1
    runs = []
    for j, (first, count, kinds, chunks) in enumerate(split):
        time = LayerCost.zero()
        for kind, n in kinds:
            if chunks is None or kind not in TRANSFORMER_KINDS:
                time = time + _one(by_kind[kind], layer_of, recompute).scaled(n)
        if chunks is not None:  # every configuration of the group recomputes fully
            every = {k: _one(by_kind[k], layer_of, RECOMPUTE_MODES.index("full"))
                     for k in TRANSFORMER_KINDS if k in by_kind}  # fmt: skip
            kept = {k: _one(by_kind[k], layer_of, RECOMPUTE_MODES.index("none"))
                    for k in TRANSFORMER_KINDS if k in by_kind}  # fmt: skip
            time = time + chunks_cost(chunks, every=every, kept=kept)
        one, several = (np.array([[getattr(getattr(static[u], kind)[j], f.name) for f in
                                   fields(cost.DataParallelSync)] for u in used])[local]
                         for kind in ("syncs", "accumulating_syncs"))  # fmt: skip
        sync = np.where((microbatches > 1)[:, None], several, one)
        held = np.array([static[u].state_bytes[j] for u in used])[local]
        tied = np.array([static[u].tied_s for u in used])[local]
        runs.append(StageRun(
            time=time.with_pipeline_comm(sends),
            sync=cost.DataParallelSync(**{f.name: sync[:, i] for i, f in
                                          enumerate(fields(cost.DataParallelSync))}),
            state_bytes=(held[:, 0], held[:, 1], held[:, 2]),
            first=first, count=count, tied_s=tied if first in (0, last) else 0.0,
        ))  # fmt: skip
    return runs


def _one(table: np.ndarray, layer_of: np.ndarray, mode: Any) -> LayerCost:
    """One layer's costs per configuration, from a kind's ``[layer, mode, field]`` table."""
    values = table[layer_of, mode]
    return LayerCost(**{f: values[:, i] for i, f in enumerate(LAYER_FIELDS)})

