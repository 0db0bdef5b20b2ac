"""planner bench end to end on this machine's CPU: time the kernels, fit the block, price a
training step of the tiny Llama with it, then run that step in PyTorch and compare.

    python benchmarks/bench_cpu_step.py [--steps 5]

The model is ``tests/data/bench/tiny-llama.json`` (2 layers, hidden 256, GQA 4/2 heads,
SwiGLU 704, RMSNorm, vocab 1024, fp32, sequence 256), trained as ``planner estimate`` prices
it on one device: microbatch 1, 8 microbatches accumulated, then AdamW. Printed: the fitted
block, the predicted step, the measured median step and their ratio. Needs PyTorch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from planner.diagnose.bench_cases import bench_cases
from planner.diagnose.bench_fit import fit_bench
from planner.diagnose.bench_torch import run_cases
from planner.plan.config import ParallelConfig
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "data" / "bench" / "tiny-llama.json"
CLUSTER = ROOT / "tests" / "data" / "bench" / "cpu-node.json"


class Block(nn.Module):
    """One decoder layer as the planner lowers it: RMSNorm, fused QKV with GQA, causal SDPA,
    output projection, residual; RMSNorm, fused gate-and-up, SiLU x up, down, residual."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim,
             self.kv_heads * self.head_dim], dim=-1)  # fmt: skip
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def measured_step_s(steps: int) -> float:
    """Median seconds of a training step of the tiny Llama on the CPU."""
    m = load_model(MODEL)
    assert m.training is not None
    layers = [Block(m.hidden_size, m.num_attention_heads, m.query_groups, m.ffn)
              for _ in range(m.num_layers)]  # fmt: skip
    model = nn.Sequential(nn.Embedding(m.vocab_size, m.hidden_size), *layers,
                          nn.RMSNorm(m.hidden_size), nn.Linear(m.hidden_size, m.vocab_size,
                                                               bias=False))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    seq, microbatches = m.training.seq_length, m.training.global_batch_size
    tokens = torch.randint(0, m.vocab_size, (microbatches, 1, seq + 1))
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        for i in range(microbatches):
            logits = model(tokens[i, :, :-1])
            F.cross_entropy(logits.view(-1, m.vocab_size), tokens[i, :, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main() -> None:
    """Bench, fit, price, run, compare."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    model = load_model(MODEL)
    assert model.training is not None
    cases = bench_cases(model, model.training, tensor_parallel=(1,), micro_batches=(1,))
    timings = run_cases(cases, precision="fp32", device="cpu")
    fit = fit_bench(CLUSTER, cases, timings, model_name=model.name,
                    seq_length=model.training.seq_length)  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        fitted = Path(folder) / "cpu.json"
        fitted.write_text(fit.updated_json)
        cluster = load_cluster(fitted)
    predicted = estimate(model, cluster, ParallelConfig(mbs=1)).step_time_s
    measured = measured_step_s(args.steps)
    after = fit.after
    print(f"device: {timings.device_name} (torch {timings.torch_version})")
    print(f"fitted: gemm {after.gemm.max_fraction:g} / {after.gemm.half_saturation_gflop:g} "
          f"GFLOP, memory {after.memory_bound_fraction:g}, launch {after.kernel_launch_us:g} us")
    print(f"step: predicted {predicted:.4f} s, measured {measured:.4f} s "
          f"(median of {args.steps}), predicted / measured {predicted / measured:.3f}")


if __name__ == "__main__":
    main()
