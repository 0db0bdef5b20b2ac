"""``planner estimate``: price one uniform (Megatron-style) configuration.

Every operator gets the strategy Megatron-LM runs it with, drawn from the ILP's own strategy
space (:func:`planner.sharding.uniform.megatron_assignment`), and the layer is priced by the same
functions as the ILP's choices (:func:`planner.sharding.uniform.uniform_parts`). Layers of one
kind are identical, so one layer of each kind is priced and multiplied; the one step composer
(:func:`planner.cost.step.compose_step`) adds the pipeline, the data-parallel sync, the optimizer
and the memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict

from planner import cost
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.rates import headline, throughput
from planner.cost.stage_weights import (
    StageCost,
    TiedCopy,
    Weights,
)
from planner.cost.step import PipelineKnobs, compose_step
from planner.cost.uncertainty import parallelism_kind
from planner.graph import LayerIndex, forward_flops, lowered
from planner.pipeline.options import TRANSFORMER_KINDS
from planner.placement.ranks import RankOrder, megatron_order
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.plan.schema import MemoryBreakdown, Predicted, StageTime
from planner.sharding.layout import LogicalMesh
from planner.sharding.uniform import UniformLayout, UniformQuery, uniform_layout, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.recompute_layers import (
    Chunk,
    chunks_cost,
    recomputed_counts,
    stage_chunks,
)
from planner.vocabulary import GIB


class StageEstimate(BaseModel):
    """One pipeline stage: per-microbatch seconds and per-device memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: StageTime
    """Seconds one microbatch spends in the stage, by part and by phase."""
    memory: MemoryBreakdown
    """The stage's peak memory per device, by what fills it."""


class Estimate(Predicted):
    """The priced configuration: the headline numbers a plan records (:class:`Predicted`)
    and what only a single configuration has; attribute names are the ``--json`` keys."""

    fits: bool
    """The peak, with the memory margin, within the device's memory."""
    memory: MemoryBreakdown
    """Peak memory per device on the most loaded stage, by what fills it."""
    num_microbatches: int
    """Microbatches per step and data-parallel rank."""
    dp: int
    """Data-parallel ranks."""
    num_devices: int
    """Devices the configuration uses."""
    stages: tuple[StageEstimate, ...] = ()
    """Each pipeline stage's seconds and memory."""
    host_memory_gib: float = 0.0
    """Host memory per node the offloaded states of its devices take (0: nothing offloaded);
    it fits when within the cluster's ``host.memory_gib``."""

    def headline(self) -> Predicted:
        """The headline numbers alone, as a plan records them."""
        return Predicted(**{name: getattr(self, name) for name in Predicted.model_fields})

    def to_dict(self) -> dict[str, Any]:
        """The ``planner estimate --json`` object (JSON types only)."""
        return self.model_dump(mode="json")


@lru_cache(maxsize=64)
def layer_index(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> LayerIndex:
    """The model's layers by kind, as lowered for ``micro_batch_size`` (remembered)."""
    return lowered(model, training, micro_batch_size)[1]


@lru_cache(maxsize=256)
def stage_kinds(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int, layers: tuple[int, ...],
    *, head_first: bool = False,
) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Layer kinds per stage (sorted (kind, count) pairs): contiguous blocks of ``layers[i]``
    layers, embedding first and head last; ``head_first``: the head on the first stage too,
    as a V schedule places it (ZB-V runs the last model chunk on the first stage)."""
    index = layer_index(model, training, micro_batch_size)
    kind_of = {layer: kind for kind, layers in index.layers_by_kind.items() for layer in layers}
    stages = []
    first = 1
    for stage, count in enumerate(layers):
        kinds = Counter(kind_of[layer] for layer in range(first, first + count))
        kinds["embedding"] += stage == 0
        kinds["head"] += stage == (0 if head_first else len(layers) - 1)
        stages.append(tuple(sorted((k, n) for k, n in kinds.items() if n)))
        first += count
    return tuple(stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformStage:
    """How a uniform configuration's stage sits on the ranks: its mesh (three axes, see
    :mod:`planner.sharding.uniform`) with their rank strides, and its data-parallel copies."""

    layout: UniformLayout
    """The stage's sharding: its mesh's axes and what each splits."""
    mesh: LogicalMesh
    """The stage's mesh, with the rank strides of its axes."""
    replicas: int
    """Copies of the stage (data-parallel ranks outside its mesh)."""
    replica_stride: int
    """Ranks between a device and the same device of the next copy."""
    rank_order: RankOrder
    """How the configuration numbers its ranks (:func:`planner.placement.ranks.megatron_order`)."""

    @property
    def pipeline_distance(self) -> int:
        """Ranks between a device and the same device of the next stage."""
        return self.rank_order.stride("pp")

    @property
    def tensor_group(self) -> cost.CommGroup:
        """The tensor-parallel ranks of a device."""
        return self.rank_order.group("tp")

    def group(self, axes: tuple[int, ...]) -> cost.CommGroup | None:
        """The ranks holding copies of a weight replicated along the mesh ``axes`` and over
        the stage's copies (None: no other copy)."""
        members = [(self.mesh.size(a), self.mesh.stride(a)) for a in axes]
        members.append((self.replicas, self.replica_stride))
        size = 1
        for n, _ in members:
            size *= n
        if size <= 1:
            return None
        return cost.CommGroup(size=size, stride=min(stride for n, stride in members if n > 1))


def uniform_stage(resolved: ResolvedConfig) -> UniformStage:
    """The mesh and groups of ``resolved``'s stages, its ranks numbered in its rank order."""
    c = resolved.config
    return placed_stage(tp=c.tp, cp=c.cp, ep=c.ep, sp=resolved.sp, ulysses=c.cp_algo == "ulysses",
                        dp=resolved.dp, pp=c.pp, rank_order=c.rank_order)  # fmt: skip


@lru_cache(maxsize=4096)
def placed_stage(
    *, tp: int, cp: int, ep: int, sp: bool, ulysses: bool, dp: int, pp: int, rank_order: str
) -> UniformStage:
    """The mesh and groups of the stages of a uniform configuration of these degrees, its
    ranks numbered in ``rank_order`` (:func:`planner.placement.ranks.megatron_order`)."""
    layout = uniform_layout(tp=tp, cp=cp, ep=ep, sp=sp, ulysses=ulysses)
    ranks = megatron_order(rank_order, tp=tp, cp=cp, dp=dp, pp=pp)
    s = ranks.strides()
    data, context, tensor = layout.shape
    if layout.data_ways > 1 or data == 1:  # the first axis is data-parallel ranks
        strides = (s["dp"], s["cp"], s["tp"])
    else:  # the first axis is the outer part of the context-parallel ranks
        strides = (s["cp"] * context, s["cp"], s["tp"])
    replicas = dp // layout.data_ways
    row_major = (context * tensor, tensor, 1)
    # An axis of one rank has no neighbours: its stride is moot, and left row-major the same
    # layer on other pipelines (or rank orders) is the same layer to price.
    strides = tuple(r if n == 1 else s for s, r, n in zip(strides, row_major, layout.shape,
                                                          strict=True))  # fmt: skip
    mesh = LogicalMesh(layout.shape, None if strides == row_major else strides)
    return UniformStage(layout=layout, mesh=mesh, replicas=replicas,
                        replica_stride=s["dp"] * layout.data_ways, rank_order=ranks)


def uniform_query(resolved: ResolvedConfig, stage: UniformStage, kind: str) -> UniformQuery:
    """The layer query of one layer kind of ``resolved``."""
    c, training = resolved.config, resolved.training
    return UniformQuery(kind=kind, layout=stage.layout, micro_batch_size=c.mbs,
                        seq_length=training.seq_length, precision=training.precision,
                        flash_attention=c.flash_attention, tp_comm_overlap=c.tp_comm_overlap,
                        strides=stage.mesh.strides)  # type: ignore[arg-type]  # fmt: skip


def estimate(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *,
    memory_margin_gib: float | None = None,
) -> Estimate:  # fmt: skip
    """Price ``config`` for training ``model`` on ``cluster``; it fits when its peak leaves
    ``memory_margin_gib`` free (:func:`planner.cost.memory_margin_bytes`).

    Raises :class:`~planner.errors.ConfigError` when the configuration does not divide.
    """
    resolved = resolve(model, cluster, config)
    c, training = resolved.config, resolved.training
    stage = uniform_stage(resolved)
    index = layer_index(model, training, c.mbs)
    parts = {kind: uniform_parts(model, cluster, uniform_query(resolved, stage, kind))
             for kind in index.layers_by_kind}  # fmt: skip
    transformer = TRANSFORMER_KINDS
    kind_costs = {kind: layer_cost(p, c.recompute if kind in transformer else "none")
                  for kind, p in parts.items()}  # fmt: skip
    p2p = pipeline_sends_s(model, cluster, stage, mbs=c.mbs, training=training, cp=c.cp,
                           tp=c.tp, sp=resolved.sp, vpp=c.vpp, pp=c.pp)  # fmt: skip
    chunks = partial_chunks(model, training, resolved)  # None: the mode holds for every layer
    none_costs = {} if chunks is None else {kind: layer_cost(p, "none")
                                             for kind, p in parts.items()}  # fmt: skip
    distinct: dict[tuple[object, ...], StageCost] = {}  # middle stages repeat
    stages = []
    v_shape = c.schedule == "zb-v"
    for i, kinds in enumerate(stage_kinds(model, training, c.mbs, resolved.stage_layers,
                                          head_first=v_shape)):  # fmt: skip
        key = (kinds, None if chunks is None else chunks[i])
        if key not in distinct:
            layers = LayerCost.zero()
            params: dict[tuple[int, ...], float] = {}
            for kind, count in kinds:
                if chunks is None or kind not in transformer:
                    layers = layers + kind_costs[kind].scaled(count)
                for axes, n in parts[kind].weight_groups():
                    params[axes] = params.get(axes, 0.0) + n * count
            if chunks is not None:
                layers = layers + chunks_cost(chunks[i], every=kind_costs, kept=none_costs)
            distinct[key] = StageCost(time=layers.with_pipeline_comm(p2p), zero=c.zero,
                                      weights=stage_weights(params, stage))  # fmt: skip
        stages.append(distinct[key])
    knobs = PipelineKnobs(
        num_microbatches=resolved.num_microbatches, schedule=c.schedule, vpp=c.vpp,
        precision=training.precision, overlap_grad_reduce=c.overlap_grad_reduce,
        overlap_param_gather=c.overlap_param_gather, offload=c.offload,
    )  # fmt: skip
    tied = None if v_shape else tied_copy(model, stage, tp=c.tp, pp=c.pp)
    step = compose_step(cluster, knobs, stages, tied=tied)

    recomputed = {} if chunks is None else recomputed_counts(chunks)
    recompute_flops = sum(
        kind_costs[kind].recompute_flops * recomputed.get(kind, len(layers))
        for kind, layers in index.layers_by_kind.items()
    )
    sequences = c.mbs * stage.layout.data_ways  # one microbatch of the stage's mesh
    rates = throughput(
        step.step_s, training, cluster,
        forward_flops_per_sequence=forward_flops(model, training, c.mbs) / c.mbs,
        executed_flops_per_sequence=cost.executed_training_flops(
            model, training, c.mbs, flash_attention=c.flash_attention) / c.mbs,
        recompute_flops_per_sequence=recompute_flops / sequences,
    )  # fmt: skip
    peak_bytes = sum(step.peak_memory_bytes)
    host_bytes = cluster.devices_per_node * step.host_bytes
    kind = parallelism_kind(tensor_parallel=c.tp, pipeline_parallel=c.pp, context_parallel=c.cp,
                            expert_parallel=c.ep, zero=c.zero)  # fmt: skip
    return Estimate(
        **dict(headline(step, rates, device=cluster.device, kind=kind)),
        fits=peak_bytes + cost.memory_margin_bytes(cluster.device.memory_gib, memory_margin_gib)
        <= cluster.device.memory_bytes and host_fits(cluster, host_bytes),
        host_memory_gib=host_bytes / GIB,
        memory=MemoryBreakdown.from_bytes(step.peak_memory_bytes),
        num_microbatches=resolved.num_microbatches,
        dp=resolved.dp,
        num_devices=resolved.num_devices,
        stages=tuple(
            StageEstimate(time=times, memory=MemoryBreakdown.from_bytes(memory))
            for times, memory in zip(step.stage_times(), step.stage_memory_bytes, strict=True)
        ),
    )


def partial_chunks(
    model: ModelSpec, training: TrainingSpec, resolved: ResolvedConfig
) -> tuple[tuple[Chunk, ...], ...] | None:
    """Each stage's chunks with the layers that recompute, when ``resolved`` recomputes only
    some (:mod:`planner.uniform.recompute_layers`); None when its mode holds for every
    layer."""
    c = resolved.config
    if c.recompute_layers is None:
        return None
    return stage_chunks(model, training, resolved.stage_layers, vpp=c.vpp,
                        recompute_layers=c.recompute_layers)  # fmt: skip
def host_fits(cluster: ClusterSpec, node_bytes: Any) -> Any:
    """Whether a node's host memory holds ``node_bytes`` of offloaded states (a float or an
    array; nothing offloaded always fits, with or without host figures)."""
    if cluster.host is None:
        return node_bytes <= 0
    return node_bytes <= cluster.host.memory_bytes


def stage_weights(
    params: dict[tuple[int, ...], float], stage: UniformStage
) -> tuple[Weights, ...]:
    """The stage's parameters by the groups their gradients are summed over.

    Megatron-LM reduces every gradient over the data-parallel ranks holding the same shard
    (data x context ranks; for experts, the ranks holding the same experts), and those of
    weights sequence parallelism replicates across tensor-parallel ranks (the norms) over
    those ranks first, in a separate all-reduce
    (``_allreduce_non_tensor_model_parallel_grads``,
    ``megatron/core/distributed/finalize_model_grads.py``); the distributed optimizer
    shards their states over the data-parallel ranks only."""
    weights = []
    for axes, n in sorted(params.items()):
        tensor = 2 in axes
        outer = tuple(a for a in axes if a != 2)
        weights.append(Weights(params=n, data_parallel=stage.group(outer),
                               also_reduced_over=stage.tensor_group if tensor else None))
    return tuple(weights)


def tied_copy(model: ModelSpec, stage: UniformStage, *, tp: int, pp: int) -> TiedCopy | None:
    """The last stage's copy of tied word embeddings, split over tensor-parallel ranks (none
    under ZB-V, whose first stage holds the embedding and the head: callers skip it)."""
    if not model.tie_word_embeddings or pp == 1:
        return None
    return TiedCopy(params=model.vocab_size * model.hidden_size / tp,
                    data_parallel=stage.group((0, 1)),
                    sync_group=stage.rank_order.ends_group("pp"))  # fmt: skip


def pipeline_sends_s(
    model: ModelSpec, cluster: ClusterSpec, stage: UniformStage, *, mbs: int,
    training: TrainingSpec, cp: int, tp: int, sp: bool, vpp: int, pp: int,
) -> float:  # fmt: skip
    """Per-microbatch pipeline send time of one stage (forward activation + backward grad),
    times ``vpp`` chunk boundaries (:func:`planner.cost.pipeline_send_s`). Each context-parallel
    rank holds ``1/cp`` of the tokens; Megatron sends a 1/t slice of them and all-gathers it
    over NVLink (Narayanan et al., Sec. 4.1), or the SP shard as it is."""
    hidden = cost.hidden_state_bytes(micro_batch_size=mbs, seq_length=training.seq_length,
                                     hidden_size=model.hidden_size,
                                     precision=training.precision) / cp  # fmt: skip
    gather = stage.tensor_group if tp > 1 and not sp else None
    return cost.pipeline_send_s(cluster, hidden, stage.pipeline_distance, chunks=vpp,
                                stages=pp, slices=tp, gather=gather)  # fmt: skip
