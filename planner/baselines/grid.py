"""The grid baseline: every uniform (Megatron-style) configuration the target framework
launches (:mod:`planner.uniform.space`), priced by :func:`~planner.uniform.estimate.estimate`;
the fastest that fits (:func:`~planner.search.framework.enumerate_plan`) as a plan of method
``"grid"``."""

from __future__ import annotations

from planner.options import DEFAULT_OPTIONS, ProgressFn, SolveOptions
from planner.plan.schema import Plan
from planner.search.framework import enumerate_plan
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.space import grid_space

__all__ = ["grid_plan", "grid_space"]


def grid_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest uniform configuration ``options.framework`` launches that fits, as a plan
    (method ``"grid"``); see :func:`enumerate_plan`."""
    return enumerate_plan(model, cluster, options, progress=progress, method="grid")
