"""MindSpeed as a framework target: its rules (Megatron-LM's as core_v0.12.1 states them, and its
own) and the launch text read back as Megatron-LM under MindSpeed would.

The reading is :mod:`tests.test_framework_megatron`'s, in MindSpeed's words: core_v0.12.1's
NullTokenizer adds an end-of-document token to ``--vocab-size``, ZeRO-2/3 are
``--use-custom-fsdp``, fused attention is ``--use-flash-attn`` on Megatron's local layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import planner
from planner.frameworks import megatron, mindspeed
from tests import test_framework_megatron as tm
from tests.test_framework_megatron import (
    CASE_PARAMS,
    MODEL_PARAMS,
    accepted,
    configure,
    load,
    priced,
    read_back,
    read_flags,
    refused,
    round_trip,
)

P = mindspeed.PROFILE


@pytest.mark.parametrize(("path", "label"), CASE_PARAMS)
def test_launch_reads_back_as_priced(path: Path, label: str) -> None:
    """Every bundled model: degrees, split, schedule, batch, recompute, ZeRO, overlaps and the
    model's shape come back exactly from MindSpeed's flags."""
    round_trip(P, "mindspeed", path, label)


@pytest.mark.parametrize("path", MODEL_PARAMS, ids=lambda p: p.stem)
def test_uneven_split_with_interleaving_reads_back(path: Path) -> None:
    """Megatron-Core's first/last-stage flags and virtual stages per rank, which MindSpeed core
    passes through (not MindSpeed-LLM's --num-layer-list, which refuses interleaving)."""
    model = planner.load_model(path)
    resolved = tm.uneven(model)
    assert P.refusals(resolved, model) == ()
    text = mindspeed.launch(resolved, model).text
    assert "--num-layer-list" not in read_flags(text)
    assert read_back(text, world=16, flavor="mindspeed") == priced(resolved, model)


def test_flags_that_differ_from_megatron() -> None:
    """Llama-3 8B, TP2 CP2 with ring attention: MindSpeed's algorithm flag and send/receive
    overlap, the NPU's fused attention on local layers and its fused RoPE, the vocabulary one
    less (NullTokenizer adds its end-of-document token), and nothing else differs."""
    model = load("llama3-8b")
    resolved = configure(model, 16, tp=2, cp=2, sp=True, zero=1)
    ours = read_flags(mindspeed.launch(resolved, model).text)
    theirs = read_flags(megatron.launch(resolved, model).text)
    assert {k: v for k, v in ours.items() if theirs.get(k, "absent") != v} == {
        "--context-parallel-algo": "megatron_cp_algo", "--use-cp-send-recv-overlap": None,
        "--vocab-size": "128255", "--transformer-impl": "local", "--use-flash-attn": None,
        "--use-fused-rotary-pos-emb": None,
    }  # fmt: skip
    assert set(theirs) - set(ours) == {"--attention-backend"}
    assert mindspeed.launch(resolved, model).environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_ulysses_is_ulysses_cp_algo() -> None:
    """Llama-3 8B, TP2 CP2 with Ulysses all-to-alls: ``--context-parallel-algo
    ulysses_cp_algo``, which MindSpeed's Ulysses feature adds to the choices
    (``ulysses_context_parallel.py:15-19``), without the ring's send/receive overlap."""
    model = load("llama3-8b")
    resolved = configure(model, 16, tp=2, cp=2, cp_algo="ulysses", sp=True, zero=1)
    flags = read_flags(mindspeed.launch(resolved, model).text)
    assert flags["--context-parallel-algo"] == "ulysses_cp_algo"
    assert "--use-cp-send-recv-overlap" not in flags and "--use-flash-attn" in flags
    assert "--cp-comm-type" not in flags  # Transformer Engine's, which local layers never run
    assert read_back(mindspeed.launch(resolved, model).text, world=16,
                     flavor="mindspeed") == priced(resolved, model)


def test_zero3_is_custom_fsdp() -> None:
    """ZeRO-3 on core_v0.12.1: --use-custom-fsdp with optim_grads_params, the distributed
    optimizer, gradient accumulation fusion off; no CUDA_DEVICE_MAX_CONNECTIONS=1."""
    model = load("llama3-8b")
    resolved = configure(model, 16, tp=2, sp=True, zero=3, overlap_grad_reduce=True,
                         overlap_param_gather=True)  # fmt: skip
    launch = mindspeed.launch(resolved, model)
    flags = read_flags(launch.text)
    assert [flags.get(k, "absent") for k in ("--use-custom-fsdp",
            "--data-parallel-sharding-strategy", "--use-distributed-optimizer",
            "--no-gradient-accumulation-fusion", "--use-megatron-fsdp", "--ckpt-format")] == [
        None, "optim_grads_params", None, None, "absent", "absent"]  # fmt: skip
    assert launch.environment == {}
    # MindSpeed's own caution, said with the launch (Ascend/MindSpeed@028de58ca629
    # docs/zh/features/custom_fsdp.md)
    assert any("advises against combining it" in note for note in launch.notes)


def test_unfused_attention_without_context_parallelism() -> None:
    """flash_attention off: local layers without --use-flash-attn."""
    model = load("gpt-1.7b")
    flags = read_flags(mindspeed.launch(configure(model, 16, flash_attention=False), model).text)
    assert flags["--transformer-impl"] == "local" and "--use-flash-attn" not in flags


def test_notes_say_how_to_run() -> None:
    """The adaptor import, the data, and the version."""
    model = load("gpt-1.7b")
    notes = " ".join(mindspeed.launch(configure(model, 16), model).notes)
    assert "import mindspeed.megatron_adaptor" in notes and "core_v0.12.1" in notes
    assert "--data-path" in notes


def test_mla_yarn_original_context_note() -> None:
    """core_v0.12.1's MLA builds YaRN over --max-position-embeddings
    (``multi_latent_attention.py:94-98``): DeepSeek-V3's 163840 rather than its 4096."""
    model = load("DeepSeek-V3")
    notes = mindspeed.launch(configure(model, 64, tp=2, sp=True, ep=8, zero=1), model).notes
    (note,) = [n for n in notes if "YaRN" in n]
    assert "--max-position-embeddings (163840), not the model's 4096" in note
    assert not any("YaRN" in n for n in megatron.launch(
        configure(model, 64, tp=2, sp=True, ep=8, zero=1), model).notes)


# --- rules: one test each, citing the rule's source ----------------------------------------------


def test_every_rule_is_pinned_and_cited() -> None:
    """One test per rule below, each citing the source the rule cites."""
    tm.rule_tests(sys.modules[__name__], P)


def test_rule_gpipe() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/pipeline_parallel/schedules.py:106-113"""
    tm.pin_gpipe(P)


def test_rule_zero_bubble() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/pipeline_parallel/schedules.py:106-113"""
    tm.pin_zero_bubble(P)


def test_rule_zero_2_3_with_pipeline() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) docs/source/api-guide/custom_fsdp.md:19;
    Ascend/MindSpeed@028de58ca629 docs/zh/features/custom_fsdp.md:38"""
    tm.pin_zero_2_3_with_pipeline(P)


def test_rule_zero_2_3_grad_overlap() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py:146-147"""
    tm.pin_zero_2_3_grad_overlap(P)


def test_rule_zero_3_param_overlap() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py:144-145"""
    tm.pin_zero_3_param_overlap(P)


def test_rule_param_gather_without_sharding() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:502-504"""
    tm.pin_param_gather_without_sharding(P)


def test_rule_param_gather_without_grad_overlap() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:505-506"""
    tm.pin_param_gather_without_grad_overlap(P)


def test_rule_tp_comm_overlap() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/initialize.py:236-243;
    Ascend/MindSpeed@028de58ca629 mindspeed/arguments.py:695-696"""
    model = load("gpt-1.7b")
    refused(P, "tp-comm-overlap", configure(model, 16, tp=4, sp=True, tp_comm_overlap=True),
            model, r"tp_comm_overlap with tp\(4\).*userbuffers, absent on Ascend")  # fmt: skip
    accepted(P, "tp-comm-overlap", configure(model, 16, tp_comm_overlap=True), model)


def test_rule_sp_sequence_split() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/tensor_parallel/mappings.py:66-69"""
    tm.pin_sp_sequence_split(P)


def test_rule_cp_sequence() -> None:
    """Ascend/MindSpeed@028de58ca629
    mindspeed/features_manager/context_parallel/context_parallel_feature.py:39-41;
    NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:683-686"""
    tm.pin_cp_sequence(P)


def test_rule_vpp_without_pipeline() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:432-435"""
    tm.pin_vpp_without_pipeline(P)


def test_rule_vpp_microbatches() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/pipeline_parallel/schedules.py:789-795;
    megatron/core/model_parallel_config.py:389-390"""
    tm.pin_vpp_microbatches(P)


def test_rule_moe_comm_overlap() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/moe/moe_layer.py:129-149

    core_v0.12.1's MoE layer dispatches, computes and combines in line: no combined 1F1B."""
    model = load("mixtral-8x7b")
    resolved = configure(model, 64, pp=4, vpp=2, ep=8, zero=1,
                         overlap_moe_expert_parallel_comm=True)  # fmt: skip
    refused(P, "moe-comm-overlap", resolved, model, r"run in line")


def test_rule_recompute_modules() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/transformer_config.py:726-745

    Megatron-Core's checks, and its allowed modules, which have no shared_experts yet."""
    tm.pin_recompute_modules(P)
    model = load("mixtral-8x7b")
    refused(P, "recompute-modules", configure(model, 16, ep=8, recompute="selective",
                                              recompute_modules="moe,shared_experts"),
            model, r"shared_experts: .*core_v0.12.1\) has core_attn")  # fmt: skip


def test_rule_vpp_chunks() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/transformer_config.py:790-841;
    megatron/core/transformer/transformer_block.py:136-139, 152-158"""
    tm.pin_vpp_chunks(P)


def test_rule_expert_parallel() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:849-853"""
    tm.pin_expert_parallel(P)


def test_rule_moe_tp_without_sp() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/moe/moe_layer.py:130-137"""
    tm.pin_moe_tp_without_sp(P)


def test_rule_moe_bias() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/transformer_config.py:945-946"""
    biased = load("mixtral-8x7b").model_copy(update={"bias": True})
    refused(P, "moe-bias", configure(biased, 16, ep=2), biased, "builds no biased experts")
    dense = load("gpt-1.7b")
    accepted(P, "moe-bias", configure(dense, 16), dense)


def test_rule_bias_without_qkv_bias() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:787-789"""
    tm.pin_bias_without_qkv_bias(P)


def test_rule_pytorch_context_parallel() -> None:
    """Ascend/MindSpeed@028de58ca629
    mindspeed/features_manager/context_parallel/context_parallel_feature.py:106"""
    tm.pin_pytorch_context_parallel(P)


def test_rule_layer_architecture() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/transformer_layer.py:205-213;
    NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:1299;
    NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:1311"""
    tm.pin_layer_architecture(P, window=False)


def test_rule_multi_token_prediction() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:961-967:
    core_v0.12.1 asserts multi-token prediction without context parallelism, on rotary or no
    position embeddings (Megatron-LM's later ``validate_args`` takes both)."""
    qwen3 = load("Qwen3-8B").model_copy(update={"mtp_layers": 1})
    refused(P, "multi-token-prediction", configure(qwen3, 16, cp=2), qwen3,
            r"mtp_layers 1 with cp\(2\).*without context parallelism")
    accepted(P, "multi-token-prediction", configure(qwen3, 16), qwen3)
    gpt = load("gpt-1.7b").model_copy(update={"mtp_layers": 1})
    refused(P, "multi-token-prediction", configure(gpt, 16), gpt,
            "learned position embeddings: .* with rope or none")
    plain = load("Qwen3-8B")
    accepted(P, "multi-token-prediction", configure(plain, 16, cp=2), plain)
    assert not any("multi-token" in r for r in megatron.PROFILE.refusals(
        configure(qwen3, 16, cp=2), qwen3))  # Megatron-LM at d98e8a64ddf3 takes it


def test_rule_rank_order() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/initialize.py:354"""
    tm.pin_rank_order(P)


def test_rule_unfused_attention_with_cp() -> None:
    """Ascend/MindSpeed@028de58ca629
    mindspeed/features_manager/context_parallel/context_parallel_feature.py:51;
    Ascend/MindSpeed@028de58ca629
    mindspeed/features_manager/context_parallel/ulysses_context_parallel.py:34;
    Ascend/MindSpeed@028de58ca629 docs/zh/features/ring-attention-context-parallel.md:43"""
    model = load("llama3-8b")
    refused(P, "unfused-attention-with-cp",
            configure(model, 16, tp=2, cp=2, sp=True, flash_attention=False), model,
            r"cp=2\): MindSpeed's ring attention switches fused attention on")  # fmt: skip
    refused(P, "unfused-attention-with-cp",
            configure(model, 16, tp=2, cp=2, cp_algo="ulysses", sp=True, flash_attention=False),
            model, r"MindSpeed's Ulysses context parallelism switches fused attention on")
    accepted(P, "unfused-attention-with-cp", configure(model, 16, flash_attention=False), model)


def test_profile_names_mindspeed() -> None:
    """The profile is MindSpeed's; fp32 with fused attention is not refused on Ascend as it is
    by Transformer Engine, and MindSpeed refuses every TP overlap Megatron-LM would run."""
    assert (P.name, P.title, P.launch) == ("mindspeed", "MindSpeed", mindspeed.launch)
    names = {r.name for r in P.rules}
    assert "fused-attention-precision" not in names and "tp-comm-overlap-without-sp" not in names


def test_some_layers_recomputed_are_the_block_method() -> None:
    """MindSpeed runs Megatron-Core's block method as core_v0.12.1 has it: each chunk (one
    ``TransformerBlock``, ``num_layers_per_pipeline_rank = len(self.layers)``) checkpoints its
    first ``--recompute-num-layers`` layers (NVIDIA/Megatron-LM@core_v0.12.1
    megatron/core/transformer/transformer_block.py:268; :384-400)."""
    model = load("llama3-70b")
    resolved = configure(model, 64, tp=8, pp=4, vpp=2, sp=True, zero=1, recompute="full",
                         recompute_layers=3)  # fmt: skip
    assert P.refusals(resolved, model) == ()
    text = P.launch(resolved, model).text
    flags = read_flags(text)
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == ("block", "3")
    assert read_back(text, world=resolved.num_devices, flavor="mindspeed") == priced(resolved,
                                                                                    model)


def test_rule_optimizer_offload_zero_0() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1) megatron/training/arguments.py:944-949;
    NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/optimizer/distrib_optimizer.py:347-348"""
    tm.pin_optimizer_offload_zero_0(P)


def test_rule_optimizer_offload_fsdp() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/optimizer/distrib_optimizer.py:493-494"""
    tm.pin_optimizer_offload_fsdp(P)


def test_rule_zero_offload() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py:150-175"""
    tm.pin_zero_offload(P)


def test_module_slots_launch_with_mindspeeds_layout() -> None:
    """Ascend/MindSpeed@028de58ca629
    mindspeed/features_manager/pipeline_parallel/pipeline_model_parallel_layout_feature.py;
    mindspeed/core/pipeline_parallel/pipeline_model_parallel_layout/layout.py:94-140

    An interleaved split whose loss's end also takes the multi-token-prediction module's slot
    (DeepSeek-V3's recipe) launches with ``--pipeline-model-parallel-layout``, which MindSpeed
    brings to core_v0.12.1 (it was refused as core_v0.12.1's arguments lack it), as
    Megatron-LM writes it, without the virtual stages' count the layout implies."""
    model = load("deepseek-v3")
    knobs = dict(tp=2, pp=8, ep=32, etp=1, sp=True, zero=1, recompute="full",
                 global_batch=8192, seq_len=4096)  # fmt: skip
    slotted = configure(model, 1024, vpp=4, first_stage_layers=7, last_stage_layers=6, **knobs)
    assert P.refusals(slotted, model) == ()
    flags = read_flags(P.launch(slotted, model).text)
    assert flags["--pipeline-model-parallel-layout"] == "Et|(tt|)*30mL"
    assert "--num-virtual-stages-per-pipeline-rank" not in flags
    assert flags["--mtp-num-layers"] == "1"


def test_rule_deepep() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/transformer/moe/fused_a2a.py; deepseek-ai/DeepEP README.md (SM80 and SM90
    GPUs: no Ascend kernels)

    MindSpeed trains on Ascend NPUs, for which DeepEP has no kernels."""
    model = load("mixtral-8x7b")
    deepep = configure(model, 64, ep=8, zero=1, moe_dispatcher="deepep")
    refused(P, "deepep", deepep, model, r"exchanged with all-to-alls here")
    accepted(P, "deepep", configure(model, 64, ep=8, zero=1), model)


def test_rule_bf16_moments() -> None:
    """NVIDIA/Megatron-LM@a845aa7e12b3 (core_v0.12.1)
    megatron/core/optimizer/optimizer_config.py:165-199 (Transformer Engine's FusedAdam, which
    has no Ascend build)

    core_v0.12.1's precision-aware optimizer needs Transformer Engine's FusedAdam."""
    model = load("gpt-1.7b")
    refused(P, "bf16-moments", configure(model, 16, zero=1, optimizer_moments="bf16"), model,
            r"keeps Adam's moments in fp32")
    accepted(P, "bf16-moments", configure(model, 16, zero=1), model)
