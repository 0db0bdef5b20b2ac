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
MIN_RANK_TOKENS = 1024
"""The fewest tokens a context-parallel rank keeps at a degree the batch needs
(:func:`batch_bound`): a floor that keeps the search finite, not a measured limit; the cost
model prices each degree above it, its ring's exposed transfers among them."""
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
    (:func:`across_scale_up`; at any sequence for a pinned ``cp``, and down to
    :data:`MIN_RANK_TOKENS` a rank for the degrees the batch needs, :func:`batch_bound`)."""
    n, seq = cluster.num_devices, training.seq_length
    pinned = pins.cp is not None
    groups = []
    for tp in tp_degrees(model, cluster):
        if not pins.admits(tp=tp):
            continue
        bound = 1 if pinned else batch_bound(n, tp=tp, training=training)
        cps = (pins.cp,) if pinned else tuple(sorted({*cp_degrees(training), *(
            1 << k for k in range(bound.bit_length()) if seq >= (1 << k) * MIN_RANK_TOKENS)}))
        for cp in cps:
            # a pinned degree is the user's; one the batch needs may keep fewer tokens a rank
            rank_tokens = 0 if pinned else MIN_RANK_TOKENS if cp <= bound else LONG_SEQUENCE
            if n % (tp * cp) == 0 and (
                    within_scale_up(cluster, tp=tp, cp=cp)
                    or across_scale_up(cluster, tp=tp, cp=cp, seq_length=seq,
                                       rank_tokens=rank_tokens)):
                groups.append((tp, cp))
    return groups


def batch_bound(num_devices: int, *, tp: int, training: TrainingSpec) -> int:
    """The context-parallel degree the batch needs on ``num_devices`` at ``tp``: the least
    power of two that leaves no more data-parallel ranks than the global batch has sequences
    without a pipeline (1 when the batch fills the devices, or when sequences are shorter than
    :data:`LONG_SEQUENCE`, where context parallelism is not tried). Qwen3-235B at 128K tokens,
    128 sequences on 16,384 H100 at TP4: 32 (the 8K-a-rank rule stopped at 16, leaving a
    pipeline's bubble to take the rest).

    >>> from planner.spec import TrainingSpec
    >>> run = TrainingSpec(seq_length=131072, global_batch_size=128)
    >>> batch_bound(16384, tp=4, training=run), batch_bound(1024, tp=4, training=run)
    (32, 2)
    """
    if training.seq_length < LONG_SEQUENCE:
        return 1
    bound = 1
    while num_devices // (tp * bound) > training.global_batch_size:
        bound *= 2
    return bound
