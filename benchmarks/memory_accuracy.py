"""The memory model against what devices measured and what published runs did: the table
issue 27's targets are read from.

1. Every layer measurement of ``../shared/validation/h100/layers.jsonl`` (one Hugging Face
   Llama layer, eager and compiled, whole and tensor-parallel shards; the LM head and its
   loss): predicted vs measured bytes (:mod:`planner.diagnose.layer_memory`). Target: 10 %.
2. Every whole step that measured its peak (``../shared/validation/h100/runs_one_gpu.json``):
   allocated and reserved, predicted vs measured (``planner validate``'s rows). Targets: 8 %
   and 10 %.
3. Every published run of ``../shared/validation/*.json``: how many ran and are predicted not
   to fit, how many ran out of memory and are predicted to fit. Target: none of either.

Run from the repository root (about a minute on 2 cores):

    python benchmarks/memory_accuracy.py
"""

from __future__ import annotations

from pathlib import Path

from planner.diagnose.calibration import validate
from planner.diagnose.layer_memory import layer_memory_checks, read_layer_records
from planner.diagnose.runs import load_runs
from planner.spec import ModelSpec
from planner.spec.reading import load_cluster, load_model

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT.parent / "shared" / "validation"
H100 = VALIDATION / "h100"
CLUSTERS = ROOT / "instances" / "clusters"


def _layer_models() -> dict[str, ModelSpec]:
    """The shapes ``real_layer.py`` builds: Llama-3.2-1B (the one-GPU runs' model) and
    Llama-3.1-8B (the bundled Llama 3 8B: the same layer)."""
    runs = load_runs(H100 / "runs_one_gpu.json")
    return {"llama3.2-1b": runs[0].model,
            "llama3.1-8b": load_model(ROOT / "instances" / "models" / "llama3-8b.json")}


def main() -> None:
    """Print the three tables."""
    cluster = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json", nodes=1)
    checks = layer_memory_checks(read_layer_records(H100 / "layers.jsonl"), _layer_models(),
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
    print(f"{len(ran)} ran: {sum(not r.predicted_fits for r in ran)} predicted not to fit; "
          f"{len(oom)} ran out of memory: {sum(r.predicted_fits for r in oom)} predicted to fit")
    for r in ran:
        if not r.predicted_fits:
            print(f"  ran, predicted not to fit: {r.id} ({r.peak_memory_gib:.1f} GiB on "
                  f"{r.device})")


if __name__ == "__main__":
    main()
