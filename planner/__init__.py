"""planner: an automatic parallelization planner for training large language models.

>>> import planner
>>> model = planner.load_model("instances/models/gpt3-175b.json")  # doctest: +SKIP
>>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json")  # doctest: +SKIP
>>> planner.estimate(model, cluster, planner.ParallelConfig(tp=8, pp=16))  # doctest: +SKIP
>>> planner.solve(model, cluster).summary()  # doctest: +SKIP
'TP1 x PP32 x DP8 x CP4, mbs 1, interleaved 1F1B (v=3), distributed optimizer'
"""

from planner.diagnose.explain import Explanation, explain
from planner.errors import ConfigError, InfeasibleError, InputError, PlannerError, SolverError
from planner.options import Pins, Progress, SolveOptions
from planner.plan.config import ParallelConfig
from planner.plan.schema import Plan
from planner.search.targets import solve
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model
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
    "ModelSpec",
    "ParallelConfig",
    "Pins",
    "Plan",
    "PlannerError",
    "Progress",
    "SolveOptions",
    "SolverError",
    "TrainingSpec",
    "estimate",
    "estimate_batch",
    "explain",
    "load_cluster",
    "load_model",
    "solve",
]
