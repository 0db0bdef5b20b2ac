"""The pipeline's formulas, each once: the step from per-microbatch stage times and its bubble
(:func:`fill_and_drain`, which the step composer and the stage dynamic program both use), the
zero-bubble schedules' bubbles (:func:`zero_bubble_bubble`), the bubble's share of the step
(:func:`bubble_share`, the one definition every command prints) and its closed form for equal
stages, and the forwards a schedule runs before a stage's first backward
(:func:`warmup_forwards`, from which the schedules' op orders and the microbatches a stage
holds follow)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from planner.cost.elementwise import Real, maximum, minimum, where
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


def _max(*values: Real) -> Real:
    """Elementwise maximum of several values."""
    out = values[0]
    for v in values[1:]:
        out = maximum(out, v)
    return out


def zero_bubble_bubble(
    schedule: ScheduleName, *, forward_s: Real, input_s: Real, weight_s: Real, pp: Real,
    num_microbatches: Real,
) -> Real:  # fmt: skip
    """The fill and drain of PyTorch's zero-bubble schedules beyond ``m (F + B + W)``, for
    ``pp`` equal stages each spending ``F``, ``B`` (input gradient) and ``W`` (weight
    gradient) on one microbatch (all chunks), with no time on the wire. Derived from the op
    orders of :mod:`planner.pipeline.zero_bubble` and held exactly to the simulator in
    ``tests/test_zero_bubble.py``.

    ZB-H1 (any ``m``): ``(p - 1) max(F, B, F + B - W) + max(0, p - m) min(F, B, W)``; for
    ``F = B = W`` Qi et al.'s ``(p - 1)(F + B - W)`` (ICLR'24, Sec. 3.1), against 1F1B's
    ``(p - 1)(F + B + W)``.

    ZB-V (``m >= 2p - 1``; per chunk ``f, b, w = F/2, B/2, W/2``): 0 for one stage, else
    ``b_2 + (p - 2) s`` with ``b_2 = max(b, 2b - 2w, f, f + b - 2w, 2f - b - w, 2f - 3w)``
    and ``s = max(w, b, 2b - 2w, 2f - b, 2f - 2w)``: for ``f = b = w``, ``(p - 1) f``, the
    one forward chunk of each hop that nothing can fill (the order is fixed, not re-planned
    for the measured times, so unequal passes leave more).

    >>> zero_bubble_bubble("zb-h1", forward_s=1.0, input_s=1.0, weight_s=1.0, pp=4,
    ...                    num_microbatches=8)
    3.0
    >>> zero_bubble_bubble("zb-v", forward_s=1.0, input_s=1.0, weight_s=1.0, pp=4,
    ...                    num_microbatches=8)
    1.5
    """
    f, b, w, p = forward_s, input_s, weight_s, pp
    if schedule == "zb-h1":
        fill = (p - 1) * _max(f, b, f + b - w)
        return fill + maximum(p - num_microbatches, 0) * minimum(minimum(f, b), w)
    f, b, w = f / 2, b / 2, w / 2
    first = _max(b, 2 * b - 2 * w, f, f + b - 2 * w, 2 * f - b - w, 2 * f - 3 * w)
    hop = _max(w, b, 2 * b - 2 * w, 2 * f - b, 2 * f - 2 * w)
    return where(p > 1, first + (p - 2) * hop, 0.0 * hop)


def bubble_share(*, bubble_s: Real, step_s: Real) -> Real:
    """The one definition of the bubble a plan, a report and the simulator print: the
    critical stage's fill and drain (``pipeline_bubble_s``) over the whole step (pipeline,
    exposed sync and optimizer), the share the breakdown shows beside it; between 0 and 1.
    (Narayanan et al.'s ``(p - 1) / (v m)`` is the bubble over the busy time instead, which
    passes 100 % when a step has fewer microbatches than stages.)

    >>> bubble_share(bubble_s=3.0, step_s=12.0)
    0.25
    >>> bubble_share(bubble_s=np.array([0.0, 1.0]), step_s=np.array([2.0, 4.0]))
    array([0.  , 0.25])
    """
    return where(step_s > 0, bubble_s / maximum(step_s, 1e-300), 0.0 * bubble_s)


def bubble_fraction(*, pp: int, vpp: int, num_microbatches: int) -> float:
    """Closed-form :func:`bubble_share` of equal stages with nothing after the pipeline:
    ``(p - 1) / (v m + p - 1)``, the fill and drain ``(p - 1) t / v`` over the pipeline
    ``m t + (p - 1) t / v``.

    >>> bubble_fraction(pp=4, vpp=1, num_microbatches=8)  # 3 of 11
    0.2727272727272727
    """
    return (pp - 1) / (vpp * num_microbatches + pp - 1)


def paired_fraction(
    schedule: ScheduleName, *, pp: Real, vpp: Real, num_microbatches: Real
) -> Real:
    """Of the first stage's ``m v`` chunk forwards, the share Megatron-Core's combined 1F1B
    runs beside another microbatch's backward: all but its warm-up forwards
    (:func:`warmup_forwards`), and without a pipeline all but the first (``combined_1f1b.py``:
    "the forward step for the first microbatch is executed alone"). The first stage has the
    most warm-up, so the share holds for every stage at least.

    >>> paired_fraction("1f1b", pp=1, vpp=1, num_microbatches=8)
    0.875
    >>> paired_fraction("interleaved", pp=4, vpp=2, num_microbatches=8)  # 10 of 16 warm up
    0.375
    """
    chunks = num_microbatches * vpp
    warmup = warmup_forwards(schedule, stage=0, pp=pp, vpp=vpp,
                             num_microbatches=num_microbatches)  # fmt: skip
    return (chunks - maximum(warmup, 1)) / chunks


def warmup_forwards(
    schedule: ScheduleName, *, stage: Real, pp: Real, vpp: Real, num_microbatches: Real
) -> Real:
    """Forwards (of model chunks) stage ``stage`` (0-based) of ``pp`` runs before its first
    backward.

    1F1B (PipeDream-Flush; Megatron-LM's ``forward_backward_pipelining_without_interleaving``):
    ``p - i - 1``. Interleaved 1F1B (Megatron-LM's
    ``forward_backward_pipelining_with_interleaving``): ``2 (p - i - 1) + (v - 1) p`` chunk
    forwards. Both capped at everything there is; GPipe runs all forwards first. The zero-bubble
    schedules' orders are their own (:mod:`planner.pipeline.zero_bubble`).

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
