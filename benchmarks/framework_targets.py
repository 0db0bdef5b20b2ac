"""Framework targets end to end: for each case and framework, ``solve --framework F`` (timed,
median of ``--repeats``), the plan launched as F's own configuration, and that configuration
priced again from the launch's inputs: the step and the peak memory against the plan's, and
whether it fits beside the memory margin.

Cases (the issue's "done when" list): GPT-3 175B on 1,024 A100; Llama-3 70B on 64 H100 at
8,192 tokens; Mixtral 8x7B on 64 H100; Llama-3.1 405B on 16,384 H100; Qwen3-235B-A22B on 256
H100 (its Hugging Face config, sequence 4,096, global batch 1,024: the config has no training
block); DeepSeek-V3 on 2,048 H100. MindSpeed runs on Ascend only (it imports ``torch_npu``),
so its rows are the same cases on as many Ascend 910B (``ascend-910b.json``, uncalibrated: the
data sheet's roofline). Run from the repository root:

    python benchmarks/framework_targets.py                 # about 5 minutes on 2 cores
    python benchmarks/framework_targets.py --repeats 1 --only gpt3-175b
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from planner import frameworks
from planner.errors import PlannerError
from planner.options import SolveOptions
from planner.plan.schema import Plan
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT.parent / "shared" / "reference" / "hf"
CASES = [
    ("GPT-3 175B", ROOT / "instances/models/gpt3-175b.json", "dgx-a100-80gb", 128, {}),
    ("Llama-3 70B 8K", ROOT / "instances/models/llama3-70b.json", "dgx-h100-80gb", 8,
     {"seq_length": 8192}),
    ("Mixtral 8x7B", ROOT / "instances/models/mixtral-8x7b.json", "dgx-h100-80gb", 8, {}),
    ("Llama-3.1 405B", ROOT / "instances/models/llama3.1-405b.json", "dgx-h100-80gb", 2048, {}),
    ("Qwen3-235B", HF / "Qwen3-235B-A22B.config.json", "dgx-h100-80gb", 32,
     {"seq_length": 4096, "global_batch_size": 1024}),
    ("DeepSeek-V3", ROOT / "instances/models/deepseek-v3.json", "dgx-h100-80gb", 256, {}),
]  # fmt: skip


def _row(name: str, devices: int, framework: str, plan: Plan, walls: list[float],
         again_step: float, again_peak: float) -> str:  # fmt: skip
    p = plan.predicted
    capacity = plan.cluster.device_memory_gib - plan.memory_margin_gib
    fits = "yes" if again_peak <= capacity else "NO"
    return (f"| {name} | {devices:,} | {framework} | {plan.summary()} | {p.step_time_s:.3f} | "
            f"{again_step / p.step_time_s - 1:+.2e} | {p.peak_memory_gib:.1f} | "
            f"{again_peak / p.peak_memory_gib - 1:+.2e} | {fits} | "
            f"{statistics.median(walls):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", action="append", help="Model file stem; repeatable.")
    parser.add_argument("--framework", action="append", help="Repeatable; default all five.")
    args = parser.parse_args()
    print("| case | devices | framework | plan | step s | exported step vs plan | peak GiB "
          "| exported peak vs plan | fits with margin | solve s (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, path, cluster_file, nodes, settings in CASES:
        if args.only and path.stem not in args.only:
            continue
        model = load_model(path)
        for framework in args.framework or frameworks.FRAMEWORKS:
            on = "ascend-910b" if framework == "mindspeed" else cluster_file
            cluster = load_cluster(ROOT / "instances" / "clusters" / f"{on}.json", nodes)
            options = SolveOptions(framework=framework, **settings)
            walls, plan = [], None
            try:
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    plan = solve(model, cluster, options)
                    walls.append(time.perf_counter() - started)
                assert plan is not None
                frameworks.launch(plan, framework, model=model, cluster=cluster)
                again = estimate(model, cluster, plan.configuration)  # type: ignore[arg-type]
            except PlannerError as exc:
                print(f"| {name} | {cluster.num_devices:,} | {framework} | no plan: "
                      f"{str(exc)[:160]} | | | | | | |")
                continue
            print(_row(name, cluster.num_devices, framework, plan, walls, again.step_time_s,
                       again.peak_memory_gib), flush=True)


if __name__ == "__main__":
    main()
