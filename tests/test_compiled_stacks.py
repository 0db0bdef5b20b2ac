"""torchtitan's blocks under ``torch.compile`` (``torchtitan-compiled``): what they keep, counted
from what Inductor's partitioner saves (``benchmarks/compiled_layer_kept.py``, torch 2.13 on
the CPU, whose reading of Hugging Face's compiled layer is the H100's measured bytes to the
byte), the kernels they run apart, their loss compiled too, their plans."""

from __future__ import annotations

import pytest

import planner
from planner.graph.lower import lower
from planner.spec import ModelSpec, TrainingSpec
from planner.spec.reading import load_model
from tests.conftest import HF, REPO, shared
from tests.test_eager_stacks import KV, LLAMA3_8B, F, H, Q, _layer, _per_token

INDUCTOR_KEPT = {("llama3-8b", 1): 139_400, ("llama3-8b", 2): 86_088, ("Qwen3-8B", 1): 138_024,
                 ("llama3-8b", "op"): 55_424}
"""Bytes a token the compiled block keeps, read off Inductor's compiled function on the CPU
(``python benchmarks/compiled_layer_kept.py [--tp 2 | --model
../shared/reference/hf/Qwen3-8B.config.json | --op-sac]``): the planner's count plus SDPA's
log-sum-exp, the norms' reciprocal RMS and, for Qwen3, its rotary tables' slices."""


def _kept(model: ModelSpec, stack: str, tensor_parallel: int = 1, seq: int = 1024) -> float:
    shard = model.model_copy(update={
        "num_layers": 1, "num_attention_heads": model.num_attention_heads // tensor_parallel,
        "num_query_groups": model.query_groups // tensor_parallel,
        "ffn_hidden_size": model.ffn // tensor_parallel,
        "kv_channels": model.head_dim})  # fmt: skip
    training = TrainingSpec(seq_length=seq, global_batch_size=1, precision="bf16", stack=stack)
    graph = lower(shard, training)
    ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 1]
    return sum(t.bytes for op in ops for t in op.saved) / seq


def test_the_compiled_block_keeps_all_the_eager_one_does_but_silus_output() -> None:
    """``8h + 4q + 4kv + 6f`` bytes a token: the partitioner recomputes SiLU from the kept gate;
    within 0.1 % of what Inductor's compiled Llama 3 8B block keeps at TP 1 and 2, 0.6 % of
    Qwen3 8B's (its per-head q and k norms' values and its rotary tables' slices)."""
    llama = load_model(REPO / "instances/models/llama3-8b.json")
    compiled = _kept(llama, "torchtitan-compiled")
    assert compiled == 8 * H + 4 * Q + 4 * KV + 6 * F == 139_264
    assert _kept(llama, "torchtitan-eager") - compiled == 2 * F
    assert compiled / INDUCTOR_KEPT["llama3-8b", 1] - 1 == pytest.approx(-0.001, abs=0.0005)
    shard = _kept(llama, "torchtitan-compiled", tensor_parallel=2)
    assert shard == 8 * H + (4 * Q + 4 * KV + 6 * F) / 2
    assert shard / INDUCTOR_KEPT["llama3-8b", 2] - 1 == pytest.approx(-0.0008, abs=0.0005)
    qwen = load_model(shared(HF / "Qwen3-8B.config.json"))
    assert _kept(qwen, "torchtitan-compiled") / INDUCTOR_KEPT["Qwen3-8B", 1] - 1 == (
        pytest.approx(-0.0059, abs=0.0005))


def test_the_compiled_block_runs_fewer_fused_kernels() -> None:
    """Forward: the rotary embedding as eager's (Inductor falls back to ATen for complex
    products: 20 bytes an element of q and k, three kernels each), the residual adds written
    once (6), SwiGLU in one kernel (6 an FFN element). Backward: the separate projections'
    gradients read inside the norms' backward (2 bytes each reader past the first), the
    rotary embedding's (20), the residual stream's branch read (2), SwiGLU's one kernel with
    SiLU recomputed (10). The norms stay one kernel each way, as on the eager block."""
    ops, eager = _layer("torchtitan-compiled"), _layer("torchtitan-eager")
    assert _per_token(ops, "forward") == 20 * (Q + KV) + 2 * 6 * H + 6 * F
    assert _per_token(ops, "backward") == 3 * 2 * H + 20 * (Q + KV) + 2 * 2 * H + 10 * F
    assert _per_token(ops, "backward") < _per_token(eager, "backward")

    def kernels(layer: list, part: str) -> int:
        return sum(getattr(op.unfused, f"{part}_kernels") for op in layer if op.unfused)

    assert (kernels(ops, "forward"), kernels(ops, "backward")) == (9, 7)
    assert (kernels(eager, "forward"), kernels(eager, "backward")) == (10, 14)
    assert all(op.unfused is None for op in ops if op.kind == "norm")


def test_the_loss_is_compiled_too() -> None:
    """torchtitan compiles its loss with its blocks (``compile.components`` defaults to both,
    and the export writes both): Inductor keeps the bf16 logits (2 bytes a logit, where eager
    keeps fp32 log-probabilities, 4), its backward writes their bf16 gradient (2 bytes a logit
    held beyond them, where eager holds 8), and it reads the logits once forward (a GPU's online
    softmax) and once backward beside the gradient it writes (``benchmarks/fused_loss_code.py
    --code torchtitan``). The final norm and the output layer run as on the eager stack."""
    from planner.graph.stacks import LOSS_KEPT, LOSS_WORKING

    assert (LOSS_KEPT["torchtitan-compiled"], LOSS_WORKING["torchtitan-compiled"]) == (2.0, 2.0)
    assert (LOSS_KEPT["torchtitan-eager"], LOSS_WORKING["torchtitan-eager"]) == (4.0, 8.0)

    def head(stack: str) -> dict[str, object]:
        training = TrainingSpec(seq_length=512, global_batch_size=1, precision="bf16",
                                stack=stack)  # fmt: skip
        graph = lower(LLAMA3_8B, training)
        ops = [graph.nodes[n]["op"] for n in graph if graph.nodes[n]["op"].layer == 2]
        return {op.kind: op for op in ops}

    compiled, eager = head("torchtitan-compiled"), head("torchtitan-eager")
    logits = 512 * LLAMA3_8B.vocab_size
    loss = compiled["loss"].unfused
    assert loss is not None
    assert (loss.forward[0].bytes / logits, loss.backward[0].bytes / logits) == (2.0, 4.0)
    assert sum(t.bytes for t in compiled["loss"].saved) < sum(t.bytes for t in eager["loss"].saved)
    for kind in ("norm", "linear"):
        assert compiled[kind].unfused == eager[kind].unfused
        assert compiled[kind].saved == eager[kind].saved


def test_compiled_plans_are_faster_leaner_and_say_the_stack_is_unvalidated() -> None:
    """Llama 3 8B on 8 H100s (FSDP, 8K tokens, two-sequence microbatches, torchtitan's
    per-operator checkpointing): the compiled block and loss move fewer bytes, and the loss
    holds less; no validated run ran the stack, and the band says so."""
    model = load_model(REPO / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    steps = {}
    for stack in ("torchtitan-eager", "torchtitan-compiled"):
        config = planner.ParallelConfig(dp=8, zero=3, mbs=2, global_batch=16,
                                        recompute="selective", recompute_modules="op",
                                        overlap_grad_reduce=True, overlap_param_gather=True,
                                        stack=stack)  # fmt: skip
        steps[stack] = planner.estimate(model, cluster, config)
    eager, compiled = steps["torchtitan-eager"], steps["torchtitan-compiled"]
    assert eager.step_time_s / compiled.step_time_s - 1 == pytest.approx(0.052, abs=0.01)
    # the compiled loss keeps and holds 4 bytes a logit where eager's does 12, each compiled
    # block's checkpoint 2h bytes a token less (w2's output), and the caching allocator's
    # slack (8 % of the allocated peak) goes with them
    tokens = 2 * 8192
    saved = (8 * tokens * model.vocab_size + 2 * H * tokens * model.num_layers) * 1.08 / 2**30
    assert eager.memory.total_gib - compiled.memory.total_gib == pytest.approx(saved, rel=0.01)
    band = compiled.error_band
    assert band is not None
    assert [e.text for e in band.extrapolated if e.feature == "stack"] == [
        "no validated run on the torchtitan-compiled stack on H100-SXM5-80GB"]


def test_per_operator_checkpointing_compiled_keeps_only_what_the_backward_reads() -> None:
    """torchtitan checkpoints before it compiles: its policy marks the outputs it may save and
    Inductor's partitioner saves those the backward reads, all but ``w2``'s (only the residual
    add takes it): 2h bytes a token less than the eager cache keeps, and no more FLOPs rerun;
    55,296 counted where Inductor's checkpointed block keeps 55,424 (the log-sum-exp)."""
    from planner.diagnose.titan_sac import priced_op_sac

    model = load_model(REPO / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(REPO / "instances/clusters/dgx-h100-80gb.json", nodes=1)
    eager = priced_op_sac(model, cluster, 512)
    compiled = priced_op_sac(model, cluster, 512, stack="torchtitan-compiled")
    assert (eager.kept_bytes - compiled.kept_bytes) / 512 == 2 * H
    assert compiled.rerun_matmul_flops == eager.rerun_matmul_flops
    assert compiled.kept_bytes / 512 / INDUCTOR_KEPT["llama3-8b", "op"] - 1 == pytest.approx(
        -0.0023, abs=0.0005)
