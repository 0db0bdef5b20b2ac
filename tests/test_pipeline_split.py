"""The vectorised stage split against brute force over every choice of cut points, and known
answers worked out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import cost
from planner.errors import InfeasibleError, InputError
from planner.pipeline.split import Split, lower_bounds_s, split_layers


def brute_force(latency: np.ndarray, num_microbatches: int) -> float | None:
    """The least step over all cuts into ``p`` non-empty stages, or None if none fits."""
    num_stages, num_layers = latency.shape[0], latency.shape[1] - 1
    best = None
    for inner in itertools.combinations(range(1, num_layers), num_stages - 1):
        cuts = (0, *inner, num_layers)
        times = [latency[i, a, b] for i, (a, b) in enumerate(itertools.pairwise(cuts))]
        if all(math.isfinite(t) for t in times):
            step = sum(times) + (num_microbatches - 1) * max(times)
            best = step if best is None else min(best, step)
    return best


def per_layer(costs: list[float], num_stages: int, *, extra_s: list[float] | None = None):
    """Stage latency = sum of its layers' costs, plus a fixed extra per stage."""
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    a, b = np.indices((len(costs) + 1, len(costs) + 1))
    one = np.where(a < b, prefix[b] - prefix[a], np.inf)
    extra = extra_s or [0.0] * num_stages
    return np.stack([one + extra[i] for i in range(num_stages)])


def assert_consistent(split: Split, latency: np.ndarray, num_microbatches: int) -> None:
    """The cuts cover every layer, each stage non-empty, and the latencies and step are those
    of the cuts."""
    num_stages, num_layers = latency.shape[0], latency.shape[1] - 1
    assert len(split.bounds) == num_stages + 1
    assert split.bounds[0] == 0 and split.bounds[-1] == num_layers
    assert all(a < b for a, b in itertools.pairwise(split.bounds))
    expected = tuple(latency[i, a, b] for i, (a, b) in enumerate(itertools.pairwise(split.bounds)))
    assert split.latencies_s == expected
    assert all(math.isfinite(t) for t in split.latencies_s)
    step = sum(expected) + (num_microbatches - 1) * max(expected)
    assert split.step_s == pytest.approx(step)
    # The one pipeline step formula, to the last bit (the step composer's).
    assert split.step_s == cost.pipeline_time(expected, num_microbatches=num_microbatches).total_s


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Random integer tenths of a second, about one stage range in six that does not fit."""
    num_layers = draw(st.integers(1, 7))
    num_stages = draw(st.integers(1, num_layers))
    num_microbatches = draw(st.integers(1, 12))
    latency = np.full((num_stages, num_layers + 1, num_layers + 1), np.inf)
    for i in range(num_stages):
        for a in range(num_layers):
            for b in range(a + 1, num_layers + 1):
                tenths = draw(st.integers(-10, 50))
                latency[i, a, b] = tenths / 10 if tenths > 0 else np.inf
    return latency, num_microbatches


@settings(max_examples=300, deadline=None)
@given(instances())
def test_exact_matches_brute_force(instance: tuple[np.ndarray, int]) -> None:
    """Same optimum as brute force, or InfeasibleError exactly when brute force finds none."""
    latency, num_microbatches = instance
    expected = brute_force(latency, num_microbatches)
    if expected is None:
        with pytest.raises(InfeasibleError, match="fits in memory"):
            split_layers(latency, num_microbatches)
        return
    split = split_layers(latency, num_microbatches)
    assert split.step_s == pytest.approx(expected)
    assert_consistent(split, latency, num_microbatches)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_lower_bounds_are_the_step_formula_and_bound_every_cut(
    instance: tuple[np.ndarray, int],
) -> None:
    """The vectorised early-stop floors are :func:`cost.fill_and_drain` of the least sum with
    each bound as the maximum, elementwise to the last bit, and no cut's step (in floating
    point) is below the floor at its own maximum."""
    latency, num_microbatches = instance
    num_stages, num_layers = latency.shape[0], latency.shape[1] - 1
    cuts = [(0, *inner, num_layers)
            for inner in itertools.combinations(range(1, num_layers), num_stages - 1)]
    times = [[float(latency[i, a, b]) for i, (a, b) in enumerate(itertools.pairwise(c))]
             for c in cuts]  # fmt: skip
    times = [t for t in times if all(math.isfinite(x) for x in t)]
    if not times:
        return
    s_min = min(sum(t) for t in times)
    maxima = np.array(sorted({max(t) for t in times}))
    floors = lower_bounds_s(s_min, maxima, num_microbatches=num_microbatches)
    assert floors.tolist() == [
        cost.fill_and_drain(sum_s=s_min, max_s=float(x), num_microbatches=num_microbatches)[0]
        for x in maxima
    ]
    for t in times:
        step = cost.pipeline_time(t, num_microbatches=num_microbatches).total_s
        assert step >= floors[int(np.searchsorted(maxima, max(t)))]


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(1, 4))
def test_max_bounds_is_valid_and_never_better(
    instance: tuple[np.ndarray, int], max_bounds: int
) -> None:
    """A capped scan returns a valid split, no better than the exact one, and runs the dynamic
    program at most once for ``inf``, ``ceil(log2 n)`` times in the binary search (plus once
    for the top candidate) and ``max_bounds`` times in the scan."""
    latency, num_microbatches = instance
    if brute_force(latency, num_microbatches) is None:
        return
    exact = split_layers(latency, num_microbatches)
    capped = split_layers(latency, num_microbatches, max_bounds=max_bounds)
    assert capped.step_s >= exact.step_s - 1e-9
    assert_consistent(capped, latency, num_microbatches)
    candidates = len(np.unique(latency[np.isfinite(latency)]))
    assert capped.bounds_tried <= 2 + math.ceil(math.log2(candidates)) + max_bounds


@pytest.mark.parametrize(
    ("num_microbatches", "bounds", "step_s"),
    [
        (1, (0, 1, 3), 6.0),  # the least sum, 1 + 5
        (2, (0, 1, 3), 11.0),  # 6 + 5 beats 8 + 4
        (3, (0, 2, 3), 16.0),  # 6 + 2 x 5 ties 8 + 2 x 4: the lower bound wins
        (4, (0, 2, 3), 20.0),  # 8 + 3 x 4 beats 6 + 3 x 5
    ],
)
def test_more_microbatches_favour_the_smaller_max(
    num_microbatches: int, bounds: tuple[int, ...], step_s: float
) -> None:
    """Three layers, two stages: cut (1 | 2) costs 1 + 5 s, cut (2 | 1) costs 4 + 4 s. The
    bubble term (B - 1) max t moves the optimum from the least sum to the least max."""
    latency = np.full((2, 4, 4), np.inf)
    latency[0, 0, 1], latency[1, 1, 3] = 1.0, 5.0
    latency[0, 0, 2], latency[1, 2, 3] = 4.0, 4.0
    split = split_layers(latency, num_microbatches)
    assert (split.bounds, split.step_s) == (bounds, step_s)


def test_tie_keeps_the_lower_bound() -> None:
    """Four layers, two stages, two microbatches. Cut 2 (4 + 4 s) is found at bound 4, cut 1
    (2 + 5 s) at bound 5: both step 12 s, and the scan reaches bound 5 because S(inf) + 5 =
    6.5 + 5 < 12 (cut 3, 0.5 + 6 s, is the least sum). The lower bound's cut is kept."""
    latency = np.full((2, 5, 5), np.inf)
    latency[0, 0, 2], latency[1, 2, 4] = 4.0, 4.0
    latency[0, 0, 1], latency[1, 1, 4] = 2.0, 5.0
    latency[0, 0, 3], latency[1, 3, 4] = 0.5, 6.0
    split = split_layers(latency, 2)
    assert (split.bounds, split.step_s) == ((0, 2, 4), 12.0)


def test_expensive_embedding_gets_fewer_layers() -> None:
    """Eight layers of 1 s on four stages; the first stage also carries a 2 s embedding and
    the last a 2 s head. Only stages of 1, 3, 3, 1 layers keep every stage at 3 s: step
    12 + 15 x 3 = 57 s, against 12 + 15 x 4 = 72 s for the even split."""
    latency = per_layer([1.0] * 8, 4, extra_s=[2.0, 0.0, 0.0, 2.0])
    split = split_layers(latency, 16)
    assert split.bounds == (0, 1, 4, 7, 8)
    assert split.latencies_s == (3.0, 3.0, 3.0, 3.0)
    assert split.step_s == 57.0


def test_memory_limit_forces_the_cut() -> None:
    """Six equal layers on two stages with one microbatch would take any cut (the sum is 6 s
    either way), but the first stage fits at most two layers, so 4 layers go last."""
    latency = per_layer([1.0] * 6, 2)
    latency[0, 0, 3:] = np.inf
    split = split_layers(latency, 1)
    assert split.bounds[1] <= 2
    assert split.step_s == 6.0
    assert split.bounds_tried == 1  # one microbatch: S(inf) alone decides


def test_stage_that_fits_nothing_is_infeasible() -> None:
    """A stage with no layer range that fits: the error names it."""
    latency = per_layer([1.0] * 4, 3)
    latency[1] = np.inf
    with pytest.raises(InfeasibleError, match=r"4 layers into 3 stages.*stages \[1\]"):
        split_layers(latency, 4)


def test_no_cut_fits() -> None:
    """Each stage fits some range, but no cut puts them together."""
    latency = np.full((2, 4, 4), np.inf)
    latency[0, 0, 1] = latency[1, 2, 3] = 1.0
    with pytest.raises(InfeasibleError, match="no cut of 3 layers into 2 stages fits"):
        split_layers(latency, 4)


@pytest.mark.parametrize(
    ("latency", "num_microbatches", "max_bounds", "match"),
    [
        (np.ones((2, 4)), 4, None, r"shape \(p, L \+ 1, L \+ 1\).*\(2, 4\)"),
        (np.ones((2, 4, 5)), 4, None, r"got \(2, 4, 5\)"),
        (per_layer([1.0] * 2, 3), 4, None, "3 stages .* 2 layers"),
        (per_layer([1.0] * 4, 2), 0, None, "num_microbatches must be at least 1, got 0"),
        (per_layer([1.0] * 4, 2), 4, 0, "max_bounds must be at least 1.*got 0"),
        (per_layer([1.0, -1.0], 1), 4, None, r"got -1.0 at \[i, a, b\]=\(0, 1, 2\)"),
        (per_layer([1.0, np.nan], 1), 4, None, "got nan"),
    ],
)
def test_validation(latency, num_microbatches, max_bounds, match) -> None:
    """Malformed input is an InputError that shows what was given."""
    with pytest.raises(InputError, match=match):
        split_layers(latency, num_microbatches, max_bounds=max_bounds)


def test_64_stages_of_128_layers() -> None:
    """128 identical 1 s layers on 64 stages: two layers each, 128 + 7 x 2 = 142 s."""
    split = split_layers(per_layer([1.0] * 128, 64), 8)
    assert split.bounds == tuple(range(0, 129, 2))
    assert split.latencies_s == (2.0,) * 64
    assert split.step_s == 142.0
