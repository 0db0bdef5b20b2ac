"""Plan invariants (issue 6): every method's plans keep them on bundled instances, each one
catches a plan mutated to break it, random uniform configurations keep the structural ones,
and the producers (uniform plans, the baselines, plan files) enforce them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.baselines import grid, heuristic
from planner.diagnose.compare import METHODS
from planner.errors import InputError, InvalidPlanError
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, stage_layers
from planner.plan.files import plan_from_json
from planner.plan.invariants import SHOWN, check_plan, plan_violations
from planner.plan.schema import Plan, ScheduleSpec
from planner.search import framework as enumeration
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from planner.uniform.plan import uniform_plan
from planner.uniform.space import divisors, stage_splits
from tests.conftest import CLUSTERS, MODELS

# --------------------------------------------------------------------------- real plans

INSTANCES: dict[str, tuple[str, str, int | None, SolveOptions]] = {
    # the ILP puts data parallelism inside the stage's mesh (stage dp 8)
    "llama3-8b-1node": ("llama3-8b", "dgx-h100-80gb", 1, SolveOptions()),
    # context parallelism
    "llama3-8b-16k": (
        "llama3-8b", "dgx-h100-80gb", 1, SolveOptions(seq_length=16384, global_batch_size=16),
    ),
    # 1,024 devices, pipelines, interleaving, stages with different shardings (ILP)
    "gpt3-175b": ("gpt3-175b", "dgx-a100-80gb", None, SolveOptions()),
    # experts: expert parallelism against the data-parallel and context-parallel ways (meshes
    # within a node: the same plan as two-node meshes, in a seventh of the time)
    "mixtral-2nodes": (
        "mixtral-8x7b", "dgx-h100-80gb", 2,
        SolveOptions(micro_batch_sizes=(1,), global_batch_size=64, max_mesh_nodes=1),
    ),
}  # fmt: skip
"""Bundled instances each method solves in seconds, chosen to cover what the checks count."""

Solved = Callable[[str, str], tuple[ModelSpec, Plan]]


@pytest.fixture(scope="module")
def solved() -> Solved:
    """``solved(instance, method)``: the model and the method's plan, each solved once."""
    cache: dict[tuple[str, str], tuple[ModelSpec, Plan]] = {}

    def get(instance: str, method: str) -> tuple[ModelSpec, Plan]:
        if (instance, method) not in cache:
            model_name, cluster_name, nodes, options = INSTANCES[instance]
            model = load_model(MODELS / f"{model_name}.json")
            cluster = load_cluster(CLUSTERS / f"{cluster_name}.json", nodes)
            cache[instance, method] = (model, METHODS[method](model, cluster, options))
        return cache[instance, method]

    return get


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("instance", INSTANCES)
def test_every_method_keeps_every_invariant(solved: Solved, instance: str, method: str) -> None:
    """The ILP, the grid and the heuristic return plans that break none, memory included,
    and the plan reads back from its JSON (which checks the structure again)."""
    model, plan = solved(instance, method)
    assert plan_violations(plan, model) == []
    assert check_plan(plan, model) is plan
    assert plan_from_json(plan.to_json(), source="plan.json") == plan


# --------------------------------------------------------------------------- mutations


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return load_model(MODELS / "llama3-8b.json")


@pytest.fixture(scope="module")
def node() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)


def _structural(plan: Plan) -> Plan:
    """``plan`` as a per-operator plan, without the configuration that tampering with its
    stages would also contradict (the ``configuration`` family has its own test)."""
    return plan.model_copy(update={"framework": "any", "configuration": None})


@pytest.fixture(scope="module")
def configured(llama: ModelSpec, node: ClusterSpec) -> Plan:
    """TP2 x PP2 x DP2 on one node, as ``planner estimate --out`` writes it."""
    return uniform_plan(llama, node, ParallelConfig(tp=2, pp=2, global_batch=64))


@pytest.fixture(scope="module")
def base(configured: Plan) -> Plan:
    """TP2 x PP2 x DP2 on one node: two stages of 16 layers, two replicas, ranks 0..7."""
    plan = _structural(configured)
    assert [s.ranks for s in plan.stages] == [((0, 1), (2, 3)), ((4, 5), (6, 7))]
    return plan


@pytest.fixture(scope="module")
def interleaved(llama: ModelSpec, node: ClusterSpec) -> Plan:
    """PP2 with two chunks per stage, 32 microbatches."""
    return _structural(uniform_plan(llama, node, ParallelConfig(tp=2, pp=2, vpp=2,
                                                                global_batch=64)))  # fmt: skip


def with_stage(plan: Plan, index: int, **update: Any) -> Plan:
    """``plan`` with stage ``index``'s fields replaced (no validation, as a damaged plan)."""
    stages = tuple(s.model_copy(update=update) if s.index == index else s for s in plan.stages)
    return plan.model_copy(update={"stages": stages})


def with_parallel(plan: Plan, index: int, **update: Any) -> Plan:
    """``plan`` with stage ``index``'s degrees replaced."""
    parallel = plan.stages[index].parallel.model_copy(update=update)
    return with_stage(plan, index, parallel=parallel)


def only(
    plan: Plan, family: str, model: ModelSpec | None = None, *, memory: bool = True
) -> list[str]:
    """The violations, after checking they all belong to ``family``."""
    found = plan_violations(plan, model, memory=memory)
    assert found, f"no violation found; expected {family}"
    assert all(v.startswith(f"{family}: ") for v in found), found
    return found


def test_valid_bases_break_nothing(base: Plan, interleaved: Plan, llama: ModelSpec) -> None:
    assert plan_violations(base, llama) == plan_violations(interleaved, llama) == []


def test_layers_in_exactly_one_stage(base: Plan, llama: ModelSpec) -> None:
    """A gap, an overlap, a wrong start or end, an empty range, stages out of order."""
    gap = with_stage(base, 1, layers=(18, 32))
    assert only(gap, "layers") == ["layers: stage 1 starts at layer 18, not 17 (leaves a gap)"]
    overlap = with_stage(base, 1, layers=(16, 32))
    assert "overlaps the previous stage" in only(overlap, "layers")[0]
    late = with_stage(base, 0, layers=(2, 16))
    assert only(late, "layers") == ["layers: stage 0 starts at layer 2, not 1 (leaves a gap)"]
    short = with_stage(base, 1, layers=(17, 30))
    assert plan_violations(short) == []  # without the model, the end is unknown
    assert only(short, "layers", llama) == [
        "layers: the stages end at layer 30, but llama3-8b has 32 decoder layers"
    ]
    empty = with_stage(base, 1, layers=(17, 16))
    assert "an empty range" in only(empty, "layers", llama)[0]
    swapped = base.model_copy(update={"stages": base.stages[::-1]})
    assert "stage 1 is listed at position 0" in only(swapped, "layers")[0]


def test_ranks_disjoint_and_in_the_cluster(base: Plan) -> None:
    """A rank used twice, a rank beyond the cluster, a replica's group missing."""
    twice = with_stage(base, 1, ranks=((4, 5), (6, 1)))
    assert only(twice, "ranks") == [
        "ranks: stage 1 replica 1 uses rank 1, already used by stage 0 replica 0"
    ]
    outside = with_stage(base, 1, ranks=((4, 5), (6, 8)))
    assert only(outside, "ranks") == [
        "ranks: stage 1 replica 1 uses rank 8, outside the cluster's 0..7"
    ]
    negative = with_stage(base, 0, ranks=((0, -1), (2, 3)))
    assert "uses rank -1" in only(negative, "ranks")[0]
    missing = with_stage(base, 0, ranks=((0, 1),))
    assert only(missing, "ranks") == [
        "ranks: stage 0 has 1 rank groups, not one per data-parallel replica (2)"
    ]


def test_devices_per_stage_equal_the_mesh(base: Plan) -> None:
    """Mesh, device count and rank groups agree; the replicas fit in the cluster."""
    mesh = with_stage(base, 0, mesh=(2, 2))
    assert only(mesh, "devices") == ["devices: stage 0 has mesh 2 x 2 = 4, not its 2 devices"]
    group = with_stage(base, 1, ranks=((4, 5), (6,)))
    assert only(group, "devices") == [
        "devices: stage 1 has rank groups of [1] ranks, not its 2 devices"
    ]
    small = base.cluster.model_copy(update={"devices_per_node": 4})
    crowded = base.model_copy(update={"cluster": small})
    found = plan_violations(crowded)
    assert "devices: 2 replicas x 4 devices = 8, more than the cluster's 4" in found
    assert any(v.startswith("ranks: ") and "outside the cluster's 0..3" in v for v in found)


def test_degrees_multiply_to_the_stage_devices(base: Plan) -> None:
    """tp x cp x dp is the stage's devices (Megatron's count)."""
    wider = with_parallel(base, 1, tp=4)
    assert only(wider, "degrees") == [
        "degrees: stage 1: tp(4) x cp(1) x dp(1) = 4, not its 2 devices"
    ]
    context = with_parallel(base, 0, tp=1, cp=2)
    assert plan_violations(context) == []  # same devices, counted as context parallel


def test_expert_parallel_divides_data_and_context_parallel(base: Plan, node: ClusterSpec) -> None:
    """Megatron-Core: world % (etp x ep x pp) == 0, i.e. ep | dp x cp with etp = tp."""
    mixtral = load_model(MODELS / "mixtral-8x7b.json")
    moe = _structural(uniform_plan(mixtral, node, ParallelConfig(tp=2, ep=4, global_batch=64)))
    # eight devices hold the degrees but not Mixtral's weights: memory is not the point here
    assert plan_violations(moe, mixtral, memory=False) == []
    too_wide = with_parallel(moe, 0, ep=8)
    assert only(too_wide, "degrees", memory=False) == [
        "degrees: stage 0: ep(8) does not divide data-parallel ranks(4) x cp(1) = 4"
    ]
    # context-parallel ranks count: dp 2 x cp 2 = 4 holds ep 4
    with_cp = with_parallel(moe, 0, tp=1, cp=2).model_copy(update={"data_parallel_replicas": 2})
    assert not [v for v in plan_violations(with_cp, memory=False) if "ep(" in v]
    assert "ep(4) does not divide" in only(with_parallel(base, 0, ep=4), "degrees")[0]


def test_interleaved_schedule_rules(interleaved: Plan, base: Plan) -> None:
    """Chunks divide every stage's layers, microbatches a multiple of the stages, a
    pipeline, and virtual_stages > 1 exactly when the schedule is interleaved."""
    three = interleaved.model_copy(
        update={"schedule": ScheduleSpec(name="interleaved", virtual_stages=3)}
    )
    assert only(three, "degrees") == [
        "degrees: stages of [16, 16] layers do not cut into virtual_stages(3) chunks: equal, "
        "or the embedding's and the loss's slots a layer short"
    ]
    odd = interleaved.model_copy(update={"num_microbatches": 31, "global_batch_size": 62})
    assert only(odd, "degrees") == [
        "degrees: interleaved schedule: 31 microbatches are not a multiple of the 2 stages"
    ]
    unnamed = interleaved.model_copy(
        update={"schedule": ScheduleSpec(name="1f1b", virtual_stages=2)}
    )
    assert "interleaving is exactly virtual_stages > 1" in only(unnamed, "degrees")[0]
    flat = interleaved.model_copy(update={"schedule": ScheduleSpec(name="interleaved")})
    assert "interleaving is exactly virtual_stages > 1" in only(flat, "degrees")[0]
    alone = with_stage(base, 0, layers=(1, 32)).stages[0]
    one = base.model_copy(update={"stages": (alone,), "schedule": interleaved.schedule})
    assert only(one, "degrees") == [
        "degrees: virtual_stages 2 needs a pipeline, but the plan has one stage"
    ]


def test_global_batch_is_micro_x_microbatches_x_data_parallel(base: Plan) -> None:
    """Checked on every stage: a stage that counts other data-parallel ranks breaks it."""
    bigger = base.model_copy(update={"global_batch_size": 128})
    assert only(bigger, "batch") == [
        f"batch: stage {i}: micro batch 1 x 32 microbatches x 2 data-parallel ranks = 64, "
        "not the global batch 128"
        for i in (0, 1)
    ]
    micro = base.model_copy(update={"micro_batch_size": 2})
    assert len(only(micro, "batch")) == 2
    # stage 1 claims 2 data-parallel ways in its mesh: degrees and batch both object
    halved = with_parallel(base, 1, tp=1, dp=2)
    found = plan_violations(halved)
    assert found == [
        "batch: stage 1: micro batch 1 x 32 microbatches x 4 data-parallel ranks = 128, not "
        "the global batch 64"
    ]


def test_predicted_memory_within_capacity(base: Plan) -> None:
    """Every stage and the predicted peak within the device's memory, up to float rounding."""
    capacity = base.cluster.device_memory_gib
    memory = base.stages[1].memory
    over = with_stage(base, 1, memory=memory.model_copy(
        update={"other_gib": memory.other_gib + capacity - memory.total_gib + 0.5}))  # fmt: skip
    assert only(over, "memory") == [
        f"memory: stage 1 needs {capacity + 0.5:.3f} GiB per device, more than the "
        f"{capacity:g} GiB a device has"
    ]
    assert plan_violations(over, memory=False) == []
    other = memory.other_gib + capacity * (1 + 1e-12) - memory.total_gib
    rounding = with_stage(base, 1, memory=memory.model_copy(update={"other_gib": other}))
    assert plan_violations(rounding) == []
    predicted = base.predicted.model_copy(update={"peak_memory_gib": capacity + 1})
    peak = base.model_copy(update={"predicted": predicted})
    assert only(peak, "memory") == [
        f"memory: the predicted peak {capacity + 1:.3f} GiB is more than the {capacity:g} GiB "
        "a device has"
    ]


def test_check_plan_lists_the_first_violations_and_counts_them(base: Plan) -> None:
    """Five quoted, in family order, and the rest counted."""
    broken = base.model_copy(update={"global_batch_size": 128, "micro_batch_size": 3})
    broken = with_stage(broken, 0, mesh=(4, 4), ranks=((0, 1), (2, 9)))
    broken = with_parallel(broken, 1, tp=8)
    found = plan_violations(broken)
    assert [v.split(":")[0] for v in found] == ["ranks", "devices", "degrees", "batch", "batch"]
    tail = with_stage(broken, 1, layers=(18, 32))
    with pytest.raises(
        InvalidPlanError,
        match=r"^uniform plan of llama3-8b on 1 x 8 devices "
        r"breaks 6 invariants: layers: stage 1 starts at layer 18.*; "
        r"devices: .*; and 1 more$",
    ):
        check_plan(tail)  # fmt: skip
    assert SHOWN == 5


# --------------------------------------------------------------------------- producers


def test_plan_file_breaking_an_invariant_is_an_input_error(base: Plan) -> None:
    """A damaged or hand-edited file names itself and the invariant; memory is not checked
    on reading (``planner estimate --out`` may write a configuration that does not fit)."""
    damaged = with_stage(base, 1, ranks=((4, 5), (6, 1))).to_json()
    with pytest.raises(
        InputError,
        match=r"^p\.json: damaged or hand-edited plan: .*ranks: "
        r"stage 1 replica 1 uses rank 1",
    ):
        plan_from_json(damaged, source="p.json")  # fmt: skip
    predicted = base.predicted.model_copy(update={"peak_memory_gib": 1000.0})
    over = base.model_copy(update={"predicted": predicted})
    assert plan_from_json(over.to_json()) == over


def test_uniform_plan_keeps_structure_but_may_exceed_memory(node: ClusterSpec) -> None:
    """``estimate --out`` writes what was asked: a configuration over memory is a plan, with
    only the memory invariant broken."""
    gpt3 = load_model(MODELS / "gpt3-175b.json")
    plan = uniform_plan(gpt3, node, ParallelConfig(tp=8, global_batch=8, seq_len=2048))
    found = plan_violations(plan, gpt3)
    assert found and all(v.startswith("memory: ") for v in found)


def test_baselines_check_the_plan_they_return(
    monkeypatch: pytest.MonkeyPatch, llama: ModelSpec, node: ClusterSpec
) -> None:
    """A uniform plan that does not fit (here: its memory inflated) is not returned."""

    def inflated(*args: Any, **kwargs: Any) -> Plan:
        plan = uniform_plan(*args, **kwargs)
        predicted = plan.predicted.model_copy(update={"peak_memory_gib": 1000.0})
        return plan.model_copy(update={"predicted": predicted})

    options = SolveOptions(global_batch_size=64)
    for module, planner in ((heuristic, heuristic.heuristic_plan),
                           (enumeration, grid.grid_plan)):
        monkeypatch.setattr(module, "uniform_plan", inflated)
        with pytest.raises(InvalidPlanError, match=r"memory: the predicted peak 1000\.000 GiB"):
            planner(llama, node, options)


# --------------------------------------------------------------------------- property

SMALL_MODELS = [load_model(MODELS / f"{name}.json") for name in ("gpt-3.6b", "mixtral-8x7b")]
"""30 layers (uneven end stages at PP 4, 8, 16) and a mixture of experts."""
H100 = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
RANK_ORDERS = ("tp-cp-ep-dp-pp", "cp-ep-dp-tp-pp", "tp-pp-cp-ep-dp", "pp-tp-cp-ep-dp")


@st.composite
def uniform_configs(draw: st.DrawFn) -> tuple[ModelSpec, ClusterSpec, ParallelConfig]:
    """A uniform configuration that divides: degrees from the devices, the batch from the
    data-parallel ways, uneven end stages sometimes, interleaving where it divides."""
    model = draw(st.sampled_from(SMALL_MODELS))
    nodes = draw(st.sampled_from((1, 2, 4)))
    cluster = H100.model_copy(update={"num_nodes": nodes})
    n = cluster.num_devices
    heads = model.num_attention_heads
    groups = heads if model.mla else model.query_groups
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and groups % t == 0]))
    cp = draw(st.sampled_from([c for c in (1, 2) if n % (tp * c) == 0]))
    pps = [p for p in divisors(n // (tp * cp)) if stage_splits(model.num_layers, p)]
    pp = draw(st.sampled_from(pps))
    split = draw(st.sampled_from(stage_splits(model.num_layers, pp)))
    layers = stage_layers(model.num_layers, pp=pp, first=split[0], last=split[1])
    dp = n // (tp * cp * pp)
    experts = model.moe.num_experts if model.moe else 1
    ep = draw(st.sampled_from([e for e in divisors(experts) if (dp * cp) % e == 0]))
    vpps = [v for v in range(1, min(layers) + 1) if all(k % v == 0 for k in layers)]
    vpp = draw(st.sampled_from(vpps if pp > 1 else [1]))
    mbs = draw(st.sampled_from((1, 2)))
    microbatches = draw(st.integers(1, 4)) * (pp if vpp > 1 else 1)
    config = ParallelConfig(
        tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, sp=tp > 1 and draw(st.booleans()),
        first_stage_layers=split[0], last_stage_layers=split[1],
        global_batch=mbs * dp * microbatches, seq_len=2048,
        recompute=draw(st.sampled_from(("none", "selective", "full"))),
        zero=draw(st.sampled_from((0, 1, 2, 3) if pp == 1 else (0, 1))),
        rank_order=draw(st.sampled_from(RANK_ORDERS)),
    )  # fmt: skip
    return model, cluster, config


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uniform_configs())
def test_random_uniform_plans_keep_the_structural_invariants(
    case: tuple[ModelSpec, ClusterSpec, ParallelConfig],
) -> None:
    """Any configuration that divides gives a plan on every device once, with only memory
    left to break, and broken exactly when the estimate says it does not fit."""
    model, cluster, config = case
    plan = uniform_plan(model, cluster, config)
    found = plan_violations(plan, model)
    assert all(v.startswith("memory: ") for v in found), found
    peak = estimate(model, cluster, config).peak_memory_gib
    assert bool(found) == (peak > cluster.device.memory_gib * (1 + 1e-9))
    used = sorted(r for s in plan.stages for g in s.ranks for r in g)
    assert used == list(range(cluster.num_devices))


def test_a_plan_is_its_configuration(configured: Plan) -> None:
    """A uniform plan whose stages no longer match the configuration it carries (what an
    export would launch) is refused, and so is a per-operator plan that carries one; a uniform
    plan made for ``any`` keeps its configuration."""
    base = configured
    assert base.configuration is not None
    tampered = with_stage(base, 0, parallel=base.stages[0].parallel.model_copy(
        update={"recompute": "full"}))  # fmt: skip
    assert only(tampered, "configuration") == [
        f"configuration: stage 0 runs {{'tp': {base.configuration.tp}, 'cp': 1, 'ep': 1, "
        f"'sp': {base.stages[0].parallel.sp}, 'zero': {base.configuration.zero}, "
        f"'recompute': 'full'}}, not {{'tp': {base.configuration.tp}, 'cp': 1, 'ep': 1, "
        f"'sp': {base.stages[0].parallel.sp}, 'zero': {base.configuration.zero}, "
        f"'recompute': '{base.configuration.recompute}'}}"]
    assert only(base.model_copy(update={"method": "ilp", "framework": "any"}),
                "configuration") == [
        "configuration: a per-operator plan (method ilp) carries a configuration"]
    assert plan_violations(base.model_copy(update={"framework": "any"})) == []
