"""``planner.solve``: the fastest plan the target framework launches.

For a framework (``megatron``, ``mindspeed``, ``deepspeed``, ``colossalai``, ``torchtitan``)
a layer's sharding follows from its degrees, so the search enumerates every uniform
configuration the framework's profile launches, prices each with the one cost model and
keeps the fastest that fits (:func:`planner.uniform.enumerate.enumerate_plan`); for ``any`` it
is the union of those spaces, then the per-operator search (the layer ILP and the stage
dynamic program) bounded by the union's best (:func:`planner.search.superset.solve_any`).
"""

from __future__ import annotations

from planner.frameworks import ANY, check_framework
from planner.options import DEFAULT_OPTIONS, ProgressFn, SolveOptions
from planner.plan.schema import Plan
from planner.search.superset import solve_any
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.enumerate import enumerate_plan


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest plan for ``options.framework`` that fits, with the knobs in
    ``options.pins`` fixed and ``options.memory_margin_gib`` left free on every device.

    Raises :class:`~planner.errors.InputError` for an unknown framework,
    :class:`~planner.errors.InfeasibleError` when nothing fits (naming what would) and
    :class:`~planner.errors.TimeLimitError` when the time limit passes before any plan.
    """
    if check_framework(options.framework) == ANY:
        return solve_any(model, cluster, options, progress=progress)
    return enumerate_plan(model, cluster, options, progress=progress)
