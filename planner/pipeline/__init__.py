"""The inter-operator pass: layers into pipeline stages on submeshes (Alpa's dynamic program),
the stage costs it needs, the found pipeline priced and written as a plan, and the
event-driven simulator of its schedule."""

from planner.pipeline.simulate import (
    Event,
    Simulation,
    StageDurations,
    simulate,
    simulate_plan,
)
from planner.pipeline.split import Split, split_layers
from planner.pipeline.stages import (
    Partition,
    StageChoice,
    StageCost,
    StageCostFn,
    partition,
    step_latency_s,
    submesh_shapes,
)

__all__ = [
    "Event",
    "Partition",
    "Simulation",
    "Split",
    "StageChoice",
    "StageCost",
    "StageCostFn",
    "StageDurations",
    "partition",
    "simulate",
    "simulate_plan",
    "split_layers",
    "step_latency_s",
    "submesh_shapes",
]
