"""The stage dynamic program (:func:`planner.pipeline.split.split_layers`) on the known answers
of Alpa's general program, which it replaced, and against brute force over every cut when each
layer range has several options (say with and without recomputation) that admit different
numbers of in-flight microbatches: under 1F1B stage ``i`` of ``p`` holds ``p - i``, and takes
the fastest option that fits them, as :func:`planner.pipeline.options.stage_table` does."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleError
from planner.pipeline.split import split_layers
from planner.pipeline.submeshes import submesh_shapes

Option = tuple[float, int]
"""A stage option: per-microbatch latency, and the most microbatches in flight that fit."""
Options = Callable[[int, int], list[Option]]
"""The options of a stage holding layers ``first..last`` (1-based, inclusive)."""


def fastest(options: list[Option], held: int) -> float:
    """The fastest option admitting ``held`` microbatches (inf: none)."""
    return min((t for t, most in options if most >= held), default=math.inf)


def table(num_layers: int, num_stages: int, options: Options) -> np.ndarray:
    """``latency[i, a, b]``: stage ``i`` holding layers ``a..b-1`` (0-based) with the fastest
    option that fits the ``p - i`` microbatches it holds."""
    latency = np.full((num_stages, num_layers + 1, num_layers + 1), np.inf)
    for i in range(num_stages):
        for a in range(num_layers):
            for b in range(a + 1, num_layers + 1):
                latency[i, a, b] = fastest(options(a + 1, b), num_stages - i)
    return latency


def brute_force(
    num_layers: int, num_stages: int, num_microbatches: int, options: Options
) -> float | None:
    """The least ``sum t + (m - 1) max t`` over every cut into ``num_stages`` stages, each
    stage taking its fastest option that fits, or None if no cut fits."""
    best = None
    for inner in itertools.combinations(range(1, num_layers), num_stages - 1):
        cuts = (0, *inner, num_layers)
        times = [fastest(options(a + 1, b), num_stages - i)
                 for i, (a, b) in enumerate(itertools.pairwise(cuts))]  # fmt: skip
        if all(math.isfinite(t) for t in times):
            step = sum(times) + (num_microbatches - 1) * max(times)
            best = step if best is None else min(best, step)
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[int, int, int, dict[tuple[int, int], list[Option]]]:
    """Up to 6 layers, 0-3 options per range (none: nothing fits) of 0.1-5 s admitting 1-5
    microbatches."""
    layers = draw(st.integers(1, 6))
    stages = draw(st.integers(1, layers))
    microbatches = draw(st.integers(1, 12))
    costs = {
        (first, last): [(draw(st.integers(1, 50)) / 10, draw(st.integers(1, 5)))
                        for _ in range(draw(st.integers(0, 3)))]
        for first in range(1, layers + 1) for last in range(first, layers + 1)
    }  # fmt: skip
    return layers, stages, microbatches, costs


@settings(max_examples=200, deadline=None)
@given(instances())
def test_split_matches_brute_force_over_options(instance) -> None:
    """Same optimum, or infeasible exactly when brute force finds nothing; every stage of the
    split runs an option of its layers that fits what it holds."""
    layers, stages, microbatches, costs = instance

    def options(first: int, last: int) -> list[Option]:
        return costs[first, last]

    expected = brute_force(layers, stages, microbatches, options)
    latency = table(layers, stages, options)
    if expected is None:
        with pytest.raises(InfeasibleError):
            split_layers(latency, microbatches)
        return
    split = split_layers(latency, microbatches)
    assert split.step_s == pytest.approx(expected, rel=1e-12)
    for i, (a, b) in enumerate(itertools.pairwise(split.bounds)):
        held = stages - i
        assert any(t == split.latencies_s[i] and most >= held for t, most in costs[a + 1, b])


def best_over_stage_counts(
    num_layers: int, counts: list[int], num_microbatches: int, options: Callable[[int], Options]
) -> tuple[int, tuple[int, ...], float]:
    """The best split over the given stage counts (the search's outer loop), its count,
    cuts and step; ``options(p)`` gives the stage options with ``p`` stages."""
    found = []
    for p in counts:
        split = split_layers(table(num_layers, p, options(p)), num_microbatches)
        found.append((split.step_s, p, split.bounds))
    step, p, bounds = min(found)
    return p, bounds, step


def test_one_wide_stage_beats_two_narrow_ones() -> None:
    """Four equal layers on two devices, 8 microbatches, 0.25 s fixed per stage: one stage on
    both devices (8 x 2.25 = 18 s) beats two stages of one device each (2.25 + 2.25 + 7 x 2.25
    = 20.25 s), whose bubble costs more than the split saves."""
    def options(p: int) -> Options:
        devices = 2 // p  # the submesh each stage gets
        return lambda first, last: [((last - first + 1) / devices + 0.25, 8)]

    assert best_over_stage_counts(4, [1, 2], 8, options) == (1, (0, 4), 18.0)
    two = split_layers(table(4, 2, options(2)), 8)
    assert (two.bounds, two.step_s) == ((0, 2, 4), 20.25)


def test_balanced_stages_for_equal_layers() -> None:
    """Eight equal layers on eight stages with many microbatches: one layer a stage, 8 + 63 x
    1 s."""
    split = split_layers(table(8, 8, lambda first, last: [(last - first + 1.0, 16)]), 64)
    assert split.bounds == tuple(range(9))
    assert split.step_s == 8 + 63


def test_more_stages_win_with_many_microbatches() -> None:
    """The same eight layers over 1, 2, 4 or 8 stages (each stage's submesh a share of eight
    devices, the layer time shrinking as ``d^0.9``): eight stages of one device each win, the
    bubble ``(p - 1)/m`` being small beside the eight times shorter stage."""
    def options(p: int) -> Options:
        devices = 8 // p
        return lambda first, last: [((last - first + 1) / devices**0.9, 16)]

    p, bounds, step = best_over_stage_counts(8, [1, 2, 4, 8], 64, options)
    assert (p, bounds, step) == (8, tuple(range(9)), 8 + 63)


def test_memory_forces_the_cut() -> None:
    """No stage of more than two layers fits, so six layers on three stages take two each."""
    latency = table(6, 3, lambda first, last: [] if last - first + 1 > 2
                    else [(last - first + 1.0, 4)])  # fmt: skip
    split = split_layers(latency, 8)
    assert split.bounds == (0, 2, 4, 6)
    assert split.step_s == 6 + 7 * 2


def test_the_stage_that_holds_more_takes_the_leaner_option() -> None:
    """Each stage may run fast holding 1 microbatch or slower (recomputing) holding 4. With
    two stages, the first holds 2 and must take the slow option; the last takes the fast
    one: 3 + 1 + (8 - 1) x 3."""
    latency = table(2, 2, lambda first, last: [(1.0, 1), (3.0, 4)])
    split = split_layers(latency, 8)
    assert split.latencies_s == (3.0, 1.0)
    assert split.step_s == 3 + 1 + 7 * 3


def test_nothing_fits_what_the_first_stage_holds() -> None:
    """Every option holds one microbatch: the last stage fits, the first (holding 2) does not."""
    with pytest.raises(InfeasibleError, match="2 stages fits in memory"):
        split_layers(table(3, 2, lambda first, last: [(1.0, 1)]), 4)


def test_submesh_shapes() -> None:
    """Powers of two inside a node, then whole nodes."""
    assert submesh_shapes(3, 4) == [(1, 1), (1, 2), (1, 4), (2, 4), (3, 4)]
    assert submesh_shapes(1, 1) == [(1, 1)]
