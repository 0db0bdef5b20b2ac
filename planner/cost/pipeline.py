"""The pipeline step from per-microbatch stage times, and its bubble fraction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
