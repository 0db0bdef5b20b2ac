"""What :func:`planner.diagnose.explain.explain` answers, as records: the plan's parts, what
binds its memory, each neighbouring configuration and the plan on other hardware, with the
verdicts (divides, fits, launched) each row carries. ``--json`` prints them; the report
(:mod:`planner.report.explain`) reads them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from planner.diagnose.routing import RoutingWhatIf
from planner.plan.config import ParallelConfig
from planner.plan.schema import MemoryBreakdown, StepTime


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Part(_Frozen):
    """One part of a whole: a step's seconds or a device's memory."""

    name: str
    """The part's key, as the plan's JSON names it (``compute_s``, ``optimizer_gib``)."""
    value: float
    """Its amount, in the unit its name ends with (for a difference: the difference)."""
    share: float
    """Its fraction of the whole (for a difference: of the whole difference)."""


class MemoryBinding(_Frozen):
    """The most loaded stage's memory against what the device lets a plan use."""

    stage: int
    """The stage with the highest peak."""
    peak_gib: float
    """Its peak per device, the device's reserved memory included."""
    capacity_gib: float
    """The device's memory."""
    margin_gib: float
    """What the plan keeps free beside its peak."""
    free_gib: float
    """Capacity less margin less peak: what the stage could still take (negative: over)."""
    parts: tuple[Part, ...]
    """What fills the peak, largest first."""


class Neighbour(_Frozen):
    """A configuration one notch (or a user's changes) away from the plan's, priced."""

    knob: str
    """The ``ParallelConfig`` field turned (``why-not`` for a user's own configuration)."""
    direction: Literal["down", "up", "given"]
    """Which way it turned."""
    change: str
    """What changed, as a user says it: ``tp 4 -> 8 (dp 32 -> 16)``."""
    config: ParallelConfig
    """The configuration priced."""
    refusal: str | None
    """Why it does not divide, in ``planner estimate``'s words; None when it does."""
    step_time_s: float | None
    """Its predicted step (None when it does not divide)."""
    delta_s: float | None
    """Its step less the plan's (negative: faster)."""
    peak_memory_gib: float | None
    """Its most loaded stage's peak per device."""
    over_gib: float | None
    """Its peak less what the device lets it use (positive: does not fit by that much)."""
    time: StepTime | None
    """Its step's seconds by part."""
    memory: MemoryBreakdown | None
    """Its peak by what fills it."""
    framework_refusals: tuple[str, ...] = ()
    """Why the plan's framework cannot launch it (empty: it can, or the plan has none)."""
    fits: bool = False
    """It divides and its peak leaves the margin free (``over_gib <= 0``; set from it)."""
    feasible: bool = False
    """It divides, fits and the plan's framework launches it (set from the above)."""

    @model_validator(mode="before")
    @classmethod
    def _verdicts(cls, data: Any) -> Any:
        # fits and feasible follow from over_gib and the refusals: derived here, never given
        if isinstance(data, dict):
            over = data.get("over_gib")
            fits = over is not None and over <= 0
            data = data | {"fits": fits, "feasible": fits and not data.get("framework_refusals")}
        return data


class WhatIf(_Frozen):
    """The plan's configuration on changed hardware."""

    change: str
    """The hardware change, in words (:func:`~planner.diagnose.whatif.hardware_changes`)."""
    priced: Neighbour
    """The plan's configuration priced on it (``delta_s`` against the plan on its own
    hardware)."""
    best: Neighbour | None
    """The fastest one-notch change the changed hardware makes feasible (it was not on the
    plan's), when it beats the plan's configuration there (``delta_s`` against the plan on
    its own hardware)."""


class Extrapolated(_Frozen):
    """Something the plan's prediction has no validated run for, and the parts of its step
    that price it (:data:`planner.cost.uncertainty.TERMS`)."""

    text: str
    """In words, as the band says it."""
    parts: tuple[Part, ...]
    """The step's parts it prices, each with its seconds and share of the step."""


class Explanation(_Frozen):
    """Why a plan is what it is: :func:`explain`'s answer."""

    summary: str
    """The plan in one line (:meth:`Plan.summary`)."""
    framework: str
    """The framework the plan was made for."""
    step_time_s: float
    """The plan's predicted step."""
    step: tuple[Part, ...]
    """The step's seconds on the critical stage by part, largest first."""
    memory: MemoryBinding
    """The most loaded stage's memory."""
    sensitivities: tuple[Neighbour, ...] = ()
    """Each knob one notch down and up, in :data:`~planner.diagnose.notches.KNOBS`' order."""
    hardware: tuple[WhatIf, ...] = ()
    """The plan on changed hardware."""
    why_not: Neighbour | None = None
    """The user's own configuration, priced beside the plan."""
    limits: tuple[str, ...] = ()
    """What this explanation could not do for this plan, and why."""
    extrapolated: tuple[Extrapolated, ...] = ()
    """What the step's price rests on beyond the validated runs (its error band's
    :attr:`~planner.plan.schema.ErrorBand.extrapolated`)."""
    routing: RoutingWhatIf | None = None
    """A dropless mixture of experts' plan with its experts' loads spread otherwise
    (:mod:`planner.diagnose.routing`)."""
