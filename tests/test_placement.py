"""Placement: where the ranks of each parallel group sit decides which network levels their
collectives cross, and so the price."""

from __future__ import annotations

import pytest

import planner
from planner import cost
from planner.placement.ranks import (
    ORDER_DIMS,
    ORDERS,
    PipelinePlacement,
    RankOrder,
    megatron_order,
)
from planner.plan.config import resolve
from planner.plan.degrees import Degrees
from planner.uniform.plan import megatron_ranks
from planner.uniform.stages import UniformStage, uniform_stage
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
        megatron_order("tp-dp-cp-ep-pp", Degrees(tp=2, dp=2))
    with pytest.raises(planner.ConfigError, match="once each"):
        megatron_order("tp-tp-cp-ep-dp", Degrees(tp=2, dp=2))


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
    from planner.search.per_operator import (
        SearchContext,
        SearchState,
        candidate_send_s,
        candidates,
        decoder_kinds,
        evaluate,
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
    knobs = PipelineKnobs(num_microbatches=c.num_microbatches, states_precision="bf16")
    steps = {}
    for order in ("replicas-inner", "stages-inner"):
        placement = PipelinePlacement(mesh=LogicalMesh((1, 4)), num_stages=64, replicas=4,
                                      order=order)  # fmt: skip
        send = candidate_send_s(ctx, c, placement.pipeline_distance)
        steps[order] = compose(found.stages, kinds, model=model, cluster=a100, knobs=knobs,
                               placement=placement, pipeline_comm_s=send)  # fmt: skip
    inner, outer = steps["replicas-inner"], steps["stages-inner"]
    assert inner.time.data_parallel_comm_exposed_s < outer.time.data_parallel_comm_exposed_s
    assert outer.time.pipeline_comm_s == inner.time.pipeline_comm_s


def test_a_mesh_split_over_nodes_pays_for_it(a100: planner.ClusterSpec) -> None:
    """Stages of part of a node: replicas side by side share the node's NVLink for their
    gradient reduction, while a whole pipeline apart they cross InfiniBand, so that order's
    exposed data-parallel time is larger (the same stages, the same sharding)."""
    from planner.sharding.layout import LogicalMesh

    near = PipelinePlacement(mesh=LogicalMesh((1, 2)), num_stages=4, replicas=4)
    far = PipelinePlacement(mesh=LogicalMesh((1, 2)), num_stages=4, replicas=4,
                            order="stages-inner")  # fmt: skip
    near_group, far_group = near.weight_group(()), far.weight_group(())
    assert near_group is not None and far_group is not None
    assert cost.members_per_level(a100, near_group) == (4, 4)
    assert cost.members_per_level(a100, far_group) == (1, 4)
    nbytes = 1e9
    assert cost.collective_time_s(a100, "all_reduce", nbytes, far_group) > 5 * (
        cost.collective_time_s(a100, "all_reduce", nbytes, near_group)
    )
    assert near.pipeline_distance == 8 and far.pipeline_distance == 2


# --------------------------------------------------------------------------- one numbering

SPELLINGS = {"replicas-inner": "tp-cp-ep-dp-pp", "stages-inner": "tp-pp-cp-ep-dp"}
"""Each search order and the Megatron order that numbers ranks the same way, a stage's mesh
(``cp x tp`` ranks, context-major) one contiguous block: Megatron's default for any ``cp``;
with stages inner only for ``cp = 1`` (``cp-ep-dp`` stays one block in Megatron's orders)."""

DEGREES = [(1, 1, 1, 1), (2, 1, 2, 2), (4, 1, 2, 3), (8, 1, 4, 16), (1, 1, 3, 2)]
"""(tp, cp, dp, pp)."""


@pytest.mark.parametrize(
    ("order", "tp", "cp", "dp", "pp"),
    [(order, *d) for order in ORDERS for d in DEGREES]
    + [("replicas-inner", 4, 2, 2, 3), ("replicas-inner", 2, 4, 3, 5)],
)
def test_both_spellings_of_one_numbering_give_the_same_ranks(
    order: str, tp: int, cp: int, dp: int, pp: int
) -> None:
    """The search's placement of ``pp`` stages on ``cp x tp`` meshes with ``dp`` replicas and
    Megatron's numbering of the same degrees give every stage and replica the same ranks, and
    the same distances between replicas and between stages."""
    from planner.sharding.layout import LogicalMesh

    search = PipelinePlacement(mesh=LogicalMesh((cp, tp)), num_stages=pp, replicas=dp,
                               order=order)  # type: ignore[arg-type]  # fmt: skip
    megatron = megatron_ranks(tp=tp, cp=cp, dp=dp, pp=pp, order=SPELLINGS[order])
    assert [list(map(list, search.stage_ranks(i))) for i in range(pp)] == megatron
    strides = megatron_order(SPELLINGS[order], Degrees(tp=tp, cp=cp, dp=dp, pp=pp)).strides()
    assert search.pipeline_distance == strides["pp"]
    assert search.replica_stride == strides["dp"]
    assert search.num_devices == tp * cp * dp * pp


def test_the_search_orders_are_rank_orders() -> None:
    """``replicas-inner`` numbers the mesh, then replicas, then stages; ``stages-inner`` the
    mesh, then stages, then replicas; every rank once."""
    from planner.sharding.layout import LogicalMesh

    for order in ORDERS:
        placement = PipelinePlacement(mesh=LogicalMesh((2, 4)), num_stages=3, replicas=2,
                                      order=order)  # fmt: skip
        numbering = placement.rank_order
        assert tuple(name for name, _ in numbering.dims) == ORDER_DIMS[order]
        ranks = sorted(r for i in range(3) for replica in placement.stage_ranks(i)
                       for r in replica)  # fmt: skip
        assert ranks == list(range(48))


def test_rank_order_known_answers() -> None:
    """Strides are the products of the faster sizes; ranks follow the coordinates; groups are
    evenly spaced by the stride; the ends of a dimension are ``(n - 1)`` strides apart."""
    numbering = RankOrder(dims=(("tp", 4), ("dp", 3), ("pp", 2)))
    assert numbering.strides() == {"tp": 1, "dp": 4, "pp": 12}
    assert numbering.num_ranks == 24
    assert numbering.ranks(at={"dp": 2, "pp": 1}, over=("tp",)) == [20, 21, 22, 23]
    assert numbering.ranks(at={"tp": 1}, over=("pp", "dp")) == [1, 5, 9, 13, 17, 21]
    assert numbering.group("dp") == cost.CommGroup(size=3, stride=4)
    assert numbering.ends_group("pp") == cost.CommGroup(size=2, stride=12)
    assert RankOrder(dims=(("pp", 1),)).ends_group("pp") == cost.CommGroup(size=2, stride=1)


def test_uniform_groups_follow_the_numbering(a100: planner.ClusterSpec) -> None:
    """A uniform configuration's tensor group, pipeline distance and tied-embedding group are
    its numbering's: TP8 PP16 DP8 in Megatron's order puts stages 64 ranks apart and the first
    and last stage 15 x 64 apart."""
    resolved = resolve(planner.load_model(MODELS / "gpt3-175b.json"), a100,
                       planner.ParallelConfig(tp=8, pp=16))  # fmt: skip
    stage = uniform_stage(resolved)
    assert stage.tensor_group == cost.CommGroup(size=8, stride=1)
    assert stage.pipeline_distance == 64
    assert stage.rank_order.ends_group("pp") == cost.CommGroup(size=2, stride=15 * 64)
