"""How long ``planner solve --framework any`` takes on every bundled instance, and (with
``--frameworks``) that its plan is never slower than the best framework plan.

The instances: every model of ``instances/models`` with its own training block on 1,024 H100
(the bundled cluster's 128 nodes); the documentation's (the README's quick start, GPT-3 175B
on 1,024 A100; docs/export.md's Llama 3 8B on 16 H100 at 8K tokens; docs/offload.md's Llama 3
70B on 16 H100 at global batch 64); the benchmarks' cases (``solve_quality.py``,
``framework_targets.py``); and issue 25's three:
Llama-3.1 70B on 256 H100 and Llama-3.1 405B on 2,048 H100 at 8K tokens and global batch
512, DeepSeek-V3 on 2,048 H100; and Mixtral 8x22B's Hugging Face config on 128 H100 at 4K
tokens (a mixture of experts on 2-node meshes outside the bundled models). Target: each
solve at most 10 s on 2 cores. The CPU time is printed beside the wall time: the machine is
shared, and the wall time counts the others.

Run from the repository root:

    python benchmarks/any_solve_times.py                    # a few minutes on 2 cores
    python benchmarks/any_solve_times.py --only llama3-8b   # one instance (a name's substring)
    python benchmarks/any_solve_times.py --skip deepseek --skip DeepSeek
    python benchmarks/any_solve_times.py --frameworks       # also every framework's solve
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.frameworks import FRAMEWORKS
from planner.options import SolveOptions
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "instances" / "models"
HF = ROOT.parent / "shared" / "reference" / "hf"
TARGET_S = 10.0


@dataclass(frozen=True)
class Instance:
    name: str
    model: Path
    cluster: str
    nodes: int | None
    run: dict[str, Any] = field(default_factory=dict)


def instances() -> list[Instance]:
    """The bundled instances, the documentation's, the benchmarks' and the issue's."""
    bundled = [Instance(p.stem, p, "dgx-h100-80gb", None) for p in sorted(MODELS.glob("*.json"))]
    return [
        *bundled,
        Instance("README quick start: gpt3-175b", MODELS / "gpt3-175b.json", "dgx-a100-80gb",
                 None),
        Instance("docs/export.md: llama3-8b 8K", MODELS / "llama3-8b.json", "dgx-h100-80gb", 2,
                 {"seq_length": 8192, "global_batch_size": 128}),
        Instance("docs/offload.md: llama3-70b gbs 64", MODELS / "llama3-70b.json",
                 "dgx-h100-80gb", 2, {"global_batch_size": 64}),
        Instance("solve_quality: GPT-1T", MODELS / "gpt-1t.json", "dgx-a100-80gb", 384,
                 {"global_batch_size": 3072}),
        Instance("solve_quality: Llama 3.1 405B", MODELS / "llama3.1-405b.json",
                 "dgx-h100-80gb", 2048, {"global_batch_size": 2048}),
        Instance("framework_targets: Llama-3 70B 8K", MODELS / "llama3-70b.json",
                 "dgx-h100-80gb", 8, {"seq_length": 8192}),
        Instance("framework_targets: Mixtral 8x7B", MODELS / "mixtral-8x7b.json",
                 "dgx-h100-80gb", 8),
        Instance("framework_targets: Qwen3-235B", HF / "Qwen3-235B-A22B.config.json",
                 "dgx-h100-80gb", 32, {"seq_length": 4096, "global_batch_size": 1024}),
        Instance("issue 25: Llama-3.1 70B 8K", HF / "Meta-Llama-3.1-70B.config.json",
                 "dgx-h100-80gb", 32, {"seq_length": 8192, "global_batch_size": 512}),
        Instance("issue 25: Llama-3.1 405B 8K", HF / "Meta-Llama-3.1-405B.config.json",
                 "dgx-h100-80gb", 256, {"seq_length": 8192, "global_batch_size": 512}),
        Instance("issue 25: DeepSeek-V3", MODELS / "deepseek-v3.json", "dgx-h100-80gb", 256),
        Instance("HF: Mixtral 8x22B 4K", HF / "Mixtral-8x22B-v0.1.config.json",
                 "dgx-h100-80gb", 16, {"seq_length": 4096, "global_batch_size": 512}),
    ]  # fmt: skip


def _solve(case: Instance, framework: str) -> tuple[float | None, str, float, float]:
    """The step, the plan (or why none), and the wall and CPU seconds of one solve."""
    model = load_model(case.model)
    cluster = load_cluster(ROOT / "instances" / "clusters" / f"{case.cluster}.json", case.nodes)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan = solve(model, cluster, SolveOptions(framework=framework, **case.run))
        step: float | None = plan.predicted.step_time_s
        said = f"{plan.method}: {plan.summary()}"
    except PlannerError as exc:
        step, said = None, f"no plan: {str(exc)[:60]}"
    return step, said, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="A substring of the names; repeatable.")
    parser.add_argument("--skip", action="append", help="A substring of the names to leave out.")
    parser.add_argument("--frameworks", action="store_true",
                        help="Also solve for every framework and check any <= the best.")
    args = parser.parse_args()
    cases = [c for c in instances() if (not args.only or any(o in c.name for o in args.only))
             and not any(s in c.name for s in args.skip or ())]  # fmt: skip
    print("| instance | devices | any step s | plan | wall s | CPU s | best framework s |")
    print("|---|---|---|---|---|---|---|")
    slow, worse = [], []
    for case in cases:
        step, said, wall, cpu = _solve(case, "any")
        devices = load_cluster(ROOT / "instances" / "clusters" / f"{case.cluster}.json",
                               case.nodes).num_devices  # fmt: skip
        best = ""
        if args.frameworks:
            steps = [s for f in FRAMEWORKS if (s := _solve(case, f)[0]) is not None]
            if steps:
                best = f"{min(steps):.3f}"
                if step is None or step > min(steps):
                    worse.append(case.name)
        if cpu > TARGET_S:
            slow.append(case.name)
        shown = "-" if step is None else f"{step:.3f}"
        print(f"| {case.name} | {devices:,} | {shown} | {said} | {wall:.2f} | {cpu:.2f} | "
              f"{best} |", flush=True)  # fmt: skip
    print(f"\nover {TARGET_S:g} s of CPU: {', '.join(slow) or 'none'}")
    if args.frameworks:
        print(f"any slower than a framework: {', '.join(worse) or 'none'}")


if __name__ == "__main__":
    main()
