"""One training step: pipeline, data-parallel sync, optimizer and memory, composed from the
stages' per-microbatch costs (uniform stages from ``planner estimate``, or the search's).

Data-parallel gradient reduction overlaps compute only as far as that compute reaches: with
``overlap_grad_reduce`` a stage's reduction hides behind the backward of its last microbatch
(Megatron-Core starts a bucket's reduction when the last microbatch's backward produced it);
later stages finish their last backward earlier, so their reduction also hides behind the
earlier stages' remaining backward work.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from planner import cost
from planner.cost.elementwise import Real, first_argmax, maximum, pick, where
from planner.cost.layer import LayerCost
from planner.cost.stage_weights import StageCost, TiedCopy, stage_statics
from planner.plan.schema import StageTime, StepTime
from planner.spec import ClusterSpec
from planner.vocabulary import (
    Offload,
    PipelineSchedule,
    ScheduleName,
    Stack,
    StatesPrecision,
    schedule_name,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineKnobs:
    """What composing a step needs beyond the stages."""

    num_microbatches: int
    """Microbatches of one step through the pipeline."""
    schedule: PipelineSchedule = "1f1b"
    """The pipeline schedule (interleaved when ``vpp > 1``)."""
    vpp: int = 1
    """Model chunks (virtual stages) per stage."""
    gathered_bytes_per_param: float = 0.0
    """What ZeRO-3 holds unsharded of a layer's parameter at its peak
    (:func:`planner.cost.memory.gathered_bytes_per_param`; ZeRO-3 stages only)."""
    communicator_bytes: Real = 0.0
    """NCCL's buffers for the communicators every device connects
    (:attr:`planner.cost.memory.Communicators.bytes`)."""
    end_communicator_bytes: Real = 0.0
    """NCCL's buffers for those only the first and last stages connect: the embedding group
    of a copy of the word embeddings on the last stage
    (:func:`planner.uniform.stages.embedding_group_bytes`)."""
    states_precision: StatesPrecision = "bf16"
    """The precision of the weights' states (:func:`planner.cost.memory.states_precision`):
    their bytes, the gradient sync's and the optimizer step's."""
    overlap_grad_reduce: bool = False
    """Whether the gradient reduction overlaps the backward."""
    overlap_param_gather: bool = False
    """Whether the weights' all-gathers (ZeRO >= 1) overlap the compute."""
    overlap_moe_comm: Real = False
    """Whether the experts' all-to-alls overlap another microbatch's compute (Megatron-Core's
    combined 1F1B; :meth:`~planner.cost.layer.LayerCost.with_moe_overlap`)."""
    deepep: Real = False
    """Whether DeepEP exchanges the experts' tokens: its SMs slow the compute an overlapped
    exchange hides behind (:func:`planner.cost.deepep_contention`)."""
    offload: Offload = "none"
    """What lives in host memory (:mod:`planner.cost.offload`)."""
    stack: Stack | None = None
    """The stack that runs the layers: FSDP2's copies on its stacks
    (:func:`planner.cost.data_parallel.gradient_accumulation`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    """One step: its seconds by category (on the critical stage) and the peak memory."""

    step_s: float
    """Seconds of one step: the pipeline, the exposed sync after it and the optimizer."""
    time: StepTime
    """Seconds by category on the critical stage; they add up to the step."""
    bubble_fraction: float
    """The pipeline's bubble over the step (:func:`cost.bubble_share`)."""
    peak_memory_bytes: cost.MemoryParts
    """The memory of the most loaded stage, by part."""
    stage_memory_bytes: tuple[cost.MemoryParts, ...]
    """The same per stage."""
    stage_time_s: tuple[tuple[float, float, float], ...]
    """Per stage and microbatch: compute, communication (incl. exposed per-microbatch
    data-parallel traffic), pipeline sends."""
    stage_phase_s: tuple[tuple[float, float, float], ...]
    """Per stage and microbatch: forward, backward and recomputation, each with its share of
    the communication (for the schedule simulator)."""
    stage_sync_tail_s: tuple[float, ...]
    """Per stage, once per step after its last backward: the exposed data-parallel sync."""
    stage_weight_s: tuple[float, ...] = ()
    """Per stage and microbatch: the weight gradients within the backward, with their share
    of the communication (empty: none priced apart)."""
    stage_comm_s: tuple[dict[str, float], ...] = ()
    """Per stage: the communication by kind, exposed and hidden, by :class:`StageTime`'s
    field names (``tensor_parallel_comm_s``, ``data_parallel_hidden_s``, ...; empty: none
    recorded)."""
    host_bytes: float = 0.0
    """Host memory one device's offloaded states take, on the stage that offloads most."""

    def stage_times(self) -> tuple[StageTime, ...]:
        """Each stage's per-microbatch seconds as a plan records them."""
        n = len(self.stage_time_s)
        return tuple(
            StageTime(
                compute_s=c, communication_s=comm, pipeline_s=pipe, forward_s=f,
                backward_s=b, recompute_s=r, sync_tail_s=tail, weight_s=w,
                **parts,
            )
            for (c, comm, pipe), (f, b, r), tail, w, parts in zip(
                self.stage_time_s, self.stage_phase_s, self.stage_sync_tail_s,
                self.stage_weight_s or (0.0,) * n, self.stage_comm_s or ({},) * n,
                strict=True,
            )
        )  # fmt: skip



@dataclass(frozen=True, slots=True, kw_only=True)
class StageRun:
    """Consecutive pipeline stages with equal costs: what the step composer adds up. Its
    numbers are floats for one configuration or arrays over many (a batch whose stages share
    this run's place in the pipeline)."""

    time: LayerCost
    """One stage's per-microbatch costs, pipeline sends included."""
    sync: cost.DataParallelSync
    """One stage's data-parallel traffic (:func:`stage_sync`)."""
    state_bytes: tuple[Real, Real, Real]
    """One device's weights, gradients and optimizer states (:func:`stage_state_bytes`)."""
    first: int
    """The run's first stage (0-based)."""
    count: int = 1
    """Stages in the run."""
    tied_s: Real = 0.0
    """The tied embedding copies' all-reduce, on the first and last stages only."""
    gathered_bytes: Real = 0.0
    """ZeRO-3's unsharded parameters and gradients at the peak
    (:attr:`~planner.cost.stage_weights.StageStatics.gathered_bytes_per_param`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTotals:
    """One step composed from its stage runs: the headline numbers and what each run leaves
    exposed (floats, or arrays over a batch of configurations)."""

    step_s: Real
    """Seconds of one step."""
    parts_s: dict[str, Real]
    """Seconds by category on the critical stage (:class:`StepTime`'s fields)."""
    bubble_fraction: Real
    """The pipeline's bubble over the step (:func:`cost.bubble_share`)."""
    peak_memory_bytes: cost.MemoryParts
    """The memory of the most loaded stage, by part."""
    exposed: tuple[cost.ExposedSync, ...]
    """Each run's exposed data-parallel traffic (per microbatch, and once per step)."""



def moe_overlapped(
    time: LayerCost, cluster: ClusterSpec, knobs: PipelineKnobs, *, schedule: ScheduleName,
    num_stages: Real,
) -> LayerCost:  # fmt: skip
    """``time`` with the experts' all-to-alls overlapped where ``knobs`` ask for it
    (:meth:`~planner.cost.layer.LayerCost.with_moe_overlap`, on the pipeline's paired share
    of microbatches: :func:`~planner.cost.pipeline.paired_fraction`)."""
    paired = cost.paired_fraction(schedule, pp=num_stages, vpp=knobs.vpp,
                                  num_microbatches=knobs.num_microbatches)  # fmt: skip
    contention = cluster.device.efficiency.overlap_contention + where(
        knobs.deepep, cost.deepep_contention(cluster.device), 0.0)
    return time.with_moe_overlap(where(knobs.overlap_moe_comm, paired, 0.0), contention)


def run_memory_bytes(
    run: StageRun, stage: Real, cluster: ClusterSpec, knobs: PipelineKnobs,
    schedule: ScheduleName, num_stages: Real,
) -> cost.MemoryParts:  # fmt: skip
    """The memory of stage ``stage`` of ``run``, by part."""
    in_flight = cost.in_flight_microbatches(schedule, stage=stage, pp=num_stages, vpp=knobs.vpp,
                                            num_microbatches=knobs.num_microbatches)  # fmt: skip
    in_flight = cost.held_in_flight(in_flight, vpp=knobs.vpp,
                                    num_microbatches=knobs.num_microbatches,
                                    overlap_moe_comm=knobs.overlap_moe_comm)  # fmt: skip
    working, loss = run.time.working_bytes, run.time.loss_bytes
    parts = cost.MemoryParts(
        *run.state_bytes,
        activations=in_flight * run.time.activation_bytes,
        working=where(working > loss, working, 0.0),
        loss_workspace=where(working > loss, 0.0, loss),
        gathered_parameters=run.gathered_bytes,
    )
    end = (stage == 0) | (stage == num_stages - 1)
    communicators = knobs.communicator_bytes + where(end, knobs.end_communicator_bytes, 0.0)
    reserve = cost.reserve_bytes(cluster.device, allocated=parts.total,
                                 communicators=communicators)  # fmt: skip
    return parts._replace(other=reserve)


def step_totals(
    cluster: ClusterSpec, knobs: PipelineKnobs, runs: Sequence[StageRun], *,
    schedule: ScheduleName, num_stages: Real, optimizer_s: Real,
) -> StepTotals:  # fmt: skip
    """The step of ``runs`` (every stage, in order): the pipeline (:func:`cost.pipeline_time`'s
    formula), the exposed sync after it, the optimizer and the peak memory.

    A run's stages share a per-microbatch time, so the critical stage is a run's first; a later
    stage holds no more microbatches (:func:`cost.in_flight_microbatches`) and finishes its last
    backward earlier, so a run's peak memory and its exposed sync tail are its first stage's.
    ``knobs``' numbers, the runs' and ``num_stages`` may be arrays over configurations that
    share ``schedule`` and the runs' places.
    """
    m = knobs.num_microbatches
    runs = [replace(r, time=moe_overlapped(r.time, cluster, knobs, schedule=schedule,
                                           num_stages=num_stages)) for r in runs]  # fmt: skip
    exposed = tuple(
        cost.exposed_sync(
            r.sync, forward_s=r.time.forward_s, backward_s=r.time.backward_s,
            overlap_grad_reduce=knobs.overlap_grad_reduce,
            overlap_param_gather=knobs.overlap_param_gather,
            contention=cluster.device.efficiency.overlap_contention,
        )
        for r in runs
    )  # fmt: skip
    stage_times = [r.time.time_s + e.per_microbatch_s for r, e in zip(runs, exposed, strict=True)]
    total_s = sum(r.count * t for r, t in zip(runs, stage_times, strict=True))
    max_s = stage_times[0]
    for t in stage_times[1:]:
        max_s = maximum(max_s, t)
    critical = first_argmax(stage_times)
    if schedule in ("zb-h1", "zb-v"):
        pipe_s, bubble_s = _zero_bubble_pipeline(
            runs, critical, max_s, schedule=schedule, num_stages=num_stages, num_microbatches=m
        )
    else:
        pipe_s, bubble_s = cost.fill_and_drain(sum_s=total_s, max_s=max_s, num_microbatches=m,
                                               vpp=knobs.vpp)  # fmt: skip
    # Stage i finishes its last backward before stages 0..i-1 finish theirs: they still run
    # that microbatch's backward through their layers; with interleaving, only through their
    # first chunk's (the last backward a stage runs is of chunk 0).
    tail, still_busy = 0.0, 0.0
    for r, e in zip(runs, exposed, strict=True):
        tail = maximum(tail, e.once_s + r.tied_s - still_busy)
        still_busy = still_busy + r.count * (r.time.backward_s + r.time.recompute_s) / knobs.vpp
    memories = [run_memory_bytes(r, r.first, cluster, knobs, schedule, num_stages) for r in runs]
    loaded = first_argmax([parts.total for parts in memories])

    def on_critical(values: Sequence[Real]) -> Real:
        return pick(values, critical)

    parts_s = {
        "compute_s": m * on_critical([r.time.compute_s for r in runs]),
        "tensor_parallel_comm_s": m * on_critical([r.time.tp_comm_s for r in runs]),
        "context_parallel_comm_s": m * on_critical([r.time.cp_comm_s for r in runs]),
        "expert_parallel_comm_s": m * on_critical([r.time.ep_comm_s for r in runs]),
        "pipeline_comm_s": m * on_critical([r.time.pipeline_comm_s for r in runs]),
        "pipeline_bubble_s": bubble_s,
        "data_parallel_comm_exposed_s": m * on_critical([e.per_microbatch_s for e in exposed])
        + tail,
        "optimizer_s": optimizer_s,
    }
    peak = cost.MemoryParts(*(pick([parts[k] for parts in memories], loaded)
                              for k in range(len(cost.MemoryParts._fields))))
    step_s = pipe_s + tail + optimizer_s
    return StepTotals(
        step_s=step_s,
        parts_s=parts_s,
        bubble_fraction=cost.bubble_share(bubble_s=bubble_s, step_s=step_s),
        peak_memory_bytes=peak,
        exposed=exposed,
    )


def _zero_bubble_pipeline(
    runs: Sequence[StageRun], critical: Real, max_s: Real, *, schedule: ScheduleName,
    num_stages: Real, num_microbatches: Real,
) -> tuple[Real, Real]:  # fmt: skip
    """The pipeline and its bubble under a zero-bubble schedule
    (:func:`cost.zero_bubble_bubble`), every stage priced as the critical one: exact for equal
    stages, an upper estimate of the fill and drain when the others are faster. The critical
    stage's seconds split into its forward, its weight gradients and the rest (input
    gradients, recomputation, sends), the collectives shared in proportion to compute as
    :func:`_phases` shares them."""
    compute = pick([r.time.compute_s for r in runs], critical)
    share = max_s / maximum(compute, 1e-300)
    forward = pick([r.time.forward_s for r in runs], critical) * share
    weight = pick([r.time.weight_s for r in runs], critical) * share
    bubble = cost.zero_bubble_bubble(
        schedule, forward_s=forward, input_s=max_s - forward - weight, weight_s=weight,
        pp=num_stages, num_microbatches=num_microbatches,
    )
    return num_microbatches * max_s + bubble, bubble



def equal_runs(keys: Sequence[Hashable]) -> list[tuple[int, int]]:
    """(first, count) of the runs of consecutive stages with equal ``keys``, the first and
    the last stage alone (only they carry the tied embedding's all-reduce): the runs the step
    composer adds up.

    >>> equal_runs(["a", "b", "b", "b", "b"])
    [(0, 1), (1, 3), (4, 1)]
    """
    runs: list[tuple[int, int]] = []
    last = len(keys) - 1
    for i, key in enumerate(keys):
        if runs and 0 < i < last and runs[-1][0] > 0 and keys[runs[-1][0]] == key:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def compose_step(
    cluster: ClusterSpec,
    knobs: PipelineKnobs,
    stages: Sequence[StageCost],
    *,
    tied: TiedCopy | None = None,
) -> StepCost:
    """Compose the stages' per-microbatch costs into one step's time and peak memory
    (:func:`step_totals`, with each stage's own numbers for the plan).

    The stages may differ (layers, sharding, ZeRO stage, groups): the pipeline, the exposed
    gradient synchronisation and the optimizer step are composed the same way for all.
    """
    pp = len(stages)
    spans = equal_runs([id(s) for s in stages])
    schedule = schedule_name(knobs.schedule, knobs.vpp)
    statics = stage_statics(cluster, knobs.states_precision, [stages[first] for first, _ in spans],
                            tied=tied, offload=knobs.offload,
                            gathered_bytes_per_param=knobs.gathered_bytes_per_param,
                            stack=knobs.stack)  # fmt: skip
    # The optimizer's gradient accumulation is weight-gradient work in each backward.
    accumulated = [replace(stages[first], time=stages[first].time.with_weight_work(
                       statics.accumulation(j, knobs.num_microbatches)))
                   for j, (first, _) in enumerate(spans)]  # fmt: skip
    stages = [accumulated[j] for j, (_, count) in enumerate(spans) for _ in range(count)]
    overlapped = {id(s): replace(s, time=moe_overlapped(s.time, cluster, knobs, schedule=schedule,
                                                        num_stages=pp)) for s in stages}
    shown = [overlapped[id(s)] for s in stages]  # what each stage's breakdown shows
    accumulating = knobs.num_microbatches > 1
    runs = [StageRun(time=stages[first].time, sync=statics.sync(j, accumulating=accumulating),
                     state_bytes=statics.state_bytes[j], first=first, count=count,
                     tied_s=statics.tied_s if first in (0, pp - 1) else 0.0,
                     gathered_bytes=stages[first].time.layer_params
                     * statics.gathered_bytes_per_param)
            for j, (first, count) in enumerate(spans)]  # fmt: skip
    totals = step_totals(cluster, knobs, runs, schedule=schedule, num_stages=pp,
                         optimizer_s=statics.optimizer_s)  # fmt: skip
    per_stage = [(r, e) for r, e in zip(runs, totals.exposed, strict=True)
                 for _ in range(r.count)]  # fmt: skip
    syncs = [_Sync(per_microbatch_s=e.per_microbatch_s, tail_s=e.once_s + r.tied_s,
                   hidden_per_microbatch_s=e.hidden_per_microbatch_s,
                   hidden_reduce_once_s=e.hidden_reduce_once_s,
                   hidden_gather_once_s=e.hidden_gather_once_s)
             for r, e in per_stage]  # fmt: skip
    return StepCost(
        step_s=totals.step_s,
        time=StepTime(**totals.parts_s),
        bubble_fraction=totals.bubble_fraction,
        peak_memory_bytes=totals.peak_memory_bytes,
        stage_memory_bytes=tuple(
            run_memory_bytes(r, i, cluster, knobs, schedule, pp)
            for i, (r, _) in enumerate(per_stage)
        ),
        stage_time_s=tuple(
            (s.time.compute_s, _communication_s(s.time, y), s.time.pipeline_comm_s)
            for s, y in zip(shown, syncs, strict=True)
        ),
        stage_phase_s=tuple(_phases(s.time, y) for s, y in zip(shown, syncs, strict=True)),
        stage_sync_tail_s=tuple(y.tail_s for y in syncs),
        stage_weight_s=tuple(_weight_s(s.time, y) for s, y in zip(shown, syncs, strict=True)),
        stage_comm_s=tuple(_comm_parts(s.time, y) for s, y in zip(shown, syncs, strict=True)),
        host_bytes=statics.accumulating_host_bytes if accumulating else statics.host_bytes,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sync:
    """A stage's data-parallel communication: per microbatch and once per step, exposed."""

    per_microbatch_s: float
    """Exposed with every microbatch."""
    tail_s: float
    """Exposed once per step, after the stage's last backward."""
    hidden_per_microbatch_s: float = 0.0
    """Hidden behind every microbatch's forward and backward."""
    hidden_reduce_once_s: float = 0.0
    """The once-per-step gradient reduction hidden behind the last backward."""
    hidden_gather_once_s: float = 0.0
    """The once-per-step weight gather hidden behind the next forward."""


def _comm_parts(t: LayerCost, sync: _Sync) -> dict[str, float]:
    """A stage's communication by kind, exposed and hidden, as a plan's stage records it."""
    return {
        "tensor_parallel_comm_s": t.tp_comm_s, "context_parallel_comm_s": t.cp_comm_s,
        "expert_parallel_comm_s": t.ep_comm_s, "data_parallel_comm_s": sync.per_microbatch_s,
        "tensor_parallel_hidden_s": t.tp_hidden_s, "context_parallel_hidden_s": t.cp_hidden_s,
        "expert_parallel_hidden_s": t.ep_hidden_s,
        "data_parallel_hidden_s": sync.hidden_per_microbatch_s,
        "grad_reduce_hidden_s": sync.hidden_reduce_once_s,
        "param_gather_hidden_s": sync.hidden_gather_once_s,
    }  # fmt: skip


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


def _weight_s(t: LayerCost, sync: _Sync) -> float:
    """The weight gradients' seconds of one microbatch, with the share of the communication
    :func:`_phases` gives the backward they are part of."""
    compute = t.compute_s
    return t.weight_s * (1 + _communication_s(t, sync) / compute) if compute > 0 else 0.0
