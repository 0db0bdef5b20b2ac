"""``validate`` and ``calibrate`` go on past a record they cannot price, listing it with why,
and fail only when nothing is left; DeepSpeed's pipeline partition (BLOOM's 70 layers on 12
stages) is a split the planner prices."""

from __future__ import annotations

import itertools
import json
import random
import re
from functools import partial
from pathlib import Path

import pytest

from planner.diagnose.calibration import at_site, calibrate, validate
from planner.diagnose.run_records import config_from_record
from planner.diagnose.runs import load_runs_noting
from planner.errors import PlannerError
from planner.frameworks._deepspeed_partition import (
    deepspeed_stage_layers,
    layer_specs,
    partition_balanced,
    partition_uniform,
    type_weights,
)
from planner.plan.config import ParallelConfig
from planner.spec.reading import load_cluster
from planner.uniform.estimate import estimate
from tests.cli_process import cli
from tests.conftest import REPO, SHARED, shared

_validate_cli = partial(cli, columns=80, timeout=300)

CLUSTERS = REPO / "instances" / "clusters"
CALIBRATION_RUNS = SHARED / "validation" / "calibration_runs.json"
DEEPSPEED_RUNS = SHARED / "validation" / "deepspeed_runs.json"


# --- DeepSpeed's partition, by hand and restated ----------------------------------------------


def deepspeed_partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/utils.py:627-665 as it is written: the
    reference the planner's array form must equal."""
    n, m = len(weights), num_parts
    if n <= m:
        return list(partition_uniform(n, m))
    inf = float("inf")
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0.0, *itertools.accumulate(weights)]
    dp_max[0][0] = dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k][j - 1], prefix[i] - prefix[k])
                min_sum = min(dp_min[k][j - 1], prefix[i] - prefix[k])
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j] = cost, max_sum, min_sum
                    position[i][j] = k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def test_bloom_by_hand() -> None:
    """BLOOM 176B (bigscience tr11: 70 layers, PP 12, ``type:transformer|embedding``): the
    embedding, 70 blocks and the tied head are 72 weighted slots, 6 a stage, so the ends hold
    5 blocks each. The same from BLOOM's own spec list (bigscience-workshop/Megatron-DeepSpeed
    gpt_model.py:222-291: two more casts, a transpose and its undo, weighted 0)."""
    assert deepspeed_stage_layers(70, pp=12, method="type:transformer|embedding",
                                  tied_embeddings=True) == (5, *[6] * 10, 5)  # fmt: skip
    bloom = ["_to_float16", "EmbeddingPipe", "<lambda>", *["ParallelTransformerLayerPipe"] * 70,
             "undo", "MixedFusedLayerNorm", "EmbeddingPipe", "float16_to_fp32"]  # fmt: skip
    bounds = partition_balanced(type_weights(tuple(bloom), "type:transformer|embedding"), 12)
    blocks = [sum(n.startswith("Parallel") for n in bloom[a:b])
              for a, b in itertools.pairwise(bounds)]  # fmt: skip
    assert blocks == [5, *[6] * 10, 5]
    assert "EmbeddingPipe" in bloom[: bounds[1]] and "EmbeddingPipe" in bloom[bounds[-2]:]


def test_small_cases_by_hand() -> None:
    """Four blocks on two stages: 2 + 2. With the embedding and a tied head counted, six
    slots: 2 + 2 blocks still (each end holds an embedding slot and two blocks). Untied, the
    head (LMHeadPipe) does not match ``embedding``: five slots, 3 + 2 by the last-cut rule,
    so the first stage holds the embedding and two blocks, the second two blocks."""
    assert deepspeed_stage_layers(4, pp=2, tied_embeddings=True) == (2, 2)
    assert deepspeed_stage_layers(4, pp=2, method="type:transformer|embedding",
                                  tied_embeddings=True) == (2, 2)  # fmt: skip
    assert deepspeed_stage_layers(4, pp=2, method="type:transformer|embedding",
                                  tied_embeddings=False) == (2, 2)  # fmt: skip
    assert layer_specs(1, tied_embeddings=True, moe=True)[3] == "_calculate_moe_loss"


def test_array_form_is_deepspeeds_loop() -> None:
    """The planner's partition_balanced equals DeepSpeed's own loops on random weights
    (ties included: many zero and equal weights)."""
    rng = random.Random(25)
    for _ in range(300):
        weights = [rng.choice([0, 0, 1, 1, 2, 3, 7]) for _ in range(rng.randint(1, 20))]
        parts = rng.randint(1, 8)
        assert list(partition_balanced(tuple(weights), parts)) == \
            deepspeed_partition_balanced(weights, parts), (weights, parts)


def test_divisible_blocks_split_evenly() -> None:
    """With ``type:transformer`` and layers a multiple of the stages, every stage gets the
    same blocks (what the planner priced before it read DeepSpeed's partition)."""
    for layers, pp in [(24, 2), (24, 4), (72, 6), (72, 24), (96, 16), (70, 7), (70, 35)]:
        assert deepspeed_stage_layers(layers, pp=pp, tied_embeddings=True) == \
            (layers // pp,) * pp


def test_refuses_what_deepspeed_refuses() -> None:
    from planner.errors import InputError

    with pytest.raises(InputError, match="found no valid layers to partition"):
        deepspeed_stage_layers(4, pp=2, method="type:attention", tied_embeddings=True)
    with pytest.raises(InputError, match="the planner reads DeepSpeed's 'type:REGEX'"):
        deepspeed_stage_layers(4, pp=2, method="parameters", tied_embeddings=True)


# --- the BLOOM records ------------------------------------------------------------------------


def test_bloom_record_is_priced_with_deepspeeds_split() -> None:
    """The production BLOOM run is read as 5 + 6 x 10 + 5 and priced as estimate prices that
    configuration (before, validate stopped at 'num_layers(70) is not divisible')."""
    records = json.loads(shared(DEEPSPEED_RUNS).read_text())
    record = next(r for r in records if r["id"] == "bloom176b_production_384gpu")
    config = config_from_record(record)
    assert (config.first_stage_layers, config.last_stage_layers) == (5, 5)
    result = validate([DEEPSPEED_RUNS], CLUSTERS)
    rows = {row.id: row for row in result.rows}
    row = rows["bloom176b_production_384gpu"]
    [run] = [r for r in load_runs_noting(DEEPSPEED_RUNS).runs if r.id == row.id]
    # BLOOM ran on Jean Zay: the A100 file's device on that machine's Omni-Path network.
    cluster = at_site(load_cluster(CLUSTERS / "dgx-a100-80gb.json"), CLUSTERS,
                      "Jean Zay").with_nodes(384 // 8)  # fmt: skip
    assert row.predicted_s == estimate(run.model, cluster, run.config).step_time_s
    assert row.family == "deepspeed" and "PP12 (first 5, last 5 layers)" in row.config
    # Every record is priced, the three that ran out of memory for their memory alone: each
    # is predicted not to fit.
    assert len(rows) == 30 and not result.skipped
    oom = [r for r in result.rows if r.measured_oom]
    assert len(oom) == 3 and all(r.measured_s is None and not r.predicted_fits for r in oom)


def test_deepspeed_search_launches_only_the_pinned_partition() -> None:
    """The DeepSpeed target's search on BLOOM's shape, pinned to the production run's TP4 PP12
    on 384 A100s, offers no split: the pinned Megatron-DeepSpeed cuts 70 blocks on 12 stages
    as 6 x 10, 5, 5 (``type:transformer``, ``gpt_model.py:463``), which first/last stage
    counts cannot hold, and BLOOM's 5 + 6 x 10 + 5 needs its fork's ``--pp-partition-method``.
    The refusal says so rather than returning a plan the export cannot launch as printed."""
    from planner import solve
    from planner.options import Pins, SolveOptions

    [run] = [r for r in load_runs_noting(shared(DEEPSPEED_RUNS)).runs
             if r.id == "bloom176b_production_384gpu"]  # fmt: skip
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json").with_nodes(48)
    options = SolveOptions(global_batch_size=2048, seq_length=2048, framework="deepspeed",
                           pins=Pins(tp=4, pp=12))  # fmt: skip
    with pytest.raises(PlannerError, match="pp"):
        solve(run.model, cluster, options)
    # The record itself keeps its fork's partition (priced in
    # test_bloom_record_is_priced_with_deepspeeds_split).
    assert (run.config.first_stage_layers, run.config.last_stage_layers) == (5, 5)


# --- going on past a record, and the exit codes -----------------------------------------------


def _records(tmp_path: Path) -> Path:
    """One good run, one malformed record, one the planner refuses (70 layers on 4 stages
    of Megatron-LM, which takes no uneven split without saying its ends)."""
    records = json.loads(shared(CALIBRATION_RUNS).read_text())
    good = next(r for r in records if r["cluster"]["num_gpus"] == 1024)
    bad = json.loads(json.dumps(good)) | {"id": "bad-layers"}
    bad["model"]["layers"] = "24"
    odd = json.loads(json.dumps(good)) | {"id": "odd-split"}
    odd["model"]["layers"] = 70  # on the run's 4 stages
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([bad, good, odd]))
    return path


def test_validate_goes_on_and_lists_each_record(tmp_path: Path) -> None:
    path = _records(tmp_path)
    done = _validate_cli("validate", path)
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    text = " ".join(done.stdout.split())
    assert "2 records left out:" in text
    assert "- bad-layers: malformed (TypeError: layers must be a number, got '24')" in text
    assert re.search(r"- odd-split: num_layers\(70\) is not divisible by pp\(4\)", text)
    result = validate([path], CLUSTERS)
    assert [row.id for row in result.rows] == [json.loads(path.read_text())[1]["id"]]


def test_nothing_priced_is_exit_2(tmp_path: Path) -> None:
    path = _records(tmp_path)
    records = json.loads(path.read_text())
    path.write_text(json.dumps([records[0], records[2]]))
    done = _validate_cli("validate", path)
    assert done.returncode == 2
    assert "- bad-layers:" in done.stdout and "- odd-split:" in done.stdout
    assert "could be priced (2 left out, each with why above)" in " ".join(done.stderr.split())
    done = _validate_cli("calibrate", path, "--gpu", "A100")
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "2 records left out (`planner validate` lists each with why), the first: bad-layers" \
        in message


def test_calibrate_fits_on_what_it_can_price(tmp_path: Path) -> None:
    fit = calibrate([_records(tmp_path)], CLUSTERS, chip="A100")
    assert fit.fit.runs == 1 and len(fit.before) == len(fit.after) == 1
    assert [line.split(":")[0] for line in fit.skipped] == ["bad-layers", "odd-split"]


def test_megatron_run_keeps_its_even_split() -> None:
    """A record without a DeepSpeed software block is read as before: no ends."""
    records = json.loads(shared(CALIBRATION_RUNS).read_text())
    config = config_from_record(records[0])
    assert isinstance(config, ParallelConfig)
    assert (config.first_stage_layers, config.last_stage_layers) == (None, None)


def test_a_file_of_something_else_is_one_line(tmp_path: Path) -> None:
    """Every record of a file left out for one reason (``param_counts.json`` holds parameter
    counts, not runs) is one line naming the file, not one per record."""
    path = tmp_path / "counts.json"
    path.write_text(json.dumps([{"model": "a", "params": 1}, {"model": "b", "params": 2}]))
    assert load_runs_noting(path).skipped == \
        ["counts.json: all 2 records: required field 'measured' is missing"]


def test_a_file_that_is_not_runs_is_listed_beside_others(tmp_path: Path) -> None:
    """Given with other files (``validate ../shared/validation/h100/*``), a file that is not
    JSON or not a list of records (a benchmark's, a cluster's) is listed with why and the rest
    is priced; given alone, it is the error (exit 2, as before)."""
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"name": "c"}))
    lines = tmp_path / "gemms.jsonl"
    lines.write_text('{"m": 1}\n{"m": 2}\n')
    good = _records(tmp_path)
    loaded = load_runs_noting(good, cluster, lines)
    assert loaded.skipped[-2:] == [
        "cluster.json: expected a JSON list of run records, got a JSON dict",
        "gemms.jsonl: invalid JSON at line 2, column 1: Extra data"]
    assert len(loaded.runs) == 2  # the good record and odd-split, which pricing refuses
    done = _validate_cli("validate", good, cluster, lines)
    assert done.returncode == 0, done.stderr
    assert "- cluster.json: expected a JSON list of run records" in done.stdout
    with pytest.raises(PlannerError, match="expected a JSON list of run records"):
        load_runs_noting(cluster)
