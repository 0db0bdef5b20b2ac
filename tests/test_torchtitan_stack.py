"""The ``torchtitan-eager`` stack: what torchtitan's own block keeps and moves, counted from its
source (``torchtitan/models/llama3/model/model.py`` at v0.2.2) and checked against the block
itself by ``benchmarks/torchtitan_layer.py`` (Llama 3 8B's block on 512 tokens: kept bytes
within 0.1 %, forward kernels' bytes exact, backward's within 0.4 %); torchtitan's plans and
logs priced on it, and their bands saying it is extrapolated."""

from __future__ import annotations

import pytest

import planner
from planner.frameworks import default_stack, profile
from planner.graph.lower import lower
from planner.plan.config import resolve
from planner.spec import ModelSpec, TrainingSpec
from tests.conftest import REPO

LLAMA3_8B = ModelSpec(name="torchtitan llama3 8B", num_layers=1, hidden_size=4096,
                      num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                      vocab_size=128256, max_position_embeddings=8192, activation="swiglu",
                      normalization="rmsnorm", position_embedding="rope", bias=False)  # fmt: skip
H, Q, KV, F = 4096, 4096, 1024, 14336


def _layer(stack: str, seq: int = 512) -> list:
    training = TrainingSpec(seq_length=seq, global_batch_size=1, precision="bf16", stack=stack)
    graph = lower(LLAMA3_8B, training)
    return [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]


def _per_token(ops: list, part: str, seq: int = 512) -> float:
    return sum(t.bytes for op in ops if op.unfused for t in getattr(op.unfused, part)) / seq


def test_the_block_keeps_megatrons_bytes_and_silus_output() -> None:
    """A token keeps ``8h + 4q + 4kv + 8f`` bytes: each norm's bf16 input and output, q, k, v
    and the attention's output, the gate and up projections, SiLU's output (the eager product
    keeps it) and the product; the rotary embedding's complex product keeps only the constant
    frequencies. Outside the norms (which run composite in fp32 on the CPU), torchtitan's
    block keeps 151,680 bytes a token where this count says 151,552: the rest is SDPA's
    log-sum-exp (``benchmarks/torchtitan_layer.py``)."""
    ops = _layer("torchtitan-eager")
    kept = sum(t.bytes for op in ops for t in op.saved) / 512
    assert kept == 8 * H + 4 * Q + 4 * KV + 8 * F == 167_936
    assert kept - sum(t.bytes for op in ops if op.kind == "norm" for t in op.saved) / 512 == 151_552
    megatron = sum(t.bytes for op in _layer("megatron-te") for t in op.saved) / 512
    assert kept - megatron == 2 * F  # SiLU's output


def test_the_blocks_separate_kernels_move_what_torchtitans_dispatch_moves() -> None:
    """Forward: the rotary embedding's three kernels on q and k (20 bytes an element), two
    bf16 residual adds (6), SwiGLU (10 an FFN element): 294,912 bytes a token, as dispatched
    by torchtitan's block. Backward: the q, k, v readers' and gate and up readers' gradients
    summed (6 a hidden element, three sums), the rotary embedding's (20), the residual
    stream's sums (6 twice), SwiGLU's (18): 483,328, where the block dispatches 485,376 (the
    2,048 more copy the constant frequencies' conjugate)."""
    ops = _layer("torchtitan-eager")
    assert _per_token(ops, "forward") == 20 * (Q + KV) + 2 * 6 * H + 10 * F == 294_912
    assert _per_token(ops, "backward") == 3 * 6 * H + 20 * (Q + KV) + 2 * 6 * H + 18 * F
    assert _per_token(ops, "backward") == 483_328
    assert all(op.unfused is None for op in ops if op.kind == "norm")  # one fused kernel
    assert not any(op.unfused and op.unfused.weight_forward_bytes for op in ops)  # no autocast


def test_torchtitan_plans_run_its_eager_stack_and_say_it_is_extrapolated() -> None:
    """torchtitan's plans are priced on its own stack (its export leaves ``compile`` off), a
    little slower than Megatron-Core's fused layers and faster than Hugging Face's eager
    layers under autocast; no validated run ran that stack, and the band says so."""
    model = planner.load_model(REPO / "instances/models/llama3-8b.json")
    assert default_stack("torchtitan", model) == "torchtitan-eager"
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    steps = {}
    for stack in ("megatron-te", "torchtitan-eager", "hf-eager"):
        config = planner.ParallelConfig(tp=1, pp=1, dp=8, zero=3, mbs=2, global_batch=16,
                                        recompute="selective", stack=stack)  # fmt: skip
        steps[stack] = planner.estimate(model, cluster, config)
    eager, fused = steps["torchtitan-eager"].step_time_s, steps["megatron-te"].step_time_s
    assert fused < eager < steps["hf-eager"].step_time_s
    assert eager / fused - 1 == pytest.approx(0.07, abs=0.03)
    band = steps["torchtitan-eager"].error_band
    assert band is not None
    stack = [e.text for e in band.extrapolated if e.feature == "stack"]
    assert stack == ["no validated run on the torchtitan-eager stack on H100-SXM5-80GB"]
    fused_band = steps["megatron-te"].error_band
    assert fused_band is not None and band.fraction > fused_band.fraction


def test_torchtitan_refuses_a_stack_it_does_not_run() -> None:
    """A configuration on Megatron-Core's stack is none torchtitan launches: its refusal names
    the stack it runs (``planner/frameworks/base.py``, ``Profile.refusals``)."""
    model = planner.load_model(REPO / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    config = planner.ParallelConfig(dp=8, zero=3, stack="megatron-te")
    resolved = resolve(model, cluster, config)
    assert "stack megatron-te: torchtitan runs torchtitan-eager" in profile(
        "torchtitan").refusals(resolved, model)
