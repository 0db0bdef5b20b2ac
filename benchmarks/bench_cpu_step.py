"""planner bench and planner profile end to end on this machine's CPU: time the kernels, fit
the block, profile the layers, price a training step of the tiny Llama with each, then run
that step in PyTorch and compare.

    python benchmarks/bench_cpu_step.py [--steps 5] [--model tests/data/bench/tiny-moe.json]

The model is ``tests/data/bench/tiny-llama.json`` (2 layers, hidden 256, GQA 4/2 heads,
SwiGLU 704, RMSNorm, vocab 1024, fp32, sequence 256), or with ``--model`` another tiny one
(``tiny-moe.json``: a dense and an MoE layer of 8 experts, top-2, one shared; ``tiny-mla.json``
the same with latent attention), whose MoE layer then runs whole, each expert on the rows its
router gave it, where the profile measured the layer around its experts and the experts on
balanced rows apart. It is trained as ``planner estimate`` prices it on one device:
microbatch 1, 8 microbatches accumulated, then AdamW, built from the layers ``planner
profile`` runs. Printed: the fitted block, the step predicted from the kernels
(``planner bench``) and from the layers (``planner profile`` at microbatches 1 and 2, AdamW
over a layer), the measured median and fastest steps, and their ratios. Needs PyTorch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from planner.diagnose.bench_cases import bench_cases
from planner.diagnose.bench_fit import fit_bench
from planner.diagnose.bench_torch import run_cases
from planner.diagnose.faithful_layers import (
    DecoderLayer,
    Embedding,
    Head,
    MoELayer,
    RoutedExperts,
)
from planner.diagnose.profile_torch import profile_cases, run_profile
from planner.plan.config import ParallelConfig
from planner.sharding.profiled import with_profile
from planner.spec import ModelSpec
from planner.spec.profile import LayerProfile, layer_shape
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "data" / "bench" / "tiny-llama.json"
CLUSTER = ROOT / "tests" / "data" / "bench" / "cpu-node.json"


def _layer(m: ModelSpec, index: int) -> nn.Module:
    if m.moe is None or not m.is_moe_layer(index):
        return DecoderLayer(m)
    return MoELayer(m, experts=RoutedExperts(m, m.moe.num_experts))


def measured_step_s(model: Path, steps: int) -> tuple[float, float]:
    """Median and fastest seconds of a training step of ``model`` on the CPU, built from the
    layers ``planner profile`` runs (:mod:`planner.diagnose.faithful_layers`)."""
    m = load_model(model)
    assert m.training is not None
    embedding, head = Embedding(m), Head(m)
    layers = nn.Sequential(*(_layer(m, i) for i in range(m.num_layers)))
    params = [*embedding.parameters(), *layers.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    seq, microbatches = m.training.seq_length, m.training.global_batch_size
    tokens = torch.randint(0, m.vocab_size, (microbatches, 1, seq + 1))
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        for i in range(microbatches):
            head(layers(embedding(tokens[i, :, :-1])), tokens[i, :, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]), min(times[2:])


def main() -> None:
    """Bench, fit, price; profile, price; run; compare."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    model = load_model(args.model)
    assert model.training is not None
    cases = bench_cases(model, model.training, tensor_parallel=(1,), micro_batches=(1,))
    timings = run_cases(cases, precision="fp32", device="cpu")
    fit = fit_bench(CLUSTER, cases, timings, model_name=model.name,
                    seq_length=model.training.seq_length)  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        fitted = Path(folder) / "cpu.json"
        fitted.write_text(fit.updated_json)
        cluster = load_cluster(fitted)
    config = ParallelConfig(mbs=1)
    kernels = estimate(model, cluster, config).step_time_s
    layers, _ = profile_cases(model, seq_length=model.training.seq_length,
                              tensor_parallel=(1,), micro_batches=(1, 2))  # fmt: skip
    run = run_profile(model, layers, torch=torch, backend="cpu", precision="fp32",
                      stack="hf-eager")  # fmt: skip
    profile = LayerProfile(device=cluster.device.name, device_reported=run.device_name,
                           model=model.name, shape=layer_shape(model), stack="hf-eager",
                           precision="fp32", layer_code="faithful", measured=run.measured)
    eager = model.model_copy(update={"training": model.training.model_copy(
        update={"stack": "hf-eager"})})  # fmt: skip
    profiled = estimate(eager, with_profile(cluster, eager, profile), config).step_time_s
    measured, fastest = measured_step_s(args.model, args.steps)
    after = fit.after
    print(f"device: {timings.device_name} (torch {timings.torch_version})")
    print(f"fitted: gemm {after.gemm.max_fraction:g} / {after.gemm.half_saturation_gflop:g} "
          f"GFLOP, memory {after.memory_bound_fraction:g}, launch {after.kernel_launch_us:g} us")
    print(f"measured step: {measured:.4f} s (median of {args.steps}; fastest {fastest:.4f} s: "
          f"the profile and the bench time the fastest of their batches)")
    print(f"predicted from the kernels (planner bench): {kernels:.4f} s, "
          f"predicted / measured {kernels / measured:.3f}")
    print(f"predicted from the layers (planner profile): {profiled:.4f} s, "
          f"predicted / measured {profiled / measured:.3f} (/ fastest {profiled / fastest:.3f})")


if __name__ == "__main__":
    main()
