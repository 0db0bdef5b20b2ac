"""Placement: where the ranks of each parallel group sit decides which network levels their
collectives cross, and so the price."""

from __future__ import annotations

import pytest

import planner
from planner import cost
from planner.placement.ranks import rank_strides
from planner.plan.config import resolve
from planner.uniform.estimate import UniformStage, uniform_stage
from planner.uniform.plan import megatron_ranks
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
    assert across.time.tensor_parallel_comm_s > 5 * inside.time.tensor_parallel_comm_s
    assert across.step_time_s > inside.step_time_s
    assert across.time.data_parallel_comm_exposed_s < inside.time.data_parallel_comm_exposed_s


def test_groups_span_the_levels_their_ranks_do(a100: planner.ClusterSpec) -> None:
    """The groups' members per node follow the order: TP fastest = 8 per node; TP after DP 8 =
    1 per node; the data-parallel copies of a weight likewise the other way round."""
    def stage(order: str) -> UniformStage:
        return uniform_stage(resolve(planner.load_model(MODELS / "gpt3-175b.json"), a100,
                                     planner.ParallelConfig(tp=8, pp=16, rank_order=order)))

    fast, slow = stage("tp-cp-ep-dp-pp"), stage("cp-ep-dp-tp-pp")
    assert cost.members_per_level(a100, fast.tensor_group) == (8, 8)
    assert cost.members_per_level(a100, slow.tensor_group) == (1, 8)
    assert cost.members_per_level(a100, fast.mesh.group(2)) == (8, 8)
    assert cost.members_per_level(a100, slow.mesh.group(2)) == (1, 8)
    assert cost.members_per_level(a100, fast.group((0, 1))) == (1, 8)
    assert cost.members_per_level(a100, slow.group((0, 1))) == (8, 8)
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
        rank_strides("tp-dp-cp-ep-pp", tp=2, cp=1, dp=2, pp=1)
    with pytest.raises(planner.ConfigError, match="once each"):
        rank_strides("tp-tp-cp-ep-dp", tp=2, cp=1, dp=2, pp=1)


def test_search_placement_prices_the_levels_its_groups_cross(a100: planner.ClusterSpec) -> None:
    """The search's GPT-3 pipeline of 64 stages on half nodes (1 x 4), 4 replicas, priced
    under both rank orders. Replicas side by side put two of each stage's data-parallel ranks
    in one node (the reduction crosses 2 nodes, not 4) and neighbouring stages 16 ranks apart
    (always another node); stages side by side put neighbours 4 ranks apart, but a row of 64
    of them spans 32 nodes, so every other pair of neighbours is in different nodes and the
    pipeline runs at InfiniBand's pace all the same. The composer sees both: the same sends,
    a slower reduction."""
    from planner.cost.step import PipelineKnobs
    from planner.options import SolveOptions, training_of
    from planner.pipeline.assemble import compose
    from planner.placement.ranks import PipelinePlacement
    from planner.search.loop import (
        SearchContext,
        SearchState,
        candidates,
        decoder_kinds,
        evaluate,
        pipeline_send_s,
    )
    from planner.sharding.layout import LogicalMesh

    model = planner.load_model(MODELS / "gpt3-175b.json")
    options = SolveOptions(global_batch_size=1536, seq_length=2048, overlap_grad_reduce=False,
                           overlap_param_gather=False)  # fmt: skip
    training = training_of(model, options)
    ctx = SearchContext(model=model, cluster=a100, training=training, options=options,
                        state=SearchState())
    c = next(c for c in candidates(model, a100, training, options)
             if (c.replicas, c.mesh, c.mesh_micro_batch_size, c.vpp)
             == (4, (1, 4), 1, 1))  # fmt: skip
    kinds = decoder_kinds(model)
    found = evaluate(ctx, c, kinds)
    assert found is not None and len(found.stages) == 64
    knobs = PipelineKnobs(num_microbatches=c.num_microbatches, precision="bf16")
    steps = {}
    for order in ("replicas-inner", "stages-inner"):
        placement = PipelinePlacement(LogicalMesh((1, 4)), 64, 4, order)
        send = pipeline_send_s(ctx, c, placement.pipeline_distance)
        steps[order] = compose(found.stages, kinds, model, a100, knobs, placement, send)
    inner, outer = steps["replicas-inner"], steps["stages-inner"]
    assert inner.time.data_parallel_comm_exposed_s < outer.time.data_parallel_comm_exposed_s
    assert outer.time.pipeline_comm_s == inner.time.pipeline_comm_s


def test_a_mesh_split_over_nodes_pays_for_it(a100: planner.ClusterSpec) -> None:
    """Stages of part of a node: replicas side by side share the node's NVLink for their
    gradient reduction, while a whole pipeline apart they cross InfiniBand, so that order's
    exposed data-parallel time is larger (the same stages, the same sharding)."""
    from planner.placement.ranks import PipelinePlacement
    from planner.sharding.layout import LogicalMesh

    near = PipelinePlacement(LogicalMesh((1, 2)), num_stages=4, replicas=4)
    far = PipelinePlacement(LogicalMesh((1, 2)), 4, 4, "stages-inner")
    near_group, far_group = near.weight_group(()), far.weight_group(())
    assert near_group is not None and far_group is not None
    assert cost.members_per_level(a100, near_group) == (4, 4)
    assert cost.members_per_level(a100, far_group) == (1, 4)
    nbytes = 1e9
    assert cost.collective_time_s(a100, "all_reduce", nbytes, far_group) > 5 * (
        cost.collective_time_s(a100, "all_reduce", nbytes, near_group)
    )
    assert near.pipeline_distance == 8 and far.pipeline_distance == 2
