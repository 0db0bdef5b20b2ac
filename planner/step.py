"""One training step of a uniform configuration: pipeline, data-parallel sync, optimizer,
memory, and the derived throughput figures.

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
from planner.config import ResolvedConfig
from planner.layer_cost import LayerCost, Placement
from planner.spec import GIB, ClusterSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class StageCost:
    """One pipeline stage: per-microbatch costs and its local parameters."""

    time: LayerCost
    params_dense: float
    params_expert: float
    params_by_sync: dict[str, float]

    @classmethod
    def of(cls, layers: LayerCost) -> StageCost:
        """A stage made of ``layers``."""
        expert = sum(v for k, v in layers.params_by_sync.items() if k.startswith("edp"))
        return cls(
            time=layers,
            params_dense=sum(layers.params_by_sync.values()) - expert,
            params_expert=expert,
            params_by_sync=layers.params_by_sync,
        )


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Where one step's seconds go on the critical path; the fields add up to the step."""

    compute: float
    tensor_parallel_comm: float
    context_parallel_comm: float
    expert_parallel_comm: float
    pipeline_comm: float
    pipeline_bubble: float
    data_parallel_comm_exposed: float
    optimizer: float


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step: its seconds by category (on the critical stage) and the peak memory."""

    step_s: float
    time: TimeBreakdown
    bubble_fraction: float
    peak_memory_bytes: tuple[float, float, float, float, float]
    """Weights, gradients, optimizer, activations, other, of the most loaded stage."""
    stage_memory_bytes: tuple[tuple[float, float, float, float, float], ...]
    stage_time_s: tuple[tuple[float, float, float], ...]
    """Per stage and microbatch: compute, communication (incl. exposed per-microbatch
    data-parallel traffic), pipeline sends."""


@dataclass(frozen=True, slots=True)
class _Sync:
    """A stage's data-parallel communication: per microbatch and once per step, exposed."""

    per_microbatch_s: float
    tail_s: float


def _dp_sync(
    stage: StageCost, cluster: ClusterSpec, r: ResolvedConfig, pl: Placement, tied_copy_s: float
) -> _Sync:
    """Gradient reduction and ZeRO gathers of one stage (:func:`cost.data_parallel_sync`),
    exposed as far as the overlap windows do not hide them."""
    c = r.config
    groups = {"dp": pl.dp, "edp": pl.edp}
    once = grads_mb = gathers_mb = gather_once = 0.0
    for key, params in stage.params_by_sync.items():
        axes = key.split("+")
        if "tp" in axes:  # sequence-parallel replicated weights: summed over TP as well
            once += cost.data_parallel_sync(
                cluster, pl.tp, params=params, precision=r.training.precision, zero=0
            ).reduce_once_s
        group = groups["edp" if "edp" in axes else "dp"]
        sync = cost.data_parallel_sync(cluster, group, params=params,
                                       precision=r.training.precision, zero=c.zero)  # fmt: skip
        once += sync.reduce_once_s
        gather_once += sync.gather_once_s
        grads_mb += sync.reduce_per_microbatch_s
        gathers_mb += sync.gather_per_microbatch_s
    t = stage.time
    grad_hide = t.backward_s if c.overlap_grad_reduce else 0.0
    gather_hide = t.forward_s if c.overlap_param_gather else 0.0
    # ZeRO-3 prefetches weights behind the forward and backward; ZeRO-2/3 reduce-scatters hide
    # behind each microbatch's backward.
    window = (t.forward_s if c.overlap_param_gather else 0.0) + (
        t.backward_s if c.overlap_param_gather or c.overlap_grad_reduce else 0.0
    )
    per_mb = cost.exposed_s(grads_mb + gathers_mb, window)
    tail = cost.exposed_s(once, grad_hide) + cost.exposed_s(gather_once, gather_hide)
    return _Sync(per_mb, tail + tied_copy_s)


def _tied_embedding_s(model: ModelSpec, cluster: ClusterSpec, r: ResolvedConfig,
                      pl: Placement) -> float:  # fmt: skip
    """With tied embeddings and a pipeline, the first and last stages each hold the word
    embeddings and all-reduce their gradients after the backward (Megatron)."""
    if not model.tie_word_embeddings or r.config.pp == 1:
        return 0.0
    nbytes = model.vocab_size * model.hidden_size / r.config.tp
    nbytes *= cost.gradient_bytes_on_wire(r.training.precision)
    group = cost.CommGroup(2, (r.config.pp - 1) * pl.pipeline_distance)
    return cost.collective_time_s(cluster, "all_reduce", nbytes, group)


def _memory(
    stage: StageCost, index: int, cluster: ClusterSpec, r: ResolvedConfig
) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, activations, other) bytes of stage ``index``."""
    c = r.config
    dense = cost.state_bytes_per_param(r.training.precision, zero=c.zero, shards=r.dp * c.cp)
    expert = cost.state_bytes_per_param(
        r.training.precision, zero=c.zero, shards=r.dp * c.cp // c.ep
    )
    in_flight = cost.in_flight_microbatches(
        c.schedule, stage=index, pp=c.pp, vpp=c.vpp, num_microbatches=r.num_microbatches
    )
    pd, pe = stage.params_dense, stage.params_expert
    return (
        pd * dense.weights + pe * expert.weights,
        pd * dense.gradients + pe * expert.gradients,
        pd * dense.optimizer + pe * expert.optimizer,
        in_flight * stage.time.activation_bytes + stage.time.working_bytes,
        cluster.device.reserved_memory_gib * GIB,
    )


def _with_tied_copy(
    stages: Sequence[StageCost], model: ModelSpec, r: ResolvedConfig
) -> list[StageCost]:
    """The last stage's copy of tied word embeddings (memory, sync, optimizer)."""
    stages = list(stages)
    if model.tie_word_embeddings and r.config.pp > 1:
        extra = model.vocab_size * model.hidden_size / r.config.tp
        last = stages[-1]
        by_sync = dict(last.params_by_sync)
        by_sync["dp"] = by_sync.get("dp", 0.0) + extra
        stages[-1] = replace(last, params_dense=last.params_dense + extra, params_by_sync=by_sync)
    return stages


def compose_step(
    model: ModelSpec,
    cluster: ClusterSpec,
    r: ResolvedConfig,
    pl: Placement,
    stages: Sequence[StageCost],
) -> StepCost:
    """Compose the stages' per-microbatch costs into one step's time and peak memory."""
    c = r.config
    m = r.num_microbatches
    stages = _with_tied_copy(stages, model, r)
    tied_s = _tied_embedding_s(model, cluster, r, pl)
    memo: dict[tuple[int, bool], _Sync] = {}  # identical stages share one StageCost

    def sync(i: int, stage: StageCost) -> _Sync:
        key = (id(stage), i in (0, c.pp - 1))
        if key not in memo:
            memo[key] = _dp_sync(stage, cluster, r, pl, tied_s if key[1] else 0.0)
        return memo[key]

    syncs = [sync(i, s) for i, s in enumerate(stages)]
    stage_times = [s.time.time_s + y.per_microbatch_s for s, y in zip(stages, syncs, strict=True)]
    pipe = cost.pipeline_time(stage_times, num_microbatches=m, vpp=c.vpp)
    # Stage i finishes its last backward before stages 0..i-1 finish theirs.
    tail, still_busy = 0.0, 0.0
    for s, y in zip(stages, syncs, strict=True):
        tail = max(tail, y.tail_s - still_busy)
        still_busy += s.time.backward_s + s.time.recompute_s
    zero_shards = r.dp * c.cp if c.zero >= 1 else 1
    expert_shards = r.dp * c.cp // c.ep if c.zero >= 1 else 1
    optimizer = cost.optimizer_step_s(
        cluster.device, r.training.precision,
        params=max(s.params_dense / zero_shards + s.params_expert / expert_shards for s in stages),
    )  # fmt: skip
    critical = max(range(len(stages)), key=lambda i: stage_times[i])
    t = stages[critical].time
    memories = tuple(_memory(s, i, cluster, r) for i, s in enumerate(stages))
    return StepCost(
        step_s=pipe.total_s + tail + optimizer,
        time=TimeBreakdown(
            compute=m * t.compute_s,
            tensor_parallel_comm=m * t.tp_comm_s,
            context_parallel_comm=m * t.cp_comm_s,
            expert_parallel_comm=m * t.ep_comm_s,
            pipeline_comm=m * t.pipeline_comm_s,
            pipeline_bubble=pipe.bubble_s,
            data_parallel_comm_exposed=m * syncs[critical].per_microbatch_s + tail,
            optimizer=optimizer,
        ),
        bubble_fraction=pipe.bubble_s / (m * max(stage_times)),
        peak_memory_bytes=max(memories, key=sum),
        stage_memory_bytes=memories,
        stage_time_s=tuple(
            (s.time.compute_s,
             s.time.tp_comm_s + s.time.cp_comm_s + s.time.ep_comm_s + y.per_microbatch_s,
             s.time.pipeline_comm_s)
            for s, y in zip(stages, syncs, strict=True)
        ),
    )
