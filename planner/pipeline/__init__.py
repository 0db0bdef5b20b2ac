"""The inter-operator pass: layers into pipeline stages on submeshes (Alpa's dynamic program)."""

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
    "StageChoice",
    "StageCost",
    "StageCostFn",
    "partition",
    "step_latency_s",
    "submesh_shapes",
]
