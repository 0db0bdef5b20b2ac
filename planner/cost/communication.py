"""Communication time: alpha-beta per collective with ring bus-bandwidth factors, one ring
through the group's ranks as NCCL channels it across the network levels the group spans;
all-to-all split by level; point-to-point sends; overlap."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.elementwise import Real, maximum
from planner.graph.lower import ACTIVATION_BYTES
from planner.spec import ClusterSpec, NetworkLevel
from planner.vocabulary import CollectiveKind, Precision


@dataclass(frozen=True, slots=True, kw_only=True)
class CommGroup:
    """``size`` ranks spaced ``stride`` apart in the cluster's rank order (rank = device)."""

    size: int
    """Ranks in the group."""
    stride: int = 1
    """Ranks between consecutive members in the cluster's rank order (1: contiguous)."""


def members_per_level(cluster: ClusterSpec, group: CommGroup) -> tuple[int, ...]:
    """How many of the group's ranks share one domain of each network level.

    >>> from planner.spec import ClusterSpec
    >>> c = ClusterSpec.model_validate({"name": "c", "num_nodes": 4, "devices_per_node": 8,
    ...     "device": {"name": "g", "memory_gib": 80, "memory_bandwidth_gb_s": 2000,
    ...                "peak_tflops": {"bf16": 300}},
    ...     "network": [{"name": "nvlink", "domain_devices": 8, "bandwidth_gb_s": 300,
    ...                  "latency_us": 2},
    ...                 {"name": "ib", "domain_devices": 32, "bandwidth_gb_s": 25,
    ...                  "latency_us": 5}]})
    >>> members_per_level(c, CommGroup(size=32)), members_per_level(c, CommGroup(size=4, stride=8))
    ((8, 32), (1, 4))
    """
    counts = [
        min(group.size, max(1, level.domain_devices // group.stride)) for level in cluster.network
    ]
    counts[-1] = group.size  # the outermost level connects every device
    return tuple(counts)


def collective_time_s(
    cluster: ClusterSpec, kind: CollectiveKind, nbytes: float, group: CommGroup
) -> float:
    """Seconds of one collective on ``group``.

    ``nbytes`` is the full buffer: the all-reduced tensor, the all-gather's output, the
    reduce-scatter's input, or one rank's all-to-all send buffer.
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    counts = members_per_level(cluster, group)
    levels = cluster.network
    outer = next(i for i, c in enumerate(counts) if c == n)
    if kind == "all_to_all":
        # Each rank sends (c_l - c_{l-1}) / n of its buffer over level l; levels run in parallel.
        previous, slowest = 1, 0.0
        for count, level in zip(counts[: outer + 1], levels, strict=False):
            slowest = max(slowest, (count - previous) / n * nbytes / level.bandwidth_bytes_s)
            previous = count
        return slowest + levels[outer].latency_s * math.ceil(math.log2(n))
    return _channelled_ring_s(kind, nbytes, counts[: outer + 1], levels)


def _channelled_ring_s(
    kind: CollectiveKind, nbytes: float, counts: tuple[int, ...], levels: tuple[NetworkLevel, ...]
) -> float:  # fmt: skip
    """One ring through the group's ``counts[-1]`` ranks as NCCL runs it across network
    levels: the buffer split over channels, each a ring that leaves a node through a
    different member's network device (``src/graph/search.cc``: one NIC per channel, spread
    over the node's NICs), so every level moves its share at once and the slowest bounds the
    whole. The innermost level carries the ring's bytes over each rank's own link; every outer
    level over the ``counts[0]`` links of the group's ranks in the innermost domain (a node,
    or an NVLink domain) where a channel crosses: a ring crosses a leaf or spine boundary at
    one such domain per channel, not at every rank of the leaf. On 2 DGX H100 nodes (16
    ranks, one 400 Gb/s NIC a GPU) that is eight NICs at once, 368 GB/s of bus bandwidth,
    NVLink's 369 just above: NVIDIA's maintainers expect 46-48 GB/s per NIC there
    (NVIDIA/nccl-tests#290). With one rank a node it is the flat ring on the outer level."""
    n = counts[-1]
    if n <= 1 or nbytes <= 0:
        return 0.0
    links = (1, *(counts[0],) * (len(counts) - 1))
    slowest = min(level.bandwidth_bytes_s * links[i]
                  for i, level in enumerate(levels[: len(counts)]))  # fmt: skip
    rounds = 2 if kind == "all_reduce" else 1
    latency = rounds * math.ceil(math.log2(n)) * levels[len(counts) - 1].latency_s
    return rounds * (n - 1) / n * nbytes / slowest + latency


def p2p_time_s(cluster: ClusterSpec, nbytes: float, distance: int, *, ranks: int = 2) -> float:
    """Seconds to send ``nbytes`` between neighbours of a row of ``ranks`` ranks ``distance``
    apart, at the slowest pair's pace: when the row spans several domains of a level, some
    neighbours sit in different domains (four stages of four ranks on 8-GPU nodes: stages 1
    and 2 are in different nodes), so the row is priced at the outermost level it spans."""
    if nbytes <= 0 or ranks <= 1:
        return 0.0
    counts = members_per_level(cluster, CommGroup(size=ranks, stride=max(1, distance)))
    level = cluster.network[next(i for i, c in enumerate(counts) if c == ranks)]
    return level.latency_s + nbytes / level.bandwidth_bytes_s


def hidden_state_bytes(
    *, micro_batch_size: int, seq_length: int, hidden_size: int, precision: Precision
) -> float:
    """One microbatch's hidden state ``[b, s, h]`` in activation precision: what a pipeline
    stage sends the next one per model chunk (and the gradient it gets back).

    >>> hidden_state_bytes(micro_batch_size=1, seq_length=2048, hidden_size=12288,
    ...                    precision="bf16") / 2**20
    48.0
    """
    return micro_batch_size * seq_length * hidden_size * ACTIVATION_BYTES[precision]


def pipeline_send_s(
    cluster: ClusterSpec,
    nbytes: float,
    distance: int,
    *,
    chunks: int,
    stages: int = 2,
    slices: int = 1,
    gather: CommGroup | None = None,
    transfers: int = 2,
) -> float:
    """One stage's pipeline traffic per microbatch: the hidden state it passes on (``nbytes``,
    :func:`hidden_state_bytes` as the stage holds it) sent forward and its gradient sent back,
    once per model chunk it holds, between ``stages`` stages ``distance`` ranks apart
    (:func:`p2p_time_s`: the pipeline runs at its slowest send); nothing without a pipeline.
    ``transfers`` is how many transfers of that size hold the stage's stream a microbatch
    (:func:`planner.graph.stacks.pipeline_transfers`: 2, or 4 on DeepSpeed's engine).

    Each device sends ``1/slices`` of it. With ``gather``, the receivers all-gather the slices
    back over that group (Megatron's scatter-gather over tensor-parallel ranks, Narayanan et
    al., SC'21, Sec. 4.1); without, the slices are what the next stage holds (a mesh's share,
    or sequence-parallel shards)."""
    if stages <= 1:
        return 0.0
    send = transfers * chunks * p2p_time_s(cluster, nbytes / slices, distance, ranks=stages)
    if gather is not None:
        send += transfers * chunks * collective_time_s(cluster, "all_gather", nbytes, gather)
    return send


def ring_attention_exposed_s(
    cluster: ClusterSpec, kv_bytes: float, group: CommGroup, *, forward_s: float,
    backward_s: float,
) -> tuple[float, float]:
    """(forward and backward, forward) seconds of ring attention's K/V exchange left on the
    critical path, priced per ring step.

    ``kv_bytes`` is the whole sequence's K and V as one rank of ``group`` would hold them
    unsharded (grouped-query attention's fewer K/V heads make it smaller); ``forward_s`` and
    ``backward_s`` are the rank's attention compute. Of ``n`` ring steps, the first ``n - 1``
    each send one block to the next rank while computing on the block held: the exposed time
    is the transfer beyond that step's compute (``1/n`` of the attention with load-balanced
    causal chunks), step by step, never hidden by other steps' slack or by other ops. Backward
    sends the blocks again with their gradients: twice the bytes per step (Transformer
    Engine's ``AttnFuncWithCPAndKVP2P``, ``transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py``, which Megatron-Core's context parallelism
    calls).

    >>> from planner.spec import ClusterSpec
    >>> c = ClusterSpec.model_validate({"name": "c", "num_nodes": 1, "devices_per_node": 4,
    ...     "device": {"name": "g", "memory_gib": 80, "memory_bandwidth_gb_s": 2000,
    ...                "peak_tflops": {"bf16": 300}},
    ...     "network": [{"name": "l", "domain_devices": 4, "bandwidth_gb_s": 1,
    ...                  "latency_us": 0}]})
    >>> ring_attention_exposed_s(c, 4e9, CommGroup(size=4), forward_s=2.0, backward_s=4.0)
    (4.5, 1.5)
    >>> ring_attention_hidden_s(c, 4e9, CommGroup(size=4), forward_s=2.0, backward_s=4.0)
    (4.5, 1.5)

    PyTorch's all-gathering variant (:func:`allgather_attention_exposed_s`) on the same
    cluster, where the ring leaves 3 s exposed: its all-gather takes 3 s, 1.5 beyond the
    forward's first step and 2 beyond the backward's; an fp32 gradient block 2 s, 1 beyond
    each of the 3 next steps and 2 after the last.

    >>> ring_attention_exposed_s(c, 4e9, CommGroup(size=4), forward_s=6.0, backward_s=4.0)
    (3.0, 0.0)
    >>> allgather_attention_exposed_s(c, 4e9, CommGroup(size=4), forward_s=6.0,
    ...                               backward_s=4.0)
    (8.5, 1.5)
    """
    n = group.size
    if n <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    step_s = collective_time_s(cluster, "all_gather", kv_bytes, group) / (n - 1)
    forward = (n - 1) * exposed_s(step_s, forward_s / n)
    backward = (n - 1) * exposed_s(2 * step_s, backward_s / n)
    return forward + backward, forward


def ring_attention_hidden_s(
    cluster: ClusterSpec, kv_bytes: float, group: CommGroup, *, forward_s: float,
    backward_s: float,
) -> tuple[float, float]:
    """(forward and backward, forward) seconds of ring attention's K/V exchange hidden behind
    each ring step's compute: the transfer (an all-gather's forward, twice that backward)
    less what :func:`ring_attention_exposed_s` leaves exposed (its example hides 4.5 s of
    the 9 s moved, 1.5 s of them in the forward).
    """
    if group.size <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    transfer_s = collective_time_s(cluster, "all_gather", kv_bytes, group)
    total, forward = ring_attention_exposed_s(cluster, kv_bytes, group, forward_s=forward_s,
                                              backward_s=backward_s)  # fmt: skip
    return 3 * transfer_s - total, transfer_s - forward


GRADIENT_WIDENING = 2.0
"""PyTorch's context parallelism passes the K/V gradients in fp32 (``convert_to_f32``): a
gradient block is twice the bytes of the bf16 K/V block it belongs to."""


def _allgather_transfers(cluster: ClusterSpec, kv_bytes: float,
                         group: CommGroup) -> tuple[float, float]:  # fmt: skip
    """The all-gather of the whole sequence's K/V, and one rank's fp32 gradient block sent to
    the next rank: seconds each."""
    gather_s = collective_time_s(cluster, "all_gather", kv_bytes, group)
    return gather_s, gather_s / (group.size - 1) * GRADIENT_WIDENING


def allgather_attention_exposed_s(
    cluster: ClusterSpec, kv_bytes: float, group: CommGroup, *, forward_s: float,
    backward_s: float,
) -> tuple[float, float]:
    """(forward and backward, forward) seconds of PyTorch's context parallelism left on the
    critical path: K/V all-gathered once, their gradients passed around the ring.

    As ``_templated_ring_attention`` and its backward run it with the all-gather rotater
    (``torch/distributed/tensor/experimental/_context_parallel/_attention.py``, PyTorch
    v2.13.0; torchtitan's training never sets another): the forward issues one all-gather of
    the rank's K/V block before the first of ``n`` attention steps and waits for it before the
    second, so the all-gather hides behind one step (``1/n`` of the attention with
    load-balanced causal chunks). The backward all-gathers K/V again the same way and sends
    the accumulated K/V gradients to the next rank after each of its ``n`` steps, in fp32
    (``convert_to_f32``), each send waited for after the next step's compute and the last one
    after the loop. ``kv_bytes`` is the whole sequence's K and V as one rank of ``group`` would hold
    them unsharded, as for :func:`ring_attention_exposed_s`.

    Its example is :func:`ring_attention_exposed_s`'s, beside the ring's.
    """
    n = group.size
    if n <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    gather_s, block_s = _allgather_transfers(cluster, kv_bytes, group)
    forward = exposed_s(gather_s, forward_s / n)
    backward = (exposed_s(gather_s, backward_s / n)
                + (n - 1) * exposed_s(block_s, backward_s / n) + block_s)  # fmt: skip
    return forward + backward, forward


def allgather_attention_hidden_s(
    cluster: ClusterSpec, kv_bytes: float, group: CommGroup, *, forward_s: float,
    backward_s: float,
) -> tuple[float, float]:
    """(forward and backward, forward) seconds of PyTorch's context parallelism hidden behind
    the attention steps: what it moves (two all-gathers of K/V, ``n`` fp32 gradient blocks)
    less what :func:`allgather_attention_exposed_s` leaves exposed."""
    n = group.size
    if n <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    gather_s, block_s = _allgather_transfers(cluster, kv_bytes, group)
    moved = 2 * gather_s + n * block_s
    total, forward = allgather_attention_exposed_s(cluster, kv_bytes, group,
                                                   forward_s=forward_s, backward_s=backward_s)
    return moved - total, gather_s - forward


def exposed_s(comm_s: Real, hidden_behind_s: Real) -> Real:
    """Communication left on the critical path when it overlaps ``hidden_behind_s`` of work."""
    return maximum(0.0, comm_s - hidden_behind_s)


# --------------------------------------------------------------------------- memory
