"""DeepEP's dispatcher: the experts' token exchange as DeepSeek's DeepEP runs it under
Megatron-Core's flex dispatcher (``--moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep``), its time and its buffers.

NCCL's all-to-all (:func:`planner.cost.collective_time_s`) sends a token once per chosen
expert. DeepEP's high-throughput kernels send it once per node that holds one of its experts,
over the network to the same-index GPU of that node, which forwards it over NVLink to each GPU
there that holds one (deepseek-ai/DeepEP ``docs/legacy.md``: "forwarding data from NVLink
domain to RDMA domain"; ``csrc/kernels/legacy/internode.cu``): a DeepSeek-V3 token, whose
eight experts lie on four of eight nodes, crosses the network 3.5 times on average where the
all-to-all sends the 7 of its copies bound for other nodes. Its buffers are its own (an NVLink
buffer and an RDMA one, sized by :func:`deepep_buffer_bytes`), not NCCL's per-peer all-to-all
buffers. Its kernels hold 20 SMs while they run, which slows the compute an overlapped
exchange hides behind (:func:`deepep_contention`). What is not priced: the host
synchronisation of each dispatch (the CPU waits for the receive counts), NVSHMEM's own
allocations beside the RDMA buffer, and FP8 dispatch (Megatron hands DeepEP the hidden states
in the compute precision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.communication import CommGroup, members_per_level
from planner.spec import ClusterSpec, DeviceSpec, ModelSpec

DEEPEP_NVL_PEERS = 8
"""GPUs DeepEP connects over NVLink inside a node; a group of more ranks takes 8 from each
node (``LEGACY_NUM_MAX_NVL_PEERS``, ``csrc/kernels/legacy/compiled.cuh``)."""
DEEPEP_NUM_SMS = 20
"""SMs DeepEP's kernels run on under Megatron-Core unless ``--moe-flex-dispatcher-num-sms``
says otherwise (``megatron/core/transformer/moe/token_dispatcher.py``,
``set_deepep_num_sms(... else 20)``): half of them are channels."""

_CONFIGS: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    2: ((256, 6, 128), (256, 6, 128)),
    4: ((256, 6, 128), (256, 6, 128)),
    8: ((256, 6, 128), (256, 6, 128)),
    16: ((288, 20, 128), (288, 12, 128)),
    24: ((288, 8, 128), (288, 8, 128)),
    32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)),
    64: ((288, 8, 128), (288, 8, 128)),
    96: ((480, 12, 128), (480, 8, 128)),
    128: ((560, 12, 128), (560, 8, 128)),
    144: ((720, 12, 128), (720, 8, 128)),
    160: ((720, 12, 128), (720, 8, 128)),
}
"""Per group size DeepEP knows, its dispatch and its combine configuration: tokens a channel
receives over NVLink, tokens it sends and receives over RDMA (``Buffer.get_dispatch_config``
and ``get_combine_config``, ``deep_ep/buffers/legacy.py`` at dd758ca; ``Config`` rounds the
RDMA receive up to a multiple of the send, ``csrc/legacy/config.hpp``)."""
DEEPEP_GROUP_SIZES: tuple[int, ...] = tuple(_CONFIGS)
"""The expert-parallel group sizes DeepEP has a configuration for (any other asserts)."""

_TOPK = 128
"""Top-k slots and scales DeepEP reserves per buffered token (``kNumMaxTopK``,
``kNumMaxScales``); a slot's index is 8 bytes, its weight and a scale 4."""
_SOURCE_META = 8
"""Bytes of a token's ``SourceMeta`` (its RDMA rank and a bit per NVLink rank)."""


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def deepep_buffer_bytes(ranks: int, hidden_bytes: int, *, num_sms: int = DEEPEP_NUM_SMS) -> int:
    """Device bytes of the DeepEP buffer Megatron-Core allocates for an expert-parallel group
    of ``ranks`` moving hidden states of ``hidden_bytes`` each (``get_buffer`` in
    ``megatron/core/transformer/moe/fused_a2a.py``: the larger of the dispatch and combine
    configurations' NVLink and RDMA size hints, ``Config.get_nvl_buffer_size_hint`` and
    ``get_rdma_buffer_size_hint`` in DeepEP's ``csrc/legacy/config.hpp``); no RDMA buffer
    inside one node.

    DeepSeek-V3's hidden states (7,168 in bf16) over 64 ranks: 378 MB over NVLink and 336 MB
    for RDMA, where NCCL's all-to-all on 8-GPU nodes connects 7 peers at 0.47 GB each and the
    56 beyond through its shared network pool, 3.43 GB.

    >>> round(deepep_buffer_bytes(64, 7168 * 2) / 1e6)
    714
    >>> round(deepep_buffer_bytes(8, 7168 * 2) / 1e6)
    336
    """
    if ranks not in _CONFIGS:
        raise ValueError(deepep_group_refusal(ranks) or f"DeepEP group of {ranks}")
    channels = num_sms // 2
    nvl_ranks = min(ranks, DEEPEP_NVL_PEERS)
    rdma_ranks = max(ranks // DEEPEP_NVL_PEERS, 1)
    per_token = hidden_bytes + _SOURCE_META + _TOPK * 8 + 2 * _TOPK * 4
    nvl = rdma = 0
    for nvl_recv, rdma_send, rdma_recv in _CONFIGS[ranks]:
        signals = channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
        nvl = max(nvl, _round_up(signals + channels * nvl_ranks * nvl_recv * per_token, 128))
        if ranks > DEEPEP_NVL_PEERS:
            recv = _round_up(rdma_recv, rdma_send)
            signals = channels * rdma_ranks * (2 * DEEPEP_NVL_PEERS + 2) * 2 * 4
            tokens = channels * rdma_ranks * recv * (per_token + 16) * 2
            rdma = max(rdma, _round_up(signals + tokens, 128))
    return nvl + rdma


def deepep_group_refusal(ranks: int, per_node: int | None = None) -> str | None:
    """Why DeepEP cannot run an expert-parallel group of ``ranks``, ``per_node`` of them in
    each NVLink domain, or None: it knows only some group sizes (:data:`DEEPEP_GROUP_SIZES`)
    and, beyond one node, takes eight ranks from every node (``Config`` asserts ``num_ranks %
    8 == 0``; a rank's NVLink peer is ``rank % 8``).

    >>> deepep_group_refusal(64, 8) is None, deepep_group_refusal(64, 4)
    (True, "DeepEP's group of 64 ranks takes 8 from each node, not 4")
    >>> print(deepep_group_refusal(12))  # doctest: +ELLIPSIS
    DeepEP has no configuration for 12 expert-parallel ranks (it has 2, 4, 8, ..., 160)
    """
    if ranks not in _CONFIGS:
        known = ", ".join(map(str, DEEPEP_GROUP_SIZES))
        return f"DeepEP has no configuration for {ranks} expert-parallel ranks (it has {known})"
    if per_node is not None and per_node != min(ranks, DEEPEP_NVL_PEERS):
        return (f"DeepEP's group of {ranks} ranks takes {min(ranks, DEEPEP_NVL_PEERS)} from "
                f"each node, not {per_node}")
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """How a token picks its experts, as far as where it is sent depends on it."""

    experts: int
    """Routed experts, spread evenly and in order over the group's ranks."""
    top_k: int
    """Experts a token is sent to."""
    groups: int = 1
    """Group-limited routing: the experts in this many contiguous groups..."""
    group_topk: int = 1
    """... of which a token picks this many, then its experts among theirs."""

    @classmethod
    def of(cls, model: ModelSpec) -> Routing | None:
        """The routing of ``model``'s MoE layers, or None for a dense model."""
        moe = model.moe
        if moe is None:
            return None
        groups = moe.router_num_groups or 1
        return cls(experts=moe.num_experts, top_k=moe.top_k, groups=groups,
                   group_topk=moe.router_group_topk or groups)  # fmt: skip


def domains_hit(routing: Routing, domains: int) -> float:
    """The expected number of ``domains`` (nodes, or ranks) of equal size, over which the
    experts lie in order, that one token's experts reach under balanced routing: its experts
    drawn uniformly; under group-limited routing its groups drawn uniformly, each of them
    receiving at least one of its experts (DeepSeek-V3 picks a group by its two best experts'
    scores, so a picked group holds some of the token's top ones) and an even share of them.

    DeepSeek-V3 (256 experts, top 8 of 4 groups of 8) on 8 nodes: every group is a node, so 4
    nodes (the paper's "at most 4"); without the group limit 5.29; 7.61 of 64 ranks (four
    experts each, two of a token's per chosen group):

    >>> v3 = Routing(experts=256, top_k=8, groups=8, group_topk=4)
    >>> domains_hit(v3, 8), round(domains_hit(Routing(experts=256, top_k=8), 8), 2)
    (4.0, 5.29)
    >>> round(domains_hit(v3, 64), 2)
    7.61
    """
    e, k, g, chosen = routing.experts, routing.top_k, routing.groups, routing.group_topk
    if chosen < g and g % domains == 0:  # groups nest in domains: hit if one of its is picked
        per = g // domains
        return domains * (1 - math.comb(g - per, chosen) / math.comb(g, chosen))
    if chosen < g and domains % g == 0:  # a group spans domains
        in_group, per_domain = e // g, e // domains
        if k % chosen == 0:  # k / chosen of the group's experts, drawn without replacement
            share = k // chosen
            missed = math.comb(in_group - per_domain, share) / math.comb(in_group, share)
        else:
            missed = (1 - g / domains) ** (k / chosen)
        return domains * chosen / g * (1 - missed)
    per_domain = e // domains
    return domains * (1 - math.comb(e - per_domain, k) / math.comb(e, k))


def deepep_contention(device: DeviceSpec, num_sms: int = DEEPEP_NUM_SMS) -> float:
    """How much longer the compute beside an overlapped DeepEP exchange runs, as a share of the
    exchange's hidden time: its kernels hold ``num_sms`` of the device's streaming
    multiprocessors while they run, so the compute has ``units - num_sms`` of them; 0 where the
    cluster file does not say how many the device has (``device.compute_units``).

    >>> from planner.spec import DeviceSpec
    >>> h100 = DeviceSpec(name="H100", memory_gib=80, peak_tflops={"bf16": 989},
    ...                   memory_bandwidth_gb_s=3350, compute_units=132)
    >>> round(deepep_contention(h100), 3)
    0.179
    """
    units = device.compute_units
    if units is None or units <= num_sms:
        return 0.0
    return num_sms / (units - num_sms)


def deepep_time_s(
    cluster: ClusterSpec, routed_bytes: float, group: CommGroup, routing: Routing
) -> float:
    """Seconds of one DeepEP dispatch (or combine, which moves the same bytes back) of a rank
    whose routed tokens, a copy per chosen expert, take ``routed_bytes``.

    Each token crosses a network level once per domain of it that its experts reach outside
    the rank's own (:func:`domains_hit`, the share of those domains beyond the next level in,
    as :func:`~planner.cost.collective_time_s`'s all-to-all splits them), and NVLink once per
    other GPU that holds one of its experts (directly, or forwarded there); the levels run at
    once and the slowest bounds it. DeepEP's published runs move these bytes at the links'
    rate (``docs/legacy.md``: 43-58 GB/s of RDMA per 50 GB/s NIC at 16-64 ranks on H800).
    """
    n = group.size
    if n <= 1 or routed_bytes <= 0:
        return 0.0
    token_bytes = routed_bytes / routing.top_k
    counts = members_per_level(cluster, group)
    outer = next(i for i, c in enumerate(counts) if c == n)
    levels = cluster.network
    slowest = token_bytes * domains_hit(routing, n) * (n - 1) / n / levels[0].bandwidth_bytes_s
    node_hits = domains_hit(routing, n // counts[0]) if counts[0] < n else 0.0
    previous = counts[0]
    for count, level in zip(counts[1 : outer + 1], levels[1:], strict=False):
        share = (count - previous) / n
        slowest = max(slowest, token_bytes * node_hits * share / level.bandwidth_bytes_s)
        previous = count
    return slowest + levels[outer].latency_s * math.ceil(math.log2(n))
