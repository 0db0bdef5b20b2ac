"""Whether the error bands hold what they claim: leave one framework family out of a chip's
validated runs, band each of its runs from the rest (:func:`planner.cost.uncertainty.nearest`),
and count how many fall inside. The widening of the bands with distance
(:data:`~planner.cost.uncertainty.WIDENING`) and their allowance for exposed communication
(:data:`~planner.cost.uncertainty.COMMUNICATION`) are fitted here (:func:`fit_bands`) and
checked here (:func:`coverage`), by ``benchmarks/band_coverage.py``.

>>> from planner.spec import ValidatedRun
>>> def run(family, error, stack="megatron-te"):
...     return ValidatedRun(id=f"{family}{error}", family=family, stack=stack, seq_length=2048,
...                         num_devices=8, network_gb_s=231.0, gflop_per_token=3.0,
...                         error=error, mfu=0.4)
>>> runs = [run("a", e) for e in (0.01, 0.02, -0.01)] + [run("b", e, "hf-eager")
...                                                       for e in (0.1, -0.2, 0.05)]
>>> held = held_out("X", runs)
>>> [h.family for h in held], round(held[3].nearest.mean_distance, 1)
(['a', 'a', 'a', 'b', 'b', 'b'], 2.0)
>>> fit_widening(held, 0.8) > 0
True
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.cost.uncertainty import COMMUNICATION, WIDENING, Nearest, nearest
from planner.spec import ValidatedRun


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    """A run whose family was left out, and the runs its band rests on without it."""

    id: str
    """The run's id."""
    chip: str
    """The chip it ran on."""
    family: str
    """Its framework family, the one left out."""
    error: float
    """Its error, ``predicted / measured - 1``."""
    communication_share: float
    """The share of its predicted step that is exposed communication."""
    nearest: Nearest
    """The runs of the other families nearest it."""

    def half_width(self, quantile: float, widening: Mapping[float, float] = WIDENING,
                   communication: Mapping[float, float] = COMMUNICATION) -> float:  # fmt: skip
        """Its band's half-width at ``quantile`` (:meth:`Nearest.half_width`)."""
        return self.nearest.half_width(quantile, self.communication_share, widening=widening,
                                       communication=communication)  # fmt: skip

    def inside(self, quantile: float, widening: Mapping[float, float] = WIDENING,
               communication: Mapping[float, float] = COMMUNICATION) -> bool:  # fmt: skip
        """Whether its error is inside its band at ``quantile``."""
        return abs(self.error) <= self.half_width(quantile, widening, communication)


def held_out(chip: str, runs: Sequence[ValidatedRun], families: Sequence[str] | None = None,
             ) -> list[HeldOut]:  # fmt: skip
    """Every run of ``families`` (default: every family of ``runs``, one chip's runs) banded
    from the runs of the other families; none for a chip with one family."""
    out = []
    for family in sorted(families or {r.family for r in runs}):
        others = [r for r in runs if r.family != family]
        if others:
            out += [HeldOut(id=r.id, chip=chip, family=family, error=r.error,
                            communication_share=r.communication_share,
                            nearest=nearest(r, others))
                    for r in runs if r.family == family]  # fmt: skip
    return out


def held_out_runs(chip: str, runs: Sequence[ValidatedRun]) -> list[HeldOut]:
    """Every run of ``runs`` (one chip's) banded from all the others, its own family's
    included: the bands of predictions near the evidence, as a user pricing a configuration
    of a validated family gets them."""
    return [HeldOut(id=r.id, chip=chip, family=r.family, error=r.error,
                    communication_share=r.communication_share,
                    nearest=nearest(r, [o for o in runs if o.id != r.id]))
            for r in runs if len(runs) > 1]  # fmt: skip


def _folds(held: Sequence[HeldOut]) -> dict[tuple[str, str], list[HeldOut]]:
    """The held-out runs by (chip, family): each fold left out together."""
    folds: dict[tuple[str, str], list[HeldOut]] = {}
    for h in held:
        folds.setdefault((h.chip, h.family), []).append(h)
    return folds


def fit_widening(held: Sequence[HeldOut], quantile: float,
                 communication: Mapping[float, float] = COMMUNICATION) -> float:  # fmt: skip
    """The least widening per unit of distance at which the folds' mean coverage at
    ``quantile`` reaches it, the bands widened by ``communication`` for each step's exposed
    communication: each (chip, family) counts once, however many runs it has (one software
    stack's 78 runs are one piece of evidence about another stack, not 78)."""
    folds = list(_folds(held).values())
    c = communication[quantile]

    def needed(h: HeldOut) -> float:
        """The least widening that puts ``h`` inside its band."""
        near, error = h.nearest, abs(h.error)
        if error <= near.spread[quantile]:
            return 0.0
        short = error - near.set_apart(quantile, c) - c * h.communication_share
        return max(0.0, short / max(near.mean_distance, 1e-9))

    needs = [np.array([needed(h) for h in fold]) for fold in folds]
    candidates = np.unique(np.concatenate([[0.0], *needs]))
    for slope in candidates:
        if statistics.fmean(float((n <= slope).mean()) for n in needs) >= quantile:
            return _up(float(slope))
    return _up(float(candidates[-1]))


def _up(slope: float) -> float:
    """``slope`` rounded up to 4 decimals: rounded down, a fitted slope could leave out the
    run it was fitted to take in."""
    return math.ceil(slope * 1e4 - 1e-9) / 1e4


COMMUNICATION_GRID = tuple(round(0.05 * i, 2) for i in range(21))
"""The allowances for exposed communication :func:`fit_bands` tries: 0 to 1 in steps of 5 %."""


def fit_bands(held: Sequence[HeldOut]) -> tuple[dict[float, float], dict[float, float]]:
    """The allowance for exposed communication and the widening per unit of distance at each
    quantile of :data:`~planner.cost.uncertainty.WIDENING` (the two things a band fits). The
    widening is :func:`fit_widening`'s without an allowance: how misses grow away from the
    evidence. The allowance is then the one of :data:`COMMUNICATION_GRID` whose folds'
    coverage spreads least about the quantile (the sum of squared differences; ties: the
    smaller) with their mean still at or above it, and not below the lower quantile's. Fitted
    the other way round, a larger allowance would buy a smaller widening, and a family left
    out with little communication and far from the others would lose its band to it.

    >>> from planner.spec import ValidatedRun
    >>> def run(family, error, share, stack):
    ...     return ValidatedRun(id=f"{family}{error}", family=family, stack=stack,
    ...                         seq_length=2048, num_devices=8, network_gb_s=231.0,
    ...                         gflop_per_token=3.0, error=error, mfu=0.4,
    ...                         communication_share=share)
    >>> quiet = [run("a", e, 0.0, "megatron-te") for e in (0.01, 0.02, 0.01, 0.0, 0.02)]
    >>> loud = [run("b", e, s, "hf-eager") for e, s in ((0.2, 0.4), (0.1, 0.2), (0.01, 0.0),
    ...                                                  (0.15, 0.3), (0.3, 0.6))]
    >>> communication, widening = fit_bands(held_out("X", quiet + loud))
    >>> communication[0.8] > 0
    True
    """
    folds = list(_folds(held).values())
    communication: dict[float, float] = {}
    widening: dict[float, float] = {}
    for q in sorted(WIDENING):
        w = widening[q] = fit_widening(held, q, {q: 0.0})
        floor = max(communication.values(), default=0.0)
        best: tuple[float, float] | None = None
        for c in (c for c in COMMUNICATION_GRID if c >= floor):
            inside = [float(np.mean([h.inside(q, {q: w}, {q: c}) for h in fold]))
                      for fold in folds]  # fmt: skip
            spread = sum((x - q) ** 2 for x in inside)
            if statistics.fmean(inside) >= q and (best is None or spread < best[0] - 1e-12):
                best = (spread, c)
        communication[q] = floor if best is None else best[1]
    return communication, widening


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """How many held-out runs of a fold fell inside their bands."""

    chip: str
    """The chip."""
    family: str
    """The family left out."""
    runs: int
    """Its runs."""
    inside: dict[float, float]
    """The fraction inside at each quantile."""
    median_band: float
    """The median half-width of their bands at 0.8."""


def coverage(held: Sequence[HeldOut], widening: Mapping[float, float] = WIDENING,
             communication: Mapping[float, float] = COMMUNICATION) -> list[Coverage]:  # fmt: skip
    """Per (chip, family), the fraction of its held-out runs inside their bands at each
    quantile of ``widening``."""
    return [
        Coverage(chip=chip, family=family, runs=len(fold),
                 inside={q: float(np.mean([h.inside(q, widening, communication)
                                           for h in fold]))
                         for q in widening},
                 median_band=statistics.median(h.half_width(0.8, widening, communication)
                                               for h in fold))
        for (chip, family), fold in sorted(_folds(held).items())
    ]  # fmt: skip


def nested_coverage(held: Sequence[HeldOut]) -> list[Coverage]:
    """:func:`coverage` with each fold's allowance and widening fitted without it
    (:func:`fit_bands` on the other folds): the coverage a family the bands have never seen,
    fit included, gets."""
    folds = _folds(held)
    out = []
    for key in sorted(folds):
        rest = [h for k, fold in folds.items() if k != key for h in fold]
        communication, widening = (fit_bands(rest) if rest
                                   else (dict(COMMUNICATION), dict(WIDENING)))  # fmt: skip
        out += coverage(folds[key], widening, communication)
    return out
