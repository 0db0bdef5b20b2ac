"""Solving a budgeted layer program one recomputation mode at a time.

A program that chooses among recomputation modes carries the product of every strategy with
every mode, and under full recomputation of every edge pair too; with the mode fixed, its
rerun time and memory sit on the strategy and edge variables themselves
(:func:`planner.ilp.formulation.build_layer_milp`), half the variables. Under a tight budget
CBC takes several times longer on the joint program than on the fixed ones together: on
DeepSeek-V3's MoE layer on a 2x8 mesh at 16 sequences, at 1.4 times its least memory, 5.3 s
against 0.6 s for no recomputation and 0.7 s for selective (full skipped), and at looser
budgets 0.7 s against 0.3 s. The least of the modes' optima is the joint optimum; a mode is
skipped when its floor (:func:`mode_floors`) already reaches the best time found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from planner.ilp.backends import MilpSolution, SolverReport, relaxation_bound
from planner.ilp.formulation import LayerProblem, build_layer_milp, least_memory_kib, rerun_ns
from planner.ilp.milp import Milp


def mode_floors(problem: LayerProblem, *, fastest_ns: float | None = None) -> dict[str, float]:
    """Each recomputation mode's floor: a lower bound on the layer's time with that mode,
    whatever the budget. With ``fastest_ns``, the layer's optimum without a budget and without
    recomputation: a mode's time is a choice's time without recomputation plus its reruns,
    so its floor is that optimum plus each node's and each edge's least rerun (no solve);
    without, the LP relaxation of each mode's program without a budget."""
    floors = {}
    for mode in problem.recompute_modes:
        if fastest_ns is None:
            alone = replace(problem, recompute_modes=(mode,), budget_kib=None)
            value = relaxation_bound(build_layer_milp(alone))
            floors[mode] = float("-inf") if value is None else value * (1 - 1e-9)
            continue
        rerun = sum(min(rerun_ns(n, mode)) for n in problem.nodes)
        if mode == "full":
            rerun += sum(min(min(row) for row in e.forward_ns) for e in problem.edges)
        floors[mode] = (fastest_ns + rerun) * (1 - 1e-9)
    return floors


def solve_by_mode(
    problem: LayerProblem, floors: Mapping[str, float], solve: Callable[[Milp], MilpSolution]
) -> MilpSolution:
    """``problem``'s optimum, found by solving each recomputation mode's program apart with
    ``solve`` (lowest floor first, skipping a mode whose floor reaches the best time found),
    as one solution of the joint program: every mode's choice variable is set, the report
    adds up the solves' time and is optimal only when every solve was. A mode whose least
    memory (:func:`least_memory_kib`) is over the budget is not solved, unless no mode is
    under it (the leanest is then solved, to prove it)."""
    best: MilpSolution | None = None
    solved: list[SolverReport] = []
    least = least_memory_kib(problem)
    budget = problem.budget_kib
    fitting = [m for m in problem.recompute_modes if budget is None or least[m] <= budget]
    for mode in sorted(fitting or [min(least, key=least.__getitem__)], key=lambda m: floors[m]):
        if best is not None and floors[mode] >= (best.report.objective or 0.0):
            continue
        result = solve(build_layer_milp(replace(problem, recompute_modes=(mode,))))
        solved.append(result.report)
        found = result.report.objective
        if found is not None and (best is None or found < (best.report.objective or 0.0)):
            best = result
    wall = sum(r.wall_s for r in solved)
    size = max(solved, key=lambda r: r.num_variables)
    if best is None:
        status = "infeasible" if all(r.status == "infeasible" for r in solved) else "timed_out"
        report = replace(size, status=status, objective=None, bound=None, gap=None, wall_s=wall)
        return MilpSolution(report=report, values={})
    proven = all(r.status in ("optimal", "infeasible") for r in solved)
    bounds = [r.bound for r in solved if r.bound is not None]
    objective = best.report.objective
    bound = objective if proven else min(bounds, default=None)
    gap = None if bound is None or objective is None else (
        abs(objective - bound) / max(abs(objective), 1e-9))  # fmt: skip
    report = replace(best.report, status="optimal" if proven else "feasible", bound=bound,
                     gap=gap, wall_s=wall, num_variables=size.num_variables,
                     num_constraints=size.num_constraints)  # fmt: skip
    values = {f"recompute_{m}": 0 for m in problem.recompute_modes} | best.values
    return MilpSolution(report=report, values=values)
