"""One H100's decoder layers, LM heads and one-GPU steps priced against what it measured
(``../shared/validation/h100/``: ``layers.jsonl``, ``runs_one_gpu.json``), each stack's
separate kernels counted from its source (``planner/graph/unfused.py``), on two devices:

- *kernels*: the GEMM curve, memory-bound rate and launch cost ``planner bench`` fitted to the
  H100's own kernels (``bench_llama3.1-8b_seq8192.json``), the bundled attention curve (fitted
  to the same benches): what the design prices with, nothing fitted to these layers;
- *bundled*: ``instances/clusters/dgx-h100-80gb.json`` as shipped, its GEMM curve fitted to
  Megatron-LM's H100 runs (so it carries Megatron's overheads beyond its kernels, and prices
  these stacks' GEMMs slow).

Issue 28's targets: eager and compiled layers within 10 % each; steps within 10 %.

Run from the repository root (a few seconds):

    python benchmarks/layer_times.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from planner.diagnose.bench_saved import with_saved_kernels
from planner.diagnose.calibration import priced_rows
from planner.diagnose.layer_memory import measured_layer_models, read_layer_records
from planner.diagnose.layer_times import layer_time_checks
from planner.diagnose.runs import load_runs
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT.parent / "shared" / "validation" / "h100"


def _devices() -> dict[str, ClusterSpec]:
    bundled = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json")
    kernels = with_saved_kernels(bundled.device, H100 / "bench_llama3.1-8b_seq8192.json")
    return {"kernels": bundled.model_copy(update={"device": kernels}), "bundled": bundled}


def main() -> None:
    """Print every layer and head check, the medians by stack and part, and the steps."""
    devices = _devices()
    records = read_layer_records(H100 / "layers.jsonl")
    models = measured_layer_models(H100 / "runs_one_gpu.json")
    checks = {key: layer_time_checks(records, models, cluster)
              for key, cluster in devices.items()}  # fmt: skip
    print("predicted vs measured ms (error): on the kernel curves, on the bundled file")
    print(f"{'what':38s} {'part':7s} {'measured':>8s} {'kernels':>16s} {'bundled':>16s}")
    for mine, theirs in zip(checks["kernels"], checks["bundled"], strict=True):
        cells = [f"{c.predicted_s * 1e3:7.2f} ({100 * c.error:+5.1f}%)" for c in (mine, theirs)]
        print(f"{mine.name:38s} {mine.part:7s} {mine.measured_s * 1e3:8.2f} "
              f"{cells[0]:>16s} {cells[1]:>16s}")
    print()
    print("median / max |error| by stack and part")
    groups = sorted({(c.stack, c.part) for c in checks["kernels"]})
    for stack, part in groups:
        cells = []
        for key in devices:
            errors = [abs(c.error) for c in checks[key] if (c.stack, c.part) == (stack, part)]
            cells.append(f"{key} {100 * statistics.median(errors):4.1f} / "
                         f"{100 * max(errors):4.1f} %")
        print(f"  {stack:12s} {part:8s} ({len(errors):2d})  " + "   ".join(cells))
    print()
    runs = load_runs(H100 / "runs_one_gpu.json")
    print("one-GPU steps, s: measured, kernels (error), bundled (error)")
    priced = {key: priced_rows(runs, {run.device: cluster for run in runs}).rows
              for key, cluster in devices.items()}  # fmt: skip
    for mine, theirs in zip(priced["kernels"], priced["bundled"], strict=True):
        print(f"  {mine.id:38s} {mine.measured_s:5.2f}  {mine.predicted_s:5.2f} "
              f"({100 * (mine.error or 0):+5.1f}%)  {theirs.predicted_s:5.2f} "
              f"({100 * (theirs.error or 0):+5.1f}%)")


if __name__ == "__main__":
    main()
