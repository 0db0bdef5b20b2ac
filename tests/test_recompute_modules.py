"""Selective recomputation of chosen modules (Megatron-Core's ``--recompute-modules``): what
each output-discarding module stops keeping and what it reruns, priced, searched, exported
and read back from a log."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import planner
from planner.diagnose.notches import describe_change, with_changes
from planner.plan.config import ParallelConfig, resolve
from planner.plan.degrees import Degrees
from planner.sharding.uniform import UniformQuery, uniform_layout, uniform_parts
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_columns
from tests.conftest import REPO
from tests.test_estimate_batch import agree

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
DEEPSEEK = REPO / "instances" / "models" / "deepseek-v3.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"
SEQ = 4096


def _parts(model: planner.ModelSpec, modules: tuple[str, ...], *, kind: str = "moe", tp: int = 1):
    query = UniformQuery(kind=kind, layout=uniform_layout(Degrees(tp=tp, sp=tp > 1)),
                         micro_batch_size=1, seq_length=SEQ, precision="bf16",
                         recompute_modules=modules)  # fmt: skip
    return uniform_parts(model, planner.load_cluster(H100, 1), query)


def test_moe_act_drops_the_activation_output_of_every_routed_token() -> None:
    """Mixtral, one GPU, a 4,096-token microbatch: the experts' activation output is the
    input the down projection keeps, top-k x FFN values of 2 bytes a token (balanced
    routing): 4096 x 2 x 14336 x 2 bytes; rerunning it costs the activation's forward."""
    model = planner.load_model(MIXTRAL)
    moe = model.moe
    assert moe is not None
    default, act = _parts(model, ("core_attn",)), _parts(model, ("moe_act",))
    routed_act = SEQ * moe.top_k * moe.ffn_hidden_size * 2
    assert default.kept_bytes[1] - act.kept_bytes[1] == pytest.approx(routed_act, rel=1e-12)
    assert default.kept_bytes[0] == act.kept_bytes[0]  # no recomputation: the same
    assert 0 < act.rerun_s[1] < 0.05 * act.forward_s


def test_layernorm_drops_the_pre_mlp_norm_output_the_router_keeps() -> None:
    """An MoE layer's pre-MLP norm is a module of its own in Megatron-Core's spec; its output
    is what the router's GEMM keeps: a hidden vector per token, split by tensor parallelism
    under sequence parallelism. A dense layer's norms are fused into the linears that read
    them, so the module changes nothing there."""
    model = planner.load_model(MIXTRAL)
    for tp in (1, 2):
        default, norm = _parts(model, ("core_attn",), tp=tp), _parts(model, ("layernorm",), tp=tp)
        hidden = SEQ * model.hidden_size * 2 / tp
        assert default.kept_bytes[1] - norm.kept_bytes[1] == pytest.approx(hidden, rel=1e-12)
    dense = planner.load_model(REPO / "instances" / "models" / "llama3-8b.json")
    assert (_parts(dense, ("layernorm",), kind="dense").kept_bytes[1]
            == _parts(dense, ("core_attn",), kind="dense").kept_bytes[1])  # fmt: skip


def test_mla_up_proj_drops_the_attention_cores_inputs() -> None:
    """DeepSeek-V3's MLA: the up projections' outputs (Q, K and V of the attention core) are
    rebuilt from the kept latents, so the core keeps none of them; their GEMMs rerun."""
    model = planner.load_model(DEEPSEEK)
    mla = model.mla
    assert mla is not None
    default, up = _parts(model, ("core_attn",)), _parts(model, ("mla_up_proj",))
    heads = model.num_attention_heads
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    qkv = SEQ * heads * (2 * qk + mla.v_head_dim) * 2
    assert default.kept_bytes[1] - up.kept_bytes[1] == pytest.approx(qkv, rel=1e-12)
    assert mla.q_lora_rank is not None
    up_gemms = 2 * SEQ * (mla.q_lora_rank * heads * qk
                          + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim))
    assert up.rerun_flops[1] == pytest.approx(up_gemms, rel=1e-12)
    assert up.rerun_s[1] > 0


def test_a_plan_priced_with_modules_keeps_less_and_the_batch_agrees() -> None:
    """On 16 H100s, Mixtral EP8 with the experts' activation and the norms recomputed keeps
    less than with the attention core (which flash attention already drops) and steps a
    little slower; the batch pricer agrees with ``estimate`` on every column."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 2)
    knobs = dict(ep=8, zero=1, recompute="selective", global_batch=64, seq_len=SEQ)
    plain = planner.estimate(model, cluster, ParallelConfig(**knobs))
    lean = planner.estimate(model, cluster, ParallelConfig(recompute_modules="moe_act,layernorm",
                                                           **knobs))  # fmt: skip
    assert lean.memory.activations_gib < plain.memory.activations_gib
    configs = [ParallelConfig(recompute_modules=m, pp=pp, **knobs)
               for m in (None, "moe_act,layernorm", "layernorm") for pp in (1, 2)]  # fmt: skip
    batch = estimate_batch(model, cluster, config_columns(configs))
    assert agree(batch, configs, model, cluster) == 6


def test_modules_need_selective_recomputation_and_a_known_module() -> None:
    with pytest.raises(ValidationError, match=r"needs recompute 'selective', not 'full'"):
        ParallelConfig(recompute="full", recompute_modules="moe_act")
    with pytest.raises(ValidationError, match=r"module 'mhc': expected some of core_attn"):
        ParallelConfig(recompute="selective", recompute_modules="moe_act mhc")
    # Megatron-Core's order, once each; the default spelled out is the default.
    assert ParallelConfig(recompute="selective",
                          recompute_modules="layernorm moe_act,layernorm").recompute_modules \
        == "moe_act,layernorm"  # fmt: skip
    assert ParallelConfig(recompute="selective", recompute_modules="core_attn").recompute_modules \
        is None  # fmt: skip


def test_turning_recomputation_drops_the_modules() -> None:
    """``explain``'s notches: leaving selective recomputation leaves its modules (the bug
    class of a count of recomputed layers beside another mode)."""
    model = planner.load_model(MIXTRAL)
    lean = ParallelConfig(recompute="selective", recompute_modules="moe_act")
    full = with_changes(lean, {"recompute": "full"}, model)
    assert full.recompute_modules is None
    assert describe_change(lean, full, dp=(8, 8), microbatches=(4, 4), knob="recompute") == (
        "recompute selective -> full (recompute-modules moe_act dropped)")  # fmt: skip
    assert with_changes(ParallelConfig(), {"recompute_modules": "moe_act"},
                        model).recompute == "selective"  # fmt: skip


def test_solve_tries_them_for_megatron_and_launches_them() -> None:
    """Pinned, the plan carries the modules, says them, and Megatron-LM launches them."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 2)
    options = planner.SolveOptions(framework="megatron", global_batch_size=64, seq_length=SEQ,
                                   pins=planner.Pins(recompute_modules="moe_act,layernorm"))
    plan = planner.solve(model, cluster, options)
    assert plan.configuration is not None
    assert plan.configuration.recompute_modules == "moe_act,layernorm"
    assert "selective recompute (moe_act, layernorm)" in plan.summary()
    resolved = resolve(model, cluster, plan.configuration)
    text = planner.frameworks.profile("megatron").launch(resolved, model).text
    assert "--recompute-modules moe_act layernorm " in text


def test_mlp_checkpoints_a_dense_layers_mlp_and_reruns_its_collectives() -> None:
    """Llama 3 8B, TP2 with SP: the MLP keeps nothing of its own (its input, the residual
    stream, is the checkpoint's and the norm's), so a token drops its up projection's input
    (h) and the gated activation's input and output (3 x FFN); it reruns the MLP's forward and
    its all-gather and reduce-scatter, half of what full recomputation reruns (attention's
    pair is the other half, of the same size)."""
    model = planner.load_model(REPO / "instances" / "models" / "llama3-8b.json")
    default = _parts(model, ("core_attn",), kind="dense", tp=2)
    mlp = _parts(model, ("mlp",), kind="dense", tp=2)
    dropped = SEQ * (model.hidden_size + 3 * model.ffn) * 2 / 2  # split by TP (SP for h)
    assert default.kept_bytes[1] - mlp.kept_bytes[1] == pytest.approx(dropped, rel=1e-12)
    assert default.selective_rerun_comm_s == (0.0, 0.0, 0.0)
    assert mlp.selective_rerun_comm_s[0] == pytest.approx(0.5 * mlp.rerun_comm_s[0], rel=1e-12)
    assert 0 < mlp.rerun_s[1] < mlp.rerun_s[2]


def test_moe_checkpoints_the_moe_block_and_reruns_its_all_to_alls() -> None:
    """Mixtral: the MoE block keeps its input alone (the pre-MLP norm's output the router
    kept), so what the block kept beyond it goes; its rerun includes the forward's all-to-alls,
    as full recomputation's does."""
    model = planner.load_model(MIXTRAL)
    query = dict(kind="moe", micro_batch_size=1, seq_length=SEQ, precision="bf16")
    layout = uniform_layout(Degrees(ep=8))
    cluster = planner.load_cluster(H100, 1)
    default, moe = (uniform_parts(model, cluster, UniformQuery(
        layout=layout, recompute_modules=m, **query)) for m in (("core_attn",), ("moe",)))  # type: ignore[arg-type]  # fmt: skip
    assert moe.selective_rerun_comm_s[2] == pytest.approx(moe.rerun_comm_s[2], rel=1e-12)
    assert moe.selective_rerun_comm_s[2] > 0
    assert default.selective_rerun_comm_s[2] == 0
    # Beyond the router's input the block kept the routed tokens at each expert projection,
    # the activation's input and the logits: all gone.
    moe_spec = model.moe
    assert moe_spec is not None
    routed = SEQ * moe_spec.top_k  # per GPU: its share of the experts' tokens (EP8 of 8 ranks)
    block = routed * (model.hidden_size + 2 * moe_spec.ffn_hidden_size
                      + moe_spec.ffn_hidden_size) * 2 + SEQ * moe_spec.num_experts * 4
    assert default.kept_bytes[1] - moe.kept_bytes[1] == pytest.approx(block, rel=1e-12)


def test_shared_experts_keep_their_input_alone() -> None:
    """DeepSeek-V3's shared expert: checkpointed, it keeps its input (the norm's output) and
    drops the gated activation's input and output (3 x its FFN a token)."""
    model = planner.load_model(DEEPSEEK)
    moe = model.moe
    assert moe is not None and moe.shared_ffn
    default, shared = _parts(model, ("core_attn",)), _parts(model, ("shared_experts",))
    assert default.kept_bytes[1] - shared.kept_bytes[1] == pytest.approx(
        SEQ * 3 * moe.shared_ffn * 2, rel=1e-12)  # fmt: skip
