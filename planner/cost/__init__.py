"""THE cost model: every planner in the repository prices plans with these functions.

- Compute: a roofline per operator, ``max(flops / (peak * f_gemm), bytes / (hbm * f_mem))``
  plus a launch cost per kernel, with the calibrated fractions of the cluster file.
- Communication: alpha-beta per collective with ring bus-bandwidth factors (all-reduce
  ``2(n-1)/n``, all-gather and reduce-scatter ``(n-1)/n``); a group that spans several network
  levels is one ring as NCCL channels it, its levels moving their shares at once over as many
  links as the group has ranks in a node (:func:`collective_time_s`).
- Memory: mixed-precision Adam state per parameter as Megatron-LM's distributed optimizer
  documentation tabulates it, divided by the ZeRO stage; activations per Korthikanti et al.
- Pipeline: step time ``m * max(t) + (sum(t) - max(t)) / v`` for ``m`` microbatches and ``v``
  virtual stages (:func:`fill_and_drain`, for the step composer and the stage dynamic program
  alike), which is ``sum_i t_i + (m - 1) max_i t_i`` (Alpa, Eq. 2) for ``v = 1``; the bubble
  is reported as its share of the step (:func:`bubble_share`), ``(p - 1) / (v m + p - 1)``
  for equal stages (Narayanan et al., SC'21, give ``(p - 1) / (v m)`` of the busy time); each
  schedule's warm-up forwards, from which the microbatches a stage holds follow.

Units: seconds, bytes, FLOPs, bytes/second. No hardware number lives here: they all come from
the :class:`~planner.spec.ClusterSpec`.
"""

from __future__ import annotations

from planner.cost.activations import (
    held_in_flight,
    in_flight_microbatches,
    keeps_inputs,
    kept_fraction,
    saved_activation_bytes,
)
from planner.cost.communication import (
    GRADIENT_WIDENING,
    CommGroup,
    allgather_attention_exposed_s,
    allgather_attention_hidden_s,
    collective_time_s,
    exposed_s,
    hidden_state_bytes,
    members_per_level,
    p2p_time_s,
    pipeline_send_s,
    ring_attention_exposed_s,
    ring_attention_hidden_s,
)
from planner.cost.compute import (
    CAUSAL_FRACTION,
    ELEMENTWISE_BACKWARD_FACTOR,
    FLASH_BACKWARD_FACTOR,
    MATMUL_BACKWARD_FACTOR,
    ExecutedFlops,
    OpTime,
    attention_fraction,
    compute_lower_bound_s,
    compute_time_s,
    device_fp8_speedup,
    executed_flops,
    executed_training_flops,
    fused_attention_fraction,
    fused_attention_s,
    gemm_fraction,
    op_time,
    sharded_bytes,
)
from planner.cost.data_parallel import (
    NO_SYNC,
    DataParallelSync,
    ExposedSync,
    GradientAccumulation,
    data_parallel_sync,
    exposed_sync,
    gradient_accumulation,
    optimizer_step_s,
)
from planner.cost.deepep import (
    DEEPEP_GROUP_SIZES,
    Routing,
    deepep_buffer_bytes,
    deepep_contention,
    deepep_group_refusal,
    deepep_time_s,
    domains_hit,
)
from planner.cost.expert_load import busiest_rank_load
from planner.cost.memory import (
    DEFAULT_MEMORY_MARGIN,
    MEMORY_MARGIN,
    Communicators,
    MemoryParts,
    StateBytes,
    allocatable_bytes,
    allocator_slack_bytes,
    fits,
    gathered_bytes_per_param,
    gradient_bytes_on_wire,
    memory_margin_bytes,
    reserve_bytes,
    state_bytes_per_param,
    states_precision,
    usable_bytes,
)
from planner.cost.pipeline import (
    PipelineTime,
    bubble_fraction,
    bubble_share,
    fill_and_drain,
    paired_fraction,
    pipeline_time,
    warmup_forwards,
    zero_bubble_bubble,
)

__all__ = [
    "CAUSAL_FRACTION",
    "DEEPEP_GROUP_SIZES",
    "DEFAULT_MEMORY_MARGIN",
    "ELEMENTWISE_BACKWARD_FACTOR",
    "FLASH_BACKWARD_FACTOR",
    "GRADIENT_WIDENING",
    "MATMUL_BACKWARD_FACTOR",
    "MEMORY_MARGIN",
    "NO_SYNC",
    "CommGroup",
    "Communicators",
    "DataParallelSync",
    "ExecutedFlops",
    "ExposedSync",
    "GradientAccumulation",
    "MemoryParts",
    "OpTime",
    "PipelineTime",
    "Routing",
    "StateBytes",
    "allgather_attention_exposed_s",
    "allgather_attention_hidden_s",
    "allocatable_bytes",
    "allocator_slack_bytes",
    "attention_fraction",
    "bubble_fraction",
    "bubble_share",
    "busiest_rank_load",
    "collective_time_s",
    "compute_lower_bound_s",
    "compute_time_s",
    "data_parallel_sync",
    "deepep_buffer_bytes",
    "deepep_contention",
    "deepep_group_refusal",
    "deepep_time_s",
    "device_fp8_speedup",
    "domains_hit",
    "executed_flops",
    "executed_training_flops",
    "exposed_s",
    "exposed_sync",
    "fill_and_drain",
    "fits",
    "fused_attention_fraction",
    "fused_attention_s",
    "gathered_bytes_per_param",
    "gemm_fraction",
    "gradient_accumulation",
    "gradient_bytes_on_wire",
    "held_in_flight",
    "hidden_state_bytes",
    "in_flight_microbatches",
    "keeps_inputs",
    "kept_fraction",
    "members_per_level",
    "memory_margin_bytes",
    "op_time",
    "optimizer_step_s",
    "p2p_time_s",
    "paired_fraction",
    "pipeline_send_s",
    "pipeline_time",
    "reserve_bytes",
    "ring_attention_exposed_s",
    "ring_attention_hidden_s",
    "saved_activation_bytes",
    "sharded_bytes",
    "state_bytes_per_param",
    "states_precision",
    "usable_bytes",
    "warmup_forwards",
    "zero_bubble_bubble",
]
