"""A pipeline stage's weights: their local parameters and the groups their gradients are summed
over, what they hold on one device (weights, gradients, optimizer states, by ZeRO stage and
offload), their data-parallel sync and optimizer step, and the last stage's copy of tied word
embeddings. The step composer (:mod:`planner.cost.step`) adds these up over the stages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner import cost
from planner.cost.elementwise import Real
from planner.cost.layer import LayerCost
from planner.cost.memory import ADAM_STATE
from planner.cost.offload import gradient_copy_sync, host_state_bytes, optimizer_time_s
from planner.spec import ClusterSpec, DeviceSpec
from planner.vocabulary import Offload, Stack, StatesPrecision


@dataclass(frozen=True, slots=True, kw_only=True)
class Weights:
    """Some of a stage's local parameters and the groups their gradients are summed over."""

    params: float
    """Local parameters (one device's shard)."""
    data_parallel: cost.CommGroup | None
    """The ranks holding the same shard: gradients reduced over it, ZeRO shards the states
    over it (None: not replicated)."""
    also_reduced_over: cost.CommGroup | None = None
    """A group whose partial gradients are all-reduced first (the norms Megatron's sequence
    parallelism replicates across tensor-parallel ranks)."""

    @property
    def shards(self) -> int:
        """Ranks the ZeRO-sharded states are split over."""
        return self.data_parallel.size if self.data_parallel is not None else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """One pipeline stage: per-microbatch costs, its local parameters and their ZeRO stage."""

    time: LayerCost
    """Its layers' per-microbatch costs, pipeline sends included."""
    weights: tuple[Weights, ...]
    """Its local parameters by the groups their gradients are summed over."""
    zero: int = 0
    """The ZeRO stage of its states."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TiedCopy:
    """With tied word embeddings and a pipeline, the last stage keeps a copy of the embedding
    and the two copies' gradients are all-reduced after the backward (Megatron)."""

    params: float
    """Local parameters of the copy (the embedding's shard)."""
    data_parallel: cost.CommGroup | None
    """The ranks holding the same shard of the copy (None: not replicated)."""
    sync_group: cost.CommGroup
    """The first and last stages' corresponding ranks."""


def stage_sync(
    weights: Sequence[Weights], zero: int, cluster: ClusterSpec, precision: StatesPrecision
) -> cost.DataParallelSync:
    """Gradient reduction and ZeRO gathers of a stage's weights (:func:`cost.data_parallel_sync`
    per gradient bucket)."""
    total = cost.NO_SYNC
    for w in weights:
        if w.also_reduced_over is not None:
            total += cost.data_parallel_sync(
                cluster, w.also_reduced_over, params=w.params, precision=precision, zero=0
            )
        total += cost.data_parallel_sync(cluster, w.data_parallel, params=w.params,
                                         precision=precision, zero=zero)  # fmt: skip
    return total


def stage_state_bytes(
    weights: Sequence[Weights], zero: int, precision: StatesPrecision, offload: Offload = "none"
) -> tuple[float, float, float]:
    """One device's bytes of weights, gradients and optimizer states of a stage's weights (no
    optimizer states when they are offloaded to the host). DeepSpeed runs ZeRO-Offload on its
    ZeRO optimizer, not ``BF16_Optimizer``: those states are Megatron-LM's layout
    (:func:`~planner.cost.memory.state_bytes_per_param` with ``held`` false)."""
    held = [0.0, 0.0, 0.0]
    for w in weights:
        per_param = cost.state_bytes_per_param(precision, zero=zero, shards=w.shards,
                                               held=offload != "zero-offload")
        held[0] += w.params * per_param.weights
        held[1] += w.params * per_param.gradients
        if offload == "none":
            held[2] += w.params * per_param.optimizer
    return held[0], held[1], held[2]


def optimizer_params(weights: Sequence[Weights], zero: int) -> float:
    """Parameters whose Adam update one device of a stage runs (ZeRO shards the update)."""
    return sum(w.params / (w.shards if zero >= 1 else 1) for w in weights)


def with_tied_copy(stages: Sequence[StageCost], tied: TiedCopy | None) -> list[StageCost]:
    """The last stage's copy of tied word embeddings (memory, sync, optimizer)."""
    stages = list(stages)
    if tied is not None and len(stages) > 1:
        last = stages[-1]
        weights = list(last.weights)
        # One bucket with the other weights reduced over the same group, as frameworks do.
        same = next((i for i, w in enumerate(weights)
                     if w.data_parallel == tied.data_parallel and w.also_reduced_over is None),
                    None)  # fmt: skip
        if same is None:
            weights.append(Weights(params=tied.params, data_parallel=tied.data_parallel))
        else:
            weights[same] = replace(weights[same], params=weights[same].params + tied.params)
        stages[-1] = replace(last, weights=tuple(weights))
    return stages


def tied_sync_s(cluster: ClusterSpec, tied: TiedCopy | None, precision: StatesPrecision) -> float:
    """The all-reduce of the tied embedding copies' gradients (0 without copies): the kept
    gradients themselves, not cast to a communication type (Megatron's ``main_grad``;
    DeepSpeed's pipeline engine all-reduces ``weight._hp_grad``, fp32 under
    ``BF16_Optimizer``: ``deepspeed/runtime/pipe/engine.py`` ``_exec_reduce_tied_grads`` at
    microsoft/DeepSpeed 77b649d and 38327e0)."""
    if tied is None:
        return 0.0
    nbytes = tied.params * ADAM_STATE[precision].gradients
    return cost.collective_time_s(cluster, "all_reduce", nbytes, tied.sync_group)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageStatics:
    """What each of a pipeline's distinct stages costs that no microbatch, schedule or overlap
    switch changes: its data-parallel traffic and state bytes, and the step's tied-copy
    all-reduce, optimizer step and host memory. The step composer reads it, for one
    configuration or for the configurations of a batch that share a split and a ZeRO stage."""

    syncs: tuple[cost.DataParallelSync, ...]
    """Each stage's data-parallel traffic with one microbatch a step."""
    accumulating_syncs: tuple[cost.DataParallelSync, ...]
    """The same with several microbatches a step (ZeRO-Offload's gradient copies differ:
    :func:`~planner.cost.offload.gradient_copy_sync`)."""
    state_bytes: tuple[tuple[float, float, float], ...]
    """Each stage's weights, gradients and optimizer states per device."""
    tied_s: float
    """The tied embedding copies' all-reduce (first and last stages)."""
    optimizer_s: float
    """The optimizer step of the stage that updates the most parameters."""
    host_bytes: float
    """Host memory one device's offloaded states take, on the stage that offloads most, with
    one microbatch a step."""
    accumulating_host_bytes: float
    """The same with several (ZeRO-Offload accumulates the gradients on the host)."""
    gathered_bytes_per_param: float = 0.0
    """Bytes per parameter of a stage's largest layer that ZeRO-3 holds unsharded at its
    peak (:func:`planner.cost.memory.gathered_bytes_per_param`; 0 below ZeRO-3)."""
    accumulations: tuple[cost.GradientAccumulation, ...] = ()
    """Each stage's gradient accumulation between microbatches
    (:func:`~planner.cost.data_parallel.gradient_accumulation`; empty: none)."""
    local_params: tuple[float, ...] = ()
    """Each stage's local parameters, whose gradients it accumulates."""
    device: DeviceSpec | None = None
    """The device that runs the accumulation."""

    def sync(self, i: int, *, accumulating: bool) -> cost.DataParallelSync:
        """Stage ``i``'s data-parallel traffic, with several microbatches a step or one."""
        return (self.accumulating_syncs if accumulating else self.syncs)[i]

    def accumulation(self, i: int, num_microbatches: Real) -> Real:
        """Stage ``i``'s gradient accumulation per microbatch, averaged over a step of
        ``num_microbatches``."""
        if not self.accumulations or self.device is None:
            return 0.0
        return self.accumulations[i].seconds(self.device, params=self.local_params[i],
                                             num_microbatches=num_microbatches)  # fmt: skip


def stage_statics(
    cluster: ClusterSpec, precision: StatesPrecision, stages: Sequence[StageCost], *,
    tied: TiedCopy | None = None, offload: Offload = "none", gathered_bytes_per_param: float = 0.0,
    stack: Stack | None = None,
) -> StageStatics:  # fmt: skip
    """:class:`StageStatics` of ``stages`` (the pipeline's first stage first and its last
    stage last, each stage of a run of equal ones once), the last stage holding ``tied``;
    ``gathered_bytes_per_param`` what ZeRO-3 holds unsharded of a layer's parameter
    (:func:`planner.cost.memory.gathered_bytes_per_param`), where the stages run ZeRO-3."""
    stages = with_tied_copy(stages, tied)
    syncs, accumulating = [], []
    for s in stages:
        sync = stage_sync(s.weights, s.zero, cluster, precision)
        params = optimizer_params(s.weights, s.zero)
        for out, several in ((syncs, False), (accumulating, True)):
            out.append(sync + gradient_copy_sync(cluster, precision, params=params, zero=s.zero,
                                                 offload=offload, accumulating=several))
    params = max(optimizer_params(s.weights, s.zero) for s in stages)
    return StageStatics(
        syncs=tuple(syncs),
        accumulating_syncs=tuple(accumulating),
        state_bytes=tuple(stage_state_bytes(s.weights, s.zero, precision, offload)
                          for s in stages),
        tied_s=tied_sync_s(cluster, tied, precision),
        optimizer_s=optimizer_time_s(cluster, precision, params=params, offload=offload),
        host_bytes=host_state_bytes(precision, params=params, offload=offload),
        accumulating_host_bytes=host_state_bytes(precision, params=params, offload=offload,
                                                 accumulating=True),
        gathered_bytes_per_param=gathered_bytes_per_param if stages[0].zero >= 3 else 0.0,
        accumulations=tuple(cost.gradient_accumulation(precision, zero=s.zero, offload=offload,
                                                       stack=stack)
                            for s in stages),
        local_params=tuple(sum(w.params for w in s.weights) for s in stages),
        device=cluster.device,
    )  # fmt: skip
