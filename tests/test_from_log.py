"""``planner runs from-log``: a training log written by hand from a published run becomes a
record that ``validate`` prices exactly as it prices the published record."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from planner.diagnose.calibration import validate
from planner.diagnose.log_lines import megatron_arguments, titan_steps
from planner.diagnose.log_models import (
    TitanModel,
    check_megatron_model,
    check_titan_model,
    megatron_printed,
    titan_batch_fields,
    titan_parameter_count,
)
from planner.diagnose.logs import read_log
from planner.diagnose.run_records import model_from_record
from planner.diagnose.runs import load_runs
from planner.errors import InputError
from planner.frameworks import torchtitan
from planner.graph import ParameterCount, lower, parameter_count
from planner.spec import ModelSpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from tests.cli_process import cli
from tests.conftest import CALIBRATION_RUNS, CLUSTERS, FSDP_RUNS, HF, REPO, shared

MEGATRON_ID = "megatron_readme2021_gpt3_175b_1024gpu"
TITAN_ID = "mpt_A100_40GB_13b_s2048_g16_mb10"
ANSI_RED, ANSI_BLUE, ANSI_RESET = "\x1b[31m", "\x1b[34m", "\x1b[39m"


def _record(path: Path, run_id: str) -> dict[str, Any]:
    return next(r for r in json.loads(shared(path).read_text()) if r["id"] == run_id)


def _megatron_log(record: dict[str, Any], warmup_ms: float = 61234.5) -> str:
    """Megatron's arguments dump (arguments.py ``_print_args``: 48 - len(name) dots) and
    iteration lines (training.py ``training_log``) of the published run: 3 slow warm-up
    iterations, then 20 at the published step time."""
    m, p = record["model"], record["parallel"]
    args = {"tensor_model_parallel_size": p["tp"], "pipeline_model_parallel_size": p["pp"],
            "data_parallel_size": p["dp"], "micro_batch_size": p["microbatch"],
            "global_batch_size": p["global_batch"], "seq_length": m["seq_len"],
            "num_layers": m["layers"], "hidden_size": m["hidden"],
            "num_attention_heads": m["heads"], "recompute_granularity": "full",
            "fp16": True, "bf16": False, "use_flash_attn": False, "sequence_parallel": False,
            "virtual_pipeline_model_parallel_size": None}  # fmt: skip
    lines = ["------------------------ arguments ------------------------"]
    lines += sorted(f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items())
    lines.append("-------------------- end of arguments ---------------------")
    step_ms = record["measured"]["step_time_s"] * 1000.0
    for it in range(1, 24):
        ms = warmup_ms if it <= 3 else step_ms
        lines.append(
            f" [2026-01-01 00:00:{it:02d}.000000] iteration {it:8d}/{500:8d} |"
            f" consumed samples: {it * p['global_batch']:12d} |"
            f" elapsed time per iteration (ms): {ms:.1f} | learning rate: 6.000000E-05 |"
            f" global batch size: {p['global_batch']:5d} | lm loss: 7.1E+00 |")
    return "\n".join(lines) + "\n"


def _titan_log(record: dict[str, Any]) -> str:
    """torchtitan's metrics lines (metrics.py ``log``), coloured, at the published tokens/s
    per GPU as torchtitan rounds and prints it."""
    tps = record["measured"]["tokens_per_s"] / record["cluster"]["num_gpus"]
    lines = []
    for step in range(1, 24):
        shown = round(tps / 3) if step <= 3 else round(tps)
        lines.append(f"[rank0]:[titan] INFO - {ANSI_RED}step: {step:2}  \x1b[32mloss:  "
                     f"7.12345  \x1b[33mmemory: 30.12GiB(76.20%)  {ANSI_BLUE}tps: "
                     f"{shown:,}  \x1b[36mtflops: 160.00  \x1b[35mmfu: 51.28%{ANSI_RESET}")
    return "\n".join(lines) + "\n"


def _from_log(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return cli("runs", "from-log", *args, columns=None)


def _predicted(runs: Path, run_id: str) -> tuple[float, float]:
    row = next(r for r in validate([runs], CLUSTERS).rows if r.id == run_id)
    return row.predicted_s, row.measured_s


def test_megatron_log_prices_as_the_published_run(tmp_path: Path) -> None:
    record = _record(CALIBRATION_RUNS, MEGATRON_ID)
    log = tmp_path / "gpt3.log"
    log.write_text(_megatron_log(record))
    model = tmp_path / "model.json"
    model.write_text(model_from_record(record).model_dump_json())
    out = tmp_path / "mine.json"
    done = _from_log(log, "--model", model, "--cluster", CLUSTERS / "dgx-a100-80gb.json",
                     "--out", out)
    assert done.returncode == 0, done.stderr
    mine = json.loads(out.read_text())
    assert mine[0]["parallel"] | {"vpp": None} == {
        "tp": 8, "pp": 16, "dp": 8, "cp": 1, "ep": 1, "vpp": None, "sp": False,
        "microbatch": 1, "global_batch": 1536, "recompute": "full", "zero": 0}
    predicted, measured = _predicted(out, "gpt3")
    assert measured == 32.0  # the median of the 20 steady iterations, warm-up left out
    assert predicted == pytest.approx(_predicted(CALIBRATION_RUNS, MEGATRON_ID)[0], rel=1e-12)


def test_torchtitan_log_prices_as_the_published_run(tmp_path: Path) -> None:
    """A compiled torchtitan log of MPT-13B's FSDP run prices as the run's record does: both
    stacks run fused layers, and they differ only in what the log's stack (priced as
    Megatron-Core's) runs beside them: the embedding's gradient added into ``main_grad``
    (0.02 % of the step) and Megatron's eager vocab-parallel loss where Composer runs
    flash-attn's fused one (0.37 %)."""
    record = _record(FSDP_RUNS, TITAN_ID)
    log = tmp_path / "mpt13b.log"
    log.write_text(_titan_log(record))
    model = tmp_path / "model.json"
    model.write_text(model_from_record(record).model_dump_json())
    p = record["parallel"]
    out = tmp_path / "mine.json"
    done = _from_log(log, "--model", model, "--cluster", CLUSTERS / "dgx-a100-40gb.json",
                     "--nodes", 2, "--dp", p["dp"], "--mbs", p["microbatch"], "--global-batch",
                     p["global_batch"], "--seq-len", record["model"]["seq_len"],
                     "--recompute", "full", "--zero", 3, "--precision", "bf16", "--out", out)
    assert done.returncode == 0, done.stderr
    predicted, measured = _predicted(out, "mpt13b")
    published, published_measured = _predicted(FSDP_RUNS, TITAN_ID)
    assert predicted == pytest.approx(published, rel=5e-3)
    assert predicted > published
    tokens = p["global_batch"] * record["model"]["seq_len"]
    assert measured == pytest.approx(tokens / (round(31900 / 16) * 16), rel=1e-12)
    assert measured == pytest.approx(published_measured, rel=1e-3)  # tps printed rounded


def test_parsers_read_the_printed_formats() -> None:
    """The median after the warm-up; ANSI colours and thousands commas read through."""
    lines = [f"{ANSI_RED}step: {i:2}  {ANSI_BLUE}tps: {t:,}  mfu: 1.00%{ANSI_RESET}"
             for i, t in enumerate((100, 5000, 1200, 1000, 1100), 1)]
    assert [s.value for s in titan_steps(lines)] == [100, 5000, 1200, 1000, 1100]
    assert read_log("\n".join(lines), where="x", skip=2).tokens_per_s_per_gpu == 1100
    dump = ["-- arguments --", "  seq_length ....... 4096", "-- end of arguments --",
            "  num_layers ..... 9"]
    assert megatron_arguments(dump) == {"seq_length": "4096"}


def test_log_without_step_lines_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("loading checkpoint\nbuilding model\n")
    out = tmp_path / "out.json"
    done = _from_log(log, "--model", REPO / "instances/models/gpt3-175b.json", "--cluster",
                     CLUSTERS / "dgx-a100-80gb.json", "--out", out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(log) in done.stderr and "iteration lines" in done.stderr
    assert not out.exists()
    with pytest.raises(InputError, match="warm-up"):
        read_log(" iteration 1/ 9 | elapsed time per iteration (ms): 9.0 |", where="x")


def test_model_that_does_not_match_the_log_is_refused(tmp_path: Path) -> None:
    record = _record(CALIBRATION_RUNS, MEGATRON_ID)
    log = tmp_path / "gpt3.log"
    log.write_text(_megatron_log(record))
    done = _from_log(log, "--model", REPO / "instances/models/gpt-1.7b.json", "--cluster",
                     CLUSTERS / "dgx-a100-80gb.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(log) in done.stderr and "num_layers 96" in done.stderr
    assert done.stdout == ""


def test_option_that_contradicts_the_log_is_refused(tmp_path: Path) -> None:
    """The arguments dump says TP 8; ``--tp 4`` is an error, not a silent choice."""
    log = tmp_path / "gpt3.log"
    log.write_text(_megatron_log(_record(CALIBRATION_RUNS, MEGATRON_ID)))
    done = _from_log(log, "--model", REPO / "instances/models/gpt3-175b.json", "--cluster",
                     CLUSTERS / "dgx-a100-80gb.json", "--tp", 4)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tp 8" in done.stderr and "--tp 4" in done.stderr
    assert read_log(log.read_text(), where="x").global_batch == 1536  # the iteration lines'


# --- The models people train: Llama-class and MoE runs from Megatron-LM and torchtitan --------

LLAMA_LOG = REPO / "tests/data/llama3-8b-megatron.log"
MIXTRAL_LOG = REPO / "tests/data/mixtral-8x7b-megatron.log"
TITAN_LOG = REPO / "tests/data/llama3-8b-torchtitan.log"
H100 = CLUSTERS / "dgx-h100-80gb.json"


def _steady_ms(path: Path, skip: int = 3) -> float:
    """The median of the iteration times after the warm-up, read off the log by hand."""
    ms = [float(line.split("elapsed time per iteration (ms): ")[1].split(" ")[0])
          for line in path.read_text().splitlines() if "elapsed time per iteration" in line]
    return statistics.median(ms[skip:])


def _record_of(tmp_path: Path, *args: str | Path) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "mine.json"
    done = _from_log(*args, "--out", out)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())[0], out


def _count(model: ModelSpec) -> ParameterCount:
    return parameter_count(lower(model, TrainingSpec(seq_length=1, global_batch_size=1)))


def test_llama3_megatron_log_becomes_the_record_of_its_model(tmp_path: Path) -> None:
    """SwiGLU, RMSNorm, RoPE, GQA, untied: the record's model is the config's, checked against
    the arguments dump, and validate prices it as estimate prices that run."""
    config = shared(HF / "Meta-Llama-3-8B-Instruct.config.json")
    record, out = _record_of(tmp_path, LLAMA_LOG, "--model", config, "--cluster", H100,
                             "--nodes", 1)
    spec = ModelSpec.model_validate(record["model"]["spec"])
    assert spec == load_model(config).model_copy(update={"training": None})
    assert _count(spec).total == 8_030_261_248  # Llama 3 8B, as published
    assert record["parallel"] | {"vpp": None} == {
        "tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 1, "vpp": None, "sp": True, "microbatch": 1,
        "global_batch": 128, "recompute": "none", "zero": 1, "overlap_grad_reduce": True,
        "overlap_param_gather": True, "tp_comm_overlap": False}
    # --attention-backend auto runs Transformer Engine's fused kernel (use_flash_attn False).
    assert record["software"]["fused_attention"] is True
    run = load_runs(out, any_device=True)[0]
    assert run.model == spec and run.measured_step_time_s == _steady_ms(LLAMA_LOG) / 1000
    cluster = load_cluster(H100).with_nodes(1)
    predicted, _ = _predicted(out, "llama3-8b-megatron")
    assert predicted == pytest.approx(estimate(spec, cluster, run.config).step_time_s, rel=1e-12)
    assert run.config.tp == 2 and run.config.sp and run.config.flash_attention
    assert run.config.seq_len == 8192 and run.config.zero == 1
    # The dump's --overlap-grad-reduce --overlap-param-gather, without --tp-comm-overlap.
    assert (run.config.overlap_grad_reduce, run.config.overlap_param_gather,
            run.config.tp_comm_overlap) == (True, True, False)


def test_a_log_sizes_its_cluster_without_nodes(tmp_path: Path) -> None:
    """The log's ranks (TP2 x DP4) are the run's size: without --nodes the bundled 1,024-GPU
    file was refused ("8 != 1024 devices", README's own step left --nodes out); the record
    is the one --nodes 1 writes."""
    config = shared(HF / "Meta-Llama-3-8B-Instruct.config.json")
    record, _ = _record_of(tmp_path, LLAMA_LOG, "--model", config, "--cluster", H100)
    (tmp_path / "given").mkdir()
    given, _ = _record_of(tmp_path / "given", LLAMA_LOG, "--model", config, "--cluster", H100,
                          "--nodes", 1)  # fmt: skip
    assert record == given and record["cluster"]["num_gpus"] == 8


def test_mixtral_megatron_log_carries_its_experts(tmp_path: Path) -> None:
    config = shared(HF / "Mixtral-8x7B-v0.1.config.json")
    record, out = _record_of(tmp_path, MIXTRAL_LOG, "--model", config, "--cluster", H100,
                             "--nodes", 8)
    spec = ModelSpec.model_validate(record["model"]["spec"])
    assert spec == load_model(config).model_copy(update={"training": None})
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.top_k) == (8, 2)
    count = _count(spec)  # Mixtral 8x7B: 46.70B total, 12.88B active, as published
    assert (count.total, count.active) == (pytest.approx(46.70e9, rel=5e-4),
                                           pytest.approx(12.88e9, rel=5e-4))
    assert (record["parallel"]["tp"], record["parallel"]["pp"], record["parallel"]["ep"],
            record["parallel"]["dp"], record["parallel"]["recompute"]) == (2, 4, 8, 8,
                                                                           "selective")
    # The run folded its experts over the tensor-parallel ranks (expert_tensor_parallel_size
    # 1 in its arguments), and is priced so.
    assert record["parallel"]["etp"] == 1
    assert load_runs(out, any_device=True)[0].config.etp == 1
    predicted, measured = _predicted(out, "mixtral-8x7b-megatron")
    assert measured == _steady_ms(MIXTRAL_LOG) / 1000  # the slow step 17 does not move it
    assert 0 < predicted < measured * 2


def test_megatron_log_with_deepep(tmp_path: Path) -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:891-900

    The same run dispatching with DeepEP (``--moe-token-dispatcher-type flex``, backend
    deepep) is recorded and priced with it; another flex backend is refused in one line."""
    config = shared(HF / "Mixtral-8x7B-v0.1.config.json")
    text = MIXTRAL_LOG.read_text()
    flex = "  moe_token_dispatcher_type ....................... flex\n"
    deepep = tmp_path / "deepep.log"
    deepep.write_text(text.replace(
        "  moe_token_dispatcher_type ....................... alltoall\n",
        flex + "  moe_flex_dispatcher_backend ..................... deepep\n"))
    record, out = _record_of(tmp_path, deepep, "--model", config, "--cluster", H100,
                             "--nodes", 8)
    assert record["parallel"]["moe_dispatcher"] == "deepep"
    assert load_runs(out, any_device=True)[0].config.moe_dispatcher == "deepep"
    hybrid = tmp_path / "hybridep.log"
    hybrid.write_text(deepep.read_text().replace("backend ..................... deepep",
                                                 "backend ..................... hybridep"))
    done = _from_log(hybrid, "--model", config, "--cluster", H100, "--nodes", 8)
    assert done.returncode != 0 and "prices DeepEP only" in done.stderr


def test_megatron_log_with_bf16_moments(tmp_path: Path) -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/training/arguments.py:1082-1085

    A run with the precision-aware optimizer and both moments in bf16 (its dump prints the
    dtypes as torch names) is recorded with them; one moment in bf16 is refused."""
    config = shared(HF / "Mixtral-8x7B-v0.1.config.json")
    text = MIXTRAL_LOG.read_text()
    line = "  use_distributed_optimizer ....................... True\n"
    assert line in text
    moments = line + "".join(f"  {name} {'.' * (48 - len(name))} {value}\n" for name, value in (
        ("use_precision_aware_optimizer", "True"), ("exp_avg_dtype", "torch.bfloat16"),
        ("exp_avg_sq_dtype", "torch.bfloat16")))  # fmt: skip
    log = tmp_path / "moments.log"
    log.write_text(text.replace(line, moments))
    record, out = _record_of(tmp_path, log, "--model", config, "--cluster", H100, "--nodes", 8)
    assert record["parallel"]["optimizer_moments"] == "bf16"
    assert load_runs(out, any_device=True)[0].config.optimizer_moments == "bf16"
    mixed = tmp_path / "mixed.log"
    dots = "exp_avg_sq_dtype " + "." * 32
    mixed.write_text(log.read_text().replace(f"{dots} torch.bfloat16", f"{dots} torch.float32"))
    done = _from_log(mixed, "--model", config, "--cluster", H100, "--nodes", 8)
    assert done.returncode != 0 and "fp32 or both in bf16" in done.stderr


def _with_cp2(*arguments: str) -> str:
    """The Llama log's dump at CP2 (DP 4 to 2), with ``arguments`` lines added to it."""
    return LLAMA_LOG.read_text().replace(
        "  context_parallel_size ........................... 1",
        "  context_parallel_size ........................... 2").replace(
        "  data_parallel_size .............................. 4",
        "\n".join(("  data_parallel_size .............................. 2", *arguments)))


@pytest.mark.parametrize(("arguments", "refused", "message"), [
    # Megatron-LM's --cp-comm-type as printed (megatron/training/arguments.py:3221, a list):
    # ['a2a'] is Ulysses; Transformer Engine's all_gather is not priced
    (("  cp_comm_type .................................... ['a2a']",),
     ("['a2a']", "['all_gather']"),
     "cp_comm_type ['all_gather']: the planner prices Megatron's context parallelism as one "
     "of p2p, a2a"),
    # MindSpeed's own context_parallel_algo decides, beside Megatron's unread default ['p2p']
    (("  context_parallel_algo ........................... ulysses_cp_algo",
      "  cp_comm_type .................................... ['p2p']"),
     ("ulysses_cp_algo", "hybrid_cp_algo"),
     "context_parallel_algo hybrid_cp_algo: the planner prices MindSpeed's context "
     "parallelism as megatron_cp_algo or ulysses_cp_algo"),
], ids=["megatron", "mindspeed"])
def test_a_log_with_context_parallelism_says_how_it_attended(
    tmp_path: Path, arguments: tuple[str, ...], refused: tuple[str, str], message: str
) -> None:
    """A dump with ``context_parallel_size 2`` that ran Ulysses: the record says so and the
    run is priced so; a way the planner does not price is refused in one line."""
    config = shared(HF / "Meta-Llama-3-8B-Instruct.config.json")
    text = _with_cp2(*arguments)
    log = tmp_path / "cp.log"
    log.write_text(text)
    record, out = _record_of(tmp_path, log, "--model", config, "--cluster", H100, "--nodes", 1)
    assert (record["parallel"]["cp"], record["parallel"]["cp_algo"]) == (2, "ulysses")
    assert load_runs(out, any_device=True)[0].config.cp_algo == "ulysses"
    log.write_text(text.replace(*refused))
    done = _from_log(log, "--model", config, "--cluster", H100, "--nodes", 1)
    assert done.returncode == 2
    assert message in " ".join(done.stderr.split())


def test_megatron_log_refuses_a_model_of_another_architecture(tmp_path: Path) -> None:
    model = load_model(shared(HF / "Meta-Llama-3-8B-Instruct.config.json"))
    for change, said in (({"activation": "gelu"}, "swiglu True"),
                         ({"num_query_groups": 4}, "num_query_groups 8"),
                         ({"tie_word_embeddings": True},
                          "untie_embeddings_and_output_weights True")):  # fmt: skip
        path = tmp_path / "model.json"
        path.write_text(model.model_copy(update=change).model_dump_json())
        done = _from_log(LLAMA_LOG, "--model", path, "--cluster", H100, "--nodes", 1)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"the log ran {said}" in " ".join(done.stderr.split())


def test_megatron_dump_of_deepseek_v3_checks_mla_and_routing() -> None:
    """What the dump prints for DeepSeek-V3 (--multi-latent-attention, its ranks,
    --moe-layer-freq as a list) matches the HF config's model, and a rank that differs is
    refused."""
    model = load_model(shared(HF / "DeepSeek-V3.config.json"))
    printed = megatron_printed(model)
    assert (printed["multi_latent_attention"], printed["q_lora_rank"], printed["kv_lora_rank"],
            printed["qk_head_dim"], printed["qk_pos_emb_head_dim"], printed["v_head_dim"]) == (
        "True", "1536", "512", "128", "64", "128")
    assert printed["moe_layer_freq"] == str([0] * 3 + [1] * 58)
    assert printed["mtp_num_layers"] == "1"
    assert (printed["num_experts"], printed["moe_router_topk"], printed["moe_ffn_hidden_size"],
            printed["moe_shared_expert_intermediate_size"]) == ("256", "8", "2048", "2048")
    check_megatron_model(printed, model, where="x")
    with pytest.raises(InputError, match="the log ran kv_lora_rank 256"):
        check_megatron_model(printed | {"kv_lora_rank": "256"}, model, where="x")


def test_torchtitan_log_states_mesh_sequence_and_model(tmp_path: Path) -> None:
    config = shared(HF / "Meta-Llama-3.1-8B.config.json")
    record, out = _record_of(tmp_path, TITAN_LOG, "--model", config, "--cluster", H100,
                             "--nodes", 1, "--mbs", 1, "--global-batch", 8)
    spec = ModelSpec.model_validate(record["model"]["spec"])
    assert spec == load_model(config).model_copy(update={"training": None})
    assert record["model"]["seq_len"] == 8192  # max_seq_len, set from training.seq_len
    assert record["parallel"] | {"vpp": None} == {
        "tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vpp": None, "sp": False, "microbatch": 1,
        "global_batch": 8, "recompute": "full", "zero": 3}
    tps = statistics.median(s.value for s in titan_steps(TITAN_LOG.read_text().splitlines())[3:])
    predicted, measured = _predicted(out, "llama3-8b-torchtitan")
    assert measured == pytest.approx(8 * 8192 / (tps * 8), rel=1e-12)
    assert predicted > 0
    # A model whose parameter count is not the 8,030,261,248 torchtitan printed is refused.
    done = _from_log(TITAN_LOG, "--model", shared(HF / "Meta-Llama-3.1-70B.config.json"),
                     "--cluster", H100, "--nodes", 1, "--global-batch", 8)
    assert done.returncode == 2
    assert "torchtitan built llama3 8B with dim=4096" in " ".join(done.stderr.split())


def test_torchtitan_log_carries_the_memory_it_reserved(tmp_path: Path) -> None:
    """torchtitan's ``memory`` field is the allocator's peak reserved since the last line:
    the record measures the most of the kept lines (not the warm-up's, which compiles and
    allocates once), and ``validate`` compares the predicted reserved peak with it."""
    lines = TITAN_LOG.read_text().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if "tps:" in line]
    lines[steps[0]] = lines[steps[0]].replace("memory: 61.88GiB", "memory: 70.00GiB")
    lines[steps[5]] = lines[steps[5]].replace("memory: 61.88GiB", "memory: 63.10GiB")
    log = tmp_path / "titan.log"
    log.write_text("".join(lines))
    record, out = _record_of(tmp_path, log, "--cluster", H100, "--nodes", 1,
                             "--global-batch", 8)  # fmt: skip
    assert record["measured"]["peak_memory_reserved_gib"] == 63.1
    done = cli("validate", out, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    assert row["measured_reserved_memory_gib"] == 63.1 and row["reserved_error"] is not None


def test_torchtitan_log_with_context_parallelism_runs_pytorchs(tmp_path: Path) -> None:
    """A torchtitan log whose mesh has cp=2 ran PyTorch's context parallelism, K/V
    all-gathered (torchtitan's training never sets another rotate method): the record says
    ``cp_algo`` allgather and the run is priced so."""
    config = shared(HF / "Meta-Llama-3.1-8B.config.json")
    log = tmp_path / "cp.log"
    log.write_text(TITAN_LOG.read_text().replace("dp_shard=8, cp=1", "dp_shard=4, cp=2"))
    record, out = _record_of(tmp_path, log, "--model", config, "--cluster", H100, "--nodes", 1,
                             "--mbs", 1, "--global-batch", 8)  # fmt: skip
    assert (record["parallel"]["cp"], record["parallel"]["cp_algo"]) == (2, "allgather")
    run = load_runs(out)[0]
    assert (run.config.cp, run.config.cp_algo, run.config.dp) == (2, "allgather", 4)


def test_torchtitan_log_runs_its_eager_stack_unless_it_compiled(tmp_path: Path) -> None:
    """A torchtitan log prices its eager block (the framework's name says so: no stack
    written); one that says it compiled each block (``Compiling each TransformerBlock with
    torch.compile``, torchtitan/models/llama3/infra/parallelize.py:269) runs the compiled
    block, which the record says; without the loss's line (torchtitan/components/loss.py:34)
    the command says its loss is priced compiled all the same."""
    config = shared(HF / "Meta-Llama-3.1-8B.config.json")
    args = ("--model", config, "--cluster", H100, "--nodes", 1, "--mbs", 1, "--global-batch", 8)
    eager, out = _record_of(tmp_path, TITAN_LOG, *args)
    assert "stack" not in eager["software"]
    assert load_runs(out)[0].config.stack == "torchtitan-eager"
    compiled = tmp_path / "compiled.log"
    lines = TITAN_LOG.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "Applied full activation" in line)
    lines.insert(at + 1, "[rank0]:[titan] 2026-03-02 15:02:10,200 - root - INFO - Compiling "
                         "each TransformerBlock with torch.compile\n")
    compiled.write_text("".join(lines))
    blocks_alone = _from_log(compiled, *args, "--out", tmp_path / "blocks.json")
    assert "the log compiled its blocks alone, which no stack prices: the record prices both " \
           "compiled" in " ".join(blocks_alone.stderr.split())
    lines.insert(at + 2, "[rank0]:[titan] 2026-03-02 15:02:10,300 - root - INFO - Compiling "
                         "the loss function with torch.compile\n")
    compiled.write_text("".join(lines))
    done = _from_log(compiled, *args, "--out", tmp_path / "both.json")
    assert done.returncode == 0 and "compiled its" not in done.stderr
    record, _ = _record_of(tmp_path, compiled, *args)
    assert record["software"]["stack"] == "torchtitan-compiled"


def test_torchtitan_selective_checkpointing_needs_a_recompute_option(tmp_path: Path) -> None:
    log = tmp_path / "sac.log"
    log.write_text(TITAN_LOG.read_text().replace("Applied full activation",
                                                 "Applied selective activation"))
    config = shared(HF / "Meta-Llama-3.1-8B.config.json")
    done = _from_log(log, "--model", config, "--cluster", H100, "--nodes", 1,
                     "--global-batch", 8)
    assert done.returncode == 2 and ("pass --recompute selective --recompute-modules op for "
                                     "its per-operator policy") in " ".join(done.stderr.split())
    record, _ = _record_of(tmp_path, log, "--model", config, "--cluster", H100, "--nodes", 1,
                           "--global-batch", 8, "--recompute", "selective",
                           "--recompute-modules", "op")  # fmt: skip
    assert record["parallel"]["recompute"] == "selective"
    assert record["parallel"]["recompute_modules"] == "op"
    with pytest.raises(InputError, match="parameters"):
        check_titan_model(TitanModel(name="llama3", flavor="8B", args={},
                                     total_parameters=8_030_261_249),
                          load_model(config), where="x")


def test_torchtitan_count_leaves_out_a_tied_embedding_and_expert_biases() -> None:
    """torchtitan prints every parameter less a tied embedding (models/utils.py:428-429); a
    router's expert bias is a buffer (models/moe/moe.py:459-465)."""
    llama = load_model(shared(HF / "Meta-Llama-3.1-8B.config.json"))
    assert titan_parameter_count(llama) == 8_030_261_248
    tied = llama.model_copy(update={"tie_word_embeddings": True})
    assert titan_parameter_count(tied) == 8_030_261_248 - 2 * 128256 * 4096
    deepseek = load_model(shared(HF / "DeepSeek-V3.config.json"))
    main = deepseek.model_copy(update={"mtp_layers": 0})  # v0.2.2 builds no MTP module
    assert titan_parameter_count(deepseek) == _count(main).total - 256 * 58


def test_torchtitan_log_without_a_model_is_its_flavor(tmp_path: Path) -> None:
    """The flavor torchtitan built (llama3 8B) is the model; a Megatron log needs --model."""
    record, _ = _record_of(tmp_path, TITAN_LOG, "--cluster", H100, "--nodes", 1,
                           "--global-batch", 8)
    spec = ModelSpec.model_validate(record["model"]["spec"])
    assert spec == torchtitan.flavor(spec).spec and spec.name == "llama3 8B"
    assert titan_parameter_count(spec) == 8_030_261_248
    llama = load_model(shared(HF / "Meta-Llama-3.1-8B.config.json"))
    assert spec.model_dump(exclude={"name", "training"}) == llama.model_dump(
        exclude={"name", "training"})  # the HF config's Llama 3.1 8B, but for its name
    done = _from_log(LLAMA_LOG, "--cluster", H100, "--nodes", 1)
    assert done.returncode == 2 and "pass --model" in " ".join(done.stderr.split())


def test_an_fp8_megatron_log_is_priced_in_fp8(tmp_path: Path) -> None:
    """A Megatron-LM run with ``--fp8-format hybrid`` (delayed scaling, Megatron-Core's
    default recipe) is recorded on an FP8 stack (this log's loss fused:
    ``megatron-te-fp8-fused-loss``) and validated as estimate prices it in FP8; another recipe
    is refused in one line, the planner pricing delayed scaling only."""
    config = shared(HF / "Meta-Llama-3-8B-Instruct.config.json")
    text = LLAMA_LOG.read_text()
    fp8_line = next(line for line in text.splitlines() if line.strip().startswith("fp8 ."))
    log = tmp_path / "fp8.log"
    log.write_text(text.replace(fp8_line, fp8_line.replace("None", "hybrid")))
    record, out = _record_of(tmp_path, log, "--model", config, "--cluster", H100, "--nodes", 1)
    assert record["software"]["stack"] == "megatron-te-fp8-fused-loss"
    run = load_runs(out, any_device=True)[0]
    assert run.config.stack == "megatron-te-fp8-fused-loss"
    spec = ModelSpec.model_validate(record["model"]["spec"])
    predicted, _ = _predicted(out, "fp8")
    cluster = load_cluster(H100).with_nodes(1)
    assert predicted == pytest.approx(estimate(spec, cluster, run.config).step_time_s, rel=1e-12)
    assert predicted < estimate(spec, cluster, run.config.model_copy(
        update={"stack": "megatron-te-fused-loss"})).step_time_s  # fmt: skip
    tensorwise = fp8_line.replace("fp8 ", "fp8_recipe ").replace("None", "tensorwise")
    log.write_text(text.replace(fp8_line, f"{fp8_line.replace('None', 'hybrid')}\n{tensorwise}"))
    done = _from_log(log, "--model", config, "--cluster", H100, "--nodes", 1,
                     "--out", tmp_path / "refused.json")  # fmt: skip
    assert done.returncode == 2 and "fp8_recipe tensorwise" in done.stderr


def test_a_megatron_log_with_the_fused_loss_is_priced_with_it(tmp_path: Path) -> None:
    """``cross_entropy_loss_fusion True`` in Megatron's arguments (this log's, with the native
    implementation by default) puts the run on ``megatron-te-fused-loss``, priced faster than
    the eager loss (the same softmax kept, a clone of it held in the backward); ``False`` leaves
    it on ``megatron-te``; Transformer
    Engine's implementation, which the planner does not price, is priced as the native one
    and says so, and an implementation Megatron-Core does not have is refused."""
    config = shared(HF / "Meta-Llama-3-8B-Instruct.config.json")
    text = LLAMA_LOG.read_text()
    fused_line = next(line for line in text.splitlines()
                      if line.strip().startswith("cross_entropy_loss_fusion ."))  # fmt: skip
    eager_text = text.replace(fused_line, fused_line.replace("True", "False"))
    runs = {}
    for name, log_text in (("fused", text), ("eager", eager_text)):
        log = tmp_path / f"{name}.log"
        log.write_text(log_text)
        record, out = _record_of(tmp_path, log, "--model", config, "--cluster", H100,
                                 "--nodes", 1)  # fmt: skip
        runs[name] = load_runs(out, any_device=True)[0]
        assert record["software"].get("stack", "megatron-te") == runs[name].config.stack
    assert [runs[n].config.stack for n in runs] == ["megatron-te-fused-loss", "megatron-te"]
    spec = ModelSpec.model_validate(record["model"]["spec"])
    cluster = load_cluster(H100).with_nodes(1)
    fused, eager = (estimate(spec, cluster, runs[n].config) for n in ("fused", "eager"))
    assert fused.step_time_s < eager.step_time_s
    # the same kept softmax; the compiled backward's clone of it beside
    assert fused.memory.activations_gib == eager.memory.activations_gib
    assert fused.memory.loss_workspace_gib >= eager.memory.loss_workspace_gib
    impl = fused_line.replace("cross_entropy_loss_fusion", "cross_entropy_fusion_impl", 1)
    for value, out in (("te", tmp_path / "te.json"), ("triton", tmp_path / "refused.json")):
        log = tmp_path / f"{value}.log"
        log.write_text(text.replace(fused_line, f"{fused_line}\n{impl.replace('True', value)}"))
        done = _from_log(log, "--model", config, "--cluster", H100, "--nodes", 1, "--out", out)
        if value == "te":
            assert done.returncode == 0, done.stderr
            assert "Transformer Engine's fused cross entropy" in done.stderr
            assert load_runs(out, any_device=True)[0].config.stack == "megatron-te-fused-loss"
        else:
            assert done.returncode == 2 and "cross_entropy_fusion_impl triton" in done.stderr


# --- What a log says and how it says it: the QA findings ---------------------------------------

LLAMA_HF = HF / "Meta-Llama-3-8B-Instruct.config.json"
TITAN_HF = HF / "Meta-Llama-3.1-8B.config.json"
TITAN_ARGS = ("--cluster", H100, "--nodes", 1)
TRAINER = ("[rank0]:[titan] 2026-03-02 15:02:11,200 - root - INFO - Trainer is initialized with "
           "local batch size {local}, global batch size {batch}, gradient accumulation steps "
           "{accumulate}, sequence length 8192, total steps 1000 (warmup 200)")


def _llama(tmp_path: Path, text: str, *args: str | Path) -> tuple[dict[str, Any], Path]:
    """The record of a Llama 3 8B Megatron log of ``text``, named as the data log is."""
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    log = folder / LLAMA_LOG.name
    log.write_text(text)
    return _record_of(folder, log, "--model", shared(LLAMA_HF), "--cluster", H100, *args)


def _titan(tmp_path: Path, text: str, *args: str | Path) -> tuple[dict[str, Any], Path]:
    """The record of a torchtitan log of ``text``, named as the data log is."""
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    log = folder / TITAN_LOG.name
    log.write_text(text)
    return _record_of(folder, log, "--model", shared(TITAN_HF), *TITAN_ARGS, *args)


def _refused(tmp_path: Path, text: str, *args: str | Path) -> str:
    """The one-line error of ``runs from-log`` on a log of ``text``, whitespace joined."""
    log = tmp_path / "refused.log"
    log.write_text(text)
    done = _from_log(log, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    return " ".join(done.stderr.split())


def _with_trainer_line(text: str, **sizes: int) -> str:
    """The torchtitan log with the trainer's batch line (torchtitan/train.py:354-362)."""
    at = "[rank0]:[titan] 2026-03-02 15:02:11,310 - root - INFO - Training starts at step 1"
    return text.replace(at, TRAINER.format(**sizes) + "\n" + at)


def test_torchtitan_tensor_parallelism_is_sequence_parallel(tmp_path: Path) -> None:
    """A3: torchtitan's TP shards the norms along the sequence (SequenceParallel): a mesh with
    tp=2 records sp true, and --no-sp contradicts the log."""
    text = TITAN_LOG.read_text().replace("dp_shard=8, cp=1, tp=1", "dp_shard=4, cp=1, tp=2")
    record, out = _titan(tmp_path, text, "--mbs", 1, "--global-batch", 8)
    assert (record["parallel"]["tp"], record["parallel"]["dp"], record["parallel"]["sp"]) == (
        2, 4, True)
    assert load_runs(out)[0].config.sp
    refused = _refused(tmp_path, text, "--model", shared(TITAN_HF), *TITAN_ARGS,
                       "--global-batch", 8, "--no-sp")  # fmt: skip
    assert "the log says sp True; --sp False contradicts it" in refused


def test_torchtitan_batch_sizes_come_from_the_log(tmp_path: Path) -> None:
    """A4: ``Trainer is initialized with local batch size 2, global batch size 32, gradient
    accumulation steps 2`` gives the microbatch (2, what a rank runs at once) and the global
    batch without options; an option that contradicts it is refused."""
    text = _with_trainer_line(TITAN_LOG.read_text(), local=2, batch=32, accumulate=2)
    record, _ = _titan(tmp_path, text)
    assert (record["parallel"]["microbatch"], record["parallel"]["global_batch"]) == (2, 32)
    tps = statistics.median(s.value for s in titan_steps(text.splitlines())[3:])
    assert record["measured"]["step_time_s"] == pytest.approx(32 * 8192 / (tps * 8), rel=1e-12)
    for option, said in (("--global-batch", "global_batch 32"), ("--mbs", "mbs 2")):
        refused = _refused(tmp_path, text, "--model", shared(TITAN_HF), *TITAN_ARGS, option, 16)
        assert f"the log says {said}; {option} 16 contradicts it" in refused
    # A pipeline splits the local batch into the microbatches its schedule line states.
    lines = [TRAINER.format(local=8, batch=32, accumulate=1)]
    assert titan_batch_fields(lines, pp=2) == {"global_batch": 32}
    schedule = "Using pipeline schedule 1F1B with 4 microbatches and 2 stages."
    assert titan_batch_fields([*lines, schedule], pp=2) == {"global_batch": 32, "mbs": 2}


def test_prefixed_megatron_log_is_the_unprefixed_record(tmp_path: Path) -> None:
    """A5: ``srun -l`` (``0: ``) and torchrun's ``--tee`` (``[rank0]:`` on the dump, the last
    rank's ``[rank7]:`` on the iteration lines) prefix each line; the record is the same."""
    text = LLAMA_LOG.read_text()
    plain, _ = _llama(tmp_path, text)
    srun = "".join(f"0: {line}" for line in text.splitlines(keepends=True))
    assert _llama(tmp_path, srun)[0] == plain
    torchrun = "".join(f"[rank{7 if 'iteration ' in line else 0}]:{line}"
                       for line in text.splitlines(keepends=True))  # fmt: skip
    assert _llama(tmp_path, torchrun)[0] == plain
    assert megatron_arguments(srun.splitlines())["tensor_model_parallel_size"] == "2"


def test_torchtitan_log_of_two_ranks_is_one_run(tmp_path: Path) -> None:
    """torchtitan's ``LOG_RANK=0,1`` logs both ranks, their lines interleaved: each rank's
    start-up lines once is one run, and the steps are read once (rank 0's)."""
    text = TITAN_LOG.read_text()
    plain, _ = _titan(tmp_path, text, "--mbs", 1, "--global-batch", 8)
    both = "".join(line + line.replace("[rank0]:", "[rank1]:", 1)
                   for line in text.splitlines(keepends=True))  # fmt: skip
    assert _titan(tmp_path, both, "--mbs", 1, "--global-batch", 8)[0] == plain


def test_a_log_of_two_runs_is_refused(tmp_path: Path) -> None:
    """A6: two Megatron jobs, two torchtitan runs, or Megatron then torchtitan appended to one
    file: refused in one line that names where each run starts and says to split the file."""
    llama, titan = LLAMA_LOG.read_text(), TITAN_LOG.read_text()
    llama_lines, titan_lines = len(llama.splitlines()), len(titan.splitlines())
    args = ("--model", shared(LLAMA_HF), "--cluster", H100)
    for text, starts in (
        (llama + llama, f"a Megatron-LM run from line 3 (an arguments dump), a Megatron-LM run "
                        f"from line {llama_lines + 3} (an arguments dump)"),
        (titan + titan, f"a torchtitan run from line 1 (a 'Starting job' line), a torchtitan "
                        f"run from line {titan_lines + 1} (a 'Starting job' line)"),
        (llama + titan, f"a torchtitan run from line {llama_lines + 1}"),
    ):  # fmt: skip
        refused = _refused(tmp_path, text, *args)
        assert "the log holds 2 runs" in refused and starts in refused
        assert "split it into one log per run" in refused
    # Without a second dump, a step that goes back starts a run of its own.
    steps = [line for line in llama.splitlines() if "iteration " in line]
    refused = _refused(tmp_path, "\n".join(steps + steps), *args)
    assert f"a Megatron-LM run from line {len(steps) + 1} (step 1 after step 30)" in refused


def test_a_cut_off_last_line_is_no_step(tmp_path: Path) -> None:
    """A7: a last line cut off inside its field (``elapsed time per iteration (ms): 17``,
    ``tps: 4,8``) is not read as a step: the record is the one without it."""
    llama = LLAMA_LOG.read_text()
    whole = llama.rsplit("\n", 2)[0] + "\n"  # the log without its last iteration line
    cut = whole + llama.splitlines()[-1].split("(ms): ")[0] + "(ms): 17"
    assert _llama(tmp_path, cut)[0] == _llama(tmp_path, whole)[0]
    titan = TITAN_LOG.read_text()
    cut = titan + titan.splitlines()[-1].replace("step: 30", "step: 31").split("tps: ")[0]
    assert _titan(tmp_path, cut + "tps: 4,8", "--global-batch", 8)[0] == _titan(
        tmp_path, titan, "--global-batch", 8)[0]
    assert len(titan_steps((cut + "tps: 4,8").splitlines())) == 30


def test_the_logs_gpu_must_be_the_clusters(tmp_path: Path) -> None:
    """A9: torchtitan's ``CUDA capacity: NVIDIA H100 80GB HBM3 with 79.11GiB memory`` refuses
    an A100 cluster (and an 80GB log a 40GB cluster), naming the log's device."""
    args = ("--model", shared(TITAN_HF), "--nodes", 1, "--global-batch", 8)
    refused = _refused(tmp_path, TITAN_LOG.read_text(), *args, "--cluster",
                       CLUSTERS / "dgx-a100-80gb.json")
    assert ("the log ran on NVIDIA H100 80GB HBM3 (torchtitan's 'capacity:' line), the cluster "
            "file's device is A100-SXM4-80GB") in refused
    a100 = TITAN_LOG.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
    refused = _refused(tmp_path, a100, *args, "--cluster", CLUSTERS / "dgx-a100-40gb.json")
    assert "the log ran on NVIDIA A100-SXM4-80GB" in refused
    assert _titan(tmp_path, TITAN_LOG.read_text(), "--global-batch", 8)[0]["cluster"]["gpu"] == (
        "H100-SXM5-80GB")


def test_skipped_and_nan_lines_are_left_out_and_said(tmp_path: Path) -> None:
    """B2: an fp16 run's skipped iterations ran no optimizer step, and a NaN loss is a broken
    run: their lines are left out of the median, the record's note and the command say how
    many and why; a log of nothing else after the warm-up is refused."""
    text = LLAMA_LOG.read_text()
    lines = text.splitlines(keepends=True)
    iterations = [i for i, line in enumerate(lines) if "iteration " in line]
    for i in iterations[10:14]:  # four fast skipped lines
        ms = lines[i].split("(ms): ")[1].split(" ")[0]
        lines[i] = lines[i].replace(f"(ms): {ms}", "(ms): 9000.0").replace(
            "skipped iterations:   0", "skipped iterations:   1")
    record, out = _llama(tmp_path, "".join(lines))
    kept = [float(lines[i].split("(ms): ")[1].split(" ")[0]) for i in iterations[3:]]
    assert record["measured"]["step_time_s"] == statistics.median(
        ms for ms in kept if ms != 9000.0) / 1000
    assert record["note"] == ("left out of the median: 4 step lines with skipped iterations "
                              f"(from line {iterations[10] + 1}), which ran no optimizer step "
                              f"(an inf or NaN gradient)")
    assert "23 log lines of 23 iterations after the warm-up" in record["source"]
    assert load_runs(out, any_device=True)[0].measured_step_time_s == record["measured"][
        "step_time_s"]
    done = _from_log(tmp_path / "0" / LLAMA_LOG.name, "--model", shared(LLAMA_HF),
                     "--cluster", H100)  # fmt: skip
    assert "note: left out of the median: 4 step lines" in done.stderr
    # torchtitan's loss: nan (``{:8.5f}``) from step 20 on
    titan = TITAN_LOG.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(titan) if "step: 20" in line)
    nan = [re.sub(r"loss: +[0-9.]+", "loss:      nan", line) if i >= at else line
           for i, line in enumerate(titan)]  # fmt: skip
    record, _ = _titan(tmp_path, "".join(nan), "--global-batch", 8)
    assert record["note"] == ("left out of the median: 11 step lines whose loss or gradient "
                              f"norm is not a number (from line {at + 1}): the run diverged there")
    every = [re.sub(r"loss: +[0-9.]+", "loss:      nan", line) for line in titan]
    refused = _refused(tmp_path, "".join(every), "--model", shared(TITAN_HF), *TITAN_ARGS,
                       "--global-batch", 8)
    assert ("all 27 step lines after the 3 warm-up lines report skipped iterations or a loss "
            "that is not a number") in refused


def test_megatron_moe_without_grouped_gemm_is_refused(tmp_path: Path) -> None:
    """B3: the planner prices a bf16 Megatron MoE run's experts as one grouped GEMM, and no
    configuration field says otherwise: ``moe_grouped_gemm False`` is refused in one line."""
    text = MIXTRAL_LOG.read_text()
    grouped = "  moe_grouped_gemm ................................ True"
    assert grouped in text
    refused = _refused(tmp_path, text.replace(grouped, grouped.replace("True", "False")),
                       "--model", shared(HF / "Mixtral-8x7B-v0.1.config.json"), "--cluster",
                       H100)  # fmt: skip
    assert ("moe_grouped_gemm False: the planner prices Megatron MoE runs in bf16 with "
            "--moe-grouped-gemm only") in refused


def test_nodes_that_do_not_hold_the_logs_ranks_say_so(tmp_path: Path) -> None:
    """--nodes 4 on a log of 8 ranks names the log's ranks and the fix."""
    refused = _refused(tmp_path, LLAMA_LOG.read_text(), "--model", shared(LLAMA_HF),
                       "--cluster", H100, "--nodes", 4)  # fmt: skip
    assert ("the log ran tp(2) x pp(1) x cp(1) x dp(4) = 8 ranks, --nodes 4 gives 32 devices "
            "(4 x 8); --nodes must match the log's ranks, or leave it out") in refused


def test_a_dense_dumps_expert_tensor_parallelism_is_ignored(tmp_path: Path) -> None:
    """A dense run's dump prints Megatron's default expert_tensor_parallel_size 1 at TP2; it
    says nothing of experts the model does not have, and the record is the one without it."""
    text = LLAMA_LOG.read_text()
    dense = text.replace("  data_parallel_size ....", "  expert_tensor_parallel_size ..........."
                         "......... 1\n  data_parallel_size ....")  # fmt: skip
    assert megatron_arguments(dense.splitlines())["expert_tensor_parallel_size"] == "1"
    assert _llama(tmp_path, dense)[0] == _llama(tmp_path, text)[0]


def test_the_record_counts_lines_and_their_iterations(tmp_path: Path) -> None:
    """At log_interval 5 a line reports five iterations: the record says how many lines it
    kept and how many iterations they report."""
    every_fifth = "".join(line for line in LLAMA_LOG.read_text().splitlines(keepends=True)
                          if "iteration " not in line
                          or int(line.split("iteration")[1].split("/")[0]) % 5 == 0)
    record, _ = _llama(tmp_path, every_fifth)
    assert "3 log lines of 15 iterations after the warm-up" in record["source"]


def test_ranks_printed_without_a_prefix_are_said_as_such() -> None:
    """Two ranks of one torchtitan run printing every line without ``[rankN]:`` (plain
    torchrun, no rank filter) read as many runs; the refusal says that each step is printed
    twice, and how to keep one rank's lines (it told the user to split a file of one run)."""
    text = (Path(__file__).parent / "data" / "llama3-8b-torchtitan.log").read_text()
    plain = [re.sub(r"^\[rank\d+\]:", "", line) for line in text.splitlines()]
    doubled = "\n".join(line for line in plain for _ in range(2))
    with pytest.raises(InputError, match=r"each step printed 2 times, one run's ranks without "
                                         r"a rank prefix: keep one rank's lines"):
        read_log(doubled, where="two-ranks.log")
