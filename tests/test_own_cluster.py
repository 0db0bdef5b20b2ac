"""A user's own cluster file: ``runs from-log``, ``validate --cluster`` and ``calibrate
--cluster`` on a device none of the bundled files models (Ascend 910B), each checked against a
known answer: the estimate of the same configuration, and a GEMM curve the runs were made
with."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from planner.diagnose.calibration import calibrate, validate
from planner.diagnose.fit import sized_for, with_values, without_fits
from planner.diagnose.runs import load_runs
from planner.spec.reading import load_cluster
from planner.uniform.estimate import estimate
from tests.cli_process import cli
from tests.conftest import CALIBRATION_RUNS, CLUSTERS, MODELS, REPO, SHARED, shared
from tests.test_cli import _assert_one_line_error, _error_text

ASCEND = CLUSTERS / "ascend-910b.json"
# Written by hand in Megatron-LM's format (tests/data/gpt3-175b-megatron.log's layout): GPT
# 1.7B on 2 nodes of 8 910Bs, TP 2 PP 2 DP 4, SP, microbatch 2, global batch 512, fp16, fused
# attention, distributed optimizer; 3 warm-up iterations at 9876.5 ms, then 20 at 5190, 5210
# and 5230 ms and one checkpoint save at 8421.7 ms, whose median is 5210 ms.
LOG_910B = REPO / "tests" / "data" / "gpt-1.7b-910b-megatron.log"
MEASURED_910B_S = 5.21
# The same configuration as estimate takes it.
CONFIG_910B = ("--nodes", "2", "--tp", "2", "--pp", "2", "--dp", "4", "--sp", "--mbs", "2",
               "--global-batch", "512", "--seq-len", "2048", "--zero", "1", "--precision",
               "fp16", "--flash-attention")  # fmt: skip
# The GEMM curve the synthetic runs' "measured" times are made with.
TRUE_GEMM = {"gemm.max_fraction": 0.62, "gemm.half_saturation_gflop": 40.0}


def _digest(*paths: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _from_log_910b(out: Path) -> str:
    """``runs from-log`` of the 910B log into ``out``; its stderr."""
    done = cli("runs", "from-log", LOG_910B, "--model", MODELS / "gpt-1.7b.json", "--cluster",
                ASCEND, "--nodes", 2, "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_910b_log_is_priced_as_estimate_prices_it(tmp_path: Path) -> None:
    """The record names the file's device; ``validate --cluster`` predicts what ``estimate``
    of the same configuration on that file does, and measures the log's median."""
    out = tmp_path / "mine.json"
    stderr = _from_log_910b(out)
    assert "not a bundled device" in stderr and f"--cluster {ASCEND}" in stderr
    record = json.loads(out.read_text())[0]
    assert record["cluster"] == {"gpu": "Ascend-910B", "num_gpus": 16}
    assert record["parallel"] | {"vpp": None} == {
        "tp": 2, "pp": 2, "dp": 4, "cp": 1, "ep": 1, "vpp": None, "sp": True, "microbatch": 2,
        "global_batch": 512, "recompute": "none", "zero": 1}
    done = cli("validate", out, "--cluster", ASCEND, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    estimated = json.loads(cli("estimate", MODELS / "gpt-1.7b.json", ASCEND, *CONFIG_910B,
                                "--json").stdout)  # fmt: skip
    assert row["device"] == "Ascend-910B" and row["measured_s"] == MEASURED_910B_S
    assert row["predicted_s"] == pytest.approx(estimated["step_time_s"], rel=1e-12)
    assert row["predicted_s"] == pytest.approx(3.7293, rel=1e-4)  # the uncalibrated roofline


def _synthetic_runs(path: Path, cluster: Path) -> list[dict[str, Any]]:
    """Four 910B runs of GEMMs from ~2 to ~500 GFLOP, each "measured" at what the cost model
    predicts on ``cluster`` with :data:`TRUE_GEMM`; written to ``path``."""
    shapes = [  # hidden, layers, heads, tp, pp, mbs, devices
        (1024, 24, 16, 8, 1, 1, 8), (2304, 24, 24, 4, 1, 1, 8), (2304, 24, 24, 2, 2, 2, 16),
        (4096, 16, 32, 2, 1, 4, 8),
    ]  # fmt: skip
    records = []
    for i, (hidden, layers, heads, tp, pp, mbs, devices) in enumerate(shapes):
        records.append({
            "id": f"synthetic-{i}", "source": "made by the cost model", "source_kind": "test",
            "software": {"framework": "Megatron-LM", "fused_attention": True, "dropout": 0.0},
            "model": {"name": f"gpt-h{hidden}", "layers": layers, "hidden": hidden,
                      "heads": heads, "ffn_hidden": 4 * hidden, "vocab": 51200,
                      "seq_len": 2048},
            "cluster": {"gpu": "Ascend-910B", "num_gpus": devices},
            "parallel": {"tp": tp, "pp": pp, "dp": devices // (tp * pp), "sp": tp > 1,
                         "microbatch": mbs, "global_batch": 128, "recompute": "none",
                         "zero": 1},
            "precision": "bf16", "measured": {"step_time_s": 1.0},
        })  # fmt: skip
    path.write_text(json.dumps(records))
    truth = with_values(without_fits(load_cluster(cluster)), TRUE_GEMM)
    for record, run in zip(records, load_runs(path, any_device=True), strict=True):
        step = estimate(run.model, sized_for(run, truth), run.config).step_time_s
        record["measured"]["step_time_s"] = step
    path.write_text(json.dumps(records, indent=2))
    return records


def test_calibrate_cluster_recovers_the_gemm_curve_into_that_file_only(tmp_path: Path) -> None:
    """Four runs the cost model "measured" with a known GEMM curve fit back to it, written
    into the user's file only (the runs, with their errors, as its evidence), every bundled
    file untouched."""
    mine = tmp_path / "ascend-910b.json"
    shutil.copy(ASCEND, mine)
    runs = tmp_path / "runs.json"
    _synthetic_runs(runs, mine)
    bundled = _digest(*sorted(CLUSTERS.glob("*.json")))
    done = cli("calibrate", runs, "--cluster", mine, "--write")
    assert done.returncode == 0, done.stderr
    assert _digest(*bundled) == bundled
    before, after = json.loads(ASCEND.read_text()), json.loads(mine.read_text())
    eff = after["device"].pop("efficiency")
    old = before["device"].pop("efficiency")
    assert after == before  # only the efficiency block changed
    assert {k: eff[k] for k in old if k != "gemm"} == {k: old[k] for k in old if k != "gemm"}
    assert eff["gemm"]["max_fraction"] == pytest.approx(0.62, rel=1e-3)
    assert eff["gemm"]["half_saturation_gflop"] == pytest.approx(40.0, rel=1e-3)
    assert "planner calibrate --cluster ascend-910b.json --write" in eff["gemm"]["source"]
    assert "on 4 Ascend-910B runs" in eff["gemm"]["source"]
    assert "--gpu" not in eff["gemm"]["source"]
    assert "validation" not in eff
    assert len(eff["evidence"]) == 4
    assert all(abs(run["error"]) <= 0.002 for run in eff["evidence"])
    assert "attention" not in eff and eff["overlap_contention"] == 0.0
    assert str(mine) in done.stdout.replace("\n", "")
    # two runs a knob: the 0.2 % bands written are in sample, and the fit says so
    assert ("note: 4 runs fitted 2 knobs: the fit leaves them almost no residual, so the error "
            "bands it writes are in sample and narrow") in " ".join(done.stdout.split())


def test_one_run_fits_the_ceiling_only(tmp_path: Path) -> None:
    """One run's step time fits any split between the GEMM curve's ceiling and its half
    saturation: the ceiling alone is fitted, the file's half saturation kept, and the run is
    then priced as measured."""
    cluster = tmp_path / "910b.json"
    cluster.write_text(ASCEND.read_text())
    runs = tmp_path / "runs.json"
    records = _synthetic_runs(runs, cluster)
    runs.write_text(json.dumps(records[2:3]))
    fit = calibrate([runs], CLUSTERS, cluster=cluster)
    assert set(fit.fit.values) == {"gemm.max_fraction"}
    assert abs(fit.after[0].error) < 1e-3
    assert fit.fit.in_sample is not None and fit.fit.in_sample.startswith("1 run fitted 1 knob")


def test_validate_without_cluster_names_the_record_and_the_option(tmp_path: Path) -> None:
    out = tmp_path / "mine.json"
    _from_log_910b(out)
    done = cli("validate", out)
    # The record is listed with why; nothing else could be priced, so exit 2.
    listed = " ".join(done.stdout.split())
    assert ("- gpt-1.7b-910b-megatron: cluster.gpu 'Ascend-910B' is none of the bundled "
            "devices (A100-40GB, A100, H100); pass --cluster FILE") in listed, done.stdout
    assert done.returncode == 2
    assert f"no record of {out} could be priced (1 left out" in _error_text(done.stderr)
    _assert_one_line_error(cli("calibrate", out, "--gpu", "A100"),
                           "1 record left out: gpt-1.7b-910b-megatron", "pass --cluster FILE")


@pytest.mark.parametrize("options", [
    pytest.param((), id="neither"),
    pytest.param(("--gpu", "A100", "--cluster", "{cluster}", "--write"), id="both"),
    pytest.param(("--cluster", "{cluster}", "--write", "--exclude-family", "megatron"),
                 id="write-excluding"),
])  # fmt: skip
def test_calibrate_cluster_errors_are_one_line_and_write_nothing(
    options: tuple[str, ...], tmp_path: Path
) -> None:
    mine = tmp_path / "ascend-910b.json"
    shutil.copy(ASCEND, mine)
    runs = tmp_path / "runs.json"
    _synthetic_runs(runs, mine)
    files = _digest(mine, runs, *sorted(CLUSTERS.glob("*.json")))
    args = [str(mine) if o == "{cluster}" else o for o in options]
    done = cli("calibrate", runs, *args)
    needle = "--exclude-family" if "--exclude-family" in options else "exactly one of --gpu"
    _assert_one_line_error(done, needle)
    assert _digest(*files) == files


def test_validate_on_a_bundled_file_is_the_bundled_pricing() -> None:
    """``--cluster`` is the same pricing given one file: the published A100 80GB runs priced on
    ``dgx-a100-80gb.json`` as a user's file predict what the bundled path does."""
    runs = shared(CALIBRATION_RUNS)
    bundled = {r.id: r for r in validate([runs], CLUSTERS).rows if r.device == "A100"}
    mine = validate([runs], CLUSTERS, cluster=CLUSTERS / "dgx-a100-80gb.json").rows
    same = [row for row in mine if row.id in bundled]
    assert len(same) == len(bundled) >= 3
    assert all(row == bundled[row.id] for row in same)


def test_a_knob_left_on_its_bound_is_said(tmp_path: Path) -> None:
    """The five one-GPU H100 steps fit the GEMM curve's half saturation at its lower bound
    (0.01 GFLOP): the runs do not pin it, and the fit printed it as a value in silence. The
    fit names it, and calibrate says so; a fit that leaves its knobs inside their bounds names
    none. (Five runs fit three knobs at most: the attention curve's two no longer come
    with the GEMM curve's, :func:`~planner.diagnose.calibration.fittable_knobs`.)"""
    runs = shared(SHARED / "validation" / "h100" / "runs_one_gpu.json")
    one_gpu = shared(SHARED / "validation" / "h100" / "h100-sxm-1gpu.json")
    mine = tmp_path / "h1.json"
    mine.write_text(one_gpu.read_text())
    fit = calibrate([runs], CLUSTERS, cluster=mine)
    assert set(fit.fit.values) == {"gemm.max_fraction", "gemm.half_saturation_gflop"}
    assert fit.fit.at_bounds == {"gemm.half_saturation_gflop": 0.01}
    assert all(fit.fit.values[name] == bound for name, bound in fit.fit.at_bounds.items())
    done = cli("calibrate", runs, "--cluster", mine)
    assert done.returncode == 0, done.stderr
    assert ("note: gemm.half_saturation_gflop is at its bound, 0.01: the runs do not pin it"
            in " ".join(done.stdout.split()))


def test_calibrate_keeps_a_kernel_fitted_attention_curve(tmp_path: Path) -> None:
    """The bundled H100 file's attention curve was fitted on kernels (``planner bench``,
    ``kernel`` torch-sdpa, its backward and per-call terms): a fit on whole runs neither moves
    it nor drops it on ``--write`` (it wrote the runs' attention ceiling over it, 0.843 ->
    0.154 on five site runs, and dropped the kernel's fields)."""
    mine = tmp_path / "h100.json"
    shutil.copy(CLUSTERS / "dgx-h100-80gb.json", mine)
    attention = json.loads(mine.read_text())["device"]["efficiency"]["attention"]
    assert attention["kernel"] == "torch-sdpa"
    runs = shared(SHARED / "validation" / "h100" / "runs_one_gpu.json")
    fit = calibrate([runs], CLUSTERS, cluster=mine, write=True)
    assert not any(name.startswith("attention") for name in fit.fit.values)
    assert json.loads(mine.read_text())["device"]["efficiency"]["attention"] == attention


def test_cluster_fits_only_its_own_devices_runs_each_once(tmp_path: Path) -> None:
    """The published runs beside a user's H100 file: the A100 runs are left out, each with
    why (fitted in, they pulled the file's GEMM ceiling to 0.39), and a file given twice is
    read once (its runs counted twice weighed twice)."""
    mine = tmp_path / "site-h100.json"
    shutil.copy(CLUSTERS / "dgx-h100-80gb.json", mine)
    runs = shared(CALIBRATION_RUNS)
    checked = validate([runs, runs], CLUSTERS, cluster=mine)
    assert {row.device for row in checked.rows} == {"H100"}
    ids = [row.id for row in checked.rows]
    assert len(ids) == len(set(ids)) >= 3
    assert any(line.endswith("ran on A100, not site-h100.json's H100-SXM5-80GB")
               for line in checked.skipped)
    assert sum("given twice, read once" in line for line in checked.skipped) == len(
        load_runs(runs))
    bundled = [r for r in validate([runs], CLUSTERS).rows if r.device == "H100"]
    assert sorted(ids) == sorted(r.id for r in bundled)


def test_no_more_knobs_than_the_runs_can_check() -> None:
    """One knob for the first run and one for every two more, in their order, the attention
    curve's three terms together (MPT's runs span two head dims): its FSDP runs (fused
    attention at several lengths, overlapped) fit the GEMM ceiling alone from one or two runs,
    its half saturation from three, the contention where the attention's three do not fit
    yet (five runs), the attention curve from nine, and with a kernel-fitted curve the
    contention instead."""
    from planner.diagnose.calibration import fittable_knobs

    runs = sorted(load_runs(shared(SHARED / "validation" / "fsdp_runs.json")),
                  key=lambda r: (r.config.seq_len, r.id))  # fmt: skip
    spread = [runs[0], runs[-1], *runs[1:-1]]  # two sequence lengths among the first two
    gemm = ("gemm.max_fraction", "gemm.half_saturation_gflop")
    attention = ("attention.max_fraction", "attention.half_saturation_tokens",
                 "attention.half_saturation_head_dim")
    assert fittable_knobs(spread[:1]) == fittable_knobs(spread[:2]) == gemm[:1]
    assert fittable_knobs(spread[:3]) == gemm
    assert fittable_knobs(spread[:5]) == (*gemm, "overlap_contention")
    assert fittable_knobs(spread[:9]) == gemm + attention
    assert fittable_knobs(spread[:9], kernel_curve=True) == (*gemm, "overlap_contention")
