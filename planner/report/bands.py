"""The error band beside a predicted step time, and the line that says what it rests on
(:class:`planner.plan.schema.ErrorBand`): every report that prints a step time prints it with
these, so a device without validated runs says so wherever its numbers appear."""

from __future__ import annotations

from collections.abc import Sequence

from planner.plan.schema import ErrorBand

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
    within it``; for a device without validated runs, ``uncalibrated:`` and why. ``rows``
    names the rows of a table it belongs to, where rows rest on different bands.

    >>> band_line(ErrorBand(fraction=0.1, runs=8, parallelism="model-parallel",
    ...                     closest="80 % of 8 runs were within it"), rows=["any", "megatron"])
    'band (any, megatron): 80 % of 8 runs were within it'
    """
    which = f" ({', '.join(rows)})" if rows else ""
    if band is None:
        return f"{NOT_RECORDED}{which}: the plan file predates error bands"
    if band.fraction is None:
        return f"uncalibrated{which}: {band.closest}"
    return f"band{which}: {band.closest}"
