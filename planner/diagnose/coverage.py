"""Whether the error bands hold what they claim: leave one framework family out of a chip's
validated runs, band each of its runs from the rest (:func:`planner.cost.uncertainty.nearest`),
and count how many fall inside. The widening of the bands with distance
(:data:`~planner.cost.uncertainty.WIDENING`) is fitted here (:func:`fit_widening`) and checked
here (:func:`coverage`), by ``benchmarks/band_coverage.py``.

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

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.cost.uncertainty import WIDENING, Nearest, nearest
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
    nearest: Nearest
    """The runs of the other families nearest it."""

    def inside(self, quantile: float, widening: Mapping[float, float] = WIDENING) -> bool:
        """Whether its error is inside its band at ``quantile``."""
        return abs(self.error) <= self.nearest.half_width(quantile, widening)


def held_out(chip: str, runs: Sequence[ValidatedRun], families: Sequence[str] | None = None,
             ) -> list[HeldOut]:  # fmt: skip
    """Every run of ``families`` (default: every family of ``runs``, one chip's runs) banded
    from the runs of the other families; none for a chip with one family."""
    out = []
    for family in sorted(families or {r.family for r in runs}):
        others = [r for r in runs if r.family != family]
        if others:
            out += [HeldOut(id=r.id, chip=chip, family=family, error=r.error,
                            nearest=nearest(r, others))
                    for r in runs if r.family == family]  # fmt: skip
    return out


def held_out_runs(chip: str, runs: Sequence[ValidatedRun]) -> list[HeldOut]:
    """Every run of ``runs`` (one chip's) banded from all the others, its own family's
    included: the bands of predictions near the evidence, as a user pricing a configuration
    of a validated family gets them."""
    return [HeldOut(id=r.id, chip=chip, family=r.family, error=r.error,
                    nearest=nearest(r, [o for o in runs if o.id != r.id]))
            for r in runs if len(runs) > 1]  # fmt: skip


def _folds(held: Sequence[HeldOut]) -> dict[tuple[str, str], list[HeldOut]]:
    """The held-out runs by (chip, family): each fold left out together."""
    folds: dict[tuple[str, str], list[HeldOut]] = {}
    for h in held:
        folds.setdefault((h.chip, h.family), []).append(h)
    return folds


def fit_widening(held: Sequence[HeldOut], quantile: float) -> float:
    """The least widening per unit of distance at which the folds' mean coverage at
    ``quantile`` reaches it: each (chip, family) counts once, however many runs it has (one
    software stack's 78 runs are one piece of evidence about another stack, not 78)."""
    folds = list(_folds(held).values())
    needed = [np.array([max(0.0, (abs(h.error) - h.nearest.spread[quantile])
                            / max(h.nearest.mean_distance, 1e-9)) for h in fold])
              for fold in folds]  # fmt: skip
    candidates = np.unique(np.concatenate([[0.0], *needed]))
    for slope in candidates:
        if statistics.fmean(float((n <= slope).mean()) for n in needed) >= quantile:
            return round(float(slope), 4)
    return round(float(candidates[-1]), 4)


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
             ) -> list[Coverage]:  # fmt: skip
    """Per (chip, family), the fraction of its held-out runs inside their bands at each
    quantile of ``widening``."""
    return [
        Coverage(chip=chip, family=family, runs=len(fold),
                 inside={q: float(np.mean([h.inside(q, widening) for h in fold]))
                         for q in widening},
                 median_band=statistics.median(h.nearest.half_width(0.8, widening)
                                               for h in fold))
        for (chip, family), fold in sorted(_folds(held).items())
    ]  # fmt: skip


def nested_coverage(held: Sequence[HeldOut]) -> list[Coverage]:
    """:func:`coverage` with each fold's widening fitted without it (:func:`fit_widening` on
    the other folds): the coverage a family the bands have never seen, fit included, gets."""
    folds = _folds(held)
    out = []
    for key in sorted(folds):
        rest = [h for k, fold in folds.items() if k != key for h in fold]
        widening = {q: fit_widening(rest, q) for q in WIDENING} if rest else dict(WIDENING)
        out += coverage(folds[key], widening)
    return out
