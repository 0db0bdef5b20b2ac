"""The Plan: JSON round trip, schema version, one-line summary, Megatron's rank order."""

from __future__ import annotations

import json

import pytest

import planner
from planner.plan.files import plan_from_json
from planner.plan.schema import SCHEMA_VERSION, Plan
from planner.uniform.plan import megatron_ranks, uniform_plan
from tests.conftest import MODELS, REPO


@pytest.fixture(scope="module")
def plan(a100: planner.ClusterSpec) -> Plan:
    model = planner.load_model(MODELS / "gpt3-175b.json")
    config = planner.ParallelConfig(tp=8, pp=16, sp=True, recompute="selective", zero=1)
    return uniform_plan(model, a100, config)


def test_round_trip_is_exact(plan: Plan) -> None:
    """to_json then from_json gives the same plan, and to_json is canonical (sorted keys)."""
    text = plan.to_json()
    assert plan_from_json(text) == plan
    assert plan_from_json(text).to_json() == text
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_unknown_schema_version_is_refused(plan: Plan) -> None:
    """A plan from another planner version is an InputError naming the version."""
    for version in (1, SCHEMA_VERSION + 1):
        data = json.loads(plan.to_json()) | {"schema_version": version}
        with pytest.raises(planner.InputError, match=f"schema_version {version} is not"):
            plan_from_json(json.dumps(data), source="p.json")


def test_malformed_plan_names_the_field(plan: Plan) -> None:
    """A stage whose mesh does not multiply to its devices is refused with the arithmetic."""
    data = json.loads(plan.to_json())
    data["stages"][0]["mesh"] = [2, 2]
    with pytest.raises(planner.InputError, match=r"p.json: stages.0: .*mesh"):
        plan_from_json(json.dumps(data), source="p.json")


def test_summary_reads_like_a_user_would_say_it(plan: Plan) -> None:
    """GPT-3's published shape in one line."""
    assert plan.summary() == ("TP8 x PP16 x DP8, mbs 1, 1F1B, sequence parallel, "
                              "selective recompute, distributed optimizer")  # fmt: skip


@pytest.mark.parametrize(("pp", "vpp", "said"), [
    (1, 1, "full recompute of 3 of 96 layers"),
    (16, 1, "full recompute of 3 layers per stage"),
    (16, 2, "full recompute of 3 layers per chunk"),
])
def test_summary_counts_recomputed_layers_as_megatron_does(
        a100: planner.ClusterSpec, pp: int, vpp: int, said: str) -> None:  # fmt: skip
    """``--recompute-num-layers`` counts per model chunk: per stage without interleaving, and
    of all the layers without a pipeline, where "per chunk" would say nothing."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    config = planner.ParallelConfig(tp=8, pp=pp, vpp=vpp, sp=True, recompute="full",
                                    recompute_layers=3, zero=1)  # fmt: skip
    assert f", {said}," in uniform_plan(model, a100, config).summary()


def test_plan_agrees_with_estimate(plan: Plan, a100: planner.ClusterSpec) -> None:
    """The uniform plan carries estimate's numbers; 16 stages of 6 layers cover all 96."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    config = planner.ParallelConfig(tp=8, pp=16, sp=True, recompute="selective", zero=1)
    assert plan.predicted.step_time_s == planner.estimate(model, a100, config).step_time_s
    assert [s.layers for s in plan.stages][:2] == [(1, 6), (7, 12)]
    assert plan.num_layers == 96 and plan.data_parallel_replicas == 8


def test_megatron_rank_order() -> None:
    """tp-cp-dp-pp: a stage's replicas are adjacent blocks; stages are dp*tp*cp apart; every
    rank appears once."""
    ranks = megatron_ranks(tp=4, cp=2, dp=3, pp=2)
    flat = [r for stage in ranks for replica in stage for r in replica]
    assert sorted(flat) == list(range(48))
    assert ranks[0][1] == list(range(8, 16))
    assert ranks[1][0][0] == 24


def test_schema_2_plans_read_as_plans_for_any(plan: Plan) -> None:
    """A plan written before framework targets reads back as a per-operator plan (framework
    ``any``, no configuration), which exports refuse rather than guess."""
    data = json.loads(plan.to_json())
    for key in ("framework", "configuration", "memory_margin_gib"):
        data.pop(key)
    old = plan_from_json(json.dumps(data | {"schema_version": 2}), source="p.json")
    assert (old.schema_version, old.framework, old.configuration) == (SCHEMA_VERSION, "any",
                                                                      None)


def test_schema_5_plans_read_with_the_bubble_as_a_share_of_the_step(
    a100: planner.ClusterSpec,
) -> None:
    """Schema 5 stored the bubble over the busy time: GPT-3 on PP16 with 8 microbatches
    wrote 1.8 (180 %) beside a breakdown whose bubble is 55 % of the step. Read back, it is
    the share of the step, the number estimate, simulate and the table print."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    config = planner.ParallelConfig(tp=8, pp=16, recompute="full", global_batch=64)
    new = uniform_plan(model, a100, config)
    time, step_s = new.predicted.time, new.predicted.step_time_s
    assert new.num_microbatches == 8
    assert new.predicted.bubble_fraction == time.pipeline_bubble_s / step_s
    assert 0.5 < new.predicted.bubble_fraction < 1
    data = json.loads(new.to_json())
    busy_s = step_s - time.pipeline_bubble_s - time.data_parallel_comm_exposed_s - time.optimizer_s
    data["predicted"]["bubble_fraction"] = time.pipeline_bubble_s / busy_s
    assert data["predicted"]["bubble_fraction"] > 1  # what schema 5 wrote
    old = plan_from_json(json.dumps(data | {"schema_version": 5}), source="p.json")
    assert old == new


def _schema_3(plan: Plan) -> dict:
    """``plan`` as schema 3 wrote it: breakdowns without units in their keys, ``zero_stage``."""
    data = json.loads(plan.to_json())

    def bare(part: dict, unit: str) -> dict:
        return {key.removesuffix(unit): value for key, value in part.items()}

    for stage in data["stages"]:
        stage["memory_gib"] = bare(stage.pop("memory"), "_gib")
        stage["time_s"] = bare(stage.pop("time"), "_s")
        stage["parallel"]["zero_stage"] = stage["parallel"].pop("zero")
    data["predicted"]["time_s"] = bare(data["predicted"].pop("time"), "_s")
    return data | {"schema_version": 3}


def test_schema_3_plans_read_with_units_in_their_names(plan: Plan) -> None:
    """Schema 4 put units in the breakdowns' keys (``weights_gib``, ``compute_s``) and named
    the ZeRO stage ``zero``; a schema-3 file reads back as the same plan."""
    old = _schema_3(plan)
    assert "weights" in old["stages"][0]["memory_gib"]
    assert plan_from_json(json.dumps(old), source="p.json") == plan


def test_bundled_schema_3_plan_reads() -> None:
    """The schema-3 plan kept in tests/ (written by an earlier version) still reads, and its
    breakdowns add up to what it predicts."""
    path = REPO / "tests" / "fuzz_plan_uniform.json"
    text = path.read_text()
    assert json.loads(text)["schema_version"] == 3
    read = plan_from_json(text, source=str(path))
    stage = read.stages[0]
    assert stage.memory.total_gib > stage.memory.weights_gib > 0
    assert sum(read.predicted.time.model_dump().values()) == pytest.approx(
        read.predicted.step_time_s)

