"""``planner estimate``: price one uniform (Megatron-style) configuration.

Every operator of the graph gets the sharding Megatron-LM would give it
(:func:`planner.graph.sharding.megatron_sharding`); :mod:`planner.cost` prices each op, each
collective, the memory and the pipeline. Layers of one kind are identical, so one layer of each
kind is priced and multiplied.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

from planner import cost
from planner.config import ParallelConfig, ResolvedConfig, resolve
from planner.graph import LayerIndex, lowered
from planner.graph.lower import ACTIVATION_BYTES
from planner.layer_cost import LayerCost, Placement, price_layer
from planner.plan import MemoryBreakdown, StageTime, StepTime
from planner.spec import GIB, ClusterSpec, ModelSpec, TrainingSpec
from planner.step import (
    PipelineKnobs,
    StageCost,
    TiedCopy,
    Weights,
    compose_step,
    throughput,
)


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline stage: per-microbatch seconds and per-device memory (GiB)."""

    time_s: StageTime
    memory_gib: MemoryBreakdown


@dataclass(frozen=True, slots=True)
class Estimate:
    """The priced configuration; attribute names are the ``--json`` keys."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    fits: bool
    memory_gib: MemoryBreakdown
    time_s: StepTime
    bubble_fraction: float
    num_microbatches: int
    dp: int
    num_devices: int
    stages: tuple[StageEstimate, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``planner estimate --json`` object (JSON types only)."""
        return _plain(self)  # type: ignore[no-any-return]


def _plain(value: object) -> object:
    """Dataclasses, pydantic models and tuples as dicts and lists."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


@lru_cache(maxsize=64)
def _layers(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> LayerIndex:
    return lowered(model, training, micro_batch_size)[1]


@lru_cache(maxsize=256)
def _stage_kinds(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int, layers: tuple[int, ...]
) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Layer kinds per stage (sorted (kind, count) pairs): contiguous blocks of ``layers[i]``
    layers, embedding first and head last."""
    index = _layers(model, training, micro_batch_size)
    kind_of = {layer: kind for kind, layers in index.layers_by_kind.items() for layer in layers}
    stages = []
    first = 1
    for stage, count in enumerate(layers):
        kinds = Counter(kind_of[layer] for layer in range(first, first + count))
        kinds["embedding"] += stage == 0
        kinds["head"] += stage == len(layers) - 1
        stages.append(tuple(sorted((k, n) for k, n in kinds.items() if n)))
        first += count
    return tuple(stages)


@lru_cache(maxsize=64)
def _forward_flops(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> float:
    """Model FLOPs of one microbatch's forward pass through the whole model."""
    index = _layers(model, training, micro_batch_size)
    return sum(op.flops for ops in index.ops_by_layer.values() for op in ops)


def estimate(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> Estimate:
    """Price ``config`` for training ``model`` on ``cluster``.

    Raises :class:`~planner.errors.ConfigError` when the configuration does not divide.
    """
    resolved = resolve(model, cluster, config)
    c, training = resolved.config, resolved.training
    placement = Placement.from_order(c.rank_order, tp=c.tp, cp=c.cp, dp=resolved.dp, ep=c.ep,
                                     pp=c.pp)  # fmt: skip
    index = _layers(model, training, c.mbs)
    kind_costs = {
        kind: price_layer(
            index.representative(kind), cluster, resolved, placement,
            transformer_layer=kind in ("dense", "moe"),
        )
        for kind in index.layers_by_kind
    }  # fmt: skip
    p2p = _p2p_s(model, cluster, resolved, placement)
    distinct: dict[tuple[tuple[str, int], ...], StageCost] = {}  # middle stages repeat
    stages = []
    for key in _stage_kinds(model, training, c.mbs, resolved.stage_layers):
        if key not in distinct:
            layers = LayerCost.zero()
            for kind, count in key:
                layers = layers + kind_costs[kind].scaled(count)
            distinct[key] = StageCost(layers.with_pipeline_comm(p2p),
                                      _weights(layers, placement), zero=c.zero)  # fmt: skip
        stages.append(distinct[key])
    knobs = PipelineKnobs(
        num_microbatches=resolved.num_microbatches, schedule=c.schedule, vpp=c.vpp,
        precision=training.precision, overlap_grad_reduce=c.overlap_grad_reduce,
        overlap_param_gather=c.overlap_param_gather,
    )  # fmt: skip
    step = compose_step(cluster, knobs, stages, tied=_tied_copy(model, resolved, placement))

    recompute_flops = sum(
        kind_costs[kind].recompute_flops * len(layers)
        for kind, layers in index.layers_by_kind.items()
    )
    rates = throughput(
        step.step_s, training, cluster,
        forward_flops_per_sequence=_forward_flops(model, training, c.mbs) / c.mbs,
        recompute_flops_per_sequence=recompute_flops / c.mbs,
    )  # fmt: skip
    peak_bytes = sum(step.peak_memory_bytes)
    return Estimate(
        step_time_s=step.step_s,
        tokens_per_s=rates.tokens_per_s,
        model_tflops_per_gpu=rates.model_tflops_per_gpu,
        hardware_tflops_per_gpu=rates.hardware_tflops_per_gpu,
        mfu=rates.mfu,
        peak_memory_gib=peak_bytes / GIB,
        fits=peak_bytes <= cluster.device.memory_bytes,
        memory_gib=MemoryBreakdown.from_bytes(step.peak_memory_bytes),
        time_s=step.time,
        bubble_fraction=step.bubble_fraction,
        num_microbatches=resolved.num_microbatches,
        dp=resolved.dp,
        num_devices=resolved.num_devices,
        stages=tuple(
            StageEstimate(times, memory_gib=MemoryBreakdown.from_bytes(memory))
            for times, memory in zip(step.stage_times(), step.stage_memory_bytes, strict=True)
        ),
    )


def _weights(layers: LayerCost, pl: Placement) -> tuple[Weights, ...]:
    """The layers' parameters by the groups their gradients are summed over: dense weights
    over data x context parallel ranks, experts over the ranks holding the same experts, and
    sequence-parallel norms first over the tensor-parallel ranks too."""
    weights = []
    for key, params in sorted(layers.params_by_sync.items()):
        axes = key.split("+")
        group = pl.edp if "edp" in axes else pl.dp
        weights.append(Weights(params, group, pl.tp if "tp" in axes else None))
    return tuple(weights)


def _tied_copy(model: ModelSpec, r: ResolvedConfig, pl: Placement) -> TiedCopy | None:
    """The last stage's copy of tied word embeddings, split over tensor-parallel ranks."""
    c = r.config
    if not model.tie_word_embeddings or c.pp == 1:
        return None
    return TiedCopy(params=model.vocab_size * model.hidden_size / c.tp, data_parallel=pl.dp,
                    sync_group=cost.CommGroup(2, (c.pp - 1) * pl.pipeline_distance))  # fmt: skip


def _p2p_s(model: ModelSpec, cluster: ClusterSpec, r: ResolvedConfig, pl: Placement) -> float:
    """Per-microbatch pipeline send time of one stage (forward activation + backward grad),
    times ``vpp`` chunk boundaries. Megatron sends a 1/t slice of the hidden state and
    all-gathers it over NVLink (Narayanan et al., Sec. 4.1), or the SP shard as it is."""
    c = r.config
    if c.pp == 1:
        return 0.0
    act = ACTIVATION_BYTES[r.training.precision]
    full = c.mbs * r.training.seq_length * model.hidden_size * act / c.cp
    send = cost.pipeline_send_s(cluster, full / c.tp, pl.pipeline_distance, chunks=c.vpp)
    if c.tp > 1 and not r.sp:
        send += 2 * c.vpp * cost.collective_time_s(cluster, "all_gather", full, pl.tp)
    return send
