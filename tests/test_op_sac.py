"""torchtitan's selective checkpointing: per operator (``selective_ac_option = "op"``, the
recompute module ``op``), what a dense or MoE block keeps and reruns under it, counted from
torchtitan's policy and checked against torchtitan's own block; and every n-th block
(``selective_ac_option = n``), the planner's full recomputation of some layers; the rules
that launch them and refuse them; the search choosing among them."""

from __future__ import annotations

import importlib.util
import tomllib

import pytest

import planner
from planner.frameworks import launch, profile
from planner.plan.config import ParallelConfig, resolve
from planner.plan.degrees import Degrees
from planner.sharding.uniform import UniformQuery, uniform_layout, uniform_parts
from planner.uniform.batch import estimate_batch
from planner.uniform.remedies import config_remedies
from tests.conftest import REPO, SHARED
from tests.test_eager_stacks import LLAMA3_8B
from tests.test_estimate_batch import agree

H, Q, KV, F = 4096, 4096, 1024, 14336
MODEL = planner.load_model(REPO / "instances/models/llama3-8b.json")
H100 = REPO / "instances/clusters/dgx-h100-80gb.json"
needs_torchtitan = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchtitan") is None,
    reason="torchtitan's block needs PyTorch and torchtitan (the test extra has both)")


def _parts(tp: int, modules: tuple[str, ...] = ("op",), seq: int = 1024):
    query = UniformQuery(kind="dense", layout=uniform_layout(Degrees(tp=tp, sp=tp > 1)),
                         micro_batch_size=1, seq_length=seq, precision="bf16",
                         stack="torchtitan-eager", recompute_modules=modules)  # fmt: skip
    return uniform_parts(MODEL, planner.load_cluster(H100, nodes=1), query)


def test_a_token_keeps_the_input_and_the_saved_outputs() -> None:
    """Unsharded, a token keeps the block's input, ``wq``'s and ``wv``'s outputs, attention's,
    ``w1``'s and ``w2``'s (the odd matmuls): ``8h + 2kv + 2f`` bytes, 63,488 for Llama 3 8B,
    where the block keeps 167,936 without checkpointing and 8,192 fully checkpointed."""
    parts = _parts(1)
    assert parts.kept_bytes[1] / 1024 == 2 * H + 2 * Q + 2 * KV + 2 * Q + 2 * F + 2 * H == 63_488
    assert (parts.kept_bytes[0] / 1024, parts.kept_bytes[2] / 1024) == (167_936, 8_192)
    # the rerun rebuilds the rest of one block at a time
    assert parts.working_bytes[1] == parts.kept_bytes[0] - parts.kept_bytes[1]


def test_tensor_parallel_keeps_the_partial_sum_and_the_reduce_scatters() -> None:
    """Under TP with sequence parallelism, the saved matmuls keep their shards but ``w2``'s
    output, a partial sum of the whole sequence; the two reduce-scatters' outputs are saved
    (``reduce_scatter_tensor`` is in the save list), so they are neither rebuilt nor rerun,
    while the all-gathers before ``wq`` and ``w1`` are."""
    for tp in (2, 4):
        parts = _parts(tp)
        split = (2 * H + 2 * Q + 2 * KV + 2 * Q + 2 * F) / tp
        assert parts.kept_bytes[1] / 1024 == split + 2 * H + 2 * (2 * H / tp)
        # two all-gathers of the four collectives a forward runs: half of full's rerun
        assert parts.selective_rerun_comm_s[0] == pytest.approx(parts.rerun_comm_s[0] / 2)


def test_the_rerun_skips_the_saved_matmuls_and_attention() -> None:
    """The backward reruns ``wk``, ``wo`` and ``w3`` (159.4 MFLOP a token of the 436.2 the
    projections run) and every memory-bound kernel, not attention."""
    parts = _parts(1)
    tokens = 1024
    assert parts.rerun_flops[1] / tokens == 2 * H * (KV + H + F) == 159_383_552
    assert parts.rerun_flops[2] / tokens > 436_207_616  # attention's too
    none, selective, full = (_parts(1, m).rerun_s[k] for m, k in (((), 0), (("op",), 1),
                                                                   ((), 2)))  # fmt: skip
    assert none == 0 < selective < full / 2


@needs_torchtitan
def test_torchtitans_block_keeps_and_reruns_what_the_planner_counts() -> None:
    """torchtitan's own block under its own policy on the CPU (``planner.diagnose.titan_sac``):
    the matmul FLOPs it reruns exactly, the bytes it keeps but SDPA's log-sum-exp (4 bytes a
    head a token), which no stack counts; at TP 2, on two gloo processes with torchtitan's
    own TP plan, one rank's bytes likewise, the partial sum and the reduce-scatters' outputs
    included. ``python benchmarks/op_sac.py`` prints Llama 3 8B: 63,616 bytes a token kept,
    63,488 counted."""
    from planner.diagnose.titan_sac import measure_op_sac, priced_op_sac

    small = LLAMA3_8B.model_copy(update={"hidden_size": 512, "num_attention_heads": 8,
                                         "num_query_groups": 2, "ffn_hidden_size": 1536})
    cluster, seq = planner.load_cluster(H100, nodes=1), 128
    measured, priced = measure_op_sac(small, seq), priced_op_sac(small, cluster, seq)
    assert measured.forward_matmul_flops == priced.forward_matmul_flops
    assert measured.rerun_matmul_flops == priced.rerun_matmul_flops
    assert measured.kept_bytes - priced.kept_bytes == 4 * small.num_attention_heads * seq
    shard, counted = measure_op_sac(small, seq, 2), priced_op_sac(small, cluster, seq, 2)
    assert shard.kept_bytes - counted.kept_bytes == 4 * small.num_attention_heads // 2 * seq


@needs_torchtitan
def test_torchtitans_moe_block_keeps_and_reruns_what_the_planner_counts() -> None:
    """torchtitan's Qwen3 block with experts (a shared one too) under its own policy on the
    CPU: it keeps the attention half's saved outputs and the shared expert's odd matmuls,
    nothing of the routed experts, the router or the combine; its ``mm`` FLOPs (the router's
    gate forced to recompute, out of the count) exactly; the bytes but the log-sum-exp.
    ``python benchmarks/op_sac.py --model ../shared/reference/hf/Qwen3-30B-A3B.config.json``:
    21,632 bytes a token kept, 21,504 counted."""
    from planner.diagnose.titan_sac import measure_op_sac, priced_op_sac

    moe = planner.ModelSpec.model_validate(dict(
        name="small-moe", num_layers=1, hidden_size=512, num_attention_heads=8,
        num_query_groups=2, ffn_hidden_size=1024, vocab_size=1024,
        max_position_embeddings=256, activation="swiglu", normalization="rmsnorm",
        position_embedding="rope", tie_word_embeddings=False, bias=False, qk_layernorm=True,
        moe=dict(num_experts=8, top_k=2, ffn_hidden_size=256, shared_experts=1)))  # fmt: skip
    cluster, seq = planner.load_cluster(H100, nodes=1), 128
    measured, priced = measure_op_sac(moe, seq), priced_op_sac(moe, cluster, seq)
    h, q, kv, shared = 512, 512, 128, 256
    # the input, wq's, wv's, attention's, the shared expert's w1 and w2 (its 5th and 7th mm)
    assert priced.kept_bytes / seq == 2 * (h + q + kv + q + shared + h) == 4_864
    assert measured.kept_bytes - priced.kept_bytes == 4 * moe.num_attention_heads * seq
    assert measured.forward_matmul_flops == priced.forward_matmul_flops
    # wk, wo, the router's gate and the shared expert's w3
    assert measured.rerun_matmul_flops == priced.rerun_matmul_flops == seq * 2 * h * (
        kv + h + 8 + shared)


def _torchtitan_plan(**pins: str) -> tuple[planner.Plan, planner.ClusterSpec]:
    """Llama 3 8B for torchtitan on 8 H100s, 64 sequences of 8,192 tokens."""
    cluster = planner.load_cluster(H100, nodes=1)
    options = planner.SolveOptions(framework="torchtitan", global_batch_size=64,
                                   pins=planner.Pins(**pins))  # fmt: skip
    return planner.solve(MODEL, cluster, options), cluster


def test_only_torchtitan_launches_it() -> None:
    """Megatron-Core has no module ``op``; ``op`` stands alone; torchtitan launches it as
    ``selective_ac_option = "op"`` and runs no other selective recomputation."""
    plan, cluster = _torchtitan_plan(recompute_modules="op")
    assert plan.configuration is not None
    on_te = plan.configuration.model_copy(update={"stack": "megatron-te"})
    (refusal,) = profile("megatron").refusals(resolve(MODEL, cluster, on_te), MODEL)
    assert refusal.startswith("recompute module op: torchtitan's per-operator policy; "
                              "Megatron-Core's --recompute-modules are core_attn, moe_act,")
    with pytest.raises(ValueError, match="name it alone"):
        ParallelConfig(recompute="selective", recompute_modules="op,core_attn")
    # explain's notches leave the policy or drop it, never to a Megatron module
    changes = [s.change for s in planner.explain(plan, MODEL, cluster).sensitivities
               if s.knob.startswith("recompute")]  # fmt: skip
    assert changes == ["recompute selective -> none (recompute-modules op dropped)",
                       "recompute selective -> full (recompute-modules op dropped)"]
    text = launch(plan, "torchtitan", model=MODEL, cluster=cluster).text
    assert tomllib.loads(text)["activation_checkpoint"] == {"mode": "selective",
                                                            "selective_ac_option": "op"}


def test_the_search_chooses_among_torchtitans_checkpointing() -> None:
    """torchtitan's ``llama3_8b.toml`` (v0.2.2) trains on 8 GPUs with FSDP, a local batch of
    1 and per-operator checkpointing: with that policy pinned, the search picks the same.
    Left free, it checkpoints every 4th block (8 of 32, ``selective_ac_option = "4"``), 4 %
    faster at 73.3 GiB: 7 blocks would fit too, but no n checkpoints 7 of 32. Nothing
    recomputed needs 83.8 GiB; every block recomputed is 15 % slower than the per-operator
    policy."""
    pinned, cluster = _torchtitan_plan(recompute_modules="op")
    c = pinned.configuration
    assert c is not None
    assert (c.tp, c.pp, c.zero, c.mbs, c.recompute, c.recompute_modules) == (
        1, 1, 3, 1, "selective", "op")
    steps = {r: planner.estimate(MODEL, cluster, c.model_copy(update={
        "recompute": r, "recompute_modules": None})) for r in ("none", "full")}  # fmt: skip
    assert not steps["none"].fits and steps["none"].peak_memory_gib > 80
    assert steps["full"].step_time_s / pinned.predicted.step_time_s == pytest.approx(1.154,
                                                                                    abs=0.01)
    free, _ = _torchtitan_plan()
    f = free.configuration
    assert f is not None
    assert (f.tp, f.zero, f.mbs, f.recompute, f.recompute_layers) == (1, 3, 1, "full", 8)
    assert free.predicted.step_time_s / pinned.predicted.step_time_s == pytest.approx(0.960,
                                                                                     abs=0.005)
    seven = f.model_copy(update={"recompute_layers": 7})
    assert planner.estimate(MODEL, cluster, seven).fits
    assert "no n recomputes 7" in " ".join(profile("torchtitan").refusals(
        resolve(MODEL, cluster, seven), MODEL))  # fmt: skip
    toml = tomllib.loads(launch(free, "torchtitan", model=MODEL, cluster=cluster).text)
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "4"}


def test_batch_agrees_with_estimate() -> None:
    """``estimate_batch`` prices the policy as ``estimate`` does, over TP, PP, CP, EP and
    ZeRO; on an MoE model the experts' all-to-alls run again."""
    cluster = planner.load_cluster(H100, nodes=2)
    configs = [ParallelConfig(tp=tp, pp=pp, cp=cp, sp=tp > 1, zero=zero, mbs=mbs,
                              recompute="selective", recompute_modules="op", global_batch=64)
               for tp, pp, cp, zero, mbs in ((1, 1, 1, 3, 1), (2, 1, 1, 1, 2), (4, 2, 1, 1, 1),
                                             (2, 1, 2, 2, 1), (8, 2, 1, 0, 1))]  # fmt: skip
    batch = estimate_batch(MODEL, cluster, configs)
    assert agree(batch, configs, MODEL, cluster) == len(configs)
    # and on MoE blocks, the experts in place and over EP (their all-to-alls rerun)
    moe = planner.load_model(SHARED / "reference/hf/Qwen3-30B-A3B.config.json")
    configs = [ParallelConfig(pp=pp, ep=ep, zero=zero, recompute="selective",
                              recompute_modules="op", global_batch=64, seq_len=4096)
               for pp, ep, zero in ((1, 1, 3), (1, 8, 3), (2, 4, 1), (1, 16, 0))]  # fmt: skip
    batch = estimate_batch(moe, cluster, configs)
    assert agree(batch, configs, moe, cluster) == len(configs)
    none, op = (planner.estimate(moe, cluster, configs[1].model_copy(update=update))
                for update in ({"recompute": "none", "recompute_modules": None}, {}))
    assert op.time.expert_parallel_comm_s > none.time.expert_parallel_comm_s


def test_remedies_offer_torchtitans_own_selective_recomputation() -> None:
    """A torchtitan configuration that does not fit is told of torchtitan's per-operator
    policy (56.3 GiB), the mildest recomputation that fits; without the framework, of full
    recomputation, since Megatron's attention core keeps as much under flash attention."""
    cluster = planner.load_cluster(H100, nodes=1)
    config = ParallelConfig(tp=1, zero=3, mbs=1, global_batch=64, stack="torchtitan-eager",
                            overlap_grad_reduce=True, overlap_param_gather=True)  # fmt: skip
    changes = {fw: [r.change for r in config_remedies(MODEL, cluster, config, framework=fw)
                    if r.fits and r.change.startswith("--recompute")]
               for fw in ("torchtitan", None)}  # fmt: skip
    assert changes == {"torchtitan": ["--recompute selective --recompute-modules op"],
                       None: ["--recompute full"]}
