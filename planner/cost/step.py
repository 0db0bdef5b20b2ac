"""One training step: pipeline, data-parallel sync, optimizer and memory, composed from the
stages' per-microbatch costs (uniform stages from ``planner estimate``, or the search's).

Data-parallel gradient reduction overlaps compute only as far as that compute reaches: with
``overlap_grad_reduce`` a stage's reduction hides behind the backward of its last microbatch
(Megatron-Core starts a bucket's reduction when the last microbatch's backward produced it);
later stages finish their last backward earlier, so their reduction also hides behind the
earlier stages' remaining backward work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner import cost
from planner.cost.layer import LayerCost
from planner.cost.uncertainty import error_band
from planner.plan.schema import Predicted, StageTime, StepTime
from planner.spec import ClusterSpec, DeviceSpec, TrainingSpec
from planner.vocabulary import GIB, ParallelismKind, PipelineSchedule, Precision


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
class PipelineKnobs:
    """What composing a step needs beyond the stages."""

    num_microbatches: int
    """Microbatches of one step through the pipeline."""
    schedule: PipelineSchedule = "1f1b"
    """The pipeline schedule (interleaved when ``vpp > 1``)."""
    vpp: int = 1
    """Model chunks (virtual stages) per stage."""
    precision: Precision = "bf16"
    """Compute precision."""
    overlap_grad_reduce: bool = False
    """Whether the gradient reduction overlaps the backward."""
    overlap_param_gather: bool = False
    """Whether the weights' all-gathers (ZeRO >= 1) overlap the compute."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    """One step: its seconds by category (on the critical stage) and the peak memory."""

    step_s: float
    """Seconds of one step: the pipeline, the exposed sync after it and the optimizer."""
    time: StepTime
    """Seconds by category on the critical stage; they add up to the step."""
    bubble_fraction: float
    """The pipeline's bubble over the critical stage's busy time, ``m max t``."""
    peak_memory_bytes: tuple[float, float, float, float, float]
    """Weights, gradients, optimizer, activations, other, of the most loaded stage."""
    stage_memory_bytes: tuple[tuple[float, float, float, float, float], ...]
    """The same five per stage."""
    stage_time_s: tuple[tuple[float, float, float], ...]
    """Per stage and microbatch: compute, communication (incl. exposed per-microbatch
    data-parallel traffic), pipeline sends."""
    stage_phase_s: tuple[tuple[float, float, float], ...]
    """Per stage and microbatch: forward, backward and recomputation, each with its share of
    the communication (for the schedule simulator)."""
    stage_sync_tail_s: tuple[float, ...]
    """Per stage, once per step after its last backward: the exposed data-parallel sync."""

    def stage_times(self) -> tuple[StageTime, ...]:
        """Each stage's per-microbatch seconds as a plan records them."""
        return tuple(
            StageTime(
                compute_s=c, communication_s=comm, pipeline_s=pipe, forward_s=f,
                backward_s=b, recompute_s=r, sync_tail_s=tail,
            )
            for (c, comm, pipe), (f, b, r), tail in zip(
                self.stage_time_s, self.stage_phase_s, self.stage_sync_tail_s, strict=True
            )
        )



@dataclass(frozen=True, slots=True, kw_only=True)
class _Sync:
    """A stage's data-parallel communication: per microbatch and once per step, exposed."""

    per_microbatch_s: float
    """Exposed with every microbatch."""
    tail_s: float
    """Exposed once per step, after the stage's last backward."""


def _dp_sync(stage: StageCost, cluster: ClusterSpec, k: PipelineKnobs, tied_s: float) -> _Sync:
    """Gradient reduction and ZeRO gathers of one stage (:func:`cost.data_parallel_sync`),
    exposed as far as the overlap windows do not hide them (:func:`cost.exposed_sync`)."""
    total = cost.NO_SYNC
    for w in stage.weights:
        if w.also_reduced_over is not None:
            total += cost.data_parallel_sync(
                cluster, w.also_reduced_over, params=w.params, precision=k.precision, zero=0
            )
        total += cost.data_parallel_sync(cluster, w.data_parallel, params=w.params,
                                         precision=k.precision, zero=stage.zero)  # fmt: skip
    t = stage.time
    exposed = cost.exposed_sync(
        total, forward_s=t.forward_s, backward_s=t.backward_s,
        overlap_grad_reduce=k.overlap_grad_reduce, overlap_param_gather=k.overlap_param_gather,
        contention=cluster.device.efficiency.overlap_contention,
    )  # fmt: skip
    return _Sync(per_microbatch_s=exposed.per_microbatch_s, tail_s=exposed.once_s + tied_s)


def _memory(
    stage: StageCost, index: int, cluster: ClusterSpec, k: PipelineKnobs, num_stages: int
) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, activations, other) bytes of stage ``index``."""
    weights = gradients = optimizer = 0.0
    for w in stage.weights:
        per_param = cost.state_bytes_per_param(k.precision, zero=stage.zero, shards=w.shards)
        weights += w.params * per_param.weights
        gradients += w.params * per_param.gradients
        optimizer += w.params * per_param.optimizer
    in_flight = cost.in_flight_microbatches(
        k.schedule, stage=index, pp=num_stages, vpp=k.vpp, num_microbatches=k.num_microbatches
    )
    return (
        weights,
        gradients,
        optimizer,
        in_flight * stage.time.activation_bytes + stage.time.working_bytes,
        cluster.device.reserved_memory_gib * GIB,
    )


def _with_tied_copy(stages: Sequence[StageCost], tied: TiedCopy | None) -> list[StageCost]:
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


def _optimizer_params(stage: StageCost) -> float:
    """Parameters whose Adam update one device of the stage runs (ZeRO shards the update)."""
    return sum(w.params / (w.shards if stage.zero >= 1 else 1) for w in stage.weights)


def compose_step(
    cluster: ClusterSpec,
    knobs: PipelineKnobs,
    stages: Sequence[StageCost],
    *,
    tied: TiedCopy | None = None,
) -> StepCost:
    """Compose the stages' per-microbatch costs into one step's time and peak memory.

    The stages may differ (layers, sharding, ZeRO stage, groups): the pipeline, the exposed
    gradient synchronisation and the optimizer step are composed the same way for all.
    """
    m = knobs.num_microbatches
    pp = len(stages)
    stages = _with_tied_copy(stages, tied)
    tied_s = 0.0
    if tied is not None and pp > 1:
        nbytes = tied.params * cost.gradient_bytes_on_wire(knobs.precision)
        tied_s = cost.collective_time_s(cluster, "all_reduce", nbytes, tied.sync_group)
    memo: dict[tuple[int, bool], _Sync] = {}  # identical stages share one StageCost

    def sync(i: int, stage: StageCost) -> _Sync:
        key = (id(stage), i in (0, pp - 1))
        if key not in memo:
            memo[key] = _dp_sync(stage, cluster, knobs, tied_s if key[1] else 0.0)
        return memo[key]

    syncs = [sync(i, s) for i, s in enumerate(stages)]
    stage_times = [s.time.time_s + y.per_microbatch_s for s, y in zip(stages, syncs, strict=True)]
    pipe = cost.pipeline_time(stage_times, num_microbatches=m, vpp=knobs.vpp)
    # Stage i finishes its last backward before stages 0..i-1 finish theirs: they still run
    # that microbatch's backward through their layers; with interleaving, only through their
    # first chunk's (the last backward a stage runs is of chunk 0).
    tail, still_busy = 0.0, 0.0
    for s, y in zip(stages, syncs, strict=True):
        tail = max(tail, y.tail_s - still_busy)
        still_busy += (s.time.backward_s + s.time.recompute_s) / knobs.vpp
    optimizer = cost.optimizer_step_s(
        cluster.device, knobs.precision, params=max(_optimizer_params(s) for s in stages)
    )
    critical = max(range(pp), key=lambda i: stage_times[i])
    t = stages[critical].time
    memories = tuple(_memory(s, i, cluster, knobs, pp) for i, s in enumerate(stages))
    return StepCost(
        step_s=pipe.total_s + tail + optimizer,
        time=StepTime(
            compute_s=m * t.compute_s,
            tensor_parallel_comm_s=m * t.tp_comm_s,
            context_parallel_comm_s=m * t.cp_comm_s,
            expert_parallel_comm_s=m * t.ep_comm_s,
            pipeline_comm_s=m * t.pipeline_comm_s,
            pipeline_bubble_s=pipe.bubble_s,
            data_parallel_comm_exposed_s=m * syncs[critical].per_microbatch_s + tail,
            optimizer_s=optimizer,
        ),
        bubble_fraction=pipe.bubble_s / (m * max(stage_times)),
        peak_memory_bytes=max(memories, key=sum),
        stage_memory_bytes=memories,
        stage_time_s=tuple(
            (s.time.compute_s, _communication_s(s.time, y), s.time.pipeline_comm_s)
            for s, y in zip(stages, syncs, strict=True)
        ),
        stage_phase_s=tuple(_phases(s.time, y) for s, y in zip(stages, syncs, strict=True)),
        stage_sync_tail_s=tuple(y.tail_s for y in syncs),
    )


def _communication_s(t: LayerCost, sync: _Sync) -> float:
    """A stage's collectives per microbatch, with the data-parallel traffic left exposed."""
    return t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + sync.per_microbatch_s


def _phases(t: LayerCost, sync: _Sync) -> tuple[float, float, float]:
    """Forward, backward and recomputation seconds of one microbatch. The cost model prices a
    stage's collectives per microbatch, not per phase; they are shared in proportion to each
    phase's compute (Megatron's tensor-parallel pairs run once forward and once backward, and
    again in a recomputed forward)."""
    comm = _communication_s(t, sync)
    compute = t.compute_s
    if compute <= 0:
        return (comm / 2, comm / 2, 0.0)
    share = 1 + comm / compute
    return (t.forward_s * share, t.backward_s * share, t.recompute_s * share)


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """A step's rates: tokens, model and hardware FLOP/s per device, model FLOPs utilisation."""

    tokens_per_s: float
    """Tokens trained per second."""
    model_tflops_per_gpu: float
    """Model FLOPs (three times the forward's) per second and device, in TFLOP/s."""
    hardware_tflops_per_gpu: float
    """Model FLOPs plus recomputation per second and device, in TFLOP/s."""
    mfu: float
    """Model FLOPs utilisation: model FLOP/s over the device's peak."""


def throughput(
    step_s: float,
    training: TrainingSpec,
    cluster: ClusterSpec,
    *,
    forward_flops_per_sequence: float,
    executed_flops_per_sequence: float,
    recompute_flops_per_sequence: float,
) -> Throughput:
    """A step's rates. Model FLOPs are three times the forward's, full attention scores
    included (forward, and backward twice: Narayanan et al., SC'21, Eq. 3; the convention MFU
    is reported in). Hardware FLOPs are what the GPUs execute
    (:func:`planner.cost.executed_flops`: fused causal attention computes half the scores and
    recomputes them in its backward) plus the forward work recomputation reruns; they are
    timed by the same cost model, so hardware FLOP/s never exceed the device's peak."""
    sequences = training.global_batch_size
    model = 3 * forward_flops_per_sequence * sequences
    hardware = (executed_flops_per_sequence + recompute_flops_per_sequence) * sequences
    per_device_s = step_s * cluster.num_devices
    return Throughput(
        tokens_per_s=sequences * training.seq_length / step_s,
        model_tflops_per_gpu=model / per_device_s / 1e12,
        hardware_tflops_per_gpu=hardware / per_device_s / 1e12,
        mfu=model / per_device_s / cluster.device.peak_flops_per_s(training.precision),
    )


def headline(
    step: StepCost, rates: Throughput, *, device: DeviceSpec, kind: ParallelismKind
) -> Predicted:
    """A priced step's headline numbers as a plan records them, with the error band of
    ``device``'s validated runs of the configuration's ``kind`` of parallelism
    (:mod:`planner.cost.uncertainty`): every planner (the search's assembly, ``estimate``)
    reports these through this one function."""
    return Predicted(
        step_time_s=step.step_s,
        time=step.time,
        tokens_per_s=rates.tokens_per_s,
        model_tflops_per_gpu=rates.model_tflops_per_gpu,
        hardware_tflops_per_gpu=rates.hardware_tflops_per_gpu,
        mfu=rates.mfu,
        peak_memory_gib=sum(step.peak_memory_bytes) / GIB,
        bubble_fraction=step.bubble_fraction,
        error_band=error_band(device, kind),
    )

