"""How a sweep's points are read for its pictures and its page: the Pareto front and its
axes' units, each point's label and hover text, the heatmap's cells, and round tick values
written to their step's digits. Plain functions over the rows (of matplotlib, only its tick
locator): the figures and the HTML page (:mod:`planner.report.sweep_figures`) draw from them
alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.ticker import MaxNLocator

from planner.report.sweep_table import value_text
from planner.sweep import SweepRow

COST_UNIT = "price per device-hour x device-hours"
"""The cost's unit: the sweep's ``price_per_device_hour`` (in whatever currency it was given)
times devices times hours to train."""


def time_of(row: SweepRow) -> float | None:
    """What the front trades against: time to train when the sweep has tokens, else the
    step time."""
    return row.time_to_train_s if row.time_to_train_s is not None else row.step_time_s


def resource_of(row: SweepRow) -> float | None:
    """What the time is bought with: the cost when the sweep has a price, else devices."""
    return row.cost if row.cost is not None else float(row.devices)


def pareto_front(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """The rows no other row beats on both resource (cost, else devices) and time (to train,
    else per step), cheapest first: each is the fastest for what it costs.

    >>> from planner.sweep import SweepRow
    >>> def row(i, devices, step):
    ...     return SweepRow(index=i, values=(), summary="s", devices=devices,
    ...                     step_time_s=step, tokens_per_s=None, mfu=None, peak_memory_gib=None,
    ...                     error_band=None, time_to_train_s=None, cost=None, error=None)
    >>> [r.index for r in pareto_front([row(0, 8, 2.0), row(1, 16, 1.0), row(2, 16, 3.0)])]
    [0, 1]

    Resources a millionth apart are the same (two designs whose costs differ by cents):
    only the faster is on the front.

    >>> [r.index for r in pareto_front([row(0, 16.0, 2.0), row(1, 16.000001, 1.0)])]
    [1]
    """
    solved = sorted((r for r in rows if time_of(r) is not None),
                    key=lambda r: (resource_of(r), time_of(r)))  # fmt: skip
    front: list[SweepRow] = []
    for row in solved:
        time = time_of(row) or 0.0
        if front and math.isclose(resource_of(row) or 0.0, resource_of(front[-1]) or 0.0,
                                  rel_tol=SAME_RESOURCE):  # fmt: skip
            if time < (time_of(front[-1]) or 0.0):
                front[-1] = row
        elif not front or time < (time_of(front[-1]) or 0.0):
            front.append(row)
    return front


SAME_RESOURCE = 1e-6
"""Resources this close, relatively, are the same on the front: the bundled NIC sweep's two
designs at 7,886,188.07 and 7,886,188.54 (twice the devices for half the time) cost the same,
and the slower one drew a front of its own."""


def front_labels(rows: Sequence[SweepRow]) -> tuple[str, str]:
    """The axes' names of the front: (resource, time)."""
    resource = "cost" if any(r.cost is not None for r in rows) else "devices"
    time = ("days to train" if any(r.time_to_train_s is not None for r in rows)
            else "seconds per step")  # fmt: skip
    return resource, time


def time_value(row: SweepRow) -> float:
    """Time in the front's unit: days to train, else seconds per step."""
    if row.time_to_train_s is not None:
        return row.time_to_train_s / 86400
    return row.step_time_s or 0.0


MAX_LABELLED = 12
"""Up to this many points each carry a label; past it, only the front's do."""


def point_label(row: SweepRow, axes: Sequence[str]) -> str:
    """A point's label on the Pareto picture: its index, its parallel degrees (the plan's
    first clause) and, when the sweep varies the framework, the framework.

    >>> from planner.sweep import SweepRow
    >>> r = SweepRow(index=3, values=("megatron",), summary="TP8 x PP1 x DP16, mbs 1, 1F1B",
    ...              devices=128, step_time_s=2.5, tokens_per_s=1e6, mfu=0.4,
    ...              peak_memory_gib=60.0, error_band=None, time_to_train_s=None, cost=None,
    ...              error=None)
    >>> point_label(r, ["search.framework"])
    '3: TP8 x PP1 x DP16 (megatron)'
    """
    degrees = (row.summary or "").split(", ")[0]
    framework = [str(v) for a, v in zip(axes, row.values, strict=True)
                 if a.endswith("framework")]  # fmt: skip
    return f"{row.index}: {degrees}" + "".join(f" ({f})" for f in framework)


def place_label(here: Sequence[SweepRow], axes: Sequence[str], *, full: bool) -> str:
    """The label of the points at one place: their indices, and with ``full`` their plan
    (:func:`point_label`) once when they share it.

    >>> from planner.sweep import SweepRow
    >>> def row(i, summary):
    ...     return SweepRow(index=i, values=(), summary=summary, devices=8, step_time_s=1.0,
    ...                     tokens_per_s=None, mfu=None, peak_memory_gib=None,
    ...                     error_band=None, time_to_train_s=None, cost=None, error=None)
    >>> tied = [row(11, "TP4 x PP1 x DP2048, mbs 1"), row(15, "TP4 x PP1 x DP2048, mbs 1")]
    >>> place_label(tied, [], full=True), place_label(tied, [], full=False)
    ('11, 15: TP4 x PP1 x DP2048', '11, 15')
    """
    indices = ", ".join(str(r.index) for r in here)
    if not full:
        return indices
    plans = list(dict.fromkeys(point_label(r, axes).split(": ", 1)[1] for r in here))
    return f"{indices}: {' / '.join(plans)}"


def tick_step(ticks: Sequence[float]) -> float:
    """The distance between two ticks (1 for a lone tick)."""
    return float(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0


def heatmap_cells(
    rows: Sequence[SweepRow], axes: Sequence[str], x_axis: str, y_axis: str
) -> tuple[list[object], list[object], list[list[float | None]]]:
    """(x values, y values, grid): the shortest step time over the points at each pair of
    the two axes' values (the other axes free); None where no such point has a plan."""
    xi, yi = axes.index(x_axis), axes.index(y_axis)
    xs = list(dict.fromkeys(r.values[xi] for r in rows))
    ys = list(dict.fromkeys(r.values[yi] for r in rows))
    grid: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    for r in rows:
        if r.step_time_s is None:
            continue
        i, j = ys.index(r.values[yi]), xs.index(r.values[xi])
        current = grid[i][j]
        grid[i][j] = r.step_time_s if current is None else min(current, r.step_time_s)
    return xs, ys, grid


def cell_text(seconds: float) -> str:
    """A heatmap cell's step time: three figures, whole seconds from 100 on (``%.3g`` wrote
    1,088 s as 1.09e+03).

    >>> [cell_text(s) for s in (1088.4, 41.85, 4.591, 0.0123)]
    ['1,088', '41.9', '4.59', '0.0123']
    """
    if seconds >= 100:
        return f"{seconds:,.0f}"
    return f"{seconds:.3g}"


def point_text(row: SweepRow, axes: Sequence[str]) -> str:
    """What hovering a point shows: its inputs, its plan and its numbers, or why it has none.

    >>> from planner.sweep import SweepRow
    >>> r = SweepRow(index=3, values=(16,), summary="TP8 x PP1 x DP16", devices=128,
    ...              step_time_s=2.5, tokens_per_s=1e6, mfu=0.4, peak_memory_gib=60.0,
    ...              error_band="+/- 10 %", time_to_train_s=None, cost=None, error=None)
    >>> print(point_text(r, ["cluster.num_nodes"]))
    point 3: cluster.num_nodes=16
    TP8 x PP1 x DP16
    step 2.500 s +/- 10 %, MFU 40.0 %, 60.0 GiB, 128 devices
    """
    inputs = ", ".join(f"{a}={value_text(v)}" for a, v in zip(axes, row.values, strict=True))
    lines = [f"point {row.index}: {inputs}"]
    if row.step_time_s is None:
        return "\n".join([*lines, f"no plan: {row.error}"])
    numbers = (f"step {row.step_time_s:.3f} s {row.error_band or ''}".rstrip()
               + f", MFU {100 * (row.mfu or 0):.1f} %, {row.peak_memory_gib or 0:.1f} GiB, "
               f"{row.devices} devices")  # fmt: skip
    if row.time_to_train_s is not None:
        numbers += f", {row.time_to_train_s / 86400:.1f} days to train"
    if row.cost is not None:
        numbers += f", cost {row.cost:,.0f}"
    return "\n".join([*lines, row.summary or "", numbers])


def nice_ticks(lo: float, hi: float, *, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x a power of ten apart) from at or below ``lo`` to at or
    above ``hi``, about ``count`` of them (matplotlib's :class:`~matplotlib.ticker.
    MaxNLocator`); a range of one value is widened by 10 % either side.

    >>> nice_ticks(8.09e6, 9.0e6)
    [8000000.0, 8200000.0, 8400000.0, 8600000.0, 8800000.0, 9000000.0]
    >>> nice_ticks(128.0, 128.0)
    [115.0, 120.0, 125.0, 130.0, 135.0, 140.0, 145.0]
    """
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    ticks = MaxNLocator(nbins=count, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    inner = [float(t) for t in ticks]
    while len(inner) > 2 and inner[1] <= lo:  # the locator may add a tick beyond either end
        inner.pop(0)
    while len(inner) > 2 and inner[-2] >= hi:
        inner.pop()
    return inner


def tick_text(value: float, step: float) -> str:
    """A tick's label: millions with an ``M`` (to the tick step's digits), else whole numbers
    with separators, else as many decimals as the step needs.

    >>> tick_text(8200000.0, 200000.0), tick_text(1070.0, 50.0), tick_text(2.5, 0.5)
    ('8.2M', '1,070', '2.5')

    A step of 0.25M keeps its two decimals (7.75M read "7.8M" beside 8.0M, 8.2M):

    >>> [tick_text(v, 250000.0) for v in (7750000.0, 8000000.0, 8250000.0)]
    ['7.75M', '8.00M', '8.25M']
    """
    if abs(value) >= 1e6 or step >= 1e6:
        return f"{value / 1e6:,.{decimals(step / 1e6)}f}M"
    return f"{value:,.{decimals(step)}f}"


def decimals(step: float) -> int:
    """The fewest decimals that write ``step`` exactly (0.25: 2, 50: 0), at most 6."""
    if step <= 0:
        return 0
    return next((d for d in range(7) if abs(round(step, d) - step) <= 1e-9 * step), 6)


def axis_labels(rows: Sequence[SweepRow]) -> tuple[str, str]:
    """The front's axis titles with their units: (resource, time)."""
    resource, time = front_labels(rows)
    return (f"{resource} ({COST_UNIT})" if resource == "cost" else "devices",
            "time to train (days)" if time == "days to train" else "step time (s)")
