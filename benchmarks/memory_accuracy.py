"""The memory model against what devices measured and what published runs did: the table
issue 27's targets are read from.

1. Every layer measurement of ``../shared/validation/h100/layers.jsonl`` (one Hugging Face
   Llama layer, eager and compiled, whole and tensor-parallel shards; the LM head and its
   loss): predicted vs measured bytes (:mod:`planner.diagnose.layer_memory`). Target: 10 %.
2. Every whole step that measured its peak (``../shared/validation/h100/runs_one_gpu.json``):
   allocated and reserved, predicted vs measured (``planner validate``'s rows). Targets: 8 %
   and 10 %.
3. Every published run of ``../shared/validation/*.json``: how many ran and are predicted over
   the device's memory, how many ran out of memory and are predicted to fit beside their
   stack's margin (target: none of either); and the runs that ran predicted within the
   margin (no miss: the margin is the model's uncertainty, but the search would not take
   them).
4. Every published run whose record gives the device memory nvidia-smi showed (BLOOM's,
   ``memory_gb``): the whole predicted peak against it, the evidence of ``megatron-deepspeed``'s
   margin (:data:`planner.cost.MEMORY_MARGIN`).

Run from the repository root (about a minute on 2 cores):

    python benchmarks/memory_accuracy.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from planner.cost import MEMORY_MARGIN
from planner.diagnose.calibration import validate
from planner.diagnose.layer_memory import (
    layer_memory_checks,
    measured_layer_models,
    read_layer_records,
)
from planner.spec.reading import load_cluster

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT.parent / "shared" / "validation"
H100 = VALIDATION / "h100"
CLUSTERS = ROOT / "instances" / "clusters"


def main() -> None:
    """Print the three tables."""
    cluster = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json", nodes=1)
    checks = layer_memory_checks(read_layer_records(H100 / "layers.jsonl"),
                                 measured_layer_models(H100 / "runs_one_gpu.json"),
                                 cluster)  # fmt: skip
    print("1. layers and the loss, one H100 (GiB)")
    print(f"{'measurement':52s} {'predicted':>9s} {'measured':>9s} {'error':>7s}")
    for c in checks:
        print(f"{c.name:52s} {c.predicted_gib:9.3f} {c.measured_gib:9.3f} {c.error:+7.1%}")
    worst = max(abs(c.error) for c in checks)
    print(f"{len(checks)} measurements, largest |error| {worst:.2%} (target 10 %)\n")

    rows = validate([H100 / "runs_one_gpu.json"], CLUSTERS).rows
    print("2. whole steps, one H100 (GiB)")
    print(f"{'run':40s} {'alloc':>6s} {'meas':>6s} {'error':>7s} {'reserv':>6s} {'meas':>6s} "
          f"{'error':>7s}")  # fmt: skip
    for r in rows:
        print(f"{r.id:40s} {r.predicted_peak_memory_gib:6.2f} {r.measured_peak_memory_gib:6.2f} "
              f"{r.memory_error:+7.1%} {r.predicted_reserved_memory_gib:6.2f} "
              f"{r.measured_reserved_memory_gib:6.2f} {r.reserved_error:+7.1%}")  # fmt: skip
    print()

    every = validate(sorted(VALIDATION.glob("*_runs.json")), CLUSTERS).rows
    ran = [r for r in every if not r.measured_oom]
    oom = [r for r in every if r.measured_oom]
    print("3. published runs: predicted fit against what happened")
    over = [r for r in ran if r.predicted_over]
    tight = [r for r in ran if not r.predicted_fits and not r.predicted_over]
    print(f"{len(ran)} ran: {len(over)} predicted over the device's memory, {len(tight)} "
          f"within the margin; {len(oom)} ran out of memory: "
          f"{sum(r.predicted_fits for r in oom)} predicted to fit beside the margin")
    for r in over + tight:
        what = "over the device" if r.predicted_over else "within the margin"
        print(f"  ran, {what}: {r.id} ({r.peak_memory_gib:.1f} GiB on {r.device})")
    print()

    seen = [r for r in every if r.device_memory_error is not None]
    print("4. device memory in use (nvidia-smi) against the whole predicted peak (GiB)")
    print(f"{'run':50s} {'peak':>6s} {'in use':>7s} {'error':>7s}")
    for r in seen:
        print(f"{r.id:50s} {r.peak_memory_gib:6.1f} {r.measured_device_memory_gib:7.1f} "
              f"{r.device_memory_error:+7.1%}")
    errors = sorted(abs(r.device_memory_error or 0.0) for r in seen)
    print(f"{len(seen)} runs: median |error| {statistics.median(errors):.1%}, "
          f"max {errors[-1]:.1%} (megatron-deepspeed's margin: "
          f"{MEMORY_MARGIN['megatron-deepspeed']:.0%})")

if __name__ == "__main__":
    main()
