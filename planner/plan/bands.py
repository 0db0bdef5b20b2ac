"""The bands a prediction carries: how far its step time (:class:`ErrorBand`) and its peak memory
(:class:`MemoryBand`) may be off, and what it extrapolates (:class:`Extrapolation`). Records of a
plan (:class:`planner.plan.schema.Predicted`); computed by :mod:`planner.cost.uncertainty`."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from planner.vocabulary import ParallelismKind


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def plus_minus(fraction: float) -> str:
    """A band's half-width as printed: ``+/- 6 %``, whole percent rounded up, at least 1.

    >>> plus_minus(0.06), plus_minus(0.0601), plus_minus(0.0)
    ('+/- 6 %', '+/- 7 %', '+/- 1 %')
    """
    # 1e-9: a band stored as 0.06 is 6 %, not 7 % by a float's last digit
    return f"+/- {max(1, math.ceil(100 * fraction - 1e-9))} %"


class Extrapolation(_Frozen):
    """One thing a prediction has no validated run for."""

    feature: str
    """What is outside the evidence: a mechanism (``zero-3``), or ``stack``, ``moe``,
    ``precision``, ``seq_length``, ``num_devices``, ``utilization`` (a hardware FLOPs
    utilisation above the highest validated; ``mfu`` in plans written before it)
    (:data:`planner.cost.uncertainty.TERMS` says which parts of the step each prices)."""
    text: str
    """In words: ``no validated run with ZeRO-3 on H100-SXM5-80GB``."""


class ErrorBand(_Frozen):
    """How far the cost model missed the validated runs nearest to a prediction on its device,
    widened with their distance from it, and what that rests on: the step time printed
    ``16.9 s +/- 6 %``. Computed by :func:`planner.cost.uncertainty.error_band`."""

    fraction: float | None = Field(ge=0)
    """The band's half-width at the 80th percentile of |predicted / measured - 1|; None when
    the device has no validated runs (its step times carry no measured error:
    uncalibrated)."""
    fraction_p95: float | None = Field(default=None, ge=0)
    """The same at the 95th percentile; None without runs, or in a plan whose device's file
    kept bands by kind only."""
    runs: int = Field(ge=0)
    """How many validated runs the band rests on (0: uncalibrated)."""
    parallelism: ParallelismKind
    """The prediction's kind of parallelism."""
    closest: str
    """What the band rests on, in words: which runs, how far they were within, how much the
    band widened for their distance; or, for a device without runs, that its numbers are
    uncalibrated."""
    extrapolated: tuple[Extrapolation, ...] = ()
    """What the prediction has no validated run for, and a hardware FLOPs utilisation above
    the highest validated."""

    def at(self, quantile: float) -> float | None:
        """The half-width at ``quantile`` (0.8 or 0.95); None where not known."""
        return {0.8: self.fraction, 0.95: self.fraction_p95}[quantile]

    @property
    def text(self) -> str:
        """``+/- 6 %`` (whole percent, rounded up), or ``uncalibrated``."""
        return "uncalibrated" if self.fraction is None else plus_minus(self.fraction)


class MemoryBand(_Frozen):
    """How far the memory model missed the peaks measured on the prediction's device and stack:
    computed by :func:`planner.cost.uncertainty.memory_band`."""

    fraction: float | None = Field(ge=0)
    """80th percentile of |predicted / measured - 1| of those peaks; None where no run of the
    stack measured its peak on the device."""
    fraction_p95: float | None = Field(default=None, ge=0)
    """The same at the 95th percentile."""
    runs: int = Field(ge=0)
    """How many measured peaks it rests on."""
    closest: str
    """What it rests on, in words."""

    def at(self, quantile: float) -> float | None:
        """The band at ``quantile`` (0.8 or 0.95); None where not known."""
        return {0.8: self.fraction, 0.95: self.fraction_p95}[quantile]

    @property
    def text(self) -> str:
        """``+/- 1 %``, or ``unmeasured``."""
        return "unmeasured" if self.fraction is None else plus_minus(self.fraction)
