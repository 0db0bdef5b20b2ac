"""The heuristic baseline: the rule of thumb an experienced Megatron-LM user applies.

1. Tensor parallelism inside a node, in powers of two: start at 8 (or the node's size) for a
   model of :data:`LARGE_MODEL_PARAMS` or more, at 2 from :data:`MEDIUM_MODEL_PARAMS`, else at
   1 (Narayanan et al. 2021, takeaway 1: TP up to the node's size, PP across nodes), raising it
   only when no pipeline depth fits. Sequence parallelism on whenever TP > 1.
2. Pipeline parallelism: the fewest stages that divide the layers and fit in memory.
3. The distributed optimizer (ZeRO-1), selective recomputation (Korthikanti et al. 2022), a
   microbatch of 1 (the smallest in ``options.micro_batch_sizes`` when 1 is not allowed), 1F1B
   without interleaving, no context parallelism.
4. Mixtures of experts: the size in step 1 counts the active parameters, and expert
   parallelism is as wide as the experts and the data-parallel ranks allow (DeepSeek-V3
   trained with EP 64 across 8 nodes).
5. Data parallelism takes the devices left over.
6. When nothing fits with selective recomputation, the same again with full recomputation.

Every candidate is checked with :func:`~planner.estimate.estimate`; the first that fits wins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from planner.baselines.grid import DEFAULT_OPTIONS, nothing_fits, run_config, tp_degrees
from planner.config import ParallelConfig, Recompute
from planner.errors import ConfigError, InfeasibleError
from planner.estimate import Estimate, estimate
from planner.graph import lowered, parameter_count
from planner.plan import Plan, SolverSummary
from planner.search import Progress, ProgressFn, SolveOptions, training_of
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform import uniform_plan

LARGE_MODEL_PARAMS = 30e9
"""From here on a model starts at TP 8: its weights and states would otherwise need a deep
pipeline (Megatron trained GPT-3 175B at TP 8)."""
MEDIUM_MODEL_PARAMS = 10e9
"""From here on a model starts at TP 2 (13B-class models commonly train at TP 2); below it at
TP 1."""
RECOMPUTE_LADDER: tuple[Recompute, ...] = ("selective", "full")


def heuristic_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The rule of thumb's configuration, as a plan (method ``"heuristic"``).

    Raises :class:`~planner.errors.InfeasibleError` when no candidate fits.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    todo = list(heuristic_candidates(model, cluster, training, options))
    chosen, leanest = _first_fit(model, cluster, todo, progress)
    if chosen is None:
        raise _failure(model, cluster, training, leanest)
    plan = uniform_plan(model, cluster, chosen, method="heuristic")
    summary = SolverSummary(time_s=time.perf_counter() - started, status="feasible",
                            objective=plan.predicted.step_time_s)  # fmt: skip
    return plan.model_copy(update={"solver": summary})


def heuristic_candidates(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> Iterator[ParallelConfig]:
    """The rule's configurations in the order it tries them."""
    n = cluster.num_devices
    mbs = 1 if 1 in options.micro_batch_sizes else min(options.micro_batch_sizes)
    tps = [t for t in tp_degrees(model, cluster)
           if t & (t - 1) == 0 and t >= start_tp(model, cluster, training)]  # fmt: skip
    for recompute in RECOMPUTE_LADDER:
        for tp in tps:
            for pp in (p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0):
                if n % (tp * pp):
                    continue
                ep = expert_degree(model, dp=n // (tp * pp))
                yield run_config(training, options, tp=tp, pp=pp, ep=ep, sp=tp > 1, mbs=mbs,
                                 recompute=recompute, zero=1)  # fmt: skip


def start_tp(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> int:
    """The tensor-parallel degree the rule starts from, by the model's size (its active
    parameters: a mixture of experts spreads the rest with expert parallelism)."""
    params = parameter_count(lowered(model, training, 1)[0]).active
    start = 8 if params >= LARGE_MODEL_PARAMS else 2 if params >= MEDIUM_MODEL_PARAMS else 1
    # the largest power of two the model's heads and the node allow, if 8 is out of reach
    allowed = [t for t in tp_degrees(model, cluster) if t & (t - 1) == 0]
    return max(t for t in allowed if t <= start)


def expert_degree(model: ModelSpec, *, dp: int) -> int:
    """The widest expert parallelism that divides the experts and the data-parallel ranks."""
    if model.moe is None:
        return 1
    experts = model.moe.num_experts
    return max(e for e in range(1, experts + 1) if experts % e == 0 and dp % e == 0)


def _first_fit(
    model: ModelSpec,
    cluster: ClusterSpec,
    todo: list[ParallelConfig],
    progress: ProgressFn | None,
) -> tuple[ParallelConfig | None, tuple[float, ParallelConfig] | None]:
    """The first of ``todo`` that divides and fits, and the leanest that did not fit with the
    memory it needs."""
    leanest: tuple[float, ParallelConfig] | None = None
    for done, config in enumerate(todo, start=1):
        try:
            result: Estimate | None = estimate(model, cluster, config)
        except ConfigError:
            result = None  # e.g. the batch does not split over this many replicas
        if result is not None and result.fits:
            if progress is not None:
                progress(Progress(len(todo), len(todo), result.step_time_s))
            return config, leanest
        if result is not None and (leanest is None or result.peak_memory_gib < leanest[0]):
            leanest = (result.peak_memory_gib, config)
        if progress is not None:
            progress(Progress(done, len(todo), None))
    return None, leanest


def _failure(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    leanest: tuple[float, ParallelConfig] | None,
) -> InfeasibleError | ConfigError:
    if leanest is None:
        return ConfigError(
            f"the heuristic found no configuration of {model.name} that divides "
            f"{cluster.num_devices} devices at global batch {training.global_batch_size}; "
            f"try a global batch divisible by more data-parallel sizes"
        )
    return nothing_fits(model, cluster, training, leanest,
                        searched="no configuration of the rule of thumb",
                        advice="add nodes, shorten the sequence, or search wider (the grid or "
                        "the ILP)")  # fmt: skip
