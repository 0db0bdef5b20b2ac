"""Fuzzing the search with small valid problems: every solve gives a plan that keeps the
invariants or a PlannerError, never another exception (the longer run is
``benchmarks/fuzz_solve.py``)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from planner.errors import InfeasibleError
from planner.spec import ClusterSpec, ModelSpec
from tests.valid_problems import clusters, models, solve_checked

CI_CASES = 25
"""Enough to reach dense and MoE models, infeasible memories and multi-node clusters with the
seed below (measured: about 20 s in all)."""


@settings(max_examples=CI_CASES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(models(), clusters())
def test_solve_gives_a_valid_plan_or_a_planner_error(
    model: ModelSpec, cluster: ClusterSpec
) -> None:
    """The property itself is in :func:`tests.valid_problems.solve_checked`; an infeasible
    problem must also say how much memory a plan needs."""
    result = solve_checked(model, cluster)
    if isinstance(result, InfeasibleError):
        assert "GiB" in str(result)
