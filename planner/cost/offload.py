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

The CPU's Adam is memory-bound as the device's is (:func:`~planner.cost.memory.adam_traffic_bytes`,
the same bytes per parameter), at the node's host memory bandwidth shared by its devices, which
all step at once.
"""

from __future__ import annotations

from planner.cost.data_parallel import optimizer_step_s
from planner.cost.memory import ADAM_STATE, adam_traffic_bytes
from planner.spec import ClusterSpec
from planner.vocabulary import Offload, Precision


def offloaded_optimizer_step_s(cluster: ClusterSpec, precision: Precision, *,
                               params: float) -> float:  # fmt: skip
    """Seconds of the optimizer step of one device's ``params`` parameters offloaded: the
    slowest of the gradients' copy to the host, the CPU's Adam and the weights' copy back (a
    pipeline over the parameters, Megatron-LM's ``--overlap-cpu-optimizer-d2h-h2d``).

    Raises :class:`~planner.errors.InputError` when the cluster has no host figures.
    """
    host = cluster.host_for("optimizer offload")
    state = ADAM_STATE[precision]
    to_host_s = params * state.gradients / host.link_bytes_s
    host_bandwidth = host.memory_bandwidth_bytes_s / cluster.devices_per_node
    cpu_adam_s = params * adam_traffic_bytes(precision) / host_bandwidth
    to_device_s = params * state.weights / host.link_bytes_s
    return max(to_host_s, cpu_adam_s, to_device_s)


def optimizer_time_s(cluster: ClusterSpec, precision: Precision, *, params: float,
                     offload: Offload) -> float:  # fmt: skip
    """Seconds of the optimizer step of one device's ``params`` parameters: on the device
    (:func:`~planner.cost.data_parallel.optimizer_step_s`) or offloaded
    (:func:`offloaded_optimizer_step_s`)."""
    if offload == "optimizer":
        return offloaded_optimizer_step_s(cluster, precision, params=params)
    return optimizer_step_s(cluster.device, precision, params=params)


def host_state_bytes(precision: Precision, *, params: float, offload: Offload) -> float:
    """Host bytes one device's offloaded optimizer takes: the optimizer states with their fp32
    master weights, and the copy of the gradients the CPU steps on (0 without offload)."""
    if offload != "optimizer":
        return 0.0
    state = ADAM_STATE[precision]
    return params * (state.optimizer + state.gradients)
