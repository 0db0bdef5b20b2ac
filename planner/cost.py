"""THE cost model: every planner in the repository prices plans with these functions.

- Compute: a roofline per operator, ``max(flops / (peak * f_gemm), bytes / (hbm * f_mem))``
  plus a launch cost per kernel, with the calibrated fractions of the cluster file.
- Communication: alpha-beta per collective with ring bus-bandwidth factors (all-reduce
  ``2(n-1)/n``, all-gather and reduce-scatter ``(n-1)/n``); a group that spans several network
  levels is priced both flat (at its slowest level) and hierarchically (level by level on ever
  smaller pieces, as NCCL does across nodes), whichever is cheaper.
- Memory: mixed-precision Adam state per parameter as Megatron-LM's distributed optimizer
  documentation tabulates it, divided by the ZeRO stage; activations per Korthikanti et al.
- Pipeline: step time ``m * max(t) + (sum(t) - max(t)) / v`` for ``m`` microbatches and ``v``
  virtual stages, which is ``sum_i t_i + (m - 1) max_i t_i`` (Alpa, Eq. 2) for ``v = 1`` and
  has the bubble fraction ``(p - 1) / (v m)`` (Narayanan et al., SC'21) for equal stages.

Units: seconds, bytes, FLOPs, bytes/second. No hardware number lives here: they all come from
the :class:`~planner.spec.ClusterSpec`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from planner.graph.ops import Op, Tensor
from planner.spec import ClusterSpec, DeviceSpec, GemmEfficiency, NetworkLevel, Precision

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
Recompute = Literal["none", "selective", "full"]
ScheduleName = Literal["1f1b", "gpipe"]

# Causal attention with a fused kernel computes only the lower triangle of the scores.
CAUSAL_FRACTION = 0.5
# FlashAttention-2's backward runs five matmuls against the forward's two, recomputing the
# scores (Dao, 2023, Sec. 3.1): 2.5x the forward FLOPs instead of 2x.
FLASH_BACKWARD_FACTOR = 2.5
# A matmul's backward computes the input and the weight gradients: twice the forward FLOPs.
MATMUL_BACKWARD_FACTOR = 2.0
# A memory-bound op's backward reads the output gradient and the saved input and writes the
# input gradient: about twice the forward's traffic.
ELEMENTWISE_BACKWARD_FACTOR = 2.0


# --------------------------------------------------------------------------- compute


def gemm_fraction(efficiency: GemmEfficiency, flops_per_call: float) -> float:
    """Achieved fraction of peak for one GEMM of ``flops_per_call`` FLOPs."""
    half = efficiency.half_saturation_gflop * 1e9
    return efficiency.max_fraction * flops_per_call / (flops_per_call + half)


def compute_lower_bound_s(device: DeviceSpec, precision: Precision, *, flops: float) -> float:
    """No sharding runs ``flops`` faster than the GEMM curve's ceiling allows (its fraction of
    peak only approaches ``max_fraction`` as GEMMs grow): a bound, not a price."""
    return flops / (device.peak_flops_per_s(precision) * device.efficiency.gemm.max_fraction)


def compute_time_s(
    device: DeviceSpec,
    precision: Precision,
    *,
    flops: float,
    bytes_moved: float,
    calls: int = 1,
) -> float:
    """Roofline time of ``calls`` kernels doing ``flops`` and moving ``bytes_moved`` in all.

    >>> from planner.spec import DeviceSpec
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 300})
    >>> compute_time_s(gpu, "bf16", flops=3e12, bytes_moved=0)  # compute-bound
    0.01
    >>> compute_time_s(gpu, "bf16", flops=0, bytes_moved=2e9)  # memory-bound
    0.001
    """
    eff = device.efficiency
    memory_s = bytes_moved / (device.memory_bandwidth_bytes_s * eff.memory_bound_fraction)
    math_s = 0.0
    if flops > 0:
        fraction = gemm_fraction(eff.gemm, flops / calls)
        math_s = flops / (device.peak_flops_per_s(precision) * fraction)
    return max(math_s, memory_s) + calls * eff.kernel_launch_us * 1e-6


def sharded_bytes(tensor: Tensor, degrees: Mapping[str, int]) -> float:
    """Bytes of one device's shard of ``tensor`` when dim ``d`` is split ``degrees[d]`` ways."""
    numel = 1
    for name, size in tensor.dims:
        numel *= -(-size // degrees.get(name, 1))
    return numel * tensor.element_bytes


@dataclass(frozen=True, slots=True)
class OpTime:
    """Seconds of one op on one device for one microbatch, by pass."""

    forward_s: float
    backward_s: float


def op_time(
    op: Op,
    device: DeviceSpec,
    precision: Precision,
    *,
    activation_degrees: Mapping[str, int],
    weight_degrees: Mapping[str, int],
    compute_degree: int,
    gemm_calls: int = 1,
    flash_attention: bool = True,
) -> OpTime:
    """Forward and backward compute seconds of ``op`` under a sharding.

    Strategies that divide the FLOPs by the same degree cost the same, whichever dims they
    split: the GEMM efficiency depends only on the FLOPs per call.
    """
    moved = sum(sharded_bytes(t, activation_degrees) for t in (*op.inputs, op.output))
    if op.weight is not None:
        moved += sharded_bytes(op.weight, weight_degrees)
    flops = op.flops / compute_degree
    backward_factor = MATMUL_BACKWARD_FACTOR if op.is_gemm else ELEMENTWISE_BACKWARD_FACTOR
    if op.kind == "attention":
        if flash_attention:
            flops *= CAUSAL_FRACTION
            backward_factor = FLASH_BACKWARD_FACTOR
        else:
            # Unfused: the scores are written, then read by softmax, dropout and the matmul.
            moved += 3 * sum(sharded_bytes(t, activation_degrees) for t in op.score_tensors)
    forward = compute_time_s(device, precision, flops=flops, bytes_moved=moved, calls=gemm_calls)
    backward = compute_time_s(
        device, precision, flops=backward_factor * flops,
        bytes_moved=ELEMENTWISE_BACKWARD_FACTOR * moved, calls=2 * gemm_calls,
    )  # fmt: skip
    return OpTime(forward, backward)


# --------------------------------------------------------------------------- communication


@dataclass(frozen=True, slots=True)
class CommGroup:
    """``size`` ranks spaced ``stride`` apart in the cluster's rank order (rank = device)."""

    size: int
    stride: int = 1


def members_per_level(cluster: ClusterSpec, group: CommGroup) -> tuple[int, ...]:
    """How many of the group's ranks share one domain of each network level.

    >>> from planner.spec import ClusterSpec
    >>> c = ClusterSpec.model_validate({"name": "c", "num_nodes": 4, "devices_per_node": 8,
    ...     "device": {"name": "g", "memory_gib": 80, "memory_bandwidth_gb_s": 2000,
    ...                "peak_tflops": {"bf16": 300}},
    ...     "network": [{"name": "nvlink", "domain_devices": 8, "bandwidth_gb_s": 300,
    ...                  "latency_us": 2},
    ...                 {"name": "ib", "domain_devices": 32, "bandwidth_gb_s": 25,
    ...                  "latency_us": 5}]})
    >>> members_per_level(c, CommGroup(size=32)), members_per_level(c, CommGroup(4, stride=8))
    ((8, 32), (1, 4))
    """
    counts = [
        min(group.size, max(1, level.domain_devices // group.stride)) for level in cluster.network
    ]
    counts[-1] = group.size  # the outermost level connects every device
    return tuple(counts)


def _ring_s(kind: CollectiveKind, nbytes: float, n: int, level: NetworkLevel) -> float:
    """One ring collective among ``n`` ranks on ``level``; latency as NCCL's tree (log n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    rounds = 2 if kind == "all_reduce" else 1
    bandwidth_term = rounds * (n - 1) / n * nbytes / level.bandwidth_bytes_s
    return bandwidth_term + rounds * math.ceil(math.log2(n)) * level.latency_s


def collective_time_s(
    cluster: ClusterSpec, kind: CollectiveKind, nbytes: float, group: CommGroup
) -> float:
    """Seconds of one collective on ``group``.

    ``nbytes`` is the full buffer: the all-reduced tensor, the all-gather's output, the
    reduce-scatter's input, or one rank's all-to-all send buffer.
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    counts = members_per_level(cluster, group)
    levels = cluster.network
    outer = next(i for i, c in enumerate(counts) if c == n)
    if kind == "all_to_all":
        # Each rank sends (c_l - c_{l-1}) / n of its buffer over level l; levels run in parallel.
        previous, slowest = 1, 0.0
        for count, level in zip(counts[: outer + 1], levels, strict=False):
            slowest = max(slowest, (count - previous) / n * nbytes / level.bandwidth_bytes_s)
            previous = count
        return slowest + levels[outer].latency_s * math.ceil(math.log2(n))
    flat = _ring_s(kind, nbytes, n, levels[outer])
    hierarchical, previous = 0.0, 1
    for count, level in zip(counts[: outer + 1], levels, strict=False):
        hierarchical += _ring_s(kind, nbytes / previous, count // previous, level)
        previous = count
    return min(flat, hierarchical)


def p2p_time_s(cluster: ClusterSpec, nbytes: float, distance: int, *, ranks: int = 2) -> float:
    """Seconds to send ``nbytes`` between neighbours of a row of ``ranks`` ranks ``distance``
    apart, at the slowest pair's pace: when the row spans several domains of a level, some
    neighbours sit in different domains (four stages of four ranks on 8-GPU nodes: stages 1
    and 2 are in different nodes), so the row is priced at the outermost level it spans."""
    if nbytes <= 0 or ranks <= 1:
        return 0.0
    counts = members_per_level(cluster, CommGroup(ranks, max(1, distance)))
    level = cluster.network[next(i for i, c in enumerate(counts) if c == ranks)]
    return level.latency_s + nbytes / level.bandwidth_bytes_s


def pipeline_send_s(
    cluster: ClusterSpec, nbytes: float, distance: int, *, chunks: int, stages: int = 2
) -> float:
    """One stage's pipeline traffic per microbatch: its activation sent forward and the
    gradient sent back, ``nbytes`` from each device, once per model chunk it holds, between
    ``stages`` stages ``distance`` ranks apart (:func:`p2p_time_s`: the pipeline runs at its
    slowest send)."""
    return 2 * chunks * p2p_time_s(cluster, nbytes, distance, ranks=stages)


def exposed_s(comm_s: float, hidden_behind_s: float) -> float:
    """Communication left on the critical path when it overlaps ``hidden_behind_s`` of work."""
    return max(0.0, comm_s - hidden_behind_s)


# --------------------------------------------------------------------------- memory


DEFAULT_MEMORY_MARGIN = 0.05
"""Share of a device's memory a plan leaves free unless told otherwise, beside the device's
``reserved_memory_gib`` (which counts the CUDA context and NCCL's communicators): the caching
allocator's rounding and fragmentation and the transient buffers the model does not price (see
the README, "Memory margin")."""


def memory_margin_bytes(memory_gib: float, margin_gib: float | None = None) -> float:
    """The memory a plan leaves free on a device of ``memory_gib``: ``margin_gib``, or
    :data:`DEFAULT_MEMORY_MARGIN` of the device when None.

    >>> memory_margin_bytes(80) / 2**30, memory_margin_bytes(80, 1.5) / 2**30
    (4.0, 1.5)
    """
    gib = DEFAULT_MEMORY_MARGIN * memory_gib if margin_gib is None else margin_gib
    return gib * 2**30


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state on one device."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """All three."""
        return self.weights + self.gradients + self.optimizer


# Megatron-LM distributed-optimizer docs: bf16 params + fp32 grads = 18 bytes/param
# (2 + 4 + 12: fp32 master, Adam m and v); fp16 params + fp16 grads = 20 (2 + 2 + 16: the
# optimizer also keeps an fp32 copy of the gradients); fp32 = 16 (4 + 4 + 8).
_ADAM_STATE: dict[Precision, StateBytes] = {
    "bf16": StateBytes(weights=2, gradients=4, optimizer=12),
    "fp16": StateBytes(weights=2, gradients=2, optimizer=16),
    "fp32": StateBytes(weights=4, gradients=4, optimizer=8),
}


def state_bytes_per_param(precision: Precision, *, zero: int, shards: int) -> StateBytes:
    """Adam state per parameter with ZeRO stage ``zero`` over ``shards`` data-parallel ranks.

    Stage 1 (Megatron's distributed optimizer) shards the optimizer state, stage 2 also the
    gradients, stage 3 also the weights.

    >>> state_bytes_per_param("bf16", zero=1, shards=8).total  # Megatron: 6 + 12/d
    7.5
    """
    full = _ADAM_STATE[precision]
    return StateBytes(
        weights=full.weights / (shards if zero >= 3 else 1),
        gradients=full.gradients / (shards if zero >= 2 else 1),
        optimizer=full.optimizer / (shards if zero >= 1 else 1),
    )


def gradient_bytes_on_wire(precision: Precision) -> float:
    """Bytes per parameter the data-parallel gradient reduction moves (fp32 main grads for
    bf16, as Megatron reduces them; fp16 grads for fp16)."""
    return _ADAM_STATE[precision].gradients


@dataclass(frozen=True, slots=True)
class DataParallelSync:
    """Data-parallel traffic of some weights under one ZeRO stage, in seconds."""

    reduce_once_s: float
    """Gradients, once per step."""
    gather_once_s: float
    """Updated weights, once per step."""
    reduce_per_microbatch_s: float
    gather_per_microbatch_s: float

    def per_microbatch_s(self, num_microbatches: int) -> float:
        """Everything, with the once-per-step part shared among the microbatches."""
        once = (self.reduce_once_s + self.gather_once_s) / num_microbatches
        return once + self.reduce_per_microbatch_s + self.gather_per_microbatch_s

    def __add__(self, other: DataParallelSync) -> DataParallelSync:
        return DataParallelSync(
            self.reduce_once_s + other.reduce_once_s,
            self.gather_once_s + other.gather_once_s,
            self.reduce_per_microbatch_s + other.reduce_per_microbatch_s,
            self.gather_per_microbatch_s + other.gather_per_microbatch_s,
        )


NO_SYNC = DataParallelSync(0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class ExposedSync:
    """The part of some data-parallel traffic left on the critical path, in seconds."""

    per_microbatch_s: float
    once_s: float


def exposed_sync(
    sync: DataParallelSync,
    *,
    forward_s: float,
    backward_s: float,
    overlap_grad_reduce: bool,
    overlap_param_gather: bool,
) -> ExposedSync:
    """What ``sync`` leaves exposed beside one microbatch's ``forward_s`` and ``backward_s``
    of the same weights' compute.

    With ``overlap_grad_reduce`` the once-per-step reduction hides behind the last
    microbatch's backward (Megatron-Core starts a bucket's reduction as soon as the last
    backward produced it), and with ``overlap_param_gather`` the once-per-step gather behind
    the next forward. ZeRO-3 prefetches weights behind every forward and backward, and ZeRO-2/3
    reduce-scatters hide behind each microbatch's backward.

    >>> exposed_sync(DataParallelSync(3.0, 1.0, 0.0, 0.0), forward_s=1.0, backward_s=2.0,
    ...              overlap_grad_reduce=True, overlap_param_gather=False)
    ExposedSync(per_microbatch_s=0.0, once_s=2.0)
    """
    grad_hide = backward_s if overlap_grad_reduce else 0.0
    gather_hide = forward_s if overlap_param_gather else 0.0
    window = gather_hide + (backward_s if overlap_param_gather or overlap_grad_reduce else 0.0)
    per_mb = exposed_s(sync.reduce_per_microbatch_s + sync.gather_per_microbatch_s, window)
    once = exposed_s(sync.reduce_once_s, grad_hide) + exposed_s(sync.gather_once_s, gather_hide)
    return ExposedSync(per_mb, once)


def data_parallel_sync(
    cluster: ClusterSpec,
    group: CommGroup | None,
    *,
    params: float,
    precision: Precision,
    zero: int,
) -> DataParallelSync:
    """The gradient reduction and weight gathers of ``params`` parameters replicated on
    ``group`` (None: not replicated, nothing to move).

    ZeRO 0: all-reduce the gradients once; 1 (Megatron's distributed optimizer): reduce-scatter
    them, then all-gather the updated compute-precision weights; 2: reduce-scatter every
    microbatch (the gradients are sharded); 3: also all-gather the weights for every
    microbatch's forward and backward (Rajbhandari et al., 2020).
    """
    if group is None or group.size <= 1 or params <= 0:
        return NO_SYNC
    grads = params * gradient_bytes_on_wire(precision)
    weights = params * _ADAM_STATE[precision].weights

    def t(kind: CollectiveKind, nbytes: float) -> float:
        return collective_time_s(cluster, kind, nbytes, group)

    if zero == 0:
        return DataParallelSync(t("all_reduce", grads), 0.0, 0.0, 0.0)
    if zero == 1:
        return DataParallelSync(t("reduce_scatter", grads), t("all_gather", weights), 0.0, 0.0)
    if zero == 2:
        return DataParallelSync(0.0, t("all_gather", weights), t("reduce_scatter", grads), 0.0)
    return DataParallelSync(0.0, 0.0, t("reduce_scatter", grads), 2 * t("all_gather", weights))


def optimizer_step_s(device: DeviceSpec, precision: Precision, *, params: float) -> float:
    """Adam's update of ``params`` local parameters: memory-bound (reads and writes the
    optimizer state, reads the gradients, writes the compute-precision weights)."""
    state = _ADAM_STATE[precision]
    traffic = 2 * state.optimizer + state.gradients + state.weights
    return compute_time_s(device, precision, flops=0.0, bytes_moved=params * traffic)


def saved_activation_bytes(
    op: Op,
    degrees: Callable[[Tensor], Mapping[str, int]],
    *,
    recompute: Recompute,
    flash_attention: bool,
) -> float:
    """Bytes ``op`` keeps for backward on one device, each kept tensor split as ``degrees``
    says (before full recompute, which the caller handles at layer level). Selective
    recompute and flash attention drop the ``s x s`` tensors (Korthikanti et al., Sec. 5)."""
    kept = sum(sharded_bytes(t, degrees(t)) for t in op.saved)
    if recompute == "none" and not flash_attention:
        kept += sum(sharded_bytes(t, degrees(t)) for t in op.score_tensors)
    return kept


# --------------------------------------------------------------------------- pipeline


def in_flight_microbatches(
    schedule: ScheduleName, *, stage: int, pp: int, vpp: int, num_microbatches: int
) -> float:
    """Microbatches' worth of one stage's activations held at the peak, for ``stage`` (0-based).

    1F1B: stage ``i`` of ``p`` holds ``p - i``. Interleaved 1F1B (Megatron's warm-up of
    ``2(p - i - 1) + (v - 1) p`` chunks plus one) holds ``1 + (p - 1)/(p v)`` times the
    first stage's 1F1B amount on stage 0 (Korthikanti et al., Sec. 4.2.3). GPipe holds all.
    """
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if vpp == 1:
        return float(min(pp - stage, m))
    chunks = min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    return chunks / vpp


@dataclass(frozen=True, slots=True)
class PipelineTime:
    """The pipeline's share of a step: total seconds and the bubble within it."""

    total_s: float
    bubble_s: float


def pipeline_time(
    stage_times_s: Sequence[float], *, num_microbatches: int, vpp: int = 1
) -> PipelineTime:
    """Forward-backward time of ``num_microbatches`` through stages of the given per-microbatch
    times (1F1B and GPipe share it; interleaving divides the fill and drain by ``vpp``).

    >>> pipeline_time([1.0, 1.0, 1.0, 1.0], num_microbatches=8)
    PipelineTime(total_s=11.0, bubble_s=3.0)
    """
    slowest = max(stage_times_s)
    busy = num_microbatches * slowest
    bubble = (sum(stage_times_s) - slowest) / vpp
    return PipelineTime(busy + bubble, bubble)


def bubble_fraction(*, pp: int, vpp: int, num_microbatches: int) -> float:
    """Closed-form bubble share of equal stages: ``(p - 1) / (v m)`` of the busy time."""
    return (pp - 1) / (vpp * num_microbatches)
