"""Long sequences: the framework search tries context parallelism across scale-up domains where
each rank keeps a long sequence, so a run ``planner estimate`` shows fitting is not reported as
fitting nowhere (issue 25: Llama 3.1 8B at 1M tokens on 64 H100, where CP stopped at 8 inside
a node and the search said the leanest needed 92.6 GiB)."""

from __future__ import annotations

import pytest

from planner import estimate
from planner.options import Pins, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.search.targets import solve
from planner.spec.reading import load_cluster, load_model
from planner.uniform.groups import LONG_SEQUENCE, within_scale_up
from planner.uniform.leanest import leanest_uniform, nodes_to_fit
from planner.uniform.space import branches

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
