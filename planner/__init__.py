"""planner: an automatic parallelization planner for training large language models.

Load a model and a cluster (the bundled ones are under ``instances/``; a Hugging Face
``config.json`` reads as a model too), here GPT-3 175B on 128 nodes of 8 A100s:

>>> import planner
>>> model = planner.load_model("instances/models/gpt3-175b.json")
>>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=128)
>>> model.num_layers, cluster.num_devices
(96, 1024)

Price one configuration: 8-way tensor and 16-way pipeline parallelism, the devices left over
data parallel. Its step in seconds, whether it fits in the devices' memory (with the default
margin left free) and its peak memory per device in GiB:

>>> e = planner.estimate(model, cluster, planner.ParallelConfig(tp=8, pp=16))
>>> round(e.step_time_s, 2), e.fits, round(e.peak_memory_gib, 1), e.dp
(22.75, True, 61.3, 8)

Search every configuration Megatron-LM launches for the fastest that fits:

>>> plan = planner.solve(model, cluster, planner.SolveOptions(framework="megatron"))
>>> plan.summary()
'TP4 x PP8 x DP32, mbs 1, interleaved 1F1B (v=6), sequence parallel, distributed optimizer'
>>> round(plan.predicted.step_time_s, 2), round(plan.predicted.peak_memory_gib, 1)
(18.03, 62.6)

:func:`explain` says why that plan and not its neighbours; :func:`estimate_batch` prices many
configurations at once.
"""

from planner.diagnose.explain import explain
from planner.diagnose.explanation import Explanation
from planner.errors import (
    ConfigError,
    InfeasibleError,
    InputError,
    InvalidPlanError,
    PlannerError,
    SolverError,
    TimeLimitError,
)
from planner.options import Pins, Progress, SolveOptions
from planner.plan.config import ParallelConfig
from planner.plan.schema import Plan
from planner.search.targets import solve
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import check_cluster, load_cluster, load_model
from planner.uniform.batch import BatchEstimate, estimate_batch
from planner.uniform.estimate import Estimate, estimate

__all__ = [
    "BatchEstimate",
    "ClusterSpec",
    "ConfigError",
    "Estimate",
    "Explanation",
    "InfeasibleError",
    "InputError",
    "InvalidPlanError",
    "ModelSpec",
    "ParallelConfig",
    "Pins",
    "Plan",
    "PlannerError",
    "Progress",
    "SolveOptions",
    "SolverError",
    "TimeLimitError",
    "TrainingSpec",
    "check_cluster",
    "estimate",
    "estimate_batch",
    "explain",
    "load_cluster",
    "load_model",
    "solve",
]
