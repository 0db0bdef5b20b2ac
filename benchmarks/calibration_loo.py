"""Leave-one-out check of the calibration: fit each device's GEMM efficiency on all its
published runs but one, predict the one left out, and print the table.

The in-sample fit (`planner validate`) flatters the cost model; this is the honest error for a
run the fit has not seen. Run from the repository root:

    python benchmarks/calibration_loo.py ../shared/validation/calibration_runs.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from planner.diagnose.calibration import (
    BUNDLED_CLUSTERS,
    fit_gemm_efficiency,
    load_runs,
    predict_s,
    with_gemm_efficiency,
)
from planner.spec.reading import load_cluster


def main(runs_path: str) -> None:
    """Print one row per run: measured, in-sample and leave-one-out predictions."""
    runs = load_runs(runs_path)
    print(f"{'run':40s} {'measured s':>10s} {'in-sample':>10s} {'left out':>10s} {'error':>8s}")
    errors: dict[str, list[float]] = {}
    start = time.perf_counter()
    for gpu, file in BUNDLED_CLUSTERS.items():
        cluster = load_cluster(Path("instances/clusters") / file)
        mine = [r for r in runs if r.device == gpu]
        for held_out in mine:
            rest = [r for r in mine if r is not held_out]
            gemm, _ = fit_gemm_efficiency(rest, cluster)
            loo = predict_s(held_out, with_gemm_efficiency(cluster, gemm))
            fitted = predict_s(held_out, cluster)
            err = loo / held_out.measured_step_time_s - 1
            errors.setdefault(gpu, []).append(abs(err))
            print(f"{held_out.id:40s} {held_out.measured_step_time_s:10.2f} {fitted:10.2f} "
                  f"{loo:10.2f} {100 * err:+7.1f}%", flush=True)  # fmt: skip
    for gpu, errs in errors.items():
        print(f"{gpu}: leave-one-out median |error| {100 * statistics.median(errs):.1f} %, "
              f"max {100 * max(errs):.1f} % over {len(errs)} runs")  # fmt: skip
    every = [e for errs in errors.values() for e in errs]
    print(f"all: median {100 * statistics.median(every):.1f} %, max {100 * max(every):.1f} %; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/calibration_runs.json")
