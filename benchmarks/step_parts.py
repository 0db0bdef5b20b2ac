"""Which part of the predicted step a family's misses follow: a diagnosis, never a fit.

For every framework family of the runs files (priced as ``planner validate`` prices them), the
median |error| as predicted, then, for each part of the step (compute with the bubble, the
tensor-, pipeline- and data-parallel communication left exposed), the one factor on that part
alone that best explains the family's measured steps (least squares on the relative errors,
the other parts as predicted) and the median |error| it would leave. A part whose factor is
near 1 is not where the family's misses are; one that explains them with a large factor names
the mechanism to look for (a collective slower than the network file says, a cost per kernel
the stack adds). Nothing here is written into a cluster file: a factor fitted to a family's
own runs would tune the model to them, and several parts can explain the same misses.
Run from the repository root (a few seconds):

    python benchmarks/step_parts.py ../shared/validation/deepspeed_runs.json
"""

from __future__ import annotations

import statistics
import sys

import numpy as np

from planner.diagnose.calibration import run_clusters
from planner.diagnose.fit import sized_for
from planner.diagnose.runs import load_runs
from planner.uniform.estimate import estimate

PARTS = {
    "compute": ("compute_s", "pipeline_bubble_s"),
    "TP comm": ("tensor_parallel_comm_s",),
    "PP comm": ("pipeline_comm_s",),
    "DP exposed": ("data_parallel_comm_exposed_s",),
}
"""The step's parts the factors act on, each the sum of :class:`StepTime` fields."""


def main(paths: list[str]) -> None:
    """Print one row per (family, part): the factor and the median |error| it leaves."""
    runs = [r for r in load_runs(*paths) if r.measured_step_time_s]
    clusters = run_clusters(runs, "instances/clusters")
    rows: dict[str, list[tuple[float, float, dict[str, float]]]] = {}
    for run in runs:
        est = estimate(run.model, sized_for(run, clusters[run.cluster_key]), run.config)
        time = est.time.model_dump()
        parts = {name: sum(time[f] for f in fields) for name, fields in PARTS.items()}
        measured = run.measured_step_time_s
        assert measured is not None
        rows.setdefault(f"{run.family} on {run.chip}", []).append(
            (measured, est.step_time_s, parts))
    print("| family | runs | as predicted | part | factor | median \\|error\\| left |")
    print("|---|---:|---:|---|---:|---:|")
    for family, found in rows.items():
        measured = np.array([m for m, _, _ in found])
        predicted = np.array([p for _, p, _ in found])
        before = statistics.median(abs(predicted / measured - 1))
        for name in PARTS:
            part = np.array([parts[name] for _, _, parts in found])
            if not part.any():
                continue
            # Least squares on the relative errors, each run weighed alike whatever its step.
            rest, x = (predicted - part) / measured, part / measured
            # A part cannot take negative time: no factor below 0.
            factor = max(0.0, float(x @ (1 - rest) / (x @ x)))
            left = statistics.median(abs(rest + factor * x - 1))
            print(f"| {family} | {len(found)} | {before:.1%} | {name} | {factor:.2f} | "
                  f"{left:.1%} |")


if __name__ == "__main__":
    main(sys.argv[1:])
