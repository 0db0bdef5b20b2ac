"""The inter-operator pass: layers into pipeline stages on submeshes (Alpa's dynamic program),
the stage costs it needs, and the found pipeline priced and written as a plan."""

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
    "Partition",
    "Split",
    "StageChoice",
    "StageCost",
    "StageCostFn",
    "partition",
    "split_layers",
    "step_latency_s",
    "submesh_shapes",
]
