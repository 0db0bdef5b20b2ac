"""DeepEP's dispatcher (:mod:`planner.cost.deepep`): its buffers as DeepEP sizes them, the
nodes a token reaches counted by brute force, its exchange against NCCL's all-to-all, and a
plan priced, searched and exported with it."""

from __future__ import annotations

import itertools
import math

import pytest

import planner
from planner import cost
from planner.cost.memory import (
    NCCL_ALL_TO_ALL_PEER_BYTES,
    NCCL_GROUP_BYTES,
    NCCL_NET_P2P_POOL_BYTES,
    NCCL_PAIR_BYTES,
)
from planner.errors import ConfigError, InputError
from planner.frameworks import megatron
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec
from tests.framework_cases import load

RECIPE = dict(tp=2, pp=8, vpp=4, ep=64, etp=1, sp=True, zero=1, first_stage_layers=7,
              last_stage_layers=6, recompute="selective", recompute_modules="mla_up_proj,mlp",
              overlap_moe_expert_parallel_comm=True, global_batch=8192, seq_len=4096,
              overlap_grad_reduce=True, overlap_param_gather=True)  # fmt: skip
"""NVIDIA's DeepSeek-V3 recipe on 1,024 H100 (yanring/Megatron-MoE-ModelZoo
``best_practice/deepseek-v3/run_deepseek_v3_h100.sh`` at e865051), which dispatches with
DeepEP (``sbatch_benchmarking.sh``: ``DISPATCHER=deepep``)."""


def _h100(nodes: int) -> ClusterSpec:
    return planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=nodes)


def test_buffer_as_deepep_sizes_it() -> None:
    """deepseek-ai/DeepEP csrc/legacy/config.hpp (get_nvl_buffer_size_hint,
    get_rdma_buffer_size_hint); deep_ep/buffers/legacy.py (the configurations)

    DeepSeek-V3's 7,168 bf16 hidden values over 64 ranks (8 nodes of 8), 20 SMs (10
    channels), written out term by term: NVLink receives 288 tokens a channel and peer, RDMA
    128 (both configurations), each token its bytes, an 8-byte source record, 128 top-k
    indices (8 bytes), weights and scales (4); RDMA doubles it (send and receive) with a
    16-byte tail; one node needs no RDMA buffer."""
    token = 7168 * 2 + 8 + 128 * 8 + 128 * 4 + 128 * 4
    nvl = 10 * 8 * (2 * 8 + 3) * 4 + 10 * 8 * 288 * token
    rdma = 10 * 8 * 18 * 2 * 4 + 10 * 8 * 128 * (token + 16) * 2
    assert cost.deepep_buffer_bytes(64, 7168 * 2) == math.ceil(nvl / 128) * 128 + math.ceil(
        rdma / 128) * 128
    assert cost.deepep_buffer_bytes(8, 7168 * 2) == math.ceil(
        (10 * 8 * (2 * 1 + 3) * 4 + 10 * 8 * 256 * token) / 128) * 128
    # Against NCCL's all-to-all on 8-GPU nodes: 7 peers' buffers and the network pool,
    # 3.43 GB, against 0.71 GB.
    assert cost.deepep_buffer_bytes(64, 7168 * 2) < (
        7 * NCCL_ALL_TO_ALL_PEER_BYTES + NCCL_NET_P2P_POOL_BYTES) / 4.8
    with pytest.raises(ValueError, match="no configuration for 12"):
        cost.deepep_buffer_bytes(12, 1024)


def _hit_by_enumeration(experts: int, top_k: int, domains: int) -> float:
    """Domains an ungrouped top-k choice reaches, averaged over every choice."""
    per = experts // domains
    hits = [len({e // per for e in chosen})
            for chosen in itertools.combinations(range(experts), top_k)]  # fmt: skip
    return sum(hits) / len(hits)


def _grouped_by_enumeration(experts: int, top_k: int, groups: int, chosen: int,
                            domains: int) -> float:  # fmt: skip
    """Domains reached when ``chosen`` of ``groups`` are picked and each gets ``top_k /
    chosen`` of its experts, averaged over every pick."""
    in_group, per, share = experts // groups, experts // domains, top_k // chosen
    total = count = 0
    for picked in itertools.combinations(range(groups), chosen):
        parts = [itertools.combinations(range(g * in_group, (g + 1) * in_group), share)
                 for g in picked]  # fmt: skip
        for experts_of in itertools.product(*parts):
            total += len({e // per for part in experts_of for e in part})
            count += 1
    return total / count


@pytest.mark.parametrize(("experts", "top_k", "domains"), [(16, 4, 4), (12, 2, 3), (8, 2, 8)])
def test_domains_hit_ungrouped_by_enumeration(experts: int, top_k: int, domains: int) -> None:
    """Balanced routing: the expected domains reached equal the average over every choice."""
    routing = cost.Routing(experts=experts, top_k=top_k)
    assert cost.domains_hit(routing, domains) == pytest.approx(
        _hit_by_enumeration(experts, top_k, domains))


@pytest.mark.parametrize(("experts", "top_k", "groups", "chosen", "domains"),
                         [(16, 4, 4, 2, 4), (16, 4, 4, 2, 2), (16, 4, 2, 1, 4),
                          (24, 6, 4, 2, 8)])  # fmt: skip
def test_domains_hit_grouped_by_enumeration(experts: int, top_k: int, groups: int, chosen: int,
                                            domains: int) -> None:  # fmt: skip
    """Group-limited routing, groups nested in domains or spanning them: the same average
    over every pick of groups and of an even share of experts in each."""
    routing = cost.Routing(experts=experts, top_k=top_k, groups=groups, group_topk=chosen)
    assert cost.domains_hit(routing, domains) == pytest.approx(
        _grouped_by_enumeration(experts, top_k, groups, chosen, domains))


def _two_levels(nvlink_gb_s: float, network_gb_s: float, nodes: int) -> ClusterSpec:
    return ClusterSpec.model_validate({
        "name": "c", "num_nodes": nodes, "devices_per_node": 8,
        "device": {"name": "g", "memory_gib": 80, "memory_bandwidth_gb_s": 3000,
                   "peak_tflops": {"bf16": 900}},
        "network": [{"name": "nvlink", "domain_devices": 8, "bandwidth_gb_s": nvlink_gb_s,
                     "latency_us": 0},
                    {"name": "ib", "domain_devices": 8 * nodes, "bandwidth_gb_s": network_gb_s,
                     "latency_us": 0}]})  # fmt: skip


def test_deepep_halves_deepseek_v3_network_bytes() -> None:
    """DeepSeek-V3 over 64 ranks on 8 nodes: NCCL's all-to-all sends 7 of a token's 8 copies
    over the network; DeepEP one per other node of the 4 its groups lie in (3.5 on average):
    half the time where the network binds."""
    cluster = _two_levels(nvlink_gb_s=450, network_gb_s=50, nodes=8)
    v3 = cost.Routing(experts=256, top_k=8, groups=8, group_topk=4)
    group = cost.CommGroup(size=64)
    routed = 4096 * 8 * 7168 * 2.0
    nccl = cost.collective_time_s(cluster, "all_to_all", routed, group)
    assert nccl == pytest.approx(routed * 56 / 64 / 50e9)
    assert cost.deepep_time_s(cluster, routed, group, v3) == pytest.approx(nccl / 2)


def test_deepep_inside_a_node_moves_what_all_to_all_moves() -> None:
    """Mixtral's top-2 of 8 experts on one node of 8: a token reaches 2 GPUs on average, as
    many as its copies, so DeepEP and the all-to-all move the same NVLink bytes."""
    cluster = _two_levels(nvlink_gb_s=450, network_gb_s=50, nodes=2)
    group = cost.CommGroup(size=8)
    routed = 4096 * 2 * 4096 * 2.0
    assert cost.deepep_time_s(cluster, routed, group, cost.Routing(experts=8, top_k=2)) == \
        pytest.approx(cost.collective_time_s(cluster, "all_to_all", routed, group))


def test_recipe_priced_with_deepep() -> None:
    """The recipe as it launches with DeepEP: the exchange priced faster, the reserve without
    the all-to-all's buffers (its 7 peers in a node, NCCL's shared network pool for the 56
    beyond) but with DeepEP's and the experts' group as a collective group;
    ``estimate_batch`` agrees with ``estimate``."""
    model, cluster = load("deepseek-v3"), _h100(128)
    nccl = planner.estimate(model, cluster, ParallelConfig(**RECIPE))
    deepep = planner.estimate(model, cluster, ParallelConfig(**RECIPE, moe_dispatcher="deepep"))
    in_line = RECIPE | {"overlap_moe_expert_parallel_comm": False}
    exposed = [planner.estimate(model, cluster, ParallelConfig(**in_line, moe_dispatcher=d))
               .time.expert_parallel_comm_s for d in ("alltoall", "deepep")]  # fmt: skip
    assert exposed[1] < 0.55 * exposed[0]  # half the network bytes, the same latency
    saved = (7 * NCCL_ALL_TO_ALL_PEER_BYTES + NCCL_NET_P2P_POOL_BYTES - NCCL_GROUP_BYTES
             - cost.deepep_buffer_bytes(64, 7168 * 2))
    compute_same = deepep.memory.activations_gib == nccl.memory.activations_gib
    assert compute_same
    assert (nccl.memory.other_gib - deepep.memory.other_gib) * 2**30 == pytest.approx(saved)
    batch = planner.estimate_batch(model, cluster, [ParallelConfig(**RECIPE,
                                                                   moe_dispatcher="deepep")])
    assert batch.columns["step_time_s"][0] == pytest.approx(deepep.step_time_s)
    assert batch.columns["peak_memory_gib"][0] == pytest.approx(deepep.peak_memory_gib)


def test_deepep_sms_slow_the_overlapped_compute() -> None:
    """Overlapped, DeepEP's 20 SMs of the H100's 132 slow the compute its exchange hides
    behind by 20/112 of the hidden time: the exposed exchange grows by that, and not at all
    where the cluster file does not say how many SMs the device has (or without overlap)."""
    model, cluster = load("deepseek-v3"), _h100(128)
    unknown = cluster.model_copy(update={"device": cluster.device.model_copy(
        update={"compute_units": None})})  # fmt: skip
    assert cost.deepep_contention(cluster.device) == pytest.approx(20 / 112)
    assert cost.deepep_contention(unknown.device) == 0.0
    config = ParallelConfig(**RECIPE, moe_dispatcher="deepep")
    slowed, free = (planner.estimate(model, c, config) for c in (cluster, unknown))
    assert slowed.time.expert_parallel_comm_s > free.time.expert_parallel_comm_s + 0.5
    in_line = config.model_copy(update={"overlap_moe_expert_parallel_comm": False})
    assert planner.estimate(model, cluster, in_line).step_time_s == pytest.approx(
        planner.estimate(model, unknown, in_line).step_time_s)


def test_recipe_exported_with_deepep() -> None:
    """NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/core/transformer/transformer_config.py:891-900

    Megatron-LM's launch names the flex dispatcher and its DeepEP backend, not the
    all-to-all one."""
    model = load("deepseek-v3")
    resolved = resolve(model, _h100(128), ParallelConfig(**RECIPE, moe_dispatcher="deepep"))
    assert megatron.PROFILE.refusals(resolved, model) == ()
    text = megatron.PROFILE.launch(resolved, model).text
    assert "--moe-token-dispatcher-type flex" in text
    assert "--moe-flex-dispatcher-backend deepep" in text
    assert "alltoall" not in text


def test_deepep_refusals() -> None:
    """DeepEP takes 8 ranks a node beyond one node, and only the group sizes it has a
    configuration for; a dense model has nothing to exchange."""
    model = load("deepseek-v3")
    four_a_node = _h100(128).model_copy(update={"devices_per_node": 4})
    four_a_node = four_a_node.model_copy(update={"network": (
        four_a_node.network[0].model_copy(update={"domain_devices": 4}),
        *four_a_node.network[1:])})  # fmt: skip
    four_a_node = ClusterSpec.model_validate(four_a_node.model_dump() | {"num_nodes": 256})
    with pytest.raises(ConfigError, match="takes 8 from each node, not 4"):
        planner.estimate(model, four_a_node, ParallelConfig(**RECIPE, moe_dispatcher="deepep"))
    with pytest.raises(ConfigError, match="dense model has none to exchange"):
        planner.estimate(load("llama3-8b"), _h100(1),
                         ParallelConfig(global_batch=64, moe_dispatcher="deepep"))
    batch = planner.estimate_batch(model, four_a_node,
                                   [ParallelConfig(**RECIPE, moe_dispatcher="deepep"),
                                    ParallelConfig(**RECIPE)])  # fmt: skip
    assert batch.columns["divides"].tolist() == [False, True]


def test_solve_pinned_to_deepep() -> None:
    """``--moe-dispatcher deepep``: Mixtral on four nodes plans EP8 on DeepEP, at least as
    fast as the search finds without it (DeepEP never moves more bytes here); a model
    without experts is refused before searching, not planned without the pin."""
    model, cluster = load("mixtral-8x7b"), _h100(4)
    options = dict(framework="megatron", global_batch_size=256, seq_length=4096)
    free = planner.solve(model, cluster, planner.SolveOptions(**options))
    pinned = planner.solve(model, cluster, planner.SolveOptions(
        **options, pins=planner.Pins(moe_dispatcher="deepep")))  # fmt: skip
    assert pinned.configuration is not None
    assert (pinned.configuration.ep, pinned.configuration.moe_dispatcher) == (8, "deepep")
    assert "EP8 (DeepEP)" in pinned.summary()
    assert pinned.predicted.step_time_s <= free.predicted.step_time_s * (1 + 1e-9)
    with pytest.raises(InputError, match="has no experts"):
        planner.solve(load("llama3-8b"), cluster, planner.SolveOptions(
            framework="megatron", global_batch_size=256,
            pins=planner.Pins(moe_dispatcher="deepep")))  # fmt: skip


def test_per_operator_search_keeps_the_dispatcher() -> None:
    """The per-operator search (``any``'s second step) prices DeepEP where pinned: Mixtral on
    four nodes finds the plan it finds without the pin (EP8 inside a node, where DeepEP moves
    what the all-to-all moves), marked DeepEP, in the memory of DeepEP's buffers instead of
    the all-to-all's peers; never experts spread one rank a node, which DeepEP
    refuses."""
    from planner.search.per_operator import solve_per_operator

    model, cluster = load("mixtral-8x7b"), _h100(4)
    free = solve_per_operator(model, cluster, planner.SolveOptions())
    pinned = solve_per_operator(model, cluster, planner.SolveOptions(
        pins=planner.Pins(moe_dispatcher="deepep")))  # fmt: skip
    assert [s.parallel for s in pinned.stages] == [s.parallel for s in free.stages]
    assert max(s.parallel.ep for s in pinned.stages) == 8
    assert (free.flags.moe_dispatcher, pinned.flags.moe_dispatcher) == ("alltoall", "deepep")
    assert "(DeepEP)" in pinned.summary()
    assert pinned.predicted.error_band is not None
    assert "deepep" in {e.feature for e in pinned.predicted.error_band.extrapolated}
    # Stages of 2x8 meshes: the all-to-all's 7 peers in the node and its peer on the other
    # (through NCCL's shared network pool) become a group of 8 and a pair, and DeepEP's
    # buffers are charged for the widest group it could run before the layer ILP chose (16
    # ranks: 8 a node).
    assert pinned.stages[0].mesh == (2, 8)
    saved = (7 * NCCL_ALL_TO_ALL_PEER_BYTES + NCCL_NET_P2P_POOL_BYTES - NCCL_PAIR_BYTES
             - NCCL_GROUP_BYTES - cost.deepep_buffer_bytes(16, model.hidden_size * 2))
    gained = free.predicted.peak_memory_gib - pinned.predicted.peak_memory_gib
    assert gained * 2**30 == pytest.approx(saved, rel=1e-6)


def test_experts_spread_after_the_dispatch_are_expert_parallel() -> None:
    """A per-operator sharding may keep the tokens on their ranks through the dispatch and
    reshard them to the experts' ranks after it (the same exchange, priced as a resharding:
    for Mixtral on 4 nodes it ties with the dispatch's own all-to-all): the experts are spread
    all the same, and the stage says so (EP8, folded where the experts split the tensor
    axis), not DP alone, which would launch every expert on every rank."""
    from types import SimpleNamespace

    from planner.ilp.layer import OpChoice
    from planner.pipeline.assemble import folded_etp, summarise

    def stage(attention: str, dispatch: str, experts: str) -> dict[str, int | bool]:
        choices = tuple(OpChoice(op=f"layer1.{name}", strategy=strategy,
                                 output=tuple(strategy.split(",")), followers=())
                        for name, strategy in (("attention", attention), ("dispatch", dispatch),
                                               ("expert_up", experts)))  # fmt: skip
        return summarise(SimpleNamespace(choices=choices), (2, 8))  # type: ignore[arg-type]

    resharded = stage("batch,batch", "batch,batch", "capacity,experts")
    routed = stage("batch,batch", "batch,experts:batch", "capacity,experts")
    assert resharded == routed
    assert (resharded["dp"], resharded["ep"]) == (16, 8)
    folded = stage("batch,heads", "batch,batch", "capacity,experts")
    assert (folded["tp"], folded["ep"], folded_etp(folded)) == (8, 8, 1)


def test_deepep_layouts_in_the_layer_graph() -> None:
    """Under DeepEP no operator of Mixtral's MoE layer on two nodes spreads the experts over
    the node axis alone (one rank a node); inside a node it may, as without DeepEP."""
    from planner.ilp.problem import LayerQuery, layer_graph_of

    model, cluster = load("mixtral-8x7b"), _h100(2)

    def expert_axes(dispatcher: str) -> set[tuple[int, ...]]:
        query = LayerQuery(kind="moe", mesh=(2, 8), mesh_micro_batch_size=16,
                           seq_length=4096, moe_dispatcher=dispatcher)  # fmt: skip
        graph = layer_graph_of(model, cluster, query)
        return {tuple(a for a, d in enumerate(s.assignment) if d and d.startswith("experts"))
                for node in graph.nodes for s in node.strategies}  # fmt: skip

    free, pinned = expert_axes("alltoall"), expert_axes("deepep")
    assert (0,) in free and (0,) not in pinned
    assert (1,) in pinned  # eight experts: no more than eight ranks hold them


def test_a_plan_written_before_its_flags_said_deepep_reads_as_one() -> None:
    """A schema 6 plan whose flags predate ``moe_dispatcher`` and ``optimizer_moments`` (its
    configuration had them) reads with them: its summary still says DeepEP and bf16
    moments."""
    import json

    from planner.plan.files import plan_from_json
    from planner.uniform.plan import uniform_plan

    model, cluster = load("mixtral-8x7b"), _h100(4)
    plan = uniform_plan(model, cluster, ParallelConfig(
        tp=1, ep=8, zero=1, global_batch=256, seq_len=4096, moe_dispatcher="deepep",
        optimizer_moments="bf16"))  # fmt: skip
    data = json.loads(plan.to_json())
    for key in ("moe_dispatcher", "optimizer_moments"):
        del data["flags"][key]
    read = plan_from_json(json.dumps(data))
    assert (read.flags.moe_dispatcher, read.flags.optimizer_moments) == ("deepep", "bf16")
    assert "EP8 (DeepEP)" in read.summary() and "Adam moments in bf16" in read.summary()
