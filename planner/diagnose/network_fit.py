"""Fitting one network level's efficiency and latency to nccl-tests or hccl_test
measurements.

The fitted quantities are the level's ``efficiency.bandwidth_fraction`` and ``latency_us``,
and the model they are fitted through is the cost model's own
:func:`planner.cost.collective_time_s`: the fit never restates a collective's formula, so
what it stores is exactly what the planner will price with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.cost import CommGroup, collective_time_s
from planner.diagnose.evidence import cluster_json
from planner.diagnose.hccl_tests import is_hccl_tests_output, read_hccl_tests
from planner.diagnose.nccl_tests import (
    NcclRun,
    bus_factor,
    is_nccl_tests_output,
    read_nccl_tests,
)
from planner.errors import InputError
from planner.spec import ClusterSpec, NetworkLevel
from planner.spec.reading import load_cluster, read_json, read_text
from planner.vocabulary import CollectiveKind

LATENCY_SHARE = 0.05
"""The latency is fitted only when, at the fit, it is at least this share of the smallest
message's measured time: below it the sizes say nothing about it (large messages only)."""
DISAGREEMENT = 0.10
"""Runs whose fractions, each fitted alone, differ by more than this share are warned of: a
level has one ``bandwidth_fraction`` for every collective, so their joint fit prices some of
them off by about that much."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkFitRow:
    """One message size: measured against predicted before and after the fit."""

    path: str
    """The test output file of the row."""
    kind: CollectiveKind
    """The collective."""
    ranks: int
    """Ranks of the run."""
    size_bytes: int
    """The table's size column."""
    measured_s: float
    """Measured seconds (out of place)."""
    before_s: float
    """Predicted seconds with the cluster file as it was."""
    after_s: float
    """Predicted seconds with the fitted level."""
    busbw_gb_s: float
    """The table's bus bandwidth, GB/s."""
    busbw_after_gb_s: float
    """Bus bandwidth the fitted prediction implies, GB/s, by nccl-tests' definition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkFitRun:
    """One run (one file) against the joint fit, and what it fits alone."""

    path: str
    """The test output file."""
    kind: CollectiveKind
    """The collective."""
    ranks: int
    """Ranks of the run."""
    error: float
    """Fitted over measured time at the run's largest size, less 1: above 0, the fit prices
    the collective slower than its table."""
    bandwidth_fraction_alone: float | None
    """The fraction this run alone fits, as :func:`fit_network` on its file alone would (None:
    its time does not depend on the level)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkFit:
    """The fit of one network level to collective test runs."""

    cluster: str
    """The cluster file."""
    tools: tuple[str, ...]
    """The tools whose output was read (``nccl-tests``, ``hccl_test``), first file first."""
    level: int
    """Index of the fitted level in the cluster's ``network`` (0: innermost)."""
    level_name: str
    """Its name."""
    bandwidth_fraction_before: float
    """``efficiency.bandwidth_fraction`` as the file had it."""
    bandwidth_fraction: float
    """Fitted ``efficiency.bandwidth_fraction``."""
    latency_us_before: float
    """``latency_us`` as the file had it."""
    latency_us: float
    """Fitted ``latency_us`` (the old one when ``latency_fitted`` is false)."""
    latency_fitted: bool
    """False when the messages were too large to see the latency, which is then kept."""
    rows: tuple[NetworkFitRow, ...]
    """Every size of every run."""
    runs: tuple[NetworkFitRun, ...]
    """Every run's error at the fit and its fraction alone, first file first."""
    notes: tuple[str, ...]
    """Lines said after the table: with several runs, each one's error and fraction alone,
    and a warning when those fractions differ by more than :data:`DISAGREEMENT`."""
    source: str
    """What the level's ``efficiency.source`` says after a write."""
    updated_json: str
    """The cluster file with the fit written in, the rest unchanged (key order kept)."""


def _level_of(cluster: ClusterSpec, run: NcclRun) -> int:
    """The innermost level whose domain holds the run: its ranks on one node, or the whole
    nodes it spans (its hosts, or the nodes given for hccl_test)."""
    devices = run.ranks if run.nodes <= 1 else run.nodes * cluster.devices_per_node
    for i, level in enumerate(cluster.network):
        if level.domain_devices >= devices or i == len(cluster.network) - 1:
            return i
    raise AssertionError("the outermost level holds every device")


def _group(cluster: ClusterSpec, run: NcclRun) -> tuple[ClusterSpec, CommGroup]:
    """The run's ranks in the cluster's rank order: one node's ranks contiguous; across
    nodes, ``ranks / nodes`` per node, spaced to fill it. The cluster grows to hold them."""
    stride = 1
    if run.nodes > 1 and run.ranks % run.nodes == 0:
        per_host = run.ranks // run.nodes
        if cluster.devices_per_node % per_host == 0:
            stride = cluster.devices_per_node // per_host
    nodes = -(-run.ranks * stride // cluster.devices_per_node)
    return cluster.with_nodes(max(cluster.num_nodes, nodes)), CommGroup(size=run.ranks,
                                                                        stride=stride)


def _with_level(cluster: ClusterSpec, index: int, fraction: float, latency_us: float
                ) -> ClusterSpec:
    level: NetworkLevel = cluster.network[index]
    new = level.model_copy(update={
        "latency_us": latency_us,
        "efficiency": level.efficiency.model_copy(update={"bandwidth_fraction": fraction})})
    network = (*cluster.network[:index], new, *cluster.network[index + 1:])
    return cluster.model_copy(update={"network": network})


def _times(cluster: ClusterSpec, index: int, runs: Sequence[NcclRun], inverse_fraction: float,
           latency_us: float) -> np.ndarray:
    """Predicted seconds of every row with the level at ``1 / inverse_fraction`` and
    ``latency_us`` (the inverse: the time is linear in it)."""
    out = []
    for run in runs:
        grown, group = _group(cluster, run)
        fitted = _with_level(grown, index, 1 / inverse_fraction, latency_us)
        out += [collective_time_s(fitted, run.kind, r.size_bytes, group) for r in run.rows]
    return np.array(out)


def _solve(cluster: ClusterSpec, index: int, runs: Sequence[NcclRun], measured: np.ndarray,
           start: tuple[float, float], *, with_latency: bool) -> tuple[float, float]:
    """Least squares of relative time error over (1 / fraction, latency): Gauss-Newton on the
    cost model, exact in one step where the model is linear (one level, a ring)."""
    x, lat = start
    for _ in range(20):
        now = _times(cluster, index, runs, x, lat)
        d_x = _times(cluster, index, runs, 2 * x, lat) - now  # per unit of x: x's step is x
        columns = [d_x / x]
        if with_latency:
            columns.append(_times(cluster, index, runs, x, lat + 1.0) - now)
        design = np.column_stack(columns) / measured[:, None]
        residual = (measured - now) / measured
        step, *_ = np.linalg.lstsq(design, residual, rcond=None)
        if not np.any(design):
            names = ", ".join(run.path for run in runs)
            raise InputError(f"{names}: the runs do not cross level {index} "
                             f"({cluster.network[index].name}); expected runs whose time "
                             f"depends on it (see --level)")
        x, lat = x + float(step[0]), lat + (float(step[1]) if with_latency else 0.0)
        if x <= 0:
            raise InputError("no positive bandwidth fits the runs; expected times that grow "
                             "with the message size")
        if np.max(np.abs(step)) < 1e-12 * max(x, abs(lat), 1.0):
            break
    return x, lat


BOUND_ELSEWHERE = ("; another level bounds these runs (NCCL's rings cross every NIC of a node "
                   "at once): the fraction is the lowest that reproduces them")
"""Said in the source when the fitted level does not bound the runs' time."""


def _slowest_that_fits(cluster: ClusterSpec, index: int, runs: Sequence[NcclRun], x: float,
                       lat: float) -> tuple[float, bool]:
    """``x`` (1 / fraction) unchanged when level ``index`` bounds the runs' time there; else,
    as when a 2-node all-reduce is bound by NVLink while the rings cross all eight NICs at
    once, where any slower level below that bound prices the same, the largest ``x`` (the
    slowest level) whose times stay within 0.1 % of the fit's: what the runs show at least,
    and True."""
    fitted = _times(cluster, index, runs, x, lat)

    def same(candidate: float) -> bool:
        return bool(np.all(_times(cluster, index, runs, candidate, lat) <= fitted * 1.001))

    if not same(x * 1.01):
        return x, False
    low, high = x, x * 1.01
    while same(high) and high < 1e6 * x:
        low, high = high, high * 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if same(middle) else (low, middle)
    return low, True


def _fit(cluster: ClusterSpec, index: int, runs: Sequence[NcclRun], start: tuple[float, float]
         ) -> tuple[float, float, bool, bool]:
    """(1 / fraction, latency_us, whether the latency was fitted, whether another level
    bounds the runs) fitted to ``runs`` from ``start``, (1 / fraction, latency_us)."""
    measured = np.array([r.time_s for run in runs for r in run.rows])
    x, lat = _solve(cluster, index, runs, measured, start, with_latency=True)
    smallest = _times(cluster, index, runs, x, lat) - _times(cluster, index, runs, x, 0.0)
    fitted = lat >= 0 and bool(np.max(smallest / measured) >= LATENCY_SHARE)
    if not fitted:
        x, lat = _solve(cluster, index, runs, measured, start, with_latency=False)
    x, bound_elsewhere = _slowest_that_fits(cluster, index, runs, x, lat)
    return x, lat, fitted, bound_elsewhere


def read_test_output(path: str | Path, *, ranks: int | None = None, nodes: int | None = None
                     ) -> NcclRun:
    """One collective test's output, nccl-tests' or hccl_test's, told apart by hccl_test's
    table header. ``ranks`` and ``nodes`` are what hccl_test does not print; an nccl-tests
    file that states other counts is refused."""
    text = read_text(Path(path))
    if is_hccl_tests_output(text):
        return read_hccl_tests(path, ranks=ranks, nodes=nodes)
    if not is_nccl_tests_output(text):
        raise InputError(f"{path}: expected nccl-tests output ('#' lines and a table of size, "
                         f"count, type, ...) or hccl_test output (a 'data_size(Bytes): | "
                         f"aveg_time(us): | ...' table)")
    run = read_nccl_tests(path)
    if ranks is not None and ranks != run.ranks:
        raise InputError(f"{path}: nccl-tests ran {run.ranks} ranks; expected --ranks to agree "
                         f"or be left out, got {ranks}")
    if nodes is not None and run.nodes and nodes != run.nodes:
        raise InputError(f"{path}: nccl-tests ran on {run.nodes} hosts; expected --nodes to "
                         f"agree or be left out, got {nodes}")
    return run if nodes is None or run.nodes else replace(run, nodes=nodes)


def fit_network(
    cluster_path: str | Path, results: Sequence[str | Path], *, level: int | None = None,
    ranks: int | None = None, nodes: int | None = None,
) -> NetworkFit:
    """Fit the network level the ``results`` exercised (or ``level``) so that
    :func:`planner.cost.collective_time_s` reproduces their out-of-place times: least squares
    of relative error over every size, large messages fixing the bandwidth fraction, small
    ones the latency. The results are nccl-tests or hccl_test outputs; ``ranks`` and
    ``nodes`` give what hccl_test does not print. The returned ``updated_json`` is the cluster
    file with the fit in."""
    cluster_path = Path(cluster_path)
    cluster = load_cluster(cluster_path)
    runs = [read_test_output(p, ranks=ranks, nodes=nodes) for p in results]
    if level is None:
        levels = {_level_of(cluster, run) for run in runs}
        if len(levels) > 1:
            raise InputError(f"the runs exercise different network levels of {cluster_path} "
                             f"({', '.join(cluster.network[i].name for i in sorted(levels))}); "
                             f"expected runs of one level, or --level")
        level = levels.pop()
    if not 0 <= level < len(cluster.network):
        raise InputError(f"{cluster_path}: has network levels 0 to {len(cluster.network) - 1}; "
                         f"expected --level among them, got {level}")
    old = cluster.network[level]
    start = (1 / old.efficiency.bandwidth_fraction, old.latency_us)
    x, lat, fitted, bound_elsewhere = _fit(cluster, level, runs, start)
    fraction, lat = round(1 / x, 4), round(lat, 2)
    if fraction > 1:
        # the level carries bandwidth_gb_s x fraction (NetworkLevel.bandwidth_bytes_s), so at
        # fraction 1 the runs need bandwidth_gb_s x fraction: not their bus bandwidth, which
        # counts other levels' bytes too (a 2-node all-to-all sends half its buffer by NIC)
        raise InputError(f"{cluster_path}: the runs are {fraction:.2f} times faster than level "
                         f"{old.name}'s bandwidth_gb_s {old.bandwidth_gb_s:g} allows; expected "
                         f"a bandwidth_gb_s of at least {old.bandwidth_gb_s * fraction:.4g}, "
                         f"what they need at bandwidth_fraction 1")
    runs_fit = tuple(_run_fit(cluster, level, run, fit=(1 / fraction, lat),
                              latency_us=old.latency_us)
                     for run in runs)  # fmt: skip
    source = _source(runs, runs_fit, fitted=fitted, bound_elsewhere=bound_elsewhere)
    before = _times(cluster, level, runs, start[0], start[1])
    after = _times(cluster, level, runs, 1 / fraction, lat)
    rows, i = [], 0
    for run in runs:
        for r in run.rows:
            busbw = r.size_bytes / after[i] / 1e9 * bus_factor(run.kind, run.ranks)
            rows.append(NetworkFitRow(
                path=run.path, kind=run.kind, ranks=run.ranks, size_bytes=r.size_bytes,
                measured_s=r.time_s, before_s=float(before[i]), after_s=float(after[i]),
                busbw_gb_s=r.busbw_gb_s, busbw_after_gb_s=float(busbw)))  # fmt: skip
            i += 1
    return NetworkFit(
        cluster=str(cluster_path), tools=tuple(dict.fromkeys(run.tool for run in runs)),
        level=level, level_name=old.name,
        bandwidth_fraction_before=old.efficiency.bandwidth_fraction,
        bandwidth_fraction=fraction, latency_us_before=old.latency_us, latency_us=lat,
        latency_fitted=fitted, rows=tuple(rows), runs=runs_fit,
        notes=_notes(runs_fit, level_name=old.name), source=source,
        updated_json=_updated(cluster_path, level, fraction, lat if fitted else None, source),
    )  # fmt: skip


def _source(runs: Sequence[NcclRun], runs_fit: Sequence[NetworkFitRun], *, fitted: bool,
            bound_elsewhere: bool) -> str:
    """What the level's ``efficiency.source`` says: the files, how, and where the runs
    disagree, their fractions alone."""
    names = ", ".join(Path(run.path).name for run in runs)
    tools = dict.fromkeys(run.tool for run in runs)
    sizes = sum(len(run.rows) for run in runs)
    alone = _disagreement(runs_fit)
    return (f"fitted by `planner calibrate-network` to {' and '.join(tools)} {names} (out "
            f"of place, {sizes} sizes, least squares on relative time"
            f"{'' if fitted else '; latency kept: messages too large to see it'}"
            f"{BOUND_ELSEWHERE if bound_elsewhere else ''}"
            f"{f'; alone they fit {alone[0]:g} to {alone[1]:g}' if alone else ''})")


def _disagreement(runs: Sequence[NetworkFitRun]) -> tuple[float, float] | None:
    """The lowest and highest fraction the runs fit alone, where they differ by more than
    :data:`DISAGREEMENT`."""
    alone = [run.bandwidth_fraction_alone for run in runs
             if run.bandwidth_fraction_alone is not None]  # fmt: skip
    if alone and max(alone) > (1 + DISAGREEMENT) * min(alone):
        return min(alone), max(alone)
    return None


def _run_fit(cluster: ClusterSpec, index: int, run: NcclRun, *, fit: tuple[float, float],
             latency_us: float) -> NetworkFitRun:
    """One run at the joint ``fit`` (1 / fraction, latency_us): its error at its largest size,
    and the fraction it fits alone, as ``fit_network`` on its file would (from the joint
    fraction, where the run's time is known to depend on the level, and the file's
    ``latency_us``)."""
    now = _times(cluster, index, [run], *fit)
    alone = None
    if np.any(_times(cluster, index, [run], 2 * fit[0], fit[1]) != now):
        alone = round(1 / _fit(cluster, index, [run], (fit[0], latency_us))[0], 4)
    return NetworkFitRun(path=run.path, kind=run.kind, ranks=run.ranks,
                         error=float(now[-1] / run.rows[-1].time_s - 1),
                         bandwidth_fraction_alone=alone)


def _notes(runs: Sequence[NetworkFitRun], *, level_name: str) -> tuple[str, ...]:
    """With several runs: what the joint fit prices each at against its table, what it fits
    alone, and a warning when those fractions disagree."""
    if len(runs) < 2:
        return ()
    lines = [f"{run.kind} x{run.ranks} ({Path(run.path).name}): priced "
             f"{abs(100 * run.error):.1f} % {'slow' if run.error > 0 else 'fast'} at its largest "
             f"size; " + (f"bandwidth_fraction alone {run.bandwidth_fraction_alone:g}"
                          if run.bandwidth_fraction_alone is not None else
                          f"level {level_name} does not time it")
             for run in runs]  # fmt: skip
    if alone := _disagreement(runs):
        lines.append(f"warning: the tables alone fit bandwidth_fraction {alone[0]:g} to "
                     f"{alone[1]:g}, but a level has one for all collectives: fit the one "
                     f"your plans spend most time in alone")
    return tuple(lines)


def _updated(path: Path, level: int, fraction: float, latency_us: float | None,
             source: str) -> str:
    """The cluster file's JSON with the level's fraction, latency (None: as it was) and source
    replaced, every other key where it was (as ``planner calibrate --write`` keeps a
    device's)."""
    data = read_json(path)
    entry = data["network"][level]
    if latency_us is not None:
        entry["latency_us"] = latency_us
    entry["efficiency"] = (entry.get("efficiency") or {}) | {
        "bandwidth_fraction": fraction, "source": source}
    return cluster_json(data)
