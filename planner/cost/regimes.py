"""Where a prediction or a run sits in the features its error band is built from
(:class:`~planner.spec.Regime`): the mechanisms a configuration or a plan uses, its kind of
parallelism, its regime on a cluster, and the share of its step left in exposed communication.
:mod:`planner.cost.uncertainty` measures the distance between regimes and builds the bands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from planner.plan.config import ParallelConfig
from planner.plan.schema import StageParallel
from planner.spec import ClusterSpec, Regime, TrainingSpec
from planner.vocabulary import (
    GB,
    MECHANISMS,
    Mechanism,
    Offload,
    ParallelismKind,
    evidence_stack,
)

COMMUNICATION_PARTS = ("tensor_parallel_comm_s", "context_parallel_comm_s",
                       "expert_parallel_comm_s", "pipeline_comm_s",
                       "data_parallel_comm_exposed_s")  # fmt: skip
"""The parts of a step (:class:`~planner.plan.schema.StepTime`) that are communication left
exposed."""


def communication_share(parts: Mapping[str, Any]) -> Any:
    """The share of a step its exposed communication takes (:data:`COMMUNICATION_PARTS` over
    all the parts of :class:`~planner.plan.schema.StepTime`, which add up to the step),
    rounded to 0.1 %: a float from floats, an array element-wise from arrays of parts.

    >>> communication_share({"compute_s": 3.0, "tensor_parallel_comm_s": 0.75,
    ...                      "data_parallel_comm_exposed_s": 0.25})
    0.25
    """
    exposed = np.asarray(sum(parts.get(name, 0.0) for name in COMMUNICATION_PARTS), float)
    total = np.asarray(sum(parts.values()), float)
    share = np.round(np.where(total > 0, exposed / np.where(total > 0, total, 1.0), 0.0), 3)
    return float(share) if share.ndim == 0 else share


def mechanisms(
    *, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
    expert_parallel: int = 1, zero: int = 0, offload: Offload = "none", deepep: bool = False,
) -> tuple[Mechanism, ...]:  # fmt: skip
    """The mechanisms a configuration uses, in :data:`~planner.vocabulary.MECHANISMS` order.

    >>> mechanisms(tensor_parallel=8, pipeline_parallel=1, zero=3)
    ('tensor', 'zero-3')
    """
    used = {"tensor": tensor_parallel > 1, "pipeline": pipeline_parallel > 1,
            "context": context_parallel > 1, "expert": expert_parallel > 1,
            "zero-3": zero == 3, "offload": offload != "none",
            "deepep": deepep and expert_parallel > 1}  # fmt: skip
    return tuple(m for m in MECHANISMS if used[m])


def config_mechanisms(config: ParallelConfig) -> tuple[Mechanism, ...]:
    """The mechanisms of a uniform configuration (:func:`mechanisms`)."""
    return mechanisms(tensor_parallel=config.tp, pipeline_parallel=config.pp,
                      context_parallel=config.cp, expert_parallel=config.ep, zero=config.zero,
                      offload=config.offload,
                      deepep=config.moe_dispatcher == "deepep")  # fmt: skip


def regime_of(
    training: TrainingSpec, cluster: ClusterSpec, *, used: tuple[Mechanism, ...], moe: bool,
    forward_flops_per_sequence: float,
) -> Regime:
    """The regime of a prediction for ``training`` on ``cluster`` with the mechanisms
    ``used``, for a model of ``forward_flops_per_sequence`` (routing experts when ``moe``)."""
    gflop_per_token = forward_flops_per_sequence / training.seq_length / 1e9
    spanned = next((level for level in cluster.network
                    if level.domain_devices >= cluster.num_devices), cluster.network[-1])
    return Regime(stack=evidence_stack(training.stack), mechanisms=used,
                  seq_length=training.seq_length, num_devices=cluster.num_devices,
                  network_gb_s=spanned.bandwidth_bytes_s / GB, gflop_per_token=gflop_per_token,
                  moe=moe, precision=training.precision)  # fmt: skip


def stage_mechanisms(
    stages: Sequence[StageParallel], *, deepep: bool = False
) -> tuple[Mechanism, ...]:
    """The mechanisms of a plan's stages (the search's, which may differ from stage to stage):
    any mechanism a stage uses; pipeline when there is more than one stage; DeepEP where it
    exchanges the experts' tokens (``deepep``) and some stage spreads them.

    >>> stage_mechanisms([StageParallel(tp=1, dp=8, zero=3)] * 2)
    ('pipeline', 'zero-3')
    """
    return mechanisms(
        tensor_parallel=max(s.tp for s in stages), pipeline_parallel=len(stages),
        context_parallel=max(s.cp for s in stages), expert_parallel=max(s.ep for s in stages),
        zero=max(s.zero for s in stages), deepep=deepep,
    )  # fmt: skip


def parallelism_kind(*, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
                     expert_parallel: int = 1, zero: int) -> ParallelismKind:  # fmt: skip
    """The kind of parallelism a configuration is, as bands by kind (files written before
    runs were kept) group runs.

    >>> parallelism_kind(tensor_parallel=1, pipeline_parallel=1, zero=3)
    'sharded-data-parallel'
    >>> parallelism_kind(tensor_parallel=8, pipeline_parallel=2, context_parallel=2, zero=1)
    'context-parallel'
    """
    if expert_parallel > 1:
        return "expert-parallel"
    if context_parallel > 1:
        return "context-parallel"
    if tensor_parallel * pipeline_parallel > 1:
        return "model-parallel"
    return "sharded-data-parallel" if zero == 3 else "data-parallel"


def kind_of(used: Sequence[Mechanism]) -> ParallelismKind:
    """The kind of parallelism of a set of mechanisms (:func:`parallelism_kind`)."""
    return parallelism_kind(
        tensor_parallel=2 if "tensor" in used else 1,
        pipeline_parallel=2 if "pipeline" in used else 1,
        context_parallel=2 if "context" in used else 1,
        expert_parallel=2 if "expert" in used else 1, zero=3 if "zero-3" in used else 0,
    )  # fmt: skip
