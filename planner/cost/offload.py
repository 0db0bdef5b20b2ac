"""Offload: the optimizer kept in host memory, its Adam step run on the CPU.

With the optimizer offloaded, a device keeps its weights, gradients and activations; the host
keeps the optimizer states (Adam's m and v and the fp32 master weights) and a copy of the
gradients. After the backward, each device copies its gradients to the host over its host link,
the CPU runs Adam on them, and the updated weights come back over the same link. Megatron-LM's
``HybridDeviceOptimizer`` (``--optimizer-cpu-offload`` with
``--overlap-cpu-optimizer-d2h-h2d``) gives every parameter its own CPU optimizer, copies the
gradients on one stream and each updated parameter back on another as soon as its CPU step is
done (NVIDIA/Megatron-LM@d98e8a64ddf3
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:117-125, 150-175, 203-221): the three
run as a pipeline over the parameters, and the step takes the slowest of them. Nothing of it
overlaps the backward (``step`` starts after it), so it is all exposed.

DeepSpeed's ZeRO-Offload (``offload: zero-offload``) moves the gradients earlier: as the
backward reduces each gradient bucket, the ZeRO-1/2 optimizer casts the device's share to fp32
and copies it into a pinned host buffer, on the reduction stream with ``overlap_comm`` and on
the compute stream without it (deepspeedai/DeepSpeed@edaa722
deepspeed/runtime/zero/stage_1_and_2.py:1719-1762, 1590-1605, 1650-1665). That copy therefore
rides with the gradient reduction (:func:`gradient_copy_sync`): hidden behind the last backward
with ``overlap_grad_reduce``, exposed after it without. ``step`` then, one parameter group at a
time, unscales the fp32 gradients in place, runs the CPU's Adam, converts the fp32 master
weights into a pinned buffer of the compute precision and copies it to the device
(stage_1_and_2.py:2320-2343, 2434-2449): the CPU's passes and the copy back are exposed
(:func:`zero_offload_step_s`; a group's copy back overlaps only the next group's CPU step,
and Megatron-DeepSpeed puts the small group, the norms and biases, last:
deepspeedai/Megatron-DeepSpeed@4efb479 megatron/optimizer/__init__.py:56-64).

The CPU's Adam is memory-bound as the device's is (:func:`~planner.cost.memory.adam_traffic_bytes`,
the same bytes per parameter, and ZeRO-Offload's unscaling and conversion passes beside it:
:func:`zero_offload_cpu_bytes`), at the node's host memory bandwidth shared by its devices,
which all step at once.
"""

from __future__ import annotations

from planner.cost.data_parallel import NO_SYNC, DataParallelSync, optimizer_step_s
from planner.cost.memory import ADAM_STATE, adam_traffic_bytes
from planner.spec import ClusterSpec
from planner.vocabulary import Offload, StatesPrecision

FP32_BYTES = 4
"""Bytes of an fp32 number: ZeRO-Offload's master weights, Adam moments and host gradients."""


def _cpu_pass_s(cluster: ClusterSpec, *, params: float, bytes_per_param: float) -> float:
    """Seconds of a memory-bound CPU pass over ``params`` parameters moving ``bytes_per_param``
    each, at the node's host memory bandwidth shared by its devices (they all step at once)."""
    host = cluster.host_for("optimizer offload")
    host_bandwidth = host.memory_bandwidth_bytes_s / cluster.devices_per_node
    return params * bytes_per_param / host_bandwidth


def offloaded_optimizer_step_s(cluster: ClusterSpec, precision: StatesPrecision, *,
                               params: float) -> float:  # fmt: skip
    """Seconds of the optimizer step of one device's ``params`` parameters offloaded: the
    slowest of the gradients' copy to the host, the CPU's Adam and the weights' copy back (a
    pipeline over the parameters, Megatron-LM's ``--overlap-cpu-optimizer-d2h-h2d``).

    Raises :class:`~planner.errors.InputError` when the cluster has no host figures.
    """
    host = cluster.host_for("optimizer offload")
    state = ADAM_STATE[precision]
    to_host_s = params * state.gradients / host.link_bytes_s
    cpu_adam_s = _cpu_pass_s(cluster, params=params, bytes_per_param=adam_traffic_bytes(precision))
    to_device_s = params * state.weights / host.link_bytes_s
    return max(to_host_s, cpu_adam_s, to_device_s)


def zero_offload_cpu_bytes(precision: StatesPrecision) -> float:
    """Host memory bytes per parameter ZeRO-Offload's ``step`` moves on the CPU: Adam's
    (:func:`~planner.cost.memory.adam_traffic_bytes`), the in-place unscaling of the fp32
    gradients before it (read and write), and the master weights read again for their
    conversion to the compute precision after it (that write is Adam's weight write)."""
    return adam_traffic_bytes(precision) + 2 * FP32_BYTES + FP32_BYTES


def zero_offload_step_s(cluster: ClusterSpec, precision: StatesPrecision, *,
                        params: float) -> float:  # fmt: skip
    """Seconds of ZeRO-Offload's ``step`` for one device's ``params`` parameters: the CPU's
    passes (:func:`zero_offload_cpu_bytes`), then the compute-precision weights copied back to
    the device, one after the other (the gradients came down during the backward:
    :func:`gradient_copy_sync`).

    Raises :class:`~planner.errors.InputError` when the cluster has no host figures.
    """
    host = cluster.host_for("optimizer offload")
    cpu_s = _cpu_pass_s(cluster, params=params, bytes_per_param=zero_offload_cpu_bytes(precision))
    return cpu_s + params * ADAM_STATE[precision].weights / host.link_bytes_s


def gradient_copy_sync(cluster: ClusterSpec, precision: StatesPrecision, *, params: float,
                       zero: int, offload: Offload, accumulating: bool,
                       ) -> DataParallelSync:  # fmt: skip
    """ZeRO-Offload's copies of one device's ``params`` gradients between device and host,
    which ride with the gradient reduction (hidden behind the backward as it is, exposed after
    it without ``overlap_grad_reduce``); nothing for the other offloads.

    The step's last reduction copies the fp32 gradients down (``copy_grads_in_partition``).
    Over several microbatches (``accumulating``) each reduction first adds the gradients kept
    on the host to the device's, bringing them up, and sends the sum back down, both in the
    compute precision (``async_accumulate_grad_in_cpu_via_gpu``: stage_1_and_2.py:1516-1560,
    1650-1665): ZeRO-2 reduces every microbatch's backward, ZeRO-1 only the last
    (stage_1_and_2.py:1767-1769). The first microbatch has nothing to bring up: for ZeRO-2
    that copy is taken off the step's once-per-step part, the total being exact.

    Raises :class:`~planner.errors.InputError` when ZeRO-Offload's cluster has no host figures.
    """
    if offload != "zero-offload":
        return NO_SYNC
    link = cluster.host_for("optimizer offload").link_bytes_s
    weights = ADAM_STATE[precision].weights
    once, per_microbatch = float(FP32_BYTES), 0.0
    if accumulating and zero >= 2:
        once, per_microbatch = FP32_BYTES - weights, 2.0 * weights
    elif accumulating:
        once = FP32_BYTES + 2.0 * weights
    return DataParallelSync(reduce_once_s=params * once / link, gather_once_s=0.0,
                            reduce_per_microbatch_s=params * per_microbatch / link,
                            gather_per_microbatch_s=0.0)  # fmt: skip


def optimizer_time_s(cluster: ClusterSpec, precision: StatesPrecision, *, params: float,
                     offload: Offload) -> float:  # fmt: skip
    """Seconds of the optimizer step of one device's ``params`` parameters: on the device
    (:func:`~planner.cost.data_parallel.optimizer_step_s`) or offloaded
    (:func:`offloaded_optimizer_step_s`, Megatron-LM's; :func:`zero_offload_step_s`,
    DeepSpeed's)."""
    if offload == "optimizer":
        return offloaded_optimizer_step_s(cluster, precision, params=params)
    if offload == "zero-offload":
        return zero_offload_step_s(cluster, precision, params=params)
    return optimizer_step_s(cluster.device, precision, params=params)


def host_state_bytes(precision: StatesPrecision, *, params: float, offload: Offload,
                     accumulating: bool = False) -> float:  # fmt: skip
    """Host bytes one device's offloaded optimizer takes: the optimizer states with their fp32
    master weights, and the copy of the gradients the CPU steps on (0 without offload).
    ZeRO-Offload's are all fp32 (master weights, Adam's two moments, the gradients), with the
    pinned buffer of compute-precision weights it copies back from (stage_1_and_2.py:489-508,
    838-844) and, over several microbatches (``accumulating``), the compute-precision
    gradients it accumulates on the host, kept from step to step (stage_1_and_2.py:1525-1528,
    1555-1556)."""
    state = ADAM_STATE[precision]
    if offload == "optimizer":
        return params * (state.optimizer + state.gradients)
    if offload == "zero-offload":
        return params * (4 * FP32_BYTES + state.weights * (2 if accumulating else 1))
    return 0.0
