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

The readme's "Long Context" table runs the same model dropless and with
``--moe-router-force-load-balancing`` (TP4 PP8 VPP4 EP8, CP 1-8 at 16K-128K tokens, DeepEP,
``--recompute-modules layernorm moe``, global batch 256), in TFLOP/s per GPU by Megatron's
count. The balanced runs are priced as they ran; the dropless runs' extra time is what the
busiest expert-parallel rank costs (:mod:`planner.cost.expert_load`): each row's spread of
tokens per expert (``expert_load_cv``) is the one the model needs to price that row's
dropless step from its balanced one, and the median of the four prices them all, then the
4K runs above (dropless, their routers' spread not stated) as a check.

``best_practice/mixtral/run_mixtral_8x22B.sh`` states Mixtral 8x22B's throughput on 128
H100 (``runtime_configs/benchmarking/runtime.conf``: TP2 PP8 VPP7 EP8, 4,096 tokens, global
batch 256, NCCL's all-to-all; ``--tp-comm-overlap`` for bf16, from ``sbatch_benchmarking.sh``,
and the native fused loss of ``model_configs/benchmarking/Mixtral-8x22B.yaml``) dropless,
force-balanced, with its experts padded to a capacity of 1.0, and force-balanced in FP8 with
blockwise scaling. The runs load Mixtral's released weights (``--finetune``, ``PRETRAIN=0``):
a trained router. They are priced as they ran (FP8 as the delayed scaling the planner prices,
which is not what ran), and the dropless run's spread is read from its ratio to the
force-balanced one as above.

The readme's GB200 table has one bf16 run, Qwen3-235B on 256 GB200 (TP1 PP8 EP8, 4,096
tokens, global batch 8,192, force-balanced, HybridEP, CUDA graphs over attention and the
router): 750 TFLOP/s a GPU. ``gb200-nvl72.json`` is uncalibrated (its GEMMs at the data
sheet's peak); the run is priced on it with NCCL's all-to-all and with DeepEP (HybridEP is
not priced), to say how far that file is from a measured step.

Run from the repository root (about a minute):

    python benchmarks/moe_modelzoo.py
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from planner.plan.config import ParallelConfig
from planner.spec import ClusterSpec, ModelSpec
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


LONG_CONTEXT: tuple[tuple[int, int, float, float], ...] = (
    # (tokens a sequence, context parallel, TFLOP/s per GPU forced balanced, dropless)
    (16384, 1, 295, 237), (32768, 2, 335, 277), (65536, 4, 368, 320), (131072, 8, 389, 357),
)
LONG = dict(tp=4, ep=8, zero=1, **PP8, recompute="selective",
            recompute_modules="layernorm,moe", moe_dispatcher="deepep")  # fmt: skip
GPUS = 256

MIXTRAL = ROOT.parent / "shared" / "reference" / "hf" / "Mixtral-8x22B-v0.1.config.json"
MIXTRAL_GPUS = 128
MIXTRAL_RUN = dict(seq_len=4096, global_batch=256, tp=2, pp=8, vpp=7, ep=8, etp=1, sp=True,
                   zero=1, overlap_grad_reduce=True, overlap_param_gather=True,
                   moe_dispatcher="alltoall")  # fmt: skip
BF16 = dict(stack="megatron-te-fused-loss", tp_comm_overlap=True)
MIXTRAL_ROWS: tuple[tuple[str, str, dict[str, Any], float], ...] = (
    # (what the script says, routing, the rest of its configuration, TFLOP/s per GPU)
    ("dropless", "dropless", BF16, 445),
    ("forced balancing", "balanced", BF16, 465),
    ("token drop, capacity 1.0, padded", "capacity", BF16, 470),
    ("FP8 blockwise, forced balancing", "balanced",
     dict(stack="megatron-te-fp8-fused-loss", optimizer_moments="bf16"), 560),
)  # fmt: skip


def per_layer(model: ModelSpec, cluster: ClusterSpec) -> None:
    """Print each 4K run's step per layer and microbatch on one rank, measured and priced,
    beside the routed experts each rank holds: what a cost per layer that does not shrink with
    the layer's work, or grows with its experts, would show."""
    assert model.moe is not None
    print("\n| run (readme) | local experts | measured ms | predicted ms | gap ms |")
    print("|---|---:|---:|---:|---:|")
    for label, dispatcher, knobs, measured in ROWS:
        config = ParallelConfig(**RUN, **knobs, moe_dispatcher=dispatcher)  # type: ignore[arg-type]
        result = estimate(model, cluster, config)
        slots = result.num_microbatches * model.num_layers / config.pp * 1e-3
        step = result.step_time_s
        print(f"| {label} | {model.moe.num_experts // config.ep} | {measured / slots:.2f} | "
              f"{step / slots:.2f} | {(measured - step) / slots:+.2f} |")


def megatron_flops(model: ModelSpec, seq: int, batch: int) -> float:
    """One step's FLOPs as Megatron-LM counts them for its TFLOP/s (``megatron/training/
    training.py``, ``num_floating_point_operations``, before its THD form): 12 x the
    layers' GEMM shapes per token (forward and backward, Narayanan et al.'s Appendix), the
    routed experts at top_k times their width, half the attention's score matrix, the
    output layer; no router, norms or recomputation. The readme's own steps and TFLOP/s
    agree with it to 0.5 % (4.85 PFLOP a GPU at 4K: 19.7 s at 245 TFLOP/s)."""
    moe = model.moe
    assert moe is not None  # a mixture of experts
    h, heads = model.hidden_size, model.num_attention_heads
    q_ratio = model.head_dim * heads / h
    mlp = moe.ffn_hidden_size * moe.top_k * (1.5 if model.gated_mlp else 1.0)
    attention = h * (1 + model.query_groups / heads + seq / h / 2) * q_ratio
    per_token = 12 * model.num_layers * h * (mlp + attention) + 6 * h * model.vocab_size
    return batch * seq * per_token


def with_spread(model: ModelSpec, cv: float) -> ModelSpec:
    """``model`` with its experts' loads spread by ``cv`` (dropless routing)."""
    assert model.moe is not None
    return model.model_copy(update={"moe": model.moe.model_copy(
        update={"expert_load_cv": cv})})  # fmt: skip


def long_config(seq: int, cp: int) -> ParallelConfig:
    """A long-context run's configuration."""
    return ParallelConfig(**{**RUN, "seq_len": seq, "global_batch": 256}, cp=cp,
                          **LONG)  # type: ignore[arg-type]


def priced(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, cv: float) -> float:
    """``config``'s step, the experts' loads spread by ``cv``."""
    return estimate(with_spread(model, cv), cluster, config).step_time_s


def implied_cv(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
               ratio: float) -> float:  # fmt: skip
    """The spread whose price of the dropless step is ``ratio`` times the balanced one's
    (bisection: the price grows with the spread)."""
    balanced, low, high = priced(model, cluster, config, 0.0), 0.0, 4.0
    for _ in range(24):
        mid = (low + high) / 2
        low, high = (mid, high) if priced(model, cluster, config, mid) < balanced * ratio \
            else (low, mid)
    return (low + high) / 2


def long_context(model: ModelSpec, cluster: ClusterSpec) -> float:
    """Print the long-context table; return the median spread its rows imply."""
    print("\n| tokens | CP | balanced s | predicted s | error | dropless s | dropless / "
          "balanced | cv it implies |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    cvs = []
    for seq, cp, forced, dropless in LONG_CONTEXT:
        flops = megatron_flops(model, seq, 256) / GPUS
        balanced_s, dropless_s = flops / (forced * 1e12), flops / (dropless * 1e12)
        predicted = priced(model, cluster, long_config(seq, cp), 0.0)
        cvs.append(implied_cv(model, cluster, long_config(seq, cp), dropless_s / balanced_s))
        print(f"| {seq:,} | {cp} | {balanced_s:.1f} | {predicted:.1f} | "
              f"{predicted / balanced_s - 1:+.1%} | {dropless_s:.1f} | "
              f"{dropless_s / balanced_s:.3f} | {cvs[-1]:.2f} |")
    median = statistics.median(cvs)
    print(f"\nmedian cv {median:.2f}; each row's dropless / balanced step priced with it:")
    for seq, cp, forced, dropless in LONG_CONTEXT:
        config = long_config(seq, cp)
        ratio = priced(model, cluster, config, median) / priced(model, cluster, config, 0.0)
        print(f"  {seq:>7,} tokens: {ratio:.3f}, measured {forced / dropless:.3f}")
    return median


def mixtral_rows(model: ModelSpec, cluster: ClusterSpec) -> list[tuple[str, float, float]]:
    """Mixtral 8x22B's four runs: (what ran, measured step, predicted step), the dropless one
    priced balanced (its spread is :func:`mixtral_spread`'s)."""
    assert model.moe is not None
    rows = []
    for label, routing, knobs, tflops in MIXTRAL_ROWS:
        priced_as = model if routing != "capacity" else model.model_copy(update={
            "moe": model.moe.model_copy(update={"capacity_factor": 1.0})})  # fmt: skip
        config = ParallelConfig(**MIXTRAL_RUN, **knobs)  # type: ignore[arg-type]
        measured = megatron_flops(model, 4096, 256) / MIXTRAL_GPUS / (tflops * 1e12)
        rows.append((label, measured, estimate(priced_as, cluster, config).step_time_s))
    return rows


def mixtral_spread(model: ModelSpec, cluster: ClusterSpec) -> float:
    """The spread that prices Mixtral 8x22B's dropless run from its force-balanced one."""
    ratio = MIXTRAL_ROWS[1][3] / MIXTRAL_ROWS[0][3]
    return implied_cv(model, cluster, ParallelConfig(**MIXTRAL_RUN, **BF16), ratio)


def mixtral(spread: float) -> None:
    """Print Mixtral 8x22B's runs, the spread its dropless run implies and its price at the
    long-context runs' ``spread``."""
    model = load_model(MIXTRAL)
    cluster = load_cluster(ROOT / "instances" / "clusters" / "dgx-h100-80gb.json", nodes=16)
    print("\n| Mixtral 8x22B, 128 H100 | measured s | predicted s | error |")
    print("|---|---:|---:|---:|")
    for label, measured, predicted in mixtral_rows(model, cluster):
        print(f"| {label} | {measured:.3f} | {predicted:.3f} | {predicted / measured - 1:+.1%} |")
    config = ParallelConfig(**MIXTRAL_RUN, **BF16)
    balanced = priced(model, cluster, config, 0.0)
    dropless = MIXTRAL_ROWS[1][3] / MIXTRAL_ROWS[0][3]
    print(f"\ndropless / forced measured {dropless:.3f}: cv {mixtral_spread(model, cluster):.3f}; "
          f"at cv {spread:.2f} it would be {priced(model, cluster, config, spread) / balanced:.3f}")


def gb200() -> None:
    """Print Qwen3-235B's bf16 run on 256 GB200 priced on the uncalibrated GB200 file."""
    model = load_model(MODEL)
    cluster = load_cluster(ROOT / "instances" / "clusters" / "gb200-nvl72.json", nodes=64)
    measured = megatron_flops(model, 4096, 8192) / GPUS / 750e12
    print(f"\nQwen3-235B on 256 GB200, bf16, TP1 PP8 EP8: measured {measured:.2f} s")
    for dispatcher in ("alltoall", "deepep"):
        config = ParallelConfig(**{**RUN, "global_batch": 8192}, tp=1, ep=8, zero=1,
                                pp=8, first_stage_layers=11, last_stage_layers=11,
                                moe_dispatcher=dispatcher)  # type: ignore[arg-type]
        result = estimate(model, cluster, config)
        time = result.time
        print(f"  {dispatcher:8s} predicted {result.step_time_s:.2f} s "
              f"({result.step_time_s / measured - 1:+.0%}), compute {time.compute_s:.2f} s, "
              f"expert-parallel {time.expert_parallel_comm_s:.2f} s")


def main() -> None:
    """Print one row per published run: measured, predicted as it ran, and with the other
    dispatcher, with the errors; then the long-context table and the 4K runs at its
    spread."""
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
    per_layer(model, cluster)
    cv = long_context(model, cluster)
    print(f"\nthe 4K runs (dropless) with cv {cv:.2f}:")
    spread = with_spread(model, cv)
    for label, dispatcher, knobs, measured in ROWS:
        step = estimate(spread, cluster, ParallelConfig(**RUN, **knobs,
                                                        moe_dispatcher=dispatcher)).step_time_s
        print(f"  {label:30s} measured {measured:5.1f} s, predicted {step:6.2f} s "
              f"({step / measured - 1:+.0%})")
    mixtral(cv)
    gb200()


if __name__ == "__main__":
    main()
