"""The baselines: the grid against brute force over its own space (uneven first and last
stages included), the heuristic against its written rule (Megatron's GPT-3 175B answer: TP 8
inside a node; Llama 3.1 405B's uneven stages), the grid never slower than the heuristic, the
configurations each prices, and one clear error when nothing fits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from planner.baselines import grid_plan, grid_space, heuristic, heuristic_plan
from planner.baselines.heuristic import heuristic_candidates, layouts
from planner.errors import ConfigError, InfeasibleError
from planner.options import Pins, Progress, SolveOptions, training_of
from planner.plan.config import ParallelConfig, resolve, stage_layers
from planner.plan.schema import Plan, StageParallel
from planner.search import framework as enumeration
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import Estimate, estimate
from planner.uniform.groups import tp_degrees
from planner.uniform.plan import uniform_plan
from planner.uniform.space import config_key, run_config, stage_splits
from planner.vocabulary import GIB
from tests.conftest import CLUSTERS, MODELS

GPT3_RUN = SolveOptions(global_batch_size=1536, seq_length=2048)
"""Megatron's published GPT-3 175B run (Narayanan et al. 2021, Table 1)."""
SMALL_405B_RUN = SolveOptions(global_batch_size=64, seq_length=4096)
"""Llama 3.1 405B on 32 nodes, small enough to price the grid's whole space in a second."""


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return load_model(MODELS / "llama3-8b.json")


@pytest.fixture(scope="module")
def gpt3() -> ModelSpec:
    return load_model(MODELS / "gpt3-175b.json")


@pytest.fixture(scope="module")
def h100_node() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)


@pytest.fixture(scope="module")
def a100_128() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-a100-80gb.json", 128)


@pytest.fixture(scope="module")
def llama405b() -> ModelSpec:
    return load_model(MODELS / "llama3.1-405b.json")


@pytest.fixture(scope="module")
def h100_32() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json", 32)


@pytest.fixture(scope="module")
def plans(
    llama: ModelSpec, gpt3: ModelSpec, h100_node: ClusterSpec, a100_128: ClusterSpec
) -> dict[tuple[str, str], Plan]:
    """(case, method) -> plan, for Llama 3 8B on one DGX H100 and GPT-3 on 1,024 A100."""
    cases = {"llama3-8b": (llama, h100_node, SolveOptions()),
             "gpt3-175b": (gpt3, a100_128, GPT3_RUN)}  # fmt: skip
    return {(case, name): method(model, cluster, options)
            for case, (model, cluster, options) in cases.items()
            for name, method in (("grid", grid_plan), ("heuristic", heuristic_plan))}  # fmt: skip


def _brute_force(model: ModelSpec, cluster: ClusterSpec, options: SolveOptions) -> ParallelConfig:
    """Every configuration of the grid's space priced, no pruning."""
    best: tuple[float, tuple[int, ...], ParallelConfig] | None = None
    for config in grid_space(model, cluster, options):
        try:
            result = estimate(model, cluster, config)
        except ConfigError:
            continue
        key = (result.step_time_s, config_key(config), config)
        fits = result.peak_memory_gib * GIB <= cluster.device.memory_bytes - options.margin_bytes(
            cluster.device, "megatron-te")  # fmt: skip
        if fits and (best is None or key[:2] < best[:2]):
            best = key
    assert best is not None
    return best[2]


def test_grid_is_the_brute_force_minimum(
    llama: ModelSpec, h100_node: ClusterSpec, plans: dict[tuple[str, str], Plan]
) -> None:
    """With its pruning, the grid returns exactly the least step time over its whole space
    (ties to the simplest configuration), priced as ``uniform_plan`` prices it."""
    plan = plans["llama3-8b", "grid"]
    best = _brute_force(llama, h100_node, SolveOptions())
    margin = SolveOptions().margin_bytes(h100_node.device, "megatron-te") / GIB
    expected = uniform_plan(llama, h100_node, best, method="grid", memory_margin_gib=margin)
    assert plan.model_copy(update={"solver": expected.solver}) == expected
    assert plan.solver.status == "optimal"
    assert plan.solver.objective == plan.predicted.step_time_s


def test_grid_is_the_brute_force_minimum_with_uneven_stages(
    llama405b: ModelSpec, h100_32: ClusterSpec
) -> None:
    """Llama 3.1 405B (126 layers) on 256 H100: the pipeline degrees 4 to 64 do not divide the
    layers, so half the space has uneven first and last stages; the pruned grid still returns
    the brute-force minimum, TP8 PP32 with 3 + 4 x 30 + 3 layers interleaved 4 ways (the
    embedding and the loss each a layer's slot, Megatron-Core's
    ``--account-for-embedding-in-pipeline-split``, as Meta's PP16 split of 7 + 8 x 14 + 7
    is on 16 stages)."""
    plan = grid_plan(llama405b, h100_32, SMALL_405B_RUN)
    best = _brute_force(llama405b, h100_32, SMALL_405B_RUN)
    margin = SMALL_405B_RUN.margin_bytes(h100_32.device, "megatron-te") / GIB
    expected = uniform_plan(llama405b, h100_32, best, method="grid", memory_margin_gib=margin)
    assert plan.model_copy(update={"solver": expected.solver}) == expected
    assert [s.num_layers for s in plan.stages] == [3, *[4] * 30, 3]
    assert plan.uniform is not None and plan.uniform.tp == 8
    assert plan.schedule.virtual_stages == 4


def test_stage_splits_known_answers() -> None:
    """Megatron's equal ends where the remainder allows (Llama 3.1 405B on PP16 as Meta
    trained it), ends one apart either way round where it does not (DeepSeek-V3's 61 layers),
    the middle one layer heavier as the alternative (also where equal stages are possible, after
    them: DeepSeek-V2's 60 layers on PP4 cut into two chunks only as 14 + 16 x 2 + 14), and
    nothing when the ends would be empty."""
    assert stage_splits(126, 16) == [(7, 7)]
    assert stage_layers(126, pp=16, first=7, last=7) == (7, *[8] * 14, 7)
    assert stage_splits(61, 16) == [(2, 3), (3, 2)]
    assert stage_splits(126, 4) == [(31, 31), (30, 30)]
    assert stage_splits(61, 2) == [(30, 31), (31, 30)]
    assert stage_splits(126, 48) == [] and stage_splits(32, 33) == []
    assert stage_splits(96, 8) == [(None, None), (9, 9)]
    assert stage_splits(60, 4) == [(None, None), (14, 14)]
    assert stage_splits(96, 16) == stage_splits(64, 2) == stage_splits(64, 1) == [(None, None)]


@pytest.mark.parametrize("num_layers", range(2, 70))
def test_stage_splits_are_megatron_splits(num_layers: int) -> None:
    """Every split covers the layers, gives every stage one at least, never puts more on an
    end than in the middle, keeps the busiest stage within one layer of the least possible,
    and is at most four per degree."""
    for pp in range(2, num_layers + 1):
        splits = stage_splits(num_layers, pp)
        assert len(splits) <= 4 and len(set(splits)) == len(splits)
        least = -(-num_layers // pp)
        if num_layers % pp == 0:  # equal stages first, said once (not also as their ends)
            assert splits[0] == (None, None) and (least, least) not in splits
        for split in splits:
            layers = stage_layers(num_layers, pp=pp, first=split[0], last=split[1])
            assert len(layers) == pp and sum(layers) == num_layers and min(layers) >= 1
            assert max(layers) in (least, least + 1)
            assert max(layers[0], layers[-1]) <= max(layers)


def test_grid_splits_resolve_as_megatron_does(llama405b: ModelSpec, h100_32: ClusterSpec) -> None:
    """``resolve`` accepts every configuration of the grid's space, uneven stages with
    interleaving and context parallelism included, and lays the layers out as the grid
    meant."""
    space = grid_space(llama405b, h100_32)
    uneven = [c for c in space if c.first_stage_layers is not None]
    assert {c.pp for c in uneven} == {4, 8, 16, 32, 64}
    assert {c.cp for c in uneven} == {1, 2, 4, 8} and max(c.vpp for c in uneven) > 1
    for config in space:
        layers = stage_layers(llama405b.num_layers, pp=config.pp,
                              first=config.first_stage_layers, last=config.last_stage_layers)
        assert resolve(llama405b, h100_32, config).stage_layers == layers


def _counting(monkeypatch: pytest.MonkeyPatch, module: object) -> dict[str, int]:
    """Count the ``estimate`` calls of ``module`` and those that returned a price."""
    counts = {"calls": 0, "priced": 0}

    def counted(*args: object, **kwargs: object) -> Estimate:
        counts["calls"] += 1
        result = estimate(*args, **kwargs)  # type: ignore[arg-type]
        counts["priced"] += 1
        return result

    monkeypatch.setattr(module, "estimate", counted)
    return counts


def test_heuristic_counts_the_estimates(
    llama405b: ModelSpec, h100_32: ClusterSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heuristic's ``solver.configurations`` is the number of configurations ``estimate``
    priced (not those it refused)."""
    counts = _counting(monkeypatch, heuristic)
    plan = heuristic_plan(llama405b, h100_32, SMALL_405B_RUN)
    assert plan.solver.configurations == counts["priced"] > 0
    assert plan.solver.time_s > 0


def test_grid_counts_what_divides(
    llama405b: ModelSpec, h100_32: ClusterSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grid prices its whole space in batches, each configuration once, and beside each
    fitting full recomputation its fewest recomputed layers that fit: its
    ``solver.configurations`` is the number that divide, refusals not counted."""
    seen: list[ParallelConfig] = []
    batch = enumeration.estimate_batch

    def counted(model: ModelSpec, cluster: ClusterSpec, configs: list[ParallelConfig]):
        seen.extend(configs)
        return batch(model, cluster, configs)

    monkeypatch.setattr(enumeration, "estimate_batch", counted)
    plan = grid_plan(llama405b, h100_32, SMALL_405B_RUN)
    space = grid_space(llama405b, h100_32, SMALL_405B_RUN)
    fewer = [c for c in seen if c.recompute_layers is not None]
    seen = [c for c in seen if c.recompute_layers is None]
    assert sorted(map(config_key, seen)) == sorted(map(config_key, space))
    assert len(set(seen)) == len(seen) == len(space)
    assert {c.model_copy(update={"recompute_layers": None}) for c in fewer} <= set(space)
    divides = 0
    for config in space:
        try:
            estimate(llama405b, h100_32, config)
        except ConfigError:
            continue
        divides += 1
    assert plan.solver.configurations == divides + len(fewer) < len(space)


@pytest.mark.parametrize("case", ["llama3-8b", "gpt3-175b"])
def test_grid_is_never_slower_than_the_heuristic(
    case: str, plans: dict[tuple[str, str], Plan]
) -> None:
    """The heuristic's configuration is one point of the grid's space, so the grid's least
    step time cannot be above it."""
    grid, heuristic = plans[case, "grid"], plans[case, "heuristic"]
    assert grid.predicted.step_time_s <= heuristic.predicted.step_time_s
    assert (grid.method, heuristic.method) == ("grid", "heuristic")


@pytest.mark.parametrize(
    ("name", "nodes"),
    [("llama3-8b", 1), ("mixtral-8x7b", 4), ("deepseek-v3", 8), ("llama3.1-405b", 32)],
)
def test_heuristic_candidates_lie_in_the_grid_space(name: str, nodes: int) -> None:
    """Every configuration the rule tries is one of the uniform space the grid prices
    (framework ``any``: the whole space), uneven stages and expert parallelism included: the
    rule orders the space's degrees, it does not derive its own."""
    model = load_model(MODELS / f"{name}.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes)
    options = SolveOptions(framework="any")
    space = set(grid_space(model, cluster, options))
    tried = list(heuristic_candidates(model, cluster, training=training_of(model, options),
                                      options=options))
    assert tried and set(tried) <= space
    assert (model.moe is None) == all(c.ep == 1 for c in tried)
    # 126 and 61 layers: the deep pipelines the rule climbs to have uneven ends
    uneven = any(c.first_stage_layers is not None for c in tried)
    assert uneven == (name in ("deepseek-v3", "llama3.1-405b"))


def test_heuristic_gpt3_follows_megatron(
    gpt3: ModelSpec, a100_128: ClusterSpec, plans: dict[tuple[str, str], Plan]
) -> None:
    """GPT-3 175B on 128 DGX A100: TP 8 with sequence parallelism, the distributed optimizer,
    selective recomputation, a microbatch of 1, and the fewest pipeline stages that fit (the
    next smaller divisor of the layers does not)."""
    plan = plans["gpt3-175b", "heuristic"]
    assert plan.uniform == StageParallel(tp=8, dp=1, sp=True, zero=1, recompute="selective")
    assert plan.micro_batch_size == 1
    assert plan.predicted.peak_memory_gib <= a100_128.device.memory_gib
    pp = len(plan.stages)
    fewer = max(p for p in range(1, pp)
                if gpt3.num_layers % p == 0 and a100_128.num_devices % (8 * p) == 0)
    config = run_config(training_of(gpt3, GPT3_RUN), GPT3_RUN, tp=8, pp=fewer, sp=True,
                        zero=1, recompute="selective")  # fmt: skip
    assert not estimate(gpt3, a100_128, config).fits


def test_heuristic_raises_tp_before_pp(
    llama: ModelSpec, h100_node: ClusterSpec, plans: dict[tuple[str, str], Plan]
) -> None:
    """Llama 3 8B at 8,192 tokens on one DGX H100: TP 1 does not fit with selective
    recomputation, so the rule takes TP 2, still without a pipeline."""
    plan = plans["llama3-8b", "heuristic"]
    assert plan.uniform == StageParallel(tp=2, dp=1, sp=True, zero=1, recompute="selective")
    assert len(plan.stages) == 1
    options = SolveOptions()
    tp1 = run_config(training_of(llama, options), options, tp=1, zero=1, recompute="selective")
    assert not estimate(llama, h100_node, tp1).fits
    assert layouts(llama, h100_node) == [(1, 1), (2, 1), (4, 1), (8, 1)]  # one node: no PP at TP 8


def test_heuristic_llama405b_follows_its_rule(llama405b: ModelSpec) -> None:
    """Llama 3.1 405B on 16,384 H100 (126 layers): no TP fits without a pipeline; at TP 8,
    Meta's PP16 with Megatron's 7 + 8 x 14 + 7 layers is the rule's candidate, but with
    selective recomputation its first stage holds 16 microbatches of activations and does not
    fit; nor does PP32 (3 + 4 x 30 + 3: 78.7 GiB, the allocator's slack and NCCL's buffers
    included), so the rule goes on to PP64 (1 + 2 x 62 + 1), which does; full recomputation,
    the rule's last resort, is never reached (with it PP16 would fit)."""
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 2048)
    plan = heuristic_plan(llama405b, cluster)
    assert plan.uniform == StageParallel(tp=8, dp=1, sp=True, zero=1, recompute="selective")
    assert [s.num_layers for s in plan.stages] == [1, *[2] * 62, 1]
    assert (plan.micro_batch_size, plan.data_parallel_replicas) == (1, 32)
    options = SolveOptions()
    meta = {"tp": 8, "pp": 16, "sp": True, "zero": 1, "first_stage_layers": 7,
            "last_stage_layers": 7}  # fmt: skip
    training = training_of(llama405b, options)
    selective = run_config(training, options, recompute="selective", **meta)
    full = run_config(training, options, recompute="full", **meta)
    assert selective in heuristic_candidates(llama405b, cluster, training=training,
                                             options=options)
    assert not estimate(llama405b, cluster, selective).fits
    assert estimate(llama405b, cluster, full).fits


def test_grid_space_follows_its_rules(llama: ModelSpec, h100_node: ClusterSpec) -> None:
    """Context parallelism only for long sequences, ZeRO-2/3 only without a pipeline, SP
    exactly when TP > 1, TP inside the node."""
    long = grid_space(llama, h100_node)
    assert {c.cp for c in long} == {1, 2, 4, 8}
    assert all(c.tp * c.cp <= 8 for c in long)
    assert all(c.pp == 1 for c in long if c.zero >= 2)
    assert all(c.sp == (c.tp > 1) for c in long)
    short = grid_space(llama, h100_node, SolveOptions(seq_length=4096))
    assert {c.cp for c in short} == {1}


def test_mla_models_split_heads_not_kv_groups(h100_node: ClusterSpec) -> None:
    """DeepSeek-V3's latent attention has no KV groups to divide: TP up to the node."""
    assert tp_degrees(load_model(MODELS / "deepseek-v3.json"), h100_node) == [1, 2, 4, 8]


def test_progress_ends_at_the_total(llama: ModelSpec, h100_node: ClusterSpec) -> None:
    """Both report monotone progress that ends complete with the best step found."""
    for method in (grid_plan, heuristic_plan):
        seen: list[Progress] = []
        plan = method(llama, h100_node, SolveOptions(), progress=seen.append)
        assert [p.done for p in seen] == sorted(p.done for p in seen)
        assert seen[-1].done == seen[-1].total
        assert seen[-1].best_step_s == plan.predicted.step_time_s


@pytest.mark.parametrize("method", [grid_plan, heuristic_plan])
def test_nothing_fits_is_one_clear_error(gpt3: ModelSpec, method: Callable[..., Plan]) -> None:
    """GPT-3 175B on one node: the error names the model, the devices and the memory the
    leanest configuration needs."""
    one_node = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 1)
    with pytest.raises(InfeasibleError, match=r"fits gpt3-175b on 8 x .*needs \d+\.\d GiB"):
        method(gpt3, one_node, GPT3_RUN)


def test_nothing_fits_names_the_uneven_split(llama405b: ModelSpec) -> None:
    """Llama 3.1 405B on 4 nodes: the rule's deepest pipeline, PP4 with 31 + 32 x 2 + 31
    layers, is the leanest and does not fit; the error says how the layers were split."""
    four_nodes = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 4)
    with pytest.raises(InfeasibleError, match=r"pp 4 with 31 and 31 layers at the ends"):
        heuristic_plan(llama405b, four_nodes)


@pytest.mark.parametrize("method", [grid_plan, heuristic_plan])
def test_baselines_for_any_framework_keep_their_configuration(
    llama: ModelSpec, h100_node: ClusterSpec, method: Callable[..., Plan]
) -> None:
    """Under ``--framework any`` the baselines still return uniform plans, each carrying the
    configuration it is (``planner compare --framework any`` used to stop at the invariant)."""
    options = SolveOptions(global_batch_size=64, framework="any")
    plan = method(llama, h100_node, options)
    assert plan.framework == "any" and plan.configuration is not None
    assert plan.predicted.step_time_s == estimate(llama, h100_node,
                                                  plan.configuration).step_time_s


def test_heuristic_applies_the_rule_to_the_knobs_left_free(
    llama: ModelSpec, h100_node: ClusterSpec
) -> None:
    """Pinned knobs replace the rule's choice (``compare --pp 2 --vpp 2`` showed the rule of
    thumb's TP2 x PP1 beside pinned plans); the free ones follow the rule as without pins."""
    free = heuristic_plan(llama, h100_node, SolveOptions())
    pinned = heuristic_plan(llama, h100_node, SolveOptions(pins=Pins(pp=2, vpp=2)))
    assert pinned.configuration is not None and free.configuration is not None
    assert (pinned.configuration.pp, pinned.configuration.vpp) == (2, 2)
    assert pinned.configuration.tp == free.configuration.tp
    assert pinned.configuration.recompute == free.configuration.recompute
