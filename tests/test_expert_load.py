"""Dropless routing's imbalance (``moe.expert_load_cv``): the busiest expert-parallel rank's
load, from the order statistics of the experts' loads, and the price of a layer that waits
for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.cost.expert_load import busiest_rank_load, expected_max_normal
from planner.diagnose.explain import explain
from planner.diagnose.routing import MEASURED_SPREADS, routing_what_if
from planner.errors import PlannerError
from planner.plan.config import ParallelConfig
from planner.report.explain import routing_lines
from planner.spec import ModelSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from planner.uniform.plan import uniform_plan
from tests.conftest import REPO

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"


def spread(model: ModelSpec, cv: float) -> ModelSpec:
    """``model`` with its experts' loads spread by ``cv``."""
    assert model.moe is not None
    return model.model_copy(update={"moe": model.moe.model_copy(update={"expert_load_cv": cv})})


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128, 256])
def test_blom_is_near_the_expected_maximum(n: int) -> None:
    """Blom's approximation against the mean of the largest of ``n`` normals drawn."""
    draws = np.random.default_rng(n).standard_normal((20_000, n)).max(axis=1).mean()
    assert expected_max_normal(n) == pytest.approx(draws, abs=0.03)


@pytest.mark.parametrize(("experts", "ep", "cv"),
                         [(128, 8, 0.5), (128, 32, 0.5), (128, 8, 1.5), (8, 8, 0.3),
                          (256, 64, 0.8)])  # fmt: skip
def test_the_busiest_rank_against_routing_drawn(experts: int, ep: int, cv: float) -> None:
    """Layers routed at random (each expert's load spread by ``cv`` around a total routing
    fixes), the busiest rank's sum of its experts' loads over the mean rank's: the formula
    within 2 %."""
    rng = np.random.default_rng(experts * ep)
    z = rng.standard_normal((20_000, experts))
    # Centred so the layer's total is fixed, scaled so each expert's spread is still cv.
    loads = 1 + cv * (z - z.mean(axis=1, keepdims=True)) * np.sqrt(experts / (experts - 1))
    ranks = loads.reshape(-1, ep, experts // ep).sum(axis=2)
    drawn = (ranks.max(axis=1) / ranks.mean(axis=1)).mean()
    assert busiest_rank_load(experts=experts, expert_parallel=ep, cv=cv) == pytest.approx(
        drawn, rel=0.02)


def test_balanced_or_one_rank_waits_for_no_one() -> None:
    """No spread, or every expert on one rank (its load is the layer's fixed total): the
    mean; more ranks or more spread: more."""
    assert busiest_rank_load(experts=128, expert_parallel=8, cv=0.0) == 1.0
    assert busiest_rank_load(experts=128, expert_parallel=1, cv=2.0) == 1.0
    loads = [busiest_rank_load(experts=128, expert_parallel=ep, cv=0.5)
             for ep in (2, 4, 8, 16, 32, 64, 128)]  # fmt: skip
    assert loads == sorted(loads) and loads[0] > 1
    assert busiest_rank_load(experts=128, expert_parallel=8, cv=1.0) > loads[2]


def test_the_layer_waits_for_the_busiest_rank() -> None:
    """Mixtral 8x7B on one H100 node, EP8 (one expert a rank): the experts' exchange takes
    the busiest rank's load times as long, the experts' compute grows, the memory each rank
    keeps does not (its share, averaged over the stage's layers); without expert
    parallelism nothing moves."""
    model = load_model(MIXTRAL)
    cluster = load_cluster(H100, nodes=1)
    config = ParallelConfig(tp=1, pp=1, ep=8, dp=8, mbs=1, zero=1, recompute="full",
                            global_batch=64, seq_len=4096)  # fmt: skip
    balanced, spread_out = (estimate(m, cluster, config) for m in (model, spread(model, 0.5)))
    load = busiest_rank_load(experts=8, expert_parallel=8, cv=0.5)
    assert load == pytest.approx(1 + 0.5 * expected_max_normal(8) * (8 / 7) ** 0.5)
    assert spread_out.time.expert_parallel_comm_s == pytest.approx(
        balanced.time.expert_parallel_comm_s * load, rel=1e-9)
    assert balanced.time.compute_s < spread_out.time.compute_s < balanced.time.compute_s * load
    assert spread_out.peak_memory_gib == balanced.peak_memory_gib
    no_ep = config.model_copy(update={"ep": 1})
    assert estimate(spread(model, 0.5), cluster, no_ep).step_time_s == estimate(
        model, cluster, no_ep).step_time_s


def test_a_spread_beside_a_capacity_factor_is_refused(tmp_path: Path) -> None:
    """With a capacity factor every expert is padded to its capacity: a spread of dropless
    routing beside it is refused, naming both."""
    spec = json.loads(MIXTRAL.read_text())
    spec["moe"] |= {"capacity_factor": 1.25, "expert_load_cv": 0.5}
    path = tmp_path / "model.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(PlannerError, match=r"expert_load_cv .*capacity_factor"):
        load_model(path)


QWEN3 = REPO.parent / "shared" / "reference" / "hf" / "Qwen3-235B-A22B.config.json"
LONG_CONTEXT = ((16384, 1, 295, 237), (32768, 2, 335, 277), (65536, 4, 368, 320),
                (131072, 8, 389, 357))  # fmt: skip
"""NVIDIA's Megatron-MoE-ModelZoo ``best_practice/qwen3/readme.md`` (e865051), "Long
Context": tokens, CP, TFLOP/s per GPU force-balanced and dropless, on 256 H100."""


def test_one_spread_prices_nvidias_dropless_runs_from_their_balanced_ones() -> None:
    """Qwen3-235B at TP4 PP8 VPP4 EP8 on 256 H100, 16K-128K tokens: the dropless runs took
    1.245 down to 1.090 times their balanced steps, as the experts' share of the step shrinks;
    one spread of tokens per expert, 1.65 (the median of the four rows' in
    ``benchmarks/moe_modelzoo.py``, :data:`MEASURED_SPREADS`), prices every ratio within 1 %."""
    assert MEASURED_SPREADS[1].spread == 1.65
    model = load_model(QWEN3)
    cluster = load_cluster(H100, nodes=32)
    for seq, cp, balanced, dropless in LONG_CONTEXT:
        config = ParallelConfig(
            tp=4, cp=cp, ep=8, etp=1, sp=True, pp=8, vpp=4, first_stage_layers=11,
            last_stage_layers=11, zero=1, recompute="selective",
            recompute_modules="layernorm,moe", moe_dispatcher="deepep", seq_len=seq,
            global_batch=256, overlap_grad_reduce=True, overlap_param_gather=True,
            stack="megatron-te-fused-loss")  # fmt: skip
        steps = [estimate(m, cluster, config).step_time_s
                 for m in (model, spread(model, 1.65))]
        assert steps[1] / steps[0] == pytest.approx(balanced / dropless, rel=0.01)


MIXTRAL_8X22B = REPO.parent / "shared" / "reference" / "hf" / "Mixtral-8x22B-v0.1.config.json"


def test_mixtral_8x22b_runs_price_near_and_imply_a_small_spread() -> None:
    """NVIDIA's model zoo's Mixtral 8x22B on 128 H100 (``best_practice/mixtral/
    run_mixtral_8x22B.sh`` and ``runtime.conf`` at e865051: TP2 PP8 VPP7 EP8, 4,096 tokens,
    global batch 256, all-to-all, ``--tp-comm-overlap``, the native fused loss): 465 TFLOP/s a
    GPU force-balanced, 470 padded to a capacity of 1.0, 445 dropless. By Megatron's count
    (253.9 PFLOP a step) the balanced step is 4.266 s; priced 3.947 s, 7.5 % fast, inside its
    band; padded to a capacity of 1.0 the experts do a balanced layer's work, priced the same.
    The dropless run took 1.045 times the balanced one, which 0.045
    (:data:`MEASURED_SPREADS`) prices within 1 %: its trained router spreads the tokens 37
    times less than Qwen3-235B's long-context runs show, whose spread would price it 2.7
    times as long."""
    model = load_model(MIXTRAL_8X22B)
    assert model.moe is not None
    cluster = load_cluster(H100, nodes=16)
    config = ParallelConfig(tp=2, pp=8, vpp=7, ep=8, etp=1, sp=True, zero=1, seq_len=4096,
                            global_batch=256, overlap_grad_reduce=True,
                            overlap_param_gather=True, moe_dispatcher="alltoall",
                            tp_comm_overlap=True, stack="megatron-te-fused-loss")  # fmt: skip
    balanced = estimate(model, cluster, config)
    measured = 253.93e15 / 128 / 465e12
    assert balanced.step_time_s / measured - 1 == pytest.approx(-0.075, abs=0.01)
    assert balanced.error_band is not None
    assert abs(balanced.step_time_s / measured - 1) < balanced.error_band.fraction
    assert balanced.peak_memory_gib < 80  # the runs ran
    padded = model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": 1.0})})  # fmt: skip
    assert estimate(padded, cluster, config).step_time_s == pytest.approx(balanced.step_time_s)
    ratios = [estimate(spread(model, m.spread), cluster, config).step_time_s
              / balanced.step_time_s for m in MEASURED_SPREADS]  # fmt: skip
    assert ratios[0] == pytest.approx(465 / 445, rel=0.01)
    assert ratios[1] > 2.5


def test_explain_sets_the_measured_spreads_beside_a_balanced_plan() -> None:
    """``explain`` on Mixtral's EP2 plan priced balanced: the same configuration at each
    spread NVIDIA's dropless runs showed, its step ``estimate``'s there and the busiest rank's
    load the formula's; priced spread, the same against balanced; nothing where routing
    cannot slow the plan (one rank holding every expert, experts padded to a capacity)."""
    model, cluster = load_model(MIXTRAL), load_cluster(H100, nodes=8)
    config = ParallelConfig(tp=1, pp=1, ep=2, zero=3, mbs=2, recompute="full",
                            global_batch=256, seq_len=4096)  # fmt: skip
    priced = uniform_plan(model, cluster, config)
    what_if = routing_what_if(priced, model, cluster)
    assert what_if is not None and what_if.spread == 0
    assert [o.spread for o in what_if.others] == [m.spread for m in MEASURED_SPREADS]
    for other in what_if.others:
        at = estimate(spread(model, other.spread), cluster, config).step_time_s
        assert other.step_time_s == at
        assert other.delta_s == pytest.approx(at - priced.predicted.step_time_s, abs=1e-9)
        assert other.busiest_load == busiest_rank_load(experts=8, expert_parallel=2,
                                                       cv=other.spread)  # fmt: skip
    assert 0 < what_if.others[0].delta_s < what_if.others[1].delta_s
    line = routing_lines(explain(priced, model, cluster))
    assert line and line[0].startswith("routing: priced balanced")
    assert "(Mixtral 8x22B)" in line[0] and "(Qwen3-235B" in line[0]

    spread_out = spread(model, 0.5)
    back = routing_what_if(uniform_plan(spread_out, cluster, config), spread_out, cluster)
    assert back is not None and [o.spread for o in back.others] == [0.0]
    assert back.others[0].delta_s < 0
    assert back.others[0].step_time_s == estimate(model, cluster, config).step_time_s

    one_rank = config.model_copy(update={"ep": 1})
    assert routing_what_if(uniform_plan(model, cluster, one_rank), model, cluster) is None
    assert model.moe is not None
    padded = model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": 1.0})})  # fmt: skip
    assert routing_what_if(uniform_plan(padded, cluster, config), padded, cluster) is None
