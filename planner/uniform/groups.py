"""The tensor- and context-parallel groups the uniform search tries (:func:`context_groups`):
tensor parallelism inside a scale-up domain dividing heads, KV groups and FFN
(:func:`tp_degrees`); ``tp * cp`` inside one domain, tiling it (:func:`within_scale_up`), or
across whole domains where each context-parallel rank keeps a long sequence
(:func:`across_scale_up`); context-parallel degrees from :data:`LONG_SEQUENCE` on
(:func:`cp_degrees`), each as ring attention and as Ulysses all-to-alls
(:func:`cp_algorithms`). :mod:`planner.uniform.space` builds its branches on them.
"""

from __future__ import annotations

from planner.options import NO_PINS, Pins
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.vocabulary import ContextParallelism

LONG_SEQUENCE = 8192
"""Context parallelism is tried from this sequence length on. Below it the attention's
activations are small next to the rest of a layer's, and NVIDIA's recipes keep CP at 1 (their
first with CP 2 is Llama 3 8B at 8192)."""
CP_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees tried from :data:`LONG_SEQUENCE` on with ``tp * cp`` inside a
scale-up domain (:func:`within_scale_up`); across domains the degree grows with the sequence
(:func:`across_scale_up`)."""


def tp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Tensor-parallel degrees inside one scale-up domain (a node, or an NVL72 rack) that
    divide it and split heads, KV groups and FFN evenly."""
    domain = cluster.scale_up_devices
    # MLA's keys and values come from one shared latent: there are no KV groups to split
    kv_groups = model.num_attention_heads if model.mla else model.query_groups
    return [t for t in range(1, domain + 1)
            if domain % t == 0 and model.num_attention_heads % t == 0
            and kv_groups % t == 0 and model.ffn % t == 0]  # fmt: skip


def within_scale_up(cluster: ClusterSpec, *, tp: int, cp: int) -> bool:
    """Whether tensor and context parallelism together stay inside one scale-up domain: both
    communicate inside every layer, on the critical path, so they keep to the fastest links
    (which span several nodes in an NVL72 rack). Their ranks are consecutive (Megatron's
    order), so the group must tile the domain: a group of 16 on a rack of 72 would straddle
    two racks every fourth time.

    >>> from planner.spec.reading import load_cluster
    >>> nvl72 = load_cluster("instances/clusters/gb200-nvl72.json")
    >>> within_scale_up(nvl72, tp=8, cp=1), within_scale_up(nvl72, tp=2, cp=8)
    (True, False)
    """
    return cluster.scale_up_devices % (tp * cp) == 0


def across_scale_up(
    cluster: ClusterSpec, *, tp: int, cp: int, seq_length: int, rank_tokens: int = LONG_SEQUENCE
) -> bool:
    """Whether tensor and context parallelism together span whole scale-up domains (tensor
    parallelism inside each, :func:`tp_degrees`), each context-parallel rank keeping at least
    ``rank_tokens`` of the sequence (0 for a degree the user pinned). A ring's K/V blocks then
    cross the scale-out network behind the attention it computes, whose time grows with the
    square of the tokens a rank keeps and the transfer's linearly (Liu et al., "Ring Attention
    with Blockwise Transformers", 2023).
    Meta's 128K-token stage of Llama 3 405B kept 8K a rank (TP 8 in a node, CP 16 across
    nodes: Llama Team, "The Llama 3 Herd of Models", 2024, Table 4).

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json", 8)
    >>> [across_scale_up(h100, tp=8, cp=8, seq_length=s) for s in (8192, 65536, 1 << 20)]
    [False, True, True]
    >>> across_scale_up(h100, tp=2, cp=2, seq_length=1 << 20)  # inside one node
    False
    """
    group, domain = tp * cp, cluster.scale_up_devices
    return group > domain and group % domain == 0 and seq_length >= cp * rank_tokens


def cp_degrees(training: TrainingSpec) -> tuple[int, ...]:
    """Context-parallel degrees tried at the run's sequence length, from :data:`LONG_SEQUENCE`
    on (else none, 1): :data:`CP_DEGREES`, and the powers of two beyond them that leave each
    rank :data:`LONG_SEQUENCE` tokens (for groups across domains, :func:`across_scale_up`).

    >>> from planner.spec import TrainingSpec
    >>> [cp_degrees(TrainingSpec(seq_length=s, global_batch_size=1))[-1]
    ...  for s in (4096, 8192, 131072, 1 << 20)]
    [1, 8, 16, 128]
    """
    seq = training.seq_length
    if seq < LONG_SEQUENCE:
        return (1,)
    longest = [1 << k for k in range((seq // LONG_SEQUENCE).bit_length())]
    return tuple(sorted({*CP_DEGREES, *longest}))


def cp_algorithms(
    cp: int, algorithms: tuple[ContextParallelism, ...] = ("ring", "ulysses")
) -> tuple[ContextParallelism, ...]:
    """How context parallelism of degree ``cp`` attends: ``algorithms`` (what the target
    launches) when there is any, else ring (the default, which then sends nothing).

    >>> cp_algorithms(4), cp_algorithms(4, ("allgather",)), cp_algorithms(1, ("allgather",))
    (('ring', 'ulysses'), ('allgather',), ('ring',))
    """
    return algorithms if cp > 1 else ("ring",)


def context_groups(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, pins: Pins = NO_PINS
) -> list[tuple[int, int]]:
    """Every ``(tp, cp)`` the search tries, among the pinned degrees: the group divides the
    devices and stays inside a scale-up domain (:func:`within_scale_up`) or spans whole ones
    (:func:`across_scale_up`; at any sequence for a pinned ``cp``)."""
    n, seq = cluster.num_devices, training.seq_length
    cps = cp_degrees(training) if pins.cp is None else (pins.cp,)
    rank_tokens = LONG_SEQUENCE if pins.cp is None else 0  # a pinned degree is the user's
    return [(tp, cp) for tp in tp_degrees(model, cluster) if pins.admits(tp=tp)
            for cp in cps if n % (tp * cp) == 0 and (
                within_scale_up(cluster, tp=tp, cp=cp)
                or across_scale_up(cluster, tp=tp, cp=cp, seq_length=seq,
                                   rank_tokens=rank_tokens))]  # fmt: skip
