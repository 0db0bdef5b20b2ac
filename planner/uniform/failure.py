"""Why an enumeration of uniform configurations found no plan, in the numbers a user acts on:
the framework that launches none of them and its reason, the pinned knob that does not
divide (in ``planner estimate``'s words), or the least memory a configuration needs, what would
make one fit (:mod:`planner.uniform.remedies`) and each pin without which one would fit."""

from __future__ import annotations

from dataclasses import replace

from planner.errors import ConfigError, InfeasibleError
from planner.frameworks import ANY, profile
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, broken_rules, resolve
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.describe import describe, describe_leanest
from planner.uniform.estimate import estimate
from planner.uniform.groups import context_groups
from planner.uniform.leanest import infeasible_message
from planner.uniform.space import (
    branch_groups,
    branch_leanest,
    branches,
    context_algorithms,
    folds_experts,
    run_config,
    zero_stages,
)
from planner.vocabulary import GIB


def nothing_found(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    training: TrainingSpec,
    options: SolveOptions,
    leanest: tuple[float, ParallelConfig] | None,
    first_refusal: str | None,
) -> InfeasibleError | ConfigError:
    """The error of an enumeration that found no plan: what refuses (the framework, a pin, a
    degree that does not divide), or the least memory a configuration needs and what would
    make one fit, with each pin that prevents it; ``leanest`` is the leanest configuration
    priced (None: none divided) and ``first_refusal`` why the first did not divide."""
    pinned = ", ".join(options.pins.flags().values())
    if leanest is None:
        where = (f"{model.name} on {cluster.num_devices} x {cluster.device.name} at global "
                 f"batch {training.global_batch_size}, sequence {training.seq_length}")  # fmt: skip
        if pinned:
            where += f" with {pinned}"
            refused = _pinned_refusal(model, cluster, training, options)
            if refused is not None:
                return ConfigError(f"{refused} (pinned: {pinned})")
        refused = _refusal(model, cluster, training, options)
        if refused is not None:
            return ConfigError(f"{refused[0]} launches no configuration of {where}: e.g. "
                               f"{refused[1]}")  # fmt: skip
        empty = empty_space(model, cluster, training=training, options=options)
        why = f": e.g. {first_refusal}" if first_refusal else f": {empty}" if empty else ""
        return ConfigError(f"no uniform configuration divides {where}{why}")
    need_gib, config = leanest
    message = infeasible_message(
        model, cluster, training, options, searched="no uniform configuration",
        least_gib=need_gib, leanest=describe_leanest(config),
    )  # fmt: skip
    return InfeasibleError("; ".join([message, *_pins_in_the_way(model, cluster, training,
                                                                 options)]))  # fmt: skip


def empty_space(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, options: SolveOptions
) -> str | None:
    """Why the pins leave the space no configuration at all where each divides alone (what
    :func:`_pinned_refusal` leaves), with the arithmetic: tensor parallelism inside a scale-up
    domain, ``tp x cp`` inside a domain or across whole ones, ZeRO-2/3 without a pipeline;
    None when the space has a configuration or none of these says why.

    >>> from planner.spec.reading import load_cluster, load_model
    >>> from planner.options import Pins, training_of
    >>> gpt3 = load_model("instances/models/gpt3-175b.json")
    >>> a100 = load_cluster("instances/clusters/dgx-a100-80gb.json", 16)
    >>> options = SolveOptions(pins=Pins(tp=16))
    >>> empty_space(gpt3, a100, training=training_of(gpt3, options), options=options)
    'tp(16) does not divide the 8 devices of a scale-up domain (nvlink), which tensor \
parallelism stays inside'
    """
    pins, n = options.pins, cluster.num_devices
    domain, fabric = cluster.scale_up_devices, cluster.network[0].name
    if pins.tp is not None and domain % pins.tp:
        return (f"tp({pins.tp}) does not divide the {domain} devices of a scale-up domain "
                f"({fabric}), which tensor parallelism stays inside")
    if not context_groups(model, cluster, training=training, pins=pins):
        tp, cp = pins.tp or 1, pins.cp or 1
        if n % (tp * cp):
            return f"tp({tp}) x cp({cp}) = {tp * cp} does not divide the {n} devices"
        return (f"tp({tp}) x cp({cp}) = {tp * cp} neither divides the {domain} devices of a "
                f"scale-up domain ({fabric}) nor spans whole ones")
    pp = pins.pp or 1
    if pins.zero is not None and pins.zero not in zero_stages(pp):
        return (f"ZeRO-{pins.zero} is searched without a pipeline only (pp({pp}): ZeRO "
                f"{' or '.join(map(str, zero_stages(pp)))})")  # fmt: skip
    return None


def _pinned_refusal(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> str | None:
    """Why the pinned knobs alone do not divide, in ``planner estimate``'s words (None when
    they do). A dispatcher or bf16 moments pinned apply only where the space applies them
    (:func:`~planner.uniform.space.branch_groups`: expert parallelism, ZeRO 1), so alone they
    refuse nothing."""
    pinned = options.pins.given()
    if (pinned.get("ep") or 1) == 1:
        pinned.pop("moe_dispatcher", None)
    if pinned.get("zero") != 1:
        pinned.pop("optimizer_moments", None)
    config = run_config(training, options, **pinned)
    try:
        resolve(model, cluster, config)
    except ConfigError as exc:
        own = [message for name, message in broken_rules(model, cluster, config)
               if name not in _MENDED]  # fmt: skip
        return own[0] if own else str(exc)
    return None


_MENDED = frozenset({"batch", "interleaved_microbatches"})
"""Rules a pinned configuration breaks only through the degrees left free at their
defaults (data parallelism over every device left, a microbatch of one), which the search
sets otherwise: a pin's own rule is told before them (``--ep 512`` of 256 experts was told
that the batch does not divide 16,384 data-parallel ranks)."""


def _refusal(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> tuple[str, str] | None:
    """The target framework's title and why it refuses the configurations of the space that
    divide, when it refuses them all (None otherwise): a reason it gives for every one of
    them (the model's architecture, say; the first in the profile's order of rules), else the
    first configuration's first reason."""
    if options.framework == ANY:
        return None
    target = profile(options.framework)
    common: set[str] | None = None
    first: tuple[str, ...] = ()
    for branch in branches(model, cluster, training=training, pins=options.pins,
                           fold=folds_experts(options),
                           attending=context_algorithms(options)):
        for group in branch_groups(branch, model, training=training, options=options):
            for config in group:
                try:
                    reasons = target.refusals(resolve(model, cluster, config), model)
                except ConfigError:
                    continue
                first = first or reasons
                common = set(reasons) if common is None else common & set(reasons)
    if not first:
        return None
    return target.title, next((r for r in first if r in (common or ())), first[0])


def _pins_in_the_way(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[str]:
    """Each pin without which a configuration would fit, with the leanest that then fits."""
    usable = options.usable_bytes(cluster.device, training.stack)
    out = []
    for name, flag in options.pins.flags().items():
        freed = replace(options, pins=replace(options.pins, **{name: None}))
        for leanest in branch_leanest(model, cluster, training=training, options=freed):
            try:
                result = estimate(model, cluster, leanest)
            except ConfigError:
                continue
            if result.peak_memory_gib * GIB <= usable:
                out.append(f"the pin {flag} prevents a fit: without it "
                           f"{describe(leanest)} needs {result.peak_memory_gib:.1f} GiB")
                break
    return out
