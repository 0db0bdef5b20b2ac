"""The error band beside a predicted step time, and the line that says what it rests on
(:class:`planner.plan.schema.ErrorBand`): every report that prints a step time prints it with
these, so a device without validated runs says so wherever its numbers appear."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.plan.bands import ErrorBand, MemoryBand, plus_minus

NOT_RECORDED = "band not recorded"
"""What a plan written before error bands (schema 2-4) shows for its band: unknown."""


def band_text(band: ErrorBand | None) -> str:
    """``+/- 6 %``, ``uncalibrated``, or for a plan written before bands ``band not recorded``.

    >>> band_text(ErrorBand(fraction=0.052, runs=9, parallelism="model-parallel", closest=""))
    '+/- 6 %'
    """
    return band.text if band is not None else NOT_RECORDED


def with_band(seconds: float, band: ErrorBand | None) -> str:
    """A step time with its band beside it: ``16.900 s +/- 6 %``, ``16.900 s (uncalibrated)``.

    >>> with_band(16.9, None)
    '16.900 s (band not recorded)'
    """
    text = band_text(band)
    beside = text if band is not None and band.fraction is not None else f"({text})"
    return f"{seconds:.3f} s {beside}"


def band_cell(band: ErrorBand | None) -> str:
    """The band in a column headed ``+/-``: ``6 %``, or ``-`` without one (the line under the
    table, :func:`band_line`, says why).

    >>> band_cell(ErrorBand(fraction=0.052, runs=9, parallelism="model-parallel", closest=""))
    '6 %'
    """
    text = band_text(band)
    return text.removeprefix("+/- ") if text.startswith("+/- ") else "-"


def band_line(band: ErrorBand | None, *, rows: Sequence[str] = ()) -> str:
    """What the band rests on, in one line: ``band: 80 % of 9 model-parallel runs on ... were
    within it``, and what the prediction extrapolates; for a device without validated runs,
    ``uncalibrated:`` and why. ``rows`` names the rows of a table it belongs to, where rows
    rest on different bands.

    >>> band_line(ErrorBand(fraction=0.1, runs=8, parallelism="model-parallel",
    ...                     closest="80 % of 8 runs were within it"), rows=["any", "megatron"])
    'band (any, megatron): 80 % of 8 runs were within it'
    """
    which = f" ({', '.join(rows)})" if rows else ""
    if band is None:
        return f"{NOT_RECORDED}{which}: the plan file predates error bands"
    if band.fraction is None:
        return f"uncalibrated{which}: {band.closest}"
    extrapolated = "; ".join(e.text for e in band.extrapolated)
    return f"band{which}: {band.closest}" + (f"; extrapolates: {extrapolated}"
                                             if extrapolated else "")  # fmt: skip


def ranked_line(ranked_by: str, objective: float | None, step_s: float) -> str | None:
    """What a plan ranked by its band's slow end was ranked by: ``ranked by the step at its
    band's p95 end: 6.393 s (+36 %)``; None for the expected step.

    >>> ranked_line("p95", 6.393, 4.72)
    "ranked by the step at its band's p95 end: 6.393 s (+36 %)"
    """
    if ranked_by == "expected" or objective is None or objective <= step_s:
        return None  # no band at that quantile (an uncalibrated device): the step itself
    # rounded up as the band's half-width is printed, the band it was ranked by
    width = plus_minus(objective / step_s - 1).removeprefix("+/- ")
    return f"ranked by the step at its band's {ranked_by} end: {objective:.3f} s (+{width})"


def inside(step_s: float, reference_s: float, band: ErrorBand | None, *,
           quantile: float = 0.8) -> bool:
    """Whether ``step_s`` lies within ``band`` (at ``quantile``) of ``reference_s``: the two
    steps' order is then one the cost model cannot vouch for.

    >>> band = ErrorBand(fraction=0.05, runs=5, parallelism="model-parallel", closest="")
    >>> inside(10.3, 10.0, band), inside(9.6, 10.0, band), inside(10.6, 10.0, band)
    (True, True, False)
    """
    width = None if band is None else band.at(quantile)
    return width is not None and abs(step_s - reference_s) <= reference_s * width


def not_significant(steps: Mapping[str, tuple[float, ErrorBand | None]], *,
                    quantile: float = 0.8) -> str | None:
    """A line naming the rows whose predicted step lies inside the fastest row's band (at
    ``quantile``: 0.95 where the plans were ranked by their p95 step), whose order against it
    the cost model cannot vouch for; None when there are none (or the fastest has no band).

    >>> band = ErrorBand(fraction=0.05, runs=5, parallelism="model-parallel", closest="")
    >>> print(not_significant({"ilp": (10.0, band), "grid": (10.3, band), "x": (12.0, band)}))
    grid (10.300 s) is inside the band of ilp (10.000 s +/- 5 %): their order is not significant

    Rows of the very same step (the same plan, found twice) are said apart, having no order:

    >>> print(not_significant({"ilp": (10.0, band), "grid": (10.0, band)}))
    grid finds the same step as ilp (10.000 s)
    >>> print(not_significant({"ilp": (10.0, band), "grid": (10.0, band), "x": (10.3, band)}))
    grid finds the same step as ilp (10.000 s); x (10.300 s) is inside its band (+/- 5 %): \
their order is not significant
    """
    name, (fastest, band) = min(steps.items(), key=lambda item: item[1][0])
    same = [other for other, (s, _) in steps.items() if other != name and s == fastest]
    said = ([f"{', '.join(same)} find{'s' * (len(same) == 1)} the same step as {name} "
             f"({fastest:.3f} s)"] if same else [])  # fmt: skip
    width = None if band is None else band.at(quantile)
    if band is None or width is None:
        return "; ".join(said) or None
    within = [f"{other} ({s:.3f} s)" for other, (s, _) in steps.items()
              if s != fastest and inside(s, fastest, band, quantile=quantile)]  # fmt: skip
    if within:
        verb = "is" if len(within) == 1 else "are"
        text = band.text if quantile == 0.8 else f"{plus_minus(width)} at p{100 * quantile:.0f}"
        whose = (f"its band ({text})" if same else
                 f"the band of {name} ({fastest:.3f} s {text})")  # fmt: skip
        said.append(f"{', '.join(within)} {verb} inside {whose}: their order is not "
                    f"significant")  # fmt: skip
    return "; ".join(said) or None


def memory_line(band: MemoryBand | None) -> str | None:
    """What the peak memory's band rests on, in one line; None for a plan written before
    memory bands.

    >>> memory_line(MemoryBand(fraction=0.002, runs=4, closest="80 % of 4 peaks were within it"))
    'peak memory +/- 1 %: 80 % of 4 peaks were within it'
    """
    if band is None:
        return None
    if band.fraction is None:
        return f"peak memory unmeasured: {band.closest}; the margin is the stack's"
    return f"peak memory {band.text}: {band.closest}"
