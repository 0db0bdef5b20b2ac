"""The routed experts' GEMMs on an H100: measured against priced, as one grouped kernel (what
Megatron-Core's ``--moe-grouped-gemm`` and torchtitan run) and as one GEMM per expert in turn
(what every expert GEMM was priced as before, and Megatron-DeepSpeed and Hugging Face still
run), for each shape of ``../shared/validation/h100/expert_gemms.jsonl`` (issue 28's target:
within 15 % at 128 tokens per expert and above).

Run from the repository root (a second):

    python benchmarks/expert_gemms.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from planner.diagnose.expert_gemms import FIT_MIN_TOKENS, priced_s, read_expert_gemms
from planner.spec.reading import load_cluster

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT.parent / "shared" / "validation" / "h100" / "expert_gemms.jsonl"


def main() -> None:
    """Print the table and the summary of the target's range."""
    device = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json").device
    peak = device.peak_flops_per_s("bf16")
    gemms = read_expert_gemms(MEASURED)
    print("expert GEMMs on one H100, 8 local experts (TFLOP/s; error of the priced time)")
    print(f"{'shape':18s} {'tokens':>6s} {'grouped':>8s} {'priced':>7s} {'error':>7s} "
          f"{'bmm':>6s} {'in turn':>8s} {'error':>7s}")  # fmt: skip
    errors = []
    for g in gemms:
        grouped, in_turn = priced_s(g, device), priced_s(g, device, grouped=False)
        error = grouped / g.grouped_s - 1
        if g.tokens_per_expert >= FIT_MIN_TOKENS:
            errors.append(error)
        print(f"{g.label:18s} {g.tokens_per_expert:6d} {g.flops / g.grouped_s / 1e12:8.0f} "
              f"{g.flops / grouped / 1e12:7.0f} {error:+7.1%} {g.flops / g.bmm_s / 1e12:6.0f} "
              f"{g.flops / in_turn / 1e12:8.0f} {in_turn / g.grouped_s - 1:+7.0%}")
    worst = max(errors, key=abs)
    within = sum(abs(e) <= 0.15 for e in errors)
    print(f"{len(errors)} shapes of {FIT_MIN_TOKENS}+ tokens per expert: median |error| "
          f"{statistics.median(abs(e) for e in errors):.1%}, max {abs(worst):.1%}; "
          f"{within} within 15 % (peak {peak / 1e12:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
