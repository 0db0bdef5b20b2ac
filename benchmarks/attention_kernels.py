"""H100's fused attention priced against the shared ``planner bench`` kernels: by sequence
length, the median and largest error of the forward and the backward, on the bundled curve
(a fixed cost per call and a saturating rate, the backward's rate apart, fitted to these very
kernels: in-sample) and on the form before it (no curve: the GEMM curve by FLOPs). Issue 28's
target: median error <= 8 %.

Run from the repository root (a few seconds):

    python benchmarks/attention_kernels.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from planner.diagnose.bench_fit import predicted_s
from planner.diagnose.bench_saved import saved_attention_cases
from planner.spec.reading import load_cluster

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT.parent / "shared" / "validation" / "h100"
BENCHES = ("bench_llama3.1-8b_seq8192.json", "bench_llama3.2-1b_seq32768.json")


def main() -> None:
    """Print one table per bench and the overall medians."""
    device = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json").device
    bare = device.model_copy(update={"efficiency": device.efficiency.model_copy(
        update={"attention": None})})  # fmt: skip
    every: dict[str, list[float]] = {"curve": [], "none": []}
    for name in BENCHES:
        cases, measured, precision = saved_attention_cases(H100 / name)
        print(f"{name}: |error| by sequence, median / max (bundled curve; no curve)")
        print(f"{'tokens':>7s} {'fwd':>13s} {'bwd':>13s} {'fwd, none':>13s} {'bwd, none':>13s}")
        errors = {key: np.array([predicted_s(c, d, precision) for c in cases]) / measured - 1
                  for key, d in (("curve", device), ("none", bare))}  # fmt: skip
        for key in errors:
            every[key] += list(np.abs(errors[key]))
        seqs = np.array([c.shape[2] for c in cases])
        backward = np.array([c.kernel == "attention_backward" for c in cases])
        for seq in sorted(set(seqs.tolist())):
            cells = []
            for key in ("curve", "none"):
                for is_backward in (False, True):
                    e = np.abs(errors[key][(seqs == seq) & (backward == is_backward)])
                    cells.append(f"{100 * np.median(e):5.1f} / {100 * e.max():5.1f}")
            print(f"{seq:7d} " + " ".join(f"{c:>13s}" for c in cells))
        print()
    print(f"all {len(every['curve'])} kernels: median |error| "
          f"{100 * statistics.median(every['curve']):.1f} % on the curve, "
          f"{100 * statistics.median(every['none']):.1f} % without it")


if __name__ == "__main__":
    main()
