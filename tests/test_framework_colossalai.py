"""Colossal-AI as a framework target: every rule, and the plugin construction read back.

The launch text is parsed with ``ast`` as Python would read it: the module-level settings, then
the one plugin call with its keywords (and ``PipelineGradientCheckpointConfig``'s). It is
interpreted with Colossal-AI's own arithmetic (data-parallel size = world / (tp x pp x sp_size),
microbatches from the plugin or from the accumulation steps) and must give back exactly the
configuration the planner priced. Each rule has a test that triggers it, whose docstring cites
the rule's source.
"""

from __future__ import annotations

import ast
import itertools
import sys
from typing import Any

import planner
from planner.frameworks import colossalai as cai
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from tests import framework_cases
from tests.framework_cases import forced, load, verdict, without_mtp


def configure(model: ModelSpec, devices: int, **knobs: Any) -> ResolvedConfig:
    """``knobs`` resolved on ``devices`` H100s, on Colossal-AI's stack unless they say."""
    return framework_cases.configure(model, devices, **{"stack": "colossalai-hf", **knobs})


def refusal(name: str, resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """What the rule called ``name`` says about ``resolved``."""
    return verdict(cai.RULES, name, resolved, model)


# --- reading the launch text back ---------------------------------------------------------------


def read(text: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The plugin class, its keywords (the checkpoint config as its own keywords) and the
    script's settings, as Python would evaluate the snippet."""
    tree = ast.parse(text)
    settings: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Call):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            settings[target.id] = ast.literal_eval(node.value)
    (call,) = [node.value for node in tree.body
               if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)]  # fmt: skip
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Call):
            assert isinstance(keyword.value.func, ast.Name)
            assert keyword.value.func.id in imported
            kwargs[str(keyword.arg)] = {str(k.arg): ast.literal_eval(k.value)
                                        for k in keyword.value.keywords}  # fmt: skip
        else:
            kwargs[str(keyword.arg)] = ast.literal_eval(keyword.value)
    assert call.func.id in imported
    return call.func.id, kwargs, settings


def launched(resolved: ResolvedConfig, model: ModelSpec) -> tuple[str, dict[str, Any],
                                                                   dict[str, Any]]:  # fmt: skip
    """The launch text of a configuration no rule refuses, read back."""
    assert cai.PROFILE.refusals(resolved, model) == ()
    return read(cai.PROFILE.launch(resolved, model).text)


def read_back(kwargs: dict[str, Any], settings: dict[str, Any], world: int) -> dict[str, Any]:
    """The configuration the plugin and settings describe, in the planner's terms."""
    tp, pp = kwargs["tp_size"], kwargs["pp_size"]
    attends = {"ring_attn": "ring", "all_to_all": "ulysses"}.get(
        kwargs.get("sequence_parallelism_mode", ""))
    cp = kwargs["sp_size"] if attends else 1
    dp = world // (tp * pp * cp)
    microbatches = kwargs.get("num_microbatches", settings["ACCUMULATION_STEPS"])
    mbs = kwargs.get("microbatch_size", settings["BATCH_SIZE_PER_RANK"])
    split = kwargs.get("num_layers_per_stage")
    return {"tp": tp, "pp": pp, "cp": cp, "cp_algo": attends, "dp": dp,
            "ep": kwargs.get("ep_size", 1),
            "sp": kwargs.get("sequence_parallelism_mode") in ("split_gather", "ring"),
            "zero": kwargs["zero_stage"], "mbs": mbs, "global": mbs * microbatches * dp,
            "vpp": kwargs.get("num_model_chunks", 1), "split": split,
            "recompute": "full" if settings["GRADIENT_CHECKPOINTING"] else "none"}  # fmt: skip


def expected(resolved: ResolvedConfig) -> dict[str, Any]:
    """What :func:`read_back` must find."""
    c = resolved.config
    split = list(resolved.stage_layers) if c.pp > 1 and c.vpp == 1 else None
    return {"tp": c.tp, "pp": c.pp, "cp": c.cp, "cp_algo": c.cp_algo if c.cp > 1 else None,
            "dp": resolved.dp, "ep": c.ep, "sp": resolved.sp,
            "zero": c.zero, "mbs": c.mbs, "global": resolved.training.global_batch_size,
            "vpp": c.vpp, "split": split, "recompute": c.recompute}  # fmt: skip


# --- known answers ------------------------------------------------------------------------------


def test_llama3_70b_pipeline_with_recompute() -> None:
    """Llama-3 70B, TP8 PP4 DP2, SP, ZeRO-1 gathering under the forward, full recompute."""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, recompute="full",
                         overlap_param_gather=True)  # fmt: skip
    plugin, kwargs, settings = launched(resolved, model)
    assert plugin == "HybridParallelPlugin"
    assert kwargs == {
        "tp_size": 8, "pp_size": 4, "enable_sequence_parallelism": True,
        "sequence_parallelism_mode": "split_gather", "precision": "bf16", "zero_stage": 1,
        "microbatch_size": 1, "num_microbatches": 512, "pp_style": "1f1b",
        "num_model_chunks": 1, "num_layers_per_stage": [20, 20, 20, 20],
        "overlap_communication": False, "overlap_allgather": True,
        "enable_flash_attention": True, "make_vocab_size_divisible_by": 32, "dp_outside": False,
        "gradient_checkpoint_config": {"num_ckpt_layers_per_stage": [20, 20, 20, 20]},
    }  # fmt: skip
    # llama3-70b.json is Llama-3.1 70B's config: rope_theta 500000, rms_norm_eps 1e-5, llama3
    # scaling x8 over 8192 positions; the config the model is built from carries them.
    assert settings.pop("HF_CONFIG") == {
        "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert settings == {"HF_MODEL_CLASS": "LlamaForCausalLM", "ATTN_IMPLEMENTATION": "sdpa",
                        "GRADIENT_CHECKPOINTING": True, "BATCH_SIZE_PER_RANK": 512,
                        "ACCUMULATION_STEPS": 1, "NO_SYNC_BEFORE_LAST": False}  # fmt: skip
    # Colossal-AI pads to a multiple of 32 x 8 = 256: 128256 = 501 x 256, nothing added.
    assert model.vocab_size % (kwargs["make_vocab_size_divisible_by"] * 8) == 0


def test_llama3_8b_ring_attention() -> None:
    """Llama-3 8B at 32k tokens, TP4 CP2 DP8 without pipelines: ring_attn over sp_size 2, the
    step's microbatches accumulated by the script with booster.no_sync before the last."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=4, cp=2, zero=1, seq_len=32768, mbs=1,
                         overlap_grad_reduce=True, global_batch=64)  # fmt: skip
    _, kwargs, settings = launched(resolved, model)
    assert (kwargs["sp_size"], kwargs["sequence_parallelism_mode"]) == (2, "ring_attn")
    assert kwargs["enable_sequence_parallelism"] is True and "num_microbatches" not in kwargs
    assert kwargs["overlap_communication"] is True
    assert (settings["BATCH_SIZE_PER_RANK"], settings["ACCUMULATION_STEPS"]) == (1, 8)
    assert settings["NO_SYNC_BEFORE_LAST"] is True
    assert read_back(kwargs, settings, 64) == expected(resolved)


def test_qwen3_8b_ulysses() -> None:
    """Qwen3 8B at 32k tokens, CP8 as Ulysses all-to-alls: the all_to_all mode over sp_size 8
    (the policy divides its 32 query and 8 KV heads by sp_size)."""
    model = load("Qwen3-8B")
    resolved = configure(model, 64, cp=8, cp_algo="ulysses", zero=1, seq_len=32768,
                         global_batch=64)  # fmt: skip
    _, kwargs, settings = launched(resolved, model)
    assert (kwargs["sp_size"], kwargs["sequence_parallelism_mode"]) == (8, "all_to_all")
    assert read_back(kwargs, settings, 64) == expected(resolved)


def test_mixtral_moe_plugin() -> None:
    """Mixtral 8x7B, PP4 DP16 EP4 (and TP2 DP32 EP4): MoeHybridParallelPlugin, expert data
    parallel inside data parallel, experts tensor-parallel like the rest."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, ep=4, zero=1)
    plugin, kwargs, settings = launched(resolved, model)
    assert plugin == "MoeHybridParallelPlugin"
    assert settings["HF_MODEL_CLASS"] == "MixtralForCausalLM"
    assert (kwargs["ep_size"], kwargs["moe_dp_outside"]) == (4, False)
    assert "dp_outside" not in kwargs and "enable_sequence_parallelism" not in kwargs
    assert kwargs["overlap_communication"] is False
    assert read_back(kwargs, settings, 64) == expected(resolved)
    tensor_parallel = configure(model, 64, tp=2, ep=4, zero=1)
    _, kwargs, settings = launched(tensor_parallel, model)
    assert (kwargs["tp_size"], kwargs["ep_size"]) == (2, 4)
    assert read_back(kwargs, settings, 64) == expected(tensor_parallel)


def test_gpt3_uneven_split_as_gpt2() -> None:
    """GPT-3 175B as GPT2LMHeadModel, TP8 PP16 with a 5-layer first and 7-layer last stage;
    its GeLU PyTorch's erf GeLU, as the model and the stack's count have it (``GPT2Config``
    defaults to ``gelu_new``, the tanh approximation written out in Python)."""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, sp=True, zero=1, first_stage_layers=5,
                         last_stage_layers=7)  # fmt: skip
    _, kwargs, settings = launched(resolved, model)
    assert kwargs["num_layers_per_stage"] == [5, *[6] * 14, 7]
    assert settings["HF_MODEL_CLASS"] == "GPT2LMHeadModel"
    assert settings["HF_CONFIG"] == {"layer_norm_epsilon": 1e-05, "activation_function": "gelu"}
    assert kwargs["make_vocab_size_divisible_by"] == 128  # 51200 = 50 x 128 x 8
    assert read_back(kwargs, settings, 1024) == expected(resolved)


def test_interleaved_even_split_and_checkpointing() -> None:
    """Llama-3 405B interleaved (vpp 2): no per-stage counts, checkpointing per model chunk."""
    model = load("llama3.1-405b")
    resolved = configure(model, 1008, tp=8, pp=9, vpp=2, sp=True, zero=1, recompute="full",
                         global_batch=2016)  # fmt: skip
    _, kwargs, settings = launched(resolved, model)
    assert (kwargs["pp_style"], kwargs["num_model_chunks"]) == ("interleaved", 2)
    assert "num_layers_per_stage" not in kwargs
    assert kwargs["gradient_checkpoint_config"] == {"num_ckpt_layers_per_stage": [7] * 18}
    assert read_back(kwargs, settings, 1008) == expected(resolved)


def test_tp_overlap_is_ring_mode() -> None:
    """TP communication overlap is split_gather's decomposed variant, sequence mode 'ring'."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=1, tp_comm_overlap=True)
    _, kwargs, _ = launched(resolved, model)
    assert kwargs["sequence_parallelism_mode"] == "ring"


def test_unfused_attention_is_eager() -> None:
    """Unfused attention: flash off and the model built with eager attention."""
    model = load("gpt-1.7b")
    resolved = configure(model, 8, zero=2, flash_attention=False, overlap_grad_reduce=True)
    _, kwargs, settings = launched(resolved, model)
    assert kwargs["enable_flash_attention"] is False
    assert settings["ATTN_IMPLEMENTATION"] == "eager"
    # ZeRO-2 reduce-scatters every backward: no booster.no_sync.
    assert settings["NO_SYNC_BEFORE_LAST"] is False and kwargs["precision"] == "fp16"


def test_every_launchable_configuration_reads_back_exactly() -> None:
    """Over a grid of knobs on four models, every configuration no rule refuses launches as
    itself: degrees, split, batch arithmetic, ZeRO and recomputation."""
    cases = (("llama3-8b", 64), ("mixtral-8x7b", 64), ("gpt-1.7b", 16), ("gpt3-175b", 1024))
    grid = itertools.product((1, 2, 8), (1, 2, 4), (1, 2), ("ring", "ulysses"), (0, 1, 2),
                             ("none", "full"), (False, True), (1, 2))  # fmt: skip
    count = 0
    for (name, world), (tp, pp, cp, algo, zero, recompute, sp, vpp) in itertools.product(
            cases, grid):
        model = load(name)
        try:
            resolved = configure(model, world, tp=tp, pp=pp, cp=cp, cp_algo=algo,
                                 ep=4 if model.moe else 1, zero=zero, sp=sp,
                                 recompute=recompute, vpp=vpp,
                                 overlap_grad_reduce=zero == 0 and pp == 1)  # fmt: skip
        except planner.PlannerError:
            continue
        if cai.PROFILE.refusals(resolved, model):
            continue
        _, kwargs, settings = read(cai.PROFILE.launch(resolved, model).text)
        assert read_back(kwargs, settings, world) == expected(resolved), (name, resolved.config)
        count += 1
    assert count > 30


# --- every rule ---------------------------------------------------------------------------------


def test_architecture() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/policies/auto_policy.py:59-229"""
    dense_mla = without_mtp("deepseek-v3").model_copy(update={"moe": None})
    for model in (load("Qwen3-30B-A3B"), dense_mla):
        resolved = configure(model, 8, global_batch=8, seq_len=4096)
        assert "no Shardformer policy" in (refusal("architecture", resolved, model) or ""), model
    # Qwen3 with experts is named: the list of policies read as if it qualified
    qwen3_moe = load("Qwen3-30B-A3B")
    assert "(none for Qwen3-MoE)" in (refusal("architecture", configure(
        qwen3_moe, 8, global_batch=8, seq_len=4096), qwen3_moe) or "")
    assert "Qwen3-MoE" not in (refusal("architecture", configure(
        dense_mla, 8, global_batch=8, seq_len=4096), dense_mla) or "")
    predicting = load("DeepSeek-V3")
    assert "multi-token-prediction" in (refusal("architecture", configure(predicting, 8,
                                        global_batch=8, seq_len=4096), predicting) or "")
    assert [cai.family(load(n)) for n in ("gpt3-175b", "llama3-8b", "Qwen2.5-72B",
                                          "mixtral-8x7b", "deepseek-v3", "DeepSeek-V3")] == [
        "gpt2", "llama", "qwen2", "mixtral", "deepseek_v3", "deepseek_v3"]  # fmt: skip


def test_deepseek_v3_tensor_parallel() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/policies/deepseek_v3.py:18-22"""
    model = without_mtp("DeepSeek-V3")
    resolved = configure(model, 512, tp=2, ep=8, zero=1, global_batch=1024, seq_len=4096)
    assert "refuses tensor" in (refusal("deepseek-v3-tensor-parallel", resolved, model) or "")
    llama = load("llama3-8b")
    assert refusal("deepseek-v3-tensor-parallel", configure(llama, 64, tp=8, sp=True),
                   llama) is None  # fmt: skip


def test_deepseek_v3_recompute() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/deepseek_v3.py:245-254"""
    model = without_mtp("DeepSeek-V3")
    resolved = configure(model, 512, pp=4, ep=8, zero=1, first_stage_layers=13,
                         last_stage_layers=16, recompute="full", global_batch=1024,
                         seq_len=4096)  # fmt: skip
    assert "but the model's first" in (refusal("deepseek-v3-recompute", resolved, model) or "")


def test_deepseek_v3_expert_and_pipeline_parallel() -> None:
    """DeepSeek-V3 from its Hugging Face config, PP4 x EP8 ZeRO-1: the MoE plugin over the
    checkpoint's own modeling (flash_attention_2 or eager), the config's RoPE (YaRN x40),
    norm epsilon and routing (sigmoid, x2.5, top 4 of 8 groups, aux-loss-free) in HF_CONFIG."""
    model = without_mtp("DeepSeek-V3")
    resolved = configure(model, 512, pp=4, ep=8, zero=1, first_stage_layers=13,
                         last_stage_layers=16, global_batch=1024, seq_len=4096)  # fmt: skip
    plugin, kwargs, settings = launched(resolved, model)
    assert plugin == "MoeHybridParallelPlugin"
    assert read_back(kwargs, settings, 512) == expected(resolved)
    assert (settings["HF_MODEL_CLASS"], settings["ATTN_IMPLEMENTATION"]) == (
        "DeepseekV3ForCausalLM", "flash_attention_2")
    config = settings["HF_CONFIG"]
    assert {k: config[k] for k in ("rope_theta", "rms_norm_eps", "routed_scaling_factor",
                                   "n_group", "topk_group", "scoring_func", "topk_method")} == {
        "rope_theta": 10000.0, "rms_norm_eps": 1e-06, "routed_scaling_factor": 2.5,
        "n_group": 8, "topk_group": 4, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    assert config["rope_scaling"]["type"] == "yarn" and config["rope_scaling"]["factor"] == 40.0
    notes = " ".join(cai.PROFILE.launch(resolved, model).notes)
    assert "trust_remote_code=True" in notes


def test_zero_3() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1122"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=3)
    assert "zero_stage 0, 1 or 2" in (refusal("zero-3", resolved, model) or "")


def test_zero_2_with_pipeline() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1134-1136"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=2)
    assert "pp(4)" in (refusal("zero-2-with-pipeline", resolved, model) or "")


def test_zero_precision() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1361"""
    model = load("gpt-1.7b")
    resolved = configure(model, 8, zero=1, precision="fp32")
    assert "fp16 or bf16" in (refusal("zero-precision", resolved, model) or "")


def test_gpipe() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1124"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, schedule="gpipe")
    assert "GPipe" in (refusal("gpipe", resolved, model) or "")


def test_one_f_one_b_microbatches() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/pipeline/schedule/one_f_one_b.py:93-95

    Llama 3 70B at TP8 PP4 with a global batch of 2: two microbatches for four stages, which
    the 1F1B schedule asserts against on its first step (the export wrote it); four run."""
    model = load("llama3-70b")
    short = configure(model, 32, tp=8, pp=4, sp=True, zero=1, global_batch=2)
    assert short.num_microbatches == 2
    assert "asserts at least as many microbatches as stages" in (
        refusal("one-f-one-b-microbatches", short, model) or "")
    enough = configure(model, 32, tp=8, pp=4, sp=True, zero=1, global_batch=4)
    assert refusal("one-f-one-b-microbatches", enough, model) is None


def test_zero_bubble() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1056-1058;
    hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1124;
    hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1169-1175;
    hpcaitech/ColossalAI@4f9953b colossalai/pipeline/schedule/v_schedule.py:46-60"""
    model = load("llama3-70b")
    h1 = configure(model, 64, tp=8, pp=4, sp=True, zero=1, schedule="zb-h1")
    assert "styles are 1f1b, interleaved and zbv" in (refusal("zero-bubble", h1, model) or "")
    v = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, schedule="zb-v")
    assert "PipelineGraph searches" in (refusal("zero-bubble", v, model) or "")
    assert refusal("zero-bubble", configure(model, 64, tp=8, pp=4, sp=True, zero=1),
                   model) is None  # fmt: skip


def test_interleaved_uneven_split() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/pipeline/stage_manager.py:41-42;
    colossalai/pipeline/stage_manager.py:100-102"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, first_stage_layers=18,
                         last_stage_layers=22)  # fmt: skip
    assert "[18, 20, 20, 22]" in (refusal("interleaved-uneven-split", resolved, model) or "")


def test_selective_recompute() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/llama.py:183-209"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=1, recompute="selective")
    assert "whole decoder layers" in (refusal("selective-recompute", resolved, model) or "")


def test_context_parallel_model() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/llama.py:555;
    colossalai/shardformer/modeling/gpt2.py:864; colossalai/shardformer/modeling/llama.py:522-525;
    colossalai/shardformer/policies/gpt2.py:56"""
    model = load("Qwen2.5-72B")
    resolved = configure(model, 64, tp=8, cp=2, zero=1, global_batch=64, seq_len=8192)
    assert "Qwen2ForCausalLM" in (refusal("context-parallel-model", resolved, model) or "")
    ulysses = configure(model, 64, cp=8, cp_algo="ulysses", zero=1, global_batch=64,
                        seq_len=8192)
    assert refusal("context-parallel-model", ulysses, model) is None  # Qwen2 runs all_to_all
    gpt = load("gpt-1.7b")
    assert refusal("context-parallel-model", configure(gpt, 8, cp=2, zero=1), gpt) is None
    gpt_ulysses = configure(gpt, 8, cp=2, cp_algo="ulysses", zero=1)
    assert "GPT2LMHeadModel" in (refusal("context-parallel-model", gpt_ulysses, gpt) or "")


def test_ring_attention_with_sp() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1059-1087"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=4, cp=2, sp=True, zero=1)
    assert "not both" in (refusal("ring-attention-with-sp", resolved, model) or "")


def test_ring_attention_unfused() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1080-1081"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=4, cp=2, zero=1, flash_attention=False)
    assert "flash attention" in (refusal("ring-attention-unfused", resolved, model) or "")
    ulysses = forced(resolved, cp_algo="ulysses")  # all_to_all leaves flash attention as given
    assert refusal("ring-attention-unfused", ulysses, model) is None


def test_moe_zero_2() -> None:
    """hpcaitech/ColossalAI@4f9953b
    colossalai/booster/plugin/moe_hybrid_parallel_plugin.py:227-233"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, tp=2, ep=4, zero=2)
    assert "zero_stage 2 into 1" in (refusal("moe-zero-2", resolved, model) or "")
    overlap = configure(model, 64, tp=2, ep=4, zero=1, overlap_grad_reduce=True)
    assert "overlap_communication off" in (refusal("moe-grad-overlap", overlap, model) or "")


def test_moe_ring_attention() -> None:
    """hpcaitech/ColossalAI@4f9953b
    colossalai/booster/plugin/moe_hybrid_parallel_plugin.py:240-262, 283"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, tp=2, cp=2, ep=4, zero=1)
    assert "no ring_attn" in (refusal("moe-ring-attention", resolved, model) or "")
    ulysses = forced(resolved, cp_algo="ulysses")
    assert "all_to_all mode is not written" in (refusal("moe-ring-attention", ulysses, model)
                                                or "")


def test_moe_sequence_parallel() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/policies/mixtral.py:70-74;
    colossalai/shardformer/policies/mixtral.py:121-150"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, tp=2, pp=4, ep=4, sp=True, zero=1)
    assert "Mixtral policy" in (refusal("moe-sequence-parallel", resolved, model) or "")


def test_moe_ddp_with_ep() -> None:
    """hpcaitech/ColossalAI@4f9953b
    colossalai/booster/plugin/moe_hybrid_parallel_plugin.py:438-455"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, tp=2, ep=4, overlap_grad_reduce=True)
    assert "PyTorch DDP" in (refusal("moe-ddp-with-ep", resolved, model) or "")


def test_tp_comm_overlap() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/layer/linear.py:344-352;
    colossalai/shardformer/policies/gpt2.py:57-61"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, sp=True, zero=1, tp_comm_overlap=True)
    assert "sequence_parallelism_mode 'ring'" in (refusal("tp-comm-overlap", resolved, model)
                                                  or "")  # fmt: skip


def test_pipeline_send_without_sp() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/pipeline/p2p.py:594-614"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, zero=1)
    assert "whole hidden state" in (refusal("pipeline-send-without-sp", resolved, model) or "")
    assert refusal("pipeline-send-without-sp", forced(resolved, sp=True), model) is None


def test_grad_overlap_with_pipeline() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1404-1434"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, overlap_grad_reduce=True)
    assert "after the pipeline schedule" in (refusal("grad-overlap-with-pipeline", resolved,
                                                     model) or "")  # fmt: skip


def test_ddp_overlap() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1311-1313"""
    model = load("gpt-1.7b")
    resolved = configure(model, 8)
    assert "PyTorch DDP" in (refusal("ddp-overlap", resolved, model) or "")
    assert refusal("ddp-overlap", forced(resolved, overlap_grad_reduce=True), model) is None


def test_sequence_parallel_split() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/layer/_operation.py:1191-1202"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, sp=True, zero=1, seq_len=4100)
    assert "seq_len(4100)" in (refusal("sp-sequence-split", resolved, model) or "")


def test_pytorch_context_parallel() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:48"""
    model = load("llama3-8b")
    ring = configure(model, 64, cp=2, zero=1, seq_len=8192)
    assert refusal("pytorch-context-parallel", ring, model) is None
    gathered = forced(ring, cp_algo="allgather")
    assert "cp_algo allgather" in (refusal("pytorch-context-parallel", gathered, model) or "")


def test_rank_order() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1110-1117"""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, sp=True, zero=1, rank_order="tp-pp-cp-ep-dp")
    assert "tp, then cp, dp, pp" in (refusal("rank-order", resolved, model) or "")
    ulysses = configure(model, 64, tp=4, cp=2, cp_algo="ulysses", zero=1, global_batch=64,
                        seq_len=8192)  # fmt: skip
    assert "sp_size ranks fastest, then tp" in (refusal("rank-order", ulysses, model) or "")
    alone = configure(model, 64, cp=2, cp_algo="ulysses", zero=1, global_batch=64,
                      seq_len=8192)  # fmt: skip
    assert refusal("rank-order", alone, model) is None


def test_every_rule_is_tested_with_its_source() -> None:
    """Each rule's source is cited by a test in this module (whitespace aside, the repository
    prefix written once)."""
    cited = [" ".join((f.__doc__ or "").split()) for name, f in vars(sys.modules[__name__]).items()
             if name.startswith("test_")]  # fmt: skip
    for rule in cai.RULES:
        assert any(rule.source in doc for doc in cited), rule.name


def test_partial_recompute() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/llama.py:183-199;
    colossalai/shardformer/shard/grad_ckpt_config.py:67-78;
    colossalai/shardformer/modeling/gpt2.py:267;
    colossalai/shardformer/modeling/mixtral.py:364

    Llama checkpoints each chunk's first ``num_ckpt_layers_per_stage[stage + chunk x pp]``
    layers, no more than the chunk holds; GPT-2 and Mixtral checkpoint every layer; without
    a pipeline the count is read through a stage manager there is none of."""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, recompute="full",
                         recompute_layers=7)  # fmt: skip
    _, kwargs, _ = launched(resolved, model)
    # 80 layers: 20 per stage, 10 per chunk, 7 of them checkpointed.
    assert kwargs["gradient_checkpoint_config"] == {"num_ckpt_layers_per_stage": [7] * 8}
    past = configure(model, 64, tp=8, pp=4, sp=True, zero=1, recompute="full",
                     recompute_layers=25)  # fmt: skip
    _, kwargs, _ = launched(past, model)
    assert kwargs["gradient_checkpoint_config"] == {"num_ckpt_layers_per_stage": [20] * 4}
    flat = configure(model, 64, tp=8, sp=True, zero=1, recompute="full", recompute_layers=2)
    assert "stage manager" in (refusal("partial-recompute", flat, model) or "")
    gpt = load("gpt-1.7b")
    piped = configure(gpt, 8, pp=2, zero=1, recompute="full", recompute_layers=2)
    assert "GPT2LMHeadModel" in (refusal("partial-recompute", piped, gpt) or "")
    assert refusal("partial-recompute", forced(piped, recompute_layers=None), gpt) is None


def test_optimizer_offload() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/booster/plugin/hybrid_parallel_plugin.py:1093,
    1247"""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, pp=2, zero=1, offload="optimizer")
    assert "cpu_offload" in (refusal("optimizer-offload", resolved, model) or "")
    assert refusal("optimizer-offload", configure(model, 16, tp=8, pp=2, zero=1), model) is None


def test_moe_capacity() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/mixtral.py:123-158;
    colossalai/shardformer/modeling/deepseek_v3.py:86-100

    The expert-parallel blocks send every routed token: a capacity factor is refused."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, ep=8, zero=1)
    assert refusal("moe-capacity", resolved, model) is None
    capped = model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": 2.0})})  # fmt: skip
    assert "dropless" in (refusal("moe-capacity", resolved, capped) or "")


def test_moe_comm_overlap() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/mixtral.py:123-200

    The expert-parallel block dispatches, computes and combines in line."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, ep=8, zero=1, overlap_moe_expert_parallel_comm=True)
    assert "in line" in (refusal("moe-comm-overlap", resolved, model) or "")


def test_deepep() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/shardformer/modeling/mixtral.py:123-200

    Colossal-AI's expert-parallel block exchanges tokens with its own all-to-alls."""
    model = load("mixtral-8x7b")
    deepep = configure(model, 64, pp=4, ep=8, zero=1, moe_dispatcher="deepep")
    assert "exchanged with all-to-alls here" in (refusal("deepep", deepep, model) or "")
    assert refusal("deepep", configure(model, 64, pp=4, ep=8, zero=1), model) is None


def test_bf16_moments() -> None:
    """hpcaitech/ColossalAI@4f9953b colossalai/nn/optimizer/hybrid_adam.py (fp32 moments)

    The launch's HybridAdam keeps fp32 moments."""
    model = load("gpt-1.7b")
    bf16 = configure(model, 16, zero=1, optimizer_moments="bf16")
    assert "keeps Adam's moments in fp32" in (refusal("bf16-moments", bf16, model) or "")
    assert refusal("bf16-moments", configure(model, 16, zero=1), model) is None


def test_experts_with_tp_are_searched_without_sp() -> None:
    """Colossal-AI's Mixtral policy runs no sequence parallelism, so its TP plans are searched
    without it: ``--tp 2`` on 24 H100 plans TP2 EP4 (the search set SP with every TP and
    said Colossal-AI launches no configuration)."""
    model = load("Mixtral-8x7B-v0.1")
    plan = planner.solve(model, framework_cases.nodes(24), planner.SolveOptions(
        framework="colossalai", global_batch_size=96, seq_length=4096,
        pins=planner.Pins(tp=2)))  # fmt: skip
    (stage,) = {s.parallel for s in plan.stages}
    assert (stage.tp, stage.sp, stage.ep) == (2, False, 4)
