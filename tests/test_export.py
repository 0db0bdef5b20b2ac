"""Exports: each framework's text parsed back as the framework would, and checked against the plan.

Megatron-LM and MindSpeed flags are read as a shell reads them (line continuations joined, then
``shlex``); the DeepSpeed config with ``json``; the Colossal-AI snippet with ``ast``; torchtitan
with ``tomllib``. Every "change" an exporter can report has a plan that triggers it.
"""

from __future__ import annotations

import ast
import json
import shlex
import tomllib
from collections.abc import Callable

import pytest

import planner
from planner.config import ParallelConfig
from planner.errors import ConfigError, InputError
from planner.export import (
    FORMATS,
    export,
    to_colossalai,
    to_deepspeed,
    to_megatron,
    to_mindspeed,
    to_torchtitan,
)
from planner.export.torchtitan import model_parts
from planner.plan import Plan, RunFlags, ScheduleSpec, StageParallel
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform import uniform_plan
from tests.conftest import CLUSTERS, MODELS

# --- plans -------------------------------------------------------------------------------------

GPT3_MEGATRON = dict(tp=8, pp=16, sp=True, recompute="selective", zero=1)


@pytest.fixture(scope="module")
def gpt3() -> ModelSpec:
    return planner.load_model(MODELS / "gpt3-175b.json")


@pytest.fixture(scope="module")
def plan_for(gpt3: ModelSpec, a100: ClusterSpec) -> Callable[..., Plan]:
    """A uniform GPT-3 175B plan on the 1024 A100s: Megatron's published shape, varied."""

    def make(**changes: object) -> Plan:
        return uniform_plan(gpt3, a100, ParallelConfig(**(GPT3_MEGATRON | changes)))

    return make


@pytest.fixture(scope="module")
def base(plan_for: Callable[..., Plan]) -> Plan:
    """TP8 PP16 DP8, SP, selective recompute, distributed optimizer."""
    return plan_for()


@pytest.fixture(scope="module")
def mixtral() -> Plan:
    """Mixtral 8x7B on 8 DGX H100 nodes: TP2 PP4 DP8 EP4."""
    model = planner.load_model(MODELS / "mixtral-8x7b.json")
    cluster = planner.load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=8)
    return uniform_plan(model, cluster, ParallelConfig(tp=2, pp=4, ep=4, sp=True, zero=1))


@pytest.fixture(scope="module")
def llama_cp(h100: ClusterSpec) -> Plan:
    """Llama-3 70B at 32k tokens: TP8 PP4 CP4 DP8, full recompute."""
    model = planner.load_model(MODELS / "llama3-70b.json")
    config = ParallelConfig(tp=8, pp=4, cp=4, sp=True, zero=1, recompute="full", seq_len=32768)
    return uniform_plan(model, h100, config)


def with_split(plan: Plan, counts: list[int]) -> Plan:
    """The plan with its decoder layers split ``counts`` over the stages."""
    assert sum(counts) == plan.num_layers and len(counts) == len(plan.stages)
    stages, first = [], 1
    for stage, n in zip(plan.stages, counts, strict=True):
        stages.append(stage.model_copy(update={"layers": (first, first + n - 1)}))
        first += n
    return plan.model_copy(update={"stages": tuple(stages)})


def with_parallel(plan: Plan, indices: set[int], parallel: StageParallel) -> Plan:
    """The plan with the stages at ``indices`` sharded as ``parallel``."""
    stages = tuple(s.model_copy(update={"parallel": parallel}) if s.index in indices else s
                   for s in plan.stages)  # fmt: skip
    return plan.model_copy(update={"stages": stages})


def with_flags(plan: Plan, **flags: bool) -> Plan:
    return plan.model_copy(update={"flags": plan.flags.model_copy(update=flags)})


# --- parsers: the text read back as each framework reads it -------------------------------------


def megatron_flags(text: str) -> dict[str, str | None]:
    """Flags -> value (None for a switch), after checking the one-flag-per-line layout."""
    lines = text.rstrip("\n").split("\n")
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert all(line.startswith("--") for line in lines)
    words = shlex.split(text.replace("\\\n", " "))  # the shell's line continuation
    flags: dict[str, str | None] = {}
    for word in words:
        if word.startswith("--"):
            assert word not in flags, f"{word} given twice"
            flags[word] = None
            last = word
        else:
            assert flags[last] is None, f"{last} has two values"
            flags[last] = word
    return flags


def colossal_call(text: str) -> tuple[str, dict[str, object]]:
    """The plugin class and its keyword arguments, as Python would evaluate the snippet."""
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert len(calls) == 1 and isinstance(calls[0].func, ast.Name)
    imported = [a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names]
    assert imported == [calls[0].func.id]
    return calls[0].func.id, {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}


def change_matching(changes: tuple[str, ...], *words: str) -> str:
    """The one change that mentions every word."""
    found = [c for c in changes if all(w in c for w in words)]
    assert len(found) == 1, (words, changes)
    return found[0]


# --- Megatron-LM ---------------------------------------------------------------------------------


def test_megatron_gpt3_flags_are_the_plan(base: Plan) -> None:
    """Published GPT-3 shape: every degree, batch and switch, and nothing to change."""
    exp = to_megatron(base)
    assert exp.format == "megatron" and exp.changes == () and exp.changed_step_time_s is None
    assert megatron_flags(exp.text) == {
        "--tensor-model-parallel-size": "8",
        "--pipeline-model-parallel-size": "16",
        "--sequence-parallel": None,
        "--micro-batch-size": str(base.micro_batch_size),
        "--global-batch-size": "1536",
        "--seq-length": "2048",
        "--bf16": None,
        "--recompute-granularity": "selective",
        "--use-distributed-optimizer": None,
    }


def test_megatron_batch_arithmetic(base: Plan) -> None:
    """global = micro x microbatches x data-parallel size, as Megatron derives it."""
    flags = megatron_flags(to_megatron(base).text)
    world = base.cluster.num_nodes * base.cluster.devices_per_node
    dp = world // (int(flags["--tensor-model-parallel-size"] or 0)
                   * int(flags["--pipeline-model-parallel-size"] or 0))  # fmt: skip
    assert dp == base.data_parallel_replicas == 8
    assert int(flags["--global-batch-size"] or 0) == (
        int(flags["--micro-batch-size"] or 0) * base.num_microbatches * dp
    )


def test_megatron_interleaved(plan_for: Callable[..., Plan]) -> None:
    """vpp 2 over 6-layer stages: 3 layers per virtual stage."""
    flags = megatron_flags(to_megatron(plan_for(vpp=2)).text)
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "3"
    assert "--num-virtual-stages-per-pipeline-rank" not in flags


def test_megatron_full_recompute(plan_for: Callable[..., Plan]) -> None:
    """Full recompute of every layer: uniform method, one layer per unit."""
    flags = megatron_flags(to_megatron(plan_for(recompute="full")).text)
    assert flags["--recompute-granularity"] == "full"
    assert flags["--recompute-method"] == "uniform"
    assert flags["--recompute-num-layers"] == "1"


def test_megatron_zero3_becomes_distributed_optimizer(plan_for: Callable[..., Plan]) -> None:
    """ZeRO-3 is exported as the distributed optimizer, priced as ZeRO-1."""
    seen: list[ParallelConfig] = []

    def price(config: ParallelConfig) -> float:
        seen.append(config)
        return 42.0

    exp = to_megatron(plan_for(zero=3), price=price)
    assert "--use-distributed-optimizer" in megatron_flags(exp.text)
    assert "ZeRO-3" in change_matching(exp.changes, "distributed optimizer")
    assert exp.changed_step_time_s == 42.0 and [c.zero for c in seen] == [1]
    assert seen[0].tp == 8 and seen[0].pp == 16 and seen[0].dp == 8


def test_megatron_moe_and_context_parallel(mixtral: Plan, llama_cp: Plan) -> None:
    """Expert and context parallel degrees appear only when > 1."""
    moe = megatron_flags(to_megatron(mixtral).text)
    assert moe["--expert-model-parallel-size"] == "4"
    assert moe["--tensor-model-parallel-size"] == "2" and "--context-parallel-size" not in moe
    cp = megatron_flags(to_megatron(llama_cp).text)
    assert cp["--context-parallel-size"] == "4" and cp["--seq-length"] == "32768"
    assert "--expert-model-parallel-size" not in cp


def test_megatron_uneven_first_and_last(base: Plan) -> None:
    """5 + 14 x 6 + 7 layers: the first and last stage flags, the middle implied."""
    plan = with_split(base, [5] + [6] * 14 + [7])
    exp = to_megatron(plan)
    flags = megatron_flags(exp.text)
    assert flags["--decoder-first-pipeline-num-layers"] == "5"
    assert flags["--decoder-last-pipeline-num-layers"] == "7"
    assert exp.changes == ()


def test_megatron_uneven_first_only(llama_cp: Plan) -> None:
    """Only the first stage differs from the rest: no last-stage flag."""
    flags = megatron_flags(to_megatron(with_split(llama_cp, [23, 19, 19, 19])).text)
    assert flags["--decoder-first-pipeline-num-layers"] == "23"
    assert "--decoder-last-pipeline-num-layers" not in flags


def test_megatron_unequal_middle_stages_are_evened(base: Plan) -> None:
    """Megatron cannot give middle stages different sizes: floor of their mean, rest to stage 0."""
    counts = [5, 7] + [6] * 13 + [6]  # middle: 7 then thirteen 6s = 85 layers on 14 stages
    exp = to_megatron(with_split(base, counts))
    flags = megatron_flags(exp.text)
    # 85 = 14 x 6 + 1: middles of 6, the first stage 5 + 1 = 6, the last 6: even after all.
    assert flags.get("--decoder-first-pipeline-num-layers") is None
    assert "same number of layers" in change_matching(exp.changes, "middle pipeline stage")


def test_megatron_uneven_interleaved(plan_for: Callable[..., Plan]) -> None:
    """Uneven + interleaved: virtual stages per rank with first/last; odd counts drop vpp."""
    plan = plan_for(vpp=2)
    flags = megatron_flags(to_megatron(with_split(plan, [4] + [6] * 14 + [8])).text)
    assert flags["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in flags
    assert flags["--decoder-first-pipeline-num-layers"] == "4"
    exp = to_megatron(with_split(plan, [5] + [6] * 14 + [7]))
    flags = megatron_flags(exp.text)
    assert "--num-virtual-stages-per-pipeline-rank" not in flags
    change_matching(exp.changes, "interleaving", "1F1B")


def test_megatron_overlap_flags(base: Plan) -> None:
    """Overlap switches follow the plan; Megatron's pairing rules are reported."""
    plan = with_flags(base, overlap_grad_reduce=True, overlap_param_gather=True,
                      tp_comm_overlap=True)  # fmt: skip
    flags = megatron_flags(to_megatron(plan).text)
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"} <= set(flags)
    exp = to_megatron(with_flags(base, overlap_param_gather=True))
    assert "--overlap-grad-reduce" in megatron_flags(exp.text)
    change_matching(exp.changes, "--overlap-grad-reduce")


def test_megatron_tp_overlap_needs_sequence_parallel(plan_for: Callable[..., Plan]) -> None:
    """Without SP, --tp-comm-overlap would fail Megatron's validation: dropped and reported."""
    plan = with_flags(plan_for(sp=False), tp_comm_overlap=True)
    exp = to_megatron(plan)
    assert "--tp-comm-overlap" not in megatron_flags(exp.text)
    change_matching(exp.changes, "--tp-comm-overlap")


def test_megatron_param_gather_needs_distributed_optimizer(plan_for: Callable[..., Plan]) -> None:
    """--overlap-param-gather without ZeRO is dropped and reported."""
    exp = to_megatron(with_flags(plan_for(zero=0), overlap_param_gather=True))
    assert "--overlap-param-gather" not in megatron_flags(exp.text)
    change_matching(exp.changes, "--overlap-param-gather")


def test_megatron_fp16_and_unfused_attention(base: Plan) -> None:
    """fp16 and unfused attention are flags too."""
    plan = with_flags(base.model_copy(update={"precision": "fp16"}), flash_attention=False)
    flags = megatron_flags(to_megatron(plan).text)
    assert "--fp16" in flags and "--bf16" not in flags
    assert flags["--attention-backend"] == "unfused"


def test_megatron_non_uniform_plan_exports_most_common_sharding(base: Plan) -> None:
    """Two stages at TP4 x DP2: exported as every stage's TP8 x DP1, and said so."""
    odd = base.stages[3].parallel.model_copy(update={"tp": 4, "dp": 2})
    plan = with_parallel(base, {3, 7}, odd)
    assert plan.uniform is None
    exp = to_megatron(plan, price=lambda c: float(c.tp))
    assert megatron_flags(exp.text)["--tensor-model-parallel-size"] == "8"
    change = change_matching(exp.changes, "stage 3", "stage 7")
    assert "14 of 16 stages" in change
    assert exp.changed_step_time_s == 8.0


# --- MindSpeed -----------------------------------------------------------------------------------


def test_mindspeed_flags_are_megatrons_plus_its_own(base: Plan, llama_cp: Plan) -> None:
    """Megatron's flags, fused attention switched on, ring attention spelled out."""
    flags = megatron_flags(to_mindspeed(base).text)
    assert {k: v for k, v in flags.items() if k != "--use-flash-attn"} == megatron_flags(
        to_megatron(base).text
    )
    assert "--use-flash-attn" in flags
    cp = megatron_flags(to_mindspeed(llama_cp).text)
    assert cp["--context-parallel-algo"] == "megatron_cp_algo"
    assert cp["--context-parallel-size"] == "4"


def test_mindspeed_uneven_split_is_a_layer_list(base: Plan) -> None:
    """Any split, middle stages included, as --num-layer-list."""
    counts = [5, 7] + [6] * 13 + [6]
    exp = to_mindspeed(with_split(base, counts))
    flags = megatron_flags(exp.text)
    assert [int(n) for n in (flags["--num-layer-list"] or "").split(",")] == counts
    assert not any(f.startswith("--decoder-") for f in flags) and exp.changes == ()


def test_mindspeed_layer_list_drops_interleaving(plan_for: Callable[..., Plan]) -> None:
    """MindSpeed refuses --num-layer-list with virtual stages: the split wins, and is priced."""
    plan = with_split(plan_for(vpp=2), [4] + [6] * 14 + [8])
    exp = to_mindspeed(plan, price=lambda c: float(c.vpp))
    flags = megatron_flags(exp.text)
    assert "--num-layer-list" in flags and "--num-layers-per-virtual-pipeline-stage" not in flags
    change_matching(exp.changes, "--num-layer-list", "virtual")
    assert exp.changed_step_time_s == 1.0


def test_mindspeed_drops_tp_comm_overlap(base: Plan) -> None:
    """MindSpeed switches --tp-comm-overlap off on Ascend: not exported, and said so."""
    exp = to_mindspeed(with_flags(base, tp_comm_overlap=True))
    assert "--tp-comm-overlap" not in megatron_flags(exp.text)
    change_matching(exp.changes, "--tp-comm-overlap")


# --- DeepSpeed -----------------------------------------------------------------------------------


def test_deepspeed_config_batch_arithmetic(base: Plan) -> None:
    """train_batch_size = micro x accumulation x data parallel = the global batch."""
    config = json.loads(to_deepspeed(base).text)
    dp = base.data_parallel_replicas * base.stages[0].parallel.dp
    assert config["train_batch_size"] == base.global_batch_size == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * dp
    )
    assert config["gradient_accumulation_steps"] == base.num_microbatches
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["zero_optimization"] == {"stage": 1, "overlap_comm": False}
    assert config["activation_checkpointing"]["partition_activations"] is False


def test_deepspeed_says_what_lives_in_the_launcher(base: Plan) -> None:
    """TP, PP, SP and recompute granularity are not ds_config keys."""
    change = change_matching(to_deepspeed(base).changes, "ds_config")
    assert "TP8" in change and "PP16" in change and "selective" in change


def test_deepspeed_zero3_with_pipeline_is_zero1(plan_for: Callable[..., Plan]) -> None:
    """DeepSpeed refuses ZeRO-2/3 with PP: exported as ZeRO-1 and priced so."""
    seen: list[int] = []
    exp = to_deepspeed(plan_for(zero=3),
                       price=lambda c: seen.append(c.zero) or 1.5)  # fmt: skip
    assert json.loads(exp.text)["zero_optimization"]["stage"] == 1
    change_matching(exp.changes, "ZeRO-3", "ZeRO-1")
    assert seen == [1] and exp.changed_step_time_s == 1.5


def test_deepspeed_zero3_without_pipeline_is_kept(gpt3: ModelSpec, a100: ClusterSpec) -> None:
    """Without PP, ZeRO-3 stays; no recompute block when the plan recomputes nothing."""
    plan = uniform_plan(gpt3, a100, ParallelConfig(tp=8, zero=3))
    config = json.loads(to_deepspeed(plan).text)
    assert config["zero_optimization"]["stage"] == 3 and "activation_checkpointing" not in config
    assert config["train_batch_size"] == plan.global_batch_size


def test_deepspeed_interleaving_is_dropped(plan_for: Callable[..., Plan]) -> None:
    """DeepSpeed's pipeline engine has one schedule."""
    exp = to_deepspeed(plan_for(vpp=2), price=lambda c: float(c.vpp))
    change_matching(exp.changes, "interleaved 1F1B (v=2)")
    assert exp.changed_step_time_s == 1.0


def test_deepspeed_moe_and_cp_are_launcher_settings(mixtral: Plan, llama_cp: Plan) -> None:
    """EP and CP are named among the settings outside ds_config."""
    assert "EP4" in change_matching(to_deepspeed(mixtral).changes, "ds_config")
    assert "CP4" in change_matching(to_deepspeed(llama_cp).changes, "ds_config")


# --- Colossal-AI ---------------------------------------------------------------------------------


def test_colossalai_gpt3_plugin(base: Plan) -> None:
    """Degrees, batch, schedule and Megatron-style SP as HybridParallelPlugin keywords."""
    plugin, kwargs = colossal_call(to_colossalai(base).text)
    assert plugin == "HybridParallelPlugin"
    assert kwargs == {
        "tp_size": 8, "pp_size": 16, "enable_sequence_parallelism": True,
        "sequence_parallelism_mode": "split_gather", "precision": "bf16", "zero_stage": 1,
        "microbatch_size": base.micro_batch_size, "num_microbatches": base.num_microbatches,
        "pp_style": "1f1b", "num_model_chunks": 1, "enable_flash_attention": True,
        "overlap_communication": False, "overlap_allgather": False,
    }  # fmt: skip


def test_colossalai_batch_arithmetic(base: Plan) -> None:
    """Microbatch x microbatches x (world / (tp x pp)) is the global batch."""
    _, kwargs = colossal_call(to_colossalai(base).text)
    tp, pp, mbs, n = (kwargs[k] for k in ("tp_size", "pp_size", "microbatch_size",
                                          "num_microbatches"))  # fmt: skip
    assert isinstance(tp, int) and isinstance(pp, int)
    assert isinstance(mbs, int) and isinstance(n, int)
    world = base.cluster.num_nodes * base.cluster.devices_per_node
    assert mbs * n * (world // (tp * pp)) == base.global_batch_size


def test_colossalai_selective_recompute_becomes_full(base: Plan) -> None:
    """Recompute is not a plugin keyword; the model's checkpointing is whole layers."""
    seen: list[str] = []
    exp = to_colossalai(base, price=lambda c: seen.append(c.recompute) or 3.0)
    change_matching(exp.changes, "selective", "full")
    assert seen == ["full"] and exp.changed_step_time_s == 3.0


def test_colossalai_zero3_with_pipeline(plan_for: Callable[..., Plan]) -> None:
    """zero_stage <= 1 with pp_size > 1 (and never 3): exported as 1."""
    exp = to_colossalai(plan_for(zero=3))
    assert colossal_call(exp.text)[1]["zero_stage"] == 1
    assert "zero_stage=1" in change_matching(exp.changes, "ZeRO-3")


def test_colossalai_zero3_without_pipeline(gpt3: ModelSpec, a100: ClusterSpec) -> None:
    """Without PP the plugin still stops at ZeRO-2; no pipeline keywords at pp_size=1."""
    plan = uniform_plan(gpt3, a100, ParallelConfig(tp=8, zero=3, sp=True))
    exp = to_colossalai(plan)
    _, kwargs = colossal_call(exp.text)
    assert kwargs["zero_stage"] == 2 and kwargs["pp_size"] == 1
    assert "num_microbatches" not in kwargs and "pp_style" not in kwargs
    change_matching(exp.changes, "ZeRO-3", "zero_stage=2")
    change_matching(exp.changes, "pp_size=1", "accumulate")


def test_colossalai_interleaved(plan_for: Callable[..., Plan]) -> None:
    """vpp 2: the interleaved style with two model chunks."""
    _, kwargs = colossal_call(to_colossalai(plan_for(vpp=2)).text)
    assert kwargs["pp_style"] == "interleaved" and kwargs["num_model_chunks"] == 2


def test_colossalai_uneven_split(base: Plan) -> None:
    """An uneven split is num_layers_per_stage, one count per stage."""
    counts = [5, 7] + [6] * 13 + [6]
    _, kwargs = colossal_call(to_colossalai(with_split(base, counts)).text)
    assert kwargs["num_layers_per_stage"] == counts


def test_colossalai_moe_plugin(mixtral: Plan) -> None:
    """EP: the MoE plugin with ep_size, which forbids overlap_communication."""
    exp = to_colossalai(with_flags(mixtral, overlap_grad_reduce=True))
    plugin, kwargs = colossal_call(exp.text)
    assert plugin == "MoeHybridParallelPlugin"
    assert (kwargs["ep_size"], kwargs["tp_size"], kwargs["pp_size"]) == (4, 2, 4)
    assert kwargs["overlap_communication"] is False
    change_matching(exp.changes, "overlap_communication")


def test_colossalai_moe_plugin_has_no_zero2() -> None:
    """Even without PP, the MoE plugin turns ZeRO-2 into ZeRO-1."""
    model = planner.load_model(MODELS / "mixtral-8x7b.json")
    cluster = planner.load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=8)
    plan = uniform_plan(model, cluster, ParallelConfig(tp=2, ep=4, sp=True, zero=2))
    exp = to_colossalai(plan)
    assert colossal_call(exp.text)[1]["zero_stage"] == 1
    change_matching(exp.changes, "MoeHybridParallelPlugin turns ZeRO-2")


def test_colossalai_context_parallel_is_ring_attention(llama_cp: Plan) -> None:
    """CP as ring attention over sp_size ranks; SP inside TP cannot run alongside it."""
    exp = to_colossalai(llama_cp)
    _, kwargs = colossal_call(exp.text)
    assert kwargs["sequence_parallelism_mode"] == "ring_attn" and kwargs["sp_size"] == 4
    change_matching(exp.changes, "split_gather")


# --- torchtitan ----------------------------------------------------------------------------------


def test_torchtitan_gpt3_tables(base: Plan) -> None:
    """The reference file's tables; the split written out as module names."""
    toml = tomllib.loads(to_torchtitan(base).text)
    assert set(toml) == {"training", "parallelism", "activation_checkpoint"}
    par = toml["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (8, 16)
    assert par["context_parallel_degree"] == 1 and "expert_parallel_degree" not in par
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert par["pipeline_parallel_microbatch_size"] == base.micro_batch_size
    parts = par["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [6] * 16
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_torchtitan_batch_arithmetic(base: Plan) -> None:
    """global = local x (replicate x shard); with PP the local batch is all microbatches."""
    toml = tomllib.loads(to_torchtitan(base).text)
    train, par = toml["training"], toml["parallelism"]
    batch_degree = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert train["global_batch_size"] == base.global_batch_size
    assert train["local_batch_size"] * batch_degree == base.global_batch_size  # no accumulation
    assert train["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == (
        base.num_microbatches
    )
    assert train["seq_len"] == 2048 and train["mixed_precision_param"] == "bfloat16"


def test_torchtitan_zero1_with_pipeline_shards(base: Plan) -> None:
    """No DDP next to TP/PP: FSDP2 over DP, which under PP behaves as ZeRO-1 (no change)."""
    exp = to_torchtitan(base)
    par = tomllib.loads(exp.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 8)
    assert par["fsdp_reshard_after_forward"] == "never"
    assert not any("FSDP2" in c for c in exp.changes)


def test_torchtitan_zero3_with_pipeline_runs_as_zero1(plan_for: Callable[..., Plan]) -> None:
    """Pipelining keeps FSDP's gradients and parameters whole: ZeRO-3 priced as ZeRO-1."""
    seen: list[int] = []
    exp = to_torchtitan(plan_for(zero=3), price=lambda c: seen.append(c.zero) or 2.0)
    change_matching(exp.changes, "ZeRO-3", "ZeRO-1")
    assert seen == [1] and exp.changed_step_time_s == 2.0


def test_torchtitan_zero3_without_pipeline(gpt3: ModelSpec, a100: ClusterSpec) -> None:
    """FSDP2 resharding after forward is ZeRO-3; gradient accumulation over local batches."""
    plan = uniform_plan(gpt3, a100, ParallelConfig(tp=8, zero=3, sp=True))
    exp = to_torchtitan(plan)
    toml = tomllib.loads(exp.text)
    par, train = toml["parallelism"], toml["training"]
    assert par["data_parallel_shard_degree"] == 128
    assert par["fsdp_reshard_after_forward"] == "always"
    assert "pipeline_parallel_schedule" not in par and "module_fqns_per_model_part" not in par
    assert train["local_batch_size"] == plan.micro_batch_size
    assert train["global_batch_size"] == plan.global_batch_size
    assert not any("ZeRO" in c for c in exp.changes)


def test_torchtitan_zero1_without_pipeline_is_zero2(gpt3: ModelSpec, a100: ClusterSpec) -> None:
    """TP with ZeRO-1 and no PP: FSDP2 keeps parameters for backward, i.e. ZeRO-2."""
    plan = uniform_plan(gpt3, a100, ParallelConfig(tp=8, zero=1, sp=True))
    seen: list[int] = []
    exp = to_torchtitan(plan, price=lambda c: seen.append(c.zero) or 1.0)
    assert tomllib.loads(exp.text)["parallelism"]["fsdp_reshard_after_forward"] == "never"
    change_matching(exp.changes, "ZeRO-1", "ZeRO-2")
    assert seen == [2]


def test_torchtitan_data_parallel_only_is_ddp(a100: ClusterSpec) -> None:
    """Only DP: replicate (DDP); ZeRO-1's sharded optimizer is lost, and said so."""
    model = planner.load_model(MODELS / "gpt-1.7b.json")
    cluster = a100.with_nodes(1)
    plan = uniform_plan(model, cluster, ParallelConfig(zero=1, global_batch=64))
    exp = to_torchtitan(plan)
    par = tomllib.loads(exp.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (8, 1)
    assert "fsdp_reshard_after_forward" not in par
    change_matching(exp.changes, "DDP", "ZeRO-1")
    change_matching(exp.changes, "all-reduces", "microbatches")


def test_torchtitan_interleaved(plan_for: Callable[..., Plan]) -> None:
    """vpp 2: 32 parts of 3 layers, part k on rank k % 16."""
    par = tomllib.loads(to_torchtitan(plan_for(vpp=2)).text)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 32 and all(len([m for m in p if "layers" in m]) == 3 for p in parts)
    assert parts[16][0] == "layers.48"  # rank 0's second chunk starts halfway


def test_torchtitan_uneven_split_and_gpipe(base: Plan) -> None:
    """The exact uneven split, and GPipe by torch's schedule name."""
    counts = [5, 7] + [6] * 13 + [6]
    plan = with_split(base, counts).model_copy(update={"schedule": ScheduleSpec(name="gpipe")})
    par = tomllib.loads(to_torchtitan(plan).text)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "GPipe"
    layers = [[m for m in p if m.startswith("layers.")] for p in par["module_fqns_per_model_part"]]
    assert [len(p) for p in layers] == counts
    assert [int(m.split(".")[1]) for p in layers for m in p] == list(range(96))


def test_torchtitan_moe_and_context_parallel(mixtral: Plan, llama_cp: Plan) -> None:
    """EP with experts tensor-parallel like Megatron's; CP as context_parallel_degree."""
    par = tomllib.loads(to_torchtitan(mixtral).text)["parallelism"]
    assert par["expert_parallel_degree"] == 4 and par["expert_tensor_parallel_degree"] == 2
    toml = tomllib.loads(to_torchtitan(llama_cp).text)
    assert toml["parallelism"]["context_parallel_degree"] == 4
    assert toml["training"]["seq_len"] == 32768
    assert toml["activation_checkpoint"] == {"mode": "full"}


def test_torchtitan_reports_what_it_cannot_say(plan_for: Callable[..., Plan]) -> None:
    """fp16, TP without SP, unfused attention and TP overlap each have a change."""
    plan = plan_for(sp=False).model_copy(update={"precision": "fp16"})
    plan = with_flags(plan, flash_attention=False, tp_comm_overlap=True)
    exp = to_torchtitan(plan)
    toml = tomllib.loads(exp.text)
    assert toml["training"]["mixed_precision_param"] == "bfloat16"
    assert toml["parallelism"]["enable_async_tensor_parallel"] is True
    for words in [("fp16",), ("sequence",), ("unfused",), ("[compile]",)]:
        change_matching(exp.changes, *words)


def test_model_parts_follow_the_looped_schedule() -> None:
    """Two ranks, two chunks each: rank 0 holds parts 0 and 2."""
    parts = model_parts((4, 2), 2)
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [2, 1, 2, 1]
    assert parts[2][0] == "layers.3"


def test_data_parallel_inside_stages_counts(base: Plan) -> None:
    """Four replicas of stages that are DP2 inside: every export's data-parallel size is 8."""
    stages = tuple(s.model_copy(update={"parallel": s.parallel.model_copy(update={"dp": 2})})
                   for s in base.stages)  # fmt: skip
    plan = base.model_copy(update={"stages": stages, "data_parallel_replicas": 4})
    assert json.loads(to_deepspeed(plan).text)["train_batch_size"] == plan.global_batch_size
    par = tomllib.loads(to_torchtitan(plan).text)["parallelism"]
    assert par["data_parallel_shard_degree"] == 8
    seen: list[int | None] = []
    to_colossalai(plan, price=lambda c: seen.append(c.dp) or 1.0)
    assert seen == [8]


# --- dispatch and pricing ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_dispatches_by_name(base: Plan, fmt: str) -> None:
    """export(plan, name) is the framework's own function."""
    exporters = {"megatron": to_megatron, "mindspeed": to_mindspeed, "deepspeed": to_deepspeed,
                 "colossalai": to_colossalai, "torchtitan": to_torchtitan}  # fmt: skip
    assert export(base, fmt) == exporters[fmt](base)
    assert export(base, fmt).format == fmt


def test_export_unknown_format_lists_the_formats(base: Plan) -> None:
    """A misspelt format is an InputError naming every format."""
    with pytest.raises(InputError, match="unknown export format 'megatron-lm'; formats: "
                       "megatron, mindspeed, deepspeed, colossalai, torchtitan"):  # fmt: skip
        export(base, "megatron-lm")


def test_price_is_not_called_when_nothing_changed(base: Plan) -> None:
    """An exact export has nothing to price."""

    def price(config: ParallelConfig) -> float:
        raise AssertionError("priced an unchanged plan")

    assert to_megatron(base, price=price).changed_step_time_s is None


def test_unpriceable_closest_plan_has_no_price(base: Plan) -> None:
    """A closest plan the cost model refuses (ConfigError) leaves the step time None."""

    def price(config: ParallelConfig) -> float:
        raise ConfigError("num_layers(96) is not divisible")

    exp = to_deepspeed(base, price=price)
    assert exp.changes and exp.changed_step_time_s is None


def test_closest_plan_prices_with_the_real_cost_model(
    plan_for: Callable[..., Plan], gpt3: ModelSpec, a100: ClusterSpec
) -> None:
    """DeepSpeed's ZeRO-1 for a ZeRO-3 plan is priced as estimate prices that configuration."""
    def price(config: ParallelConfig) -> float:
        return planner.estimate(gpt3, a100, config).step_time_s

    exp = to_deepspeed(plan_for(zero=3), price=price)
    expected = planner.estimate(gpt3, a100, ParallelConfig(**(GPT3_MEGATRON | {"zero": 1})))
    assert exp.changed_step_time_s == pytest.approx(expected.step_time_s)


def test_exports_are_frozen(base: Plan) -> None:
    """An Export is a value."""
    exp = to_megatron(base)
    with pytest.raises(AttributeError):
        exp.text = ""  # type: ignore[misc]


def test_flags_default_plan_has_flash_attention(base: Plan) -> None:
    """The GPT-3 plan was priced with fused attention, so no backend flag is needed."""
    assert base.flags == RunFlags(flash_attention=True)
    assert "--attention-backend" not in megatron_flags(to_megatron(base).text)
