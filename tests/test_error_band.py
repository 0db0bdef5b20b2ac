"""Every prediction carries the error band of the validated runs closest to it: the band of the
device's runs of the same kind of parallelism, printed beside the step time (``+/- N %``, N the
80th percentile of |error| in whole percent rounded up) and recorded in the JSON with the runs
it rests on; a device without validated runs prints ``uncalibrated`` wherever its step times
appear. The bands are built here, not read from the bundled files (which `planner calibrate`
rewrites): the bundled H100 with two known bands written into its file, and with none."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from planner.cost.uncertainty import error_band, stages_kind
from planner.options import Pins, SolveOptions
from planner.plan.files import plan_from_json
from planner.plan.schema import SCHEMA_VERSION, ErrorBand, StageParallel
from planner.search.per_operator import solve_per_operator
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster
from tests.conftest import CLUSTERS, MODELS, REPO
from tests.test_cli_width import assert_fits, planner

LLAMA = MODELS / "llama3-8b.json"
H100 = CLUSTERS / "dgx-h100-80gb.json"
ASCEND = CLUSTERS / "ascend-910b.json"
SMALL = ("--nodes", "1", "--global-batch", "32", "--seq-len", "2048")
"""Llama 3 8B on one 8-GPU node: every command takes a second or less."""
TP2 = ("--tp", "2", "--zero", "1")
"""A model-parallel configuration of it that fits."""

MODEL_PARALLEL_P80 = 0.0523
"""The calibrated cluster's model-parallel band: 6 % (5.23 rounded up)."""
SHARDED_P80 = 0.071
"""Its sharded-data-parallel band: 8 % (7.1 rounded up)."""
BANDS = [
    {"parallelism": "model-parallel", "runs": 9, "p80_abs_error": MODEL_PARALLEL_P80,
     "median_error": -0.01, "families": ["megatron"]},
    {"parallelism": "sharded-data-parallel", "runs": 11, "p80_abs_error": SHARDED_P80,
     "median_error": 0.02, "families": ["llm-foundry"]},
]  # fmt: skip


ATTENTION = {"max_fraction": 0.5, "half_saturation_tokens": 500.0}
"""An attention curve, so that the calibrated cluster's bands carry no caveat about it."""


def _percent(fraction: float) -> str:
    return f"+/- {math.ceil(100 * fraction)} %"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled H100 cluster file with a model-parallel and a sharded-data-parallel band."""
    data = json.loads(H100.read_text())
    data["device"]["efficiency"]["validation"] = BANDS
    data["device"]["efficiency"]["attention"] = ATTENTION
    path = tmp_path_factory.mktemp("bands") / "h100-calibrated.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def uncalibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled H100 cluster file with no validation bands."""
    data = json.loads(H100.read_text())
    data["device"]["efficiency"]["validation"] = []
    path = tmp_path_factory.mktemp("bands") / "h100-uncalibrated.json"
    path.write_text(json.dumps(data))
    return path


def _estimate_json(cluster: Path, *knobs: str) -> dict:
    done = planner(200, "estimate", LLAMA, cluster, *SMALL, *knobs, "--json")
    assert done.code == 0, done.stderr
    return json.loads(done.stdout)


# --------------------------------------------------------------------------- the band itself


def test_known_percentages() -> None:
    """Whole percent rounded up, never below 1; a stored 0.06 is 6 %, not 7 % by a float's
    last digit; no fraction is ``uncalibrated``."""

    def text(fraction: float | None) -> str:
        return ErrorBand(fraction=fraction, runs=3 if fraction is not None else 0,
                         parallelism="model-parallel", closest="").text  # fmt: skip

    assert [text(f) for f in (0.0523, 0.06, 0.0601, 0.001, 0.0)] == [
        "+/- 6 %", "+/- 6 %", "+/- 7 %", "+/- 1 %", "+/- 1 %"]
    assert text(None) == "uncalibrated"


def test_kind_of_parallelism_of_stages() -> None:
    """A search plan's kind from its stages: expert or context parallelism on any stage is
    its own kind (no band of other runs covers their exchanges); tensor parallelism or a
    second stage is model-parallel; one stage of pure data parallelism is sharded under
    ZeRO-3 and plain otherwise."""
    dp8 = {"tp": 1, "dp": 8}
    assert stages_kind([StageParallel(**dp8, zero=3)]) == "sharded-data-parallel"
    assert stages_kind([StageParallel(**dp8, zero=2)]) == "data-parallel"
    assert stages_kind([StageParallel(**dp8, zero=3)] * 2) == "model-parallel"
    assert stages_kind([StageParallel(tp=2, dp=4, zero=3)]) == "model-parallel"
    assert stages_kind([StageParallel(tp=2, dp=2, cp=2, zero=1)] * 2) == "context-parallel"
    assert stages_kind([StageParallel(tp=1, dp=8, cp=2, ep=2, zero=1)]) == "expert-parallel"


def test_a_kind_without_runs_takes_the_widest_band(calibrated: Path) -> None:
    """Plain data parallelism has no band on the calibrated device: the widest of its bands,
    resting on all 20 of its runs, and the line says there are none of that kind."""
    band = error_band(load_cluster(calibrated).device, "data-parallel")
    assert (band.fraction, band.runs, band.text) == (SHARDED_P80, 20, "+/- 8 %")
    assert band.closest == "widest over 20 runs on H100-SXM5-80GB (none data-parallel)"


# --------------------------------------------------------------------------- estimate


def test_estimate_prints_the_model_parallel_band(calibrated: Path) -> None:
    """TP2 is model-parallel: ``+/- 6 %`` beside the step, the line naming the 9 runs, at 80
    columns; the JSON has the fraction and the runs."""
    done = planner(80, "estimate", LLAMA, calibrated, *SMALL, *TP2)
    assert done.code == 0, done.stderr
    result = _estimate_json(calibrated, *TP2)
    assert result["error_band"] == {
        "fraction": MODEL_PARALLEL_P80, "runs": 9, "parallelism": "model-parallel",
        "closest": "80 % of 9 model-parallel runs on H100-SXM5-80GB were within it"}
    assert _percent(MODEL_PARALLEL_P80) == "+/- 6 %"
    assert f"step {result['step_time_s']:.3f} s +/- 6 %" in done.stdout
    assert "band: 80 % of 9 model-parallel runs on H100-SXM5-80GB were within it" in done.stdout
    assert "uncalibrated" not in done.stdout
    assert_fits(done.stdout, 80)


def test_estimate_of_zero3_data_parallelism_takes_the_sharded_band(calibrated: Path) -> None:
    """TP1 PP1 with ZeRO-3 is FSDP's kind: ``+/- 8 %`` on 11 sharded-data-parallel runs."""
    knobs = ("--tp", "1", "--pp", "1", "--zero", "3")
    done = planner(80, "estimate", LLAMA, calibrated, *SMALL, *knobs)
    assert done.code == 0, done.stderr
    result = _estimate_json(calibrated, *knobs)
    band = result["error_band"]
    assert (band["fraction"], band["runs"], band["parallelism"]) == (
        SHARDED_P80, 11, "sharded-data-parallel")
    assert f"step {result['step_time_s']:.3f} s +/- 8 %" in done.stdout
    assert "band: 80 % of 11 sharded-data-parallel runs on H100-SXM5-80GB" in done.stdout


def test_estimate_on_an_uncalibrated_device_says_so(uncalibrated: Path) -> None:
    """An H100 with no validation bands: ``(uncalibrated)`` beside the step, a line
    saying its error is not measured, and a band of no fraction on 0 runs in the JSON. The
    910B, whose GEMM curve is the data sheet's peak, says its times are the roofline."""
    done = planner(80, "estimate", LLAMA, uncalibrated, *SMALL, *TP2)
    result = _estimate_json(uncalibrated, *TP2)
    assert (result["error_band"]["fraction"], result["error_band"]["runs"]) == (None, 0)
    assert f"step {result['step_time_s']:.3f} s (uncalibrated)" in done.stdout
    assert "uncalibrated: no validated runs on H100-SXM5-80GB, accuracy not measured" in (
        done.stdout)
    ascend = planner(80, "estimate", LLAMA, ASCEND, *SMALL, "--tp", "8")
    assert ascend.code == 0, ascend.stderr
    assert "(uncalibrated)" in ascend.stdout
    assert "uncalibrated: no published runs on Ascend-910B; the data sheet's roofline" in (
        ascend.stdout)


# --------------------------------------------------------------------------- solve, compare


def test_solve_prints_and_records_its_plans_band(calibrated: Path, tmp_path: Path) -> None:
    """The plan Megatron's search finds carries the band of its own kind, in the table and in
    the plan file, with the runs."""
    out = tmp_path / "plan.json"
    done = planner(80, "solve", LLAMA, calibrated, *SMALL, "--out", out)
    assert done.code == 0, done.stderr
    plan = plan_from_json(out.read_text())
    band = plan.predicted.error_band
    assert band is not None
    expected = {"model-parallel": (MODEL_PARALLEL_P80, 9),
                "sharded-data-parallel": (SHARDED_P80, 11)}.get(band.parallelism, (SHARDED_P80, 20))
    assert (band.fraction, band.runs) == expected
    assert json.loads(out.read_text())["predicted"]["error_band"]["runs"] == expected[1]
    assert f"step {plan.predicted.step_time_s:.3f} s {_percent(expected[0])}" in done.stdout
    assert_fits(done.stdout, 80)


def test_solve_on_an_uncalibrated_device_says_so(uncalibrated: Path) -> None:
    """An H100 without bands: ``(uncalibrated)`` beside its plan's step, no fraction."""
    done = planner(80, "solve", LLAMA, uncalibrated, *SMALL, "--json")
    assert done.code == 0, done.stderr
    predicted = json.loads(done.stdout)["predicted"]
    band = predicted["error_band"]
    assert (band["fraction"], band["runs"]) == (None, 0)
    table = planner(80, "solve", LLAMA, uncalibrated, *SMALL)
    assert f"step {predicted['step_time_s']:.3f} s (uncalibrated)" in table.stdout


def test_compare_prints_each_rows_band(calibrated: Path, uncalibrated: Path) -> None:
    """Each method's row has its own plan's band in the ``+/-`` column, and a line under the
    table says what each distinct band rests on; uncalibrated, the rows have none and the
    line says why, once."""
    args = ("compare", LLAMA, calibrated, *SMALL, "--methods", "heuristic,grid")
    rows = json.loads(planner(200, *args, "--json").stdout)
    texts = {ErrorBand(**r["plan"]["predicted"]["error_band"]).text for r in rows}
    assert texts <= {"+/- 6 %", "+/- 8 %"}
    done = planner(80, *args)
    assert done.code == 0, done.stderr
    for r in rows:
        row = next(line for line in done.stdout.splitlines() if line.startswith(f" {r['method']}"))
        band = ErrorBand(**r["plan"]["predicted"]["error_band"])
        assert f" {r['step_time_s']:.3f} {band.text.removeprefix('+/- ')} " in (
            " ".join(row.split()) + " ")
        assert band.closest in " ".join(done.stdout.split())  # "band (grid): ..." wrapped
    assert_fits(done.stdout, 80)
    bare = planner(80, "compare", LLAMA, uncalibrated, *SMALL, "--methods", "heuristic,grid")
    numbers = [line.split() for line in bare.stdout.splitlines()
               if re.match(r" (heuristic|grid) +\d+\.\d{3} ", line)]  # fmt: skip
    assert [row[2] for row in numbers] == ["-", "-"]
    assert bare.stdout.count("uncalibrated: no validated runs on H100-SXM5-80GB") == 1


# --------------------------------------------------------------------------- the search (any)


def _tiny() -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "vocab_size": 1024, "max_position_embeddings": 512,
        "training": {"seq_length": 512, "global_batch_size": 16}})  # fmt: skip


@pytest.mark.parametrize(("pins", "kind", "fraction"), [
    (Pins(pp=2), "model-parallel", MODEL_PARALLEL_P80),
    (Pins(pp=1, tp=1, cp=1, zero=3), "sharded-data-parallel", SHARDED_P80),
])  # fmt: skip
def test_per_operator_plans_take_the_band_of_their_stages(
    calibrated: Path, pins: Pins, kind: str, fraction: float
) -> None:
    """The per-operator search's plan: two stages are model-parallel; one stage of pure data
    parallelism under ZeRO-3 is sharded-data-parallel."""
    cluster: ClusterSpec = load_cluster(calibrated, 1)
    plan = solve_per_operator(_tiny(), cluster, SolveOptions(framework="any", pins=pins))
    band = plan.predicted.error_band
    assert band is not None
    assert stages_kind([s.parallel for s in plan.stages]) == kind
    assert (band.parallelism, band.fraction) == (kind, fraction)


# --------------------------------------------------------------------------- plan files


def test_a_plan_written_before_bands_still_loads(calibrated: Path, tmp_path: Path) -> None:
    """A schema-4 plan has no band: it reads with the band unknown (None, not uncalibrated),
    and simulate and export print it as not recorded. The schema-3 plan kept in tests/ reads
    the same way."""
    fresh = tmp_path / "plan.json"
    done = planner(200, "estimate", LLAMA, calibrated, *SMALL, "--tp", "2", "--pp", "2",
                   "--out", fresh)  # fmt: skip
    assert done.code == 0, done.stderr
    data = json.loads(fresh.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["predicted"]["error_band"]["runs"] == 9
    del data["predicted"]["error_band"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data | {"schema_version": 4}))
    plan = plan_from_json(old.read_text())
    assert plan.predicted.error_band is None and plan.schema_version == SCHEMA_VERSION
    step = f"{plan.predicted.step_time_s:.3f} s (band not recorded)"
    simulated = planner(80, "simulate", old)
    assert step in simulated.stdout and "band not recorded: the plan file predates" in (
        simulated.stdout)
    assert json.loads(planner(80, "simulate", old, "--json").stdout)[
        "predicted_error_band"] is None
    exported = planner(200, "export", old, "--format", "megatron", "--model", LLAMA,
                       "--cluster", calibrated)  # fmt: skip
    assert exported.code == 0, exported.stderr
    assert f"predicted {step} per step" in exported.stderr
    bundled = plan_from_json((REPO / "tests" / "fuzz_plan_uniform.json").read_text())
    assert bundled.predicted.error_band is None


def test_simulate_and_export_print_the_plans_band(calibrated: Path, tmp_path: Path) -> None:
    """A plan with a band: simulate prints it beside the predicted step and in its JSON,
    export beside the predicted step in its notes, with the line of runs."""
    out = tmp_path / "plan.json"
    done = planner(200, "estimate", LLAMA, calibrated, *SMALL, "--tp", "2", "--pp", "2",
                   "--out", out)  # fmt: skip
    assert done.code == 0, done.stderr
    step = f"{plan_from_json(out.read_text()).predicted.step_time_s:.3f} s +/- 6 %"
    simulated = planner(80, "simulate", out)
    assert f"predicted {step}" in simulated.stdout
    assert json.loads(planner(80, "simulate", out, "--json").stdout)[
        "predicted_error_band"]["runs"] == 9
    exported = planner(200, "export", out, "--format", "megatron", "--model", LLAMA,
                       "--cluster", calibrated)  # fmt: skip
    assert f"predicted {step} per step" in exported.stderr
    assert "note: band: 80 % of 9 model-parallel runs on H100-SXM5-80GB" in exported.stderr


def test_a_device_without_an_attention_curve_says_so(calibrated: Path) -> None:
    """Bands rest on runs that may all share one sequence length: a device whose fused
    attention is not calibrated (timed as GEMMs) says so in the band's line."""
    data = json.loads(calibrated.read_text())
    del data["device"]["efficiency"]["attention"]
    cluster = ClusterSpec.model_validate(data)
    band = error_band(cluster.device, "model-parallel")
    assert band.closest.endswith("were within it; attention kernel uncalibrated")
    assert band.fraction == MODEL_PARALLEL_P80
