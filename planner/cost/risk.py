"""Plans ranked with the risk in view: a step time at a quantile of its error band.

The band of a prediction (:mod:`planner.cost.uncertainty`) says how far off it may be; a plan
that rests on runs the model has been checked against has a narrow one, a plan that
extrapolates (a mechanism no run used, a sequence no run reached) a wide one. Ranked by
``p80``, a plan counts at the slow end of its 80 % band, ``step x (1 + band)``: between two
plans 2 % apart, the one the evidence vouches for wins over a faster one it does not.

>>> band = ErrorBand(fraction=0.05, fraction_p95=0.12, runs=5, parallelism="model-parallel",
...                  closest="")
>>> objective_s(10.0, band, "p80"), objective_s(10.0, band, "expected")
(10.5, 10.0)
>>> objective_s(10.0, band.model_copy(update={"fraction_p95": None}), "p95")  # not known
10.0
>>> try:
...     parse_objective("p90")
... except InputError as exc:
...     print(exc)
--objective p90: no band at that quantile; objectives are expected, p80, p95
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np

from planner.errors import InputError
from planner.plan.bands import ErrorBand
from planner.vocabulary import OBJECTIVES, Objective

T = TypeVar("T", float, np.ndarray)

QUANTILE: dict[Objective, float | None] = {"expected": None, "p80": 0.8, "p95": 0.95}
"""The band quantile each objective reads (None: the prediction itself)."""


def parse_objective(text: str) -> Objective:
    """An objective named on the command line or in options; one line naming the known ones
    otherwise, or saying that a quantile is outside (0, 1)."""
    if text in OBJECTIVES:
        return text  # type: ignore[return-value]
    known = ", ".join(OBJECTIVES)
    digits = text.removeprefix("p")
    try:
        quantile = float(digits) / (100 if text.startswith("p") else 1)
    except ValueError:
        raise InputError(f"--objective {text}: unknown; objectives are {known}") from None
    if not 0 < quantile < 1:
        raise InputError(f"--objective {text}: the quantile {quantile:g} is outside (0, 1); "
                         f"objectives are {known}")  # fmt: skip
    raise InputError(f"--objective {text}: no band at that quantile; objectives are {known}")


def objective_s(step_s: float, band: ErrorBand | None, objective: Objective) -> float:
    """The step time ``objective`` ranks by: ``step_s`` at the slow end of its ``band``; the
    step itself where the band is not known at that quantile (a device without validated
    runs ranks by the prediction)."""
    quantile = QUANTILE[objective]
    fraction = None if quantile is None or band is None else band.at(quantile)
    return step_s if fraction is None else _slow_end(step_s, fraction)


def objective_column(columns: Mapping[str, np.ndarray], objective: Objective) -> np.ndarray:
    """:func:`objective_s` over a batch's columns (:func:`planner.uniform.batch.estimate_batch`):
    NaN bands (no band known) rank by the step."""
    step = columns["step_time_s"]
    quantile = QUANTILE[objective]
    if quantile is None:
        return step
    column = {0.8: "error_band.fraction", 0.95: "error_band.fraction_p95"}[quantile]
    return _slow_end(step, np.nan_to_num(columns[column], nan=0.0))


def _slow_end(step_s: T, fraction: T) -> T:
    """The slow end of a band of half-width ``fraction`` around ``step_s`` (floats or
    arrays)."""
    return step_s * (1 + fraction)  # type: ignore[operator, return-value]
