"""``planner.solve``: the properties every plan must have, known answers (Megatron's published
GPT-3 configuration as the bar to clear), agreement with ``planner estimate`` where both price
the same sharding, and determinism."""

from __future__ import annotations

import pytest

import planner
from planner.errors import InfeasibleError
from planner.options import Pins, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.plan.files import plan_from_json
from planner.plan.schema import Plan
from planner.search.per_operator import candidates, solve_per_operator
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster
from planner.uniform.estimate import estimate
from tests.conftest import CLUSTERS, MODELS

GPT3_RUN = SolveOptions(global_batch_size=1536, seq_length=2048)


@pytest.fixture(scope="module")
def gpt3_plan(a100: planner.ClusterSpec) -> Plan:
    """GPT-3 175B on 1,024 A100 (128 nodes), Megatron's published batch and sequence."""
    return solve_per_operator(planner.load_model(MODELS / "gpt3-175b.json"), a100, GPT3_RUN)


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    """Llama 3 8B on one DGX H100."""
    return solve_per_operator(planner.load_model(MODELS / "llama3-8b.json"),
                 load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1))  # fmt: skip


@pytest.mark.parametrize("name", ["gpt3_plan", "small_plan"])
def test_plan_is_valid(name: str, request: pytest.FixtureRequest) -> None:
    """Stages hold consecutive layers covering the model; ranks cover every device exactly
    once; every stage fits the device; the global batch is microbatch x microbatches x data
    parallel ways; the plan round-trips through JSON."""
    plan: Plan = request.getfixturevalue(name)
    assert plan.stages[0].layers[0] == 1
    for before, after in zip(plan.stages, plan.stages[1:], strict=False):
        assert after.layers[0] == before.layers[1] + 1
    num_layers = plan.stages[-1].layers[1]
    assert plan.num_layers == num_layers
    ranks = [r for s in plan.stages for replica in s.ranks for r in replica]
    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    assert sorted(ranks) == list(range(devices))
    device = load_cluster(CLUSTERS / f"{plan.cluster.name}.json").device
    assert all(s.memory.total_gib <= device.memory_gib for s in plan.stages)
    assert plan.predicted.peak_memory_gib == pytest.approx(
        max(s.memory.total_gib for s in plan.stages)
    )
    dp = plan.data_parallel_replicas * plan.stages[0].parallel.dp
    assert plan.micro_batch_size * plan.num_microbatches * dp == plan.global_batch_size
    assert plan_from_json(plan.to_json()) == plan
    # Each stage lists the shardings of what it holds: the embedding first, the head last.
    for i, stage in enumerate(plan.stages):
        kinds = {name.split(".")[0] for name in stage.op_shardings}
        assert ("embedding" in kinds) == (i == 0)
        assert ("head" in kinds) == (i == len(plan.stages) - 1)


def test_beats_megatrons_published_gpt3_configuration(
    gpt3_plan: Plan, a100: planner.ClusterSpec
) -> None:
    """Narayanan et al. (SC'21) trained GPT-3 175B on 1,024 A100 with TP8 PP16 DP8, mbs 1.
    Priced by the same cost model with the same overlap flags and the distributed optimizer,
    the search's plan is no slower."""
    published = estimate(planner.load_model(MODELS / "gpt3-175b.json"), a100, ParallelConfig(
        tp=8, pp=16, sp=True, zero=1, global_batch=1536, seq_len=2048,
        overlap_grad_reduce=True, overlap_param_gather=True,
    ))  # fmt: skip
    assert published.fits
    assert gpt3_plan.predicted.step_time_s <= published.step_time_s
    assert gpt3_plan.solver.status == "optimal"
    assert gpt3_plan.solver.ilp_count > 0 and gpt3_plan.solver.cache_hits > 0


def test_agrees_with_estimate_on_a_megatron_plan(small_plan: Plan) -> None:
    """When the plan is one ``planner estimate`` can express, both price it the same way to
    within the difference of their sharding models (the ILP prices layout conversions, the
    estimate Megatron's fixed collectives): 2 %."""
    p = small_plan.uniform
    assert p is not None
    config = ParallelConfig(
        tp=p.tp, pp=len(small_plan.stages), dp=small_plan.data_parallel_replicas * p.dp,
        cp=p.cp, ep=p.ep, sp=p.sp, mbs=small_plan.micro_batch_size, zero=p.zero,
        recompute=p.recompute, overlap_grad_reduce=True, overlap_param_gather=True,
    )  # fmt: skip
    priced = estimate(planner.load_model(MODELS / "llama3-8b.json"),
                      load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1), config)  # fmt: skip
    assert small_plan.predicted.step_time_s == pytest.approx(priced.step_time_s, rel=0.02)
    assert small_plan.predicted.peak_memory_gib == pytest.approx(priced.peak_memory_gib,
                                                                 rel=0.02)  # fmt: skip


def test_same_inputs_same_plan(small_plan: Plan) -> None:
    """Deterministic: solving again gives the same plan, byte for byte but the wall time."""
    again = solve_per_operator(planner.load_model(MODELS / "llama3-8b.json"),
                  load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1))  # fmt: skip

    def without_time(plan: Plan) -> str:
        return plan.model_copy(update={"solver": plan.solver.model_copy(
            update={"time_s": 0.0})}).to_json()  # fmt: skip

    assert without_time(again) == without_time(small_plan)


def test_progress_is_reported(a100: planner.ClusterSpec) -> None:
    """The callback hears after every candidate, ends at the total, and the best step only
    improves."""
    seen = []
    model = planner.load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 1)
    plan = solve_per_operator(model, cluster, SolveOptions(micro_batch_sizes=(1, 2)),
                              progress=seen.append)
    assert seen[-1].done == seen[-1].total
    bests = [p.best_step_s for p in seen if p.best_step_s is not None]
    assert bests == sorted(bests, reverse=True)
    assert bests[-1] == pytest.approx(plan.predicted.step_time_s)


def test_candidates_are_sorted_by_their_lower_bound(a100: planner.ClusterSpec) -> None:
    """The outer loop visits the cheapest bound first, and every candidate divides the
    cluster: replicas x stages x mesh = devices, microbatches x replicas x microbatch = batch."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    todo = candidates(model, a100, training_of(model, GPT3_RUN), GPT3_RUN)
    assert [c.lower_bound_s for c in todo] == sorted(c.lower_bound_s for c in todo)
    for c in todo:
        assert c.replicas * c.num_stages * c.mesh[0] * c.mesh[1] == a100.num_devices
        assert c.num_microbatches * c.replicas * c.mesh_micro_batch_size == 1536
        assert c.num_stages <= model.num_layers


def test_nothing_fits_names_the_least_memory_any_plan_needs() -> None:
    """Llama 3 70B at 8k tokens cannot train on one H100 node. The error names the least
    memory per device a plan of the search needs, and that number is exact: a device with
    0.1 GiB more holds the search's plan, one with 0.1 GiB less holds none. It is above
    Megatron's 18 bytes of state per parameter sharded over the 8 devices (70.6B x 18 / 8 =
    148 GiB), and the error says how many nodes would do."""
    import re

    model = planner.load_model(MODELS / "llama3-70b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
    exact = SolveOptions(memory_margin_gib=0.0, framework="any")
    with pytest.raises(InfeasibleError, match="no plan of the ILP search fits llama3-70b") as e:
        solve_per_operator(model, cluster, exact)
    found = re.search(r"needs ([0-9.]+) GiB per device", str(e.value))
    assert found is not None
    need = float(found.group(1))
    assert need > 70.6e9 * 18 / 8 / 2**30
    assert re.search(r"on \d+ nodes", str(e.value))

    def with_memory(gib: float) -> ClusterSpec:
        return cluster.model_copy(update={"device": cluster.device.model_copy(
            update={"memory_gib": gib})})  # fmt: skip

    plan = solve_per_operator(model, with_memory(need + 0.1), exact)
    assert need - 0.05 <= plan.predicted.peak_memory_gib <= need + 0.1
    with pytest.raises(InfeasibleError):
        solve_per_operator(model, with_memory(need - 0.1), exact)


def test_sequence_longer_than_learned_positions_is_refused() -> None:
    """GPT-2 has 1,024 learned positions: a 4,096-token run is refused before any search,
    as ``planner estimate`` refuses it."""
    from planner.errors import ConfigError
    from tests.conftest import HF, shared

    with pytest.raises(ConfigError, match=r"seq_len\(4096\) > max_position_embeddings\(1024\)"):
        solve_per_operator(planner.load_model(shared(HF / "gpt2.config.json")),
              load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1),
              SolveOptions(seq_length=4096, global_batch_size=64))  # fmt: skip


def test_stages_may_split_the_batch_differently() -> None:
    """A per-operator plan may give its stages different data-parallel ways (here, with the
    pipeline pinned to 2 stages of interleaved chunks, one stage splits the batch and the
    other the hidden dim): the plan is valid, every stage's ways divide the pipeline's
    microbatch, and the batch adds up over the replicas (this failed the batch invariant).
    Context parallelism is pinned off: splitting the sequence instead of the batch ties."""
    model = planner.load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
    options = SolveOptions(framework="any", pins=Pins(pp=2, vpp=2, cp=1))
    plan = solve_per_operator(model, cluster, options)
    mesh_micro = plan.micro_batch_size * plan.stages[0].parallel.dp
    assert len({s.parallel.dp for s in plan.stages}) == 2
    assert all(mesh_micro % s.parallel.dp == 0 for s in plan.stages)
    assert (mesh_micro * plan.num_microbatches * plan.data_parallel_replicas
            == plan.global_batch_size)  # fmt: skip
