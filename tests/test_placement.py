"""Placement: where the ranks of each parallel group sit decides which network levels their
collectives cross, and so the price."""

from __future__ import annotations

import pytest

import planner
from planner import cost
from planner.layer_cost import Placement
from planner.uniform import megatron_ranks
from tests.conftest import MODELS


def test_tensor_parallel_across_nodes_is_slower(a100: planner.ClusterSpec) -> None:
    """GPT-3 175B TP8 PP16 DP8: with Megatron's order the 8 tensor-parallel ranks share a
    node's NVLink; numbering data-parallel ranks first puts them 8 nodes apart on InfiniBand,
    and their collectives (and the step) get slower, while the data-parallel reduction, now
    inside a node, gets cheaper."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    inside = planner.estimate(model, a100, planner.ParallelConfig(tp=8, pp=16))
    across = planner.estimate(model, a100, planner.ParallelConfig(
        tp=8, pp=16, rank_order="cp-ep-dp-tp-pp"))  # fmt: skip
    assert across.time_s.tensor_parallel_comm > 5 * inside.time_s.tensor_parallel_comm
    assert across.step_time_s > inside.step_time_s
    assert across.time_s.data_parallel_comm_exposed < inside.time_s.data_parallel_comm_exposed


def test_groups_span_the_levels_their_ranks_do(a100: planner.ClusterSpec) -> None:
    """The groups' members per node follow the order: TP fastest = 8 per node; TP after DP 8 =
    1 per node."""
    fast = Placement.from_order("tp-cp-ep-dp-pp", tp=8, cp=1, dp=8, ep=1, pp=16)
    slow = Placement.from_order("cp-ep-dp-tp-pp", tp=8, cp=1, dp=8, ep=1, pp=16)
    assert cost.members_per_level(a100, fast.tp) == (8, 8)
    assert cost.members_per_level(a100, slow.tp) == (1, 8)
    assert fast.pipeline_distance == slow.pipeline_distance == 64


def test_ranks_follow_the_order() -> None:
    """Every rank once; a stage's replicas and tensor ranks where the order puts them."""
    for order in ("tp-cp-ep-dp-pp", "cp-ep-dp-tp-pp", "tp-pp-cp-ep-dp"):
        ranks = megatron_ranks(tp=4, cp=2, dp=2, pp=3, order=order)
        flat = sorted(r for stage in ranks for replica in stage for r in replica)
        assert flat == list(range(48)), order
    assert megatron_ranks(tp=4, cp=1, dp=2, pp=3, order="tp-pp-cp-ep-dp")[1][0] == [4, 5, 6, 7]


def test_bad_order_is_refused() -> None:
    """An order that is not a permutation, or splits the cp-ep-dp block, says how to fix it."""
    with pytest.raises(planner.ConfigError, match="cp-ep-dp together"):
        Placement.from_order("tp-dp-cp-ep-pp", tp=2, cp=1, dp=2, ep=1, pp=1)
    with pytest.raises(planner.ConfigError, match="once each"):
        Placement.from_order("tp-tp-cp-ep-dp", tp=2, cp=1, dp=2, ep=1, pp=1)
