"""Do the error bands hold what they claim? Leave-one-family-out coverage of the p80 and p95
bands on the shared runs.

For each chip and each framework family of its runs, the family's runs are banded from the
other families' runs alone (:func:`planner.diagnose.coverage.held_out`), and the table counts
how many fall inside. ``--refit`` also refits the chip's efficiencies without the family
(``planner calibrate --exclude-family``), so that its errors are out of family too: the honest
test of fit and band together (a few minutes a chip on 2 cores). Prints the allowance for
exposed communication and the widening per unit of distance the folds call for
(:func:`~planner.diagnose.coverage.fit_bands`, the values
:data:`planner.cost.uncertainty.COMMUNICATION` and :data:`~planner.cost.uncertainty.WIDENING`
hold), the coverage at the bundled values, the coverage with each family's allowance and
widening fitted without it (nested), the coverage of bands near the evidence (each run
left out alone, its family's other runs kept), how each family's misses follow the share
of its step priced as exposed communication, what the allowance rests on, and whether the runs
that executed above every other family's highest rate are missed more (what would make a rate
above the evidence widen a band). Run from the
repository root:

    python benchmarks/band_coverage.py ../shared/validation/calibration_runs.json \\
        ../shared/validation/fsdp_runs.json ../shared/validation/deepspeed_runs.json \\
        ../shared/validation/h100/runs_one_gpu.json [--refit]

Without files, those four.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from planner.cost.uncertainty import COMMUNICATION, WIDENING
from planner.diagnose.calibration import calibrate, validate
from planner.diagnose.coverage import (
    Coverage,
    HeldOut,
    coverage,
    fit_bands,
    held_out,
    held_out_runs,
    nested_coverage,
)
from planner.diagnose.evidence import validated_runs
from planner.diagnose.runs import DEVICES

CLUSTERS = "instances/clusters"
SHARED_RUNS = [f"../shared/validation/{name}" for name in (
    "calibration_runs.json", "fsdp_runs.json", "deepspeed_runs.json",
    "h100/runs_one_gpu.json")]  # fmt: skip
"""The shared validation files, what the README's coverage table is printed from."""


def _held(paths: list[str], refit: bool) -> list[HeldOut]:
    """Every run banded with its family left out, its error from the bundled calibration or,
    with ``refit``, from a fit without its family."""
    rows = validate(paths, CLUSTERS).rows
    out: list[HeldOut] = []
    for chip in sorted({DEVICES[r.device].chip for r in rows}):
        mine = validated_runs([r for r in rows if DEVICES[r.device].chip == chip])
        families = sorted({r.family for r in mine})
        if not refit or len(families) == 1:
            out += held_out(chip, mine)
            continue
        for family in families:
            fit = calibrate(paths, CLUSTERS, chip=chip, exclude_families=[family])
            out += held_out(chip, validated_runs(fit.after), [family])
    return out


def _files(paths: list[str]) -> dict[str, str]:
    """Each run's shared file."""
    return {row.id: Path(p).name for p in paths for row in validate([p], CLUSTERS).rows}


def _table(title: str, rows: list[Coverage], held: list[HeldOut], files: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"{'chip':5s} {'family':9s} {'file':22s} {'runs':>4s} {'p80 in':>7s} {'p95 in':>7s} "
          f"{'median p80 band':>16s}")  # fmt: skip
    for c in rows:
        file = next(files[h.id] for h in held if (h.chip, h.family) == (c.chip, c.family))
        print(f"{c.chip:5s} {c.family:9s} {file:22s} {c.runs:4d} {100 * c.inside[0.8]:6.0f}% "
              f"{100 * c.inside[0.95]:6.0f}% {100 * c.median_band:15.1f}%")  # fmt: skip
    runs = sum(c.runs for c in rows)
    pooled = {q: sum(c.inside[q] * c.runs for c in rows) / runs for q in (0.8, 0.95)}
    folds = {q: statistics.fmean(c.inside[q] for c in rows) for q in (0.8, 0.95)}
    print(f"{'all':5s} {'runs':9s} {'':22s} {runs:4d} {100 * pooled[0.8]:6.0f}% "
          f"{100 * pooled[0.95]:6.0f}%")  # fmt: skip
    print(f"{'all':5s} {'families':9s} {'(mean of folds)':22s} {len(rows):4d} "
          f"{100 * folds[0.8]:6.0f}% {100 * folds[0.95]:6.0f}%")  # fmt: skip


def main(argv: list[str]) -> None:
    """Print the fitted widening and the coverage tables."""
    refit = "--refit" in argv
    paths = [a for a in argv if a != "--refit"] or SHARED_RUNS
    start = time.perf_counter()
    held = _held(paths, refit)
    files = _files(paths)
    communication, widening = fit_bands(held)

    def both(c: dict[float, float], w: dict[float, float]) -> str:
        return ", ".join(f"p{round(100 * q)} {c[q]:g} and {w[q]:g}" for q in w)

    print(f"errors {'out of family (refit)' if refit else 'from the bundled calibration'}; "
          "allowance for exposed communication and widening per unit of distance fitted on "
          f"all folds: {both(communication, widening)}; bundled: "
          f"{both(COMMUNICATION, WIDENING)}")
    _table("coverage at the bundled widening", coverage(held), held, files)
    _table("coverage, each family's allowance and widening fitted without it (nested)",
           nested_coverage(held), held, files)  # fmt: skip
    rows = validate(paths, CLUSTERS).rows
    near = [h for chip in sorted({DEVICES[r.device].chip for r in rows})
            for h in held_out_runs(chip, validated_runs(
                [r for r in rows if DEVICES[r.device].chip == chip]))]  # fmt: skip
    _table("coverage, each run left out alone (its family's other runs kept; bundled fit)",
           coverage(near), near, files)  # fmt: skip
    _exposed(held)
    _above(held, {r.id: r.hfu for r in validated_runs(rows)})
    print(f"\n{time.perf_counter() - start:.0f} s")


def _exposed(held: list[HeldOut]) -> None:
    """What the allowance rests on: per family, how its runs' misses follow the share of
    their step priced as exposed communication (the runs split at the family's median share;
    Spearman's rank correlation of share and |error|)."""
    print("\nmisses against exposed communication (the errors above)")
    print(f"{'chip':5s} {'family':9s} {'runs':>4s} {'exposed':>11s} {'median |error|':>21s} "
          f"{'rank corr':>9s}")  # fmt: skip
    print(f"{'':5s} {'':9s} {'':4s} {'':11s} {'lower half':>10s} {'upper':>10s}")
    folds: dict[tuple[str, str], list[HeldOut]] = {}
    for h in held:
        folds.setdefault((h.chip, h.family), []).append(h)
    for (chip, family), fold in sorted(folds.items()):
        share = np.array([h.communication_share for h in fold])
        error = np.abs([h.error for h in fold])
        low = share <= np.median(share)
        span = f"{100 * share.min():.0f}-{100 * share.max():.0f} %"
        upper = f"{100 * np.median(error[~low]):9.1f}%" if (~low).any() else f"{'-':>10s}"
        corr = (f"{spearmanr(share, error).statistic:+9.2f}"
                if share.std() > 0 else f"{'-':>9s}")  # fmt: skip
        print(f"{chip:5s} {family:9s} {len(fold):4d} {span:>11s} "
              f"{100 * np.median(error[low]):9.1f}% {upper} {corr}")  # fmt: skip


def _above(held: list[HeldOut], hfu: dict[str, float | None]) -> None:
    """Whether a rate above the evidence is missed more, which would call for the flag of
    :func:`planner.cost.uncertainty.utilization_above` to widen the band: per family, its runs
    that executed above every other family's highest hardware FLOPs utilisation on the chip
    (measured: the FLOPs over the measured step, whatever the fit) against the rest."""
    print("\nruns above the other families' highest hardware FLOPs utilisation (errors above)")
    print(f"{'chip':5s} {'family':9s} {'highest':>7s} {'':6s} {'runs':>4s} "
          f"{'median |error|':>14s} {'inside p80':>10s}")  # fmt: skip
    for chip, family in sorted({(h.chip, h.family) for h in held}):
        rest = [hfu[h.id] or 0.0 for h in held if h.chip == chip and h.family != family]
        if not rest:
            continue
        best = max(rest)
        fold = [h for h in held if (h.chip, h.family) == (chip, family)]
        for name, group in (("above", [h for h in fold if (hfu[h.id] or 0.0) > best]),
                            ("within", [h for h in fold if (hfu[h.id] or 0.0) <= best])):
            if group:
                inside = sum(h.inside(0.8) for h in group)
                print(f"{chip:5s} {family:9s} {100 * best:6.1f}% {name:6s} {len(group):4d} "
                      f"{100 * statistics.median(abs(h.error) for h in group):13.1f}% "
                      f"{inside:>4d} of {len(group):<3d}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
