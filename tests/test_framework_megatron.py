"""Megatron-LM as a framework target: every rule, and the launch text read back as Megatron would.

The launch text is read as a shell reads it (line continuations joined, then ``shlex``) and
interpreted with Megatron-LM's own arithmetic (data-parallel size from the world size, the
middle stages from ``--decoder-first/last-pipeline-num-layers``, the vocabulary padded to a
multiple of ``--make-vocab-size-divisible-by`` x tp); what it says must be exactly the
configuration the planner priced and the model's shape. Each rule has a test that triggers it,
whose docstring cites the rule's source.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import planner
from planner.diagnose.validation_rows import describe
from planner.frameworks import _megatron_model_flags as mmf
from planner.frameworks import megatron, mindspeed
from planner.frameworks.base import Profile
from planner.plan.config import ParallelConfig, ResolvedConfig, resolve
from planner.spec import ClusterSpec, ModelSpec, RopeScaling, TrainingSpec
from tests.conftest import HF, MODELS, REPO, stand_in_when_missing
from tests.framework_cases import forced, load, nodes

MODEL_FILES = sorted(MODELS.glob("*.json")) + sorted(HF.glob("*.json"))
"""The bundled models and the reference Hugging Face configs (when ../shared is there)."""
MODEL_PARAMS = [*MODEL_FILES, *stand_in_when_missing(HF)]
HF_SEQ = 4096




def configure(model: ModelSpec, devices: int, **knobs: Any) -> ResolvedConfig:
    """``knobs`` resolved on ``devices`` H100s (a 4096-token sequence for models without a
    training block, and 4 x pp microbatches per step unless given)."""
    knobs.setdefault("seq_len", None if model.training else min(HF_SEQ,
                                                                model.max_position_embeddings))
    if "global_batch" not in knobs:
        per_step = devices // (knobs.get("tp", 1) * knobs.get("pp", 1) * knobs.get("cp", 1))
        knobs["global_batch"] = per_step * knobs.get("mbs", 1) * 4 * knobs.get("pp", 1)
    return resolve(model, nodes(devices), ParallelConfig(**knobs))



# --- reading the launch text back ---------------------------------------------------------------


LIST_FLAGS = ("--recompute-modules",)
"""Flags argparse reads as a list of words (``nargs="*"``)."""


def read_flags(text: str) -> dict[str, str | None]:
    """Flag -> value (None for a switch), after checking the one-flag-per-line layout."""
    lines = text.rstrip("\n").split("\n")
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert all(line.startswith("--") for line in lines)
    flags: dict[str, str | None] = {}
    last = ""
    for word in shlex.split(text.replace("\\\n", " ")):
        if word.startswith("--"):
            assert word not in flags, f"{word} given twice"
            flags[word] = None
            last = word
        elif last in LIST_FLAGS and flags[last] is not None:
            flags[last] = f"{flags[last]} {word}"
        else:
            assert flags[last] is None, f"{last} has two values"
            flags[last] = word
    return flags


def layer_pattern(expression: str) -> list[int]:
    """Megatron's ``--moe-layer-freq`` list expression evaluated: only list literals of ints,
    ``+`` and ``* int`` (what Megatron's own pattern check admits)."""

    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        assert isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult), node
        return value(node.left) + value(node.right) if isinstance(node.op, ast.Add) else (
            value(node.left) * value(node.right))

    return value(ast.parse(expression, mode="eval").body)


def stage_layers(flags: dict[str, str | None], num_layers: int, pp: int) -> list[int]:
    """Layers per stage as Megatron-Core's ``get_num_layers_to_build`` splits them."""
    first, last = (flags.get(f"--decoder-{end}-pipeline-num-layers") for end in ("first", "last"))
    given = [int(n) for n in (first, last) if n is not None]
    middle = pp - len(given)
    each = (num_layers - sum(given)) // middle if middle else 0
    layers = [each] * pp
    if first is not None:
        layers[0] = int(first)
    if last is not None:
        layers[-1] = int(last)
    return layers


def read_back(text: str, *, world: int, flavor: str = "megatron") -> dict[str, Any]:
    """The launch text in the planner's words: the configuration and the model's shape."""
    f = read_flags(text)

    def num(name: str, default: int | None = None) -> int | None:
        value = f.get(name)
        return default if value is None else int(value)

    tp, pp = num("--tensor-model-parallel-size"), num("--pipeline-model-parallel-size")
    cp = num("--context-parallel-size", 1)
    assert tp and pp and cp
    dp = world // (tp * pp * cp)
    mbs, gbs = num("--micro-batch-size"), num("--global-batch-size")
    assert mbs and gbs
    layers = num("--num-layers")
    assert layers
    return dict(
        tp=tp, pp=pp, cp=cp, cp_algo=attends(f, flavor) if cp > 1 else None,
        ep=num("--expert-model-parallel-size", 1), dp=dp,
        vpp=num("--num-virtual-stages-per-pipeline-rank", 1), sp="--sequence-parallel" in f,
        stage_layers=stage_layers(f, layers, pp), mbs=mbs, gbs=gbs, seq=num("--seq-length"),
        microbatches=gbs // (mbs * dp), recompute=recompute(f), zero=zero(f, flavor),
        overlap_grad_reduce="--overlap-grad-reduce" in f,
        overlap_param_gather="--overlap-param-gather" in f,
        tp_comm_overlap="--tp-comm-overlap" in f, precision=precision(f),
        flash_attention=flash(f, flavor), **shape(f, flavor),
    )  # fmt: skip


def attends(f: dict[str, str | None], flavor: str) -> str:
    """How context parallelism attends: Megatron's ``--cp-comm-type`` (p2p by default),
    MindSpeed's ``--context-parallel-algo`` (which the launch always spells out)."""
    if flavor == "megatron":
        return {"p2p": "ring", "a2a": "ulysses"}[str(f.get("--cp-comm-type") or "p2p")]
    return {"megatron_cp_algo": "ring", "ulysses_cp_algo": "ulysses"}[
        str(f["--context-parallel-algo"])]


def recompute(f: dict[str, str | None]) -> str:
    """Megatron's recompute flags as the planner's granularity."""
    granularity = f.get("--recompute-granularity")
    if granularity == "full":
        if f.get("--recompute-method") == "block":
            return f"full, first {f.get('--recompute-num-layers')} per chunk"
        uniform = f.get("--recompute-method") == "uniform" and f.get("--recompute-num-layers")
        return "full" if uniform == "1" else "full (other)"
    if granularity == "selective" and f.get("--recompute-modules"):
        return f"selective ({f['--recompute-modules']})"
    return granularity or "none"


def zero(f: dict[str, str | None], flavor: str) -> int:
    """The optimizer's sharding as a ZeRO stage."""
    fsdp = "--use-megatron-fsdp" if flavor == "megatron" else "--use-custom-fsdp"
    if fsdp in f:
        assert "--use-distributed-optimizer" in f
        return {"optim_grads": 2, "optim_grads_params": 3}[
            str(f["--data-parallel-sharding-strategy"])
        ]
    return int("--use-distributed-optimizer" in f)


def precision(f: dict[str, str | None]) -> str:
    """Mixed precision (fp32 has no flag)."""
    assert not ("--bf16" in f and "--fp16" in f)
    return "bf16" if "--bf16" in f else "fp16" if "--fp16" in f else "fp32"


def flash(f: dict[str, str | None], flavor: str) -> bool:
    """Fused attention: Megatron's backend, MindSpeed's --use-flash-attn."""
    if flavor == "megatron":
        return {"fused": True, "unfused": False}[str(f["--attention-backend"])]
    assert f["--transformer-impl"] == "local"
    return "--use-flash-attn" in f


def shape(f: dict[str, str | None], flavor: str) -> dict[str, Any]:
    """The model as Megatron builds it from the flags."""
    tp = int(str(f["--tensor-model-parallel-size"]))
    # core_v0.12.1's NullTokenizer (MindSpeed's) adds an end-of-document token.
    vocab = int(str(f["--vocab-size"])) + (flavor == "mindspeed")
    multiple = int(str(f["--make-vocab-size-divisible-by"])) * tp
    assert f["--tokenizer-type"] == "NullTokenizer"
    mla = "--multi-latent-attention" in f
    heads = int(str(f["--num-attention-heads"]))
    bias = "--disable-bias-linear" not in f
    return dict(
        num_layers=int(str(f["--num-layers"])), hidden_size=int(str(f["--hidden-size"])),
        ffn=int(str(f["--ffn-hidden-size"])), heads=heads,
        groups=None if mla else int(str(f.get("--num-query-groups") or heads)),
        grouped="--group-query-attention" in f,
        kv_channels=None if mla else int(str(f["--kv-channels"])),
        vocab_rows=-(-vocab // multiple) * multiple,
        max_positions=int(str(f["--max-position-embeddings"])),
        positions={"learned_absolute": "learned", "rope": "rope"}[
            str(f["--position-embedding-type"])],
        normalization={"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}[
            str(f["--normalization"])],
        swiglu="--swiglu" in f, tied="--untie-embeddings-and-output-weights" not in f,
        bias=bias, qkv_bias=bias or "--add-qkv-bias" in f, qk_layernorm="--qk-layernorm" in f,
        mtp_layers=int(f.get("--mtp-num-layers") or 0),
        hidden_dropout=float(str(f["--hidden-dropout"])),
        attention_dropout=float(str(f["--attention-dropout"])),
        mla=[f.get(n) and int(str(f[n])) for n in ("--q-lora-rank", "--kv-lora-rank",
             "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")] if mla else None,
        norm_epsilon=float(str(f["--norm-epsilon"])), **rope(f), **experts(f),
    )  # fmt: skip


def rope(f: dict[str, str | None]) -> dict[str, Any]:
    """RoPE's base and scaling as the flags set them (argparse reads the base as an int)."""
    if f["--position-embedding-type"] != "rope":
        assert "--rotary-base" not in f
        return dict(rotary_base=None, rope_scaling=None, rotary_percent=None)
    scaling = None
    if "--use-rope-scaling" in f:
        scaling = ("llama3", float(str(f["--rope-scaling-factor"])))
    elif "--rotary-scaling-factor" in f:
        scaling = ("yarn", *(float(str(f[k])) for k in ("--rotary-scaling-factor", "--mscale",
                                                         "--mscale-all-dim")))
    return dict(rotary_base=int(str(f["--rotary-base"])), rope_scaling=scaling,
                rotary_percent=float(str(f.get("--rotary-percent") or 1.0)))


def experts(f: dict[str, str | None]) -> dict[str, Any]:
    """The routed and shared experts, layer by layer."""
    if "--num-experts" not in f:
        return dict(experts=None)
    layers = int(str(f["--num-layers"]))
    pattern = f.get("--moe-layer-freq")
    return dict(
        experts=int(str(f["--num-experts"])), top_k=int(str(f["--moe-router-topk"])),
        expert_ffn=int(str(f["--moe-ffn-hidden-size"])),
        shared_ffn=int(str(f.get("--moe-shared-expert-intermediate-size") or 0)),
        moe_layers=layer_pattern(pattern) if pattern else [1] * layers,
        expert_bias="--moe-router-enable-expert-bias" in f,
        expert_tp=int(str(f["--expert-tensor-parallel-size"])),
        dispatcher=f["--moe-token-dispatcher-type"],
        router=(f.get("--moe-router-score-function", "softmax"),
                "--moe-router-pre-softmax" in f,
                float(str(f.get("--moe-router-topk-scaling-factor") or 1.0)),
                int(str(f.get("--moe-router-num-groups") or 0)),
                int(str(f.get("--moe-router-group-topk") or 0)),
                float(str(f.get("--moe-aux-loss-coeff") or 0.0))),
        grouped_gemm="--moe-grouped-gemm" in f,
    )  # fmt: skip


def recompute_priced(c: ParallelConfig) -> str:
    """A configuration's recomputation as :func:`recompute` names Megatron's flags."""
    if c.recompute_layers is not None:
        return f"full, first {c.recompute_layers} per chunk"
    if c.recompute_modules is not None:
        return f"selective ({c.recompute_modules.replace(',', ' ')})"
    return c.recompute


def priced(resolved: ResolvedConfig, model: ModelSpec) -> dict[str, Any]:
    """What the text must say: the configuration as the planner priced it, the model's shape."""
    c, t, moe, mla = resolved.config, resolved.training, model.moe, model.mla
    rows = -(-model.vocab_size // c.tp) * c.tp  # Megatron pads no more than to a multiple of tp
    moe_fields: dict[str, Any] = dict(experts=None)
    if moe is not None:
        moe_fields = dict(
            experts=moe.num_experts, top_k=moe.top_k, expert_ffn=moe.ffn_hidden_size,
            shared_ffn=moe.shared_ffn,
            moe_layers=[int(model.is_moe_layer(i)) for i in range(model.num_layers)],
            expert_bias=moe.router_expert_bias, expert_tp=resolved.etp or c.tp,
            dispatcher="alltoall",
            router=(moe.score_function,
                    moe.score_function == "softmax" and (moe.top_k == 1
                                                         or not moe.router_topk_normalized),
                    moe.router_topk_scaling_factor or 1.0, moe.router_num_groups or 0,
                    moe.router_group_topk or 0, moe.router_aux_loss_coeff or 0.0),
            grouped_gemm=t.precision == "bf16",
        )  # fmt: skip
    scaling = model.rope_scaling
    rope_scaling = None
    if scaling is not None and scaling.rope_type == "llama3":
        rope_scaling = ("llama3", scaling.factor)
    elif scaling is not None and scaling.rope_type == "yarn" and mla is not None:
        rope_scaling = ("yarn", scaling.factor, scaling.mscale or 1.0,
                        scaling.mscale_all_dim or 0.0)
    rope_fields = dict(rotary_base=None, rope_scaling=None, rotary_percent=None)
    if model.position_embedding == "rope":
        rope_fields = dict(rotary_base=round(model.rotary_base), rope_scaling=rope_scaling,
                           rotary_percent=model.rotary_percent)
    return dict(
        tp=c.tp, pp=c.pp, cp=c.cp, cp_algo=c.cp_algo if c.cp > 1 else None, ep=c.ep,
        dp=resolved.dp, vpp=c.vpp, sp=resolved.sp,
        stage_layers=list(resolved.stage_layers), mbs=c.mbs, gbs=t.global_batch_size,
        seq=t.seq_length, microbatches=resolved.num_microbatches, recompute=recompute_priced(c),
        zero=c.zero, overlap_grad_reduce=c.overlap_grad_reduce,
        overlap_param_gather=c.overlap_param_gather,
        tp_comm_overlap=c.tp_comm_overlap and c.tp > 1, precision=t.precision,
        flash_attention=c.flash_attention, num_layers=model.num_layers,
        hidden_size=model.hidden_size, ffn=model.ffn, heads=model.num_attention_heads,
        groups=None if mla else model.query_groups,
        grouped=mla is None and model.query_groups != model.num_attention_heads,
        kv_channels=None if mla else model.head_dim, vocab_rows=rows,
        max_positions=max(model.max_position_embeddings, t.seq_length)
        if model.position_embedding == "rope" else model.max_position_embeddings,
        positions=model.position_embedding, normalization=model.normalization,
        swiglu=model.activation == "swiglu", tied=model.tie_word_embeddings, bias=model.bias,
        qkv_bias=model.has_qkv_bias, qk_layernorm=model.qk_layernorm,
        mtp_layers=model.mtp_layers,
        hidden_dropout=model.hidden_dropout, attention_dropout=model.attention_dropout,
        mla=[mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
             mla.v_head_dim] if mla else None,
        norm_epsilon=model.norm_epsilon, **rope_fields, **moe_fields,
    )  # fmt: skip


# --- every bundled model, a handful of configurations ------------------------------------------

CONFIGURATIONS: dict[str, list[dict[str, Any]]] = {
    "TP+SP ZeRO-1 selective": [dict(tp=tp, sp=True, zero=1, recompute="selective",
                                    overlap_grad_reduce=True, overlap_param_gather=True)
                               for tp in (8, 4, 2)],
    "PP interleaved full": [dict(tp=2, pp=pp, vpp=vpp, sp=True, zero=1, recompute="full")
                            for pp in (4, 2) for vpp in (3, 2)],
    "CP ring": [dict(tp=tp, cp=2, sp=True) for tp in (4, 2)],
    "CP Ulysses": [dict(tp=tp, cp=2, cp_algo="ulysses", sp=True) for tp in (4, 2)],
    "ZeRO-3": [dict(tp=tp, sp=True, zero=3, overlap_grad_reduce=True,
                    overlap_param_gather=True) for tp in (2, 1)],
    "EP": [dict(tp=2, pp=pp, ep=ep, sp=True, zero=1) for pp in (2, 1) for ep in (8, 4, 2)],
    "EP folded, recompute modules": [
        *(dict(tp=2, pp=pp, ep=ep, etp=1, sp=True, zero=1, recompute="selective",
               recompute_modules="moe_act,layernorm") for pp in (2, 1) for ep in (8, 4, 2)),
        dict(tp=2, sp=True, zero=1, recompute="selective", recompute_modules="layernorm")],
}  # fmt: skip
"""Candidates per configuration, on 16 H100s; the first a model resolves and the profile
launches is checked (uneven splits have their own test)."""


def first_launched(profile: Profile, model: ModelSpec, candidates: list[dict[str, Any]]
                   ) -> ResolvedConfig | None:  # fmt: skip
    """The first candidate the model resolves and the profile launches."""
    for knobs in candidates:
        try:
            resolved = configure(model, 16, **knobs)
        except planner.ConfigError:
            continue
        if profile.launches(resolved, model):
            return resolved
    return None


def cases() -> list[tuple[Path, str]]:
    """Every bundled model with every configuration (experts only where there are some)."""
    return [(path, label) for path in MODEL_FILES for label in CONFIGURATIONS
            if label != "EP" or planner.load_model(path).moe is not None]  # fmt: skip


def round_trip(profile: Profile, flavor: str, path: Path, label: str) -> None:
    """The launch text of ``label``'s configuration for the model at ``path`` reads back as
    exactly what was priced (skipped when the model takes none of the candidates: a layer
    count such as DeepSeek-V3's 61 splits into no equal virtual stages)."""
    model = planner.load_model(path)
    resolved = first_launched(profile, model, CONFIGURATIONS[label])
    if resolved is None:
        pytest.skip(f"{model.name} takes none of the {label} candidates")
    text = profile.launch(resolved, model).text
    assert read_back(text, world=resolved.num_devices, flavor=flavor) == priced(resolved, model)


CASES = cases()
CASE_PARAMS = [*(pytest.param(p, lb, id=f"{p.stem}-{lb}") for p, lb in CASES),
               *stand_in_when_missing(HF, arity=2)]  # fmt: skip


@pytest.mark.parametrize(("path", "label"), CASE_PARAMS)
def test_launch_reads_back_as_priced(path: Path, label: str) -> None:
    """Every bundled model: degrees, split, schedule, batch, recompute, ZeRO, overlaps and the
    model's shape come back exactly from the flags."""
    round_trip(megatron.PROFILE, "megatron", path, label)


def uneven(model: ModelSpec) -> ResolvedConfig:
    """Four stages: an even first stage and a last one that leaves two equal even middle
    stages, interleaved (vpp 2) where the layer count is even (61 layers: 14, 16, 16, 15)."""
    first = max(2, (model.num_layers // 4 - 1) // 2 * 2)
    last = first + (model.num_layers - 2 * first) % 4
    return configure(model, 16, tp=2, pp=4, vpp=2 if last % 2 == 0 else 1, sp=True, zero=1,
                     first_stage_layers=first, last_stage_layers=last)  # fmt: skip


@pytest.mark.parametrize("path", MODEL_PARAMS, ids=lambda p: p.stem)
def test_uneven_split_reads_back(path: Path) -> None:
    """Lighter first and last stages, interleaved where they divide: Megatron's middle stages
    and chunks are the planner's."""
    model = planner.load_model(path)
    resolved = uneven(model)
    assert megatron.PROFILE.refusals(resolved, model) == ()
    text = megatron.launch(resolved, model).text
    assert read_back(text, world=16) == priced(resolved, model)


# --- known answers ------------------------------------------------------------------------------


def test_gpt3_175b_text_is_megatrons_published_shape(a100: ClusterSpec) -> None:
    """GPT-3 175B as Narayanan et al. ran it (TP8 PP16 DP8, SP, selective recompute,
    distributed optimizer) on 1,024 A100s: every flag, by hand."""
    model = load("gpt3-175b")
    resolved = resolve(model, a100, ParallelConfig(tp=8, pp=16, sp=True, zero=1,
                                                   recompute="selective"))  # fmt: skip
    launch = megatron.launch(resolved, model)
    assert read_flags(launch.text) == {
        "--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "16",
        "--sequence-parallel": None, "--micro-batch-size": "1", "--global-batch-size": "1536",
        "--seq-length": "2048", "--num-layers": "96", "--hidden-size": "12288",
        "--ffn-hidden-size": "49152", "--num-attention-heads": "96", "--kv-channels": "128",
        "--max-position-embeddings": "2048", "--position-embedding-type": "learned_absolute",
        "--normalization": "LayerNorm", "--norm-epsilon": "1e-05", "--hidden-dropout": "0.1",
        "--attention-dropout": "0.1", "--tokenizer-type": "NullTokenizer", "--vocab-size": "51200",
        "--make-vocab-size-divisible-by": "128", "--bf16": None,
        "--recompute-granularity": "selective", "--use-distributed-optimizer": None,
        "--attention-backend": "fused",
    }  # fmt: skip
    assert launch.environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert resolved.dp == 8 and resolved.num_microbatches == 192  # 1536 / (1 x 8)


def test_deepseek_v3_experts_and_latent_attention() -> None:
    """DeepSeek-V3: 3 dense layers then 58 MoE layers, 256 experts top-8 with one 2048-wide
    shared expert and aux-loss-free expert bias (sigmoid scores), MLA ranks 1536/512 and head
    dims 128+64 / 128; split 5 + 7 x 8 on 8 stages, EP8."""
    model = load("deepseek-v3")
    resolved = configure(model, 128, tp=2, pp=8, ep=8, sp=True, zero=1, first_stage_layers=5,
                         global_batch=64)  # fmt: skip
    flags = read_flags(megatron.launch(resolved, model).text)
    assert {k: flags[k] for k in flags if k.startswith(("--moe", "--num-experts", "--q-", "--kv-",
                                                        "--qk-", "--v-", "--expert", "--multi",
                                                        "--decoder"))} == {
        "--expert-model-parallel-size": "8", "--expert-tensor-parallel-size": "2",
        "--decoder-first-pipeline-num-layers": "5", "--multi-latent-attention": None,
        "--q-lora-rank": "1536", "--kv-lora-rank": "512", "--qk-head-dim": "128",
        "--qk-pos-emb-head-dim": "64", "--v-head-dim": "128", "--num-experts": "256",
        "--moe-router-topk": "8", "--moe-ffn-hidden-size": "2048",
        "--moe-token-dispatcher-type": "alltoall", "--moe-shared-expert-intermediate-size": "2048",
        "--moe-layer-freq": "[0]*3+[1]*58", "--moe-router-enable-expert-bias": None,
        "--moe-router-score-function": "sigmoid", "--moe-router-topk-scaling-factor": "2.5",
        "--moe-router-num-groups": "8", "--moe-router-group-topk": "4",
        "--moe-grouped-gemm": None,
    }  # fmt: skip
    assert "--kv-channels" not in flags and "--group-query-attention" not in flags
    assert resolved.stage_layers == (5, 8, 8, 8, 8, 8, 8, 8)


# The values each released config states (../shared/reference/hf), as Megatron's flags.
_FROM_CONFIGS = {
    # rope_theta 500000.0, rms_norm_eps 1e-05, rope_scaling llama3 factor 8.0
    "Meta-Llama-3.1-70B": {"--rotary-base": "500000", "--use-rope-scaling": None,
                           "--rope-scaling-factor": "8.0", "--norm-epsilon": "1e-05"},
    # rope_theta 1000000.0, rms_norm_eps 1e-06, norm_topk_prob true (softmax after the top 8),
    # router_aux_loss_coef 0.001
    "Qwen3-235B-A22B": {"--rotary-base": "1000000", "--norm-epsilon": "1e-06",
                        "--moe-aux-loss-coeff": "0.001", "--moe-grouped-gemm": None},
    # rope_theta 10000, rms_norm_eps 1e-06, yarn factor 40 mscale 1.0 mscale_all_dim 1.0,
    # scoring_func sigmoid, noaux_tc, routed_scaling_factor 2.5, n_group 8, topk_group 4
    "DeepSeek-V3": {"--rotary-base": "10000", "--rotary-scaling-factor": "40.0",
                    "--mscale": "1.0", "--mscale-all-dim": "1.0", "--norm-epsilon": "1e-06",
                    "--moe-router-score-function": "sigmoid",
                    "--moe-router-enable-expert-bias": None,
                    "--moe-router-topk-scaling-factor": "2.5", "--moe-router-num-groups": "8",
                    "--moe-router-group-topk": "4", "--moe-grouped-gemm": None},
}
_ROPE_AND_ROUTER = ("--rotary-base", "--use-rope-scaling", "--rope-scaling-factor",
                    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--norm-epsilon",
                    "--moe-router-score-function", "--moe-router-enable-expert-bias",
                    "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor",
                    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-aux-loss-coeff",
                    "--moe-grouped-gemm")


@pytest.mark.parametrize("name", sorted(_FROM_CONFIGS))
def test_released_configs_carry_rope_norm_and_router(name: str) -> None:
    """Megatron-LM's and MindSpeed's launches of the released Hugging Face configs say their
    RoPE base and scaling, norm epsilon and every router knob: Megatron's defaults (base 10000,
    epsilon 1e-5, softmax top-k without scaling or groups) are wrong for each of them."""
    model = load(name)
    knobs = dict(tp=2, sp=True, zero=1, ep=8 if model.moe else 1, global_batch=64, seq_len=4096)
    resolved = configure(model, 64, **knobs)
    for profile in (megatron.PROFILE, mindspeed.PROFILE):
        flags = read_flags(profile.launch(resolved, model).text)
        said = {k: flags[k] for k in _ROPE_AND_ROUTER if k in flags}
        assert said == _FROM_CONFIGS[name], profile.name


def test_router_without_renormalization_takes_the_softmax_first() -> None:
    """Qwen2-MoE's norm_topk_prob false: the k weights are the softmax over all experts, which
    is Megatron's --moe-router-pre-softmax (``moe_utils.py:900-914``); fp32 runs the experts
    one by one (grouped GEMM is bf16 only, core_v0.12.1 ``arguments.py:712-713``)."""
    base = load("mixtral-8x7b")
    assert base.moe is not None
    model = base.model_copy(update={"moe": base.moe.model_copy(
        update={"router_topk_normalized": False})})
    flags = read_flags(megatron.launch(configure(model, 16, tp=2, sp=True), model).text)
    assert flags["--moe-router-pre-softmax"] is None and flags["--moe-grouped-gemm"] is None
    fp32 = configure(base, 16, tp=2, sp=True, precision="fp32", flash_attention=False)
    flags = read_flags(megatron.launch(fp32, base).text)
    assert "--moe-router-pre-softmax" not in flags and "--moe-grouped-gemm" not in flags


def test_rope_notes_say_what_megatron_fixes() -> None:
    """Megatron fixes llama3's low and high frequency factors at 1 and 4 over 8192 positions
    (``rotary_pos_embedding.py:92-98``); another scaling type has no flag here."""
    model = load("Meta-Llama-3.1-8B")
    assert model.rope_scaling is not None
    assert mmf.rope_notes(model) == ()
    other = model.model_copy(update={"rope_scaling": model.rope_scaling.model_copy(
        update={"high_freq_factor": 2.0})})
    assert mmf.rope_notes(other) == (
        "rope_scaling llama3: high_freq_factor 2.0 (Megatron fixes 4.0)",)
    dynamic = model.model_copy(update={"rope_scaling": RopeScaling(rope_type="dynamic",
                                                                   factor=2.0)})
    (note,) = mmf.rope_notes(dynamic)
    assert "'dynamic' (factor 2.0) has no Megatron flag" in note
    assert "--use-rope-scaling" not in dict(mmf.rope_flags(dynamic))


def test_llama3_70b_grouped_query_and_ring_attention(h100: ClusterSpec) -> None:
    """Llama-3 70B at 32k tokens, TP8 PP4 CP4 DP8: 8 KV groups, RoPE, RMSNorm, SwiGLU, untied;
    the vocabulary of 128256 = 32 x 8 x 501 is built unpadded."""
    model = load("llama3-70b")
    resolved = resolve(model, h100, ParallelConfig(tp=8, pp=4, cp=4, sp=True, zero=1,
                                                   recompute="full", seq_len=32768))  # fmt: skip
    flags = read_flags(megatron.launch(resolved, model).text)
    assert flags["--context-parallel-size"] == "4" and flags["--seq-length"] == "32768"
    assert flags["--group-query-attention"] is None and flags["--num-query-groups"] == "8"
    assert flags["--make-vocab-size-divisible-by"] == "32"
    assert [flags[k] for k in ("--recompute-granularity", "--recompute-method",
                               "--recompute-num-layers")] == ["full", "uniform", "1"]
    assert {"--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear"} <= set(
        flags)


def test_zero3_is_megatron_fsdp_without_device_connections() -> None:
    """ZeRO-3: Megatron-FSDP's optim_grads_params with its checkpoint format, and no
    CUDA_DEVICE_MAX_CONNECTIONS=1 (which Megatron-FSDP refuses) despite TP."""
    model = load("llama3-8b")
    resolved = configure(model, 16, tp=2, sp=True, zero=3, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    launch = megatron.launch(resolved, model)
    flags = read_flags(launch.text)
    assert [flags.get(k, "absent") for k in ("--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", "--use-distributed-optimizer", "--ckpt-format",
            "--overlap-grad-reduce", "--overlap-param-gather")] == [
        None, "optim_grads_params", None, "fsdp_dtensor", None, None]  # fmt: skip
    assert launch.environment == {}
    assert any("CUDA_DEVICE_MAX_CONNECTIONS" in note for note in launch.notes)


def test_zero2_and_unfused_fp32() -> None:
    """ZeRO-2 is optim_grads; fp32 has no precision flag; unfused attention is said."""
    model = load("gpt-1.7b")
    resolved = configure(model, 16, tp=2, sp=True, zero=2, precision="fp32",
                         flash_attention=False, overlap_grad_reduce=True)  # fmt: skip
    flags = read_flags(megatron.launch(resolved, model).text)
    assert flags["--data-parallel-sharding-strategy"] == "optim_grads"
    assert flags["--attention-backend"] == "unfused"
    assert not {"--bf16", "--fp16", "--overlap-param-gather"} & set(flags)


def test_interleaving_says_virtual_stages_per_rank() -> None:
    """vpp 3 over 24 layers on 4 stages: 3 chunks of 2 layers per rank, microbatches in
    groups of 4; with stages of 4, 8, 8, 4 layers and vpp 2, the same flag and the first and
    last stage's."""
    model = load("gpt-1.7b")
    resolved = configure(model, 16, tp=2, pp=4, vpp=3, sp=True, tp_comm_overlap=True)
    flags = read_flags(megatron.launch(resolved, model).text)
    assert flags["--num-virtual-stages-per-pipeline-rank"] == "3"
    assert "--num-layers-per-virtual-pipeline-stage" not in flags
    assert flags["--tp-comm-overlap"] is None and resolved.num_microbatches == 16
    uneven = configure(model, 16, tp=2, pp=4, vpp=2, sp=True, first_stage_layers=4,
                       last_stage_layers=4)  # fmt: skip
    text = megatron.launch(uneven, model).text
    assert read_back(text, world=16)["stage_layers"] == [4, 8, 8, 4]
    assert read_back(text, world=16) == priced(uneven, model)


def test_two_uneven_stages_say_the_first_only() -> None:
    """Two stages of 10 and 14 layers: the first stage's flag alone, Megatron giving the last
    stage the rest (core_v0.12.1 would divide by the zero middle stages were both given)."""
    model = load("gpt-1.7b")
    resolved = configure(model, 16, tp=2, pp=2, sp=True, first_stage_layers=10,
                         last_stage_layers=14)  # fmt: skip
    text = megatron.launch(resolved, model).text
    flags = read_flags(text)
    assert flags["--decoder-first-pipeline-num-layers"] == "10"
    assert "--decoder-last-pipeline-num-layers" not in flags
    assert read_back(text, world=16)["stage_layers"] == [10, 14] == list(resolved.stage_layers)


def test_gpt2_vocabulary_padded_only_to_tp() -> None:
    """GPT-2's 50257 tokens: built unpadded at tp 1; at tp 2 padded to 50258, not to 50304 as
    Megatron's default divisor of 128 would, and the notes say so (at tp 1 too: a checkpoint
    trained at the default, as Megatron's GPT-2 examples train, holds 50304 rows)."""
    model = load("gpt2")
    alone = megatron.launch(configure(model, 16, zero=1), model)
    paired = megatron.launch(configure(model, 16, tp=2, sp=True), model)
    assert read_flags(alone.text)["--make-vocab-size-divisible-by"] == "1"
    assert not any("is no multiple of tp" in note for note in alone.notes)
    assert any("builds the 50257 rows priced" in n and "pads to 50304 at tp(1)" in n
               for n in alone.notes)  # fmt: skip
    assert read_flags(paired.text)["--make-vocab-size-divisible-by"] == "1"
    assert any("50258 rows" in note for note in paired.notes)


def test_a_divisor_below_the_default_says_what_a_default_checkpoint_holds() -> None:
    """Llama 3's 128256 tokens at tp 8: divisor 32 builds them unpadded, where Megatron's
    default 128 pads to 129024 rows, the shape a checkpoint trained at the default holds: the
    note says so (resuming one failed on the embedding's shape); at tp 2 the default pads
    nothing and nothing is said. Megatron-FSDP's checkpoint format and its warning against
    TP with it are noted where they apply."""
    model = load("llama3-8b")
    eight = megatron.launch(configure(model, 16, tp=8, sp=True, zero=3), model)
    two = megatron.launch(configure(model, 16, tp=2, sp=True, zero=1), model)
    assert read_flags(eight.text)["--make-vocab-size-divisible-by"] == "32"
    (said,) = [n for n in eight.notes if n.startswith("--make-vocab-size-divisible-by")]
    assert "builds the 128256 rows priced" in said and "pads to 129024 at tp(8)" in said
    assert not any(n.startswith("--make-vocab") for n in two.notes)
    assert any(n.startswith("--ckpt-format fsdp_dtensor") for n in eight.notes)
    assert any("TP or CP with Megatron-FSDP" in n for n in eight.notes)
    assert not any("fsdp" in n.lower() for n in two.notes)


def test_rope_model_trains_past_its_positions() -> None:
    """Llama-3 8B (8192 positions) at 16384 tokens: --max-position-embeddings is raised to the
    sequence (Megatron asserts it is no shorter; RoPE has no table of weights) and noted."""
    model = load("llama3-8b")
    launch = megatron.launch(configure(model, 16, tp=2, sp=True, seq_len=16384), model)
    assert read_flags(launch.text)["--max-position-embeddings"] == "16384"
    assert any("16384" in note and "RoPE" in note for note in launch.notes)


def test_qkv_bias_and_qk_layernorm() -> None:
    """Qwen2.5: biases on QKV only; Qwen3: per-head QK norm and kv_channels 128 != 4096 / 64."""
    qwen2, qwen3 = load("Qwen2.5-72B"), load("Qwen3-235B-A22B")
    flags2 = read_flags(megatron.launch(configure(qwen2, 16, tp=8, sp=True), qwen2).text)
    flags3 = read_flags(megatron.launch(configure(qwen3, 16, tp=4, sp=True), qwen3).text)
    assert "--disable-bias-linear" in flags2 and "--add-qkv-bias" in flags2
    assert "--qk-layernorm" in flags3 and flags3["--kv-channels"] == "128"


def test_moe_layer_patterns() -> None:
    """Dense layers first, then every other layer MoE: the pattern Megatron evaluates is the
    planner's layer by layer; top-1 routing takes the softmax first."""
    base = load("mixtral-8x7b")
    moe = base.moe
    assert moe is not None
    model = base.model_copy(update={"moe": moe.model_copy(
        update={"first_dense_layers": 3, "layer_freq": 2, "top_k": 1})})
    flags = read_flags(megatron.launch(configure(model, 16, tp=2, sp=True), model).text)
    assert flags["--moe-layer-freq"] == "[0]*3+([1]+[0]*1)*14+[1]"
    assert layer_pattern(str(flags["--moe-layer-freq"])) == [
        int(model.is_moe_layer(i)) for i in range(32)]
    assert flags["--moe-router-pre-softmax"] is None
    assert "--moe-layer-freq" not in read_flags(
        megatron.launch(configure(base, 16, tp=2, sp=True), base).text)


# --- rules: one test each, citing the rule's source ----------------------------------------------


def refused(profile: Profile, name: str, resolved: ResolvedConfig, model: ModelSpec,
            match: str) -> None:  # fmt: skip
    """Rule ``name`` refuses ``resolved`` with a message matching ``match``, and the profile's
    refusals include it."""
    rule = next(r for r in profile.rules if r.name == name)
    reason = rule.check(resolved, model)
    assert reason is not None, name
    assert re.search(match, reason), reason
    assert reason in profile.refusals(resolved, model)


def accepted(profile: Profile, name: str, resolved: ResolvedConfig, model: ModelSpec) -> None:
    """Rule ``name`` lets ``resolved`` through."""
    assert next(r for r in profile.rules if r.name == name).check(resolved, model) is None


def rule_tests(module: Any, profile: Profile) -> None:
    """Every rule of ``profile`` has a test ``test_rule_<name>`` in ``module`` whose docstring
    cites the rule's source, and every such test names a rule."""
    tests = {n.removeprefix("test_rule_"): f for n, f in vars(module).items()
             if n.startswith("test_rule_")}  # fmt: skip
    names = {r.name.replace("-", "_") for r in profile.rules}
    assert set(tests) == names
    for rule in profile.rules:
        doc = " ".join((tests[rule.name.replace("-", "_")].__doc__ or "").split())
        assert " ".join(rule.source.split()) in doc, rule.name


def test_every_rule_is_pinned_and_cited() -> None:
    """One test per rule below, each citing the source the rule cites."""
    rule_tests(sys.modules[__name__], megatron.PROFILE)


# What triggers each rule; MindSpeed's tests pin the rules it inherits with the same.


def pin_zero_bubble(p: Profile) -> None:
    """What rule ``zero-bubble`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "zero-bubble", configure(model, 16, pp=4, schedule="zb-h1"), model,
            r"zb-h1: Megatron-LM has no zero-bubble")  # fmt: skip
    refused(p, "zero-bubble", configure(model, 16, pp=4, vpp=2, schedule="zb-v"), model,
            r"zb-v: .*pp\(4\)")  # fmt: skip
    accepted(p, "zero-bubble", configure(model, 16, schedule="zb-h1"), model)
    accepted(p, "zero-bubble", configure(model, 16, pp=4), model)


def pin_gpipe(p: Profile) -> None:
    """What rule ``gpipe`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "gpipe", configure(model, 16, pp=4, schedule="gpipe"), model, r"gpipe.*pp\(4\)")
    refused(p, "gpipe", configure(model, 16, schedule="gpipe"), model, "no GPipe schedule")
    accepted(p, "gpipe", configure(model, 16, pp=4), model)


def pin_zero_2_3_with_pipeline(p: Profile) -> None:
    """What rule ``zero-2-3-with-pipeline`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    overlap = dict(overlap_grad_reduce=True, overlap_param_gather=True)
    refused(p, "zero-2-3-with-pipeline", configure(model, 16, pp=2, zero=3, **overlap), model,
            r"ZeRO-3 .*Megatron-FSDP.*pp\(2\) > 1")  # fmt: skip
    accepted(p, "zero-2-3-with-pipeline", configure(model, 16, pp=2, zero=1), model)
    accepted(p, "zero-2-3-with-pipeline", configure(model, 16, zero=2, **overlap), model)


def pin_zero_2_3_grad_overlap(p: Profile) -> None:
    """What rule ``zero-2-3-grad-overlap`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "zero-2-3-grad-overlap", configure(model, 16, zero=2), model,
            r"ZeRO-2 .*always overlaps .*overlap_grad_reduce off")
    accepted(p, "zero-2-3-grad-overlap", configure(model, 16, zero=2, overlap_grad_reduce=True),
             model)  # fmt: skip


def pin_zero_3_param_overlap(p: Profile) -> None:
    """What rule ``zero-3-param-overlap`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "zero-3-param-overlap", configure(model, 16, zero=3, overlap_grad_reduce=True),
            model, r"ZeRO-3 .*parameter all-gathers.*overlap_param_gather off")  # fmt: skip


def pin_param_gather_without_sharding(p: Profile) -> None:
    """What rule ``param-gather-without-sharding`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "param-gather-without-sharding", configure(model, 16, overlap_grad_reduce=True,
            overlap_param_gather=True), model, r"zero\(0\)")  # fmt: skip


def pin_param_gather_without_grad_overlap(p: Profile) -> None:
    """What rule ``param-gather-without-grad-overlap`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "param-gather-without-grad-overlap",
            configure(model, 16, zero=1, overlap_param_gather=True), model,
            "without overlap_grad_reduce")  # fmt: skip


def pin_tp_comm_overlap_without_sp(p: Profile) -> None:
    """What rule ``tp-comm-overlap-without-sp`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    with_sp = configure(model, 16, tp=4, sp=True, tp_comm_overlap=True)
    refused(p, "tp-comm-overlap-without-sp", forced(with_sp, sp=False), model,
            r"tp_comm_overlap with tp\(4\) needs sequence parallelism")
    accepted(p, "tp-comm-overlap-without-sp", with_sp, model)
    accepted(p, "tp-comm-overlap-without-sp", configure(model, 16, tp_comm_overlap=True), model)


def pin_sp_sequence_split(p: Profile) -> None:
    """What rule ``sp-sequence-split`` refuses (and lets through)."""
    model = load("llama3-8b")
    refused(p, "sp-sequence-split", configure(model, 16, tp=8, cp=2, sp=True, seq_len=4100),
            model, r"seq_len\(4100\) / cp\(2\) = 2050 tokens over tp\(8\)")  # fmt: skip
    accepted(p, "sp-sequence-split", configure(model, 16, tp=8, cp=2, sp=True), model)


def pin_cp_sequence(p: Profile) -> None:
    """What rule ``cp-sequence`` refuses (and lets through)."""
    model = load("llama3-8b")
    ring = configure(model, 16, tp=2, cp=4, sp=True)
    odd = replace(ring, training=TrainingSpec(seq_length=8196, global_batch_size=64))
    refused(p, "cp-sequence", odd, model, r"seq_len\(8196\) is not divisible by 2 x cp\(4\) = 8")
    accepted(p, "cp-sequence", ring, model)


def pin_vpp_without_pipeline(p: Profile) -> None:
    """What rule ``vpp-without-pipeline`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "vpp-without-pipeline", forced(configure(model, 16), vpp=2), model,
            r"vpp\(2\) > 1 needs pipeline parallelism: pp\(1\)")


def pin_vpp_microbatches(p: Profile) -> None:
    """What rule ``vpp-microbatches`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    interleaved = configure(model, 16, tp=2, pp=4, vpp=2, sp=True)
    refused(p, "vpp-microbatches", replace(interleaved, num_microbatches=10), model,
            r"num_microbatches\(10\) is not a multiple of 4")
    accepted(p, "vpp-microbatches", interleaved, model)


def pin_moe_comm_overlap(p: Profile) -> None:
    """What rule ``moe-comm-overlap`` refuses (and lets through): combined 1F1B needs
    interleaving with a pipeline, and not TE's TP overlap (full recomputation is the
    configuration's own rule)."""
    model = load("mixtral-8x7b")
    plain = configure(model, 64, pp=4, vpp=2, ep=8, zero=1, mbs=1,
                      overlap_moe_expert_parallel_comm=True)  # fmt: skip
    accepted(p, "moe-comm-overlap", plain, model)
    refused(p, "moe-comm-overlap", forced(plain, vpp=1), model, r"needs interleaving")
    refused(p, "moe-comm-overlap", forced(plain, tp=2, sp=True, tp_comm_overlap=True), model,
            r"CUDA_DEVICE_MAX_CONNECTIONS 32 and 1")


def pin_bf16_moments(p: Profile) -> None:
    """What rule ``bf16-moments`` refuses (and lets through): the precision-aware optimizer
    inside the distributed optimizer, without offload."""
    model = load("gpt-1.7b")
    accepted(p, "bf16-moments", configure(model, 16, zero=1, optimizer_moments="bf16"), model)
    refused(p, "bf16-moments", configure(model, 16, optimizer_moments="bf16"), model,
            r"needs the distributed optimizer")
    refused(p, "bf16-moments", configure(model, 16, zero=3, optimizer_moments="bf16",
                                         overlap_grad_reduce=True, overlap_param_gather=True),
            model, r"Megatron-FSDP keeps its own main parameters")  # fmt: skip
    refused(p, "bf16-moments", configure(model, 16, zero=1, offload="optimizer",
                                         optimizer_moments="bf16"), model, r"offloaded")
    accepted(p, "bf16-moments", configure(model, 16), model)


def pin_deepep_capacity(p: Profile) -> None:
    """What rule ``deepep-capacity`` refuses (and lets through): DeepEP's dispatcher pads no
    expert to a capacity."""
    model = load("mixtral-8x7b")
    deepep = configure(model, 64, ep=8, zero=1, moe_dispatcher="deepep")
    accepted(p, "deepep-capacity", deepep, model)
    capped = model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": 1.25})})  # fmt: skip
    refused(p, "deepep-capacity", deepep, capped, r"does not pad experts to capacity")
    accepted(p, "deepep-capacity", configure(model, 64, ep=8, zero=1), capped)


def pin_vpp_chunks(p: Profile) -> None:
    """What rule ``vpp-chunks`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    uneven = configure(model, 16, tp=2, pp=4, sp=True, first_stage_layers=5,
                       last_stage_layers=5)  # fmt: skip
    refused(p, "vpp-chunks", forced(uneven, vpp=2), model,
            r"vpp\(2\) equal chunks, the embedding's and the loss's slots a layer short: "
            r"stages of 5 and 7 layers do not cut so")
    accepted(p, "vpp-chunks", uneven, model)
    # 4 + 5 x 3 + 5: five slots a stage, the embedding's one of the first stage's
    slotted = configure(model, 40, tp=8, pp=5, sp=True, first_stage_layers=4,
                        last_stage_layers=5)  # fmt: skip
    accepted(p, "vpp-chunks", forced(slotted, vpp=5), model)


def pin_expert_parallel(p: Profile) -> None:
    """What rule ``expert-parallel`` refuses (and lets through)."""
    dense, mixtral = load("gpt-1.7b"), load("mixtral-8x7b")
    refused(p, "expert-parallel", forced(configure(dense, 16), ep=2), dense,
            r"ep\(2\) > 1 but gpt-1.7b has no experts")
    ep3 = forced(configure(mixtral, 16, tp=2, sp=True), ep=3)
    refused(p, "expert-parallel", ep3, mixtral, r"num_experts\(8\) is not divisible by ep\(3\)")


def pin_moe_tp_without_sp(p: Profile) -> None:
    """What rule ``moe-tp-without-sp`` refuses (and lets through)."""
    model = load("mixtral-8x7b")
    refused(p, "moe-tp-without-sp", configure(model, 16, tp=2, ep=2), model,
            r"experts and tp\(2\) > 1")
    accepted(p, "moe-tp-without-sp", configure(model, 16, ep=2), model)


def pin_recompute_modules(p: Profile) -> None:
    """What rule ``recompute-modules`` refuses (and lets through)."""
    mixtral, gpt = load("mixtral-8x7b"), load("gpt-1.7b")
    refused(p, "recompute-modules", configure(mixtral, 16, ep=8, recompute="selective",
                                              recompute_modules="moe_act", precision="fp16"),
            mixtral, r"moe_act needs --moe-grouped-gemm.* in fp16")  # fmt: skip
    refused(p, "recompute-modules", configure(gpt, 16, recompute="selective",
                                              recompute_modules="moe_act"),
            gpt, r"has no experts")  # fmt: skip
    refused(p, "recompute-modules", configure(mixtral, 16, ep=8, recompute="selective",
                                              recompute_modules="mla_up_proj"),
            mixtral, r"mla_up_proj needs latent attention")  # fmt: skip
    accepted(p, "recompute-modules", configure(mixtral, 16, ep=8, recompute="selective",
                                               recompute_modules="moe_act,layernorm"), mixtral)
    if "megatron-te-fp8" in p.stacks:  # MindSpeed runs no FP8 stack
        refused(p, "recompute-modules", configure(
            mixtral, 16, ep=8, recompute="selective", recompute_modules="moe_act,layernorm",
            stack="megatron-te-fp8"), mixtral, r"layernorm and moe_act in FP8.*delayed")
        accepted(p, "recompute-modules", configure(
            mixtral, 16, ep=8, recompute="selective", recompute_modules="core_attn",
            stack="megatron-te-fp8"), mixtral)  # fmt: skip


def pin_moe_bias_with_tp(p: Profile) -> None:
    """What rule ``moe-bias-with-tp`` refuses (and lets through)."""
    mixtral = load("mixtral-8x7b")
    biased = mixtral.model_copy(update={"bias": True})
    refused(p, "moe-bias-with-tp", configure(biased, 16, tp=2, sp=True), biased,
            r"expert tensor parallelism 1, here etp\(2\)")
    accepted(p, "moe-bias-with-tp", configure(biased, 16, ep=2), biased)
    # Folded over the tensor-parallel ranks, the experts are not tensor-parallel.
    accepted(p, "moe-bias-with-tp", configure(biased, 16, tp=2, sp=True, ep=2, etp=1), biased)


def pin_bias_without_qkv_bias(p: Profile) -> None:
    """What rule ``bias-without-qkv-bias`` refuses (and lets through)."""
    gpt = load("gpt-1.7b")
    odd = gpt.model_copy(update={"qkv_bias": False})
    refused(p, "bias-without-qkv-bias", configure(odd, 16), odd, "none on QKV")
    qwen = load("Qwen2.5-72B")  # the other way round Megatron says: --add-qkv-bias
    accepted(p, "bias-without-qkv-bias", configure(qwen, 16, tp=8, sp=True), qwen)


def pin_layer_architecture(p: Profile, *, window: bool) -> None:
    """What rule ``layer-architecture`` refuses (and lets through): Gemma 2's post-norms, a
    sliding window where the framework has no --window-size (``window`` False)."""
    gemma = planner.load_model(REPO / "tests/data/hf/gemma-2-9b.config.json")
    refused(p, "layer-architecture", configure(gemma, 16), gemma, "has post-norms")
    phi = planner.load_model(REPO / "tests/data/hf/Phi-3-mini-4k-instruct.config.json")
    if window:
        accepted(p, "layer-architecture", configure(phi, 16), phi)
    else:
        refused(p, "layer-architecture", configure(phi, 16), phi, "has sliding-window attention")
    qwen3 = load("Qwen3-8B")
    accepted(p, "layer-architecture", configure(qwen3, 16), qwen3)
    predicting = qwen3.model_copy(update={"mtp_layers": 2})  # --mtp-num-layers on both
    accepted(p, "layer-architecture", configure(predicting, 16), predicting)


def pin_rank_order(p: Profile) -> None:
    """What rule ``rank-order`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "rank-order", configure(model, 16, tp=2, rank_order="cp-ep-dp-tp-pp"), model,
            "rank_order 'cp-ep-dp-tp-pp'.*tp-cp-ep-dp-pp")


def pin_pytorch_context_parallel(p: Profile) -> None:
    """What rule ``pytorch-context-parallel`` refuses (and lets through): K/V all-gathered as
    PyTorch's context parallelism runs them, which the Megatron family does not run."""
    model = load("gpt-1.7b")
    refused(p, "pytorch-context-parallel", configure(model, 16, cp=2, cp_algo="allgather"),
            model, r"cp\(2\) with keys and values all-gathered \(cp_algo allgather")
    accepted(p, "pytorch-context-parallel", configure(model, 16, cp=2), model)
    accepted(p, "pytorch-context-parallel", configure(model, 16, cp_algo="allgather"), model)


def pin_fused_attention_precision(p: Profile) -> None:
    """What rule ``fused-attention-precision`` refuses (and lets through)."""
    model = load("gpt-1.7b")
    refused(p, "fused-attention-precision", configure(model, 16, precision="fp32"), model,
            "precision fp32")
    accepted(p, "fused-attention-precision",
             configure(model, 16, precision="fp32", flash_attention=False), model)


def pin_unfused_attention_with_cp(p: Profile) -> None:
    """What rule ``unfused-attention-with-cp`` refuses (and lets through)."""
    model = load("llama3-8b")
    refused(p, "unfused-attention-with-cp",
            configure(model, 16, tp=2, cp=2, sp=True, flash_attention=False), model,
            r"cp=2\) runs only with fused attention")  # fmt: skip


P = megatron.PROFILE


def test_rule_zero_bubble() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/pipeline_parallel/schedules.py:161-168;
    megatron/core/transformer/transformer_config.py:3073-3077"""
    pin_zero_bubble(P)


def test_rule_gpipe() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/pipeline_parallel/schedules.py:161-168"""
    pin_gpipe(P)


def test_rule_zero_2_3_with_pipeline() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 docs/user-guide/parallelism-guide.md:78;
    megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:627-638"""
    pin_zero_2_3_with_pipeline(P)


def test_rule_zero_2_3_grad_overlap() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3
    megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:331-333"""
    pin_zero_2_3_grad_overlap(P)


def test_rule_zero_3_param_overlap() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3
    megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:328-330"""
    pin_zero_3_param_overlap(P)


def test_rule_param_gather_without_sharding() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1024-1027"""
    pin_param_gather_without_sharding(P)


def test_rule_param_gather_without_grad_overlap() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1028-1029"""
    pin_param_gather_without_grad_overlap(P)


def test_rule_tp_comm_overlap_without_sp() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1441-1442"""
    pin_tp_comm_overlap_without_sp(P)


def test_rule_sp_sequence_split() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/tensor_parallel/mappings.py:72-74"""
    pin_sp_sequence_split(P)


def test_rule_cp_sequence() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1335-1338"""
    pin_cp_sequence(P)


def test_rule_vpp_without_pipeline() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1000-1004"""
    pin_vpp_without_pipeline(P)


def test_rule_vpp_microbatches() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/pipeline_parallel/schedules.py:1172-1180;
    megatron/core/model_parallel_config.py:567-568"""
    pin_vpp_microbatches(P)


def test_rule_moe_comm_overlap() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:3002-3037;
    megatron/training/arguments.py:1466-1474"""
    pin_moe_comm_overlap(P)


def test_rule_bf16_moments() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/optimizer/__init__.py:1054-1060;
    megatron/core/optimizer/distrib_optimizer.py:1007-1013"""
    pin_bf16_moments(P)


def test_rule_deepep_capacity() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:1754-1761"""
    pin_deepep_capacity(P)


def test_rule_recompute_modules() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:1964-1973,
    1999-2005"""
    pin_recompute_modules(P)


def test_rule_vpp_chunks() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:2306-2368;
    megatron/core/transformer/transformer_block.py:175-178, 191-201"""
    pin_vpp_chunks(P)


def test_rule_expert_parallel() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1654-1658"""
    pin_expert_parallel(P)


def test_rule_moe_tp_without_sp() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/moe/moe_layer.py:636-640"""
    pin_moe_tp_without_sp(P)


def test_rule_moe_bias_with_tp() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:2612-2615"""
    pin_moe_bias_with_tp(P)


def test_rule_bias_without_qkv_bias() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1608-1610"""
    pin_bias_without_qkv_bias(P)


def test_rule_layer_architecture() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_layer.py:278-288;
    NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:2384-2393;
    NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:2450-2453;
    megatron/core/transformer/transformer_config.py:248-255;
    megatron/core/transformer/multi_token_prediction.py:864-884"""
    pin_layer_architecture(P, window=True)


def test_rule_pytorch_context_parallel() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3
    megatron/core/extensions/transformer_engine.py:2063-2143: Megatron's context
    parallelism is Transformer Engine's (``cp_comm_type``), whose ``all_gather`` is not
    PyTorch's."""
    pin_pytorch_context_parallel(P)


def test_rule_window_with_ring_cp() -> None:
    """NVIDIA/TransformerEngine@d0067d0da6cb
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:5054-5060"""
    phi = planner.load_model(REPO / "tests/data/hf/Phi-3-mini-4k-instruct.config.json")
    refused(P, "window-with-ring-cp", configure(phi, 16, cp=2, seq_len=4096), phi,
            r"only with --cp-comm-type a2a or all_gather, not the ring \(cp=2")
    accepted(P, "window-with-ring-cp", configure(phi, 16, cp=2, cp_algo="ulysses",
                                                 seq_len=4096), phi)  # fmt: skip
    llama = load("llama3-8b")
    accepted(P, "window-with-ring-cp", configure(llama, 16, cp=2), llama)


def test_rule_rank_order() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/initialize.py:395"""
    pin_rank_order(P)


def test_rule_fused_attention_precision() -> None:
    """NVIDIA/TransformerEngine@d0067d0da6cb
    transformer_engine/pytorch/attention/dot_product_attention/utils.py:598-644"""
    pin_fused_attention_precision(P)


def test_rule_unfused_attention_with_cp() -> None:
    """NVIDIA/TransformerEngine@d0067d0da6cb
    transformer_engine/pytorch/attention/dot_product_attention/utils.py:1169-1173;
    NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/dot_product_attention.py:57-59"""
    pin_unfused_attention_with_cp(P)


def test_profile_names_megatron() -> None:
    """The profile is Megatron-LM's and its launcher is the module's."""
    assert (P.name, P.title, P.launch) == ("megatron", "Megatron-LM", megatron.launch)
    assert len({r.name for r in P.rules}) == len(P.rules)


def test_some_layers_recomputed_are_the_block_method() -> None:
    """Full recomputation of each chunk's first N layers is ``--recompute-method block
    --recompute-num-layers N`` (NVIDIA/Megatron-LM@d98e8a6 megatron/core/recompute.py:167-178,
    N counted per model chunk, ``transformer_block.py:334``); Megatron's own checks take it:
    full needs a method and a count (``transformer_config.py:1908-1925``), and a method goes
    with full only (``megatron/training/arguments.py:1425-1428``)."""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, recompute="full",
                         recompute_layers=3)  # fmt: skip
    text = megatron.launch(resolved, model).text
    flags = read_flags(text)
    assert [flags[k] for k in ("--recompute-granularity", "--recompute-method",
                               "--recompute-num-layers")] == ["full", "block", "3"]
    assert flags["--recompute-method"] in ("block", "uniform")
    assert int(flags["--recompute-num-layers"] or 0) >= 1
    back = read_back(text, world=resolved.num_devices)
    assert back == priced(resolved, model)
    assert back["recompute"] == "full, first 3 per chunk"


def pin_optimizer_offload_zero_0(p: Profile) -> None:
    """What rule ``optimizer-offload-zero-0`` refuses (and lets through)."""
    model = load("llama3-70b")
    refused(p, "optimizer-offload-zero-0", configure(model, 16, tp=8, pp=2, offload="optimizer"),
            model, r"--use-precision-aware-optimizer.*distributed optimizer.*ZeRO-0")
    accepted(p, "optimizer-offload-zero-0",
             configure(model, 16, tp=8, pp=2, zero=1, offload="optimizer"), model)
    accepted(p, "optimizer-offload-zero-0", configure(model, 16, tp=8, pp=2), model)


def test_rule_optimizer_offload_zero_0() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1884-1888;
    NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/optimizer/__init__.py:1057-1060"""
    pin_optimizer_offload_zero_0(P)


def test_optimizer_offload_flags() -> None:
    """The offloaded optimizer is Megatron-Core's HybridDeviceOptimizer, all of it on the CPU,
    with the precision-aware optimizer it asserts (arguments.py:1884-1888) and its copies
    overlapped with the CPU steps as priced; without offload none of the four flags."""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, pp=2, sp=True, zero=1, offload="optimizer")
    flags = read_flags(megatron.launch(resolved, model).text)
    assert flags["--optimizer-offload-fraction"] == "1.0"
    for switch in ("--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                   "--overlap-cpu-optimizer-d2h-h2d", "--use-distributed-optimizer"):
        assert switch in flags and flags[switch] is None, switch
    plain = read_flags(megatron.launch(configure(model, 16, tp=8, pp=2, zero=1), model).text)
    assert not {"--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                "--overlap-cpu-optimizer-d2h-h2d", "--optimizer-offload-fraction"} & set(plain)


def pin_optimizer_offload_fsdp(p: Profile) -> None:
    """What rule ``optimizer-offload-fsdp`` refuses (and lets through)."""
    model = load("llama3-70b")
    overlap = dict(overlap_grad_reduce=True, overlap_param_gather=True)
    for zero in (2, 3):
        refused(p, "optimizer-offload-fsdp",
                configure(model, 16, tp=8, zero=zero, offload="optimizer", **overlap), model,
                rf"distributed optimizer \(ZeRO-1\) only: ZeRO-{zero} is Megatron-FSDP")
    accepted(p, "optimizer-offload-fsdp",
             configure(model, 16, tp=8, zero=1, offload="optimizer"), model)
    accepted(p, "optimizer-offload-fsdp", configure(model, 16, tp=8, zero=3, **overlap), model)


def test_rule_optimizer_offload_fsdp() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/distributed/fsdp/src/docs/optimizer.md:42-44"""
    pin_optimizer_offload_fsdp(P)


def pin_zero_offload(p: Profile) -> None:
    """What rule ``zero-offload`` refuses (and lets through)."""
    model = load("llama3-70b")
    refused(p, "zero-offload", configure(model, 16, tp=8, zero=1, offload="zero-offload"),
            model, r"copies the gradients to the host in the optimizer's step")  # fmt: skip
    accepted(p, "zero-offload", configure(model, 16, tp=8, zero=1, offload="optimizer"), model)


def test_rule_zero_offload() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:150-175"""
    pin_zero_offload(P)


def test_the_fused_loss_is_launched_and_said() -> None:
    """On a ``-fused-loss`` stack the launch adds ``--cross-entropy-loss-fusion`` alone (its
    implementation left to Megatron-Core's default, ``native``, the one priced) and the plan
    says "fused loss"; MindSpeed, which keeps the eager loss, refuses the stack in one line
    naming the stack it runs; estimate's line says it as well."""
    model = load("llama3-8b")
    eager, fused = (configure(model, 8, tp=2, stack=stack)
                    for stack in ("megatron-te", "megatron-te-fused-loss"))  # fmt: skip
    with_eager, with_fused = (read_flags(megatron.launch(r, model).text) for r in (eager, fused))
    assert set(with_fused) - set(with_eager) == {"--cross-entropy-loss-fusion"}
    assert with_fused["--cross-entropy-loss-fusion"] is None
    assert set(with_eager) - set(with_fused) == set()
    assert mindspeed.PROFILE.refusals(fused, model)[0] == (
        "stack megatron-te-fused-loss: MindSpeed runs megatron-te")
    plan = planner.solve(model, nodes(8), planner.SolveOptions(
        framework="megatron", stack="megatron-te-fused-loss", seq_length=4096,
        global_batch_size=32))  # fmt: skip
    assert plan.summary().endswith(", fused loss")
    assert describe(fused.config).endswith(" fused-loss")  # estimate's and validate's line
    assert "fused" not in describe(eager.config)
