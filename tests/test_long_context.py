"""Long sequences: the framework search tries context parallelism across scale-up domains where
each rank keeps a long sequence, so a run ``planner estimate`` shows fitting is not reported as
fitting nowhere (issue 25: Llama 3.1 8B at 1M tokens on 64 H100, where CP stopped at 8 inside
a node and the search said the leanest needed 92.6 GiB)."""

from __future__ import annotations

import pytest

from planner import estimate
from planner.frameworks import launch
from planner.options import Pins, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.plan.schema import Plan
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.groups import LONG_SEQUENCE, within_scale_up
from planner.uniform.leanest import leanest_uniform, nodes_to_fit
from planner.uniform.space import branches
from tests.conftest import HF, shared

LLAMA8B = "../shared/reference/hf/Meta-Llama-3.1-8B.config.json"
H100 = "instances/clusters/dgx-h100-80gb.json"
MILLION = 1 << 20
RUN = {"global_batch": 8, "seq_len": MILLION}
# What the user priced: TP 8 in each node, CP 8 across 8 nodes, ZeRO-3, full recompute
BY_HAND = ParallelConfig(tp=8, cp=8, sp=True, recompute="full", zero=3, **RUN)
OPTIONS = SolveOptions(global_batch_size=8, seq_length=MILLION)


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    return load_model(LLAMA8B)


def test_a_million_tokens_solve_at_least_as_well_as_the_configuration_priced_by_hand(
    llama,  # type: ignore[no-untyped-def]
) -> None:
    """estimate shows TP8 x CP8 fitting at about 23 GiB; solve returns a plan that fits and is
    no slower than it (the search's own best, TP2 x CP32 with ZeRO-3, is faster)."""
    cluster = load_cluster(H100, 8)
    by_hand = estimate(llama, cluster, BY_HAND)
    assert by_hand.fits and by_hand.peak_memory_gib == pytest.approx(22.9, abs=0.05)
    plan = solve(llama, cluster, OPTIONS)
    assert plan.predicted.step_time_s <= by_hand.step_time_s
    config = plan.configuration
    assert config is not None and config.cp * config.tp > 8  # across nodes
    again = estimate(llama, cluster, config, memory_margin_gib=plan.memory_margin_gib)
    assert again.fits and again.step_time_s == plan.predicted.step_time_s


def test_the_leanest_report_agrees_with_estimate(llama) -> None:  # type: ignore[no-untyped-def]
    """The least memory the search reports is estimate's peak of the configuration it names,
    and no more than what the configuration priced by hand needs; on one node, where nothing
    fits, more nodes are the way out (4 nodes: TP 8 x CP 4; on 2, CP 16 without TP keeps the
    whole vocabulary's fp32 logits of 65,536 tokens, 31 GiB, and the loss's backward 16 more),
    not "more nodes do not help"."""
    cluster = load_cluster(H100, 8)
    training = training_of(llama, OPTIONS)
    found = leanest_uniform(llama, cluster, training=training, options=OPTIONS)
    assert found is not None
    least_gib, config = found
    assert least_gib == pytest.approx(estimate(llama, cluster, config).peak_memory_gib, rel=1e-9)
    assert least_gib <= estimate(llama, cluster, BY_HAND).peak_memory_gib
    one = load_cluster(H100, 1)
    fit = nodes_to_fit(llama, one, training=training, options=OPTIONS)
    assert fit is not None
    nodes, gib, fewest = fit
    assert nodes == 4 and (fewest.tp, fewest.cp) == (8, 4)
    assert gib == pytest.approx(estimate(llama, one.with_nodes(nodes), fewest).peak_memory_gib,
                                rel=1e-9)  # fmt: skip


def test_a_pinned_cp_across_nodes_is_searched(llama) -> None:  # type: ignore[no-untyped-def]
    """``--cp 64`` on 64 H100: TP1 x CP64 across 8 nodes (it said "does not divide")."""
    cluster = load_cluster(H100, 8)
    plan = solve(llama, cluster, SolveOptions(global_batch_size=8, seq_length=MILLION,
                                              pins=Pins(cp=64)))  # fmt: skip
    assert plan.configuration is not None and plan.configuration.cp == 64


@pytest.mark.parametrize(("seq_len", "widest"), [(8192, 8), (65536, 64), (MILLION, 64)])
def test_cp_leaves_the_node_only_for_long_sequences(llama, seq_len: int, widest: int) -> None:  # type: ignore[no-untyped-def]
    """At 8K tokens every TP x CP group stays in a node, as before; beyond, a group spans whole
    nodes where each CP rank keeps at least 8K tokens (64K: CP 8, 1M: CP 64 on 64 devices)."""
    cluster = load_cluster(H100, 8)
    training = training_of(llama, SolveOptions(global_batch_size=8, seq_length=seq_len))
    found = branches(llama, cluster, training=training)
    assert max(b.tp * b.cp for b in found) == widest
    for b in found:
        inside = within_scale_up(cluster, tp=b.tp, cp=b.cp)
        assert inside or (b.tp * b.cp % 8 == 0 and seq_len >= b.cp * LONG_SEQUENCE), b


def test_cp_grows_as_far_as_a_small_batch_needs(llama) -> None:  # type: ignore[no-untyped-def]
    """One sequence of 16K tokens on 64 H100: TP8 leaves eight ranks the batch cannot
    occupy, which CP8 (2K tokens a rank) takes where the 8K-a-rank rule stopped at CP2 and
    left them to a pipeline of one microbatch: TP8 PP4 CP2, 0.201 s, 72 % of it bubble; now
    TP8 CP8 without a pipeline, 0.115 s. A batch that fills the devices keeps the rule."""
    cluster = load_cluster(H100, 8)
    small = SolveOptions(global_batch_size=1, seq_length=16384)
    groups = {(b.tp, b.cp) for b in branches(llama, cluster, training=training_of(llama, small))}
    assert (8, 8) in groups and (8, 16) not in groups
    plan = solve(llama, cluster, small)
    assert plan.configuration is not None
    assert (plan.configuration.tp, plan.configuration.pp, plan.configuration.cp) == (8, 1, 8)
    assert plan.predicted.step_time_s == pytest.approx(0.1153, rel=1e-3)
    full = SolveOptions(global_batch_size=64, seq_length=16384)
    wide = {(b.tp, b.cp) for b in branches(llama, cluster, training=training_of(llama, full))}
    assert max(cp for tp, cp in wide if tp * cp > 8) == 2


def test_ulysses_all_to_alls_are_context_parallel_communication(llama) -> None:  # type: ignore[no-untyped-def]
    """Ulysses trades each rank's sequence shard for a head shard around attention: those
    all-to-alls are context-parallel communication (a TP1 plan printed them as tensor
    parallel), the TP gathers and reductions beside them tensor-parallel; the step is
    unchanged."""
    cluster = load_cluster(H100, 1)
    run = {"global_batch": 4, "seq_len": 32768, "cp_algo": "ulysses"}
    alone = estimate(llama, cluster, ParallelConfig(cp=8, **run))
    assert alone.time.tensor_parallel_comm_s == 0 and alone.time.context_parallel_comm_s > 0
    both = estimate(llama, cluster, ParallelConfig(tp=2, cp=4, sp=True, **run))
    assert both.time.tensor_parallel_comm_s > 0 and both.time.context_parallel_comm_s > 0


def _priced(model, cluster, **knobs):  # type: ignore[no-untyped-def]
    return {algo: estimate(model, cluster, ParallelConfig(cp_algo=algo, **knobs))
            for algo in ("ring", "allgather")}  # fmt: skip


@pytest.mark.parametrize(("cp", "tp", "pp"), [(2, 1, 2), (8, 1, 2), (4, 2, 2), (16, 1, 1)])
def test_all_gathered_keys_and_values_cost_what_pytorch_holds_and_waits_for(
    cp: int, tp: int, pp: int
) -> None:
    """PyTorch's context parallelism (``cp_algo`` allgather, torchtitan's) waits out more of
    its exchange than the ring (one all-gather behind the first attention step, fp32 K/V
    gradients around the ring), and holds the whole sequence's K and V of its tensor-parallel
    heads while its attention runs, and in backward two fp32 gradient blocks of 1/cp of them:
    on a first stage, which has no loss, exactly those bytes (2 x 131,072 tokens x 8 x 128 /
    tp x 2 bytes, times 1 + 4 / cp) more, with the allocator's share."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster(H100, 4)
    priced = _priced(model, cluster, tp=tp, sp=tp > 1, cp=cp, pp=pp, zero=1, global_batch=32,
                     seq_len=131072, stack="torchtitan-eager")  # fmt: skip
    ring, gathered = priced["ring"], priced["allgather"]
    assert gathered.time.context_parallel_comm_s > ring.time.context_parallel_comm_s
    assert gathered.step_time_s > ring.step_time_s
    kv = 2 * 131072 * 8 * 128 // tp * 2
    if pp > 1:
        extra = (gathered.peak_memory_gib - ring.peak_memory_gib) * 2**30
        assert extra == pytest.approx(kv * (1 + 4 / cp)
                                      * (1 + cluster.device.allocator_fragmentation))


def test_torchtitan_plans_context_parallelism_as_pytorch_runs_it() -> None:
    """torchtitan at 128K tokens (Llama 3 8B, 32 H100): the search now tries torchtitan's
    own context parallelism, and it beats the best plan without any (TP4, every layer
    recomputed); the export writes the degree."""
    model = load_model("instances/models/llama3-8b.json")
    cluster = load_cluster(H100, 4)
    options = SolveOptions(framework="torchtitan", seq_length=131072, global_batch_size=32)
    plan = solve(model, cluster, options)
    config = plan.configuration
    assert config is not None and config.cp > 1 and config.cp_algo == "allgather"
    without = solve(model, cluster, SolveOptions(framework="torchtitan", seq_length=131072,
                                                 global_batch_size=32, pins=Pins(cp=1)))
    assert plan.predicted.step_time_s < 0.8 * without.predicted.step_time_s
    toml = launch(plan, "torchtitan", model=model, cluster=cluster).text
    assert f"context_parallel_degree = {config.cp}\n" in toml


def test_colossalai_plans_ulysses_all_to_all() -> None:
    """Colossal-AI at 64K tokens (Qwen3 8B, 16 H100): its all_to_all mode is searched, and
    its plan takes it over the best with the ring or without context parallelism; the export
    writes the mode over ``sp_size``."""
    model = load_model(shared(HF / "Qwen3-8B.config.json"))
    cluster = load_cluster(H100, 2)

    def plan(**pins: object) -> Plan:
        return solve(model, cluster, SolveOptions(framework="colossalai", seq_length=65536,
                                                  global_batch_size=32, pins=Pins(**pins)))

    best = plan()
    config = best.configuration
    assert config is not None and config.cp > 1 and config.cp_algo == "ulysses"
    for other in (plan(cp_algo="ring"), plan(cp=1)):
        assert best.predicted.step_time_s < other.predicted.step_time_s
    text = launch(best, "colossalai", model=model, cluster=cluster).text
    assert f"sp_size={config.cp}," in text and "sequence_parallelism_mode='all_to_all'" in text
