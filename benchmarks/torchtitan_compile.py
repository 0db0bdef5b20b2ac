"""torchtitan's own A/B of ``torch.compile``, priced: its December 2024 benchmark
(``benchmarks/llama3_h100_202412_torchtitan.md`` at pytorch/torchtitan, Tables 1 and 3: Llama 3.1
8B, FSDP over 8 and 128 H100s, local batch 2 of 8,192 tokens, per-operator selective
checkpointing, TPS per GPU and memory with and without ``torch.compile``), against the
``torchtitan-eager`` and ``torchtitan-compiled`` stacks.

That benchmark ran torchtitan 9dec370, which differs from v0.2.2, the version the stacks count,
in two things, each priced as that commit ran it (a what-if: the stacks' tables changed in a
fresh interpreter, so no remembered pricing mixes them):

- its default norm (``norm_type = "rmsnorm"``, ``torchtitan/models/norms.py``) is written out,
  ``self._norm(x.float()).type_as(x) * self.weight``, the ops Hugging Face's ``LlamaRMSNorm``
  runs on a bf16 input, which the ``colossalai-hf`` stack counts (36 bytes an element forward,
  96 backward), where v0.2.2 builds ``nn.RMSNorm``, one fused kernel on CUDA; compiled,
  Inductor fuses either (the final norm, outside the blocks, ran as written there and is
  priced fused: one norm of 65);
- it compiled its blocks alone: the loss's compile is commented out (``train.py:137-138``), so
  its compiled run's loss is the eager one's, where v0.2.2 compiles it by default.

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


def price(stack: str, nodes: int, as_run: bool) -> tuple[float, float]:
    """TPS per GPU and peak GiB of the benchmark's configuration on ``stack``; as 9dec370 ran
    it where ``as_run`` (the eager norm written out, the loss eager)."""
    import planner
    from planner.graph import stacks, unfused

    if as_run:
        norm = unfused.UNFUSED["colossalai-hf"]["norm"]
        unfused.UNFUSED["torchtitan-eager"] = unfused.UNFUSED["torchtitan-eager"] | {"norm": norm}
        loss = unfused.UNFUSED["torchtitan-eager"]["loss"]
        unfused.UNFUSED["torchtitan-compiled"] = unfused.UNFUSED["torchtitan-compiled"] | {
            "loss": loss}  # fmt: skip
        for table in (stacks.LOSS_KEPT, stacks.LOSS_WORKING):
            table["torchtitan-compiled"] = table["torchtitan-eager"]
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
    cases = [(stack, nodes, as_run) for nodes in PUBLISHED
             for stack in ("torchtitan-eager", "torchtitan-compiled")
             for as_run in (False, True)]  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    results = {}
    for case in cases:  # one interpreter each: the what-if must not meet remembered prices
        with spawn.Pool(1) as pool:
            results[case] = pool.apply(_fresh, (case,))
    print("| GPUs | run | published TPS/GPU | GiB | priced as 9dec370 ran it | GiB "
          "| priced as v0.2.2 runs it | GiB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for nodes, published in PUBLISHED.items():
        for run, stack in (("eager", "torchtitan-eager"), ("compiled", "torchtitan-compiled")):
            (then, then_gib), (now, now_gib) = (results[stack, nodes, True],
                                                results[stack, nodes, False])  # fmt: skip
            print(f"| {8 * nodes} | {run} | {published[run][0]:,} | {published[run][1]} "
                  f"| {then:,.0f} | {then_gib:.1f} | {now:,.0f} | {now_gib:.1f} |")
        ratio = {as_run: results["torchtitan-compiled", nodes, as_run][0]
                 / results["torchtitan-eager", nodes, as_run][0]
                 for as_run in (True, False)}  # fmt: skip
        measured = published["compiled"][0] / published["eager"][0]
        print(f"| {8 * nodes} | compiled / eager | {measured:.3f} | | {ratio[True]:.3f} | "
              f"| {ratio[False]:.3f} | |")

if __name__ == "__main__":
    main()
