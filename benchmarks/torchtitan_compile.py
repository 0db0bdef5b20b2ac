"""torchtitan's own A/B of ``torch.compile``, priced: its December 2024 benchmark
(``benchmarks/llama3_h100_202412_torchtitan.md`` at pytorch/torchtitan, Tables 1 and 3: Llama 3.1
8B, FSDP over 8 and 128 H100s, local batch 2 of 8,192 tokens, per-operator selective
checkpointing, TPS per GPU and memory with and without ``torch.compile``), against the
``torchtitan-eager`` and ``torchtitan-compiled`` stacks.

That benchmark ran torchtitan 9dec370, whose default norm (``norm_type = "rmsnorm"``,
``torchtitan/models/norms.py``) is written out: ``self._norm(x.float()).type_as(x) *
self.weight``, the ops Hugging Face's ``LlamaRMSNorm`` runs on a bf16 input, which the
``colossalai-hf`` stack counts (36 bytes an element forward, 96 backward). v0.2.2, which the
stacks count, builds ``nn.RMSNorm``, one fused kernel on CUDA. So the eager step is priced both
ways: as v0.2.2 runs it, and with that norm (a what-if: the stack's norm kernels replaced by
``colossalai-hf``'s, in a fresh interpreter so no remembered pricing mixes the two). Compiled,
Inductor fuses either norm.

The benchmark's H100s are not the bundled file's: 96 GB of HBM2e at 500 W (its authors do not
know their peak), so the TPS are not comparable, their ratio is; memory is torchtitan's
reserved peak. Run from the repository root (10 s):

    python benchmarks/torchtitan_compile.py
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

PUBLISHED = {1: {"eager": (5762, 82.4), "compiled": (6667, 77.0)},
             128 // 8: {"eager": (5605, 67.0), "compiled": (6514, 62.0)}}  # fmt: skip
"""Nodes of 8: TPS per GPU and memory (GiB), without and with ``torch.compile`` (Tables 1 and
3, "FSDP" and "FSDP + torch.compile")."""
MODEL = Path("instances/models/llama3-8b.json")
CLUSTER = Path("instances/clusters/dgx-h100-80gb.json")


def price(stack: str, nodes: int, as_written_norm: bool) -> tuple[float, float]:
    """TPS per GPU and peak GiB of the benchmark's configuration on ``stack``, the eager norm
    written out where ``as_written_norm``."""
    import planner
    from planner.graph import unfused

    if as_written_norm:
        norm = unfused.UNFUSED["colossalai-hf"]["norm"]
        unfused.UNFUSED["torchtitan-eager"] = unfused.UNFUSED["torchtitan-eager"] | {"norm": norm}
    model = planner.load_model(MODEL)
    cluster = planner.load_cluster(CLUSTER, nodes=nodes)
    config = planner.ParallelConfig(dp=8 * nodes, zero=3, mbs=2, global_batch=16 * nodes,
                                    recompute="selective", recompute_modules="op",
                                    overlap_grad_reduce=True, overlap_param_gather=True,
                                    stack=stack)  # fmt: skip
    step = planner.estimate(model, cluster, config)
    return 2 * 8192 / step.step_time_s, step.memory.total_gib


def _fresh(args: tuple[str, int, bool]) -> tuple[float, float]:
    return price(*args)


def main() -> None:
    """Print the table."""
    cases = [(stack, nodes, written) for nodes in PUBLISHED
             for stack, written in (("torchtitan-eager", False), ("torchtitan-eager", True),
                                    ("torchtitan-compiled", True))]  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    results = {}
    for case in cases:  # one interpreter each: the what-if must not meet remembered prices
        with spawn.Pool(1) as pool:
            results[case] = pool.apply(_fresh, (case,))
    print("| GPUs | run | published TPS/GPU | GiB | predicted TPS/GPU | GiB |")
    print("|---:|---|---:|---:|---:|---:|")
    for nodes, published in PUBLISHED.items():
        rows = (("eager, v0.2.2's fused norm", ("torchtitan-eager", nodes, False), None),
                ("eager, 9dec370's norm", ("torchtitan-eager", nodes, True), "eager"),
                ("compiled", ("torchtitan-compiled", nodes, True), "compiled"))
        for label, case, run in rows:
            tps, gib = results[case]
            seen = f"{published[run][0]:,} | {published[run][1]}" if run else "| "
            print(f"| {8 * nodes} | {label} | {seen} | {tps:,.0f} | {gib:.1f} |")
        measured = published["compiled"][0] / published["eager"][0]
        as_run = results["torchtitan-compiled", nodes, True][0] / results[
            "torchtitan-eager", nodes, True][0]  # fmt: skip
        today = results["torchtitan-compiled", nodes, True][0] / results[
            "torchtitan-eager", nodes, False][0]  # fmt: skip
        print(f"| {8 * nodes} | compiled / eager | {measured:.3f} | | {as_run:.3f} "
              f"(v0.2.2's norm: {today:.3f}) | |")


if __name__ == "__main__":
    main()
