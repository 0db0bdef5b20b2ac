"""The ``any`` target: a plan never slower than any framework's on the same problem.

``any`` is the yardstick that says what the frameworks' rules cost, so its space must hold
every framework's plan. It is searched in two steps:

1. the union of the framework targets' uniform spaces (:func:`~planner.search.framework.
   enumerate_plan` with no framework's rules: every configuration of
   :mod:`planner.uniform.space` with the zero-bubble schedules, the fewest recomputed layers
   and every offload), priced by the one cost model. A framework's configuration differs
   from its union twin only in the overlap flags its rules fix, which change no memory and
   never slow a step; so the union's best is no slower than any framework's best. It is the
   incumbent;
2. the per-operator search (the layer ILPs and the stage DP,
   :func:`planner.search.per_operator.search`) bounded by the incumbent's step: candidates
   whose lower bound reaches it are not searched, which is most of them, and only a plan
   strictly faster replaces the incumbent.

With ``options.objective`` a quantile, the two are compared at the slow ends of their bands
(:mod:`planner.cost.risk`); inside the per-operator search, whose dynamic program compares
stages, not plans, candidates are still ranked by their predicted step.
"""

from __future__ import annotations

import time
from dataclasses import replace

from planner.cost.risk import objective_s
from planner.errors import ConfigError, InfeasibleError, TimeLimitError
from planner.frameworks import ANY
from planner.options import ProgressFn, SolveOptions
from planner.plan.schema import Plan
from planner.search import per_operator
from planner.search.framework import enumerate_plan
from planner.spec import ClusterSpec, ModelSpec


def solve_any(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The faster of the union of the frameworks' spaces and the per-operator search bounded
    by it, as a plan for ``any``; the solver summary counts both searches' configurations
    and time.

    Raises :class:`~planner.errors.InfeasibleError` (the per-operator search's message, the
    least memory any plan needs) when nothing fits and :class:`~planner.errors.TimeLimitError`
    when the time limit passes before any plan."""
    started = time.perf_counter()
    union = replace(options, framework=ANY)
    try:
        incumbent: Plan | None = enumerate_plan(model, cluster, union, progress=progress)
    except (InfeasibleError, ConfigError, TimeLimitError):
        incumbent = None  # the per-operator search says why, or finds what the union cannot
    left_s = None
    if options.time_limit_s is not None:
        left_s = max(0.0, options.time_limit_s - (time.perf_counter() - started))
    # Ranked by a band's slow end, the incumbent still bounds the search: no plan's band has a
    # negative width, so a plan whose step is no faster than the incumbent's objective loses.
    incumbent_s = None if incumbent is None else _objective_s(incumbent, options)
    found = per_operator.search(model, cluster, replace(union, time_limit_s=left_s),
                        incumbent_s=incumbent_s, progress=progress)  # fmt: skip
    best = min((p for p in (found.plan, incumbent) if p is not None),
               key=lambda p: _objective_s(p, options))  # fmt: skip
    priced = 0 if incumbent is None else incumbent.solver.configurations
    solver = best.solver.model_copy(update={
        "time_s": time.perf_counter() - started,
        "configurations": priced + found.searched,
        "objective": _objective_s(best, options), "ranked_by": options.objective,
    })  # fmt: skip
    if incumbent is not None and incumbent.solver.status == "time_limit":
        # The union was cut: it has no bound on what it did not price.
        solver = solver.model_copy(update={"status": "time_limit", "gap": None})
    elif found.cut_bound_s is not None:
        gap = max(0.0, 1 - found.cut_bound_s / best.predicted.step_time_s)
        solver = solver.model_copy(update={"status": "time_limit", "gap": gap})
    return best.model_copy(update={"solver": solver})


def _objective_s(plan: Plan, options: SolveOptions) -> float:
    """The step ``options.objective`` ranks ``plan`` by (:func:`planner.cost.risk.objective_s`)."""
    return objective_s(plan.predicted.step_time_s, plan.predicted.error_band, options.objective)
