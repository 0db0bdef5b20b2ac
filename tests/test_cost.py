"""The cost model's formulas, checked against hand-computed known answers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from planner import cost
from planner.graph.ops import Op, Tensor
from planner.spec import ClusterSpec, DeviceSpec, GemmEfficiency
from planner.spec.reading import load_cluster
from tests.conftest import CLUSTERS


@pytest.fixture
def cluster() -> ClusterSpec:
    """4 nodes x 8 devices; NVLink 300 GB/s, 2 us; network 25 GB/s, 5 us; ideal links."""
    return ClusterSpec.model_validate({
        "name": "toy", "num_nodes": 4, "devices_per_node": 8,
        "device": {"name": "gpu", "memory_gib": 80, "memory_bandwidth_gb_s": 2000,
                   "peak_tflops": {"bf16": 300}},
        "network": [
            {"name": "nvlink", "domain_devices": 8, "bandwidth_gb_s": 300, "latency_us": 2},
            {"name": "ib", "domain_devices": 32, "bandwidth_gb_s": 25, "latency_us": 5},
        ],
    })  # fmt: skip


GB = 1e9


def test_ring_all_reduce_in_a_node(cluster: ClusterSpec) -> None:
    """All-reduce of S on n ranks: 2(n-1)/n S / B plus 2 log2(n) latencies."""
    got = cost.collective_time_s(cluster, "all_reduce", 1 * GB, cost.CommGroup(size=8))
    assert got == pytest.approx(2 * 7 / 8 * GB / (300 * GB) + 2 * 3 * 2e-6)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_gather_and_scatter_move_half_an_all_reduce(cluster: ClusterSpec, kind: str) -> None:
    """All-gather and reduce-scatter: (n-1)/n S / B plus log2(n) latencies."""
    got = cost.collective_time_s(cluster, kind, 1 * GB, cost.CommGroup(size=4))  # type: ignore[arg-type]
    assert got == pytest.approx(3 / 4 * GB / (300 * GB) + 2 * 2e-6)


def test_all_reduce_across_nodes_crosses_at_every_nic(cluster: ClusterSpec) -> None:
    """32 ranks on 4 nodes: NCCL's channels cross each node at a different NIC, so the ring
    moves its bytes over the node's eight 25 GB/s links at once (200 GB/s, below NVLink's
    300): cheaper than the in-node and cross-node phases in turn, and than a flat ring."""
    s = 8 * GB
    channelled = 2 * 31 / 32 * s / (8 * 25 * GB) + 2 * 5 * 5e-6
    in_node = 2 * 7 / 8 * s / (300 * GB) + 2 * 3 * 2e-6
    across = 2 * 3 / 4 * (s / 8) / (25 * GB) + 2 * 2 * 5e-6
    flat = 2 * 31 / 32 * s / (25 * GB) + 2 * 5 * 5e-6
    got = cost.collective_time_s(cluster, "all_reduce", s, cost.CommGroup(size=32))
    assert got == pytest.approx(channelled)
    assert got < in_node + across < flat


def test_two_dgx_h100_all_reduce_at_the_published_bus_bandwidth() -> None:
    """16 ranks on 2 DGX H100 (one 400 Gb/s NIC a GPU): NVIDIA's maintainers expect 46-48 GB/s
    per NIC in a 2-node all_reduce_perf (NVIDIA/nccl-tests#290), eight NICs a node: a bus
    bandwidth of 368-384 GB/s at 1 GiB. The phases in turn gave about 250."""
    h100 = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=2)
    size, n = 2**30, 16
    seconds = cost.collective_time_s(h100, "all_reduce", size, cost.CommGroup(size=n))
    busbw = size / seconds * 2 * (n - 1) / n / GB
    assert 8 * 46 * 0.99 < busbw < 8 * 48


def test_one_rank_per_node_pays_the_network(cluster: ClusterSpec) -> None:
    """A data-parallel group with one rank per node (stride 8, as under TP 8) is a flat ring
    over the network level."""
    got = cost.collective_time_s(cluster, "all_reduce", GB, cost.CommGroup(size=4, stride=8))
    assert got == pytest.approx(2 * 3 / 4 * GB / (25 * GB) + 2 * 2 * 5e-6)
    assert cost.members_per_level(cluster, cost.CommGroup(size=4, stride=8)) == (1, 4)


def test_all_to_all_splits_traffic_by_level(cluster: ClusterSpec) -> None:
    """All-to-all on 16 ranks over 2 nodes: 7/16 of each buffer stays in the node, 8/16 crosses
    the network; the levels work in parallel, so the slower one sets the time."""
    got = cost.collective_time_s(cluster, "all_to_all", GB, cost.CommGroup(size=16))
    assert got == pytest.approx(max(7 / 16 * GB / (300 * GB), 8 / 16 * GB / (25 * GB)) + 4 * 5e-6)


def test_efficiency_scales_bandwidth(cluster: ClusterSpec) -> None:
    """A link efficiency of 0.5 doubles the bandwidth term."""
    data = cluster.model_dump()
    data["network"][0]["efficiency"]["bandwidth_fraction"] = 0.5
    slow = ClusterSpec.model_validate(data)
    group = cost.CommGroup(size=8)
    fast_s = cost.collective_time_s(cluster, "all_gather", GB, group) - 3 * 2e-6
    slow_s = cost.collective_time_s(slow, "all_gather", GB, group) - 3 * 2e-6
    assert slow_s == pytest.approx(2 * fast_s)


def test_p2p_inside_and_across_nodes(cluster: ClusterSpec) -> None:
    """Neighbours 4 ranks apart share a node; 8 apart do not."""
    assert cost.p2p_time_s(cluster, GB, 4) == pytest.approx(2e-6 + GB / (300 * GB))
    assert cost.p2p_time_s(cluster, GB, 8) == pytest.approx(5e-6 + GB / (25 * GB))


def test_a_pipeline_runs_at_its_slowest_send(cluster: ClusterSpec) -> None:
    """Two stages 4 ranks apart fit one 8-GPU node (NVLink); four such stages span two nodes,
    so stages 1 and 2 talk over InfiniBand and the whole pipeline is priced there. Each
    stage sends its activation forward and its gradient back, once per chunk."""
    inside = cost.pipeline_send_s(cluster, GB, 4, chunks=1, stages=2)
    across = cost.pipeline_send_s(cluster, GB, 4, chunks=3, stages=4)
    assert inside == pytest.approx(2 * (2e-6 + GB / (300 * GB)))
    assert across == pytest.approx(2 * 3 * (5e-6 + GB / (25 * GB)))
    assert cost.pipeline_send_s(cluster, GB, 4, chunks=1, stages=1) == 0.0


def test_pipeline_sends_in_slices_gathered_back(cluster: ClusterSpec) -> None:
    """Megatron's scatter-gather: each of 4 tensor-parallel ranks sends a quarter of the hidden
    state to the next stage, whose ranks all-gather it back over NVLink (4 ranks: ring
    ``3/4`` of the bytes, ``log2 4`` latencies), once per direction and chunk. Without a
    pipeline nothing moves, gather or not."""
    tensor = cost.CommGroup(size=4, stride=1)
    got = cost.pipeline_send_s(cluster, GB, 8, chunks=2, stages=4, slices=4, gather=tensor)
    send = 5e-6 + GB / 4 / (25 * GB)
    gather = 3 / 4 * GB / (300 * GB) + 2 * 2e-6
    assert got == pytest.approx(2 * 2 * (send + gather), rel=1e-12)
    alone = cost.pipeline_send_s(cluster, GB, 8, chunks=2, stages=4, slices=4)
    assert alone == pytest.approx(2 * 2 * send, rel=1e-12)
    assert cost.pipeline_send_s(cluster, GB, 8, chunks=2, stages=1, gather=tensor) == 0.0


def test_hidden_state_bytes() -> None:
    """``b x s x h`` activations of 2 bytes (bf16) or 4 (fp32)."""
    assert cost.hidden_state_bytes(micro_batch_size=2, seq_length=4096, hidden_size=8192,
                                   precision="bf16") == 2 * 4096 * 8192 * 2  # fmt: skip
    assert cost.hidden_state_bytes(micro_batch_size=1, seq_length=10, hidden_size=3,
                                   precision="fp32") == 120  # fmt: skip


def test_single_rank_collectives_are_free(cluster: ClusterSpec) -> None:
    """A group of one moves nothing."""
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert cost.collective_time_s(cluster, kind, GB, cost.CommGroup(size=1)) == 0.0  # type: ignore[arg-type]


def test_gemm_efficiency_curve() -> None:
    """Half of max_fraction at half_saturation, approaching max_fraction for large GEMMs."""
    eff = GemmEfficiency(max_fraction=0.8, half_saturation_gflop=10)
    assert cost.gemm_fraction(eff, 10e9) == pytest.approx(0.4)
    assert cost.gemm_fraction(eff, 1e15) == pytest.approx(0.8, rel=1e-4)


def test_same_flops_per_device_same_compute_time() -> None:
    """Splitting a GEMM's FLOPs 8 ways costs the same whether the output columns (tensor
    parallel) or the tokens (sequence/data parallel) are split: efficiency depends only on the
    FLOPs per call, so a solver is not steered by rounding. Also: memory-bound ops are priced
    by bytes (the roofline's other side)."""
    gpu = DeviceSpec(
        name="g", memory_gib=80, memory_bandwidth_gb_s=2000, peak_tflops={"bf16": 300},
        efficiency={"gemm": {"max_fraction": 0.7, "half_saturation_gflop": 5}},
    )  # fmt: skip
    x = Tensor((("batch", 1), ("seq", 4096), ("hidden", 8192)), 2.0)
    y = Tensor((("batch", 1), ("seq", 4096), ("ffn", 32768)), 2.0)
    up = Op(name="up", kind="linear", layer=1, layer_kind="dense", inputs=(x,), output=y,
            weight=Tensor((("hidden", 8192), ("ffn", 32768)), 2.0),
            flops=2.0 * 4096 * 8192 * 32768)  # fmt: skip
    by_columns = cost.op_time(up, gpu, "bf16", activation_degrees={"ffn": 8},
                              weight_degrees={"ffn": 8}, compute_degree=8)  # fmt: skip
    by_tokens = cost.op_time(up, gpu, "bf16", activation_degrees={"seq": 8},
                             weight_degrees={}, compute_degree=8)  # fmt: skip
    assert by_columns == by_tokens
    flops = up.flops / 8
    expected = flops / (300e12 * 0.7 * flops / (flops + 5e9))
    assert by_columns.forward_s == pytest.approx(expected)
    assert cost.compute_time_s(gpu, "bf16", flops=0, bytes_moved=4e9) == pytest.approx(2e-3)


@pytest.mark.parametrize(
    ("precision", "full", "distributed"),
    # Megatron-LM distributed-optimizer docs: bytes per parameter, non-distributed vs
    # distributed over d data-parallel ranks.
    [("bf16", 18, lambda d: 6 + 12 / d), ("fp16", 20, lambda d: 4 + 16 / d),
     ("fp32", 16, lambda d: 8 + 8 / d)],
)  # fmt: skip
def test_optimizer_state_bytes_match_megatron(precision: str, full: float, distributed) -> None:
    """ZeRO 0 and ZeRO 1 (distributed optimizer) per-parameter bytes."""
    assert cost.state_bytes_per_param(precision, zero=0, shards=8).total == full  # type: ignore[arg-type]
    for d in (2, 8, 64):
        got = cost.state_bytes_per_param(precision, zero=1, shards=d).total  # type: ignore[arg-type]
        assert got == pytest.approx(distributed(d))


def test_zero_stages_shard_progressively() -> None:
    """ZeRO-2 also shards gradients, ZeRO-3 also weights (Rajbhandari et al. 2020, Fig. 1:
    2 + 2 + 12 = 16 bytes/param with fp16 grads becomes (2 + 2 + 12)/N at stage 3)."""
    z2 = cost.state_bytes_per_param("bf16", zero=2, shards=4)
    z3 = cost.state_bytes_per_param("bf16", zero=3, shards=4)
    assert (z2.weights, z2.gradients, z2.optimizer) == (2, 1, 3)
    assert z3.total == pytest.approx(18 / 4)


def test_pipeline_time_alpa_form() -> None:
    """Unequal stages: sum(t) + (m - 1) max(t) (Alpa, Eq. 2)."""
    times = [1.0, 3.0, 2.0]
    got = cost.pipeline_time(times, num_microbatches=5)
    assert got.total_s == sum(times) + 4 * max(times)


def test_one_step_formula() -> None:
    """The step of a list of stage times is :func:`cost.fill_and_drain` of their sum and max,
    to the last bit; elementwise over an array it gives what it gives each element alone."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        times = rng.uniform(1e-3, 2.0, size=int(rng.integers(1, 9))).tolist()
        m, v = int(rng.integers(1, 65)), int(rng.integers(1, 5))
        got = cost.pipeline_time(times, num_microbatches=m, vpp=v)
        total, bubble = cost.fill_and_drain(sum_s=sum(times), max_s=max(times),
                                            num_microbatches=m, vpp=v)  # fmt: skip
        assert (got.total_s, got.bubble_s) == (total, bubble)
        if v == 1:
            alpa = sum(times) + (m - 1) * max(times)
            assert got.total_s == pytest.approx(alpa, rel=1e-12)
        maxima = rng.uniform(1e-3, 2.0, size=5)
        vector = cost.fill_and_drain(sum_s=10.0, max_s=maxima, num_microbatches=m, vpp=v)[0]
        assert vector.tolist() == [
            cost.fill_and_drain(sum_s=10.0, max_s=float(x), num_microbatches=m, vpp=v)[0]
            for x in maxima
        ]


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 1), (8, 64, 1), (16, 32, 2), (4, 16, 4)])
def test_bubble_fraction_closed_form(p: int, m: int, v: int) -> None:
    """Equal stages: bubble / busy = (p - 1)/(v m) (Narayanan et al. SC'21, Sec. 2.2), so
    the bubble's share of the pipeline is (p - 1) / (v m + p - 1)."""
    got = cost.pipeline_time([0.5] * p, num_microbatches=m, vpp=v)
    assert got.bubble_s / (got.total_s - got.bubble_s) == pytest.approx((p - 1) / (v * m))
    share = cost.bubble_share(bubble_s=got.bubble_s, step_s=got.total_s)
    assert share == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)
    assert cost.bubble_fraction(pp=p, vpp=v, num_microbatches=m) == pytest.approx(share,
                                                                                  rel=1e-12)


@pytest.mark.parametrize(("p", "m"), [(16, 1), (96, 8), (128, 4), (2, 1)])
def test_bubble_share_never_passes_the_step(p: int, m: int) -> None:
    """Fewer microbatches than stages: the bubble over the busy time, (p - 1) / m, passes
    100 % (15 at p = 16, m = 1), but its share of the step stays below 1, (p - 1) / (m + p - 1)
    (15 / 16)."""
    got = cost.pipeline_time([0.5] * p, num_microbatches=m)
    assert got.bubble_s / (got.total_s - got.bubble_s) == pytest.approx((p - 1) / m)
    share = cost.bubble_share(bubble_s=got.bubble_s, step_s=got.total_s)
    assert share == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert 0 < share < 1
    assert cost.bubble_share(bubble_s=0.0, step_s=0.0) == 0.0


def test_exposed_never_negative() -> None:
    """Communication hidden behind more compute than it takes costs nothing, never less."""
    assert cost.exposed_s(1.0, 3.0) == 0.0
    assert cost.exposed_s(3.0, 1.0) == 2.0
    assert math.isclose(cost.exposed_s(2.5, 0.0), 2.5)


def _ring_timeline_exposed_s(step_s: float, compute_s: float, n: int) -> float:
    """A ring of ``n`` steps simulated step by step: each of the first ``n - 1`` steps computes
    its block (``compute_s / n``) while the next block arrives (``step_s``); a step starts when
    both are done. Returns the time beyond the compute."""
    clock = 0.0
    for _ in range(n - 1):
        clock += max(compute_s / n, step_s)
    return clock + compute_s / n - compute_s


@pytest.mark.parametrize("seed", range(20))
def test_ring_attention_exposure_matches_a_step_by_step_ring(seed: int) -> None:
    """cost.ring_attention_exposed_s against a step-by-step simulation of the ring, forward
    (one block per step) and backward (the block and its gradient: twice the bytes)."""
    rng = random.Random(seed)
    n = rng.choice([2, 4, 8])
    cluster = ClusterSpec.model_validate({
        "name": "c", "num_nodes": 1, "devices_per_node": 8,
        "device": {"name": "g", "memory_gib": 80, "memory_bandwidth_gb_s": 2000,
                   "peak_tflops": {"bf16": 300}},
        "network": [{"name": "l", "domain_devices": 8, "bandwidth_gb_s": 100, "latency_us": 0}],
    })  # fmt: skip
    kv = rng.uniform(1e6, 1e9)
    forward, backward = rng.uniform(1e-4, 1e-2), rng.uniform(1e-4, 3e-2)
    total, fwd = cost.ring_attention_exposed_s(cluster, kv, cost.CommGroup(size=n),
                                               forward_s=forward, backward_s=backward)  # fmt: skip
    step = (n - 1) / n * kv / 100e9 / (n - 1)
    assert fwd == pytest.approx(_ring_timeline_exposed_s(step, forward, n), rel=1e-9, abs=1e-15)
    assert total - fwd == pytest.approx(_ring_timeline_exposed_s(2 * step, backward, n),
                                        rel=1e-9, abs=1e-15)  # fmt: skip


def test_fused_attention_runs_at_its_own_curve(cluster: ClusterSpec) -> None:
    """With an attention curve, a fused causal attention core runs at that curve's fraction
    for half its sequence of keys and its head dim, whatever the GEMM curve says; without one,
    at the GEMM curve (as before calibration)."""
    from planner.graph import lowered
    from planner.spec import AttentionEfficiency, ModelSpec, TrainingSpec

    model = ModelSpec(name="m", num_layers=1, hidden_size=2048, num_attention_heads=16,
                      vocab_size=1000, max_position_embeddings=8192)  # fmt: skip
    index = lowered(model, TrainingSpec(seq_length=8192, global_batch_size=1), 1)[1]
    [core] = [op for op in index.ops_by_layer[1] if op.kind == "attention"]
    assert core.head_dim == 128
    curve = AttentionEfficiency(max_fraction=0.5, half_saturation_tokens=4096,
                                half_saturation_head_dim=32)  # fmt: skip
    data = cluster.device.model_dump()
    data["efficiency"]["attention"] = curve.model_dump()
    device = DeviceSpec.model_validate(data)
    times = cost.op_time(core, device, "bf16", activation_degrees={}, weight_degrees={},
                         compute_degree=1)  # fmt: skip
    fraction = 0.5 * 4096 / (4096 + 4096) * 128 / (128 + 32)
    executed = cost.executed_flops(core, flash_attention=True)
    launch = device.efficiency.kernel_launch_us * 1e-6
    peak = device.peak_flops_per_s("bf16")
    assert times.forward_s == pytest.approx(executed.forward / (peak * fraction) + launch)
    assert times.backward_s == pytest.approx(executed.backward / (peak * fraction) + 2 * launch)
