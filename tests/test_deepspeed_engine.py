"""DeepSpeed's pipeline engine and BF16 optimizer priced as their source runs them, and
BLOOM's runs priced on the machine they ran on (Jean Zay's Omni-Path, not DGX A100's
InfiniBand)."""

from __future__ import annotations

import json
import statistics

import pytest

from planner import cost
from planner.cost.communication import CommGroup, collective_time_s
from planner.cost.stage_weights import TiedCopy, tied_sync_s
from planner.diagnose.calibration import at_site, validate
from planner.diagnose.runs import load_runs, run_from_record, site_run
from planner.graph.stacks import pipeline_transfers
from planner.graph.unfused import embedding_gradient_bytes
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


def test_tied_copies_all_reduce_the_kept_gradients() -> None:
    """The pipeline engine all-reduces the tied embedding's ``_hp_grad`` under BF16_Optimizer:
    fp32, where the data-parallel reduction casts to bf16; Megatron all-reduces ``main_grad``
    (fp32 in bf16, fp16 in fp16)."""
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 2)
    pair = CommGroup(size=2, stride=8)
    tied = TiedCopy(params=1e9, data_parallel=None, sync_group=pair)
    fp32 = collective_time_s(cluster, "all_reduce", 4e9, pair)
    assert tied_sync_s(cluster, tied, "bf16-deepspeed") == fp32
    assert tied_sync_s(cluster, tied, "bf16") == fp32
    assert tied_sync_s(cluster, tied, "fp16") == collective_time_s(cluster, "all_reduce", 2e9,
                                                                   pair)  # fmt: skip
    assert cost.gradient_bytes_on_wire("bf16-deepspeed") == 2.0


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


def _step(stack: str, precision: str, zero: int, global_batch: int):
    """GPT-3 175B over 8 A100 (TP8, no pipeline) on ``stack``: the estimate and its device."""
    model = load_model(REPO / "instances" / "models" / "gpt3-175b.json")
    model = model.model_copy(update={"num_layers": 8})
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 1)
    config = ParallelConfig(tp=8, pp=1, dp=1, mbs=1, global_batch=global_batch,
                            recompute="full", zero=zero, stack=stack,
                            precision=precision)  # fmt: skip
    return estimate(model, cluster, config), cluster.device


@pytest.mark.parametrize(("precision", "zero", "later", "first"),
                         [("bf16", 1, 18.0, 18.0), ("fp16", 1, 6.0, 0.0),
                          ("bf16", 2, 4.0, 4.0)])  # fmt: skip
def test_deepspeed_optimizer_accumulates_each_gradient(precision: str, zero: int,
                                                       later: float, first: float) -> None:
    """DeepSpeed's BF16_Optimizer adds every microbatch's bf16 gradients into its fp32 buffer
    (a cast and an add: 18 B a parameter, the first microbatch's too); in fp16 autograd adds
    into the fp16 gradients from the second microbatch on (6 B); at ZeRO-2 each gradient is
    copied into the reduction bucket (4 B). Megatron-LM accumulates inside the
    weight-gradient GEMM but for the embedding, whose gradient its hook adds into
    ``main_grad`` each microbatch (10 B a parameter of the local table, one kernel): the
    compute apart is exactly that, a launch a pass."""
    for microbatches in (1, 4):
        deepspeed, device = _step("megatron-deepspeed", precision, zero, microbatches)
        megatron, _ = _step("megatron-te", precision, zero, microbatches)
        params = deepspeed.memory.weights_gib * 2**30 / 2  # 16-bit weights, one stage
        rate = device.memory_bandwidth_bytes_s * device.efficiency.memory_bound_fraction
        launch = device.efficiency.kernel_launch_us * 1e-6
        passes = [first] + [later] * (microbatches - 1)
        table = 51200 / 8 * 12288  # GPT-3's vocabulary over TP8, a row of its hidden size
        hook = (embedding_gradient_bytes("megatron-te", 2.0)
                - embedding_gradient_bytes("megatron-deepspeed", 2.0))  # fmt: skip
        assert hook == 10.0
        by_hand = (sum(params * b / rate + launch for b in passes if b)
                   - microbatches * (table * hook / rate + launch))  # fmt: skip
        extra = deepspeed.time.compute_s - megatron.time.compute_s
        assert extra == pytest.approx(by_hand, rel=1e-9)


def test_bloom_runs_within_their_stated_error() -> None:
    """BLOOM's 27 timed runs: median |error| 7.8 % (8.7 % before Megatron's loss was priced op
    by op, 12.5 % before DeepSpeed's optimizers' gradient accumulation was, 22.3 % on DGX
    A100's network without DeepSpeed's engine), every one but the two TP2 PP24 runs (within
    3 %) predicted fast: the data-parallel rings of
    the most data-parallel runs (DP 24: 22 % fast) get less than the measured HFI rate, and
    TP8 with small microbatches misses most. A change that moves these is a change of the
    model to explain."""
    rows = [r for r in validate([shared(DEEPSPEED_RUNS)], CLUSTERS).rows if r.error is not None]
    errors = {r.id: r.error for r in rows}
    assert len(errors) == 27
    assert statistics.median(abs(e) for e in errors.values()) == pytest.approx(0.078, abs=0.005)
    slow = {run for run, e in errors.items() if e > 0}
    assert slow == {"bloom_prequel_0225_181B_r21_dp8tp2pp24mb1gbs2048",
                    "bloom_prequel_0225_181B_r22_dp8tp2pp24mb2gbs2048"}
    assert max(errors.values()) < 0.03
