"""Consecutive layers into ``p`` pipeline stages on equal submeshes, vectorised.

Alpa's inter-operator dynamic program (Zheng et al., OSDI'22, Sec. 5.2) with the submesh
dimension dropped: every stage runs on the same submesh (as the frameworks launch them), so
only the cut points are chosen. For a bound ``t_max`` on any stage's latency, ``S(t_max)`` is
the least ``sum_i t_i`` with every ``t_i <= t_max``; the step for ``B`` microbatches is the
pipeline step of :func:`planner.cost.pipeline.fill_and_drain`, ``sum_i t_i + (B - 1) max_i
t_i`` (Alpa, Eq. 2), so the bounds are scanned upward from the smallest feasible one until
the step of ``S(inf)`` with ``t_max`` as its maximum alone reaches the best step (Alpa's early
stop). As only the first bound of each plateau of ``S`` can win, the scan bisects from one
plateau to the next.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from planner.cost.pipeline import fill_and_drain, pipeline_time
from planner.errors import InfeasibleError, InputError


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """The cut points that minimise the step latency, and what they cost."""

    bounds: tuple[int, ...]
    """``0 = c_0 < ... < c_p = L``; stage ``i`` holds layers ``c_i .. c_{i+1} - 1``."""
    latencies_s: tuple[float, ...]
    """Per-microbatch latency of each stage, first stage first."""
    step_s: float
    """The pipeline step of ``latencies_s`` (:func:`planner.cost.pipeline.pipeline_time`),
    ``sum(latencies_s) + (B - 1) * max(latencies_s)``."""
    bounds_tried: int
    """Bounds ``t_max`` the dynamic program ran for, ``inf`` and the binary searches included."""


def split_layers(
    latency: np.ndarray, num_microbatches: int, *, max_bounds: int | None = None
) -> Split:
    """The cut of ``L`` layers into ``p`` stages with the least step latency
    ``sum_i t_i + (B - 1) max_i t_i`` (:func:`planner.cost.pipeline.fill_and_drain`).

    ``latency[i, a, b]`` is stage ``i``'s per-microbatch latency holding layers ``a .. b - 1``,
    shape ``(p, L + 1, L + 1)``, ``np.inf`` where ``a >= b`` or the stage does not fit in memory.
    Every stage holds at least one layer. With ``max_bounds``, the upward scan evaluates at most
    that many bounds, spread evenly over those that could still win; the result is then not
    guaranteed optimal. ``None`` finds the optimum.

    Raises :class:`~planner.errors.InfeasibleError` when no cut fits in memory and
    :class:`~planner.errors.InputError` on a malformed ``latency`` or argument.

    Four layers of 1 s each, two stages, 4 microbatches: two layers a stage, 4 + 3 x 2 = 10 s.
    An embedding worth 2 s on the first stage moves a layer to the second (6 + 3 x 3 = 15 s
    rather than 6 + 3 x 4):

    >>> a, b = np.indices((5, 5))
    >>> per_stage = np.where(a < b, b - a, np.inf)
    >>> split = split_layers(np.stack([per_stage, per_stage]), 4)
    >>> split.bounds, split.latencies_s, split.step_s
    ((0, 2, 4), (2.0, 2.0), 10.0)
    >>> split = split_layers(np.stack([per_stage + 2, per_stage]), 4)
    >>> split.bounds, split.latencies_s, split.step_s
    ((0, 1, 4), (3.0, 3.0), 15.0)
    """
    costs = _checked(latency, num_microbatches, max_bounds)
    band = _band(costs)
    s_min, unbounded = _least_sum(band, np.inf)
    if unbounded is None:
        never = [i for i in range(band.shape[0]) if not np.isfinite(band[i]).any()]
        raise InfeasibleError(
            f"no cut of {costs.shape[1] - 1} layers into {costs.shape[0]} stages fits in memory"
            + (f"; stages {never} fit no layer range they could hold" if never else "")
        )
    if num_microbatches == 1:
        # One microbatch: the step is the sum alone, least with no bound at all.
        return dataclasses.replace(_split(costs, unbounded, num_microbatches), bounds_tried=1)

    candidates = np.unique(band[np.isfinite(band)])
    floor_s = lower_bounds_s(s_min, candidates, num_microbatches=num_microbatches)
    k, total, cuts, tried = _first_below(band, candidates, low=-1, high=len(candidates) - 1)
    best = _split(costs, cuts, num_microbatches)
    if max_bounds is not None:
        last = _last_below(floor_s, best.step_s)
        spread = np.unique(np.linspace(k, max(k, last), max_bounds).round().astype(np.intp))
        for j in spread[spread > k]:
            if floor_s[j] >= best.step_s:
                continue
            _, cuts = _least_sum(band, float(candidates[j]))
            tried += 1
            best = min(best, _split(costs, cuts, num_microbatches), key=lambda s: s.step_s)
        return dataclasses.replace(best, bounds_tried=1 + tried)
    # Only the first bound of each plateau of S can win: a later bound in it finds the same sum
    # with a max of at least the plateau's first bound, or S would have reached that sum below
    # it. S(inf) is the last plateau; the limit is Alpa's early stop.
    while total > s_min:
        limit = _last_below(floor_s, best.step_s)
        if limit <= k:
            break
        at_limit = _least_sum(band, float(candidates[limit]))
        tried += 1
        if at_limit[0] == total:
            break  # no new plateau below the limit
        k, total, cuts, more = _first_below(band, candidates, low=k, high=limit, bound_s=total,
                                            at_high=at_limit)  # fmt: skip
        tried += more
        best = min(best, _split(costs, cuts, num_microbatches), key=lambda s: s.step_s)
    return dataclasses.replace(best, bounds_tried=1 + tried)


def lower_bounds_s(
    s_min: float, candidates: np.ndarray, *, num_microbatches: int
) -> np.ndarray:
    """Alpa's early stop, vectorised: for each bound ``candidates[j]``, the least step a cut
    first found at that bound can have, the pipeline step (:func:`fill_and_drain`) of the least
    sum ``s_min = S(inf)`` with the bound as its maximum. Such a cut's maximum is the bound
    (or ``S`` would have reached its sum at a lower one) and its sum at least ``s_min``, and
    the step grows with the sum (in floating point too), so no bound whose floor reaches the
    best step can win. The floors rise with the bound, but only up to rounding: callers look
    for the last one below a step (:func:`_last_below`), not by bisection.

    >>> lower_bounds_s(6.0, np.array([2.0, 3.0]), num_microbatches=4)
    array([12., 15.])
    """
    return fill_and_drain(sum_s=s_min, max_s=candidates, num_microbatches=num_microbatches)[0]


def _last_below(floor_s: np.ndarray, step_s: float) -> int:
    """The last bound whose floor is below ``step_s`` (-1: none); for floors in ascending
    order, ``searchsorted(floor_s, step_s) - 1``.

    >>> _last_below(np.array([1.0, 2.0, 4.0]), 3.0), _last_below(np.array([1.0, 3.0, 2.0]), 2.5)
    (1, 2)
    """
    below = np.flatnonzero(floor_s < step_s)
    return int(below[-1]) if len(below) else -1


def _split(costs: np.ndarray, cuts: tuple[int, ...], num_microbatches: int) -> Split:
    """The split at ``cuts`` with its stages' own latencies, not the bound they were found at."""
    latencies = tuple(float(costs[i, a, b]) for i, (a, b) in enumerate(itertools.pairwise(cuts)))
    step = pipeline_time(latencies, num_microbatches=num_microbatches)
    return Split(bounds=cuts, latencies_s=latencies, step_s=step.total_s, bounds_tried=0)


def _checked(latency: np.ndarray, num_microbatches: int, max_bounds: int | None) -> np.ndarray:
    """``latency`` as floats, once its shape, values and the arguments make sense."""
    costs = np.asarray(latency, dtype=float)
    if costs.ndim != 3 or costs.shape[1] != costs.shape[2] or costs.shape[1] < 2:
        raise InputError(f"latency must have shape (p, L + 1, L + 1), L >= 1; got {costs.shape}")
    num_stages, num_layers = costs.shape[0], costs.shape[1] - 1
    if not 1 <= num_stages <= num_layers:
        raise InputError(f"{num_stages} stages of at least one layer each need 1 <= p <= L, "
                         f"but there are {num_layers} layers")  # fmt: skip
    if num_microbatches < 1:
        raise InputError(f"num_microbatches must be at least 1, got {num_microbatches}")
    if max_bounds is not None and max_bounds < 1:
        raise InputError(f"max_bounds must be at least 1 (or None for exact), got {max_bounds}")
    bad = np.isnan(costs) | (costs < 0)
    if bad.any():
        where = tuple(int(x) for x in np.argwhere(bad)[0])
        raise InputError(f"latency must be >= 0 or inf, got {costs[where]} at [i, a, b]={where}")
    return costs


def _band(costs: np.ndarray) -> np.ndarray:
    """``band[i, r, c] = costs[i, i + r, i + 1 + c]`` (``inf`` unless ``r <= c``) for ``r, c <=
    L - p``: the ranges stage ``i`` can hold with a layer left for every other stage. The
    dynamic program then runs on ``(L - p + 1)^2`` entries a stage; ``c`` is the next ``r``."""
    num_stages, width = costs.shape[0], costs.shape[1] - costs.shape[0]
    stage = np.arange(num_stages)[:, None, None]
    r, c = np.arange(width)[None, :, None], np.arange(width)[None, None, :]
    return np.where(r <= c, costs[stage, stage + r, stage + 1 + c], np.inf)


def least_peak(memory: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
    """The cut of ``L`` layers into ``p`` stages whose fullest stage holds the least:
    ``min`` over cuts of ``max_i memory[i, c_i, c_{i+1}]``, and its cut points; None when every
    cut has a stage with nothing that runs (``inf``). The memory a plan in the space needs at
    the least, for telling a user by how much nothing fits.

    Two stages over three layers of 1, 1 and 4 bytes: the 4-byte layer goes alone.

    >>> sizes = np.array([1.0, 1.0, 4.0])
    >>> a, b = np.indices((4, 4))
    >>> prefix = np.concatenate([[0.0], np.cumsum(sizes)])
    >>> held = np.where(a < b, prefix[b] - prefix[a], np.inf)
    >>> least_peak(np.stack([held, held]))
    (4.0, (0, 2, 3))
    """
    costs = np.asarray(memory, dtype=float)
    found = _best_cut(_band(costs), np.maximum)
    return None if found[1] is None else found  # type: ignore[return-value]


def _least_sum(band: np.ndarray, t_max: float) -> tuple[float, tuple[int, ...] | None]:
    """``S(t_max)`` and its cut points, or ``(inf, None)`` if no cut keeps every stage within."""
    return _best_cut(np.where(band <= t_max, band, np.inf), np.add)


def _best_cut(band: np.ndarray, combine: np.ufunc) -> tuple[float, tuple[int, ...] | None]:
    """The cut whose stages' costs, folded with ``combine`` (``add``: their sum; ``maximum``:
    the largest), are least, or ``(inf, None)`` if every cut has an infinite stage.
    ``rest[r]``, Alpa's ``F``: the best fold of the stages after the current one, the next
    starting at row ``r``; built from the last stage back."""
    num_stages, width, _ = band.shape
    rest = np.full(width, np.inf)
    rest[-1] = 0.0  # past the last stage: all L layers placed
    choice = np.empty((num_stages, width), dtype=np.intp)
    rows = np.arange(width)
    for i in range(num_stages - 1, -1, -1):
        total = combine(band[i], rest[None, :])
        choice[i] = total.argmin(axis=1)
        rest = total[rows, choice[i]]
    if not np.isfinite(rest[0]):
        return float("inf"), None
    cuts, r = [0], 0
    for i in range(num_stages):
        r = int(choice[i, r])
        cuts.append(i + 1 + r)
    return float(rest[0]), tuple(cuts)


Found = tuple[int, float, tuple[int, ...], int]  # index, its S and cuts, bounds run


def _first_below(
    band: np.ndarray, candidates: np.ndarray, *, low: int, high: int,
    bound_s: float = np.inf, at_high: tuple[float, tuple[int, ...] | None] | None = None,
) -> Found:  # fmt: skip
    """The first index in ``(low, high]`` whose ``S`` is below ``bound_s``, by bisection: ``S``
    never rises with the bound, and is below ``bound_s`` at ``high`` (for ``bound_s = inf``:
    the largest candidate is feasible whenever ``S(inf)`` is, since no stage exceeds it)."""
    tried = 0
    while high - low > 1:
        middle = (low + high) // 2
        total, cuts = _least_sum(band, float(candidates[middle]))
        tried += 1
        if total < bound_s:
            high, at_high = middle, (total, cuts)
        else:
            low = middle
    if at_high is None:  # `high` never bisected, so never run
        at_high = _least_sum(band, float(candidates[high]))
        tried += 1
    total, cuts = at_high
    assert cuts is not None  # S below bound_s, so finite
    return high, total, cuts, tried
