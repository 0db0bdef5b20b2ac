"""The pipeline's formulas, each once: the step from per-microbatch stage times and its bubble
(:func:`fill_and_drain`, which the step composer and the stage dynamic program both use), the
closed-form bubble share of equal stages, and the forwards a schedule runs before a stage's
first backward (:func:`warmup_forwards`, from which the schedules' op orders and the
microbatches a stage holds follow)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from planner.cost.elementwise import Real, minimum
from planner.vocabulary import ScheduleName

Seconds = TypeVar("Seconds", float, np.ndarray)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTime:
    """The pipeline's share of a step: total seconds and the bubble within it."""

    total_s: float
    """Forward-backward of every microbatch through every stage, fill and drain included."""
    bubble_s: float
    """The fill and drain: what the slowest stage waits beyond its own ``m`` microbatches."""


def fill_and_drain(
    *, sum_s: Seconds, max_s: Seconds, num_microbatches: int, vpp: int = 1
) -> tuple[Seconds, Seconds]:
    """The step and its bubble, ``m max_i t_i + (sum_i t_i - max_i t_i) / v``, of ``m``
    microbatches through stages whose per-microbatch times ``t_i`` add up to ``sum_s`` and
    peak at ``max_s``: the slowest stage is busy ``m max t``, and the fill and drain cost the
    other stages' times once, divided by ``v`` with interleaving (Narayanan et al., SC'21,
    Sec. 2.2). For ``v = 1`` it is Alpa's ``sum_i t_i + (m - 1) max_i t_i`` (Zheng et al.,
    OSDI'22, Eq. 2). 1F1B and GPipe share it.

    The one definition of the pipeline step: :func:`pipeline_time` applies it to a list of
    stage times, the stage dynamic program (:func:`planner.pipeline.split.split_layers`) to
    its cuts and, elementwise over arrays, to its lower bounds.

    >>> fill_and_drain(sum_s=4.0, max_s=1.0, num_microbatches=8)
    (11.0, 3.0)
    >>> fill_and_drain(sum_s=6.0, max_s=np.array([2.0, 3.0]), num_microbatches=4)[0]
    array([12., 15.])
    """
    busy = num_microbatches * max_s
    bubble = (sum_s - max_s) / vpp
    return busy + bubble, bubble


def pipeline_time(
    stage_times_s: Sequence[float], *, num_microbatches: int, vpp: int = 1
) -> PipelineTime:
    """Forward-backward time of ``num_microbatches`` through stages of the given per-microbatch
    times (:func:`fill_and_drain`).

    >>> pipeline_time([1.0, 1.0, 1.0, 1.0], num_microbatches=8)
    PipelineTime(total_s=11.0, bubble_s=3.0)
    """
    total, bubble = fill_and_drain(sum_s=sum(stage_times_s), max_s=max(stage_times_s),
                                   num_microbatches=num_microbatches, vpp=vpp)  # fmt: skip
    return PipelineTime(total_s=total, bubble_s=bubble)


def bubble_fraction(*, pp: int, vpp: int, num_microbatches: int) -> float:
    """Closed-form bubble share of equal stages: ``(p - 1) / (v m)`` of the busy time."""
    return (pp - 1) / (vpp * num_microbatches)


def warmup_forwards(
    schedule: ScheduleName, *, stage: Real, pp: Real, vpp: Real, num_microbatches: Real
) -> Real:
    """Forwards (of model chunks) stage ``stage`` (0-based) of ``pp`` runs before its first
    backward.

    1F1B (PipeDream-Flush; Megatron-LM's ``forward_backward_pipelining_without_interleaving``):
    ``p - i - 1``. Interleaved 1F1B (Megatron-LM's
    ``forward_backward_pipelining_with_interleaving``): ``2 (p - i - 1) + (v - 1) p`` chunk
    forwards. Both capped at everything there is; GPipe runs all forwards first.

    >>> [warmup_forwards("interleaved", stage=i, pp=4, vpp=2, num_microbatches=8)
    ...  for i in range(4)]
    [10, 8, 6, 4]
    """
    m = num_microbatches
    if schedule == "gpipe":
        return m * vpp
    if schedule == "1f1b":
        return minimum(pp - stage - 1, m)
    return minimum(2 * (pp - stage - 1) + (vpp - 1) * pp, m * vpp)
