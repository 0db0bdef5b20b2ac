"""The inter-operator pass: consecutive layers into pipeline stages on submeshes.

Alpa's stage construction (Zheng et al., OSDI'22, Sec. 5.2): for a bound ``t_max`` on any
stage's latency, ``F(s, k, d)`` is the least total latency of putting layers ``k..L`` into ``s``
stages on exactly ``d`` devices. A stage is admissible only if its latency is at most
``t_max`` and its memory fits with the microbatches it holds in flight: under 1F1B the stage
``s`` places from the end holds ``s`` (the first stage of ``p`` holds ``p``). The step takes
``sum_i t_i + (B - 1) max_i t_i`` for ``B`` microbatches, so ``t_max`` is enumerated over the
distinct stage latencies in ascending order, stopping once ``(B - 1) t_max`` alone exceeds the
best step found.

Stage costs come from a callback, so the same dynamic program serves the ILP's layers and any
other pricing: ``stage_cost(first, last, shape)`` gives the stage's options, each a
per-microbatch latency and the largest number of in-flight microbatches whose memory fits (a
faster option, say without recomputation, usually admits fewer). The program takes, for a stage
that must hold ``s``, the fastest option admitting ``s``. The callback is called once per
(layer range, shape); an empty list means nothing fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.errors import InfeasibleError


@dataclass(frozen=True, slots=True)
class StageCost:
    """What the dynamic program needs to know of one candidate stage."""

    latency_s: float
    """Forward and backward of one microbatch."""
    max_in_flight: int
    """The most microbatches whose activations fit beside the stage's weights."""


@dataclass(frozen=True, slots=True)
class StageChoice:
    """One stage of a partition: layers ``first..last`` (1-based, inclusive) on ``shape``."""

    first: int
    last: int
    shape: tuple[int, int]
    latency_s: float


@dataclass(frozen=True, slots=True)
class Partition:
    """The best partition found and its step latency ``sum t + (B - 1) max t``."""

    stages: tuple[StageChoice, ...]
    step_s: float


StageCostFn = Callable[[int, int, tuple[int, int]], Sequence[StageCost]]


def submesh_shapes(num_nodes: int, devices_per_node: int) -> list[tuple[int, int]]:
    """Alpa's submesh shapes: part of one node in powers of two, or whole nodes.

    >>> submesh_shapes(2, 8)
    [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]
    """
    shapes = []
    m = 1
    while m < devices_per_node:
        shapes.append((1, m))
        m *= 2
    shapes += [(n, devices_per_node) for n in range(1, num_nodes + 1)]
    return shapes


def step_latency_s(latencies: Sequence[float], num_microbatches: int) -> float:
    """``sum_i t_i + (B - 1) max_i t_i`` (Alpa, Eq. 2)."""
    return sum(latencies) + (num_microbatches - 1) * max(latencies)


def partition(
    num_layers: int,
    *,
    shapes: Sequence[tuple[int, int]],
    num_devices: int,
    num_microbatches: int,
    stage_cost: StageCostFn,
    max_stages: int | None = None,
) -> Partition:
    """The partition of ``num_layers`` layers into stages on submeshes of ``shapes`` that use
    exactly ``num_devices`` devices and minimise the step latency.

    Raises :class:`~planner.errors.InfeasibleError` when no partition fits.

    Four equal layers on two devices, 8 microbatches, a fixed 0.25 s per stage: one stage on
    both devices (8 x 2.25 = 18 s) beats two stages of one device each (2 x 2.25 + 7 x 2.25 =
    20.25 s), whose bubble costs more than the split saves:

    >>> def cost(first, last, shape):
    ...     return [StageCost(latency_s=(last - first + 1) / shape[1] + 0.25, max_in_flight=8)]
    >>> best = partition(4, shapes=[(1, 1), (1, 2)], num_devices=2, num_microbatches=8,
    ...                  stage_cost=cost)
    >>> [(s.first, s.last, s.shape) for s in best.stages], best.step_s
    ([(1, 4, (1, 2))], 18.0)
    """
    costs = _all_costs(num_layers, shapes, stage_cost)
    limit = min(max_stages or num_layers, num_layers)
    latencies = sorted({c.latency_s for options in costs.values() for c in options})
    best: Partition | None = None
    for t_max in latencies:
        if best is not None and (num_microbatches - 1) * t_max >= best.step_s:
            break  # every later bound is at least this slow (Alpa's early stop)
        found = _best_under(num_layers, shapes, num_devices, limit, t_max, costs)
        for stages in found:
            step = step_latency_s([s.latency_s for s in stages], num_microbatches)
            if best is None or step < best.step_s:
                best = Partition(tuple(stages), step)
    if best is None:
        raise InfeasibleError(
            f"no partition of {num_layers} layers onto {num_devices} devices fits in memory"
        )
    return best


Costs = dict[tuple[int, int, tuple[int, int]], tuple[StageCost, ...]]


def _all_costs(
    num_layers: int, shapes: Sequence[tuple[int, int]], stage_cost: StageCostFn
) -> Costs:
    """Every stage's options, fastest first."""
    return {
        (first, last, shape): tuple(sorted(stage_cost(first, last, shape),
                                           key=lambda c: (c.latency_s, -c.max_in_flight)))
        for first in range(1, num_layers + 1)
        for last in range(first, num_layers + 1)
        for shape in shapes
    }  # fmt: skip


def _best_under(
    num_layers: int,
    shapes: Sequence[tuple[int, int]],
    num_devices: int,
    max_stages: int,
    t_max: float,
    costs: Costs,
) -> list[list[StageChoice]]:
    """For each stage count, the least-total-latency partition with every stage <= t_max."""
    memo: dict[tuple[int, int, int], tuple[float, list[StageChoice]] | None] = {}

    def solve(first: int, devices: int, stages: int) -> tuple[float, list[StageChoice]] | None:
        """Layers first..L in exactly ``stages`` stages on exactly ``devices`` devices."""
        if first > num_layers:
            return (0.0, []) if devices == 0 and stages == 0 else None
        if stages == 0 or devices <= 0:
            return None
        key = (first, devices, stages)
        if key in memo:
            return memo[key]
        best: tuple[float, list[StageChoice]] | None = None
        # Leave at least one layer for each later stage.
        for last in range(first, num_layers - stages + 2):
            for shape in shapes:
                size = shape[0] * shape[1]
                if size > devices:
                    continue
                # The fastest option that fits the `stages` microbatches this stage holds.
                cost = next((c for c in costs[first, last, shape]
                             if c.max_in_flight >= stages), None)  # fmt: skip
                if cost is None or cost.latency_s > t_max:
                    continue
                rest = solve(last + 1, devices - size, stages - 1)
                if rest is None:
                    continue
                total = cost.latency_s + rest[0]
                if best is None or total < best[0] - 1e-15:
                    best = (total, [StageChoice(first, last, shape, cost.latency_s), *rest[1]])
        memo[key] = best
        return best

    found = []
    for count in range(1, max_stages + 1):
        result = solve(1, num_devices, count)
        if result is not None and not math.isinf(result[0]):
            found.append(result[1])
    return found
