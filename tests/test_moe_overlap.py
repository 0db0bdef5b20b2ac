"""The experts' all-to-alls overlapped as Megatron-Core's combined 1F1B runs them
(``--overlap-moe-expert-parallel-comm``): one microbatch's forward beside another's backward,
each direction's all-to-all hidden by the other's compute, on all but the unpaired
microbatches, at the price of one more microbatch in flight."""

from __future__ import annotations

import pytest

import planner
from planner.cost import paired_fraction
from planner.frameworks import profile
from planner.plan.config import ParallelConfig, resolve
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_columns
from planner.uniform.plan import uniform_plan
from tests.conftest import REPO
from tests.test_estimate_batch import agree

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"


def test_overlap_hides_all_but_the_unpaired_microbatches_all_to_alls() -> None:
    """Mixtral, EP8 without a pipeline, 4 microbatches: 3 run paired. Its all-to-alls are
    shorter than the compute beside them, so a paired microbatch hides all of its own, and
    the step exposes a quarter of them (H100's fitted contention is 0); the forward of the
    next microbatch is in flight beside the backward, so the activations double."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 8)
    knobs = dict(ep=8, zero=1, mbs=1, recompute="selective", global_batch=256, seq_len=4096)
    plain = planner.estimate(model, cluster, ParallelConfig(**knobs))
    overlapped = planner.estimate(model, cluster, ParallelConfig(
        overlap_moe_expert_parallel_comm=True, **knobs))  # fmt: skip
    assert paired_fraction("1f1b", pp=1, vpp=1, num_microbatches=4) == 0.75
    assert overlapped.time.expert_parallel_comm_s == pytest.approx(
        0.25 * plain.time.expert_parallel_comm_s, rel=1e-9)  # fmt: skip
    assert overlapped.time.compute_s == pytest.approx(plain.time.compute_s, rel=1e-12)
    assert overlapped.memory.activations_gib == pytest.approx(
        2 * plain.memory.activations_gib, rel=1e-9)  # fmt: skip


def test_the_batch_prices_overlap_as_estimate_does() -> None:
    """Overlapped and not, with and without an interleaved pipeline: the batch pricer and
    ``estimate`` agree on every column."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 8)
    configs = [ParallelConfig(ep=8, pp=pp, vpp=vpp, zero=1, mbs=1, global_batch=256,
                              seq_len=4096, overlap_moe_expert_parallel_comm=a2a)
               for pp, vpp in ((1, 1), (4, 2)) for a2a in (False, True)]  # fmt: skip
    batch = estimate_batch(model, cluster, config_columns(configs))
    assert agree(batch, configs, model, cluster) == 4


def test_megatron_launches_it_with_more_connections() -> None:
    """Megatron-LM's launch sets the flag and CUDA_DEVICE_MAX_CONNECTIONS=32, as its
    argument check advises for the overlap."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 8)
    config = ParallelConfig(pp=4, vpp=2, ep=8, zero=1, mbs=1, global_batch=256, seq_len=4096,
                            overlap_moe_expert_parallel_comm=True)  # fmt: skip
    launch = profile("megatron").launch(resolve(model, cluster, config), model)
    assert "--overlap-moe-expert-parallel-comm" in launch.text
    assert launch.environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    plan = uniform_plan(model, cluster, config)
    assert plan.summary().endswith("experts' all-to-alls overlapped")


def test_without_experts_there_is_nothing_to_overlap() -> None:
    """A dense model, or experts on one rank, has no all-to-all: the switch is refused."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 8)
    with pytest.raises(planner.ConfigError, match="needs expert parallelism"):
        resolve(model, cluster, ParallelConfig(overlap_moe_expert_parallel_comm=True,
                                               global_batch=256, seq_len=4096))


def test_simulate_counts_the_overlaps_chunk_in_its_closed_form() -> None:
    """With the experts' all-to-alls overlapped the memory holds one chunk more than the
    schedule's warm-up (combined 1F1B): ``simulate``'s closed-form column is that count, one
    chunk above the simulated schedule's (it showed the plain schedule's in both, confirming a
    count the memory did not use), and the report says why they differ."""
    from planner.report.simulation import simulation_tables
    from planner.simulate.events import closed_form_in_flight, simulate_plan
    from tests.test_stage_tables import _text

    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, nodes=4)
    config = dict(tp=1, pp=2, vpp=4, ep=8, mbs=1, recompute="selective")
    plans = [uniform_plan(model, cluster, ParallelConfig(**config,
                                                         overlap_moe_expert_parallel_comm=on))
             for on in (False, True)]  # fmt: skip
    plain, overlapped = (simulate_plan(p) for p in plans)
    assert closed_form_in_flight(plans[0]) == list(plain.peak_in_flight)
    assert closed_form_in_flight(plans[1]) == [x + 1 / 4 for x in overlapped.peak_in_flight]
    text = " ".join(_text(simulation_tables(plans[1], overlapped), 100).split())
    assert "the closed form, the memory's, holds one chunk more" in text
