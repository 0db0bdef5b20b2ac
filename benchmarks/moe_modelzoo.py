"""Qwen3-235B on 256 H100 as NVIDIA's MoE model zoo published it: five Megatron-Core runs of
``best_practice/qwen3/readme.md`` (yanring/Megatron-MoE-ModelZoo at e865051, "Performance
Results, H100": 4,096 tokens, global batch 2,048, bf16, the experts folded, ETP 1), each
priced as it ran (its dispatcher) and with the other dispatcher, against its measured step.

These runs are not evidence of any cluster file and were not fitted: the table says how far
the cost model is from measured MoE steps on H100, which no validated run covers. The
readme's "norm, act" recomputation is ``--recompute-modules layernorm moe_act``; "FSDP On" is
Megatron-FSDP over the data-parallel ranks (ZeRO-3 here); its uneven interleaved splits are
the embedding's and the loss's slots (``--account-for-*-in-pipeline-split``). The recipe's
model config fuses the loss (``--cross-entropy-loss-fusion`` in
``model_configs/benchmarking/Qwen3-235B-A22B.yaml``) with Transformer Engine's kernel, which
Megatron-LM now refuses and the planner does not price: the runs are priced with Megatron's
native fused loss (``megatron-te-fused-loss``), the nearest stack priced.

Run from the repository root (about half a minute):

    python benchmarks/moe_modelzoo.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.plan.config import ParallelConfig
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT.parent / "shared" / "reference" / "hf" / "Qwen3-235B-A22B.config.json"
RUN = dict(seq_len=4096, global_batch=2048, etp=1, sp=True, overlap_grad_reduce=True,
           overlap_param_gather=True, stack="megatron-te-fused-loss")  # fmt: skip
NORM_ACT = dict(recompute="selective", recompute_modules="moe_act,layernorm")
PP8 = dict(pp=8, vpp=4, first_stage_layers=11, last_stage_layers=11)
ROWS: tuple[tuple[str, str, dict[str, Any], float], ...] = (
    # (what the readme says, its dispatcher, the configuration, its step in seconds)
    ("TP2 PP8 VPP4 EP32, norm+act", "deepep", dict(tp=2, ep=32, zero=1, **PP8, **NORM_ACT),
     19.7),
    ("the same, 1F1B overlap", "deepep", dict(tp=2, ep=32, zero=1, **PP8, **NORM_ACT,
                                              overlap_moe_expert_parallel_comm=True), 17.6),
    ("TP2 EP8 FSDP, mbs 4, full", "deepep", dict(tp=2, ep=8, zero=3, mbs=4, recompute="full"),
     17.6),
    ("TP2 PP32 VPP3 EP8, norm+act", "alltoall",
     dict(tp=2, ep=8, zero=1, pp=32, vpp=3, first_stage_layers=2, last_stage_layers=2,
          **NORM_ACT), 24.2),
    ("TP4 PP8 VPP4 EP8", "deepep", dict(tp=4, ep=8, zero=1, **PP8), 29.0),
)  # fmt: skip


def main() -> None:
    """Print one row per published run: measured, predicted as it ran, and with the other
    dispatcher, with the errors."""
    model = load_model(MODEL)
    cluster = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json", nodes=32)
    print("| run (readme) | dispatcher | measured s | predicted s | error | other dispatcher s "
          "| error | band |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, dispatcher, knobs, measured in ROWS:
        other = "alltoall" if dispatcher == "deepep" else "deepep"
        ran, swapped = (estimate(model, cluster, ParallelConfig(
            **RUN, **knobs, moe_dispatcher=d))  # type: ignore[arg-type]
            for d in (dispatcher, other))  # fmt: skip
        band = ran.error_band.fraction if ran.error_band is not None else None
        print(f"| {label} | {dispatcher} | {measured:.1f} | {ran.step_time_s:.2f} | "
              f"{ran.step_time_s / measured - 1:+.0%} | {swapped.step_time_s:.2f} | "
              f"{swapped.step_time_s / measured - 1:+.0%} | "
              f"{'' if band is None else f'+/- {band:.0%}'} |")


if __name__ == "__main__":
    main()
