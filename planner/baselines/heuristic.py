"""The heuristic baseline: the rule of thumb an experienced Megatron-LM user applies.

1. Layout, in this order (Narayanan et al. 2021, takeaway 1: tensor parallelism up to the
   node's size, pipeline parallelism across nodes): tensor parallelism inside a node, the
   smallest degree that fits without a pipeline; when even the node's widest does not fit,
   that widest with the fewest pipeline stages that fit. A pipeline degree that does not
   divide the layers takes Megatron's uneven first and last stage, the first split of
   :func:`~planner.uniform.space.stage_splits` (Llama 3.1 405B on PP16: 7 + 8 x 14 + 7, as
   Meta trained it; when the ends cannot be equal, the first stage is the lighter: under 1F1B
   it holds the most microbatches in flight).
2. Data parallelism takes the devices left over. Mixtures of experts: expert parallelism is
   as wide as the experts and the data-parallel ranks allow (DeepSeek-V3 trained with EP 64
   across 8 nodes).
3. Fixed switches: a microbatch of 1 (the smallest in ``options.micro_batch_sizes`` when 1 is
   not allowed), sequence parallelism whenever TP > 1, the distributed optimizer (ZeRO-1),
   1F1B without interleaving, no context parallelism.
4. Selective recomputation (Korthikanti et al. 2022) for the whole of step 1; when no layout
   fits with it, step 1 again with full recomputation.

Every candidate is checked with :func:`~planner.uniform.estimate.estimate`; the first that fits
wins. Under 1F1B the first stage holds ``pp`` microbatches of ``1/pp`` of the layers, so a
deeper pipeline frees weights and optimizer states but hardly activations: a run whose
activations alone overflow with selective recomputation climbs to a deep pipeline before step 4
turns full recomputation on (Llama 3.1 405B on 16,384 H100: PP32, where Meta's PP16 is 2 GiB
over at selective recomputation in this cost model and needs full). The plan's
``solver.configurations`` counts the candidates priced (those
:func:`~planner.uniform.estimate.estimate` refused as not dividing are not counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from planner.errors import ConfigError, InfeasibleError
from planner.options import DEFAULT_OPTIONS, Progress, ProgressFn, SolveOptions, training_of
from planner.plan.config import ParallelConfig, resolve
from planner.plan.invariants import check_plan
from planner.plan.schema import Plan, SolverSummary
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.describe import describe_leanest
from planner.uniform.estimate import Estimate, estimate
from planner.uniform.groups import tp_degrees
from planner.uniform.launched import launched_variant
from planner.uniform.leanest import infeasible_message
from planner.uniform.plan import uniform_plan
from planner.uniform.space import (
    expert_degrees,
    pipeline_degrees,
    run_config,
    sequence_parallel,
    stage_splits,
)
from planner.vocabulary import GIB, Recompute

RECOMPUTE_LADDER: tuple[Recompute, ...] = ("selective", "full")
"""The rule's recomputation, mildest first (step 4)."""
DISTRIBUTED_OPTIMIZER = 1
"""The rule's ZeRO stage: Megatron's ``--use-distributed-optimizer``, which every pipeline
depth launches (:func:`~planner.uniform.space.zero_stages`)."""


def heuristic_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The rule of thumb's configuration, as a plan (method ``"heuristic"``), with the
    candidates priced in ``solver.configurations``.

    Raises :class:`~planner.errors.InfeasibleError` when no candidate fits.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    todo, rule = [], 0
    for config in heuristic_candidates(model, cluster, training=training, options=options):
        rule += 1
        # as the framework launches it (the rule's overlaps where it fixes its own), or not
        launched = launched_variant(config, model, cluster=cluster, options=options)
        if launched is not None:
            todo.append(launched)
    chosen, leanest, priced = _first_fit(model, cluster, todo, progress,
                                         margin_gib=options.memory_margin_gib)  # fmt: skip
    if chosen is None and not todo and rule:
        raise ConfigError(f"{options.framework} launches none of the rule of thumb's {rule} "
                          f"configurations of {model.name} (ZeRO-1, selective or full "
                          f"recomputation, SP with TP, no context parallelism); use --method "
                          f"ilp, which searches what it launches")  # fmt: skip
    if chosen is None:
        raise _failure(model, cluster, training, options, leanest, first=todo[:1])
    margin = options.margin_bytes(cluster.device, training.stack) / GIB
    plan = uniform_plan(model, cluster, chosen, method="heuristic", framework=options.framework,
                        memory_margin_gib=margin)  # fmt: skip
    summary = SolverSummary(time_s=time.perf_counter() - started, status="feasible",
                            objective=plan.predicted.step_time_s,
                            configurations=priced)  # fmt: skip
    return check_plan(plan.model_copy(update={"solver": summary}), model)


def layouts(model: ModelSpec, cluster: ClusterSpec) -> list[tuple[int, int]]:
    """``(tp, pp)`` in the order the rule tries them: every TP inside a node without a
    pipeline, then the widest TP with ever more stages (each dividing the devices).

    >>> from pathlib import Path
    >>> from planner.spec.reading import load_cluster, load_model
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> gpt3 = load_model(root / "models/gpt3-175b.json")
    >>> layouts(gpt3, load_cluster(root / "clusters/dgx-a100-80gb.json", 16))[:7]
    [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8)]
    """
    tps = tp_degrees(model, cluster)
    widest = tps[-1]
    stages = pipeline_degrees(model, cluster.num_devices // widest)
    return [(tp, 1) for tp in tps] + [(widest, pp) for pp in stages if pp > 1]


def heuristic_candidates(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, options: SolveOptions
) -> Iterator[ParallelConfig]:
    """The rule's configurations in the order it tries them, each drawn from the uniform
    space (:mod:`planner.uniform.space`): the layouts of :func:`layouts`, the first layer
    split, the widest expert parallelism that divides, sequence parallelism with TP. The
    knobs in ``options.pins`` replace the rule's choice of them (as a user applying the rule
    to the knobs left free would), each configuration once."""
    n = cluster.num_devices
    pinned = options.pins.given()
    mbs = 1 if 1 in options.micro_batch_sizes else min(options.micro_batch_sizes)
    seen: set[ParallelConfig] = set()
    for recompute in RECOMPUTE_LADDER:  # outermost: full recomputation is the last resort
        for rule_tp, rule_pp in layouts(model, cluster):
            tp = rule_tp if options.pins.tp is None else options.pins.tp
            pp = rule_pp if options.pins.pp is None else options.pins.pp
            first, last = stage_splits(model.num_layers, pp)[0]
            ep = max(expert_degrees(model, dp=n // (tp * pp), cp=1))
            sp = sequence_parallel(tp, options.framework, model)
            knobs = {"tp": tp, "pp": pp, "ep": ep, "sp": sp, "mbs": mbs,
                     "first_stage_layers": first, "last_stage_layers": last,
                     "recompute": recompute, "zero": DISTRIBUTED_OPTIMIZER}  # fmt: skip
            merged = knobs | pinned
            if merged["ep"] == 1:  # nothing to exchange: the dispatcher pin is moot
                merged.pop("moe_dispatcher", None)
            if merged["zero"] != DISTRIBUTED_OPTIMIZER:  # kept in the distributed optimizer
                merged.pop("optimizer_moments", None)
            config = run_config(training, options, **merged)
            if config not in seen:
                seen.add(config)
                yield config


def _first_fit(
    model: ModelSpec,
    cluster: ClusterSpec,
    todo: list[ParallelConfig],
    progress: ProgressFn | None,
    *,
    margin_gib: float | None,
) -> tuple[ParallelConfig | None, tuple[float, ParallelConfig] | None, int]:
    """The first of ``todo`` that divides and fits, the leanest that did not fit with the
    memory it needs, and how many were priced."""
    leanest: tuple[float, ParallelConfig] | None = None
    priced = 0
    for done, config in enumerate(todo, start=1):
        try:
            result: Estimate | None = estimate(model, cluster, config,
                                               memory_margin_gib=margin_gib)
        except ConfigError:
            result = None  # e.g. the batch does not split over this many replicas
        if result is not None:
            priced += 1
            if result.fits:
                if progress is not None:
                    progress(Progress(done=len(todo), total=len(todo),
                                      best_step_s=result.step_time_s))  # fmt: skip
                return config, leanest, priced
            if leanest is None or result.peak_memory_gib < leanest[0]:
                leanest = (result.peak_memory_gib, config)
        if progress is not None:
            progress(Progress(done=done, total=len(todo), best_step_s=None))
    return None, leanest, priced


def _failure(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    options: SolveOptions,
    leanest: tuple[float, ParallelConfig] | None,
    *,
    first: list[ParallelConfig],
) -> InfeasibleError | ConfigError:
    """Why the rule of thumb found no plan: none divides (with ``first``'s arithmetic, the
    rule's first configuration), or what the leanest needs and what would fit."""
    if leanest is None:
        why = ""
        for config in first:
            try:
                resolve(model, cluster, config)
            except ConfigError as exc:
                why = f" (e.g. {exc})"
        return ConfigError(
            f"the heuristic found no configuration of {model.name} that divides "
            f"{cluster.num_devices} devices at global batch {training.global_batch_size}{why}; "
            f"try a global batch divisible by more data-parallel sizes"
        )
    need_gib, config = leanest
    return InfeasibleError(infeasible_message(
        model, cluster, training, options, searched="no configuration of the rule of thumb",
        least_gib=need_gib, leanest=describe_leanest(config),
    ))  # fmt: skip
