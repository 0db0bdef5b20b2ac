"""The baselines: the grid against brute force over its own space, the heuristic against its
written rule (Megatron's GPT-3 175B answer: TP 8 inside a node), the grid never slower than the
heuristic, and one clear error when nothing fits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from planner.baselines import grid_plan, grid_space, heuristic_plan
from planner.baselines.grid import config_key, run_config, tp_degrees
from planner.baselines.heuristic import heuristic_candidates
from planner.config import ParallelConfig
from planner.errors import ConfigError, InfeasibleError
from planner.estimate import estimate
from planner.plan import Plan, StageParallel
from planner.search import Progress, SolveOptions, training_of
from planner.spec import ClusterSpec, ModelSpec, load_cluster, load_model
from planner.uniform import uniform_plan
from tests.conftest import CLUSTERS, MODELS

GPT3_RUN = SolveOptions(global_batch_size=1536, seq_length=2048)
"""Megatron's published GPT-3 175B run (Narayanan et al. 2021, Table 1)."""


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
        if result.fits and (best is None or key[:2] < best[:2]):
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
    expected = uniform_plan(llama, h100_node, best, method="grid")
    assert plan.model_copy(update={"solver": expected.solver}) == expected
    assert plan.solver.status == "optimal"
    assert plan.solver.objective == plan.predicted.step_time_s


@pytest.mark.parametrize("case", ["llama3-8b", "gpt3-175b"])
def test_grid_is_never_slower_than_the_heuristic(
    case: str, plans: dict[tuple[str, str], Plan]
) -> None:
    """The heuristic's configuration is one point of the grid's space, so the grid's least
    step time cannot be above it."""
    grid, heuristic = plans[case, "grid"], plans[case, "heuristic"]
    assert grid.predicted.step_time_s <= heuristic.predicted.step_time_s
    assert (grid.method, heuristic.method) == ("grid", "heuristic")


def test_heuristic_candidates_lie_in_the_grid_space(
    llama: ModelSpec, h100_node: ClusterSpec
) -> None:
    """Every configuration the rule tries is one the grid prices too."""
    training = training_of(llama, SolveOptions())
    space = set(grid_space(llama, h100_node))
    tried = list(heuristic_candidates(llama, h100_node, training, SolveOptions()))
    assert tried and set(tried) <= space


def test_heuristic_gpt3_follows_megatron(
    gpt3: ModelSpec, a100_128: ClusterSpec, plans: dict[tuple[str, str], Plan]
) -> None:
    """GPT-3 175B on 128 DGX A100: TP 8 with sequence parallelism, the distributed optimizer,
    selective recomputation, a microbatch of 1, and the fewest pipeline stages that fit (the
    next smaller divisor of the layers does not)."""
    plan = plans["gpt3-175b", "heuristic"]
    assert plan.uniform == StageParallel(tp=8, dp=1, sp=True, zero_stage=1, recompute="selective")
    assert plan.micro_batch_size == 1
    assert plan.predicted.peak_memory_gib <= a100_128.device.memory_gib
    pp = len(plan.stages)
    fewer = max(p for p in range(1, pp) if gpt3.num_layers % p == 0)
    config = run_config(training_of(gpt3, GPT3_RUN), GPT3_RUN, tp=8, pp=fewer, sp=True,
                        zero=1, recompute="selective")  # fmt: skip
    assert not estimate(gpt3, a100_128, config).fits


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
