"""Baselines the search is measured against, priced by the same cost model: the rule of thumb
an experienced Megatron-LM user applies (:func:`heuristic_plan`) and the exhaustive grid over
uniform configurations (:func:`grid_plan`). Both return a :class:`~planner.plan.Plan` and take
the arguments of :func:`planner.solve`."""

from planner.baselines.grid import grid_plan, grid_space
from planner.baselines.heuristic import heuristic_plan

__all__ = ["grid_plan", "grid_space", "heuristic_plan"]
