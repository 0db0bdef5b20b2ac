"""Memory: the margin a plan leaves free, the reserve beside what is allocated, and
mixed-precision Adam states per parameter under each ZeRO stage (what activations take is
:mod:`planner.cost.activations`)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

from planner.cost.elementwise import Real
from planner.errors import ConfigError, InputError
from planner.graph.fp8 import FP8_BYTES
from planner.spec import DeviceSpec
from planner.vocabulary import FP8_STACKS, OptimizerMoments, Precision, Stack, StatesPrecision

DEFAULT_MEMORY_MARGIN = 0.05
"""Share of a device's memory a plan leaves free, beyond its priced peak and reserve
(:func:`reserve_bytes`), on a stack whose peak no device has measured: a guess, not an error
the memory model was measured to make (see docs/memory.md)."""

MEMORY_MARGIN: dict[Stack, float] = {"megatron-te": DEFAULT_MEMORY_MARGIN,
                                     "megatron-te-fp8": DEFAULT_MEMORY_MARGIN,
                                     "hf-eager": 0.02, "hf-compiled": 0.02,
                                     "composer-fsdp": DEFAULT_MEMORY_MARGIN,
                                     "megatron-deepspeed": 0.23,
                                     "torchtitan-eager": DEFAULT_MEMORY_MARGIN,
                                     "torchtitan-compiled": DEFAULT_MEMORY_MARGIN,
                                     "colossalai-hf": DEFAULT_MEMORY_MARGIN,
                                     "megatron-te-fused-loss": DEFAULT_MEMORY_MARGIN,
                                     "megatron-te-fp8-fused-loss": DEFAULT_MEMORY_MARGIN}
"""Share of a device's memory a plan leaves free unless told otherwise, by the stack that runs
it: the memory model's own measured error on that stack where a device measured its peak.

- ``hf-eager`` and ``hf-compiled``: the largest error of the predicted reserved peak on the
  shared one-GPU H100 steps (``../shared/validation/h100/runs_one_gpu.json``), 1.1 % on the four
  eager steps and 1.3 % on the compiled one, rounded up to a whole percent. In-sample: the
  allocator's fragmentation was fitted on the same steps, whose reserved-over-allocated spread
  (6.6-9.2 %) is most of that error.
- ``megatron-deepspeed``: BLOOM's 22 runs of 2022 whose records give the memory nvidia-smi
  showed on their first node (``../shared/validation/deepspeed_runs.json``, ``memory_gb``)
  are under-predicted by 17 % at the median and 22.9 % at most, so 23 %: a plan's whole peak
  then covers what those runs held. What is missing is known but not priced: CUDA 11's context
  without lazy loading (1.6 GiB measured by BigScience on an A100), BLOOM's embedding layer
  norm on the first stage, and the optimizer's transients after the backward (BF16_Optimizer's
  bf16 copy of the fp32 gradients for the all-reduce, 2 bytes a parameter) where the caching
  allocator cannot carve them from the activations' freed blocks.
- ``megatron-te`` and ``composer-fsdp``: no published run of either measured its peak (they
  say only that they ran), so :data:`DEFAULT_MEMORY_MARGIN`.

``tests/test_memory_margin.py`` re-prices the measured runs and holds each stack's margin
at or above its largest error."""


def memory_margin_bytes(
    memory_gib: float, margin_gib: float | None = None, stack: Stack = "megatron-te"
) -> float:
    """The memory a plan leaves free on a device of ``memory_gib``: ``margin_gib``, or the
    ``stack``'s :data:`MEMORY_MARGIN` of the device when None.

    >>> memory_margin_bytes(80) / 2**30, memory_margin_bytes(80, 1.5) / 2**30
    (4.0, 1.5)
    >>> round(memory_margin_bytes(80, stack="hf-eager") / 2**30, 2)
    1.6

    A negative margin would let a peak past the device's memory fit:

    >>> memory_margin_bytes(80, -1000)
    Traceback (most recent call last):
    planner.errors.InputError: memory margin -1000 GiB: a margin is at least 0 GiB
    """
    if margin_gib is None:
        return MEMORY_MARGIN[stack] * memory_gib * 2**30
    if not isinstance(margin_gib, numbers.Real) or not margin_gib >= 0:  # NaN and strings too
        raise InputError(f"memory margin {margin_gib!r} GiB: a margin is at least 0 GiB")
    return margin_gib * 2**30


def usable_bytes(
    device: DeviceSpec, margin_gib: float | None = None, stack: Stack = "megatron-te"
) -> float:
    """What a plan may fill on ``device``: its memory less the margin
    (:func:`memory_margin_bytes`), the device's reserved memory included."""
    return device.memory_bytes - memory_margin_bytes(device.memory_gib, margin_gib, stack)


def fits(
    peak_bytes: Real, device: DeviceSpec, margin_gib: float | None = None,
    stack: Stack = "megatron-te",
) -> Real:
    """Whether a peak of ``peak_bytes`` per device (a float, or an array over
    configurations) leaves the margin free on ``device``: what every command calls fitting.

    >>> from planner.spec import DeviceSpec
    >>> h100 = DeviceSpec(name="H100", memory_gib=80, peak_tflops={"bf16": 989},
    ...                   memory_bandwidth_gb_s=3350)
    >>> fits(75 * 2**30, h100), fits(77 * 2**30, h100), fits(77 * 2**30, h100, margin_gib=2)
    (True, False, True)
    >>> fits(77 * 2**30, h100, stack="hf-eager")
    True
    """
    margin = memory_margin_bytes(device.memory_gib, margin_gib, stack)
    return peak_bytes + margin <= device.memory_bytes


NCCL_PAIR_BYTES = 544e6
"""Device memory one NCCL communicator of two ranks takes once connected, measured on A100
(NVIDIA/nccl#964); its buffers are NCCL_BUFFSIZE-sized per channel and protocol (Simple 4 MiB,
LL 512 KiB, LL128 ~4.7 MiB: ``src/include/comm.h``), so about the same on H100."""
NCCL_GROUP_BYTES = 688e6
"""The same for a communicator of more than two ranks (NVIDIA/nccl#964)."""
NCCL_ALL_TO_ALL_PEER_BYTES = 3.3e9 / 7
"""An all-to-all connects every peer inside the scale-up domain: 3.3 GB more for an 8-rank
all-to-all on 8 H100 (NVIDIA/nccl#1685; P2P/CUMEM, 32 channels a pair), per peer."""
NCCL_NET_P2P_POOL_BYTES = 2 * 32 * 16 * 2**17
"""What an all-to-all's peers beyond the scale-up domain take together: NCCL's network
transport gives point-to-point connections one pool shared by every peer
(``NCCL_NET_SHARED_BUFFERS``, on by default: ``sharedNetBuffersInit`` in
``src/transport/net.cc`` of NVIDIA/nccl, ``nChannels x NCCL_SHARED_STEPS x p2pChunkSize``),
not buffers per peer: 32 channels, 16 steps and ``NCCL_P2P_NET_CHUNKSIZE``'s 128 kB, each
way. Read from the source, not measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Communicators:
    """The NCCL communicators one device's plan connects, by what they run."""

    groups: tuple[int, ...] = ()
    """Sizes of the collective groups (tensor, context, data parallel, ...)."""
    all_to_all: tuple[tuple[int, int], ...] = ()
    """The all-to-all groups (expert parallelism, Ulysses): each one's ranks, and how many of
    them share a scale-up domain with the device (itself included)."""
    pairs: int = 0
    """Point-to-point neighbours' communicators (pipeline stages, tied embeddings)."""
    deepep_bytes: float = 0.0
    """DeepEP's own buffers, where it exchanges the experts' tokens in place of an all-to-all
    (:func:`planner.cost.deepep.deepep_buffer_bytes`)."""

    @property
    def bytes(self) -> float:
        """Their buffers (:data:`NCCL_GROUP_BYTES` and its neighbours), a group of one rank
        none; an all-to-all's peers in the scale-up domain each
        :data:`NCCL_ALL_TO_ALL_PEER_BYTES`, those beyond it :data:`NCCL_NET_P2P_POOL_BYTES`
        together.

        >>> round(Communicators(groups=(8, 2, 1), all_to_all=((8, 8),), pairs=1).bytes / 1e9, 2)
        5.08
        >>> [round(Communicators(all_to_all=((64, n),)).bytes / 1e9, 2) for n in (64, 8)]
        [29.7, 3.43]
        """
        groups = sum(NCCL_PAIR_BYTES if n == 2 else NCCL_GROUP_BYTES for n in self.groups if n > 1)
        peers = sum(min(n, inside) - 1 for n, inside in self.all_to_all if n > 1)
        pools = sum(n > inside for n, inside in self.all_to_all)
        return (groups + peers * NCCL_ALL_TO_ALL_PEER_BYTES + pools * NCCL_NET_P2P_POOL_BYTES
                + self.pairs * NCCL_PAIR_BYTES + self.deepep_bytes)


def reserve_bytes(device: DeviceSpec, *, allocated: Real, communicators: Real) -> Real:
    """What a device holds beyond the ``allocated`` peak of a plan's tensors: the CUDA
    context (``device.reserved_memory_gib``), NCCL's buffers (``communicators`` bytes:
    :attr:`Communicators.bytes`) and what the caching allocator reserves beyond its peak
    (``device.allocator_fragmentation`` of it)."""
    context = device.reserved_memory_gib * 2**30
    return context + communicators + allocator_slack_bytes(device, allocated)


def allocator_slack_bytes(device: DeviceSpec, allocated: Real) -> Real:
    """What PyTorch's caching allocator reserves beyond an ``allocated`` peak
    (``device.allocator_fragmentation`` of it): ``max_memory_reserved`` is ``allocated`` plus
    this.

    >>> from planner.spec import DeviceSpec
    >>> h100 = DeviceSpec(name="H100", memory_gib=80, peak_tflops={"bf16": 989},
    ...                   memory_bandwidth_gb_s=3350)
    >>> allocator_slack_bytes(h100, 50 * 2**30) / 2**30
    4.0
    """
    return device.allocator_fragmentation * allocated


def allocatable_bytes(device: DeviceSpec, usable: float, *, communicators: float) -> float:
    """The largest allocated peak whose reserve (:func:`reserve_bytes`) still leaves
    ``usable`` bytes filled: the inverse of ``allocated + reserve_bytes(allocated)``."""
    context = device.reserved_memory_gib * 2**30
    return (usable - context - communicators) / (1 + device.allocator_fragmentation)


class MemoryParts(NamedTuple):
    """One device's memory at its peak by what fills it, in bytes: floats, or arrays over
    configurations (a tuple, in this order, wherever the parts travel; the plan's
    :class:`~planner.plan.schema.MemoryBreakdown` has the same fields in the same order).

    The states and the kept activations are live through the forward and backward; of the
    transients (what runs at the moment) only the largest is, so at most one of ``working``
    and ``loss_workspace`` is not zero."""

    weights: Real
    """The compute-precision weights it holds."""
    gradients: Real
    """The gradients it accumulates."""
    optimizer: Real
    """The optimizer states (and master weights) it holds."""
    activations: Real
    """The activations kept for the backward of the microbatches in flight."""
    working: Real = 0.0
    """The transient of the layer running at the peak (a fully recomputed layer rebuilt)."""
    loss_workspace: Real = 0.0
    """The loss's backward workspace when it is the peak's transient (its gradients over the
    vocabulary)."""
    gathered_parameters: Real = 0.0
    """ZeRO-3's gathered and prefetched parameters and a layer's unsharded gradients."""
    other: Real = 0.0
    """The reserve (:func:`reserve_bytes`): the CUDA context, NCCL's buffers and the caching
    allocator's slack."""

    @property
    def total(self) -> Real:
        """Every part: the peak."""
        return sum(self[1:], self[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer state on one device."""

    weights: float
    """The compute-precision weights (the fp32 master copy counts as optimizer state)."""
    gradients: float
    """The accumulated gradients (fp32 main grads under bf16)."""
    optimizer: float
    """Adam's m and v, with the fp32 master weights (and under fp16 an fp32 copy of the gradients)
    in mixed precision."""

    @property
    def total(self) -> float:
        """All three."""
        return self.weights + self.gradients + self.optimizer


# Megatron-LM distributed-optimizer docs: bf16 params + fp32 grads = 18 bytes/param
# (2 + 4 + 12: fp32 master, Adam m and v); fp16 params + fp16 grads = 20 (2 + 2 + 16: the
# optimizer also keeps an fp32 copy of the gradients); fp32 = 16 (4 + 4 + 8).
# What Adam moves per parameter is priced on this layout for every stack (DeepSpeed's too).
ADAM_STATE: dict[StatesPrecision, StateBytes] = {
    "bf16": StateBytes(weights=2, gradients=4, optimizer=12),
    "fp16": StateBytes(weights=2, gradients=2, optimizer=16),
    "fp32": StateBytes(weights=4, gradients=4, optimizer=8),
}
FP8_WEIGHT_COPIES = 2 * FP8_BYTES
"""Bytes a parameter of Transformer Engine's FP8 copies of a weight, row-wise and column-wise."""

for _precision in ("bf16", "fp16"):
    ADAM_STATE[f"{_precision}-deepspeed"] = ADAM_STATE[_precision]  # type: ignore[index]
    ADAM_STATE[f"{_precision}-fp8"] = ADAM_STATE[_precision]  # type: ignore[index]
# Megatron-LM's precision-aware optimizer with bf16 moments (``-m16``): Transformer Engine's
# FusedAdam keeps the moments in bf16 and, for bf16 weights and fp32 master weights, only the
# master's 16 low bits (``store_param_remainders``, which Megatron turns on from TE 2.1:
# megatron/core/optimizer/__init__.py:564-589, distrib_optimizer.py:1007-1013 at d98e8a6;
# TransformerEngine transformer_engine/pytorch/optimizers/fused_adam.py): 2 + 2 + 2 bytes of
# optimizer state, the fp32 main gradients unchanged (``--main-grads-dtype fp32``).
ADAM_STATE["bf16-m16"] = StateBytes(weights=2, gradients=4, optimizer=6)
ADAM_STATE["bf16-fp8-m16"] = ADAM_STATE["bf16-m16"]

HELD_STATE: dict[StatesPrecision, StateBytes] = ADAM_STATE | {
    "bf16-deepspeed": StateBytes(weights=2, gradients=6, optimizer=12),
    "fp16-deepspeed": StateBytes(weights=2, gradients=2, optimizer=12),
    "bf16-fp8": StateBytes(weights=2 + FP8_WEIGHT_COPIES, gradients=4, optimizer=12),
    "fp16-fp8": StateBytes(weights=2 + FP8_WEIGHT_COPIES, gradients=2, optimizer=16),
    "bf16-fp8-m16": StateBytes(weights=2 + FP8_WEIGHT_COPIES, gradients=4, optimizer=6),
}
"""What a device holds per parameter through the backward, by how the run keeps its states:
Megatron-LM's layout (:data:`ADAM_STATE`), or DeepSpeed's optimizers (read at
microsoft/DeepSpeed 77b649d and 3401d25, v0.6). ``BF16_Optimizer``
(``deepspeed/runtime/bf16_optimizer.py``), which DeepSpeed builds for bf16 with fp32 gradient
accumulation at ZeRO 0-1: the flat bf16 weights, an fp32 accumulation buffer of every
gradient (``fp32_groups_gradients_flat``, not partitioned) and the bf16 gradients themselves,
which the pipeline engine leaves in place between microbatches (``pipe/engine.py``
``_exec_backward_pass``: ``update_hp_grads(clear_lp_grads=False)``): 2 + 2 + 4, with the fp32
master partition and Adam's moments (12) sharded. The ZeRO optimizer for fp16
(``zero/stage_1_and_2.py``): fp16 weights and gradients, 2 + 2, the fp32 master partition and
moments (12) sharded; its fp32 gradient partition is made at the step, once the activations
are freed. Transients after the backward (BF16_Optimizer's bf16 copy of the fp32 gradients for
the all-reduce, the ZeRO step's fp32 and fp64 copies of a gradient piece) are not priced.
Transformer Engine's FP8 linears (``-fp8``) hold an FP8 copy of each weight row-wise and
column-wise beside it (:mod:`planner.graph.fp8`), counted with the weights."""


def states_precision(
    precision: Precision, stack: Stack, moments: OptimizerMoments = "fp32"
) -> StatesPrecision:
    """The precision whose Adam states (:data:`ADAM_STATE`) a run of compute ``precision`` on
    ``stack`` keeps, with Adam's moments in ``moments`` (bf16: Megatron-LM's precision-aware
    optimizer, for bf16 compute on its stacks only; raises
    :class:`~planner.errors.ConfigError` for another). Under ``torch.autocast`` (the ``hf-*``
    stacks) the weights themselves are fp32 and there is no master copy: fp32's 16 bytes per
    parameter, with autocast's 16-bit weight copies among the activations
    (:mod:`planner.graph.lower`). FSDP's mixed precision (``composer-fsdp``) keeps the
    sharded weights fp32 too (``torch/distributed/fsdp``: ``_local_shard`` fp32, gathered into
    ``_full_param_padded`` in ``param_dtype``), but gathers and reduces in 16 bits, which
    fp32's states would price as 4-byte traffic: it keeps the compute precision's 18 bytes, 2
    a parameter (over the data-parallel ranks) more than it holds. Megatron-DeepSpeed's are
    DeepSpeed's optimizers' (:data:`HELD_STATE`); the FP8 stacks' hold the FP8 weight copies
    too.

    >>> states_precision("bf16", "megatron-te"), states_precision("bf16", "hf-eager")
    ('bf16', 'fp32')
    >>> states_precision("bf16", "megatron-deepspeed"), states_precision("bf16", "megatron-te-fp8")
    ('bf16-deepspeed', 'bf16-fp8')
    >>> states_precision("bf16", "megatron-te-fp8", "bf16")
    'bf16-fp8-m16'
    """
    held = _states_precision(precision, stack)
    if moments == "fp32":
        return held
    if held not in ("bf16", "bf16-fp8"):
        raise ConfigError(f"optimizer_moments bf16 is Megatron-LM's precision-aware optimizer "
                          f"under bf16 on megatron-te or megatron-te-fp8, not {precision} on "
                          f"{stack}")  # fmt: skip
    return "bf16-m16" if held == "bf16" else "bf16-fp8-m16"


def _states_precision(precision: Precision, stack: Stack) -> StatesPrecision:
    if stack in ("hf-eager", "hf-compiled"):
        return "fp32"
    if stack == "megatron-deepspeed" and precision != "fp32":
        return "bf16-deepspeed" if precision == "bf16" else "fp16-deepspeed"
    if stack in FP8_STACKS and precision != "fp32":
        return "bf16-fp8" if precision == "bf16" else "fp16-fp8"
    return precision


def gathered_bytes_per_param(precision: Precision, stack: Stack) -> float:
    """Bytes per parameter of the largest layer that ZeRO-3 holds unsharded at its peak, the
    layer's backward, for a run of compute ``precision`` on ``stack``.

    PyTorch's FSDP2 (``torch/distributed/fsdp/_fully_shard/``; the default): the layer's
    gathered parameters and the next one's, prefetched one group ahead
    (``FSDPParamGroup._backward_prefetch``); the forward's gathered layer is still held too
    until the next group's all-gather is waited on (``FSDPCommContext.all_gather_state``), so
    three layers' in the compute precision; and the layer's unsharded gradients copied into a
    reduce-scatter input in the reduce dtype (the gradients' precision), the previous layer's
    still held until this one's post-backward (``_fsdp_collectives.foreach_reduce``,
    ``reduce_scatter_state``): two. FSDP1 as Composer ran it (``composer-fsdp``:
    ``BACKWARD_POST`` prefetch, ``limit_all_gathers``, PURE bf16 reductions): the unit's
    gradient, its padded copy for the reduce-scatter and the next unit prefetched, three in
    the compute precision. Megatron-FSDP's and DeepSpeed's own prefetch rules are not
    modelled apart.

    >>> gathered_bytes_per_param("bf16", "megatron-te"), gathered_bytes_per_param("bf16",
    ...                                                                          "composer-fsdp")
    (14.0, 6.0)
    """
    weights = 4.0 if precision == "fp32" else 2.0
    if stack == "composer-fsdp":
        return 3.0 * weights
    return 3.0 * weights + 2.0 * ADAM_STATE[precision].gradients


def adam_traffic_bytes(precision: StatesPrecision) -> float:
    """Bytes Adam's update moves per parameter, wherever it runs: it reads and writes the
    optimizer state, reads the gradient and writes the compute-precision weight; in fp32 the
    weight is the master copy, which the update also reads (PyTorch's ``_fused_adamw_`` loads
    the parameters, gradients and both moments and stores all but the gradients,
    ``aten/src/ATen/native/cuda/fused_adamw_impl.cu``).

    >>> adam_traffic_bytes("bf16"), adam_traffic_bytes("fp32")  # 24 + 4 + 2; 16 + 4 + 8
    (30, 28)
    """
    state = ADAM_STATE[precision]
    master_read = state.weights if precision == "fp32" else 0
    return 2 * state.optimizer + state.gradients + state.weights + master_read


def state_bytes_per_param(
    precision: StatesPrecision, *, zero: int, shards: int, held: bool = True
) -> StateBytes:
    """Adam state per parameter a device holds (:data:`HELD_STATE`) with ZeRO stage ``zero``
    over ``shards`` data-parallel ranks; with ``held`` false, Megatron-LM's layout of the same
    precision (:data:`ADAM_STATE`: DeepSpeed runs ZeRO-Offload on its ZeRO optimizer, not
    ``BF16_Optimizer``).

    Stage 1 (Megatron's distributed optimizer) shards the optimizer state, stage 2 also the
    gradients, stage 3 also the weights.

    >>> state_bytes_per_param("bf16", zero=1, shards=8).total  # Megatron: 6 + 12/d
    7.5
    >>> state_bytes_per_param("bf16-deepspeed", zero=1, shards=8).total  # BF16_Optimizer
    9.5
    """
    full = (HELD_STATE if held else ADAM_STATE)[precision]
    return StateBytes(
        weights=full.weights / (shards if zero >= 3 else 1),
        gradients=full.gradients / (shards if zero >= 2 else 1),
        optimizer=full.optimizer / (shards if zero >= 1 else 1),
    )


GRADIENT_WIRE_BYTES: dict[StatesPrecision, float] = {"bf16-deepspeed": 2.0}
"""Where the gradient reduction's element is not the kept gradient's: DeepSpeed reduces in its
``communication_data_type``, which defaults to the training precision (bf16 for a bf16 run:
``DeepSpeedEngine.communication_data_type`` in ``deepspeed/runtime/engine.py``), casting its
fp32 accumulated gradients to bf16 for the all-reduce and back (``allreduce_bucket``)."""


def gradient_bytes_on_wire(precision: StatesPrecision) -> float:
    """Bytes per parameter the data-parallel gradient reduction moves: fp32 main grads for
    bf16, as Megatron reduces them; fp16 grads for fp16; bf16 for DeepSpeed's bf16
    (:data:`GRADIENT_WIRE_BYTES`).

    >>> gradient_bytes_on_wire("bf16"), gradient_bytes_on_wire("bf16-deepspeed")
    (4, 2.0)
    """
    return GRADIENT_WIRE_BYTES.get(precision, ADAM_STATE[precision].gradients)
