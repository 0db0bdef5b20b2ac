"""Why this plan: :func:`explain`.

What binds (the most loaded stage's memory against the device, and what fills it; the step's
parts on the critical stage), how the step moves when each knob turns one notch either way
(:mod:`planner.diagnose.notches`, every neighbour priced in one
:func:`~planner.uniform.batch.estimate_batch` and marked as dividing, fitting and launched by
the plan's framework or not), what the same plan gains from other hardware (twice the
bandwidth outside the scale-up domain, twice the memory, a scale-up domain twice as wide), and
a user's own configuration priced beside the plan.

The memory, the step and what its price extrapolates come from the plan itself, so they are
there for every plan; the rest
prices the plan's uniform configuration (:attr:`Plan.configuration`) and needs its model and
cluster: a per-operator plan (``--framework any``) has none, and only a configuration the user
gives in full is priced for it.

The one function that fills the explanation's records (:mod:`planner.diagnose.explanation`),
with its runnable example; the neighbours are :mod:`planner.diagnose.notches`', the
other hardware :mod:`planner.diagnose.whatif`'s, what the price extrapolates the plan's error
band's (:mod:`planner.cost.uncertainty`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner import cost
from planner.cost.uncertainty import TERMS
from planner.diagnose.explanation import (
    Explanation,
    Extrapolated,
    MemoryBinding,
    Neighbour,
    Part,
    WhatIf,
)
from planner.diagnose.notches import describe_change, notches, with_changes, word
from planner.diagnose.routing import routing_what_if
from planner.diagnose.whatif import hardware_changes
from planner.errors import ConfigError, InputError
from planner.frameworks import ANY, profile
from planner.plan.config import ParallelConfig, resolve
from planner.plan.inputs import at_plan_size, check_inputs
from planner.plan.schema import MemoryBreakdown, Plan, StepTime
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.batch import BatchEstimate, estimate_batch
from planner.uniform.defaults import (
    attending,
    launched_overlaps,
    overlap_choices,
    sequence_parallel,
)
from planner.uniform.estimate import Estimate, estimate
from planner.vocabulary import GIB


def explain(
    plan: Plan, model: ModelSpec | None = None, cluster: ClusterSpec | None = None, *,
    why_not: Mapping[str, Any] | None = None,
) -> Explanation:  # fmt: skip
    """Why ``plan``: what binds, each knob one notch either way, the plan on other hardware and
    ``why_not`` (configuration fields to change from the plan's, as
    :func:`~planner.diagnose.why_not.parse_changes` reads them) priced beside it.

    Without ``model`` and ``cluster`` only what the plan records (memory, step) is explained.
    Raises :class:`InputError` when they are not the plan's, or ``why_not`` is given without
    them; :class:`~planner.errors.ConfigError` (``estimate``'s message) when ``why_not`` does
    not divide.

    GPT-3 175B's plan on 1024 A100s (its knobs pinned only to make the search quick):

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt3-175b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=128)
    >>> pins = planner.Pins(tp=4, pp=8, vpp=6, mbs=1)
    >>> plan = planner.solve(model, cluster, planner.SolveOptions(pins=pins))
    >>> why = explain(plan, model, cluster)
    >>> why.summary
    'TP4 x PP8 x DP32, mbs 1, interleaved 1F1B (v=6), sequence parallel, distributed optimizer'
    >>> why.step[0].name, round(why.step[0].share, 2)  # the step's largest part
    ('compute_s', 0.87)
    >>> why.memory.parts[0].name, round(why.memory.free_gib, 1)  # the peak's largest part
    ('activations_gib', 13.4)

    Half the tensor parallelism would be a second faster but does not fit; twice as much fits
    but is slower:

    >>> for n in why.sensitivities[:2]:
    ...     print(n.change, round(n.delta_s, 2), n.fits)
    tp 4 -> 2 (dp 32 -> 64) -1.14 False
    tp 4 -> 8 (dp 32 -> 16) 2.66 True

    A configuration of one's own, priced beside the plan:

    >>> mine = explain(plan, model, cluster, why_not={"pp": 16}).why_not
    >>> mine.change, round(mine.delta_s, 2), mine.feasible
    ('pp=16', 0.54, True)
    """
    p = plan.predicted
    steps = sorted(StepTime.model_fields, key=lambda k: -getattr(p.time, k))
    base = dict(
        summary=plan.summary(), framework=plan.framework, step_time_s=p.step_time_s,
        step=tuple(_part(k, getattr(p.time, k), p.step_time_s) for k in steps),
        memory=memory_binding(plan), extrapolated=extrapolated(plan),
    )  # fmt: skip
    if model is None or cluster is None:
        if why_not is not None:
            raise InputError("--why-not prices a configuration: give the plan's model and "
                             "cluster (--model, --cluster)")  # fmt: skip
        return Explanation(**base, limits=(
            "the knob sensitivities, the hardware what-ifs and --why-not price the plan: give "
            "its model and cluster (--model, --cluster)",))  # fmt: skip
    check_inputs(plan, model, cluster)
    cluster = at_plan_size(plan, cluster)
    mine = None if why_not is None else why_not_config(plan, model, cluster, why_not)
    if plan.configuration is None:
        limits = (f"the plan is per-operator ({plan.framework}): it has no uniform "
                  "configuration to turn one notch or to price on other hardware",)  # fmt: skip
        return Explanation(**base, limits=limits, why_not=None if mine is None else _why_not(
            plan, model, cluster, mine, why_not or {}, reference=p.step_time_s))
    reference, groups, rows, sensitivities = _sensitivities(plan, model, cluster,
                                                            plan.configuration)  # fmt: skip
    hardware = tuple(_what_if(plan, model, change, changed, rows, groups, reference,
                              sensitivities) for change, changed in hardware_changes(cluster))
    limits = ()
    if reference.step_time_s != p.step_time_s:
        limits = (f"the plan's configuration prices at {reference.step_time_s:.3f} s, the plan "
                  f"records {p.step_time_s:.3f} s (another version of the cost model): the "
                  "changes are against the former",)  # fmt: skip
    return Explanation(
        **base, sensitivities=sensitivities, hardware=hardware, limits=limits,
        routing=routing_what_if(plan, model, cluster),
        why_not=None if mine is None else _why_not(plan, model, cluster, mine, why_not or {},
                                                    reference=reference.step_time_s),
    )  # fmt: skip


Groups = list[tuple[str, str, list[ParallelConfig]]]
"""Per knob and direction, the configurations tried for its notch, nearest first."""


def _sensitivities(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig
) -> tuple[Neighbour, Groups, list[ParallelConfig], tuple[Neighbour, ...]]:
    """The plan's configuration re-priced, the notches tried, the rows priced (the plan's
    first) and, per knob and direction, the nearest notch that divides and the plan's
    framework launches, else the nearest that divides, else the nearest (DeepSpeed's notch of
    offload is its own ZeRO-Offload, not Megatron's)."""
    host = cluster.host is not None
    # a notch is launched as the plan's framework would, but for the knob it turns
    groups = [(knob.name, direction,
               [_launched(plan, model, cluster, c, given=(knob.name,)) for c in options])
              for knob, down, up in notches(config, model, cluster.num_devices, host=host)
              for direction, options in (("down", down), ("up", up)) if options]  # fmt: skip
    rows = [config, *(c for _, _, options in groups for c in options)]
    priced = _price(plan, model, cluster, rows)
    reference = priced(0, knob="plan", direction="given", base=None)
    sensitivities = []
    at = 1
    for name, direction, options in groups:
        picks = range(at, at + len(options))
        at += len(options)
        divides = [i for i in picks if priced.batch.columns["divides"][i]]
        launched = [i for i in divides if not _refusals(plan, model, cluster, rows[i])]
        i = (launched or divides or [picks[0]])[0]
        sensitivities.append(priced(i, knob=name, direction=direction, base=reference))
    return reference, groups, rows, tuple(sensitivities)


def extrapolated(plan: Plan) -> tuple[Extrapolated, ...]:
    """What the plan's step rests on beyond its validated runs, with the parts it prices."""
    p = plan.predicted
    gaps = () if p.error_band is None else p.error_band.extrapolated
    return tuple(Extrapolated(text=gap.text, parts=tuple(
        _part(name, getattr(p.time, name), p.step_time_s) for name in TERMS[gap.feature]
        if getattr(p.time, name) > 0)) for gap in gaps)  # fmt: skip


def memory_binding(plan: Plan) -> MemoryBinding:
    """The plan's most loaded stage against the device's memory less the plan's margin."""
    stage = max(plan.stages, key=lambda s: s.memory.total_gib)
    peak = stage.memory.total_gib
    names = sorted(MemoryBreakdown.model_fields, key=lambda k: -getattr(stage.memory, k))
    capacity = plan.cluster.device_memory_gib
    return MemoryBinding(
        stage=stage.index, peak_gib=peak, capacity_gib=capacity,
        margin_gib=plan.memory_margin_gib, free_gib=capacity - plan.memory_margin_gib - peak,
        parts=tuple(_part(k, getattr(stage.memory, k), peak) for k in names),
    )  # fmt: skip


def why_not_config(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, changes: Mapping[str, Any]
) -> ParallelConfig:
    """The plan's configuration with the user's ``changes`` (devices kept, as
    :func:`~planner.diagnose.notches.with_changes` keeps them), launched as the plan's
    framework would launch it but for what they set (:func:`_launched`); for a per-operator
    plan, ``estimate``'s defaults on the plan's training run."""
    run = plan.configuration or ParallelConfig(
        global_batch=plan.global_batch_size, seq_len=plan.seq_length, precision=plan.precision)
    return _launched(plan, model, cluster, with_changes(run, changes, model), given=changes)


def _launched(plan: Plan, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *,
              given: Collection[str]) -> ParallelConfig:  # fmt: skip
    """``config`` as the plan's framework would launch it, as its search sets what it does not
    search, but for the fields ``given`` (the knob a notch turns, what the user set): context
    parallelism attending its way (:func:`~planner.uniform.defaults.attending`: torchtitan's
    notch from ``cp 1`` all-gathers K/V), and where the framework refuses the configuration
    beside the change, the most overlapped flags it launches
    (:func:`~planner.uniform.defaults.launched_overlaps`: DeepSpeed's ZeRO-1 and ZeRO-2
    gather the updated weights inside the optimizer step, so a ZeRO-3 plan's notch to
    ZeRO-2 turns ``overlap_param_gather`` off), with sequence parallelism as it was, then
    as the search sets it (Megatron-Core's MoE layers take TP only with SP, so a TP1 plan's
    ``tp 1 -> 2`` turns it on). Unchanged for a per-operator plan; where nothing of that
    launches, the settings of sequence parallelism and of the overlap flags not given that
    the framework refuses for the fewest reasons (the plan's own on a tie), so that they are
    the change's own (torchtitan's ZeRO-3 ``--why-not pp=2,tp=2`` is refused for ZeRO-3
    under a pipeline, not also for TP without SP; DeepSpeed's ZeRO-3 plan's ``--why-not
    tp=8,pp=4,zero=1,recompute=selective`` for selective recomputation under flash attention,
    not also for the plan's overlaps, which DeepSpeed's pipeline and ZeRO-1 do not run)."""
    if plan.framework == ANY:
        return config
    if "cp_algo" not in given:
        config = attending(config, plan.framework)
    own = profile(plan.framework).selective_modules
    if own is not None and config.recompute == "selective" and config.recompute_modules is None \
            and "recompute_modules" not in given:
        # selective recomputation as the framework runs it (torchtitan's per-operator policy)
        config = config.model_copy(update={"recompute_modules": own})
    try:
        if not _refusals(plan, model, cluster, config):
            return config
    except ConfigError:  # does not divide: priced as it is, to say why
        return config

    def reasons(variant: ParallelConfig) -> float:
        try:
            return len(_refusals(plan, model, cluster, variant))
        except ConfigError:  # SP's split does not divide: not a way to launch it
            return math.inf

    sps = [config.sp] if "sp" in given else list(dict.fromkeys(
        (config.sp, sequence_parallel(config.tp))))  # fmt: skip
    variants = [config.model_copy(update={"sp": sp}) for sp in sps]
    for variant in variants:
        if reasons(variant) == math.inf:
            continue
        launched = launched_overlaps(variant, model, cluster=cluster, framework=plan.framework,
                                     **overlap_choices(config, given))  # fmt: skip
        if launched is not None:
            return launched

    def own_first(name: str) -> tuple[bool, ...]:  # the plan's setting wins a tie
        own = bool(getattr(config, name))
        return (own,) if name in given else (own, not own)

    flagged = [v.model_copy(update={"overlap_grad_reduce": grad, "overlap_param_gather": gather})
               for v in variants for grad in own_first("overlap_grad_reduce")
               for gather in own_first("overlap_param_gather")]  # fmt: skip
    return min(flagged, key=reasons)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Priced:
    """Rows of one :func:`estimate_batch` as :class:`Neighbour` s."""

    plan: Plan
    """The plan explained."""
    model: ModelSpec
    """Its model."""
    batch: BatchEstimate
    """The rows priced, on the cluster of the batch."""

    @property
    def plan_dp(self) -> int:
        """The plan's data-parallel ranks."""
        return self.plan.data_parallel_replicas * self.plan.stages[0].parallel.dp

    def __call__(self, i: int, *, knob: str, direction: str,
                 base: Neighbour | None) -> Neighbour:  # fmt: skip
        b, col = self.batch, self.batch.columns
        config = b.config(i)
        before = self.plan.configuration or config
        change = "the plan" if base is None else describe_change(
            before, config, dp=(self.plan_dp, int(col["dp"][i])),
            microbatches=(self.plan.num_microbatches, int(col["num_microbatches"][i])),
            knob=knob)
        if not col["divides"][i]:
            return Neighbour(
                knob=knob, direction=direction, change=change,  # type: ignore[arg-type]
                config=config, refusal=b.refusal(i), step_time_s=None, delta_s=None,
                peak_memory_gib=None, over_gib=None, time=None, memory=None,
            )  # fmt: skip
        step = float(col["step_time_s"][i])
        peak = float(col["peak_memory_gib"][i])
        usable = usable_gib(b.cluster, self.plan.memory_margin_gib)
        return Neighbour(
            knob=knob, direction=direction, change=change, config=config,  # type: ignore[arg-type]
            refusal=None, step_time_s=step,
            delta_s=None if base is None or base.step_time_s is None else step - base.step_time_s,
            peak_memory_gib=peak, over_gib=peak - usable,
            time=StepTime(**{k: float(col[f"time.{k}"][i]) for k in StepTime.model_fields}),
            memory=MemoryBreakdown(**{k: float(col[f"memory.{k}"][i])
                                      for k in MemoryBreakdown.model_fields}),
            framework_refusals=_refusals(self.plan, self.model, b.cluster, config),
        )  # fmt: skip


def _price(plan: Plan, model: ModelSpec, cluster: ClusterSpec,
           rows: Sequence[ParallelConfig]) -> _Priced:  # fmt: skip
    return _Priced(plan=plan, model=model, batch=estimate_batch(
        model, cluster, rows, memory_margin_gib=plan.memory_margin_gib))


def _refusals(plan: Plan, model: ModelSpec, cluster: ClusterSpec,
              config: ParallelConfig) -> tuple[str, ...]:  # fmt: skip
    """Why the plan's framework cannot launch ``config`` (none for a per-operator plan)."""
    if plan.framework == ANY:
        return ()
    return profile(plan.framework).refusals(resolve(model, cluster, config), model)


def _what_if(
    plan: Plan, model: ModelSpec, change: str, cluster: ClusterSpec,
    rows: Sequence[ParallelConfig], groups: Groups,
    reference: Neighbour, before: Sequence[Neighbour],
) -> WhatIf:  # fmt: skip
    """The plan's configuration priced on ``cluster``, and the fastest one-notch change the
    new hardware makes feasible (``before``: the changes on the plan's own hardware)."""
    priced = _price(plan, model, cluster, rows)
    mine = priced(0, knob="plan", direction="given", base=reference)
    best = None
    at = 1
    for (name, direction, options), was in zip(groups, before, strict=True):
        picks = range(at, at + len(options))
        at += len(options)
        if was.feasible:
            continue
        i = next((i for i in picks if priced.batch.columns["divides"][i]), None)
        if i is None:
            continue
        n = priced(i, knob=name, direction=direction, base=reference)
        bar = mine.step_time_s if best is None else best.step_time_s
        if n.feasible and n.step_time_s is not None and bar is not None and n.step_time_s < bar:
            best = n
    return WhatIf(change=change, priced=mine, best=best)


def _why_not(plan: Plan, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
             given: Mapping[str, Any], *, reference: float) -> Neighbour:  # fmt: skip
    """The user's configuration priced by :func:`estimate` (its message when it does not
    divide), against the plan's step."""
    result: Estimate = estimate(model, cluster, config, memory_margin_gib=plan.memory_margin_gib)
    usable = usable_gib(cluster, plan.memory_margin_gib)
    text = ", ".join(f"{k.replace('_', '-')}={word(v, k)}" for k, v in given.items())
    return Neighbour(
        knob="why-not", direction="given", change=text, config=config, refusal=None,
        step_time_s=result.step_time_s, delta_s=result.step_time_s - reference,
        peak_memory_gib=result.peak_memory_gib, over_gib=result.peak_memory_gib - usable,
        time=result.time, memory=result.memory,
        framework_refusals=_refusals(plan, model, cluster, config),
    )  # fmt: skip


def differences(mine: Neighbour, plan: Plan) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
    """The step's parts and the memory's parts of ``mine`` less the plan's, largest change
    first (shares of the whole difference; zero differences left out)."""
    if mine.time is None or mine.memory is None:
        return (), ()
    stage = max(plan.stages, key=lambda s: s.memory.total_gib).memory
    out = []
    for fields, ours, theirs in ((StepTime.model_fields, mine.time, plan.predicted.time),
                                 (MemoryBreakdown.model_fields, mine.memory, stage)):
        deltas = {k: getattr(ours, k) - getattr(theirs, k) for k in fields}
        whole = sum(deltas.values())
        keys = sorted((k for k, v in deltas.items() if v != 0), key=lambda k: -abs(deltas[k]))
        out.append(tuple(Part(name=k, value=deltas[k], share=deltas[k] / whole if whole else 0.0)
                         for k in keys))  # fmt: skip
    return out[0], out[1]


def usable_gib(cluster: ClusterSpec, margin_gib: float) -> float:
    """What a plan may fill on one of ``cluster``'s devices: its memory less the margin
    (``estimate``'s ``fits`` is the peak within it, :func:`planner.cost.memory_margin_bytes`)."""
    return cost.usable_bytes(cluster.device, margin_gib) / GIB


def _part(name: str, value: float, whole: float) -> Part:
    return Part(name=name, value=value, share=value / whole if whole else 0.0)
