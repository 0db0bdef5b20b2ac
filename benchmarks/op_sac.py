"""torchtitan's per-operator selective activation checkpointing (``selective_ac_option =
"op"``) on torchtitan's own Llama 3 block, or Qwen3 MoE block for a model with experts,
against the planner's recompute module ``op``: the bytes a token keeps and the matmul FLOPs a
token reruns (the ``mm``s: the routed experts' grouped GEMMs, which rerun too, are not
counted), and for a whole step what the policy costs next to no and full recomputation.

Needs PyTorch and torchtitan 0.2.2 (``pip install -e '.[torchtitan]'``). Run from the
repository root (half a minute on two cores):

    python benchmarks/op_sac.py [--model instances/models/llama3-8b.json] [--seq-len 256]
        [--tp 2 4]
    python benchmarks/op_sac.py --model ../shared/reference/hf/Qwen3-30B-A3B.config.json

The block runs once on this machine's CPU (``planner.diagnose.titan_sac``: the CPU's fused
attention op is saved as CUDA's is), and at each ``--tp`` on as many CPU processes over gloo,
sharded by torchtitan's own tensor-parallel plan (not for an MoE block, which ``op`` is
priced on without tensor parallelism only). The step rows price torchtitan's own
``llama3_8b.toml`` layout (FSDP over 8 H100s, a local batch of 1, 8,192 tokens) on the
``torchtitan-eager`` stack.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import planner
from planner.diagnose.titan_sac import measure_op_sac, priced_op_sac
from planner.spec.reading import load_model

H100 = Path("instances/clusters/dgx-h100-80gb.json")


def main() -> None:
    """Print the two tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("instances/models/llama3-8b.json"))
    parser.add_argument("--seq-len", type=int, default=256, help="tokens (256)")
    parser.add_argument("--tp", type=int, nargs="*", default=[2, 4],
                        help="tensor-parallel degrees run on as many CPU processes (2 4)")
    options = parser.parse_args()
    model = load_model(options.model)
    tokens = options.seq_len
    try:
        measured = measure_op_sac(model, tokens)
    except ImportError as exc:
        sys.exit(f"needs PyTorch and torchtitan (pip install -e '.[torchtitan]'): {exc}")
    cluster = planner.load_cluster(H100, nodes=1)
    priced = priced_op_sac(model, cluster, tokens)
    print(f"{model.name}: torchtitan's block under selective_ac_option = \"op\", {tokens} "
          f"tokens")
    print(f"{'a token (one rank)':28s} {'torchtitan':>12s} {'planner':>12s} {'error':>7s}")
    rows = [("kept, bytes", measured.kept_bytes, priced.kept_bytes),
            ("matmul FLOPs, forward", measured.forward_matmul_flops,
             priced.forward_matmul_flops),
            ("matmul FLOPs, rerun", measured.rerun_matmul_flops, priced.rerun_matmul_flops)]
    for tp in options.tp if model.moe is None else ():  # MoE: priced without TP only
        shard = measure_op_sac(model, tokens, tp)
        rows.append((f"kept at TP {tp}, bytes", shard.kept_bytes,
                     priced_op_sac(model, cluster, tokens, tp).kept_bytes))
    for label, got, want in rows:
        print(f"{label:28s} {got / tokens:12,.0f} {want / tokens:12,.0f} "
              f"{want / got - 1:+7.1%}")
    # a model with experts on two nodes, its experts over a node's 8 GPUs
    nodes, ep = (2, 8) if model.moe is not None else (1, 1)
    cluster = planner.load_cluster(H100, nodes=nodes)
    experts = f", experts over {ep} (EP)" if ep > 1 else ""
    print(f"\n{model.name} on {8 * nodes} H100s, FSDP (ZeRO-3){experts}, local batch 1, "
          f"global batch 64:")
    print(f"{'recomputation':24s} {'step s':>8s} {'peak GiB':>9s}  fits")
    for recompute, modules in (("none", None), ("selective", "op"), ("full", None)):
        config = planner.ParallelConfig(tp=1, dp=8 * nodes, ep=ep, zero=3, mbs=1, global_batch=64,
                                        recompute=recompute, recompute_modules=modules,
                                        seq_len=model.training.seq_length
                                        if model.training is not None else 8192,
                                        stack="torchtitan-eager", overlap_grad_reduce=True,
                                        overlap_param_gather=True)  # fmt: skip
        e = planner.estimate(model, cluster, config)
        name = recompute + (f" ({modules})" if modules else "")
        print(f"{name:24s} {e.step_time_s:8.3f} {e.peak_memory_gib:9.1f}  "
              f"{'yes' if e.fits else 'no'}")


if __name__ == "__main__":
    main()
