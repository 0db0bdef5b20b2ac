"""Every knob of ``planner estimate`` moves the estimate the way the literature says.

One test (or a small parametrized group) per knob, through the library API, on the bundled
models and clusters. Each test names the expected direction and its source:

- Megatron-LM: Shoeybi et al. 2019 (tensor parallelism), Narayanan et al., SC'21 ("Efficient
  Large-Scale Language Model Training on GPU Clusters": 1F1B, interleaving, Eq. 3 FLOPs),
  Korthikanti et al., MLSys'23 ("Reducing Activation Recomputation": activation memory,
  sequence parallelism, selective recomputation).
- Rajbhandari et al., SC'20 (ZeRO); Dao et al. 2022 / Dao 2023 (FlashAttention);
  Huang et al. 2019 (GPipe); Liu et al. 2023 (Ring Attention, context parallelism).

Exact comparisons where a published formula gives an exact value, strict inequalities
otherwise. The reference setting is GPT-3 175B on 128 DGX A100 nodes with TP 8 and PP 16
(Narayanan et al.'s 175B configuration family): 96 layers of 6 per stage, 192 microbatches.
"""

from __future__ import annotations

from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

import planner
from planner import ClusterSpec, ConfigError, Estimate, ModelSpec, ParallelConfig
from planner.vocabulary import Recompute

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "instances" / "models"
CLUSTERS_DIR = REPO / "instances" / "clusters"

GPT3 = "gpt3-175b"
MIXTRAL = "mixtral-8x7b"
LLAMA70B = "llama3-70b"
A100 = "dgx-a100-80gb"
H100 = "dgx-h100-80gb"

GIB = 1024**3
MASK_BYTES = 1  # dropout masks are kept as one byte per element (Korthikanti et al., Sec. 4.1)
REL = 1e-9  # for values a formula gives exactly (floating-point noise only)


@cache
def _model(name: str) -> ModelSpec:
    base, _, variant = name.partition("+")
    model = planner.load_model(MODELS_DIR / f"{base}.json")
    if variant == "rope":  # learned positions cap the sequence at 2048; RoPE does not
        model = model.model_copy(update={"position_embedding": "rope"})
    return model


@cache
def _cluster(name: str, nodes: int | None = None) -> ClusterSpec:
    return planner.load_cluster(CLUSTERS_DIR / f"{name}.json", nodes)


def _estimate(
    config: ParallelConfig, *, model: str = GPT3, cluster: str = A100, nodes: int | None = None
) -> Estimate:
    """The planner's estimate of ``config`` (default: GPT-3 175B on 128 DGX A100 nodes)."""
    return planner.estimate(_model(model), _cluster(cluster, nodes), config)


def _strictly_decreasing(values: list[float]) -> bool:
    return all(a > b for a, b in pairwise(values))


def _strictly_increasing(values: list[float]) -> bool:
    return all(a < b for a, b in pairwise(values))


def _busy_s(e: Estimate) -> float:
    """``m`` times the slowest stage's per-microbatch time, when no data-parallel traffic is
    paid per microbatch (ZeRO < 2): every part of the step except bubble, DP tail, optimizer."""
    t = e.time
    return (
        t.compute_s
        + t.tensor_parallel_comm_s
        + t.context_parallel_comm_s
        + t.expert_parallel_comm_s
        + t.pipeline_comm_s
    )


# --------------------------------------------------------------------------- tp


def test_tp_shards_weights_and_activations_and_adds_tp_comm() -> None:
    """Tensor parallelism (Shoeybi et al. 2019; Korthikanti et al., Table 2): weights per device
    fall as ~1/t (norms, biases and position embeddings stay replicated, so never below 1/t),
    activations as sbh(10 + 24/t), and the f/g all-reduces appear only when t > 1."""
    degrees = [1, 2, 4, 8]  # within one 8-GPU node
    est = {t: _estimate(ParallelConfig(tp=t, pp=16)) for t in degrees}
    weights = [est[t].memory.weights_gib for t in degrees]
    assert _strictly_decreasing(weights)
    for t in degrees:
        share = est[t].memory.weights_gib / (weights[0] / t)
        assert 1.0 <= share < 1.05, (t, share)
    assert _strictly_decreasing([est[t].memory.activations_gib for t in degrees])
    assert est[1].time.tensor_parallel_comm_s == 0.0
    assert all(est[t].time.tensor_parallel_comm_s > 0.0 for t in degrees[1:])


# --------------------------------------------------------------------------- pp

PP_DEGREES = [1, 2, 4, 8, 16]
PP_GLOBAL_BATCH = 512  # with dp 8 and mbs 1: m = 64 microbatches at every pp


def _pp_estimate(pp: int) -> Estimate:
    """GPT-3 175B, TP 8, DP 8, global batch 512: the cluster grows with the pipeline."""
    return _estimate(ParallelConfig(tp=8, pp=pp, dp=8, global_batch=PP_GLOBAL_BATCH), nodes=pp * 8)


def test_pp_shards_weights_and_only_pipelines_send() -> None:
    """Pipeline parallelism splits the layers (Narayanan et al., Sec. 2.2): weights per device
    fall with p; point-to-point sends and a bubble exist only when p > 1."""
    est = {p: _pp_estimate(p) for p in PP_DEGREES}
    assert _strictly_decreasing([est[p].memory.weights_gib for p in PP_DEGREES])
    assert est[1].time.pipeline_comm_s == 0.0
    assert est[1].time.pipeline_bubble_s == 0.0
    assert est[1].bubble_fraction == 0.0
    for p in PP_DEGREES[1:]:
        assert est[p].time.pipeline_comm_s > 0.0
        assert est[p].time.pipeline_bubble_s > 0.0


@pytest.mark.parametrize("pp", PP_DEGREES[1:])
def test_pp_bubble_fraction_is_p_minus_1_over_m(pp: int) -> None:
    """1F1B's bubble fraction is (p - 1) / m for equal stages (Narayanan et al., Sec. 2.2.1).
    Here the first and last stages also carry the embedding and the head, so the bubble
    (sum of stage times - slowest) is at most (p - 1) x slowest and a little below it; and
    that is the bubble over the busy time m x slowest stage. The reported fraction is the
    bubble's share of the step, as the breakdown prints it (:func:`cost.bubble_share`)."""
    e = _pp_estimate(pp)
    m = PP_GLOBAL_BATCH // 8
    assert e.num_microbatches == m
    closed_form = (pp - 1) / m
    over_busy = e.time.pipeline_bubble_s / _busy_s(e)
    assert 0.9 * closed_form <= over_busy <= closed_form * (1 + REL)
    assert e.bubble_fraction == pytest.approx(e.time.pipeline_bubble_s / e.step_time_s, rel=REL)


# --------------------------------------------------------------------------- dp / --nodes


def test_more_nodes_shorten_the_step() -> None:
    """Data parallelism at a fixed global batch (Narayanan et al., Sec. 3.3): more replicas mean
    fewer microbatches per replica, m = B / (d b), hence a shorter step."""
    nodes = [16, 32, 64, 128]
    est = [_estimate(ParallelConfig(tp=8, pp=8, global_batch=1536), nodes=n) for n in nodes]
    for n, e in zip(nodes, est, strict=True):
        assert e.num_devices == 8 * n
        assert e.dp == 8 * n // 64
        assert e.num_microbatches == 1536 // e.dp
    assert _strictly_decreasing([e.step_time_s for e in est])
    assert _strictly_increasing([e.tokens_per_s for e in est])


def test_explicit_dp_must_fill_the_cluster() -> None:
    """An explicit dp must satisfy tp x pp x cp x dp = devices; the error shows the arithmetic.
    A dp that does fill the cluster is the same as leaving it to the default."""
    with pytest.raises(ConfigError, match=r"dp\(4\).*512.*1024"):
        _estimate(ParallelConfig(tp=8, pp=16, dp=4))
    assert _estimate(ParallelConfig(tp=8, pp=16, dp=8)) == _estimate(ParallelConfig(tp=8, pp=16))


# --------------------------------------------------------------------------- cp

CP_DEGREES = [1, 2, 4, 8]


def test_cp_splits_activations_not_weights() -> None:
    """Context parallelism splits every activation along the sequence (Megatron-Core CP):
    Llama 3 70B at 32k tokens keeps 1/cp of the activations per device, and the same weights
    (CP replicates them). Data parallelism is held at 2 so m is the same everywhere."""
    est = {
        cp: _estimate(
            ParallelConfig(tp=8, pp=4, cp=cp, dp=2, seq_len=32768, global_batch=64),
            model=LLAMA70B, cluster=H100, nodes=8 * cp,
        )
        for cp in CP_DEGREES
    }  # fmt: skip
    base = est[1].memory
    for cp in CP_DEGREES:
        assert est[cp].memory.activations_gib == pytest.approx(base.activations_gib / cp, rel=REL)
        assert est[cp].memory.weights_gib == pytest.approx(base.weights_gib, rel=REL)
    assert est[1].time.context_parallel_comm_s == 0.0


def test_cp_ring_traffic_shows_when_attention_cannot_hide_it() -> None:
    """Ring attention passes K/V blocks around the CP group behind the attention compute (Liu
    et al. 2023); it is exposed once a block's transfer outlasts its compute. GPT-3's full
    multi-head K/V at 8k tokens with CP across nodes: absent at cp 1, exposed and growing
    with cp (blocks of s/cp tokens: traffic ~ s per step, compute ~ (s/cp)^2)."""
    comm = [
        _estimate(
            ParallelConfig(tp=8, pp=2, cp=cp, dp=2, seq_len=8192, global_batch=64),
            model=GPT3 + "+rope", cluster=H100, nodes=4 * cp,
        ).time.context_parallel_comm_s
        for cp in CP_DEGREES
    ]  # fmt: skip
    assert comm[0] == 0.0
    assert comm[1] > 0.0
    assert _strictly_increasing(comm)


# --------------------------------------------------------------------------- ep

EP_DEGREES = [1, 2, 4, 8]


def test_ep_shards_experts_and_adds_all_to_all() -> None:
    """Expert parallelism (Megatron-Core MoE; GShard): each device holds num_experts / ep of
    the experts, so weights, gradients and optimizer states fall with ep, the expert share
    exactly as 1/ep; token dispatch and combine add all-to-alls only when ep > 1."""
    est = {
        ep: _estimate(ParallelConfig(pp=4, ep=ep), model=MIXTRAL, cluster=H100, nodes=8)
        for ep in EP_DEGREES
    }
    for part in ("weights_gib", "gradients_gib", "optimizer_gib"):
        values = [getattr(est[ep].memory, part) for ep in EP_DEGREES]
        assert _strictly_decreasing(values), part
        # values[ep] = dense + experts / ep: solve from ep 1 and 2, predict 4 and 8.
        experts = 2 * (values[0] - values[1])
        dense = values[0] - experts
        assert dense > 0.0
        for ep, value in zip(EP_DEGREES, values, strict=True):
            assert value == pytest.approx(dense + experts / ep, rel=1e-9), (part, ep)
    assert est[1].time.expert_parallel_comm_s == 0.0
    assert all(est[ep].time.expert_parallel_comm_s > 0.0 for ep in EP_DEGREES[1:])


# --------------------------------------------------------------------------- vpp

VPP_DEGREES = [1, 2, 3, 6]  # 96 layers = 16 stages x vpp x (6 / vpp) layers


def test_vpp_shrinks_the_bubble_and_multiplies_pipeline_sends() -> None:
    """Interleaved 1F1B (Narayanan et al., Sec. 2.2.2): v model chunks per device cut the
    bubble to (p - 1) / (v m) at the price of v times the point-to-point communication; the
    first stage holds 1 + (p - 1) / (p v) times the 1F1B activations (Korthikanti et al.,
    Sec. 4.2.3)."""
    p = 16
    est = {v: _estimate(ParallelConfig(tp=8, pp=p, vpp=v)) for v in VPP_DEGREES}
    m = est[1].num_microbatches
    assert m == 192
    assert _strictly_decreasing([est[v].time.pipeline_bubble_s for v in VPP_DEGREES])
    for v in VPP_DEGREES:
        e = est[v]
        assert e.time.pipeline_comm_s == pytest.approx(v * est[1].time.pipeline_comm_s, rel=REL)
        closed_form = (p - 1) / (v * m)
        over_busy = e.time.pipeline_bubble_s / _busy_s(e)
        assert 0.9 * closed_form <= over_busy <= closed_form * (1 + REL)
        assert e.bubble_fraction == pytest.approx(e.time.pipeline_bubble_s / e.step_time_s,
                                                  rel=REL)  # fmt: skip
        factor = 1 + (p - 1) / (p * v) if v > 1 else 1.0
        assert e.memory.activations_gib == pytest.approx(
            factor * est[1].memory.activations_gib, rel=1e-2
        )


# --------------------------------------------------------------------------- sp


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_sp_lowers_activations(tp: int) -> None:
    """Sequence parallelism (Korthikanti et al., Sec. 4.2.2) splits the layer norms and dropouts
    along the sequence: sbh(10 + 24/t) becomes sbh 34/t, strictly less for t > 1."""
    off = _estimate(ParallelConfig(tp=tp, pp=16))
    on = _estimate(ParallelConfig(tp=tp, pp=16, sp=True))
    assert on.memory.activations_gib < off.memory.activations_gib


def test_sp_without_tp_changes_nothing() -> None:
    """Sequence parallelism lives inside the tensor-parallel group: with t = 1 it is a no-op."""
    assert _estimate(ParallelConfig(pp=16, sp=True)) == _estimate(ParallelConfig(pp=16))


@pytest.mark.parametrize(
    ("tp", "sp"),
    [
        (1, False),
        (2, False),
        (4, False),
        (8, False),
        (2, True),
        (8, True),
    ],
)
def test_activations_match_korthikanti(tp: int, sp: bool) -> None:
    """Korthikanti et al., Table 2, with flash attention (no 5as/h term): a GPT layer keeps
    sbh(10 + 24/t) bytes with TP and sbh 34/t with TP + SP. Under 1F1B the first stage holds p
    microbatches of L/p layers, i.e. L layers' worth, plus p copies of the embedding's dropout
    mask (sbh bytes, split by t under SP as Megatron scatters before the dropout)."""
    gpt = _model(GPT3)
    assert gpt.training is not None
    p, layers = 16, gpt.num_layers
    sbh = gpt.training.seq_length * 1 * gpt.hidden_size  # mbs 1
    per_layer = 34 / tp if sp else 10 + 24 / tp
    embedding_mask = MASK_BYTES / tp if sp else MASK_BYTES
    expected_bytes = sbh * (layers * per_layer + p * embedding_mask)
    e = _estimate(ParallelConfig(tp=tp, pp=p, sp=sp))
    assert e.memory.activations_gib == pytest.approx(expected_bytes / GIB, rel=1e-3)


# --------------------------------------------------------------------------- mbs


def test_mbs_raises_activations_and_the_bubble() -> None:
    """A larger microbatch b keeps b times the activations (Korthikanti et al.: all terms are
    linear in b) and, at a fixed global batch, gives fewer microbatches m = B / (d b), hence a
    larger bubble fraction (p - 1) / m (Narayanan et al., Sec. 2.2.1)."""
    sizes = [1, 2, 4]  # m = 192, 96, 48: always >= p = 16
    est = {b: _estimate(ParallelConfig(tp=8, pp=16, mbs=b)) for b in sizes}
    for b in sizes:
        assert est[b].num_microbatches == 1536 // (8 * b)
        assert est[b].memory.activations_gib == pytest.approx(
            b * est[1].memory.activations_gib, rel=REL
        )
    assert _strictly_increasing([est[b].bubble_fraction for b in sizes])


# --------------------------------------------------------------------------- global_batch


def test_global_batch_raises_step_time_and_throughput() -> None:
    """At fixed parallelism a larger global batch means more microbatches per step: the step is
    longer, but the pipeline's fill and drain, the gradient reduction and the optimizer step
    are paid once per step, so tokens/s rise (Narayanan et al., Sec. 3.3, Fig. 8)."""
    batches = [512, 1024, 1536, 3072]
    est = [_estimate(ParallelConfig(tp=8, pp=16, global_batch=g)) for g in batches]
    assert _strictly_increasing([e.step_time_s for e in est])
    assert _strictly_increasing([e.tokens_per_s for e in est])
    assert _strictly_decreasing([e.bubble_fraction for e in est])
    for e in est:  # the bubble itself does not depend on m
        assert e.time.pipeline_bubble_s == pytest.approx(est[0].time.pipeline_bubble_s, rel=REL)


# --------------------------------------------------------------------------- seq_len


def test_seq_len_raises_step_time_and_activations() -> None:
    """Longer sequences cost more FLOPs per sample (Narayanan et al., Eq. 3, with the s^2
    attention term) and keep more activations; with flash attention the kept bytes are sbh
    terms only, exactly proportional to s (Korthikanti et al., Table 2 without 5as/h)."""
    lengths = [512, 1024, 2048]  # GPT-3's learned positions stop at 2048
    est = {s: _estimate(ParallelConfig(tp=8, pp=16, seq_len=s)) for s in lengths}
    assert _strictly_increasing([est[s].step_time_s for s in lengths])
    for s in lengths:
        assert est[s].memory.activations_gib == pytest.approx(
            s / 512 * est[512].memory.activations_gib, rel=REL
        )


# --------------------------------------------------------------------------- recompute


def test_recompute_trades_memory_for_time() -> None:
    """none -> selective -> full (Korthikanti et al., Sec. 5): activations strictly fall,
    the step strictly lengthens, and the hardware FLOPs exceed the model FLOPs exactly when
    something is recomputed: by the attention core (selective), by a whole forward of every
    transformer layer (full: 4 passes instead of 3, Narayanan et al., Eq. 3 footnote; the
    embedding and head are not recomputed, so a little under 4/3)."""
    policies: list[Recompute] = ["none", "selective", "full"]
    est = {
        r: _estimate(ParallelConfig(tp=8, pp=16, recompute=r, flash_attention=False))
        for r in policies
    }
    assert _strictly_decreasing([est[r].memory.activations_gib for r in policies])
    assert _strictly_increasing([est[r].step_time_s for r in policies])
    ratio = {r: est[r].hardware_tflops_per_gpu / est[r].model_tflops_per_gpu for r in policies}
    assert est["none"].hardware_tflops_per_gpu == est["none"].model_tflops_per_gpu
    assert 1.0 < ratio["selective"] < ratio["full"]
    assert 1.3 < ratio["full"] < 4 / 3


def test_selective_recompute_keeps_what_flash_attention_keeps() -> None:
    """Selective recomputation drops exactly the attention core's s x s tensors, the 5as/h
    term of Korthikanti et al. (Sec. 5), which is also what a fused attention never stores."""
    selective = _estimate(ParallelConfig(tp=8, pp=16, recompute="selective", flash_attention=False))
    flash = _estimate(ParallelConfig(tp=8, pp=16, flash_attention=True))
    assert selective.memory.activations_gib == pytest.approx(flash.memory.activations_gib, rel=REL)


# --------------------------------------------------------------------------- zero

ZERO_STAGES = [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("model", "cluster", "nodes", "config", "shards"),
    [
        (GPT3, A100, None, ParallelConfig(tp=8, pp=16), 8),  # dp 8
        (LLAMA70B, H100, 16, ParallelConfig(tp=8, pp=4, cp=2), 4),  # dp 2 x cp 2
    ],
    ids=["gpt3-dp8", "llama70b-dp2-cp2"],
)
def test_zero_shards_optimizer_then_gradients_then_weights(
    model: str, cluster: str, nodes: int | None, config: ParallelConfig, shards: int
) -> None:
    """ZeRO (Rajbhandari et al., SC'20; stage 1 = Megatron's distributed optimizer): stage 1
    divides the optimizer states by the d data-parallel ranks (d x cp in Megatron, which shards
    over the data-and-context group), stage 2 also the gradients, stage 3 also the weights.
    No stage raises a state or the activations; the step time may rise (more collectives).
    ZeRO-3 gathers the layer it runs (and the next, FSDP2's prefetch): a new transient that
    may outweigh the weights' shard it saves, so only stages 0-2 strictly lower the peak."""
    est = {
        z: _estimate(
            config.model_copy(update={"zero": z}), model=model, cluster=cluster, nodes=nodes
        )
        for z in ZERO_STAGES
    }
    assert est[0].dp * config.cp == shards
    mem = {z: est[z].memory for z in ZERO_STAGES}
    sharded = {1: "optimizer_gib", 2: "gradients_gib", 3: "weights_gib"}
    for z, part in sharded.items():
        assert getattr(mem[z], part) == pytest.approx(getattr(mem[0], part) / shards, rel=REL)
        assert getattr(mem[z - 1], part) == pytest.approx(getattr(mem[0], part), rel=REL)
    for a, b in pairwise(ZERO_STAGES):
        for part in ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib"):
            assert getattr(mem[b], part) <= getattr(mem[a], part) * (1 + REL), (a, b, part)
    assert _strictly_decreasing([est[z].peak_memory_gib for z in (0, 1, 2)])
    assert mem[3].gathered_parameters_gib > 0 == mem[2].gathered_parameters_gib


# --------------------------------------------------------------------------- precision


def test_fp32_is_slower_and_keeps_more_activations_than_bf16() -> None:
    """Mixed precision (Micikevicius et al. 2018; Megatron-LM's bf16 default): 16-bit tensor
    cores run far above fp32 peak, and 16-bit activations take half the bytes (dropout masks
    stay one byte), so fp32 is slower and keeps more activation memory."""
    bf16 = _estimate(ParallelConfig(tp=8, pp=16, precision="bf16"))
    fp32 = _estimate(ParallelConfig(tp=8, pp=16, precision="fp32"))
    assert fp32.step_time_s > bf16.step_time_s
    assert (
        bf16.memory.activations_gib
        < fp32.memory.activations_gib
        < (2 * bf16.memory.activations_gib)
    )


# --------------------------------------------------------------------------- flash_attention


def test_flash_attention_saves_the_score_tensors_and_time() -> None:
    """FlashAttention (Dao et al. 2022) never writes the s x s scores: the first stage's
    activations drop by exactly Korthikanti's 5as/h term, 5 a s^2 b / t bytes per layer for
    L layers' worth under 1F1B, and the step is shorter (no score traffic through HBM)."""
    gpt = _model(GPT3)
    assert gpt.training is not None
    tp, s, b = 8, gpt.training.seq_length, 1
    off = _estimate(ParallelConfig(tp=tp, pp=16, flash_attention=False))
    on = _estimate(ParallelConfig(tp=tp, pp=16, flash_attention=True))
    assert on.step_time_s < off.step_time_s
    scores_bytes = gpt.num_layers * 5 * gpt.num_attention_heads * s * s * b / tp
    assert off.memory.activations_gib - on.memory.activations_gib == pytest.approx(
        scores_bytes / GIB, rel=REL
    )


# --------------------------------------------------------------------------- overlaps


def test_overlap_grad_reduce_hides_the_gradient_reduction() -> None:
    """Megatron's --overlap-grad-reduce starts each bucket's reduction during the last
    backward (Narayanan et al., Sec. 4.2; PyTorch DDP): never slower, and strictly faster when
    the reduction is large: pure DP over 128 nodes (TP 8, PP 1, dp 128)."""
    for zero in ZERO_STAGES:
        off = _estimate(ParallelConfig(tp=8, pp=16, zero=zero))
        on = _estimate(ParallelConfig(tp=8, pp=16, zero=zero, overlap_grad_reduce=True))
        assert on.step_time_s <= off.step_time_s, zero
    off = _estimate(ParallelConfig(tp=8))
    on = _estimate(ParallelConfig(tp=8, overlap_grad_reduce=True))
    assert on.time.data_parallel_comm_exposed_s < off.time.data_parallel_comm_exposed_s
    assert on.step_time_s < off.step_time_s


@pytest.mark.parametrize("zero", ZERO_STAGES)
def test_overlap_param_gather_hides_zero_gathers(zero: int) -> None:
    """Megatron's --overlap-param-gather (and ZeRO-3 prefetching, Rajbhandari et al.) hides the
    parameter all-gathers behind the forward: strictly faster when there is a gather to hide
    (ZeRO >= 1, DP 8 across nodes), identical without one (ZeRO 0)."""
    off = _estimate(ParallelConfig(tp=8, pp=16, zero=zero))
    on = _estimate(ParallelConfig(tp=8, pp=16, zero=zero, overlap_param_gather=True))
    if zero == 0:
        assert on == off
    else:
        assert on.step_time_s < off.step_time_s


def test_tp_comm_overlap_hides_tensor_parallel_collectives() -> None:
    """Transformer Engine's --tp-comm-overlap splits the TP collectives and pipelines them with
    the adjacent GEMMs (Wang et al., ASPLOS'23): strictly faster at TP 8 with SP, which
    Megatron-Core requires for it (refused without), identical at TP 1 where there is nothing
    to overlap."""
    off = _estimate(ParallelConfig(tp=8, pp=16, sp=True))
    on = _estimate(ParallelConfig(tp=8, pp=16, sp=True, tp_comm_overlap=True))
    assert on.time.tensor_parallel_comm_s < off.time.tensor_parallel_comm_s
    assert on.step_time_s < off.step_time_s
    with pytest.raises(planner.ConfigError, match="tp_comm_overlap needs sequence parallel"):
        _estimate(ParallelConfig(tp=8, pp=16, tp_comm_overlap=True))
    assert _estimate(ParallelConfig(pp=16, tp_comm_overlap=True)) == _estimate(
        ParallelConfig(pp=16)
    )


# --------------------------------------------------------------------------- schedule


def test_gpipe_holds_more_activations_than_1f1b_in_the_same_time() -> None:
    """GPipe (Huang et al. 2019) runs all m forwards before the backwards and keeps m
    microbatches' activations; 1F1B (Narayanan et al., Sec. 2.2.1) keeps at most p, with the
    same bubble and so the same step time (here p = 16 < m = 192)."""
    one_f_one_b = _estimate(ParallelConfig(tp=8, pp=16, schedule="1f1b"))
    gpipe = _estimate(ParallelConfig(tp=8, pp=16, schedule="gpipe"))
    assert gpipe.num_microbatches > 16
    assert gpipe.memory.activations_gib > one_f_one_b.memory.activations_gib
    assert gpipe.step_time_s == pytest.approx(one_f_one_b.step_time_s, rel=REL)
    assert gpipe.bubble_fraction == pytest.approx(one_f_one_b.bubble_fraction, rel=REL)


# --------------------------------------------------------------------------- bookkeeping

EVERY_KNOB: list[tuple[str, str, int | None, ParallelConfig]] = [
    (GPT3, A100, None, ParallelConfig(tp=8, pp=16)),
    (GPT3, A100, None, ParallelConfig(tp=8, pp=16, vpp=3, sp=True, mbs=2)),
    (GPT3, A100, None, ParallelConfig(tp=4, pp=8, recompute="full", flash_attention=False)),
    (GPT3, A100, None, ParallelConfig(tp=8, pp=16, recompute="selective", zero=1)),
    (GPT3, A100, None, ParallelConfig(tp=8, pp=16, zero=2, overlap_grad_reduce=True)),
    (GPT3, A100, None, ParallelConfig(tp=8, pp=16, zero=3, overlap_param_gather=True)),
    (GPT3, A100, None,
     ParallelConfig(tp=8, pp=16, sp=True, tp_comm_overlap=True, schedule="gpipe")),
    (GPT3, A100, 32, ParallelConfig(tp=8, pp=16, precision="fp32", global_batch=512)),
    (GPT3 + "+rope", H100, 16, ParallelConfig(tp=8, pp=2, cp=4, seq_len=8192, global_batch=64)),
    (LLAMA70B, H100, 16, ParallelConfig(tp=8, pp=4, cp=2, seq_len=32768, global_batch=64)),
    (MIXTRAL, H100, 8, ParallelConfig(tp=2, pp=4, ep=4, zero=1, precision="fp16")),
]


@pytest.mark.parametrize(("model", "cluster", "nodes", "config"), EVERY_KNOB)
def test_the_reported_figures_add_up(
    model: str, cluster: str, nodes: int | None, config: ParallelConfig
) -> None:
    """Whatever the knobs, the estimate is self-consistent: the eight time parts add up to the
    step, the memory parts to the peak, tokens/s is B s / step, MFU is model TFLOP/s over the
    device's peak for the precision, hardware TFLOP/s within the peak and, without fused
    attention (which skips the causal half of the scores), never below the model's."""
    e = _estimate(config, model=model, cluster=cluster, nodes=nodes)
    spec, device = _model(model), _cluster(cluster, nodes).device
    assert spec.training is not None
    seq = config.seq_len or spec.training.seq_length
    batch = config.global_batch or spec.training.global_batch_size
    precision = config.precision or spec.training.precision
    as_dict = e.to_dict()
    time_parts, memory_parts = as_dict["time"], as_dict["memory"]
    assert all(v >= 0.0 for v in (*time_parts.values(), *memory_parts.values()))
    assert sum(time_parts.values()) == pytest.approx(e.step_time_s, rel=REL)
    assert sum(memory_parts.values()) == pytest.approx(e.peak_memory_gib, rel=REL)
    assert e.fits == (e.peak_memory_gib <= device.memory_gib)
    assert e.tokens_per_s == pytest.approx(batch * seq / e.step_time_s, rel=REL)
    assert e.mfu == pytest.approx(e.model_tflops_per_gpu / device.peak_tflops[precision], rel=REL)
    assert e.hardware_tflops_per_gpu <= device.peak_tflops[precision]
    if not config.flash_attention:
        assert e.hardware_tflops_per_gpu >= e.model_tflops_per_gpu
    assert e.num_devices == e.dp * config.tp * config.pp * config.cp
    assert e.num_microbatches == batch // (e.dp * config.mbs)


def test_uneven_first_and_last_stages() -> None:
    """Megatron's --decoder-first/last-pipeline-num-layers: Llama 3.1 405B's 126 layers on 16
    stages as 7 + 14 x 8 + 7 (the Llama 3 paper's split); the first and last stages, which
    also hold the embedding and the head, get lighter, so the critical stage is a middle one
    and the step is no slower than with the layers one fewer stage can take evenly; a split
    that does not divide is refused with the rule."""
    from planner.errors import ConfigError
    from planner.plan.config import resolve

    model = planner.load_model(MODELS_DIR / "llama3.1-405b.json")
    cluster = planner.load_cluster(CLUSTERS_DIR / "dgx-h100-80gb.json", 2048)
    config = planner.ParallelConfig(tp=8, pp=16, sp=True, recompute="full",
                                    first_stage_layers=7, last_stage_layers=7)  # fmt: skip
    assert resolve(model, cluster, config).stage_layers == (7, *[8] * 14, 7)
    result = planner.estimate(model, cluster, config)
    assert len(result.stages) == 16
    middle = result.stages[1].time.compute_s
    assert result.stages[0].time.compute_s < middle * 1.1
    assert result.stages[1].memory.total_gib > result.stages[2].memory.total_gib
    with pytest.raises(ConfigError, match="does not split evenly over the other 14 stages"):
        resolve(model, cluster, config.model_copy(update={"first_stage_layers": 8}))
    with pytest.raises(ConfigError, match="not divisible by pp"):
        resolve(model, cluster, planner.ParallelConfig(tp=8, pp=16))
