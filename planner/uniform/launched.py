"""The search's configurations as the target framework launches them: the overlap flags it
sets (:mod:`planner.uniform.defaults`), and the optimizer offloads it runs, tried where
nothing fits without."""

from __future__ import annotations

from collections.abc import Sequence

from planner.frameworks import ANY
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, resolve_each
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.defaults import launched_overlaps, overlaps_launched
from planner.vocabulary import OFFLOADS


def _overlaps(options: SolveOptions) -> dict[str, tuple[bool, ...]]:
    """The settings of ``overlap_grad_reduce``, ``overlap_param_gather`` and
    ``tp_comm_overlap`` the options allow, most overlapped first."""
    return {"grads": (True, False) if options.overlap_grad_reduce else (False,),
            "gathers": (True, False) if options.overlap_param_gather else (False,),
            "tp_comms": (True, False) if options.tp_comm_overlap else (False,)}  # fmt: skip


def launched_variant(
    config: ParallelConfig, model: ModelSpec, *, cluster: ClusterSpec, options: SolveOptions
) -> ParallelConfig | None:
    """``config`` as the target framework launches it, or None when it cannot: the most
    overlapped setting of the two overlap flags the framework launches, among those the
    options allow (:func:`planner.uniform.defaults.launched_overlaps`, whose rule
    ``estimate --framework`` applies too). One that does not even divide is kept as it is,
    for the pricing to refuse with its reason."""
    if options.framework == ANY:
        return config
    return launched_overlaps(config, model, cluster=cluster, framework=options.framework,
                             **_overlaps(options))  # fmt: skip


def launched_variants(
    configs: Sequence[ParallelConfig], model: ModelSpec, *, cluster: ClusterSpec,
    options: SolveOptions,
) -> list[ParallelConfig | None]:  # fmt: skip
    """:func:`launched_variant` of each configuration, their divisibility checked at once
    (:func:`~planner.plan.config.resolve_each`)."""
    if options.framework == ANY:
        return list(configs)
    return [config if resolved is None else
            overlaps_launched(resolved, model, framework=options.framework,
                              **_overlaps(options))
            for config, resolved in zip(configs, resolve_each(model, cluster, configs),
                                        strict=True)]  # fmt: skip


def offloads(cluster: ClusterSpec, options: SolveOptions) -> bool:
    """Whether the search may offload at all: the cluster has host figures (a framework's
    rules say which offloads it launches; ``any`` tries every one)."""
    return cluster.host is not None


def offload_variants(
    model: ModelSpec, cluster: ClusterSpec, configs: Sequence[ParallelConfig], *,
    options: SolveOptions,
) -> list[ParallelConfig]:  # fmt: skip
    """The optimizer-offloaded variants of ``configs`` that the framework launches (none
    where :func:`offloads` says the search may not offload).

    The caller passes the configurations that do not fit on the device but whose peak without
    their optimizer states and gradients does (an offload frees at most those): one that fits
    needs no offload, since an offloaded step is its configuration's step with the optimizer's time
    swapped for the host copies and the CPU's Adam, never faster where the host link and the
    host memory are slower than the device's memory (every bundled cluster with host figures:
    ``tests/test_offload.py``). The search prices them only when nothing fits without
    (:func:`~planner.search.framework.enumerate_plan`)."""
    if not offloads(cluster, options):
        return []
    if options.framework == ANY:  # every framework's offload, the fastest then chosen
        return [c.model_copy(update={"offload": o}) for c in configs for o in OFFLOADS[1:]]
    variants = (offloaded_variant(c, model, cluster=cluster, options=options) for c in configs)
    return [v for v in variants if v is not None]


def offloaded_variant(
    config: ParallelConfig, model: ModelSpec, *, cluster: ClusterSpec, options: SolveOptions
) -> ParallelConfig | None:
    """``config`` with its optimizer offloaded as the target framework runs it (Megatron-LM's
    pipelined step, or DeepSpeed's ZeRO-Offload: the first it launches,
    :func:`launched_variant`), or None when it launches neither."""
    for offload in OFFLOADS[1:]:  # every offloaded value (the first, none, is not)
        variant = launched_variant(config.model_copy(update={"offload": offload}), model,
                                   cluster=cluster, options=options)  # fmt: skip
        if variant is not None:
            return variant
    return None
