"""``planner estimate``: price one uniform (Megatron-style) configuration.

Every operator gets the strategy Megatron-LM runs it with, drawn from the ILP's own strategy
space (:func:`planner.sharding.uniform.megatron_assignment`), and the layer is priced by the same
functions as the ILP's choices (:func:`planner.sharding.uniform.uniform_parts`). Layers of one
kind are identical, so one layer of each kind is priced and multiplied; the one step composer
(:func:`planner.cost.step.compose_step`) adds the pipeline, the data-parallel sync, the optimizer
and the memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from planner import cost
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.profiled import profile_coverage
from planner.cost.rates import Throughput, headline, throughput
from planner.cost.regimes import config_mechanisms
from planner.cost.stage_weights import StageCost
from planner.cost.step import PipelineKnobs, StepCost, compose_step
from planner.errors import ConfigError
from planner.graph import forward_flops
from planner.graph.ops import TRANSFORMER_KINDS
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.plan.schema import MemoryBreakdown, Predicted, StageTime
from planner.sharding.assignment import LayerParts
from planner.sharding.uniform import uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.recompute_layers import Chunk, recomputed_counts, stage_chunks
from planner.uniform.stages import (
    UniformStage,
    communicator_bytes,
    deepep_refusal,
    embedding_group_bytes,
    host_fits,
    layer_index,
    pipeline_sends_s,
    recompute_flops,
    stage_kinds,
    stage_params,
    stage_time,
    stage_weights,
    tied_copy,
    uniform_query,
    uniform_stage,
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


def estimate(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *,
    memory_margin_gib: float | None = None,
) -> Estimate:  # fmt: skip
    """Price ``config`` for training ``model`` on ``cluster``; it fits when its peak leaves
    ``memory_margin_gib`` free (:func:`planner.cost.fits`).

    Raises :class:`~planner.errors.ConfigError` when the configuration does not divide.

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt3-175b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=128)
    >>> e = estimate(model, cluster, planner.ParallelConfig(tp=8, pp=16))
    >>> round(e.step_time_s, 2), e.fits, round(e.peak_memory_gib, 1)
    (22.75, True, 61.3)
    >>> e.dp, e.num_microbatches, round(e.mfu, 3), round(e.bubble_fraction, 3)
    (8, 192, 0.466, 0.068)

    Its 61.3 GiB with 25 GiB kept free is more than the device's 80 GiB:

    >>> estimate(model, cluster, planner.ParallelConfig(tp=8, pp=16), memory_margin_gib=25).fits
    False

    A configuration that does not divide the cluster is refused, with the arithmetic:

    >>> estimate(model, cluster, planner.ParallelConfig(tp=3, pp=8))
    Traceback (most recent call last):
    ...
    planner.errors.ConfigError: tp(3) x pp(8) x cp(1) = 24 does not divide the 1024 devices
    """
    resolved = resolve(model, cluster, config)
    c, training = resolved.config, resolved.training
    held = cost.states_precision(training.precision, training.stack, c.optimizer_moments)
    deepep = c.moe_dispatcher == "deepep"
    stage = uniform_stage(resolved)
    refusal = deepep_refusal(cluster, stage) if deepep else None
    if refusal:
        raise ConfigError(refusal)
    index = layer_index(model, training, c.mbs)
    parts = {kind: uniform_parts(model, cluster, uniform_query(resolved, stage, kind))
             for kind in index.layers_by_kind}  # fmt: skip
    costs = {kind: layer_cost(p, c.recompute if kind in TRANSFORMER_KINDS else "none")
             for kind, p in parts.items()}  # fmt: skip
    chunks = partial_chunks(model, training, resolved)  # None: the mode holds for every layer
    stages = _stages(model, cluster, resolved, stage, parts, costs, chunks)
    knobs = PipelineKnobs(
        num_microbatches=resolved.num_microbatches, schedule=c.schedule, vpp=c.vpp,
        states_precision=held,
        gathered_bytes_per_param=cost.gathered_bytes_per_param(training.precision,
                                                               training.stack),
        stack=training.stack, overlap_grad_reduce=c.overlap_grad_reduce,
        overlap_param_gather=c.overlap_param_gather, offload=c.offload,
        overlap_moe_comm=c.overlap_moe_expert_parallel_comm,
        deepep=deepep,
        communicator_bytes=communicator_bytes(model, cluster, training, stage, deepep=deepep),
        end_communicator_bytes=embedding_group_bytes(model, c.pp,
                                                     v_shape=c.schedule == "zb-v"),
    )  # fmt: skip
    tied = None if c.schedule == "zb-v" else tied_copy(model, stage)
    step = compose_step(cluster, knobs, stages, tied=tied)
    flops = recompute_flops({kind: k.recompute_flops for kind, k in costs.items()}, index,
                            {} if chunks is None else recomputed_counts(chunks))  # fmt: skip
    sequences = c.mbs * stage.layout.data_ways  # one microbatch of the stage's mesh
    rates = throughput(
        step.step_s, training, cluster,
        forward_flops_per_sequence=forward_flops(model, training, c.mbs) / c.mbs,
        executed_flops_per_sequence=cost.executed_training_flops(
            model, training, c.mbs, flash_attention=c.flash_attention) / c.mbs,
        recompute_flops_per_sequence=flops / sequences,
    )  # fmt: skip
    profiled = profile_coverage(
        cluster.device.efficiency.profile, kinds=tuple(index.layers_by_kind),
        stack=training.stack, precision=training.precision, tensor_parallel=c.tp,
        micro_batch_size=c.mbs, seq_length=training.seq_length // c.cp, moe=model.moe,
        expert_parallel=c.ep, expert_tensor_parallel=c.etp)  # fmt: skip
    return _estimate(cluster, resolved, step, rates, memory_margin_gib,
                     moe=model.moe is not None, profiled=profiled)  # fmt: skip


def _stages(
    model: ModelSpec, cluster: ClusterSpec, resolved: ResolvedConfig, stage: UniformStage,
    parts: Mapping[str, LayerParts], costs: Mapping[str, LayerCost],
    chunks: tuple[tuple[Chunk, ...], ...] | None,
) -> list[StageCost]:  # fmt: skip
    """Each pipeline stage's costs, a stage equal to an earlier one the same object (the
    step composer adds up runs of them)."""
    c, training = resolved.config, resolved.training
    sends = pipeline_sends_s(model, cluster, training, stage, mbs=c.mbs, vpp=c.vpp)
    kept = None if chunks is None else {kind: layer_cost(p, "none") for kind, p in parts.items()}
    weights = {kind: p.weight_groups() for kind, p in parts.items()}
    distinct: dict[tuple[object, ...], StageCost] = {}  # middle stages repeat
    stages = []
    for i, kinds in enumerate(stage_kinds(model, training, c.mbs, resolved.stage_layers,
                                          head_first=c.schedule == "zb-v")):  # fmt: skip
        mine = None if chunks is None else chunks[i]
        if (kinds, mine) not in distinct:
            time = stage_time(kinds, mine, costs, kept)
            distinct[kinds, mine] = StageCost(
                time=time.with_pipeline_comm(sends), zero=c.zero,
                weights=stage_weights(stage_params(kinds, weights), stage))  # fmt: skip
        stages.append(distinct[kinds, mine])
    return stages


def _estimate(
    cluster: ClusterSpec, resolved: ResolvedConfig, step: StepCost, rates: Throughput,
    memory_margin_gib: float | None, *, moe: bool, profiled: tuple[str, ...] = (),
) -> Estimate:  # fmt: skip
    """The priced configuration's record."""
    c = resolved.config
    host_bytes = cluster.devices_per_node * step.host_bytes
    used = config_mechanisms(c)
    return Estimate(
        **dict(headline(step, rates, cluster=cluster, training=resolved.training,
                        moe=moe, used=used, profiled=profiled)),
        fits=cost.fits(step.peak_memory_bytes.total, cluster.device, memory_margin_gib,
                       resolved.training.stack)
        and host_fits(cluster, host_bytes),
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
