"""Megatron's warm-up, defined once (:func:`planner.cost.pipeline.warmup_forwards`): the
schedules' op orders run it, and the memory model's microbatches in flight follow from it.
Both are held here to the op orders themselves over many pipelines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner import cost
from planner.pipeline.schedules import stage_order
from planner.vocabulary import PipelineSchedule, ScheduleName


def pipelines() -> list[tuple[ScheduleName, int, int, int]]:
    """(schedule, p, v, m): GPipe and 1F1B with any ``m``, interleaved with ``m`` a multiple
    of ``p`` (Megatron's rule), fewer microbatches than stages included."""
    out: list[tuple[ScheduleName, int, int, int]] = []
    for p, m in itertools.product(range(1, 7), range(1, 13)):
        out += [("gpipe", p, 1, m), ("1f1b", p, 1, m)]
        if p >= 2 and m % p == 0:
            out += [("interleaved", p, v, m) for v in range(2, 5)]
    return out


CONFIG: dict[ScheduleName, PipelineSchedule] = {
    "gpipe": "gpipe", "1f1b": "1f1b", "interleaved": "1f1b"
}
"""The schedule as a configuration names it (interleaved is 1F1B with ``v > 1``)."""


@pytest.mark.parametrize(("schedule", "p", "v", "m"), pipelines())
def test_orders_and_memory_follow_the_one_warmup(
    schedule: ScheduleName, p: int, v: int, m: int
) -> None:
    """On every stage: the forwards before the first backward of the op order are the
    ``warmup_forwards`` and the one that starts the steady state (if any forward is left),
    and the most chunks whose forward has started and whose backward has not finished, over
    ``v``, are ``in_flight_microbatches``."""
    for stage in range(p):
        order = stage_order(schedule, stage=stage, pp=p, vpp=v, m=m)
        is_forward = np.array([f for f, _, _ in order])
        first_backward = int(np.argmin(is_forward))
        warmup = cost.warmup_forwards(schedule, stage=stage, pp=p, vpp=v, num_microbatches=m)
        assert first_backward == min(warmup + 1, m * v)
        peak = int(np.cumsum(np.where(is_forward, 1, -1)).max())
        held = cost.in_flight_microbatches(CONFIG[schedule], stage=stage, pp=p, vpp=v,
                                           num_microbatches=m)  # fmt: skip
        assert held == peak / v


def test_warmup_known_answers() -> None:
    """1F1B: ``p - i - 1``; interleaved: ``2 (p - i - 1) + (v - 1) p``; both capped at every
    forward there is; GPipe: all of them (Narayanan et al., SC'21, Sec. 2.2; Megatron-LM's
    ``schedules.py``)."""
    def warmup(schedule: ScheduleName, stage: int, p: int, v: int, m: int) -> int:
        return cost.warmup_forwards(schedule, stage=stage, pp=p, vpp=v, num_microbatches=m)

    assert [warmup("1f1b", i, 4, 1, 8) for i in range(4)] == [3, 2, 1, 0]
    assert [warmup("1f1b", i, 4, 1, 2) for i in range(4)] == [2, 2, 1, 0]
    assert [warmup("interleaved", i, 4, 2, 8) for i in range(4)] == [10, 8, 6, 4]
    assert [warmup("interleaved", i, 2, 3, 2) for i in range(2)] == [6, 4]
    assert warmup("gpipe", 0, 4, 1, 8) == 8
