"""``planner runs from-log``: a training log written by hand from a published run becomes a
record that ``validate`` prices exactly as it prices the published record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner.diagnose.calibration import validate
from planner.diagnose.logs import megatron_arguments, read_log, titan_tps
from planner.diagnose.runs import model_from_record
from planner.errors import InputError
from tests.conftest import CALIBRATION_RUNS, CLUSTERS, FSDP_RUNS, REPO, shared

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
    return subprocess.run(
        [sys.executable, "-c", "from planner.cli import main; main()", "runs", "from-log",
         *map(str, args)], cwd=REPO, capture_output=True, text=True, check=False)


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
    assert predicted == pytest.approx(published, rel=1e-12)
    tokens = p["global_batch"] * record["model"]["seq_len"]
    assert measured == pytest.approx(tokens / (round(31900 / 16) * 16), rel=1e-12)
    assert measured == pytest.approx(published_measured, rel=1e-3)  # tps printed rounded


def test_parsers_read_the_printed_formats() -> None:
    """The median after the warm-up; ANSI colours and thousands commas read through."""
    lines = [f"{ANSI_RED}step: {i:2}  {ANSI_BLUE}tps: {t:,}  mfu: 1.00%{ANSI_RESET}"
             for i, t in enumerate((100, 5000, 1200, 1000, 1100), 1)]
    assert titan_tps(lines) == [100, 5000, 1200, 1000, 1100]
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
