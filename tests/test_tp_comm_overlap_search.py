"""``solve --tp-comm-overlap``: the search lets the tensor-parallel collectives overlap their
GEMMs where the framework launches it (Megatron-LM, with sequence parallelism), and not where
it does not (DeepSpeed, torchtitan, whose async TP is not priced); off by default, as
Megatron-LM's is."""

from __future__ import annotations

import pytest

import planner
from planner.options import SolveOptions
from tests.conftest import REPO

LLAMA = REPO / "instances/models/llama3-70b.json"
H100 = REPO / "instances/clusters/dgx-h100-80gb.json"


@pytest.fixture(scope="module")
def problem() -> tuple[planner.ModelSpec, planner.ClusterSpec]:
    """Llama 3 70B at 8K tokens, global batch 512, on 64 H100 (the tuner's job)."""
    model = planner.load_model(LLAMA)
    return model, planner.load_cluster(H100, nodes=8)


def _solved(problem: tuple[planner.ModelSpec, planner.ClusterSpec], framework: str,
            overlap: bool) -> planner.Plan:  # fmt: skip
    model, cluster = problem
    options = SolveOptions(framework=framework, global_batch_size=512, seq_length=8192,
                           tp_comm_overlap=overlap)  # fmt: skip
    return planner.solve(model, cluster, options)


def test_megatron_overlaps_tp_traffic_when_let(
    problem: tuple[planner.ModelSpec, planner.ClusterSpec],
) -> None:
    """Megatron-LM's plan without the option keeps the overlap off; with it, the search
    prices every TP plan with its traffic hidden and picks a faster one (wider TP, the
    traffic hidden), priced as estimate prices its configuration, and the summary says so."""
    model, cluster = problem
    plain, overlapped = _solved(problem, "megatron", False), _solved(problem, "megatron", True)
    assert plain.configuration is not None and overlapped.configuration is not None
    assert not plain.configuration.tp_comm_overlap
    assert overlapped.configuration.tp_comm_overlap and overlapped.configuration.tp > 1
    assert overlapped.predicted.step_time_s < plain.predicted.step_time_s
    assert overlapped.predicted.step_time_s == pytest.approx(
        planner.estimate(model, cluster, overlapped.configuration).step_time_s, rel=1e-12)
    assert "TP communication overlapped" in overlapped.summary()
    assert "TP communication overlapped" not in plain.summary()


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_a_framework_that_does_not_launch_it_plans_as_without(
    problem: tuple[planner.ModelSpec, planner.ClusterSpec], framework: str,
) -> None:  # fmt: skip
    """Megatron-DeepSpeed has no TP overlap, and torchtitan's async TP (compiled
    micro-pipelined ops) is not priced: the option changes neither's plan, nor does it
    refuse their TP plans."""
    with_it, without = _solved(problem, framework, True), _solved(problem, framework, False)
    assert with_it.configuration == without.configuration
    assert with_it.predicted.step_time_s == without.predicted.step_time_s


def test_a_configuration_given_with_it_keeps_it() -> None:
    """``estimate --framework megatron --tp-comm-overlap`` (the framework's switches set
    around what the user gave) keeps the overlap and prices as without ``--framework``: the
    search's default of trying it off dropped it to a 21 % slower step."""
    model = planner.load_model(REPO / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(H100, nodes=1)
    given = planner.ParallelConfig(tp=4, sp=True, tp_comm_overlap=True)
    from planner.uniform.defaults import framework_defaults

    launched = framework_defaults(given, model, cluster=cluster, framework="megatron",
                                  given=("sp", "tp_comm_overlap"))  # fmt: skip
    assert launched.tp_comm_overlap
    bare = planner.estimate(model, cluster, given.model_copy(update={
        "overlap_grad_reduce": launched.overlap_grad_reduce,
        "overlap_param_gather": launched.overlap_param_gather}))  # fmt: skip
    assert planner.estimate(model, cluster, launched).step_time_s == bare.step_time_s


def test_colossalai_overlaps_in_its_ring_mode_when_let() -> None:
    """Colossal-AI overlaps TP traffic in its ``ring`` sequence-parallel mode, which its
    Llama policy runs: Llama 3 8B pinned to TP4 on one DGX H100 is faster with the option,
    its plan's summary says so, and the launch is the ring mode."""
    model = planner.load_model(REPO / "instances/models/llama3-8b.json")
    cluster = planner.load_cluster(H100, nodes=1)
    plans = [planner.solve(model, cluster, SolveOptions(
        framework="colossalai", pins=planner.Pins(tp=4), tp_comm_overlap=overlap))
        for overlap in (False, True)]  # fmt: skip
    plain, overlapped = plans
    assert overlapped.configuration is not None and overlapped.configuration.tp_comm_overlap
    assert overlapped.predicted.step_time_s < plain.predicted.step_time_s
    assert "TP communication overlapped" in overlapped.summary()
    text = planner.frameworks.launch(overlapped, "colossalai", model=model,
                                     cluster=cluster).text  # fmt: skip
    assert "sequence_parallelism_mode='ring'" in text
