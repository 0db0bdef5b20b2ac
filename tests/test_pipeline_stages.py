"""The stage dynamic program against brute force: every way to cut the layers into
consecutive stages and give each stage a submesh so that all devices are used."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleError
from planner.pipeline.stages import StageCost, partition, step_latency_s, submesh_shapes

SHAPES = [(1, 1), (1, 2), (1, 4), (2, 4)]


def brute_force(num_layers, shapes, num_devices, num_microbatches, costs) -> float | None:
    """The least step latency over all partitions, or None if none fits."""
    best = None
    for cuts in itertools.product([False, True], repeat=num_layers - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], num_layers]
        ranges = [(bounds[k] + 1, bounds[k + 1]) for k in range(len(bounds) - 1)]
        p = len(ranges)
        for assignment in itertools.product(shapes, repeat=p):
            if sum(a * b for a, b in assignment) != num_devices:
                continue
            latencies = []
            for position, ((first, last), shape) in enumerate(zip(ranges, assignment, strict=True)):
                # 1F1B: the stage `p - position` places from the end holds that many.
                fits = [c.latency_s for c in costs[first, last, shape]
                        if c.max_in_flight >= p - position]  # fmt: skip
                if not fits:
                    break
                latencies.append(min(fits))
            else:
                step = step_latency_s(latencies, num_microbatches)
                best = step if best is None else min(best, step)
    return best


@st.composite
def instances(draw: st.DrawFn):
    layers = draw(st.integers(1, 5))
    devices = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    microbatches = draw(st.integers(1, 12))
    costs = {}
    for first in range(1, layers + 1):
        for last in range(first, layers + 1):
            for shape in SHAPES:
                # 0-3 options (none: nothing fits), e.g. with and without recomputation.
                costs[first, last, shape] = [
                    StageCost(draw(st.integers(1, 50)) / 10, draw(st.integers(1, 5)))
                    for _ in range(draw(st.integers(0, 3)))
                ]
    return layers, devices, microbatches, costs


@settings(max_examples=150, deadline=None)
@given(instances())
def test_dynamic_program_matches_brute_force(instance) -> None:
    """Same optimum, or infeasible exactly when brute force finds nothing; the partition it
    returns is valid (consecutive layers, all devices, in-flight memory respected)."""
    layers, devices, microbatches, costs = instance
    expected = brute_force(layers, SHAPES, devices, microbatches, costs)

    def cost(first: int, last: int, shape: tuple[int, int]) -> list[StageCost]:
        return costs[first, last, shape]

    if expected is None:
        with pytest.raises(InfeasibleError):
            partition(layers, shapes=SHAPES, num_devices=devices,
                      num_microbatches=microbatches, stage_cost=cost)  # fmt: skip
        return
    best = partition(layers, shapes=SHAPES, num_devices=devices, num_microbatches=microbatches,
                     stage_cost=cost)  # fmt: skip
    assert best.step_s == pytest.approx(expected)
    stages = best.stages
    assert stages[0].first == 1 and stages[-1].last == layers
    assert all(a.last + 1 == b.first for a, b in itertools.pairwise(stages))
    assert sum(s.shape[0] * s.shape[1] for s in stages) == devices
    for position, s in enumerate(stages):
        held = len(stages) - position
        assert any(c.latency_s == s.latency_s and c.max_in_flight >= held
                   for c in costs[s.first, s.last, s.shape])  # fmt: skip


def test_balanced_stages_for_equal_layers() -> None:
    """Eight equal layers on eight single devices with many microbatches: eight one-layer
    stages (bubble (p-1)/m is small next to the 8x shorter stage)."""
    def cost(first: int, last: int, shape: tuple[int, int]) -> list[StageCost]:
        return [StageCost((last - first + 1) / (shape[0] * shape[1]) ** 0.9, 16)]

    best = partition(8, shapes=[(1, 1)], num_devices=8, num_microbatches=64, stage_cost=cost)
    assert [(s.first, s.last) for s in best.stages] == [(i, i) for i in range(1, 9)]
    assert best.step_s == pytest.approx(8 + 63)


def test_memory_forces_more_stages() -> None:
    """No stage of more than two layers fits, so six layers on three devices take three
    two-layer stages."""
    def cost(first: int, last: int, shape: tuple[int, int]) -> list[StageCost]:
        return [] if last - first + 1 > 2 else [StageCost(last - first + 1.0, 4)]

    best = partition(6, shapes=[(1, 1)], num_devices=3, num_microbatches=8, stage_cost=cost)
    assert [(s.first, s.last) for s in best.stages] == [(1, 2), (3, 4), (5, 6)]


def test_the_stage_that_holds_more_takes_the_leaner_option() -> None:
    """Each stage may run fast holding 1 microbatch or slower (recomputing) holding 4. With
    two stages, the first holds 2 and must take the slow option; the last takes the fast
    one: 3 + 1 + (8 - 1) x 3."""
    def cost(first: int, last: int, shape: tuple[int, int]) -> list[StageCost]:
        return [StageCost(1.0, 1), StageCost(3.0, 4)] if first == last else []

    best = partition(2, shapes=[(1, 1)], num_devices=2, num_microbatches=8, stage_cost=cost)
    assert [s.latency_s for s in best.stages] == [3.0, 1.0]
    assert best.step_s == 3 + 1 + 7 * 3


def test_submesh_shapes() -> None:
    """Powers of two inside a node, then whole nodes."""
    assert submesh_shapes(3, 4) == [(1, 1), (1, 2), (1, 4), (2, 4), (3, 4)]
