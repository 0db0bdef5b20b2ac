"""Optimizer offload: priced by hand, chosen by the search only where it is the only way to fit
(against brute force over the space with every offloaded variant), refused where the cluster
has no host figures or a node's host memory cannot hold what its devices offload."""

from __future__ import annotations

import json

import numpy as np
import pytest

import planner
from planner.cost.data_parallel import NO_SYNC, optimizer_step_s
from planner.cost.offload import (
    gradient_copy_sync,
    offloaded_optimizer_step_s,
    zero_offload_step_s,
)
from planner.errors import InputError
from planner.options import Pins, SolveOptions
from planner.plan.config import ParallelConfig
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.batch import estimate_batch
from planner.uniform.launched import launched_variant, offloaded_variant
from planner.uniform.remedies import OFFLOAD, config_infeasible_message, config_remedies
from planner.uniform.space import grid_space
from planner.vocabulary import GIB
from tests.conftest import CLUSTERS, MODELS
from tests.test_cli_width import planner as run_planner
from tests.test_estimate_batch import agree

LLAMA_70B = MODELS / "llama3-70b.json"
H100 = CLUSTERS / "dgx-h100-80gb.json"
BATCH = 64
"""A global batch small enough for 16 GPUs to search quickly."""


def h100_nodes(nodes: int = 2) -> ClusterSpec:
    """DGX H100 nodes, with their host figures."""
    return planner.load_cluster(H100, nodes=nodes)


def by_hand_s(cluster: ClusterSpec, params: float) -> float:
    """The offloaded bf16 step of ``params`` parameters from the cluster file's figures: 4 B of
    fp32 gradient down and 2 B of bf16 weight up per parameter over the host link, and Adam's
    30 B per parameter (read and write 12 B of states, read the gradient, write the weight)
    through the node's host memory shared by its 8 devices; pipelined, the slowest."""
    host = cluster.host
    assert host is not None
    link = host.link_bandwidth_gb_s * 1e9
    cpu = host.memory_bandwidth_gb_s * 1e9 / cluster.devices_per_node
    return max(params * 4 / link, params * 30 / cpu, params * 2 / link)


def test_seventy_billion_on_sixteen_h100_fits_only_with_the_optimizer_offloaded() -> None:
    """The done-when case: Llama 3 70B on 2 DGX H100 nodes (16 GPUs), solved for Megatron-LM,
    is planned with the optimizer offloaded; the same configuration without offload does not
    fit, and the plan's step is that configuration's step with its device optimizer step
    swapped for the host copies and CPU Adam, by hand."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    options = SolveOptions(framework="megatron", global_batch_size=BATCH)
    plan = planner.solve(model, cluster, options)
    config = plan.configuration
    assert config is not None and config.offload == "optimizer"
    offloaded = planner.estimate(model, cluster, config)
    on_device = planner.estimate(model, cluster, config.model_copy(update={"offload": "none"}))
    assert offloaded.fits and not on_device.fits
    assert offloaded.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    # The optimizer's parameters of the busiest stage, from its 12 B of states per parameter.
    params = max(s.memory.optimizer_gib for s in on_device.stages) * GIB / 12
    offload_s = by_hand_s(cluster, params)
    assert offloaded.time.optimizer_s == pytest.approx(offload_s, rel=1e-9)
    assert offload_s > 10 * on_device.time.optimizer_s  # the host traffic is in the step
    assert offloaded.step_time_s == pytest.approx(
        on_device.step_time_s - on_device.time.optimizer_s + offload_s, rel=1e-9)
    assert offloaded.memory.optimizer_gib == 0.0
    slack = 1 + cluster.device.allocator_fragmentation  # the allocator's, on what leaves
    assert offloaded.peak_memory_gib == pytest.approx(
        on_device.peak_memory_gib - slack * on_device.memory.optimizer_gib, rel=1e-12)
    # The node's host memory holds its 8 devices' states and gradient copies (16 B each).
    assert offloaded.host_memory_gib == pytest.approx(8 * params * 16 / GIB, rel=1e-9)


def test_the_search_equals_brute_force_over_every_offloaded_variant() -> None:
    """Every configuration of the Megatron-LM space and every offloaded variant Megatron-LM
    launches, priced, the fastest that fits: the search's plan (which prices variants only of
    the configurations that fit only without their optimizer states)."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    options = SolveOptions(framework="megatron", global_batch_size=BATCH)
    space = grid_space(model, cluster, options)
    variants = [launched_variant(c.model_copy(update={"offload": "optimizer"}), model,
                                 cluster=cluster, options=options) for c in space]  # fmt: skip
    every = space + [v for v in variants if v is not None]
    assert len(every) > len(space)
    batch = estimate_batch(model, cluster, every)
    usable = options.usable_bytes(cluster.device, "megatron-te")
    assert cluster.host is not None
    fits = (batch.columns["divides"] & (batch.columns["peak_memory_gib"] * GIB <= usable)
            & (batch.columns["host_memory_gib"] * GIB <= cluster.host.memory_bytes))
    assert fits.any() and not fits[: len(space)].any()  # only offloaded variants fit
    best = float(np.min(batch.columns["step_time_s"][fits]))
    plan = planner.solve(model, cluster, options)
    assert plan.predicted.step_time_s == best


def test_no_offload_where_a_configuration_fits_without_it() -> None:
    """On 4 nodes a configuration fits on the devices: the plan keeps its optimizer there."""
    model = planner.load_model(LLAMA_70B)
    plan = planner.solve(model, h100_nodes(4),
                         SolveOptions(framework="megatron", global_batch_size=BATCH))
    assert plan.configuration is not None and plan.configuration.offload == "none"


def deepspeed_by_hand(cluster: ClusterSpec, params: float) -> tuple[float, float, float]:
    """DeepSpeed's ZeRO-Offload of ``params`` fp16 parameters from the cluster file's figures:
    the copies riding with the reduction over several microbatches under ZeRO-1 (4 B of fp32
    gradient down, and the accumulated 2 B fp16 gradient up and back down), the step (48 B
    per parameter through the node's host memory: Adam's 36 in fp16's layout, the fp32 master
    weights, moments and gradient copy read and written and the fp16 gradient and weight, the
    fp32 gradients unscaled in place 8, the master weights read again for their fp16 copy 4;
    then 2 B of fp16 weight up), and the host bytes (fp32 master weights, moments and
    gradients, the fp16 buffer, and the fp16 gradients accumulated over the microbatches)."""
    host = cluster.host
    assert host is not None
    link = host.link_bandwidth_gb_s * 1e9
    cpu = host.memory_bandwidth_gb_s * 1e9 / cluster.devices_per_node
    return params * (4 + 2 * 2) / link, params * 48 / cpu + params * 2 / link, params * 20


def test_deepspeed_fits_only_with_zero_offload() -> None:
    """The done-when case for DeepSpeed: Llama 3 70B on 2 DGX H100 nodes is planned with
    ZeRO-Offload (ZeRO-2 without a pipeline, the search's choice). Pinned to ZeRO-1 and two
    stages in fp16 (bf16 ZeRO-1 offload with a pipeline is refused: rule zero-offload-pipeline),
    without it the configuration does not fit, and its step is the on-device step with the
    optimizer's time swapped for ZeRO-Offload's step and the gradients' copies exposed after
    the pipeline (its engine reduces after the schedule), by hand: both accumulate the fp16
    gradients alike, by autograd."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    options = SolveOptions(framework="deepspeed", global_batch_size=BATCH)
    chosen = planner.solve(model, cluster, options).configuration
    assert chosen is not None and chosen.offload == "zero-offload"
    pinned = SolveOptions(framework="deepspeed", global_batch_size=BATCH,
                          pins=Pins(zero=1, pp=2), precision="fp16")  # fmt: skip
    plan = planner.solve(model, cluster, pinned)
    config = plan.configuration
    assert config is not None and config.offload == "zero-offload"
    assert config.zero == 1 and config.pp > 1 and not config.overlap_grad_reduce
    offloaded = planner.estimate(model, cluster, config)
    on_device = planner.estimate(model, cluster, config.model_copy(update={"offload": "none"}))
    assert offloaded.fits and not on_device.fits
    assert offloaded.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    params = [s.memory.optimizer_gib * GIB / 12 for s in on_device.stages]
    copy_s, step_s, host_bytes = deepspeed_by_hand(cluster, max(params))
    assert offloaded.time.optimizer_s == pytest.approx(step_s, rel=1e-9)
    # The first stage finishes its backward last: its copies are the exposed ones.
    first_copy_s = deepspeed_by_hand(cluster, params[0])[0]
    exposed_s = on_device.time.data_parallel_comm_exposed_s + first_copy_s
    assert offloaded.time.data_parallel_comm_exposed_s == pytest.approx(exposed_s, rel=1e-9)
    assert copy_s > 0 and offloaded.step_time_s == pytest.approx(
        on_device.step_time_s - on_device.time.optimizer_s + step_s + first_copy_s, rel=1e-9)
    assert offloaded.memory.optimizer_gib == 0.0
    assert offloaded.host_memory_gib == pytest.approx(8 * host_bytes / GIB, rel=1e-9)


def test_deepspeed_search_equals_brute_force_over_zero_offload_variants() -> None:
    """Every configuration of the DeepSpeed space and every ZeRO-Offload variant DeepSpeed
    launches, priced, the fastest that fits: the search's plan."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    options = SolveOptions(framework="deepspeed", global_batch_size=BATCH)
    space = grid_space(model, cluster, options)
    variants = [offloaded_variant(c, model, cluster=cluster, options=options) for c in space]
    offloaded = [v for v in variants if v is not None]
    every = space + offloaded
    batch = estimate_batch(model, cluster, every)
    divides = batch.columns["divides"][len(space):]
    # Those that divide are offloaded as DeepSpeed runs it (the rest are kept for the pricing
    # to refuse: launched_variant).
    assert {v.offload for v, d in zip(offloaded, divides, strict=True) if d} == {"zero-offload"}
    usable = options.usable_bytes(cluster.device, "megatron-deepspeed")
    assert cluster.host is not None
    fits = (batch.columns["divides"] & (batch.columns["peak_memory_gib"] * GIB <= usable)
            & (batch.columns["host_memory_gib"] * GIB <= cluster.host.memory_bytes))
    assert fits.any() and not fits[: len(space)].any()  # only offloaded variants fit
    best = float(np.min(batch.columns["step_time_s"][fits]))
    assert planner.solve(model, cluster, options).predicted.step_time_s == best


def test_frameworks_without_a_priced_offload_find_nothing() -> None:
    """Colossal-AI's and torchtitan's offloads are not priced: on the starved instance nothing
    fits for them, and the failure still lists the offload among the remedies."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    for framework in ("colossalai", "torchtitan"):
        with pytest.raises(planner.InfeasibleError, match="optimizer offload"):
            planner.solve(model, cluster, SolveOptions(framework=framework,
                                                       global_batch_size=BATCH))


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("zero", [1, 2])
def test_zero_offload_copies_by_hand(precision, zero) -> None:
    """ZeRO-Offload's gradient copies per parameter: 4 B of fp32 down with one microbatch;
    over several, ZeRO-1 adds the compute-precision round trip once, ZeRO-2 every microbatch
    (its first has nothing to bring up, taken off the once-per-step part); none for
    Megatron-LM's offload, whose copies are in its step."""
    cluster = h100_nodes()
    assert cluster.host is not None
    link = cluster.host.link_bandwidth_gb_s * 1e9
    w = {"bf16": 2, "fp16": 2, "fp32": 4}[precision]
    one = gradient_copy_sync(cluster, precision, params=1e9, zero=zero, offload="zero-offload",
                             accumulating=False)  # fmt: skip
    assert (one.reduce_once_s, one.reduce_per_microbatch_s) == (1e9 * 4 / link, 0.0)
    several = gradient_copy_sync(cluster, precision, params=1e9, zero=zero,
                                 offload="zero-offload", accumulating=True)  # fmt: skip
    m = 8
    total = several.reduce_once_s + m * several.reduce_per_microbatch_s
    by_hand = 4 + 2 * w if zero == 1 else 4 + w + 2 * w * (m - 1)
    assert total == pytest.approx(1e9 * by_hand / link, rel=1e-12)
    assert several.gather_once_s == several.gather_per_microbatch_s == 0.0
    assert gradient_copy_sync(cluster, precision, params=1e9, zero=zero, offload="optimizer",
                              accumulating=True) == NO_SYNC  # fmt: skip


def _host_starved() -> tuple[ClusterSpec, ClusterSpec, ModelSpec, ParallelConfig]:
    """Two H100 nodes, the same with 256 GiB of host memory a node (too little for Llama 3
    70B's offloaded optimizer on TP8 PP2), the model and the offloaded configuration."""
    cluster = h100_nodes()
    assert cluster.host is not None
    small = cluster.model_copy(update={"host": cluster.host.model_copy(
        update={"memory_gib": 256.0})})  # fmt: skip
    model = planner.load_model(LLAMA_70B)
    config = ParallelConfig(tp=8, pp=2, sp=True, zero=1, recompute="full", global_batch=BATCH,
                            offload="optimizer")  # fmt: skip
    return cluster, small, model, config


def test_host_memory_too_small_does_not_fit() -> None:
    """A node whose host memory cannot hold its devices' offloaded states does not fit, and
    the search finds nothing."""
    cluster, small, model, config = _host_starved()
    roomy, starved = planner.estimate(model, cluster, config), planner.estimate(model, small,
                                                                                 config)
    assert roomy.fits and not starved.fits
    assert starved.host_memory_gib == roomy.host_memory_gib > 256
    batch = estimate_batch(model, small, [config])
    assert not batch.columns["fits"][0]
    with pytest.raises(planner.InfeasibleError):
        planner.solve(model, small, SolveOptions(framework="megatron", global_batch_size=BATCH))


def test_offload_without_host_figures_names_the_missing_field() -> None:
    """An offload on a cluster without a host block: one line naming the field."""
    model = planner.load_model(LLAMA_70B)
    bare = h100_nodes().model_copy(update={"host": None})
    config = ParallelConfig(tp=8, pp=2, zero=1, global_batch=BATCH, offload="optimizer")
    with pytest.raises(InputError, match=r"^cluster dgx-h100-80gb: optimizer offload needs "
                                         r"the cluster's host figures: field 'host'"):
        planner.estimate(model, bare, config)
    with pytest.raises(InputError, match="field 'host'"):
        estimate_batch(model, bare, [config])
    # Without host figures the search prices no offload: nothing fits.
    with pytest.raises(planner.InfeasibleError, match="does not price its time"):
        planner.solve(model, bare, SolveOptions(framework="megatron", global_batch_size=BATCH))


@pytest.mark.parametrize("path", sorted(CLUSTERS.glob("*.json")), ids=lambda p: p.stem)
def test_offload_is_never_faster_than_the_device(path) -> None:
    """What the search's pruning rests on: on every bundled cluster with host figures the
    offloaded optimizer step is slower than the device's, from a million parameters up, as
    Megatron-LM and as DeepSpeed run it (ZeRO-Offload's gradient copies aside)."""
    cluster = planner.load_cluster(path)
    if cluster.host is None:
        pytest.skip("no host figures")
    for params in (1e6, 1e9, 1e11):
        for precision in ("bf16", "fp16", "fp32"):
            device_s = optimizer_step_s(cluster.device, precision, params=params)
            assert offloaded_optimizer_step_s(cluster, precision, params=params) > device_s
            assert zero_offload_step_s(cluster, precision, params=params) > device_s


def test_cli_offload_option() -> None:
    """``--offload optimizer`` (and ``zero-offload``) prices it and prints the node's host
    memory; weights and activations, or both ways at once, are refused in one line."""
    common = (LLAMA_70B, H100, "--nodes", "2", "--tp", "8", "--pp", "2", "--sp", "--zero", "1",
              "--recompute", "full", "--global-batch", str(BATCH))  # fmt: skip
    run = run_planner(80, "estimate", *common, "--offload", "optimizer")
    assert run.code == 0, run.stderr
    assert "host, per node" in run.stdout and "optimizer-offload" in run.stdout
    run = run_planner(80, "estimate", *common, "--offload", "optimizer,weights")
    assert run.code == 2
    assert "offloading weights is not priced in this release" in " ".join(run.stderr.split())
    run = run_planner(80, "estimate", *common, "--offload", "gradients")
    assert run.code == 2
    assert "'gradients' is not something to offload" in " ".join(run.stderr.split())
    run = run_planner(80, "estimate", *common, "--offload", "zero-offload")
    assert run.code == 0, run.stderr
    assert "host, per node" in run.stdout and "zero-offload" in run.stdout
    run = run_planner(80, "estimate", *common, "--offload", "optimizer,zero-offload")
    assert run.code == 2
    assert "offloaded one way" in " ".join(run.stderr.split())


def test_host_short_message_and_remedies() -> None:
    """A configuration whose devices hold their part but whose node's host memory is short:
    the error says so (not the device's memory), and the remedies hold no second offload."""
    _, small, model, config = _host_starved()
    line = config_infeasible_message(model, small, config)
    assert line.startswith("tp 8, pp 2, cp 1, ep 1, mbs 1, full recompute, ZeRO-1, optimizer "
                           "offloaded: its devices offload 525.7 GiB per node to host memory, "
                           "more than a node's 256 GiB")  # fmt: skip
    changes = [r.change for r in config_remedies(model, small, config)]
    assert "--offload optimizer" not in changes and OFFLOAD not in changes
    # More nodes: more data-parallel ranks share the states, and the host holds its part.
    assert "--nodes 8" in changes


def test_offload_remedy_is_the_estimate() -> None:
    """The remedy ``--offload optimizer`` is the estimate of the configuration offloaded: its
    peak, fit and step, and what the host copies and CPU Adam take."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    config = ParallelConfig(tp=8, pp=2, sp=True, zero=1, recompute="full", global_batch=BATCH)
    (remedy,) = [r for r in config_remedies(model, cluster, config)
                 if r.change == "--offload optimizer"]  # fmt: skip
    base = planner.estimate(model, cluster, config)
    off = planner.estimate(model, cluster, config.model_copy(update={"offload": "optimizer"}))
    assert (remedy.memory_gib, remedy.fits) == (off.peak_memory_gib, True)
    assert remedy.note == (f"step {off.step_time_s:.2f} s instead of {base.step_time_s:.2f}: the "
                           f"host copies and CPU Adam take {off.time.optimizer_s:.2f} s; 526 of "
                           f"1907.35 GiB of host memory per node")  # fmt: skip


def test_plans_record_the_offload_and_old_plans_read() -> None:
    """The solved plan carries the offload through its JSON; a plan without the field (written
    before offload) reads back as not offloaded."""
    model, cluster = planner.load_model(LLAMA_70B), h100_nodes()
    plan = planner.solve(model, cluster, SolveOptions(framework="megatron",
                                                      global_batch_size=BATCH))
    again = type(plan).model_validate_json(plan.to_json())
    assert again == plan and again.configuration is not None
    assert again.configuration.offload == "optimizer"
    assert "optimizer offloaded to the host" in again.summary()
    data = json.loads(plan.to_json())
    del data["configuration"]["offload"]
    old = type(plan).model_validate(data)
    assert old.configuration is not None and old.configuration.offload == "none"


def test_zero_offload_batch_is_the_estimate() -> None:
    """``estimate_batch`` prices ZeRO-Offload as ``estimate`` does, every column, with one
    microbatch a step and several (its copies differ), ZeRO-1 and ZeRO-2, with and without
    the reduction's overlap, with and without a pipeline; the step bit for bit."""
    model, cluster = planner.load_model(MODELS / "llama3-8b.json"), h100_nodes()
    configs = [ParallelConfig(tp=4 // pp, pp=pp, sp=True, zero=zero, overlap_grad_reduce=overlap,
                              global_batch=batch, offload=offload)
               for zero in (1, 2) for overlap in (False, True) for pp in (1, 2)
               for batch in (4, 64) for offload in ("zero-offload", "optimizer")
               if zero == 1 or pp == 1]  # fmt: skip
    batch = estimate_batch(model, cluster, configs)
    assert agree(batch, configs, model, cluster) == len(configs)
    microbatches = set()
    for i, config in enumerate(configs):
        one = planner.estimate(model, cluster, config)
        assert one.step_time_s == batch.columns["step_time_s"][i], config
        microbatches.add(one.num_microbatches)
    assert 1 in microbatches and max(microbatches) > 1
