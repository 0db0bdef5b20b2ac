"""torchtitan as a framework target: every rule, and the job TOML read back.

The launch text is parsed with ``tomllib`` and interpreted with torchtitan's own arithmetic
(data-parallel degree = replicate x shard, gradient accumulation = global / (local x dp), pipeline
microbatches = local / microbatch size, stages from the module names); it must give back exactly
the configuration the planner priced. Each rule has a test that triggers it, whose docstring
cites the rule's source.
"""

from __future__ import annotations

import itertools
import sys
import tomllib
from typing import Any

import pytest

import planner
from planner.errors import ConfigError
from planner.frameworks import torchtitan as tt
from planner.frameworks._torchtitan_toml import model_parts
from planner.plan.config import ParallelConfig, ResolvedConfig
from planner.spec import ModelSpec
from tests import framework_cases
from tests.framework_cases import forced, load, verdict, without_mtp


def configure(model: ModelSpec, devices: int, **knobs: Any) -> ResolvedConfig:
    """``knobs`` resolved on ``devices`` H100s, on torchtitan's own stack unless they say."""
    return framework_cases.configure(model, devices, **{"stack": "torchtitan-eager", **knobs})


def refusal(name: str, resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """What the rule called ``name`` says about ``resolved``."""
    return verdict(tt.RULES, name, resolved, model)


def launched(resolved: ResolvedConfig, model: ModelSpec) -> dict[str, Any]:
    """The TOML of a configuration no rule refuses, read back."""
    assert tt.PROFILE.refusals(resolved, model) == ()
    text = tt.PROFILE.launch(resolved, model).text
    assert text.startswith(f"# torchtitan {tt.VERSION} ")
    return tomllib.loads(text)


def read_back(toml: dict[str, Any], world: int) -> dict[str, Any]:
    """The configuration the tables describe, in the planner's terms."""
    train, par = toml["training"], toml["parallelism"]
    tp, pp, cp = (par[f"{k}_parallel_degree"] for k in ("tensor", "pipeline", "context"))
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp * tp * pp * cp == world
    accumulation = train["global_batch_size"] // (train["local_batch_size"] * dp)
    assert train["global_batch_size"] == train["local_batch_size"] * dp * accumulation
    if pp > 1:
        mbs = par["pipeline_parallel_microbatch_size"]
        microbatches = train["local_batch_size"] // mbs * accumulation
        parts = par["module_fqns_per_model_part"]
        layers = [sum(m.startswith("layers.") for m in p) for p in parts]
        vpp = len(parts) // pp
        # A V schedule runs parts k and 2 pp - 1 - k on rank k; the others loop.
        v_shape = par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
        rank = [min(k, 2 * pp - 1 - k) if v_shape else k % pp for k in range(len(parts))]
        split = [sum(n for n, r in zip(layers, rank, strict=True) if r == s) for s in range(pp)]
    else:
        mbs, microbatches, vpp, split = train["local_batch_size"], accumulation, 1, [None]
    reshard = par.get("fsdp_reshard_after_forward")
    zero = {None: 0, "always": 3, "never": 1 if pp > 1 else 2}[reshard]
    return {"tp": tp, "pp": pp, "dp": dp, "ep": par.get("expert_parallel_degree", 1),
            "mbs": mbs, "microbatches": microbatches, "vpp": vpp, "split": split, "zero": zero,
            "recompute": recompute_of(toml["activation_checkpoint"])}  # fmt: skip


def recompute_of(table: dict[str, str]) -> str:
    """The planner's recomputation of an ``[activation_checkpoint]`` table: selective every
    n-th block is full recomputation of some layers."""
    every_nth = table["mode"] == "selective" and table.get("selective_ac_option", "").isdigit()
    return "full" if every_nth else table["mode"]


def expected(resolved: ResolvedConfig) -> dict[str, Any]:
    """What :func:`read_back` must find (ZeRO as data parallelism runs it: none at dp 1)."""
    c = resolved.config
    return {"tp": c.tp, "pp": c.pp, "dp": resolved.dp, "ep": c.ep, "mbs": c.mbs,
            "microbatches": resolved.num_microbatches, "vpp": c.vpp,
            "split": list(resolved.stage_layers) if c.pp > 1 else [None],
            "zero": c.zero if resolved.dp > 1 else 0, "recompute": c.recompute}  # fmt: skip


# --- known answers ------------------------------------------------------------------------------


def test_llama3_8b_fsdp_zero3() -> None:
    """Llama-3 8B, TP8 FSDP8: ZeRO-3 is resharding after forward, 64 accumulated microbatches."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    toml = launched(resolved, model)
    assert toml["model"] == {"name": "llama3", "flavor": "8B"}
    assert toml["training"] == {"local_batch_size": 1, "global_batch_size": 512,
                                "seq_len": 8192, "dtype": "float32",
                                "mixed_precision_param": "bfloat16",
                                "mixed_precision_reduce": "float32"}  # fmt: skip
    assert toml["parallelism"] == {
        "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 8,
        "fsdp_reshard_after_forward": "always", "tensor_parallel_degree": 8,
        "disable_loss_parallel": False, "enable_async_tensor_parallel": False,
        "context_parallel_degree": 1, "pipeline_parallel_degree": 1,
    }  # fmt: skip
    assert toml["activation_checkpoint"] == {"mode": "none"} and toml["compile"] == {
        "enable": False}
    assert read_back(toml, 64) == expected(resolved) and resolved.num_microbatches == 64


def test_llama3_70b_uneven_pipeline() -> None:
    """Llama-3 70B, TP8 PP4 FSDP2 with 18 and 22 layers on the end stages, full AC: ZeRO-1 is
    FSDP2 under the pipeline, all microbatches in one local batch."""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, recompute="full",
                         overlap_param_gather=True, first_stage_layers=18,
                         last_stage_layers=22)  # fmt: skip
    toml = launched(resolved, model)
    par = toml["parallelism"]
    assert (par["pipeline_parallel_schedule"], par["fsdp_reshard_after_forward"]) == (
        "1F1B", "never")
    parts = par["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [18, 20, 20, 22]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [int(m.split(".")[1]) for p in parts for m in p if m.startswith("layers.")] == list(
        range(80))
    assert toml["training"]["local_batch_size"] == 512  # 1024 / dp 2, one step of microbatches
    assert read_back(toml, 64) == expected(resolved)


def test_llama3_405b_interleaved() -> None:
    """Llama-3.1 405B interleaved (vpp 2 on 9 stages): 18 parts, part k on rank k % 9."""
    model = load("llama3.1-405b")
    resolved = configure(model, 1008, tp=8, pp=9, vpp=2, sp=True, zero=1, recompute="full",
                         overlap_param_gather=True, global_batch=2016)  # fmt: skip
    toml = launched(resolved, model)
    par = toml["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 18 and parts[9][0] == "layers.63"  # rank 0's second chunk
    assert read_back(toml, 1008) == expected(resolved)


def test_gpipe() -> None:
    """GPipe is PyTorch's GPipe schedule."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, pp=2, sp=True, zero=1, schedule="gpipe",
                         overlap_param_gather=True)  # fmt: skip
    assert launched(resolved, model)["parallelism"]["pipeline_parallel_schedule"] == "GPipe"


def test_zero_bubble() -> None:
    """ZB-H1 is PyTorch's interleaved zero-bubble schedule with one part per rank; ZB-V its
    ZBV schedule, rank k running parts k and 2 pp - 1 - k (parts 0 and 7 of 8 on rank 0)."""
    model = load("llama3-70b")
    h1 = configure(model, 64, tp=8, pp=4, sp=True, zero=1, schedule="zb-h1",
                   overlap_param_gather=True)  # fmt: skip
    toml = launched(h1, model)
    par = toml["parallelism"]
    assert par["pipeline_parallel_schedule"] == "InterleavedZeroBubble"
    assert len(par["module_fqns_per_model_part"]) == 4
    assert read_back(toml, 64) == expected(h1)
    v = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, schedule="zb-v",
                  overlap_param_gather=True)  # fmt: skip
    toml = launched(v, model)
    par = toml["parallelism"]
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    parts = par["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [10] * 8
    assert parts[7][-2:] == ["norm", "output"]  # rank 0's second part ends the model
    assert read_back(toml, 64) == expected(v)


def test_qwen3_moe_expert_parallel() -> None:
    """Qwen3 30B-A3B, TP2 FSDP32 EP8: experts tensor-parallel like the rest (etp = tp)."""
    model = load("Qwen3-30B-A3B")
    resolved = configure(model, 64, tp=2, ep=8, sp=True, zero=3, overlap_grad_reduce=True,
                         overlap_param_gather=True, global_batch=256, seq_len=4096)  # fmt: skip
    toml = launched(resolved, model)
    assert toml["model"] == {"name": "qwen3", "flavor": "30B-A3B"}
    par = toml["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (8, 2)
    assert read_back(toml, 64) == expected(resolved)


def test_fp32_ddp() -> None:
    """Llama-3 8B in fp32 on data parallelism alone, one microbatch per step: DDP."""
    model = load("llama3-8b")
    resolved = configure(model, 64, precision="fp32", overlap_grad_reduce=True, global_batch=64,
                         recompute="full")  # fmt: skip
    toml = launched(resolved, model)
    par = toml["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (64, 1)
    assert "fsdp_reshard_after_forward" not in par
    assert toml["training"]["mixed_precision_param"] == "float32"
    assert read_back(toml, 64) == expected(resolved)


def test_model_parts_doctest_shape() -> None:
    """Two stages of 2 and 1 layers: the embedding first, the norm and output last."""
    assert model_parts((2, 1), 1) == [["tok_embeddings", "layers.0", "layers.1"],
                                         ["layers.2", "norm", "output"]]  # fmt: skip


def test_every_launchable_configuration_reads_back_exactly() -> None:
    """Over a grid of knobs on three models, every configuration no rule refuses launches as
    itself: degrees, split, batch arithmetic, ZeRO and recomputation."""
    cases = (("llama3-8b", 64), ("llama3-70b", 64), ("Qwen3-30B-A3B", 64))
    grid = itertools.product((1, 2, 8), (1, 2, 4), (1, 2), (0, 1, 2, 3), ("none", "full"),
                             (False, True), (256, 8192))  # fmt: skip
    count = 0
    for (name, world), (tp, pp, vpp, zero, recompute, pipelined, gbs) in itertools.product(
            cases, grid):  # fmt: skip
        model = load(name)
        try:
            resolved = configure(model, world, tp=tp, pp=pp, vpp=vpp, sp=True, zero=zero,
                                 ep=4 if model.moe else 1, recompute=recompute,
                                 overlap_grad_reduce=not pipelined, overlap_param_gather=True,
                                 global_batch=gbs, seq_len=4096)  # fmt: skip
        except planner.PlannerError:
            continue
        if tt.PROFILE.refusals(resolved, model):
            continue
        assert read_back(launched(resolved, model), world) == expected(resolved), (
            name, resolved.config)
        count += 1
    assert count > 20


# --- every rule ---------------------------------------------------------------------------------


def test_model_flavor() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/__init__.py:29-99;
    torchtitan/models/qwen3/__init__.py:30-190; torchtitan/models/deepseek_v3/__init__.py:29-157;
    torchtitan/models/deepseek_v3/model/args.py (no multi-token prediction)

    DeepSeek-V3 as its Hugging Face config trains it, with a multi-token-prediction module, is
    refused saying how to train it without."""
    predicting = load("DeepSeek-V3")
    refused = refusal("model-flavor", configure(predicting, 8, global_batch=8, seq_len=2048),
                      predicting) or ""  # fmt: skip
    assert "multi-token-prediction modules (set mtp_layers" in refused
    assert refused.endswith("which torchtitan v0.2.2 does not build")
    shallower = without_mtp("deepseek-v3").model_copy(update={"num_layers": 60})
    for model in (load("mixtral-8x7b"), load("gpt3-175b"), shallower):
        resolved = configure(model, 8, global_batch=8, seq_len=2048)
        assert "registered models" in (refusal("model-flavor", resolved, model) or ""), model
    assert tt.flavor(load("Meta-Llama-3.1-70B")) is tt.flavor(load("llama3-70b")) is not None
    deepseek = tt.flavor(without_mtp("DeepSeek-V3"))
    assert deepseek is tt.flavor(without_mtp("deepseek-v3")) is not None
    assert (deepseek.name, deepseek.flavor, deepseek.pipeline) == ("deepseek_v3", "671B", True)


def test_flex_attention_context_parallel() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/deepseek_v3/infra/parallelize.py:67-73;
    torchtitan/models/deepseek_v3/model/args.py:101-109"""
    model = without_mtp("DeepSeek-V3")
    resolved = configure(model, 1024, cp=2, ep=8, zero=3, global_batch=1024, seq_len=4096)
    assert "supports SDPA only" in (refusal("flex-attention-context-parallel", resolved, model)
                                    or "")  # fmt: skip
    llama = load("llama3-8b")
    sdpa = configure(llama, 64, tp=8, cp=2, sp=True, zero=3, seq_len=32768)
    assert refusal("flex-attention-context-parallel", sdpa, llama) is None


def test_deepseek_v3_launches_its_671b_flavor() -> None:
    """DeepSeek-V3 from its Hugging Face config, PP4 x FSDP x EP8 and TP2 x EP8: the 671B
    flavor with torchtitan's pipelining (``deepseek_v3/__init__.py:165``) and its TP and
    EP/ETP (``infra/parallelize.py:75-134``), read back as priced; the notes say what the
    flavor builds otherwise than the config (norm epsilon 1e-5 against 1e-6)."""
    model = without_mtp("DeepSeek-V3")
    for knobs in (dict(pp=4, ep=8, zero=1, overlap_param_gather=True, first_stage_layers=13,
                       last_stage_layers=16),
                  dict(tp=2, sp=True, ep=8, zero=3, overlap_grad_reduce=True,
                       overlap_param_gather=True)):  # fmt: skip
        resolved = configure(model, 256, global_batch=256, seq_len=4096, recompute="full",
                             **knobs)  # fmt: skip
        toml = launched(resolved, model)
        assert toml["model"] == {"name": "deepseek_v3", "flavor": "671B"}
        assert read_back(toml, 256) == expected(resolved)
    notes = tt.PROFILE.launch(resolved, model).notes
    assert any("block-causally" in note for note in notes)
    (differs,) = [note for note in notes if "differs from" in note]
    assert differs.endswith("norm epsilon 1e-06 (the flavor's 1e-05)")


def test_flavor_differences_name_what_the_toml_cannot_set() -> None:
    """torchtitan's Qwen3 235B-A22B flavor has RoPE base 5e6 (``qwen3/__init__.py:168-190``)
    where the released config says 1e6; every Llama 3 flavor scales RoPE as Llama 3.1
    (``llama3/model/args.py:19-24``), which Llama 3's config does not; Llama 3.1 matches."""
    def differences(name: str) -> tuple[str, ...]:
        model = load(name)
        found = tt.flavor(model)
        assert found is not None
        return tt.flavor_differences(found, model)

    assert differences("Qwen3-235B-A22B") == (
        "qwen3 235B-A22B differs from Qwen3-235B-A22B in what the TOML cannot set: RoPE base "
        "1e+06 (the flavor's 5e+06)",)
    assert differences("Meta-Llama-3-8B-Instruct")[0].endswith(
        "RoPE scaling none (the flavor's llama3 x8)")
    assert differences("Meta-Llama-3.1-70B") == ()


def test_pipeline_model() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/qwen3/__init__.py:199;
    torchtitan/models/deepseek_v3/__init__.py:165"""
    model = load("Qwen3-30B-A3B")
    resolved = configure(model, 64, tp=2, pp=2, ep=8, sp=True, zero=1, global_batch=256,
                         seq_len=4096)  # fmt: skip
    assert "does not pipeline qwen3" in (refusal("pipeline-model", resolved, model) or "")


def test_fp16() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/config/job_config.py:282"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, precision="fp16")
    assert "bfloat16 or float32" in (refusal("fp16", resolved, model) or "")


def test_mixed_precision_without_fsdp() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/utils.py:243-263"""
    model = load("llama3-8b")
    alone = configure(model, 64, tp=8, pp=8, sp=True, zero=1, global_batch=64)  # dp 1
    assert "through FSDP2 only" in (refusal("mixed-precision-without-fsdp", alone, model) or "")
    ddp = configure(model, 64, zero=0, global_batch=64)
    assert refusal("mixed-precision-without-fsdp", ddp, model) is not None


def test_context_parallel() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/context_parallel.py:53-68 (SDPA through
    PyTorch's _ContextParallel); torchtitan/components/validate.py:213 (the only caller of
    set_rotate_method); pytorch/pytorch@cf30153
    torch/distributed/tensor/experimental/_context_parallel/_attention.py:77"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, cp=2, sp=True, zero=3, seq_len=32768)
    assert ("cp(2) as ring attention: torchtitan v0.2.2's training context parallelism "
            "all-gathers keys and values") in (refusal("context-parallel", resolved, model) or "")
    assert "as Ulysses all-to-alls" in (
        refusal("context-parallel", forced(resolved, cp_algo="ulysses"), model) or "")
    assert refusal("context-parallel", forced(resolved, cp_algo="allgather"), model) is None


def test_tp_without_sp() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:173-241"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=3)
    assert "SequenceParallel" in (refusal("tp-without-sp", resolved, model) or "")


def test_seq_len_divisor() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:69-74;
    pytorch/torchtitan@73a0e69 torchtitan/distributed/parallel_dims.py:365-372"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, seq_len=4104)
    assert "tp(8) x 2 x cp(1) = 16" in (refusal("seq-len-divisor", resolved, model) or "")


def test_selective_recompute() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/activation_checkpoint.py:174-190;
    torchtitan/distributed/activation_checkpoint.py:98-122;
    torchtitan/models/llama3/infra/parallelize.py:36-51;
    torchtitan/models/qwen3/infra/parallelize.py:39-55; torchtitan/config/job_config.py:661"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, recompute="selective")
    assert "every other matmul" in (refusal("selective-recompute", resolved, model) or "")
    # the per-operator policy is launched
    op = configure(model, 64, tp=8, sp=True, zero=3, recompute="selective", recompute_modules="op",
                   overlap_grad_reduce=True, overlap_param_gather=True)  # fmt: skip
    assert refusal("selective-recompute", op, model) is None
    assert launched(op, model)["activation_checkpoint"] == {"mode": "selective",
                                                            "selective_ac_option": "op"}
    # on MoE blocks too (pytorch/torchtitan@73a0e69 torchtitan/models/qwen3/infra/
    # parallelize.py:39-55, torchtitan/config/job_config.py:661), without TP only
    moe = load("Qwen3-30B-A3B")
    resolved = configure(moe, 64, tp=2, ep=8, sp=True, zero=3, recompute="selective",
                         recompute_modules="op", global_batch=256, seq_len=4096)  # fmt: skip
    assert "priced without tensor parallelism only" in (
        refusal("selective-recompute", resolved, moe) or "")
    resolved = configure(moe, 64, tp=1, ep=8, zero=3, recompute="selective",
                         recompute_modules="op", global_batch=256, seq_len=4096,
                         overlap_grad_reduce=True, overlap_param_gather=True)  # fmt: skip
    assert refusal("selective-recompute", resolved, moe) is None
    assert launched(resolved, moe)["activation_checkpoint"] == {"mode": "selective",
                                                                "selective_ac_option": "op"}
    mla = load("deepseek-v3")
    resolved = configure(mla, 64, tp=1, ep=8, zero=3, recompute="selective",
                         recompute_modules="op", global_batch=256, seq_len=4096)  # fmt: skip
    assert "latent attention" in (refusal("selective-recompute", resolved, mla) or "")


def test_unfused_attention() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/attention.py:168-190"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, flash_attention=False)
    assert "fused" in (refusal("unfused-attention", resolved, model) or "")


def test_tp_comm_overlap() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/tensor_parallel.py:16-23"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, tp_comm_overlap=True)
    assert "runs only compiled" in (refusal("tp-comm-overlap", resolved, model) or "")


def test_ddp_with_model_parallel() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:148-151"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, precision="fp32")
    assert "> 1D parallelism" in (refusal("ddp-with-model-parallel", resolved, model) or "")


def test_ddp_every_microbatch() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/train.py:542; torchtitan/train.py:577-584"""
    model = load("llama3-8b")
    resolved = configure(model, 64, precision="fp32", overlap_grad_reduce=True)
    assert "each of the 8" in (refusal("ddp-every-microbatch", resolved, model) or "")


def test_ddp_overlap() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:363-372"""
    model = load("llama3-8b")
    resolved = configure(model, 64, precision="fp32", global_batch=64)
    assert "always overlaps" in (refusal("ddp-overlap", resolved, model) or "")


def test_fsdp_zero1_without_pipeline() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:287-357;
    pytorch/torchtitan@73a0e69 torchtitan/train.py:542"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=1)
    assert "every backward" in (refusal("fsdp-zero-1-without-pipeline", resolved, model) or "")


def test_fsdp_zero2_microbatches() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:319-346"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=2, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    assert "each of the 64" in (refusal("fsdp-zero-2-microbatches", resolved, model) or "")
    one = configure(model, 64, tp=8, sp=True, zero=2, overlap_grad_reduce=True,
                    overlap_param_gather=True, global_batch=8)  # fmt: skip
    assert tt.PROFILE.refusals(one, model) == ()
    assert read_back(launched(one, model), 64)["zero"] == 2


def test_fsdp_overlap() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:319-357"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3, overlap_grad_reduce=True)
    assert "must both be on" in (refusal("fsdp-overlap", resolved, model) or "")


def test_fsdp_pipeline_sharding() -> None:
    """pytorch/pytorch@cf30153 torch/distributed/pipelining/stage.py:844-848;
    pytorch/pytorch@cf30153 torch/distributed/pipelining/stage.py:1172-1191"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=3)
    assert "which is ZeRO-1" in (refusal("fsdp-pipeline-sharding", resolved, model) or "")


def test_fsdp_pipeline_overlap() -> None:
    """pytorch/pytorch@cf30153 torch/distributed/pipelining/stage.py:1165-1191;
    pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:324-327"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    assert "after the last microbatch" in (refusal("fsdp-pipeline-overlap", resolved, model)
                                           or "")  # fmt: skip
    assert refusal("fsdp-pipeline-overlap", forced(resolved, overlap_grad_reduce=False),
                   model) is None  # fmt: skip


def test_zero_bubble_rounds() -> None:
    """pytorch/pytorch@cf30153 torch/distributed/pipelining/schedules.py:3046-3053"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, schedule="zb-h1",
                         overlap_param_gather=True, global_batch=18)  # fmt: skip
    assert resolved.num_microbatches == 9
    assert "rounds max(1, 9 // 4) = 2" in (refusal("zero-bubble-rounds", resolved, model) or "")
    ok = configure(model, 64, tp=8, pp=4, sp=True, zero=1, schedule="zb-h1",
                   overlap_param_gather=True, global_batch=20)  # fmt: skip
    assert refusal("zero-bubble-rounds", ok, model) is None


def test_compiled_zero_bubble() -> None:
    """pytorch/pytorch@cf30153 torch/distributed/pipelining/schedules.py
    (_check_torch_compile_compatibility); pytorch/torchtitan@73a0e69
    torchtitan/models/llama3/infra/parallelize.py:256-266

    torchtitan compiles each block before it builds the schedule, and PyTorch's zero-bubble
    schedules raise on a compiled stage: ZB-H1 and ZB-V are refused compiled (the export
    wrote ``InterleavedZeroBubble`` beside ``[compile] enable = true``), 1F1B is not."""
    model = load("llama3-70b")
    knobs = dict(tp=8, pp=4, sp=True, zero=1, overlap_param_gather=True,
                 stack="torchtitan-compiled")  # fmt: skip
    for schedule, vpp in (("zb-h1", 1), ("zb-v", 2)):
        resolved = configure(model, 64, schedule=schedule, vpp=vpp, **knobs)
        assert f"{schedule} with compile" in (
            refusal("compiled-zero-bubble", resolved, model) or "")
        eager = configure(model, 64, schedule=schedule, vpp=vpp,
                          **(knobs | {"stack": "torchtitan-eager"}))  # fmt: skip
        assert refusal("compiled-zero-bubble", eager, model) is None
    assert refusal("compiled-zero-bubble", configure(model, 64, **knobs), model) is None


def test_rank_order() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/parallel_dims.py:143-158"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, overlap_param_gather=True,
                         rank_order="tp-pp-cp-ep-dp")  # fmt: skip
    assert "tp, then cp, dp, pp" in (refusal("rank-order", resolved, model) or "")


def test_every_rule_is_tested_with_its_source() -> None:
    """Each rule's source is cited by a test in this module (whitespace aside)."""
    cited = [" ".join((f.__doc__ or "").split()) for name, f in vars(sys.modules[__name__]).items()
             if name.startswith("test_")]  # fmt: skip
    for rule in tt.RULES:
        assert any(rule.source in doc for doc in cited), rule.name


def test_partial_recompute() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/distributed/activation_checkpoint.py:24-49

    Layer-wise selective AC checkpoints every n-th block a rank builds by a running count:
    some layers recomputed where an n recomputes as many in every model chunk, launched as
    that n."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, pp=2, sp=True, zero=1, recompute="full",
                         recompute_layers=2, overlap_param_gather=True)  # fmt: skip
    assert refusal("partial-recompute", resolved, model) is None  # the 6th and 12th of 16
    assert launched(resolved, model)["activation_checkpoint"] == {
        "mode": "selective", "selective_ac_option": "6"}
    # 32 blocks: every 2nd is 16 and every 3rd 10, never 12
    twelve = configure(model, 64, tp=8, sp=True, zero=3, recompute="full", recompute_layers=12)
    assert "no n recomputes 12 in every model chunk" in (
        refusal("partial-recompute", twelve, model) or "")
    # interleaved, the count runs on across a rank's chunks of 8: every 4th is 2 in each,
    # and no n gives 3 in each
    chunks = dict(tp=8, pp=2, vpp=2, sp=True, zero=1, recompute="full", overlap_param_gather=True)
    assert refusal("partial-recompute", configure(model, 64, recompute_layers=2, **chunks),
                   model) is None  # fmt: skip
    assert refusal("partial-recompute", configure(model, 64, recompute_layers=3, **chunks),
                   model) is not None  # fmt: skip
    assert refusal("partial-recompute", forced(resolved, recompute_layers=None), model) is None
    # DeepSeek-V3's 3 dense blocks first: every n-th block is not each chunk's first kinds
    mixed = without_mtp("deepseek-v3")
    two = configure(mixed, 2048, ep=32, zero=3, recompute="full", recompute_layers=2,
                    overlap_param_gather=True, overlap_grad_reduce=True, global_batch=4096)
    assert "blocks of several kinds" in (refusal("partial-recompute", two, mixed) or "")


def test_optimizer_offload() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama3/infra/parallelize.py:137, 146-147,
    317"""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, pp=2, zero=1, offload="optimizer")
    assert "CPUOffloadPolicy" in (refusal("optimizer-offload", resolved, model) or "")
    assert refusal("optimizer-offload", configure(model, 16, tp=8, pp=2, zero=1), model) is None


def test_moe_capacity() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/moe/moe.py:22-41

    torchtitan routes every token (no capacity factor in MoEArgs): a model with one is
    refused, the same model without one launched."""
    model = load("Qwen3-30B-A3B")
    resolved = configure(model, 64, ep=8, zero=3, global_batch=256, seq_len=4096)
    assert refusal("moe-capacity", resolved, model) is None
    capped = model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": 1.25})})  # fmt: skip
    assert "dropless" in (refusal("moe-capacity", resolved, capped) or "")


def test_compiled_moe() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/llama4/infra/parallelize.py:593-656

    Compiled, an MoE block is compiled submodule by submodule, its routed experts left eager:
    the torchtitan-compiled stack, counted on whole dense blocks, does not price it, so the
    run is refused where it is priced (``estimate``, a batch's row, the search), not only by
    the framework: it priced Qwen3-30B-A3B's FSDP plan 2.9 times the eager step, a price
    ``explain``'s compile notch showed. A dense model compiles, its blocks and its loss."""
    model = load("Qwen3-30B-A3B")
    knobs = dict(ep=8, zero=3, global_batch=256, seq_len=4096)
    with pytest.raises(ConfigError, match="compiles Qwen3-30B-A3B's blocks submodule by "):
        configure(model, 64, stack="torchtitan-compiled", **knobs)
    cluster = framework_cases.nodes(64)
    rows = [ParallelConfig(stack=stack, **knobs)
            for stack in ("torchtitan-eager", "torchtitan-compiled")]  # fmt: skip
    batch = planner.estimate_batch(model, cluster, rows)
    assert batch.columns["divides"].tolist() == [True, False]
    assert "use torchtitan-eager" in (batch.refusal(1) or "")
    with pytest.raises(ConfigError, match="submodule by submodule"):
        planner.solve(model, cluster, planner.SolveOptions(
            framework="torchtitan", seq_length=4096, global_batch_size=256,
            stack="torchtitan-compiled"))  # fmt: skip
    dense = load("llama3-8b")
    fsdp = dict(zero=3, overlap_grad_reduce=True, overlap_param_gather=True)
    compiled = configure(dense, 8, stack="torchtitan-compiled", **fsdp)
    assert launched(compiled, dense)["compile"] == {"enable": True,
                                                    "components": ["model", "loss"]}
    assert launched(configure(dense, 8, **fsdp), dense)["compile"] == {"enable": False}


def test_moe_comm_overlap() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/moe/moe.py:473-530

    The MoE forward routes, runs the experts and combines in line: no combined 1F1B."""
    model = load("Qwen3-30B-A3B")
    resolved = configure(model, 64, ep=8, zero=3, global_batch=256, seq_len=4096,
                         overlap_moe_expert_parallel_comm=True)  # fmt: skip
    assert "in line" in (refusal("moe-comm-overlap", resolved, model) or "")


def test_deepep() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/models/deepseek_v3/infra/parallelize.py:99-121;
    torchtitan/models/qwen3/infra/parallelize.py:108-118

    DeepSeek-V3's parallelization reads ``expert_parallel_comm_backend = "deepep"`` and
    refuses it with the experts tensor-parallel; Qwen3's never reads it (its experts would
    exchange tokens with all-to-alls while the plan priced DeepEP)."""
    v3 = without_mtp("deepseek-v3")
    folded = configure(v3, 256, tp=2, ep=64, etp=1, sp=True, zero=3, global_batch=256,
                       seq_len=4096, overlap_grad_reduce=True, overlap_param_gather=True,
                       moe_dispatcher="deepep")  # fmt: skip
    assert refusal("deepep", folded, v3) is None
    table = launched(folded, v3)["parallelism"]
    assert table["expert_parallel_comm_backend"] == "deepep"
    assert table["expert_tensor_parallel_degree"] == 1
    split = forced(folded, etp=None, ep=32)
    assert "use etp 1" in (refusal("deepep", split, v3) or "")
    qwen = load("Qwen3-30B-A3B")
    fsdp = dict(zero=3, global_batch=256, seq_len=4096, overlap_grad_reduce=True,
                overlap_param_gather=True)
    resolved = configure(qwen, 64, ep=8, moe_dispatcher="deepep", **fsdp)
    assert "qwen3 models exchange the experts' tokens with all-to-alls" in (
        refusal("deepep", resolved, qwen) or "")
    standard = configure(qwen, 64, ep=8, **fsdp)
    assert "expert_parallel_comm_backend" not in launched(standard, qwen)["parallelism"]


def test_bf16_moments() -> None:
    """pytorch/torchtitan@73a0e69 torchtitan/components/optimizer.py (torch.optim.AdamW, its
    moments in the fp32 parameters' dtype)"""
    model = load("llama3-8b")
    fsdp = dict(zero=3, overlap_grad_reduce=True, overlap_param_gather=True)
    bf16 = configure(model, 16, optimizer_moments="bf16", **fsdp)
    assert "keeps Adam's moments in fp32" in (refusal("bf16-moments", bf16, model) or "")
    assert refusal("bf16-moments", configure(model, 16, **fsdp), model) is None
