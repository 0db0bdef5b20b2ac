"""In-sample and out-of-family errors of the calibration, per framework family.

For each chip: fit on all its runs and price them (in sample); then, for each family, fit
without that family's runs and price them (out of family: the honest error for software the fit
has not seen). A knob the remaining runs cannot determine is left uncalibrated, never inherited
from the full fit (``planner.diagnose.fit.without_fits``). Takes ~15 minutes on 2 cores. Run
from the repository root:

    python benchmarks/calibration_families.py ../shared/validation/calibration_runs.json \\
        ../shared/validation/fsdp_runs.json
"""

from __future__ import annotations

import statistics
import sys
import time

from planner.diagnose.calibration import calibrate
from planner.diagnose.runs import load_runs


def _median_abs(errors: list[float]) -> str:
    return f"{100 * statistics.median(abs(e) for e in errors):5.1f} %" if errors else "    -  "


def main(paths: list[str]) -> None:
    """Print one row per (chip, family): runs, in-sample and out-of-family median |error|."""
    runs = load_runs(*paths)
    start = time.perf_counter()
    print(f"{'chip':5s} {'family':9s} {'runs':>4s} {'in sample':>10s} {'out of family':>14s}  "
          f"fit without the family")  # fmt: skip
    for chip in sorted({r.chip for r in runs}):
        families = sorted({r.family for r in runs if r.chip == chip})
        full = calibrate(paths, "instances/clusters", chip=chip)
        for family in families:
            inside = [r.error for r in full.after if r.family == family]
            outside, knobs = [], "no other family to fit on"
            if len(families) > 1:
                held = calibrate(paths, "instances/clusters", chip=chip,
                                 exclude_families=[family])  # fmt: skip
                outside = [r.error for r in held.after if r.family == family]
                knobs = ", ".join(f"{k} {v:g}" for k, v in held.fit.values.items())
            print(f"{chip:5s} {family:9s} {len(inside):4d} {_median_abs(inside):>10s} "
                  f"{_median_abs(outside):>14s}  {knobs}", flush=True)  # fmt: skip
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
