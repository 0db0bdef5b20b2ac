"""DeepSpeed's pipeline engine and BF16 optimizer priced as their source runs them, and
BLOOM's runs priced on the machine they ran on (Jean Zay's Omni-Path, not DGX A100's
InfiniBand)."""

from __future__ import annotations

import json
import statistics

import pytest

from planner import cost
from planner.cost.communication import CommGroup, collective_time_s
from planner.diagnose.calibration import at_site, validate
from planner.diagnose.runs import load_runs, run_from_record, site_run
from planner.graph.stacks import pipeline_transfers
from planner.plan.config import ParallelConfig
from planner.spec.physics import cluster_warnings
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from tests.conftest import REPO, SHARED, shared

CLUSTERS = REPO / "instances" / "clusters"
DEEPSPEED_RUNS = SHARED / "validation" / "deepspeed_runs.json"


@pytest.mark.parametrize("pp", [2, 4, 16])
def test_deepspeed_engine_waits_out_each_transfer(pp: int) -> None:
    """A middle stage of DeepSpeed's ``TrainSchedule`` runs four blocking transfers a
    microbatch where Megatron's 1F1B batches them in two: twice the pipeline traffic's time
    on the stage's stream, the same with two stages (each has one neighbour)."""
    model = load_model(REPO / "instances" / "models" / "gpt3-175b.json")
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 128)
    comm = {}
    for stack in ("megatron-te", "megatron-deepspeed"):
        config = ParallelConfig(tp=8, pp=pp, dp=1024 // (8 * pp), mbs=1, global_batch=1536,
                                recompute="full", zero=1, stack=stack)  # fmt: skip
        comm[stack] = estimate(model, cluster, config).time.pipeline_comm_s
    ratio = comm["megatron-deepspeed"] / comm["megatron-te"]
    assert ratio == pytest.approx(2.0 if pp > 2 else 1.0, rel=1e-9)
    assert pipeline_transfers("megatron-deepspeed", pp) == (4 if pp > 2 else 2)


def test_bf16_optimizer_all_reduces_whole_gradients() -> None:
    """DeepSpeed's BF16_Optimizer at ZeRO-1 all-reduces every gradient, then all-gathers the
    updated weights; Megatron's distributed optimizer reduce-scatters them."""
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 4)
    group = CommGroup(size=4, stride=8)
    params = 1e9
    deepspeed = cost.data_parallel_sync(cluster, group, params=params,
                                        precision="bf16-deepspeed", zero=1)  # fmt: skip
    megatron = cost.data_parallel_sync(cluster, group, params=params, precision="bf16", zero=1)
    # DeepSpeed reduces bf16 gradients (2 B), Megatron its fp32 main gradients (4 B)
    assert deepspeed.reduce_once_s == collective_time_s(cluster, "all_reduce", 2 * params, group)
    assert megatron.reduce_once_s == collective_time_s(cluster, "reduce_scatter", 4 * params,
                                                       group)  # fmt: skip
    assert deepspeed.gather_once_s == megatron.gather_once_s


def test_a_site_is_read_only_for_its_own_device() -> None:
    """A record naming Jean Zay is priced there only on that site's A100s; on a user's own
    cluster file every run is priced on that file."""
    record = {"cluster": {"gpu": "A100-SXM4-80GB", "inter_node": "Omni-Path (Jean Zay)"}}
    assert site_run(record, "A100") == "Jean Zay"
    assert site_run(record, "A100-40GB") is None
    assert site_run({"cluster": {"gpu": "A100-SXM4-80GB"}}, "A100") is None
    bloom = next(iter(load_runs(shared(DEEPSPEED_RUNS))))
    assert (bloom.site, bloom.cluster_key) == ("Jean Zay", "A100@Jean Zay")
    first = json.loads(DEEPSPEED_RUNS.read_text())[0]
    own = run_from_record(first, any_device=True)
    assert own is not None and own.site is None


def test_site_keeps_the_device_and_replaces_the_network() -> None:
    """Jean Zay's cluster is the A100 file's device (its fitted efficiencies) on 52 nodes with
    four 100 Gb/s Omni-Path links a node, at the rate BigScience measured an HFI carry."""
    a100 = load_cluster(CLUSTERS / "dgx-a100-80gb.json")
    site = at_site(a100, CLUSTERS, "Jean Zay")
    assert site.device == a100.device
    assert site.num_nodes == 52
    assert cluster_warnings(site, source="jean-zay") == ()
    outer = site.network[-1]
    assert outer.bandwidth_gb_s * 8 == pytest.approx(4 * 100 / 8)  # 4 x 100 Gb/s a node
    # one HFI carried 5.07 GB/s each way of its 12.5 (the fraction in the file)
    assert outer.bandwidth_bytes_s * 8 / 4 == pytest.approx(5.07e9, rel=1e-3)


def test_bloom_runs_within_their_stated_error() -> None:
    """BLOOM's 27 timed runs: median |error| 12.5 % (22.3 % on DGX A100's network without
    DeepSpeed's engine), every one predicted fast: what DeepSpeed costs beyond its transfers
    and reductions per pipeline slot (MT-NLG against Megatron's PTD-P) is not modelled, and
    the data-parallel rings of the most data-parallel runs (DP 24: 24 % fast) get less than
    the measured HFI rate. A change that moves these is a change of the model to explain."""
    rows = [r for r in validate([shared(DEEPSPEED_RUNS)], CLUSTERS).rows if r.error is not None]
    errors = [r.error for r in rows]
    assert len(errors) == 27
    assert statistics.median(abs(e) for e in errors) == pytest.approx(0.125, abs=0.01)
    assert max(errors) < 0
