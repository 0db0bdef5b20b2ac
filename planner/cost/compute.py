"""Compute time: a roofline per operator with the calibrated GEMM and memory-bound
efficiencies of the cluster file, plus a launch cost per kernel."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from planner.graph import lowered
from planner.graph.ops import Op, Tensor, Unfused
from planner.spec import AttentionEfficiency, DeviceSpec, GemmEfficiency, ModelSpec, TrainingSpec
from planner.vocabulary import Precision

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


def attention_fraction(
    efficiency: AttentionEfficiency, *, keys_per_query: float, head_dim: float
) -> float:
    """Achieved fraction of peak for a fused attention kernel whose queries attend to
    ``keys_per_query`` keys on average with heads of ``head_dim`` dims.

    >>> from planner.spec import AttentionEfficiency
    >>> curve = AttentionEfficiency(max_fraction=0.6, half_saturation_tokens=512,
    ...                             half_saturation_head_dim=64)
    >>> round(attention_fraction(curve, keys_per_query=1536, head_dim=64), 6)
    0.225
    """
    e = efficiency
    return (e.max_fraction * keys_per_query / (keys_per_query + e.half_saturation_tokens)
            * head_dim / (head_dim + e.half_saturation_head_dim))  # fmt: skip


def fused_attention_fraction(
    device: DeviceSpec, *, keys_per_query: float, head_dim: float
) -> float | None:
    """The device's fused-attention fraction of peak for a kernel of ``keys_per_query`` keys
    and ``head_dim`` dims; None when the device has no attention curve, and the kernel is then
    priced on the GEMM curve by its FLOPs per call."""
    curve = device.efficiency.attention
    if curve is None:
        return None
    return attention_fraction(curve, keys_per_query=keys_per_query, head_dim=head_dim)


def grouped_gemm_fraction(
    device: DeviceSpec, *, flops: float, tokens_per_expert: float, reduction: float
) -> float:
    """Achieved fraction of peak for a rank's routed experts as one grouped GEMM of ``flops``
    in all, each expert of ``tokens_per_expert`` rows over a ``reduction`` dim: the device's
    grouped-GEMM curve, else its GEMM curve for the whole call's FLOPs (one kernel).

    >>> from planner.spec import DeviceSpec, DeviceEfficiency, GroupedGemmEfficiency
    >>> curve = GroupedGemmEfficiency(max_fraction=0.8, half_saturation_tokens=128,
    ...                               half_saturation_k=256)
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 300}, efficiency=DeviceEfficiency(grouped_gemm=curve))
    >>> round(grouped_gemm_fraction(gpu, flops=1e12, tokens_per_expert=128, reduction=768), 6)
    0.3
    """
    curve = device.efficiency.grouped_gemm
    if curve is None:
        return gemm_fraction(device.efficiency.gemm, flops)
    t, k = tokens_per_expert, reduction
    return (curve.max_fraction * t / (t + curve.half_saturation_tokens)
            * k / (k + curve.half_saturation_k))  # fmt: skip


def fused_attention_s(
    device: DeviceSpec, precision: Precision, *, flops: float, bytes_moved: float, calls: int,
    keys_per_query: float, head_dim: float, backward: bool,
) -> float:  # fmt: skip
    """Seconds of one pass of a fused attention kernel: the roofline at the device's attention
    curve (:func:`fused_attention_fraction`; the backward at its ``backward_fraction`` of the
    forward's rate) with the curve's fixed cost per call of that pass on top; on the GEMM curve
    by its FLOPs when the device has no attention curve.

    >>> from planner.spec import AttentionEfficiency, DeviceEfficiency, DeviceSpec
    >>> curve = AttentionEfficiency(max_fraction=0.5, half_saturation_tokens=0,
    ...                             half_saturation_head_dim=0, backward_fraction=0.8,
    ...                             forward_call_us=20, backward_call_us=100)
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 1000}, efficiency=DeviceEfficiency(attention=curve))
    >>> kernel = dict(flops=1e12, bytes_moved=0, calls=1, keys_per_query=4096, head_dim=128)
    >>> round(fused_attention_s(gpu, "bf16", **kernel, backward=False) * 1e3, 3)  # 2 ms + 20 us
    2.02
    >>> round(fused_attention_s(gpu, "bf16", **kernel, backward=True) * 1e3, 3)  # 2.5 ms + 100 us
    2.6
    """
    curve = device.efficiency.attention
    fraction = fused_attention_fraction(device, keys_per_query=keys_per_query, head_dim=head_dim)
    fixed_s = 0.0
    if curve is not None and fraction is not None:
        fraction *= curve.backward_fraction if backward else 1.0
        fixed_s = (curve.backward_call_us if backward else curve.forward_call_us) * 1e-6
    return compute_time_s(device, precision, flops=flops, bytes_moved=bytes_moved, calls=calls,
                          fraction=fraction) + fixed_s


def compute_lower_bound_s(device: DeviceSpec, precision: Precision, *, flops: float) -> float:
    """No sharding runs ``flops`` faster than the GEMM curve's ceiling allows (its fraction of
    peak only approaches ``max_fraction`` as GEMMs grow): a bound, not a price (FP8 GEMMs'
    FLOPs counted as :func:`executed_training_flops` counts them with ``fp8_speedup``)."""
    return flops / (device.peak_flops_per_s(precision) * device.efficiency.gemm.max_fraction)


def compute_time_s(
    device: DeviceSpec,
    precision: Precision,
    *,
    flops: float,
    bytes_moved: float,
    calls: int = 1,
    fraction: float | None = None,
    speedup: float = 1.0,
) -> float:
    """Roofline time of ``calls`` kernels doing ``flops`` and moving ``bytes_moved`` in all,
    at the GEMM curve's fraction of peak for their size unless ``fraction`` is given, the math
    ``speedup`` times faster (FP8 operands: :func:`fp8_speedup`). On the GEMM curve a call
    takes ``(f + half) / (peak x max)``: its half-saturation is a fixed cost a call (on a
    curve fitted to whole runs, time the stack loses beside the kernel), which FP8 does not
    speed up, so ``(f / speedup + half) / (peak x max)``.

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
        if fraction is None:
            fraction = gemm_fraction(eff.gemm, flops / calls / speedup)
        math_s = flops / (device.peak_flops_per_s(precision) * fraction * speedup)
    return max(math_s, memory_s) + calls * eff.kernel_launch_us * 1e-6


def device_fp8_speedup(device: DeviceSpec) -> float:
    """How many times faster ``device`` runs a GEMM on FP8 operands than on 16-bit ones
    (``efficiency.fp8``); 1 where it was not measured."""
    curve = device.efficiency.fp8
    return 1.0 if curve is None else curve.gemm_speedup


def fp8_speedup(device: DeviceSpec, op: Op) -> float:
    """How many times faster ``op``'s GEMMs run than in 16 bits: the device's FP8 GEMM speedup
    for an FP8 linear (:mod:`planner.graph.fp8`), else 1. An FP8 stack is refused on a device
    without one (:func:`planner.spec.reading.check_device`).

    >>> from planner.spec import DeviceEfficiency, DeviceSpec, Fp8Efficiency
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
    ...                  peak_tflops={"bf16": 300},
    ...                  efficiency=DeviceEfficiency(fp8=Fp8Efficiency(gemm_speedup=1.8)))
    >>> op = Op(name="fc", kind="linear", layer=1, layer_kind="dense",
    ...         inputs=(Tensor((("seq", 8),), 2.0),), output=Tensor((("ffn", 8),), 2.0), fp8=True)
    >>> fp8_speedup(gpu, op)
    1.8
    """
    return device_fp8_speedup(device) if op.fp8 else 1.0


def sharded_bytes(tensor: Tensor, degrees: Mapping[str, int]) -> float:
    """Bytes of one device's shard of ``tensor`` when dim ``d`` is split ``degrees[d]`` ways."""
    numel = 1
    for name, size in tensor.dims:
        numel *= -(-size // degrees.get(name, 1))
    return numel * tensor.element_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class OpTime:
    """Seconds of one op on one device for one microbatch, by pass."""

    forward_s: float
    """Forward pass: the roofline of its FLOPs and bytes, plus kernel launches."""
    backward_s: float
    """Backward pass, input and weight gradients: twice the forward's FLOPs (2.5 times under
    flash attention) and twice its bytes."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradient (a GEMM with a weight: one of its backward's two
    GEMMs, of the forward's FLOPs and half the backward's bytes; 0 for the attention core and
    elementwise ops, which have no weight)."""
    stack_forward_s: float = 0.0
    """Of ``forward_s``, the stack's separate memory-bound kernels (:class:`Unfused`): what
    reruns of an op whose own kernel's output a checkpoint saved (the rotary embedding
    beside the attention core)."""


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
    grouped_experts: bool = False,
) -> OpTime:
    """Forward and backward compute seconds of ``op`` under a sharding.

    Strategies that divide the FLOPs by the same degree cost the same, whichever dims they
    split: the GEMM efficiency depends only on the FLOPs per call. The routed experts' GEMMs
    are ``gemm_calls`` GEMMs in turn, one per local expert, unless ``grouped_experts``: one
    grouped kernel over them (:func:`grouped_gemm_fraction`), whose efficiency depends on each
    expert's tokens.
    """
    def stack_kernels() -> tuple[float, float, float]:
        assert op.unfused is not None
        # A tied head still casts the shared weight (it owns no parameters of its own).
        params = (sharded_bytes(op.weight, weight_degrees) / op.weight.element_bytes
                  if op.weight is not None else 0.0)  # fmt: skip
        return unfused_time_s(op.unfused, device, activation_degrees=activation_degrees,
                              local_params=params)  # fmt: skip

    if op.unfused is not None and op.kind in UNFUSED_IS_THE_OP:
        forward, backward, _ = stack_kernels()
        return OpTime(forward_s=forward, backward_s=backward, stack_forward_s=forward)
    own = _own_kernels_time(op, device, precision, activation_degrees=activation_degrees,
                            weight_degrees=weight_degrees, compute_degree=compute_degree,
                            gemm_calls=gemm_calls, flash_attention=flash_attention,
                            grouped_experts=grouped_experts)  # fmt: skip
    if op.unfused is None:
        return own
    forward, backward, weight = stack_kernels()
    return OpTime(forward_s=own.forward_s + forward, backward_s=own.backward_s + backward,
                  weight_s=own.weight_s + weight, stack_forward_s=forward)  # fmt: skip

UNFUSED_IS_THE_OP = frozenset({"norm", "residual", "elementwise", "loss"})
"""Op kinds whose stack's separate kernels (:class:`~planner.graph.ops.Unfused`) replace the
one fused kernel they are otherwise priced as; beside the others (GEMMs, the attention core)
they run in addition."""


def unfused_time_s(
    work: Unfused, device: DeviceSpec, *, activation_degrees: Mapping[str, int],
    local_params: float,
) -> tuple[float, float, float]:  # fmt: skip
    """Seconds of a stack's separate memory-bound kernels for one op: forward, backward, and
    of the backward the weight gradient's part (its cast and accumulation), each at the
    device's memory-bound rate with a launch per kernel.

    >>> from planner.spec import DeviceSpec
    >>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=1000,
    ...                  peak_tflops={"bf16": 300})
    >>> work = Unfused(forward=(Tensor((("seq", 10**9),), 2.0),), forward_kernels=2,
    ...                weight_backward_bytes=18.0, backward_kernels=1)
    >>> [round(t * 1e3, 3) for t in unfused_time_s(work, gpu, activation_degrees={},
    ...                                             local_params=1e8)]
    [2.0, 1.8, 1.8]
    """
    rate = device.memory_bandwidth_bytes_s * device.efficiency.memory_bound_fraction
    launch_s = device.efficiency.kernel_launch_us * 1e-6

    def traffic(tensors: tuple[Tensor, ...]) -> float:
        return sum(sharded_bytes(t, activation_degrees) for t in tensors)

    weight_s = local_params * work.weight_backward_bytes / rate
    forward = ((traffic(work.forward) + local_params * work.weight_forward_bytes) / rate
               + work.forward_kernels * launch_s)  # fmt: skip
    backward = traffic(work.backward) / rate + weight_s + work.backward_kernels * launch_s
    return forward, backward, weight_s


def _own_kernels_time(
    op: Op, device: DeviceSpec, precision: Precision, *, activation_degrees: Mapping[str, int],
    weight_degrees: Mapping[str, int], compute_degree: int, gemm_calls: int,
    flash_attention: bool, grouped_experts: bool,
) -> OpTime:  # fmt: skip
    """``op``'s own kernel (or kernels) as :func:`op_time` prices them, the stack's separate
    ones apart."""
    moved = sum(sharded_bytes(t, activation_degrees) for t in (*op.inputs, op.output))
    if op.kind == "embedding":
        # A lookup reads the rows it writes; what walks the whole table is its gradient
        # (the op's :func:`planner.graph.unfused.embedding`).
        moved += sharded_bytes(op.output, activation_degrees)
    elif op.weight is not None:
        moved += sharded_bytes(op.weight, weight_degrees)
    executed = executed_flops(op, flash_attention=flash_attention, devices=compute_degree)
    if op.kind == "attention" and not flash_attention:
        # Unfused: the scores are written, then read by softmax, dropout and the matmul.
        moved += 3 * sum(sharded_bytes(t, activation_degrees) for t in op.score_tensors)
    fraction, call_s = None, 0.0
    if op.kind == "expert_linear" and grouped_experts:
        tokens = -(-op.inputs[0].size("capacity") // activation_degrees.get("capacity", 1))
        name, size = op.weight.dims[-2] if op.weight is not None else ("", 1)
        fraction = grouped_gemm_fraction(device, flops=executed.forward, tokens_per_expert=tokens,
                                         reduction=-(-size // weight_degrees.get(name, 1)))
        gemm_calls = 1
        curve = device.efficiency.grouped_gemm
        call_s = curve.call_us * 1e-6 if curve is not None else 0.0
    if op.kind == "attention" and flash_attention:
        # A ring step (context parallelism) attends to one block of keys per kernel call.
        span = op.key_span or op.inputs[1].size("seq")
        keys = span / activation_degrees.get("seq", 1) * CAUSAL_FRACTION
        passes = [fused_attention_s(device, precision, flops=flops, bytes_moved=factor * moved,
                                    calls=factor * gemm_calls, keys_per_query=keys,
                                    head_dim=op.head_dim, backward=factor == 2)
                  for flops, factor in ((executed.forward, 1), (executed.backward, 2))]
        return OpTime(forward_s=passes[0], backward_s=passes[1])
    speedup = fp8_speedup(device, op)
    # A grouped kernel's fixed cost per call: the forward's one, the backward's two (the
    # input's and the weight's gradients).
    forward = compute_time_s(device, precision, flops=executed.forward, bytes_moved=moved,
                             calls=gemm_calls, fraction=fraction, speedup=speedup) + call_s
    backward = compute_time_s(
        device, precision, flops=executed.backward,
        bytes_moved=ELEMENTWISE_BACKWARD_FACTOR * moved, calls=2 * gemm_calls, fraction=fraction,
        speedup=speedup,
    ) + 2 * call_s  # fmt: skip
    weight = 0.0
    if op.is_gemm and op.weight is not None:
        # dW = X^T dY: one GEMM of the forward's size, priced by the same roofline.
        weight = min(backward, compute_time_s(
            device, precision, flops=executed.backward - executed.forward,
            bytes_moved=ELEMENTWISE_BACKWARD_FACTOR * moved / 2, calls=gemm_calls,
            fraction=fraction, speedup=speedup) + call_s)  # fmt: skip
    return OpTime(forward_s=forward, backward_s=backward, weight_s=weight)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedFlops:
    """The FLOPs one device runs for its share of one op, by pass."""

    forward: float
    """Forward FLOPs as the kernels run them: a fused causal attention computes only the
    lower triangle of the scores."""
    backward: float
    """Backward FLOPs: twice the forward's for matmuls, 2.5 times under fused attention
    (which recomputes the scores it did not keep)."""


def executed_flops(op: Op, *, flash_attention: bool, devices: int = 1) -> ExecutedFlops:
    """What a GPU runs for its share of ``op`` split over ``devices``, as :func:`op_time`
    times it: model FLOPs (``op.flops``, full ``s x s`` scores, the MFU convention) except
    that fused causal attention skips the masked half, and its backward recomputes the scores.
    Hardware FLOP/s are these over the step's time, so they never exceed the device's peak.

    >>> from planner.graph.ops import Op, Tensor
    >>> x = Tensor((("seq", 8),), 2.0)
    >>> core = Op(name="core", kind="attention", layer=1, layer_kind="dense", inputs=(x,),
    ...           output=x, flops=100.0)
    >>> executed_flops(core, flash_attention=True), executed_flops(core, flash_attention=False)
    (ExecutedFlops(forward=50.0, backward=125.0), ExecutedFlops(forward=100.0, backward=200.0))
    """
    flops = op.flops / devices
    backward_factor = MATMUL_BACKWARD_FACTOR if op.is_gemm else ELEMENTWISE_BACKWARD_FACTOR
    if op.kind == "attention" and flash_attention:
        flops *= CAUSAL_FRACTION
        backward_factor = FLASH_BACKWARD_FACTOR
    return ExecutedFlops(forward=flops, backward=backward_factor * flops)


# --------------------------------------------------------------------------- communication


@lru_cache(maxsize=256)
def executed_training_flops(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int, *, flash_attention: bool,
    fp8_speedup: float = 1.0,
) -> float:  # fmt: skip
    """FLOPs the GPUs run for one microbatch's forward and backward through the whole model
    (:func:`executed_flops` of every op), recomputation aside; remembered (every estimate
    asks, and the walk over the graph is most of a small estimate's time). With
    ``fp8_speedup`` an FP8 op's FLOPs count over it: what 16-bit GEMMs would do in the time
    (for a compute bound)."""
    index = lowered(model, training, micro_batch_size)[1]
    total = 0.0
    for ops in index.ops_by_layer.values():
        for op in ops:
            executed = executed_flops(op, flash_attention=flash_attention)
            total += (executed.forward + executed.backward) / (fp8_speedup if op.fp8 else 1.0)
    return total
