"""What the planner prints for a fixed set of commands, one file per command, to hold a
refactor to byte-identical output: run it before and after, then ``diff -r`` the two folders.

The commands cover every pricing path a change to the cost model or its composition could
move: ``estimate`` (text and ``--json``) over the knobs that take different code (tensor,
pipeline, virtual, context and expert parallelism, ZeRO 0-3, offload, some layers
recomputed, the zero-bubble schedules, uneven first and last stages, a framework's
defaults), ``solve`` for each framework and ``any``, ``compare``, ``info``, ``layer``,
``export``, ``simulate``, ``explain``, ``validate`` of every file in
``../shared/validation`` and a small ``sweep``. Wall times (the solver's seconds) are masked
as ``<s>``: they are the only text that may differ between two runs of the same code.

Run from the repository root (two to four minutes on 2 cores):

    python benchmarks/output_digest.py /tmp/before
    ... change the code ...
    python benchmarks/output_digest.py /tmp/after && diff -r /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
M = "instances/models/"
C = "instances/clusters/"
A100, H100 = C + "dgx-a100-80gb.json", C + "dgx-h100-80gb.json"
WALL_TIMES = (
    re.compile(r"\b()\d+(?:\.\d+)? s(?=, (?:optimal|feasible|time limit|gap))"),
    re.compile(r"(\"time_s\": )[0-9.e-]+"),
    re.compile(r"(solved? in )[0-9.]+ s"),
    # compare's table: the solve seconds after the peak memory
    re.compile(r"(?m)^( \S+\s+[\d.]+\s+\d+ %\s+[\d,]+\s+[\d.]+ %\s+[\d.]+\s+)[\d.]+"),
)
"""What prints a wall time: each pattern's first group is kept, the time after it masked."""

ESTIMATES: dict[str, list[str]] = {
    "gpt3-tp8-pp16": [M + "gpt3-175b.json", A100, "--tp", "8", "--pp", "16", "--sp"],
    "gpt3-vpp-selective": [M + "gpt3-175b.json", A100, "--tp", "8", "--pp", "8", "--vpp", "3",
                           "--recompute", "selective", "--zero", "1"],
    "gpt3-some-recomputed": [M + "gpt3-175b.json", A100, "--tp", "4", "--pp", "8", "--vpp", "2",
                             "--recompute", "full", "--recompute-layers", "3"],
    "llama70b-zero3-offload": [M + "llama3-70b.json", H100, "--nodes", "4", "--tp", "1",
                               "--zero", "3", "--offload", "optimizer", "--recompute", "full"],
    "llama70b-uneven": [M + "llama3-70b.json", H100, "--nodes", "8", "--tp", "8", "--pp", "4",
                        "--first-stage-layers", "18", "--last-stage-layers", "18"],
    "llama8b-ulysses": [M + "llama3-8b.json", H100, "--nodes", "2", "--cp", "4", "--cp-algo",
                        "ulysses", "--zero", "2", "--seq-len", "32768"],
    "llama8b-ring-gpipe": [M + "llama3-8b.json", H100, "--nodes", "2", "--cp", "2", "--pp", "2",
                           "--schedule", "gpipe", "--seq-len", "16384", "--tp", "2"],
    "llama8b-zbh1": [M + "llama3-8b.json", H100, "--nodes", "2", "--pp", "4", "--schedule",
                     "zb-h1", "--tp", "2"],
    "llama8b-zbv": [M + "llama3-8b.json", H100, "--nodes", "2", "--pp", "4", "--schedule",
                    "zb-v", "--vpp", "2", "--tp", "2"],
    "llama8b-torchtitan": [M + "llama3-8b.json", H100, "--nodes", "2", "--tp", "2", "--zero",
                           "3", "--framework", "torchtitan"],
    "mixtral-ep": [M + "mixtral-8x7b.json", H100, "--nodes", "8", "--tp", "2", "--ep", "8",
                   "--pp", "4", "--sp", "--overlap-grad-reduce",
                   "--tp-comm-overlap"],
    "deepseek-ep": [M + "deepseek-v3.json", H100, "--nodes", "256", "--tp", "1", "--ep", "64",
                    "--pp", "16", "--first-stage-layers", "2", "--last-stage-layers", "3",
                    "--recompute", "full"],
    "llama405b-pp-tied": [M + "llama3.1-405b.json", H100, "--nodes", "256", "--tp", "8",
                          "--pp", "16", "--cp", "2", "--seq-len", "16384",
                          "--first-stage-layers", "7", "--last-stage-layers", "7"],
}  # fmt: skip


def commands(plan: Path, sweep_out: Path) -> dict[str, list[str]]:
    """Every command, by the name of the file its output goes to."""
    gpt3 = [M + "gpt3-175b.json", A100]
    llama = [M + "llama3-8b.json", H100, "--nodes", "2", "--seq-len", "8192",
             "--global-batch", "128"]  # fmt: skip
    out: dict[str, list[str]] = {}
    for name, args in ESTIMATES.items():
        out[f"estimate-{name}"] = ["estimate", *args]
        out[f"estimate-{name}.json"] = ["estimate", *args, "--json"]
    out |= {
        "solve-megatron-export": ["solve", *gpt3, "--export", "megatron", "--out", str(plan)],
        "solve-torchtitan.json": ["solve", *llama, "--framework", "torchtitan", "--json"],
        "solve-deepspeed": ["solve", M + "llama3-70b.json", H100, "--nodes", "8",
                            "--framework", "deepspeed"],
        "solve-colossalai": ["solve", M + "mixtral-8x7b.json", H100, "--nodes", "8",
                             "--framework", "colossalai"],
        "solve-mindspeed": ["solve", M + "llama3-70b.json", C + "ascend-910b.json",
                            "--framework", "mindspeed"],
        "solve-any": ["solve", *llama, "--framework", "any"],
        "compare": ["compare", *llama],
        "info": ["info", M + "deepseek-v3.json"],
        "layer": ["layer", M + "llama3-8b.json", H100, "--nodes", "1"],
        "export-torchtitan": ["export", str(plan), "--format", "megatron", "--model", gpt3[0],
                              "--cluster", gpt3[1]],
        "simulate": ["simulate", str(plan)],
        "explain": ["explain", str(plan), "--model", gpt3[0], "--cluster", gpt3[1]],
        "sweep": ["sweep", "instances/sweeps/" + _first_sweep(), "--out", str(sweep_out)],
    }  # fmt: skip
    if SHARED.is_dir():
        for runs in sorted((SHARED / "validation").glob("*_runs.json")):
            out[f"validate-{runs.stem}"] = ["validate", str(runs)]
    return out


def _first_sweep() -> str:
    return sorted(p.name for p in (ROOT / "instances" / "sweeps").iterdir())[0]


def main() -> None:
    """Run every command; write its exit code, stdout and stderr to ``OUT/<name>.txt``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the outputs (created)")
    parser.add_argument("--only", default="", help="run only commands whose name has this")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    planner = [sys.executable, "-m", "planner.cli"]
    env = os.environ | {"COLUMNS": "100", "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        plan, sweep = Path(tmp) / "plan.json", Path(tmp) / "sweep.parquet"
        for name, argv in commands(plan, sweep).items():
            if args.only not in name:
                continue
            done = subprocess.run([*planner, *argv], capture_output=True, text=True, env=env,
                                  cwd=ROOT, check=False)  # fmt: skip
            text = f"$ planner {' '.join(argv)}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
            text = text.replace(tmp, "TMP")
            for pattern in WALL_TIMES:
                text = pattern.sub(lambda m: m.group(1) + "<s>", text)
            (args.out / f"{name}.txt").write_text(text)
            print(f"{name}: exit {done.returncode}")


if __name__ == "__main__":
    main()
