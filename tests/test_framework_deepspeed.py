"""DeepSpeed (Megatron-DeepSpeed) as a framework target: every rule, and the launch text read back.

The flags are read as a shell reads them (line continuations joined, then ``shlex``) and the
config after ``# ds_config.json`` with ``json``; both are interpreted with Megatron-DeepSpeed's
and DeepSpeed's own arithmetic (data-parallel size from the world size, accumulation steps from
the batch) and must give back exactly the configuration the planner priced. Each rule has a test
that triggers it, whose docstring cites the rule's source.
"""

from __future__ import annotations

import itertools
import json
import shlex
import sys
from typing import Any

import planner
from planner.frameworks import deepspeed as ds
from planner.plan.config import ParallelConfig, ResolvedConfig
from planner.spec import ModelSpec
from planner.uniform.defaults import framework_defaults
from planner.vocabulary import OFFLOADS
from tests import framework_cases
from tests.framework_cases import forced, load, verdict


def configure(model: ModelSpec, devices: int, **knobs: Any) -> ResolvedConfig:
    """``knobs`` resolved on ``devices`` H100s on DeepSpeed's own stack (its optimizers)."""
    return framework_cases.configure(model, devices, **({"stack": "megatron-deepspeed"} | knobs))


def refusal(name: str, resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """What the rule called ``name`` says about ``resolved``."""
    return verdict(ds.RULES, name, resolved, model)


# --- reading the launch text back ---------------------------------------------------------------


def read(text: str) -> tuple[dict[str, str | None], dict[str, Any]]:
    """The flags (flag -> value, None for a switch) and the ds_config, as their readers see
    them."""
    flags_text, config_text = text.split(f"\n{ds.DS_CONFIG_MARK}\n")
    lines = flags_text.strip("\n").split("\n")
    assert lines[0].startswith("# ") and all(line.endswith(" \\") for line in lines[1:-1])
    flags: dict[str, str | None] = {}
    last = ""
    for word in shlex.split(flags_text.replace("\\\n", " "), comments=True):
        if word.startswith("--"):
            assert word not in flags, f"{word} given twice"
            flags[word] = None
            last = word
        else:
            assert flags[last] is None, f"{last} has two values"
            flags[last] = word
    return flags, json.loads(config_text)


def launched(resolved: ResolvedConfig, model: ModelSpec) -> tuple[dict[str, str | None],
                                                                   dict[str, Any]]:  # fmt: skip
    """The launch text of a configuration no rule refuses, read back."""
    assert ds.PROFILE.refusals(resolved, model) == ()
    return read(ds.PROFILE.launch(resolved, model).text)


def degrees(flags: dict[str, str | None], world: int) -> dict[str, int]:
    """tp, pp and dp as Megatron-DeepSpeed derives them from the flags and the world size."""
    tp = int(flags["--tensor-model-parallel-size"] or 0)
    pp = int(flags["--pipeline-model-parallel-size"] or 0)
    return {"tp": tp, "pp": pp, "dp": world // (tp * pp)}


# --- known answers ------------------------------------------------------------------------------


def test_gpt3_on_1024_gpus() -> None:
    """GPT-3 175B, TP8 PP16 DP8 (without SP), ZeRO-1, full recompute: every degree and switch."""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, recompute="full")
    flags, config = launched(resolved, model)
    assert degrees(flags, 1024) == {"tp": 8, "pp": 16, "dp": 8}
    assert "--sequence-parallel" not in flags and "--no-pipeline-parallel" not in flags
    assert (flags["--micro-batch-size"], flags["--global-batch-size"]) == ("1", "1536")
    assert flags["--checkpoint-num-layers"] == "1" and "--checkpoint-activations" in flags
    assert "--recompute-granularity" not in flags and flags["--zero-stage"] == "1"
    assert config == {
        "train_batch_size": 1536, "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 192, "bf16": {"enabled": True},
        "fp16": {"enabled": False}, "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1, "overlap_comm": False},
        # The engine's default: a 1/tp slice of each activation, all-gathered on arrival.
        "pipeline": {"pipe_partitioned": True, "grad_partitioned": True},
    }  # fmt: skip


def test_gpt3_model_flags() -> None:
    """GPT-3's shape: learned positions, tied embeddings, biases, GELU and LayerNorm are
    Megatron-DeepSpeed's defaults; the dropouts (default 0.1) are always said."""
    model = load("gpt3-175b")
    flags, _ = launched(configure(model, 1024, tp=8, pp=16, zero=1), model)
    assert {k: flags[k] for k in ("--num-layers", "--hidden-size", "--ffn-hidden-size",
                                  "--num-attention-heads", "--num-key-value-heads",
                                  "--kv-channels", "--max-position-embeddings",
                                  "--normalization", "--hidden-dropout",
                                  "--attention-dropout")} == {
        "--num-layers": "96", "--hidden-size": "12288", "--ffn-hidden-size": "49152",
        "--num-attention-heads": "96", "--num-key-value-heads": "96", "--kv-channels": "128",
        "--max-position-embeddings": "2048", "--normalization": "layernorm",
        "--hidden-dropout": "0.1", "--attention-dropout": "0.1",
    }  # fmt: skip
    absent = {"--swiglu", "--use-rotary-position-embeddings", "--disable-bias-linear",
              "--untie-embeddings-and-output-weights", "--num-experts"}  # fmt: skip
    assert absent.isdisjoint(flags)
    # 51200 = 50 x 128 x 8: Megatron's default multiple already pads nothing.
    assert flags["--make-vocab-size-divisible-by"] == "128"


def test_llama3_8b_zero3_without_pipeline() -> None:
    """Llama-3 8B, TP2 DP32 ZeRO-3 with both overlaps: the plain engine, prefetching."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=2, zero=3, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    flags, config = launched(resolved, model)
    assert degrees(flags, 64) == {"tp": 2, "pp": 1, "dp": 32}
    assert "--no-pipeline-parallel" in flags and flags["--zero-stage"] == "3"
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert config["gradient_accumulation_steps"] == 512 // 32 == resolved.num_microbatches
    for switch in ("--swiglu", "--use-rotary-position-embeddings", "--no-position-embedding",
                   "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                   "--use-flash-attn-v2", "--bf16"):  # fmt: skip
        assert switch in flags
    assert (flags["--normalization"], flags["--num-key-value-heads"]) == ("rmsnorm", "8")
    assert ds.PROFILE.launch(resolved, model).environment == {}


def test_zero3_without_overlap_turns_prefetch_off() -> None:
    """ZeRO-3 with neither overlap: overlap_comm off and no prefetch bucket."""
    model = load("llama3-8b")
    _, config = launched(configure(model, 64, tp=8, zero=3), model)
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": False,
                                           "stage3_prefetch_bucket_size": 0}  # fmt: skip


def test_mixtral_expert_parallel() -> None:
    """Mixtral 8x7B, PP4 DP16 EP8: DeepSpeed's MoE flags, experts on every layer."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, ep=8, zero=1, recompute="full")
    flags, config = launched(resolved, model)
    assert degrees(flags, 64) == {"tp": 1, "pp": 4, "dp": 16}
    assert {k: flags[k] for k in ("--num-experts", "--topk", "--expert-interval",
                                  "--moe-expert-parallel-size")} == {
        "--num-experts": "8", "--topk": "2", "--expert-interval": "1",
        "--moe-expert-parallel-size": "8"}  # fmt: skip
    assert "--create-moe-param-group" in flags
    assert config["train_batch_size"] == 256 == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 16)
    assert config["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}  # tp 1


def test_fp16_selective_unfused() -> None:
    """GPT 1.7B in fp16 (the model's own), selective recompute on unfused attention, ZeRO-2."""
    model = load("gpt-1.7b")
    resolved = configure(model, 8, zero=2, recompute="selective", flash_attention=False,
                         overlap_grad_reduce=True)  # fmt: skip
    flags, config = launched(resolved, model)
    assert flags["--recompute-granularity"] == "selective" and "--fp16" in flags
    assert "--use-flash-attn-v2" not in flags and "--checkpoint-activations" not in flags
    assert config["fp16"] == {"enabled": True} and "data_types" not in config
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}


def test_tensor_parallel_pipeline_sends_slices() -> None:
    """Without sp the pipeline engine sends a 1/tp slice and gathers it (as priced)."""
    model = load("gpt3-175b")
    _, config = launched(configure(model, 1024, tp=8, pp=16, zero=1), model)
    assert config["pipeline"] == {"pipe_partitioned": True, "grad_partitioned": True}


def test_batch_arithmetic_on_every_split() -> None:
    """train_batch_size = micro x accumulation x data parallel, for several shapes."""
    model = load("llama3-70b")
    for knobs in ({"tp": 8, "pp": 4, "mbs": 2}, {"tp": 4, "pp": 8, "mbs": 1},
                  {"tp": 8, "pp": 8, "mbs": 4}):  # fmt: skip
        resolved = configure(model, 256, zero=1, **knobs)
        flags, config = launched(resolved, model)
        dp = degrees(flags, 256)["dp"]
        assert dp == resolved.dp and config["train_batch_size"] == 1024 == (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * dp)


def read_back(flags: dict[str, str | None], config: dict[str, Any], world: int) -> dict[str, Any]:
    """The configuration the launch text describes, in the planner's terms."""
    recompute = ("full" if "--checkpoint-activations" in flags else
                 flags.get("--recompute-granularity") or "none")  # fmt: skip
    micro = config["train_micro_batch_size_per_gpu"]
    # ZeRO-Offload needs both: the offload in the ds_config and the CPU Adam it steps with.
    cpu = config["zero_optimization"].get("offload_optimizer") == {"device": "cpu",
                                                                   "pin_memory": True}
    offload = "zero-offload" if cpu and "--cpu-optimizer" in flags else "none"
    return {**degrees(flags, world), "sp": "--sequence-parallel" in flags,
            "ep": int(flags.get("--moe-expert-parallel-size") or 1), "mbs": micro,
            "global": config["train_batch_size"], "zero": config["zero_optimization"]["stage"],
            "microbatches": config["gradient_accumulation_steps"], "recompute": recompute,
            "flash": "--use-flash-attn-v2" in flags, "offload": offload}  # fmt: skip


def test_every_launchable_configuration_reads_back_exactly() -> None:
    """Over a grid of knobs on three models, every configuration no rule refuses launches as
    itself: degrees, batch arithmetic, ZeRO, recomputation and ZeRO-Offload read back from the
    text."""
    cases = (("llama3-8b", 64), ("mixtral-8x7b", 64), ("gpt-1.7b", 16))
    grid = itertools.product((1, 2, 8), (1, 2, 4), (0, 1, 2, 3), ("none", "selective", "full"),
                             (True, False), (False, True), OFFLOADS)  # fmt: skip
    launched_count, offloaded_count = 0, 0
    for (name, world), (tp, pp, zero, recompute, flash, sp, off) in itertools.product(cases, grid):
        model = load(name)
        ep = 4 if model.moe else 1
        try:
            resolved = configure(model, world, tp=tp, pp=pp, ep=ep, zero=zero, sp=sp,
                                 recompute=recompute, flash_attention=flash,
                                 offload=off)  # fmt: skip
        except planner.PlannerError:
            continue
        if ds.PROFILE.refusals(resolved, model):
            continue
        flags, config = read(ds.PROFILE.launch(resolved, model).text)
        c = resolved.config
        assert read_back(flags, config, world) == {
            "tp": c.tp, "pp": c.pp, "dp": resolved.dp, "sp": resolved.sp,
            "ep": c.ep, "mbs": c.mbs, "global": resolved.training.global_batch_size,
            "zero": c.zero, "microbatches": resolved.num_microbatches,
            "recompute": c.recompute, "flash": c.flash_attention, "offload": c.offload,
        }, (name, c)  # fmt: skip
        launched_count += 1
        offloaded_count += c.offload != "none"
    assert launched_count > 20 and offloaded_count > 10


# --- every rule ---------------------------------------------------------------------------------


def test_zero_with_pipeline() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/engine.py:76-77;
    deepspeedai/Megatron-DeepSpeed@4efb479 pretrain_gpt.py:51"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=2)
    assert "ZeRO-2 with pp(16)" in (refusal("zero-2-3-with-pipeline", resolved, model) or "")
    assert refusal("zero-2-3-with-pipeline", forced(resolved, zero=1), model) is None


def test_bf16_without_zero() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:1994-1996;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2011-2021"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8)
    assert "fp32 gradients" in (refusal("bf16-without-zero", resolved, model) or "")
    assert refusal("bf16-without-zero", configure(model, 64, tp=8, precision="fp32"),
                   model) is None  # fmt: skip


def test_pipeline_schedule() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/engine.py:389;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/schedule.py:189-244"""
    model = load("gpt3-175b")
    interleaved = configure(model, 1024, tp=8, pp=16, vpp=2, zero=1)
    assert "interleaved 1F1B (vpp=2)" in (refusal("pipeline-schedule", interleaved, model) or "")
    gpipe = configure(model, 1024, tp=8, pp=16, zero=1, schedule="gpipe")
    assert "GPipe" in (refusal("pipeline-schedule", gpipe, model) or "")
    for schedule, vpp in (("zb-h1", 1), ("zb-v", 2)):
        zb = configure(model, 1024, tp=8, pp=16, vpp=vpp, zero=1, schedule=schedule)
        assert schedule.upper() in (refusal("pipeline-schedule", zb, model) or "")


def test_uneven_split() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/gpt_model.py:349-463;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/module.py:322-341, 396-447;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/utils.py:606-665"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, first_stage_layers=4,
                         last_stage_layers=8)  # fmt: skip
    message = refusal("uneven-split", resolved, model) or ""
    assert "[4, 6, 6" in message
    # What DeepSpeed's own code gives for 96 layers on 16 stages under the pinned target's
    # type:transformer: 6 each. BLOOM's fork's type:transformer|embedding needs a source edit
    # in Megatron-DeepSpeed@4efb479 (gpt_model.py:463), so it is neither offered nor named.
    assert "[6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6] ('type:transformer')" in message
    assert "embedding" not in message
    # 6 on the first stage is the even split written out: launched.
    even = configure(model, 1024, tp=8, pp=16, zero=1, first_stage_layers=6)
    assert refusal("uneven-split", even, model) is None
    # BLOOM's shape, 70 layers on 12 stages: 5 blocks on each end is what BLOOM's fork cut
    # (type:transformer|embedding); the pinned target cuts 6 x 10, 5, 5, so it is refused,
    # naming that split (which the first/last form cannot hold).
    bloom = model.model_copy(update={"num_layers": 70})
    ends = configure(bloom, 384, tp=4, pp=12, zero=1, first_stage_layers=5,
                     last_stage_layers=5)  # fmt: skip
    assert "[6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5]" in (refusal("uneven-split", ends, bloom) or "")
    other = configure(bloom, 384, tp=4, pp=12, zero=1, first_stage_layers=4,
                      last_stage_layers=6)  # fmt: skip
    assert "[6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5] ('type:transformer')" in (
        refusal("uneven-split", other, bloom) or "")


def test_context_parallel() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/arguments.py:974;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:614-621"""
    model = load("llama3-70b")
    resolved = configure(model, 256, tp=8, pp=4, cp=2, zero=1)
    assert "Ulysses" in (refusal("context-parallel", resolved, model) or "")
    gathered = forced(resolved, cp_algo="allgather")
    assert "cp(2) as keys and values all-gathered" in (
        refusal("context-parallel", gathered, model) or "")
    ulysses = forced(resolved, cp_algo="ulysses")
    assert refusal("context-parallel", ulysses, model) is None


def test_ulysses_alone() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/core/parallel_state.py:144-147"""
    model = load("llama3-70b")
    with_tp = configure(model, 256, tp=2, pp=4, cp=2, cp_algo="ulysses", zero=1)
    assert "does not work with tensor or pipeline" in (refusal("ulysses-alone", with_tp, model)
                                                       or "")  # fmt: skip
    alone = configure(model, 256, cp=8, cp_algo="ulysses", zero=3)
    assert refusal("ulysses-alone", alone, model) is None


def test_ulysses_launch_reads_back() -> None:
    """Ulysses over 8 ranks: ``--ds-sequence-parallel-size 8`` and the batch arithmetic over
    world / cp data-parallel ranks, as Megatron-DeepSpeed's arguments.py:101-108 counts them."""
    model = load("llama3-8b")
    resolved = configure(model, 64, cp=8, cp_algo="ulysses", zero=3, global_batch=64,
                         seq_len=65536)  # fmt: skip
    assert ds.PROFILE.refusals(resolved, model) == ()
    text = ds.launch(resolved, model).text
    flags_text, config_text = text.split(f"\n{ds.DS_CONFIG_MARK}\n")
    words = shlex.split(flags_text.replace("\\\n", " "))
    assert words[words.index("--ds-sequence-parallel-size") + 1] == "8"
    config = json.loads(config_text)
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] \
        * (64 // 8) == 64


def test_selective_with_flash() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:606-629"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, recompute="selective")
    assert "unfused path" in (refusal("selective-with-flash", resolved, model) or "")


def test_recompute_modules() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:606-629

    Its selective granularity checkpoints the core attention and nothing else."""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, recompute="selective",
                         recompute_modules="layernorm", flash_attention=False)
    assert "attention core only" in (refusal("recompute-modules", resolved, model) or "")
    plain = configure(model, 1024, tp=8, pp=16, zero=1, recompute="selective",
                      flash_attention=False)
    assert refusal("recompute-modules", plain, model) is None


def test_tp_comm_overlap() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/arguments.py:396-399"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, sp=True, tp_comm_overlap=True)
    assert "tp(8)" in (refusal("tp-comm-overlap", resolved, model) or "")


def test_grad_overlap_with_pipeline() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2390-2393;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/schedule.py:238-241"""
    model = load("gpt-1.7b")
    resolved = configure(model, 64, pp=4, zero=1, overlap_grad_reduce=True)
    assert "pp(4)" in (refusal("grad-overlap-with-pipeline", resolved, model) or "")
    single = configure(model, 8, tp=2, pp=4, zero=1, global_batch=8, overlap_grad_reduce=True)
    assert refusal("grad-overlap-with-pipeline", single, model) is None  # dp 1: nothing to hide


def test_grad_overlap_without_zero() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2980-2982"""
    model = load("gpt-1.7b")
    resolved = configure(model, 8, overlap_grad_reduce=True)
    assert "zero(0)" in (refusal("grad-overlap-without-zero", resolved, model) or "")


def test_grad_overlap_bf16_optimizer() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:1994-1996;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2905-2913"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=1, overlap_grad_reduce=True)
    assert "BF16_Optimizer" in (refusal("grad-overlap-bf16-optimizer", resolved, model) or "")
    fp16 = configure(model, 64, tp=8, zero=1, overlap_grad_reduce=True,
                     precision="fp16")  # fmt: skip
    assert refusal("grad-overlap-bf16-optimizer", fp16, model) is None


def test_param_gather_after_step() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/stage_1_and_2.py:2393-2398;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/bf16_optimizer.py:454-460"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=2, overlap_param_gather=True)
    assert "ZeRO-2" in (refusal("param-gather-after-step", resolved, model) or "")


def test_zero3_overlap() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/partitioned_param_coordinator.py:452;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/config.py:215"""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=3, overlap_grad_reduce=True)
    assert "not overlap_param_gather" in (refusal("zero-3-overlap", resolved, model) or "")


def test_moe_with_zero3() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:1889-1891"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, ep=8, zero=3)
    assert "ZeRO stage 3" in (refusal("moe-with-zero-3", resolved, model) or "")


def test_moe_with_tp() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/moe/sharded_moe.py:706-732"""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, tp=2, pp=4, ep=4, zero=1)
    assert "duplicate tokens" in (refusal("moe-with-tp", resolved, model) or "")


def test_moe_layout() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:1650-1660;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:1069-1072"""
    deepseek = load("deepseek-v3")
    resolved = configure(deepseek, 1024, pp=1, ep=8, zero=1, global_batch=1024, seq_len=4096)
    assert "per-layer list" in (refusal("moe-layout", resolved, deepseek) or "")
    qwen = load("Qwen3-30B-A3B")
    qwen_resolved = configure(qwen, 64, ep=8, zero=1, global_batch=64, seq_len=4096)
    assert "copies of the dense MLP" in (refusal("moe-layout", qwen_resolved, qwen) or "")


def test_deepseek_v3_is_refused_for_its_latent_attention() -> None:
    """DeepSeek-V3's first refusal names what Megatron-DeepSpeed really lacks, MLA (its dense
    prefix could be said with --num-experts' per-layer list)."""
    model = load("DeepSeek-V3")
    resolved = configure(model, 1024, pp=1, ep=8, zero=1, global_batch=1024, seq_len=4096)
    assert "multi-head latent attention" in ds.PROFILE.refusals(resolved, model)[0]


def test_rope_base_and_norm_epsilon() -> None:
    """Llama-3.1 70B: rope_theta 500000 as --rotary-position-embeddings-theta (an int,
    ``megatron/arguments.py:635-637``) and rms_norm_eps 1e-05 as --layernorm-epsilon
    (``arguments.py:652``); its llama3 RoPE scaling has no flag, which a note says."""
    model = load("Meta-Llama-3.1-70B")
    resolved = configure(model, 64, tp=8, zero=1, global_batch=64, seq_len=8192)
    flags, _ = launched(resolved, model)
    assert flags["--rotary-position-embeddings-theta"] == "500000"
    assert flags["--layernorm-epsilon"] == "1e-05"
    (note,) = [n for n in ds.PROFILE.launch(resolved, model).notes if "RoPE scaling" in n]
    assert "llama3 x8 is not applied" in note


def test_architecture() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/transformer.py:578-586;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/arguments.py:598-690;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/arguments.py:937"""
    for name, why in (("deepseek-v3", "latent attention"), ("Qwen3-30B-A3B", "queries and keys"),
                      ("Qwen2.5-72B", "QKV bias without the other")):  # fmt: skip
        model = load(name)
        resolved = configure(model, 8, global_batch=8, seq_len=4096)
        assert why in (refusal("architecture", resolved, model) or ""), name


def test_megatron_sequence_parallel() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/training.py:731-732;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/optimizer/optimizer.py:257-277

    Under ``--deepspeed`` the sequence-parallel norms' gradients are never all-reduced over
    the tensor-parallel ranks (the export wrote ``--sequence-parallel`` with every TP plan):
    refused, and the search plans TP without it, as ``estimate --framework deepspeed`` sets
    it."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=1, sp=True)
    assert "never all-reduces the sequence-parallel norms" in (
        refusal("megatron-sequence-parallel", resolved, model) or "")
    assert refusal("megatron-sequence-parallel", configure(model, 64, tp=8, zero=1),
                   model) is None  # fmt: skip
    cluster = framework_cases.nodes(16)
    plan = planner.solve(model, cluster, planner.SolveOptions(
        framework="deepspeed", global_batch_size=128, seq_length=8192,
        pins=planner.Pins(tp=2)))  # fmt: skip
    (stage,) = {s.parallel for s in plan.stages}
    assert stage.tp == 2 and not stage.sp
    assert not framework_defaults(ParallelConfig(tp=2, zero=1), model, cluster=cluster,
                                  framework="deepspeed").sp  # fmt: skip


def test_rank_order() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/topology.py:244-248;
    deepspeedai/Megatron-DeepSpeed@4efb479 megatron/core/parallel_state.py:185-215"""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, rank_order="tp-pp-cp-ep-dp")
    assert "tp, then cp, dp, pp" in (refusal("rank-order", resolved, model) or "")
    # With no data parallelism the two orders number ranks alike.
    alike = configure(model, 128, tp=8, pp=16, zero=1, rank_order="tp-pp-cp-ep-dp")
    assert refusal("rank-order", alike, model) is None


def test_every_rule_is_tested_with_its_source() -> None:
    """Each rule's source is cited by a test in this module (whitespace aside)."""
    cited = [" ".join((f.__doc__ or "").split()) for name, f in vars(sys.modules[__name__]).items()
             if name.startswith("test_")]  # fmt: skip
    for rule in ds.RULES:
        assert any(rule.source in doc for doc in cited), rule.name


def test_partial_recompute() -> None:
    """deepspeedai/Megatron-DeepSpeed@4efb479 megatron/model/gpt_model.py:446-451;
    megatron/model/transformer.py:1910-1921

    DeepSpeed's checkpointing reruns every layer in runs of --checkpoint-num-layers; the
    pipeline model takes no block method."""
    model = load("gpt3-175b")
    resolved = configure(model, 1024, tp=8, pp=16, zero=1, recompute="full",
                         recompute_layers=2)  # fmt: skip
    assert "block method" in (refusal("partial-recompute", resolved, model) or "")
    assert refusal("partial-recompute", forced(resolved, recompute_layers=None), model) is None


def test_megatron_offload() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/stage_1_and_2.py:1719-1762,
    2320-2343

    Megatron-LM's pipelined offload is refused, DeepSpeed's own ZeRO-Offload is not."""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, pp=2, zero=1, offload="optimizer")
    assert "use offload zero-offload" in (refusal("megatron-offload", resolved, model) or "")
    for offload in ("none", "zero-offload"):
        kept = configure(model, 16, tp=8, pp=2, zero=1, offload=offload)
        assert refusal("megatron-offload", kept, model) is None


def test_zero_offload_stage() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:1986-1997, 2382-2415;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/stage3.py:2628-2644

    ZeRO-Offload runs in the ZeRO-1/2 optimizer: ZeRO-0 has none, ZeRO-3's is not priced."""
    model = load("llama3-8b")
    for zero, said in ((0, "zero(0)"), (3, "ZeRO-3")):
        resolved = configure(model, 8, zero=zero, offload="zero-offload", precision="fp16")
        assert said in (refusal("zero-offload-stage", resolved, model) or "")
    for zero in (1, 2):
        resolved = configure(model, 8, zero=zero, offload="zero-offload")
        assert refusal("zero-offload-stage", resolved, model) is None
        assert ds.PROFILE.launches(resolved, model)


def test_zero_offload_pipeline() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/engine.py:862-880;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2970-2987, 3004-3031;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/zero/stage_1_and_2.py:356-364, 861-879,
    2518-2521

    bf16 ZeRO-1 under ZeRO-Offload fills its fp32 gradients in the engine's backward
    epilogue, which the pipeline engine skips but on its last stage: refused with a pipeline;
    without one, at ZeRO-2, or in fp16 (no separate fp32 accumulation) it launches."""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, pp=2, zero=1, offload="zero-offload")
    said = refusal("zero-offload-pipeline", resolved, model) or ""
    assert "all stages but the last" in said and "pp(2)" in said
    for kept in (configure(model, 16, tp=8, pp=1, zero=1, offload="zero-offload"),
                 configure(model, 16, tp=8, pp=1, zero=2, offload="zero-offload"),
                 configure(model, 16, tp=8, pp=2, zero=1, offload="zero-offload",
                           precision="fp16"),
                 configure(model, 16, tp=8, pp=2, zero=1)):  # fmt: skip
        assert refusal("zero-offload-pipeline", kept, model) is None


def test_zero_offload_copies_ride_with_the_pipeline_reduction() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:2390-2393;
    deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/pipe/schedule.py:238-241

    With a pipeline the gradients' copies to the host follow the reduction after the
    schedule, even with nothing to reduce (dp 1): overlapping them is refused."""
    model = load("gpt-1.7b")
    single = configure(model, 8, tp=2, pp=4, zero=1, global_batch=8, overlap_grad_reduce=True,
                       offload="zero-offload")  # fmt: skip
    assert "copies them to the host" in (
        refusal("grad-overlap-with-pipeline", single, model) or "")


def test_zero_offload_is_not_the_bf16_optimizer() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/engine.py:1994-1996

    bf16 ZeRO-1 with ZeRO-Offload is the ZeRO optimizer, which overlaps its reduction."""
    model = load("llama3-8b")
    resolved = configure(model, 64, tp=8, zero=1, overlap_grad_reduce=True,
                         offload="zero-offload")  # fmt: skip
    assert refusal("grad-overlap-bf16-optimizer", resolved, model) is None


def test_zero_offload_launch() -> None:
    """ZeRO-Offload's launch: ``--cpu-optimizer`` (Megatron-DeepSpeed's DeepSpeedCPUAdam,
    megatron/optimizer/__init__.py:83-90) and ``offload_optimizer`` to pinned CPU memory in
    the ds_config's zero_optimization; neither without offload."""
    model = load("llama3-70b")
    resolved = configure(model, 16, tp=8, zero=2, offload="zero-offload",
                         overlap_grad_reduce=True)  # fmt: skip
    assert ds.PROFILE.launches(resolved, model)
    flags, config = read(ds.launch(resolved, model).text)
    assert "--cpu-optimizer" in flags and flags["--cpu-optimizer"] is None
    zero = config["zero_optimization"]
    assert zero == {"stage": 2, "overlap_comm": True,
                    "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    plain = configure(model, 16, tp=8, zero=2, overlap_grad_reduce=True)
    flags, config = read(ds.launch(plain, model).text)
    assert "--cpu-optimizer" not in flags
    assert "offload_optimizer" not in config["zero_optimization"]


def test_bf16_gradients_are_reduced_in_bf16() -> None:
    """DeepSpeed all-reduces a bf16 run's fp32-accumulated gradients in bf16
    (``communication_data_type``'s default, ``deepspeed/runtime/engine.py``): half the bytes of
    Megatron's fp32 main grads, so the same all-reduce's bandwidth term halves."""
    from planner.cost import CommGroup, collective_time_s, data_parallel_sync
    from planner.spec.reading import load_cluster

    cluster = load_cluster(framework_cases.CLUSTERS / "dgx-a100-80gb.json", nodes=4)
    group = CommGroup(size=4, stride=8)
    syncs = {p: data_parallel_sync(cluster, group, params=1e9, precision=p, zero=0)
             for p in ("bf16", "bf16-deepspeed")}  # fmt: skip
    assert syncs["bf16"].reduce_once_s == collective_time_s(cluster, "all_reduce", 4e9, group)
    assert syncs["bf16-deepspeed"].reduce_once_s == collective_time_s(cluster, "all_reduce",
                                                                      2e9, group)


def test_moe_comm_overlap() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/moe/sharded_moe.py (MOELayer.forward)

    The MoE layer's two all-to-alls run in line with its experts: nothing to overlap them
    with another microbatch's compute."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, ep=4, zero=1, overlap_moe_expert_parallel_comm=True)
    assert "in line" in (refusal("moe-comm-overlap", resolved, model) or "")
    assert refusal("moe-comm-overlap", configure(model, 64, pp=4, ep=4, zero=1), model) is None


def test_deepep() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/moe/sharded_moe.py (_AllToAll)

    DeepSpeed's MoE layer exchanges tokens with its own all-to-all: DeepEP is refused."""
    model = load("mixtral-8x7b")
    deepep = configure(model, 64, pp=4, ep=4, zero=1, moe_dispatcher="deepep")
    assert "Megatron-LM and torchtitan" in (refusal("deepep", deepep, model) or "")
    assert refusal("deepep", configure(model, 64, pp=4, ep=4, zero=1), model) is None


def test_bf16_moments() -> None:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/bf16_optimizer.py (its optimizer over
    fp32 partitions)

    DeepSpeed's BF16_Optimizer steps its inner optimizer on fp32 partitions: fp32 moments."""
    model = load("gpt-1.7b")
    bf16 = configure(model, 16, zero=1, optimizer_moments="bf16")
    assert "precision-aware optimizer" in (refusal("bf16-moments", bf16, model) or "")
    assert refusal("bf16-moments", configure(model, 16, zero=1), model) is None


def test_rope_note_says_when_a_plan_trains_past_the_original_context() -> None:
    """Megatron-DeepSpeed applies no RoPE scaling (``megatron/model/language_model.py:437``):
    Llama 3.1's llama3 x8 rescales the frequencies at every position, so the note says the
    checkpoint's positions are not what the launch computes (it said "training within the
    original context is unaffected"), and past the 8,192 positions it stretches from, that
    too; dynamic scaling is unaffected within them."""
    from planner.frameworks._deepspeed_flags import rope_notes
    from planner.spec import RopeScaling

    model = load("Meta-Llama-3.1-8B")
    (within,) = rope_notes(model, 8192)
    (beyond,) = rope_notes(model, 131072)
    assert "its rotary frequencies are not the checkpoint's at any length" in within
    assert "unaffected" not in within and "131072" not in within
    assert "at 131072-token sequences, beyond the 8192 it stretches from" in beyond
    dynamic = model.model_copy(update={"rope_scaling": RopeScaling(
        rope_type="dynamic", factor=2.0, original_max_position_embeddings=8192)})
    assert rope_notes(dynamic, 8192)[0].endswith("changes nothing within the original context)")
