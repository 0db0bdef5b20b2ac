"""What a weight replicated over some ranks costs under each ZeRO stage: the states one device
holds and the data-parallel traffic that keeps the copies equal (:mod:`planner.cost`'s
formulas, for the four stages at once)."""

from __future__ import annotations

from planner import cost
from planner.spec import ClusterSpec
from planner.vocabulary import ZERO_STAGES, Stack, StatesPrecision


def weight_syncs(
    cluster: ClusterSpec, group: cost.CommGroup | None, *, params: float, precision: StatesPrecision
) -> tuple[cost.DataParallelSync, ...]:
    """The data-parallel traffic under ZeRO 0..3 of ``params`` parameters replicated on
    ``group``."""
    return tuple(
        cost.data_parallel_sync(cluster, group, params=params, precision=precision, zero=z)
        for z in ZERO_STAGES
    )


def weight_states(
    group: cost.CommGroup | None, *, params: float, precision: StatesPrecision
) -> tuple[float, ...]:
    """State bytes per device under ZeRO 0..3 of ``params`` parameters replicated on
    ``group`` (their states sharded over it)."""
    shards = group.size if group is not None else 1
    return tuple(
        params * cost.state_bytes_per_param(precision, zero=z, shards=shards).total
        for z in ZERO_STAGES
    )


def weight_costs(
    cluster: ClusterSpec,
    group: cost.CommGroup | None,
    *,
    params: float,
    precision: StatesPrecision,
    num_microbatches: int,
    stack: Stack | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """State bytes per device (:func:`weight_states`) and the seconds per microbatch the
    gradients cost beside the op's own compute under ZeRO 0..3: their sync
    (:func:`weight_syncs`, the once-per-step part shared) and the optimizer's accumulation or
    ``stack``'s FSDP2 copies (:func:`~planner.cost.data_parallel.gradient_accumulation`)."""
    if params == 0:
        return (0.0,) * 4, (0.0,) * 4
    syncs = weight_syncs(cluster, group, params=params, precision=precision)
    states = weight_states(group, params=params, precision=precision)
    return states, tuple(
        s.per_microbatch_s(num_microbatches)
        + cost.gradient_accumulation(precision, zero=z, stack=stack).seconds(
            cluster.device, params=params, num_microbatches=num_microbatches)
        for z, s in zip(ZERO_STAGES, syncs, strict=True)
    )  # fmt: skip
