"""FP8 against bf16 on H100: Megatron-LM's best plan for each model on the bundled DGX H100
cluster in bf16 (``megatron-te``) and with Transformer Engine's FP8 linears
(``megatron-te-fp8``), the step of each, and the bf16 plan priced in FP8 (what switching FP8
on alone gives, against what re-planning for it gives). No FP8 run validates these numbers
(every FP8 band says it extrapolates); they show what the cost model's FP8 terms do to plans.

Run from the repository root (about a minute):

    python benchmarks/fp8_plans.py
"""

from __future__ import annotations

from pathlib import Path

from planner.options import SolveOptions
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate

ROOT = Path(__file__).resolve().parents[1]
CASES = (  # (model file, nodes, options as solve takes them)
    ("llama3-8b.json", 1, {}),
    ("llama3-8b.json", 2, {}),
    ("llama3-70b.json", 8, {}),
    ("llama3.1-405b.json", 128, {"global_batch_size": 1024, "seq_length": 8192}),
    ("mixtral-8x7b.json", 8, {}),
    ("deepseek-v3.json", 128, {}),
)


def main() -> None:
    """Print one row per case: the two plans, their steps, and the bf16 plan in FP8."""
    print("| model | H100 | bf16 plan | bf16 s | FP8 plan | FP8 s | bf16 plan in FP8 s | "
          "re-planned gain | switched gain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, nodes, run in CASES:
        model = load_model(ROOT / "instances" / "models" / name)
        cluster = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json",
                               nodes=nodes)  # fmt: skip
        bf16 = solve(model, cluster, SolveOptions(framework="megatron", **run))
        fp8 = solve(model, cluster, SolveOptions(framework="megatron", stack="megatron-te-fp8",
                                                 **run))  # fmt: skip
        assert bf16.configuration is not None
        switched = estimate(model, cluster, bf16.configuration.model_copy(
            update={"stack": "megatron-te-fp8"}))  # fmt: skip
        b, f = bf16.predicted.step_time_s, fp8.predicted.step_time_s
        fits = "" if switched.fits else " (over memory)"
        print(f"| {model.name} | {nodes * 8:,} | {bf16.summary()} | {b:.2f} | "
              f"{fp8.summary().removesuffix(', FP8 linears')} | {f:.2f} | "
              f"{switched.step_time_s:.2f}{fits} | {b / f:.2f}x | "
              f"{b / switched.step_time_s:.2f}x |")


if __name__ == "__main__":
    main()
