"""The eager stacks of torchtitan and Colossal-AI: what torchtitan's own block
(``torchtitan-eager``) and Hugging Face's layer cast to bf16 (``colossalai-hf``) keep and move,
counted from their source and checked against those layers themselves by
``benchmarks/eager_layer_bytes.py`` (Llama 3 8B on 512 tokens: kept bytes within 0.1 %, the
separate kernels' bytes within 0.4 %); the frameworks' plans priced on them, and their bands
saying the stack is extrapolated."""

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


def _layer(stack: str, seq: int = 512, model: ModelSpec = LLAMA3_8B) -> list:
    training = TrainingSpec(seq_length=seq, global_batch_size=1, precision="bf16", stack=stack)
    graph = lower(model, training)
    return [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]


LLAMA3_8B_FILE = planner.load_model(REPO / "instances/models/llama3-8b.json")


def _fsdp_steps(*stacks: str) -> dict[str, planner.Estimate]:
    """Llama 3 8B on 8 H100s, FSDP (ZeRO-3), microbatch 2, selective recompute, on each
    stack."""
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    configs = {stack: planner.ParallelConfig(tp=1, pp=1, dp=8, zero=3, mbs=2, global_batch=16,
                                             recompute="selective", stack=stack)
               for stack in stacks}  # fmt: skip
    return {s: planner.estimate(LLAMA3_8B_FILE, cluster, c) for s, c in configs.items()}


def _per_token(ops: list, part: str, seq: int = 512) -> float:
    return sum(t.bytes for op in ops if op.unfused for t in getattr(op.unfused, part)) / seq


def test_the_block_keeps_megatrons_bytes_and_silus_output() -> None:
    """A token keeps ``8h + 4q + 4kv + 8f`` bytes: each norm's bf16 input and output, q, k, v
    and the attention's output, the gate and up projections, SiLU's output (the eager product
    keeps it) and the product; the rotary embedding's complex product keeps only the constant
    frequencies. Outside the norms (which run composite in fp32 on the CPU), torchtitan's
    block keeps 151,680 bytes a token where this count says 151,552: the rest is SDPA's
    log-sum-exp (``benchmarks/eager_layer_bytes.py``)."""
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
    little slower than Megatron-Core's fused layers (its separate kernels, and FSDP2's copies
    of 14 bytes a parameter a microbatch at ZeRO-3) and faster than Hugging Face's eager
    layers under autocast; no validated run ran that stack, and the band says so."""
    assert default_stack("torchtitan", LLAMA3_8B_FILE) == "torchtitan-eager"
    steps = _fsdp_steps("megatron-te", "torchtitan-eager", "hf-eager")
    eager, fused = steps["torchtitan-eager"].step_time_s, steps["megatron-te"].step_time_s
    assert fused < eager < steps["hf-eager"].step_time_s
    assert eager / fused - 1 == pytest.approx(0.095, abs=0.03)
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
    assert "stack megatron-te: torchtitan runs torchtitan-eager, torchtitan-compiled" in profile(
        "torchtitan").refusals(resolved, model)


def test_hugging_faces_layer_in_bf16_keeps_its_norms_upcast_copies() -> None:
    """Colossal-AI casts Hugging Face's layer to bf16: as torchtitan's block but for
    ``LlamaRMSNorm``, which keeps the fp32 copy of its input and its normalized output cast
    back (6 bytes an element, not 2): ``16h + 4q + 4kv + 8f`` bytes a token, 200,704 for
    Llama 3 8B, where Hugging Face's layer keeps 200,840 (SDPA's log-sum-exp and the norms'
    value a token the rest). A LayerNorm model's norm is PyTorch's fused one."""
    ops = _layer("colossalai-hf")
    kept = sum(t.bytes for op in ops for t in op.saved) / 512
    assert kept == 16 * H + 4 * Q + 4 * KV + 8 * F == 200_704
    gpt = LLAMA3_8B.model_copy(update={"normalization": "layernorm"})
    norms = [op for op in _layer("colossalai-hf", model=gpt) if op.kind == "norm"]
    assert all(op.unfused is None and len(op.saved) == 1 for op in norms)


def test_hugging_faces_layer_in_bf16_moves_what_it_dispatches() -> None:
    """Its separate kernels, as Hugging Face's ``LlamaDecoderLayer`` in bf16 dispatches them:
    the two norms 36 bytes an element forward and 96 backward (294,912 and 786,432 a token,
    measured 294,952 and 786,528), the rest 294,912 and 544,768 (measured the same): the
    rotary embedding's halves rotated in bf16 (20 and 32 bytes a q or k element), the
    residual adds, SwiGLU and the projections' gradient sums as torchtitan's."""
    ops = _layer("colossalai-hf")
    norms = [op for op in ops if op.kind == "norm"]
    rest = [op for op in ops if op.kind != "norm"]
    assert _per_token(norms, "forward") == 2 * 36 * H == 294_912
    assert _per_token(norms, "backward") == 2 * 96 * H == 786_432
    assert _per_token(rest, "forward") == 294_912
    assert _per_token(rest, "backward") == 3 * 6 * H + 32 * (Q + KV) + 2 * 6 * H + 18 * F
    assert _per_token(rest, "backward") == 544_768


def test_colossalai_plans_run_hugging_faces_layers_in_bf16() -> None:
    """Colossal-AI's plans are priced on Hugging Face's layers cast to bf16, slower than
    torchtitan's block (the norms run unfused) and faster than the same layers under
    autocast (no fp32 residual stream, no casts); the band says the stack is extrapolated."""
    assert default_stack("colossalai", LLAMA3_8B_FILE) == "colossalai-hf"
    steps = _fsdp_steps("torchtitan-eager", "colossalai-hf", "hf-eager")
    times = [steps[s].step_time_s for s in ("torchtitan-eager", "colossalai-hf", "hf-eager")]
    assert times == sorted(times)
    band = steps["colossalai-hf"].error_band
    assert band is not None
    assert [e.feature for e in band.extrapolated if e.feature == "stack"] == ["stack"]


def test_fsdp2_copies_every_parameter_as_torchtitan_shards_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2's copies on the compute stream (``torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py``): at ZeRO-3 each gathered bf16 weight is copied out of the
    all-gather buffer twice a microbatch (forward, and again before the backward) and each
    gradient into the fp32 reduce-scatter buffer, 14 bytes a parameter; Llama 3 8B's step on 8
    H100s (one microbatch) is exactly that much memory-bound work longer than the same step
    without them."""
    from planner.cost import data_parallel
    from planner.graph import parameter_count

    model = LLAMA3_8B_FILE
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    config = planner.ParallelConfig(dp=8, zero=3, mbs=2, global_batch=16, stack="torchtitan-eager")
    with_copies = planner.estimate(model, cluster, config).step_time_s
    monkeypatch.setattr(data_parallel, "FSDP2_STACKS", ())
    without = planner.estimate(model, cluster, config).step_time_s
    params = parameter_count(lower(model, TrainingSpec(seq_length=8192, global_batch_size=16)))
    copies = data_parallel.fsdp2_copies("bf16", 3)
    assert copies.bytes_per_param == copies.first_bytes_per_param == 14.0
    expected = copies.seconds(cluster.device, params=params.total, num_microbatches=1)
    assert with_copies - without == pytest.approx(expected, rel=1e-6)


def test_qwen3s_per_head_norms_are_the_stacks_norms() -> None:
    """Qwen3's q and k RMSNorms (per head, over its dimension) are the stack's norms over q's
    and k's elements: Hugging Face's written out under Colossal-AI (6 bytes kept, 36 and 96
    moved an element; ``benchmarks/eager_layer_bytes.py --code transformers --model
    ../shared/reference/hf/Qwen3-8B.config.json``: the norms' bytes within 0.2 %), one fused
    kernel keeping the bf16 input on Megatron-Core's and torchtitan's stacks, with their
    weights one per head dimension."""
    qwen = LLAMA3_8B.model_copy(update={"qk_layernorm": True, "ffn_hidden_size": 12288})
    for stack, kept, forward, backward in (("colossalai-hf", 6, 36, 96), ("megatron-te", 2, 0, 0),
                                           ("torchtitan-eager", 2, 0, 0)):  # fmt: skip
        (norm,) = [op for op in _layer(stack, model=qwen) if op.name.endswith("qk_norm")]
        assert sum(t.bytes for t in norm.saved) / 512 == kept * (Q + KV), stack
        assert _per_token([norm], "forward") == forward * (Q + KV), stack
        assert _per_token([norm], "backward") == backward * (Q + KV), stack
        assert norm.extra_params == 2 * 128


def test_qwen3s_block_rotates_halves_by_real_tables() -> None:
    """torchtitan builds its Qwen3 block for a model with q/k norms, which rotates q's and k's
    halves by real cos/sin tables (``x * cos + rotate_half(x) * sin`` in bf16, before the
    transpose): 20 bytes an element forward in 5 kernels, 28 backward in 7, where Llama 3's
    complex products move 20 and 20 in 3 and 3; ``benchmarks/eager_layer_bytes.py --model
    ../shared/reference/hf/Qwen3-8B.config.json`` dispatches 487,424 bytes a token in the
    block's backward beside its norms, as counted, and 22 kernels. Compiled, one fused kernel
    each way (4 bytes); Hugging Face's stacks rotate halves on either model."""
    qwen = LLAMA3_8B.model_copy(update={"qk_layernorm": True, "ffn_hidden_size": 12288})

    def rotation(stack: str, model: ModelSpec) -> tuple[float, float, int, int]:
        (core,) = [op for op in _layer(stack, model=model) if op.kind == "attention"]
        work = core.unfused
        assert work is not None
        elements = (Q + KV) * 512
        return (sum(t.bytes for t in work.forward) / elements,
                sum(t.bytes for t in work.backward) / elements,
                work.forward_kernels // 2, work.backward_kernels // 2)  # fmt: skip

    assert rotation("torchtitan-eager", qwen) == (20, 28, 5, 7)
    assert rotation("torchtitan-eager", LLAMA3_8B) == (20, 20, 3, 3)
    assert rotation("torchtitan-compiled", qwen) == (4, 4, 1, 1)
    assert rotation("colossalai-hf", qwen) == rotation("colossalai-hf", LLAMA3_8B)
    ops = _layer("torchtitan-eager", model=qwen)
    assert _per_token([op for op in ops if op.kind != "norm"], "backward") == 487_424
