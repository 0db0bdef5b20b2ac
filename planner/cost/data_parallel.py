"""The data-parallel step: gradient reduction and parameter gathering, what of them
overlaps the backward and forward, the optimizer step, and the optimizers' gradient
accumulation between microbatches."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.communication import CommGroup, collective_time_s, exposed_s
from planner.cost.compute import compute_time_s
from planner.cost.elementwise import Real, minimum, where
from planner.cost.memory import ADAM_STATE, adam_traffic_bytes, gradient_bytes_on_wire
from planner.cost.profiled import optimizer_scale
from planner.spec import ClusterSpec, DeviceSpec
from planner.vocabulary import CollectiveKind, Offload, Stack, StatesPrecision


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelSync:
    """Data-parallel traffic of some weights under one ZeRO stage, in seconds."""

    reduce_once_s: float
    """Gradients, once per step."""
    gather_once_s: float
    """Updated weights, once per step."""
    reduce_per_microbatch_s: float
    """Gradient reduce-scatter, every microbatch (ZeRO 2 and 3)."""
    gather_per_microbatch_s: float
    """Weight all-gathers, every microbatch (ZeRO 3: one before the forward, one before the
    backward)."""

    def per_microbatch_s(self, num_microbatches: int) -> float:
        """Everything, with the once-per-step part shared among the microbatches."""
        once = (self.reduce_once_s + self.gather_once_s) / num_microbatches
        return once + self.reduce_per_microbatch_s + self.gather_per_microbatch_s

    def __add__(self, other: DataParallelSync) -> DataParallelSync:
        return DataParallelSync(
            reduce_once_s=self.reduce_once_s + other.reduce_once_s,
            gather_once_s=self.gather_once_s + other.gather_once_s,
            reduce_per_microbatch_s=self.reduce_per_microbatch_s + other.reduce_per_microbatch_s,
            gather_per_microbatch_s=self.gather_per_microbatch_s + other.gather_per_microbatch_s,
        )


NO_SYNC = DataParallelSync(reduce_once_s=0.0, gather_once_s=0.0, reduce_per_microbatch_s=0.0,
                           gather_per_microbatch_s=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExposedSync:
    """The part of some data-parallel traffic left on the critical path, in seconds."""

    per_microbatch_s: float
    """Every microbatch: the per-microbatch traffic its forward and backward do not hide."""
    once_s: float
    """Once per step: the once-per-step reduction and gather the last backward and the next forward
    do not hide."""
    hidden_per_microbatch_s: float = 0.0
    """Every microbatch: the per-microbatch traffic its forward and backward hide."""
    hidden_reduce_once_s: float = 0.0
    """Once per step: the gradient reduction the last backward hides."""
    hidden_gather_once_s: float = 0.0
    """Once per step: the weight gather the next forward hides."""


def exposed_sync(
    sync: DataParallelSync,
    *,
    forward_s: Real,
    backward_s: Real,
    overlap_grad_reduce: Real,
    overlap_param_gather: Real,
    contention: float = 0.0,
) -> ExposedSync:
    """What ``sync`` leaves exposed beside one microbatch's ``forward_s`` and ``backward_s``
    of the same weights' compute.

    With ``overlap_grad_reduce`` the once-per-step reduction hides behind the last
    microbatch's backward (Megatron-Core starts a bucket's reduction as soon as the last
    backward produced it), and with ``overlap_param_gather`` the once-per-step gather behind
    the next forward. ZeRO-3 prefetches weights behind every forward and backward, and ZeRO-2/3
    reduce-scatters hide behind each microbatch's backward. Each overlap hides its own traffic
    only: ``overlap_param_gather`` the gathers (behind the forward and backward they prefetch
    for), ``overlap_grad_reduce`` the reduce-scatters (behind the backward); with both on, the
    two share the one window of the microbatch's compute, on the same links.

    Communication that does hide still slows the compute it overlaps: NCCL's kernels take
    SMs and HBM bandwidth from the GEMMs running beside them. ``contention`` is the fraction of
    the overlapped communication's time the compute loses (the device's
    ``efficiency.overlap_contention``).

    What hides is ``hidden_*``: the traffic is its exposed part (without the contention's
    slowdown) plus its hidden part.

    >>> sync = DataParallelSync(reduce_once_s=3.0, gather_once_s=1.0,
    ...                         reduce_per_microbatch_s=0.0, gather_per_microbatch_s=0.0)
    >>> exposed = exposed_sync(sync, forward_s=1.0, backward_s=2.0,
    ...                        overlap_grad_reduce=True, overlap_param_gather=False)
    >>> exposed.per_microbatch_s, exposed.once_s
    (0.0, 2.0)
    >>> exposed = exposed_sync(sync, forward_s=1.0, backward_s=2.0, overlap_grad_reduce=True,
    ...                        overlap_param_gather=False, contention=0.25)
    >>> exposed.once_s, exposed.hidden_reduce_once_s, exposed.hidden_gather_once_s
    (2.5, 2.0, 0.0)

    ZeRO-3's gathers (1.5 s a microbatch) and reduce-scatters (1.0 s): the gathers' overlap alone
    leaves the reduce-scatters exposed, the reductions' alone the gathers.

    >>> zero3 = DataParallelSync(reduce_once_s=0.0, gather_once_s=0.0,
    ...                          reduce_per_microbatch_s=1.0, gather_per_microbatch_s=1.5)
    >>> [exposed_sync(zero3, forward_s=1.0, backward_s=2.0, overlap_grad_reduce=grads,
    ...               overlap_param_gather=gathers).per_microbatch_s
    ...  for grads, gathers in ((False, False), (False, True), (True, False), (True, True))]
    [2.5, 1.0, 1.5, 0.0]
    """
    grad_hide = where(overlap_grad_reduce, backward_s, 0.0)
    gather_hide = where(overlap_param_gather, forward_s, 0.0)
    # Every microbatch: the gathers prefetch behind its forward and backward, the
    # reduce-scatters follow its backward; what either overlap leaves off stays exposed.
    window = gather_hide + where(overlap_param_gather | overlap_grad_reduce, backward_s, 0.0)
    # (summed in per_mb_comm's order: with both on, the same float)
    hideable = (where(overlap_grad_reduce, sync.reduce_per_microbatch_s, 0.0)
                + where(overlap_param_gather, sync.gather_per_microbatch_s, 0.0))  # fmt: skip

    def cost(comm_s: Real, hidden_behind_s: Real) -> Real:
        return exposed_s(comm_s, hidden_behind_s) + contention * minimum(comm_s, hidden_behind_s)

    per_mb_comm = sync.reduce_per_microbatch_s + sync.gather_per_microbatch_s
    hidden_per_mb = minimum(hideable, window)
    per_mb = per_mb_comm - hidden_per_mb + contention * hidden_per_mb
    once = cost(sync.reduce_once_s, grad_hide) + cost(sync.gather_once_s, gather_hide)
    return ExposedSync(
        per_microbatch_s=per_mb, once_s=once,
        hidden_per_microbatch_s=hidden_per_mb,
        hidden_reduce_once_s=minimum(sync.reduce_once_s, grad_hide),
        hidden_gather_once_s=minimum(sync.gather_once_s, gather_hide),
    )  # fmt: skip


WHOLE_GRADIENT_REDUCTION: tuple[StatesPrecision, ...] = ("bf16-deepspeed",)
"""Where ZeRO-1 all-reduces every gradient whole instead of reduce-scattering it: DeepSpeed's
``BF16_Optimizer`` has no ``reduce_gradients``, so ``DeepSpeedEngine.allreduce_gradients``
(and the pipeline engine's ``_bf16_reduce_grads``) all-reduce the buffered gradients
(``buffered_allreduce_fallback``: ``deepspeed/runtime/engine.py`` lines 2048-2062,
``deepspeed/runtime/pipe/engine.py`` lines 293-304 at microsoft/DeepSpeed 38327e0); after
its step each rank all-gathers its updated partition (``update_lp_params``:
``all_gather_dp_groups``, ``deepspeed/runtime/bf16_optimizer.py`` lines 423-436)."""


def data_parallel_sync(
    cluster: ClusterSpec,
    group: CommGroup | None,
    *,
    params: float,
    precision: StatesPrecision,
    zero: int,
) -> DataParallelSync:
    """The gradient reduction and weight gathers of ``params`` parameters replicated on
    ``group`` (None: not replicated, nothing to move).

    ZeRO 0: all-reduce the gradients once; 1 (Megatron's distributed optimizer): reduce-scatter
    them (all-reduce them: :data:`WHOLE_GRADIENT_REDUCTION`), then all-gather the updated
    compute-precision weights; 2: reduce-scatter every
    microbatch (the gradients are sharded); 3: also all-gather the weights for every
    microbatch's forward and backward (Rajbhandari et al., 2020).
    """
    if group is None or group.size <= 1 or params <= 0:
        return NO_SYNC
    grads = params * gradient_bytes_on_wire(precision)
    weights = params * ADAM_STATE[precision].weights

    def t(kind: CollectiveKind, nbytes: float) -> float:
        return collective_time_s(cluster, kind, nbytes, group)

    if zero == 0:
        return DataParallelSync(reduce_once_s=t("all_reduce", grads), gather_once_s=0.0,
                                reduce_per_microbatch_s=0.0, gather_per_microbatch_s=0.0)
    if zero == 1:
        whole = precision in WHOLE_GRADIENT_REDUCTION
        return DataParallelSync(reduce_once_s=t("all_reduce" if whole else "reduce_scatter",
                                                grads),
                                gather_once_s=t("all_gather", weights),
                                reduce_per_microbatch_s=0.0, gather_per_microbatch_s=0.0)
    if zero == 2:
        return DataParallelSync(reduce_once_s=0.0, gather_once_s=t("all_gather", weights),
                                reduce_per_microbatch_s=t("reduce_scatter", grads),
                                gather_per_microbatch_s=0.0)
    return DataParallelSync(reduce_once_s=0.0, gather_once_s=0.0,
                            reduce_per_microbatch_s=t("reduce_scatter", grads),
                            gather_per_microbatch_s=2 * t("all_gather", weights))


def optimizer_step_s(device: DeviceSpec, precision: StatesPrecision, *, params: float) -> float:
    """Adam's update of ``params`` local parameters: memory-bound (reads and writes the
    optimizer state, reads the gradients, writes the compute-precision weights); a layer
    profile's measured step scales it (:func:`~planner.cost.profiled.optimizer_scale`)."""
    traffic = adam_traffic_bytes(precision)
    seconds = compute_time_s(device, precision, flops=0.0, bytes_moved=params * traffic)
    return seconds * optimizer_scale(device.efficiency.profile)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradientAccumulation:
    """What runs over each local (unsharded) parameter a microbatch beside the layers, on the
    device's stream: an optimizer's accumulation of the gradients after the backward, or
    FSDP2's copies of the gathered weights and the gradients (:func:`fsdp2_copies`):
    memory-bound kernels."""

    bytes_per_param: float
    """Bytes read and written per local parameter after each microbatch but a step's first."""
    first_bytes_per_param: float
    """The same after a step's first microbatch (autograd stores the first gradient where the
    later ones are added in)."""

    def seconds(self, device: DeviceSpec, *, params: float, num_microbatches: Real) -> Real:
        """Seconds a microbatch over ``params`` local gradients, averaged over a step of
        ``num_microbatches``, at the device's memory-bound rate (a launch each pass).

        >>> from planner.spec import DeviceSpec
        >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=1000,
        ...                  peak_tflops={"bf16": 300})
        >>> gpu = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(
        ...     update={"memory_bound_fraction": 1.0, "kernel_launch_us": 0.0})})
        >>> BF16_OPTIMIZER.seconds(gpu, params=1e9, num_microbatches=4)  # 18 GB each pass
        0.018
        >>> # 6 GB after the first microbatch, 18 after each of the 3 others: 60 over 4
        >>> round(ZERO_FP32_GRADIENTS.seconds(gpu, params=1e9, num_microbatches=4), 6)
        0.015
        """
        if not (self.bytes_per_param or self.first_bytes_per_param):
            return 0.0  # the common case, in the layer ILP's inner loop
        first = _pass_s(device, params * self.first_bytes_per_param)
        later = _pass_s(device, params * self.bytes_per_param)
        return (first + (num_microbatches - 1) * later) / num_microbatches


def _pass_s(device: DeviceSpec, nbytes: float) -> float:
    """One memory-bound pass moving ``nbytes`` (none: nothing to run); with no FLOPs the
    precision names no peak that matters."""
    return compute_time_s(device, "bf16", flops=0.0, bytes_moved=nbytes) if nbytes else 0.0


NO_ACCUMULATION = GradientAccumulation(bytes_per_param=0.0, first_bytes_per_param=0.0)
"""Accumulation inside the weight-gradient GEMM (Megatron-LM's ``gradient_accumulation_fusion``
into ``main_grad``): nothing apart. The copies FSDP1 and Megatron-FSDP make of the gradients
for their reduce-scatters are not priced (FSDP2's are: :func:`fsdp2_copies`)."""
BF16_OPTIMIZER = GradientAccumulation(bytes_per_param=18.0, first_bytes_per_param=18.0)
"""DeepSpeed's ``BF16_Optimizer``: the backward writes fresh bf16 gradients (``clear_lp_grads``
sets them to None first) and ``update_hp_grads`` adds each into its fp32 buffer,
``hp_grad.add_(lp.grad.to(fp32))``: a cast reading 2 bytes and writing 4, an add reading 8 and
writing 4, after every microbatch's backward, the first's included (the buffer is zeroed at
the step); in the pipeline engine's ``_exec_backward_pass`` and the engine's backward alike
(``deepspeed/runtime/pipe/engine.py``, ``deepspeed/runtime/bf16_optimizer.py`` at
microsoft/DeepSpeed 77b649d, BLOOM's, and deepspeedai/DeepSpeed edaa722)."""
ZERO_FP32_GRADIENTS = GradientAccumulation(bytes_per_param=18.0, first_bytes_per_param=6.0)
"""DeepSpeed's ZeRO-1 optimizer accumulating 16-bit gradients in fp32 (``grad_accum_dtype``
fp32, which the planner's DeepSpeed export sets for bf16): after each backward
``fill_grad_accum_attribute`` casts every gradient to fp32 (2 bytes read, 4 written), the
first into ``param.grad_accum``, the later ones added into it (8 read, 4 written more)
(``deepspeed/runtime/zero/stage_1_and_2.py`` at deepspeedai/DeepSpeed edaa722, called from
the engine's ``_backward_epilogue``)."""
AUTOGRAD_16BIT = GradientAccumulation(bytes_per_param=6.0, first_bytes_per_param=0.0)
"""DeepSpeed's fp16 optimizers at ZeRO 0-1 (``FP16_Optimizer``, the ZeRO-1 optimizer with
fp16 accumulation, which hooks no backward): autograd adds each microbatch's gradient into
``.grad`` in place, reading 4 bytes and writing 2, from the second microbatch on."""
ZERO_BUCKET = GradientAccumulation(bytes_per_param=4.0, first_bytes_per_param=4.0)
"""DeepSpeed's ZeRO-2 and ZeRO-3: each microbatch's backward hook copies every 16-bit gradient
into the reduction bucket (``contiguous_gradients``, on by default), reading 2 bytes and writing
2, before the bucket's reduce-scatter; what accumulates after is the rank's partition
(``reduce_independent_p_g_buckets_and_remove_grads`` in ``deepspeed/runtime/zero/
stage_1_and_2.py``, ``__add_grad_to_ipg_bucket`` in ``zero/stage3.py``, deepspeedai/DeepSpeed
edaa722)."""


FSDP2_STACKS: tuple[Stack, ...] = ("torchtitan-eager", "torchtitan-compiled")
"""Stacks whose sharded data parallelism is PyTorch's FSDP2 (``fully_shard``), which copies each
gathered parameter out of its all-gather buffer and each gradient into its reduce-scatter
buffer on the device's stream (:func:`fsdp2_copies`)."""


def fsdp2_copies(precision: StatesPrecision, zero: int) -> GradientAccumulation:
    """FSDP2's copies on the compute stream, per local (unsharded) parameter, under
    ``precision``'s parameters at ZeRO stage ``zero`` as torchtitan maps them
    (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): after each all-gather,
    ``split_with_sizes_copy`` out of the gathered buffer (2 ``p`` bytes, ``p`` a parameter's:
    read and write); before each reduce-scatter, ``_chunk_cat`` of the gradients into the fp32
    ``reduce_dtype`` buffer (``p + 4``), on the current stream in current PyTorch
    (``foreach_reduce``; the 2024 releases ran it on the reduce-scatter stream). ZeRO-3
    (``reshard_after_forward``) gathers twice a microbatch, ZeRO-2 once, each reducing once;
    ZeRO-1 (under pipelining, which torchtitan runs with ``reshard_after_forward`` off and
    gradient sync and resharding held to the step's last microbatch) once a step.

    >>> fsdp2_copies("bf16", 3).bytes_per_param, fsdp2_copies("bf16", 2).bytes_per_param
    (14.0, 10.0)
    >>> fsdp2_copies("bf16", 1).first_bytes_per_param, fsdp2_copies("bf16", 1).bytes_per_param
    (10.0, 0.0)
    """
    p = 4.0 if precision == "fp32" else 2.0
    gathers = {3: 2, 2: 1, 1: 1}.get(zero, 0)
    per_step = gathers * 2 * p + (p + 4) if gathers else 0.0
    if zero == 1:
        return GradientAccumulation(bytes_per_param=0.0, first_bytes_per_param=per_step)
    return GradientAccumulation(bytes_per_param=per_step, first_bytes_per_param=per_step)


def gradient_accumulation(
    precision: StatesPrecision, *, zero: int, offload: Offload = "none",
    stack: Stack | None = None,
) -> GradientAccumulation:
    """How a run keeping its states as ``precision`` accumulates gradients over microbatches.
    DeepSpeed builds ``BF16_Optimizer`` for bf16 with fp32 accumulation at ZeRO 0-1 without
    ZeRO-Offload (``DeepSpeedEngine._do_optimizer_sanity_check``, ``deepspeed/runtime/
    engine.py``), its ZeRO optimizer otherwise, which at ZeRO 2-3 reduces each microbatch's
    gradients through its buckets (the reduce-scatter priced with the sync). On an FSDP2 stack
    (:data:`FSDP2_STACKS`), sharded data parallelism's copies (:func:`fsdp2_copies`).

    >>> gradient_accumulation("bf16-deepspeed", zero=1) == BF16_OPTIMIZER
    True
    >>> gradient_accumulation("bf16-deepspeed", zero=1, offload="zero-offload").bytes_per_param
    18.0
    >>> gradient_accumulation("fp16-deepspeed", zero=1).first_bytes_per_param
    0.0
    >>> gradient_accumulation("bf16-deepspeed", zero=3).bytes_per_param
    4.0
    >>> gradient_accumulation("bf16", zero=1) == NO_ACCUMULATION
    True
    """
    if stack in FSDP2_STACKS and zero >= 1:
        return fsdp2_copies(precision, zero)
    if precision not in ("bf16-deepspeed", "fp16-deepspeed"):
        return NO_ACCUMULATION
    if zero >= 2:
        return ZERO_BUCKET
    if precision == "fp16-deepspeed":
        return AUTOGRAD_16BIT
    return ZERO_FP32_GRADIENTS if offload == "zero-offload" else BF16_OPTIMIZER
