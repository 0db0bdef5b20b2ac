"""Activations: what an operator keeps for its backward under each recomputation, and how
many microbatches' worth of them a pipeline schedule holds at a stage's peak."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from planner.cost.compute import sharded_bytes
from planner.cost.elementwise import Real, minimum, where
from planner.cost.pipeline import warmup_forwards
from planner.graph.fp8 import fp8_copy_ratio
from planner.graph.ops import Op, Tensor
from planner.vocabulary import (
    DEFAULT_RECOMPUTE_MODULES,
    PipelineSchedule,
    Recompute,
    ScheduleName,
    schedule_name,
)


def saved_activation_bytes(
    op: Op,
    degrees: Callable[[Tensor], Mapping[str, int]],
    *,
    recompute: Recompute,
    flash_attention: bool,
    modules: Collection[str] = DEFAULT_RECOMPUTE_MODULES,
) -> float:
    """Bytes ``op`` keeps for backward on one device, each kept tensor split as ``degrees``
    says (before full recompute, which the caller handles at layer level). Flash attention,
    and selective recompute of the attention core, drop the ``s x s`` tensors (Korthikanti et
    al., Sec. 5); an FP8 linear keeps its input in FP8 (:func:`kept_fraction`); selective
    recompute of an output-discarding module among ``modules``
    (:attr:`~planner.graph.ops.Op.discarded_by`) drops the inputs the op would keep; of a
    checkpointed module it runs inside (:attr:`~planner.graph.ops.Op.checkpointed_by`),
    everything but the module's input, and the share of its output that torchtitan's
    per-operator policy saves and the backward reads (:meth:`~planner.graph.ops.Op.output_kept`)."""
    selected = recompute == "selective"
    checkpointed = selected and op.checkpointed(modules)
    inputs = keeps_inputs(op, recompute=recompute, modules=modules)
    kept = sum(sharded_bytes(t, degrees(t)) * kept_fraction(op, t) for t in op.saved
               if (inputs if t in op.inputs else not checkpointed))  # fmt: skip
    if checkpointed:
        kept += sharded_bytes(op.output, degrees(op.output)) * op.output_kept(modules)
    if not flash_attention and not (selected and "core_attn" in modules):
        kept += sum(sharded_bytes(t, degrees(t)) for t in op.score_tensors)
    return kept


def kept_fraction(op: Op, tensor: Tensor) -> float:
    """What ``op`` keeps of a tensor it saves: all of it, but an FP8 linear's input, which it
    keeps in FP8 (:func:`planner.graph.fp8.fp8_copy_ratio`)."""
    if op.fp8 and tensor in op.inputs:
        return fp8_copy_ratio(tensor.element_bytes)
    return 1.0


def keeps_inputs(op: Op, *, recompute: Recompute,
                 modules: Collection[str] = DEFAULT_RECOMPUTE_MODULES) -> bool:
    """Whether ``op`` keeps the inputs it saves (before full recompute): not under selective
    recomputation of a module that discards them or of one it runs inside, unless they are
    that module's own input."""
    if recompute != "selective":
        return True
    discarded = not set(op.discarded_by).isdisjoint(modules)
    module_input = not set(op.checkpoint_input_of).isdisjoint(modules)
    return (module_input or not op.checkpointed(modules)) and not discarded


def in_flight_microbatches(
    schedule: PipelineSchedule | ScheduleName, *, stage: Real, pp: Real, vpp: Real,
    num_microbatches: Real,
) -> Real:
    """Microbatches' worth of one stage's activations held at the peak, for ``stage`` (0-based):
    its warm-up forwards (:func:`~planner.cost.pipeline.warmup_forwards`) and the forward that
    starts its steady state, capped at everything there is, in model chunks of ``1/v`` each.

    1F1B: stage ``i`` of ``p`` holds ``p - i``. Interleaved 1F1B (Megatron's warm-up of
    ``2(p - i - 1) + (v - 1) p`` chunks plus one) holds ``1 + (p - 1)/(p v)`` times the
    first stage's 1F1B amount on stage 0 (Korthikanti et al., Sec. 4.2.3). GPipe holds all;
    the zero-bubble schedules see :func:`_zero_bubble_in_flight`. ``schedule`` may name the
    interleaved schedule itself (then ``vpp`` may be an array). Never more on a later stage
    than on an earlier one (the step composer takes a run of equal stages' peak at its first;
    ZB-V: with ``m >= 2p - 1``, which the configuration requires).

    >>> [in_flight_microbatches("1f1b", stage=i, pp=4, vpp=2, num_microbatches=8)
    ...  for i in range(4)]
    [5.5, 4.5, 3.5, 2.5]
    """
    m = num_microbatches
    if schedule == "gpipe":
        return m * 1.0
    if schedule in ("zb-h1", "zb-v"):
        return _zero_bubble_in_flight(schedule, stage=stage, pp=pp, num_microbatches=m)
    name = schedule if schedule == "interleaved" else schedule_name(schedule, vpp)
    warmup = warmup_forwards(name, stage=stage, pp=pp, vpp=vpp, num_microbatches=m)
    return minimum(warmup + 1, m * vpp) / vpp


def held_in_flight(in_flight: Real, *, vpp: Real, num_microbatches: Real,
                   overlap_moe_comm: Real) -> Real:
    """The ``in_flight`` microbatches' worth a stage's memory holds
    (:func:`in_flight_microbatches`), with the experts' all-to-alls overlapped one chunk more:
    Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``) runs a microbatch's
    forward together with another's backward, layer by layer ("Phases 1: 1st microbatch
    backward + 2nd microbatch forward", ``megatron/core/pipeline_parallel/combined_1f1b.py:54-64``
    at NVIDIA/Megatron-LM@d98e8a64dd), so the forward's chunk is built before the backward's
    is freed; capped at everything there is.

    >>> held_in_flight(5.5, vpp=2, num_microbatches=8, overlap_moe_comm=True)
    6.0
    """
    return minimum(in_flight + where(overlap_moe_comm, 1 / vpp, 0.0), num_microbatches)


def _zero_bubble_in_flight(
    schedule: PipelineSchedule | ScheduleName, *, stage: Real, pp: Real, num_microbatches: Real
) -> Real:
    """A zero-bubble stage keeps a chunk's activations until its weight gradient (W needs the
    layer inputs and the output gradients). ZB-H1 holds ``min(p, m)`` on every stage (stage
    ``i`` delays ``i`` weight gradients on top of 1F1B's ``p - i``), which is what 1F1B holds
    on its first stage, as Qi et al. (ICLR'24, Sec. 3.1) design it. ZB-V (PyTorch's order)
    holds ``min(p, m, (m + 1 + i) / 2)``: ``p`` everywhere once ``m >= 2p - 1``, where the
    planner runs it. Held to the simulator in ``tests/test_zero_bubble.py``."""
    m = num_microbatches
    if schedule == "zb-h1":
        return minimum(pp, m) * 1.0
    return minimum(minimum(pp, m) * 1.0, (m + 1 + stage) / 2)
