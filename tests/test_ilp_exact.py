"""The layer ILP against brute force: on small random problems, every backend's optimum equals
the best of all strategy x recomputation x ZeRO combinations that fit the budget, and the
least-memory program finds the least memory."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.ilp import EdgeCosts, LayerProblem, NodeCosts, build_layer_milp, solve_milp
from planner.ilp.bound import least_time_ns, time_only
from planner.ilp.formulation import edge_classes, evaluate_ns, least_memory_kib, memory_kib
from planner.ilp.modes import mode_floors, solve_by_mode
from planner.ilp.prune import prune_dominated
from planner.vocabulary import RECOMPUTE_MODES

BACKENDS = ("ortools", "pulp", "cpsat")


@st.composite
def problems(draw: st.DrawFn) -> LayerProblem:
    """2-4 nodes of 1-4 strategies, random edges (a chain plus extras), random costs."""
    n = draw(st.integers(2, 4))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    cost = st.integers(0, 1000)

    def vec(k: int) -> tuple[int, ...]:
        return tuple(draw(cost) for _ in range(k))

    modes = draw(st.sampled_from([("none",), RECOMPUTE_MODES, ("none", "full"), ("full",),
                                  ("selective",)]))  # fmt: skip
    stages = draw(st.sampled_from([(0,), (0, 1, 2, 3), (1, 3)]))
    nodes = tuple(
        NodeCosts(
            name=f"n{v}", strategies=tuple(f"s{i}" for i in range(k)), time_ns=vec(k),
            forward_ns=vec(k), attention_ns=vec(k),
            activation_kib={m: vec(k) for m in RECOMPUTE_MODES},
            state_kib=tuple(vec(k) for _ in range(4)), sync_ns=tuple(vec(k) for _ in range(4)),
        )
        for v, k in enumerate(sizes)
    )  # fmt: skip
    pairs = [(v, v + 1) for v in range(n - 1)]
    extra = [p for p in itertools.permutations(range(n), 2) if p not in pairs]
    pairs += [p for p in extra if draw(st.booleans())]
    edges = tuple(
        EdgeCosts(src=f"n{u}", dst=f"n{v}",
                  cost_ns=tuple(vec(sizes[v]) for _ in range(sizes[u])),
                  forward_ns=tuple(vec(sizes[v]) for _ in range(sizes[u])))
        for u, v in pairs
    )  # fmt: skip
    budget = draw(st.one_of(st.none(), st.integers(0, 4000)))
    return LayerProblem(nodes=nodes, edges=edges, recompute_modes=modes, zero_stages=stages,
                        budget_kib=budget)


def brute_force(problem: LayerProblem) -> tuple[int | None, int]:
    """(least objective within the budget or None, least memory of any combination)."""
    best, least = None, None
    ranges = [range(len(node.strategies)) for node in problem.nodes]
    for chosen in itertools.product(*ranges):
        for mode in problem.recompute_modes:
            for stage in problem.zero_stages:
                memory = memory_kib(problem, chosen, mode, stage)
                least = memory if least is None else min(least, memory)
                if problem.budget_kib is not None and memory > problem.budget_kib:
                    continue
                value = evaluate_ns(problem, chosen, mode, stage)
                best = value if best is None else min(best, value)
    assert least is not None
    return best, least


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_backend_matches_brute_force(problem: LayerProblem) -> None:
    """Optimal objective (or infeasibility) and least memory equal brute force."""
    best, least = brute_force(problem)
    for backend in BACKENDS:
        result = solve_milp(build_layer_milp(problem), backend=backend, time_limit_s=30)
        if best is None:
            assert result.report.status == "infeasible", backend
        else:
            assert result.report.status == "optimal", backend
            assert round(result.report.objective) == best, backend  # integral costs
            assert result.report.gap == 0
        memory = solve_milp(build_layer_milp(problem, minimise_memory=True),
                            backend=backend, time_limit_s=30)  # fmt: skip
        assert round(memory.report.objective) == least, backend
    assert min(least_memory_kib(problem).values()) == least  # what skips infeasible solves


def _with_equal_rows_and_columns(problem: LayerProblem) -> LayerProblem:
    """``problem`` with each edge's last row a copy of its first and its last column a copy of
    its first (in both matrices): strategies that share an edge class."""

    def repeated(matrix: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        rows = [*matrix[:-1], matrix[0]]
        return tuple((*row[:-1], row[0]) for row in rows)

    edges = tuple(replace(e, cost_ns=repeated(e.cost_ns), forward_ns=repeated(e.forward_ns))
                  for e in problem.edges)  # fmt: skip
    return replace(problem, edges=edges)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_edge_classes_keep_the_optimum(problem: LayerProblem) -> None:
    """Strategies with equal rows (columns) of an edge share its variables (one class fewer
    on each side where there are two or more), and the optimum is still brute force's."""
    shared = _with_equal_rows_and_columns(problem)
    for edge in shared.edges:
        rows, cols = edge_classes(edge)
        assert len(set(rows)) <= max(1, len(rows) - 1) and len(set(cols)) <= max(1, len(cols) - 1)
    best, _ = brute_force(shared)
    result = solve_milp(build_layer_milp(shared), backend="ortools", time_limit_s=30)
    if best is None:
        assert result.report.status == "infeasible"
    else:
        assert round(result.report.objective) == best


@settings(max_examples=40, deadline=None)
@given(problems())
def test_pruning_keeps_the_optimum(problem: LayerProblem) -> None:
    """Dominance pruning never changes the optimum or the least memory."""
    pruned, kept = prune_dominated(problem)
    assert brute_force(pruned) == brute_force(problem)
    assert all(len(k) >= 1 for k in kept)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_time_bound_is_below_every_choice(problem: LayerProblem) -> None:
    """The LP bound the search prunes with is at most the time (no rerun, no sync) of every
    choice of strategies, whatever the budget, recomputation and ZeRO stage."""
    bound = least_time_ns(problem)
    plain = time_only(problem)
    ranges = [range(len(node.strategies)) for node in problem.nodes]
    least = min(evaluate_ns(plain, chosen, "none", 0) for chosen in itertools.product(*ranges))
    assert bound <= least


@settings(max_examples=40, deadline=None)
@given(problems())
def test_solving_mode_by_mode_finds_the_joint_optimum(problem: LayerProblem) -> None:
    """Each recomputation mode solved apart, a mode skipped when its floor reaches the best
    time found, gives brute force's optimum (or infeasibility), with both kinds of floors:
    the LP relaxation of each mode's program, and the optimum without recomputation or
    budget plus each node's and edge's least rerun."""
    best, _ = brute_force(problem)
    free = replace(problem, recompute_modes=("none",), budget_kib=None)
    fastest = solve_milp(build_layer_milp(free), backend="ortools", time_limit_s=30)
    for floors in (mode_floors(problem),
                   mode_floors(problem, fastest_ns=fastest.report.objective)):  # fmt: skip
        assert all(floors[m] <= v for m, v in _mode_optima(problem).items())
        result = solve_by_mode(problem, floors, lambda milp: solve_milp(
            milp, backend="ortools", time_limit_s=30))  # fmt: skip
        if best is None:
            assert result.report.status == "infeasible"
        else:
            assert result.report.status == "optimal"
            assert round(result.report.objective) == best


def _mode_optima(problem: LayerProblem) -> dict[str, int]:
    """Each mode's optimum without a budget, by brute force."""
    ranges = [range(len(node.strategies)) for node in problem.nodes]
    return {mode: min(evaluate_ns(problem, chosen, mode, stage)
                      for chosen in itertools.product(*ranges) for stage in problem.zero_stages)
            for mode in problem.recompute_modes}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=4), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 100), min_size=4, max_size=4), min_size=n, max_size=n),
    st.integers(0, 400))))
def test_fitting_time_bound_is_below_every_choice_that_fits(
    case: tuple[list[list[int]], list[list[int]], int],
) -> None:
    """The Lagrangian bound the search drops candidates with (a stage's layers must fit) is
    at most the time of every choice of one strategy a node whose memory fits the budget,
    and infinite exactly when none fits."""
    from planner.ilp.bound import fitting_time_bound

    rows, memory, budget = case
    width = max(len(r) for r in rows)
    times = np.array([r + [np.inf] * (width - len(r)) for r in rows], dtype=float)
    held = np.array([m[:width] for m in memory], dtype=float)
    fitting = [sum(times[v, i] for v, i in enumerate(chosen))
               for chosen in itertools.product(*(range(len(r)) for r in rows))
               if sum(held[v, i] for v, i in enumerate(chosen)) <= budget]  # fmt: skip
    bound = fitting_time_bound(times, held, float(budget))
    if not fitting:
        assert bound == float("inf")
    else:
        assert bound <= min(fitting) + 1e-9
