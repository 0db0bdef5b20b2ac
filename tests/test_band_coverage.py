"""Leave one family out, band its runs from the others, count who falls inside: the check of
the error bands (planner.diagnose.coverage), pinned on runs written here with known answers
and the fit of the widening against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from planner.cost.uncertainty import COMMUNICATION, NEAREST, WIDENING, distance
from planner.diagnose.coverage import (
    COMMUNICATION_GRID,
    coverage,
    fit_bands,
    fit_widening,
    held_out,
    held_out_runs,
    nested_coverage,
)
from planner.spec import ValidatedRun


def _run(family: str, error: float, i: int, **regime: object) -> ValidatedRun:
    base = {"stack": "megatron-te", "seq_length": 2048, "num_devices": 64, "network_gb_s": 46.0,
            "gflop_per_token": 10.0}  # fmt: skip
    return ValidatedRun(**(base | regime), id=f"{family}{i}", family=family, error=error,
                        mfu=0.4)  # fmt: skip


def _families(seed: int) -> list[ValidatedRun]:
    """Three families on three stacks, each with its own spread of errors."""
    rng = np.random.default_rng(seed)
    runs = []
    for family, stack, scale in (("megatron", "megatron-te", 0.02), ("fsdp", "composer-fsdp", 0.08),
                                 ("deepspeed", "megatron-deepspeed", 0.15)):  # fmt: skip
        runs += [_run(family, float(rng.normal(0, scale)), i, stack=stack,
                      seq_length=int(2 ** rng.integers(10, 15)))
                 for i in range(12)]  # fmt: skip
    return runs


def test_a_held_out_run_rests_on_other_families_only() -> None:
    """Each held-out run's nearest runs are of other families, the nearest of them."""
    runs = _families(1)
    held = held_out("A100", runs)
    assert len(held) == len(runs)
    for h in held:
        others = [r for r in runs if r.family != h.family]
        assert {r.family for r in h.nearest.runs}.isdisjoint({h.family})
        mine = next(r for r in runs if r.id == h.id)
        far = max(distance(mine, r) for r in h.nearest.runs)
        assert all(distance(mine, r) >= far - 1e-12 for r in others if r not in h.nearest.runs)
    assert held_out("A100", [r for r in runs if r.family == "fsdp"]) == []


def test_leaving_one_run_out_keeps_its_family() -> None:
    """Near the evidence: a run banded from every other run, its family's included."""
    runs = _families(2)
    held = held_out_runs("A100", runs)
    assert [h.id for h in held] == [r.id for r in runs]
    assert all(h.id not in {r.id for r in h.nearest.runs} for h in held)
    assert all(h.family in {r.family for r in h.nearest.runs} for h in held)


@pytest.mark.parametrize("quantile", [0.8, 0.95])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_the_fitted_widening_is_the_least_that_reaches_the_quantile(
    seed: int, quantile: float
) -> None:
    """Brute force over a fine grid: below the fitted widening the folds' mean coverage is
    under the quantile, at it at or above."""
    held = held_out("A100", _families(seed))
    slope = fit_widening(held, quantile)

    def mean_coverage(s: float) -> float:
        return float(np.mean([c.inside[quantile] for c in coverage(held, {0.8: s, 0.95: s})]))

    assert mean_coverage(slope + 1e-4) >= quantile
    below = [s for s in np.arange(0, slope, 1e-3) if s < slope - 1e-4]
    assert all(mean_coverage(s) < quantile for s in below)


def test_coverage_counts_who_falls_inside() -> None:
    """Two families on two stacks at distance 2: with no widening, a run is inside exactly
    when its |error| is at most the 80th percentile of the other family's five nearest."""
    quiet = [_run("a", e, i) for i, e in enumerate((0.01, -0.01, 0.02, -0.02, 0.01))]
    loud = [_run("b", e, i, stack="hf-eager") for i, e in enumerate((0.3, 0.01, -0.015, 0.5, 0.0))]
    held = held_out("X", quiet + loud)
    rows = {c.family: c for c in coverage(held, {0.8: 0.0, 0.95: 0.0})}
    spread_of_a = np.percentile(np.abs([0.01, -0.01, 0.02, -0.02, 0.01]), 80)
    assert rows["b"].inside[0.8] == pytest.approx(
        np.mean([abs(e) <= spread_of_a for e in (0.3, 0.01, -0.015, 0.5, 0.0)]))
    assert rows["a"].inside[0.8] == 1.0  # b's spread covers a's small errors
    assert rows["a"].runs == rows["b"].runs == NEAREST
    assert rows["b"].median_band == pytest.approx(spread_of_a)


def _exposed_families(seed: int) -> list[ValidatedRun]:
    """Three families whose misses grow with their step's exposed communication, one of them
    with none exposed and small misses."""
    rng = np.random.default_rng(seed)
    runs = []
    for family, stack, exposed in (("megatron", "megatron-te", 0.1),
                                   ("deepspeed", "megatron-deepspeed", 0.3),
                                   ("pytorch", "hf-eager", 0.0)):  # fmt: skip
        for i in range(10):
            share = float(rng.uniform(0, 2 * exposed))
            error = float(rng.normal(0, 0.02) + rng.choice([-1, 1]) * share * rng.uniform(0, 1))
            runs.append(_run(family, error, i, stack=stack, communication_share=share))
    return runs


@pytest.mark.parametrize("seed", [7, 8])
def test_the_fitted_allowance_spreads_the_folds_least(seed: int) -> None:
    """Brute force over the grid: the widening is fit_widening's without an allowance, and at
    each quantile no allowance keeping the folds' mean coverage at the quantile puts their
    coverage closer about it than the fitted one; the 0.95 one is not below the 0.8 one."""
    held = held_out("A100", _exposed_families(seed))
    communication, widening = fit_bands(held)
    assert communication[0.95] >= communication[0.8] > 0

    def inside(q: float, c: float) -> list[float]:
        rows = coverage(held, {**WIDENING, q: widening[q]}, {**COMMUNICATION, q: c})
        return [row.inside[q] for row in rows]

    for q in WIDENING:
        assert widening[q] == fit_widening(held, q, {q: 0.0})
        floor = communication[0.8] if q == 0.95 else 0.0
        fitted = inside(q, communication[q])
        assert np.mean(fitted) >= q
        best = sum((x - q) ** 2 for x in fitted)
        for c in (c for c in COMMUNICATION_GRID if c >= floor):
            rows = inside(q, c)
            assert np.mean(rows) < q or best <= sum((x - q) ** 2 for x in rows) + 1e-12, c


def test_nested_coverage_fits_each_fold_without_it() -> None:
    """Each fold is judged by the allowance and widening the other folds alone call for."""
    held = held_out("A100", _exposed_families(6))
    nested = {c.family: c for c in nested_coverage(held)}
    for family, c in nested.items():
        rest = [h for h in held if h.family != family]
        communication, widening = fit_bands(rest)
        (expected,) = coverage([h for h in held if h.family == family], widening,
                               communication)  # fmt: skip
        assert c == expected
