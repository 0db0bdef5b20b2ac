"""Fitting a chip's efficiencies to published runs: least squares on log step time.

Only what no data sheet or micro-benchmark gives is fitted, per chip (an A100's GEMMs run the
same in a 40 GB and an 80 GB part): the GEMM efficiency curve, and the fused-attention curve
where the runs used fused attention at more than one sequence length. Each run is priced on
its own device's cluster with the candidate values substituted, so one fit serves every
cluster of the chip.

>>> KNOBS["gemm.max_fraction"].bounds
(0.2, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.diagnose.runs import CalibrationRun
from planner.spec import AttentionEfficiency, ClusterSpec, GemmEfficiency
from planner.uniform.estimate import estimate

# Residuals beyond this (in log step time, ~5 %) count linearly, not squared: one run with a
# cause the model lacks (the records flag some as anomalous) must not drag the fit.
ROBUST_SCALE = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One fitted number of a device's efficiency block."""

    block: str
    """``gemm`` or ``attention``: the block of ``device.efficiency`` it lives in; empty for a
    field of ``device.efficiency`` itself."""
    field: str
    """The field of that block."""
    bounds: tuple[float, float]
    """The values it may take: physical limits, not a prior."""
    log: bool
    """Searched on a log scale (a half-saturation point spanning decades)."""


KNOBS = {
    "gemm.max_fraction": Knob(block="gemm", field="max_fraction", bounds=(0.2, 1.0), log=False),
    "gemm.half_saturation_gflop": Knob(block="gemm", field="half_saturation_gflop",
                                       bounds=(0.01, 1000.0), log=True),
    "attention.max_fraction": Knob(block="attention", field="max_fraction", bounds=(0.1, 1.0),
                                   log=False),
    "attention.half_saturation_tokens": Knob(block="attention", field="half_saturation_tokens",
                                             bounds=(1.0, 65536.0), log=True),
    "attention.half_saturation_head_dim": Knob(block="attention",
                                               field="half_saturation_head_dim",
                                               bounds=(0.1, 1024.0), log=True),
    "overlap_contention": Knob(block="", field="overlap_contention", bounds=(0.0, 1.0),
                               log=False),
}  # fmt: skip


def with_values(cluster: ClusterSpec, values: Mapping[str, float]) -> ClusterSpec:
    """``cluster`` with the named knobs of its device's efficiency set to ``values`` (an
    absent attention block is created with every attention knob given)."""
    eff = cluster.device.efficiency
    gemm = {k.field: values[n] for n, k in KNOBS.items() if k.block == "gemm" and n in values}
    attn = {k.field: values[n] for n, k in KNOBS.items() if k.block == "attention" and n in values}
    update: dict[str, object] = {k.field: values[n] for n, k in KNOBS.items()
                                 if not k.block and n in values}  # fmt: skip
    if gemm:
        update["gemm"] = eff.gemm.model_copy(update=gemm | {"source": None})
    if attn:
        base = eff.attention.model_dump() if eff.attention is not None else {}
        update["attention"] = AttentionEfficiency.model_validate(base | attn | {"source": None})
    device = cluster.device.model_copy(update={"efficiency": eff.model_copy(update=update)})
    return cluster.model_copy(update={"device": device})


def kernel_attention(cluster: ClusterSpec) -> bool:
    """Whether ``cluster``'s attention curve was fitted on the kernels (``planner bench``:
    it names its kernel), which whole runs must not move: they cannot tell the attention's
    time from the rest of a step's."""
    attention = cluster.device.efficiency.attention
    return attention is not None and attention.kernel is not None


def without_fits(cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` with every block fitted on runs cleared: no attention curve (fused
    attention at the GEMM curve) unless one fitted on kernels (:func:`kernel_attention`), no
    overlap contention. A fit that cannot determine a knob from its runs must not inherit it
    from an earlier fit on other runs."""
    kept = cluster.device.efficiency.attention if kernel_attention(cluster) else None
    eff = cluster.device.efficiency.model_copy(update={"attention": kept,
                                                       "overlap_contention": 0.0})
    return cluster.model_copy(update={"device": cluster.device.model_copy(
        update={"efficiency": eff})})  # fmt: skip


def current_values(cluster: ClusterSpec, names: Sequence[str]) -> dict[str, float]:
    """The knobs' values in ``cluster`` (a missing attention block: the middle of the
    bounds, where a fit starts)."""
    eff = cluster.device.efficiency
    values = {}
    for name in names:
        knob = KNOBS[name]
        block = {"gemm": eff.gemm, "attention": eff.attention, "": eff}[knob.block]
        if block is None:
            low, high = knob.bounds
            values[name] = math.sqrt(low * high) if knob.log else (low + high) / 2
        else:
            values[name] = float(getattr(block, knob.field))
    return values


def cluster_of(run: CalibrationRun, clusters: Mapping[str, ClusterSpec]) -> ClusterSpec:
    """The cluster of ``clusters`` that ``run`` is priced on: its site's
    (:attr:`~planner.diagnose.runs.CalibrationRun.cluster_key`) where given, else its
    device's (a mapping of devices alone prices every run on its device's cluster)."""
    return clusters.get(run.cluster_key) or clusters[run.device]


def sized_for(run: CalibrationRun, cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` resized to the run's devices (:func:`sized_to`); ValueError naming the run
    for a run on a part of a node that does not divide it."""
    try:
        return sized_to(cluster, run.num_devices)
    except ValueError as exc:
        raise ValueError(f"run {run.id}: {exc}") from None


def sized_to(cluster: ClusterSpec, devices: int) -> ClusterSpec:
    """``cluster`` resized to ``devices`` in whole nodes of the cluster's own size; fewer
    devices than a node that divide it (the one-GPU H100 runs on the bundled 8-GPU H100 file)
    on one node of that many of the same devices, in the same network domains; ValueError for
    any other part of a node."""
    per_node = cluster.devices_per_node
    if devices < per_node and per_node % devices == 0:
        return ClusterSpec.model_validate(cluster.model_dump() | {
            "num_nodes": 1, "devices_per_node": devices})  # fmt: skip
    if devices % per_node:
        raise ValueError(f"{devices} devices are not a whole number of {cluster.name} nodes of "
                         f"{per_node}")  # fmt: skip
    return cluster.with_nodes(devices // per_node)


def log_errors(runs: Sequence[CalibrationRun], clusters: Mapping[str, ClusterSpec]) -> np.ndarray:
    """``log(predicted / measured)`` per run, each on the cluster of its device; every run
    must have a measured step time (:func:`~planner.diagnose.calibration.calibrate` fits only
    those)."""
    errors = []
    for r in runs:
        if r.measured_step_time_s is None:
            raise ValueError(f"run {r.id} has no measured step time to fit")
        predicted = estimate(r.model, sized_for(r, cluster_of(r, clusters)), r.config).step_time_s
        errors.append(math.log(predicted / r.measured_step_time_s))
    return np.array(errors)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """Fitted knob values and how well they explain the runs."""

    values: dict[str, float]
    """Knob name to value."""
    rms_log_error: float
    """Root mean square of the runs' log errors at the fitted values."""
    runs: int
    """Runs fitted on."""
    at_bounds: dict[str, float] = field(default_factory=dict)
    """The knobs the fit left on one of their bounds (scipy's active constraints, or equal to
    one to four digits), with that bound: the runs did not pin them, the bound did."""

    @property
    def in_sample(self) -> str | None:
        """A warning where the runs barely outnumber the knobs (at most two a knob): the fit
        then leaves them little residual, so the bands built from their errors are narrow in
        sample, not a measure of what it predicts; None otherwise.

        >>> Fit(values={"gemm.max_fraction": 0.6}, rms_log_error=0.0, runs=1).in_sample[:45]
        '1 run fitted 1 knob: the fit leaves it almost'
        """
        knobs = len(self.values)
        if self.runs > 2 * knobs:
            return None
        runs = f"{self.runs} run{'s' * (self.runs != 1)}"
        return (f"{runs} fitted {knobs} knob{'s' * (knobs != 1)}: the fit leaves "
                f"{'it' if self.runs == 1 else 'them'} almost no residual, so the error bands "
                "it writes are in sample and narrow; fit with more runs (the chip's published "
                "ones beside yours) and check it with `planner validate` on runs the fit did "
                "not see")


def fit_knobs(
    runs: Sequence[CalibrationRun], clusters: Mapping[str, ClusterSpec], names: Sequence[str]
) -> Fit:
    """The values of the knobs ``names`` that minimise a robust sum of squared log errors of
    ``runs`` (scipy's trust-region least squares with a soft-L1 loss of scale
    :data:`ROBUST_SCALE`), starting from the clusters' own values. Deterministic."""
    from scipy.optimize import least_squares  # scipy loads only when a fit runs

    # An uncalibrated file's roofline (half saturation 0) lies outside the bounds and has no
    # logarithm: the fit starts from the nearest value inside them.
    start = {n: min(max(v, KNOBS[n].bounds[0]), KNOBS[n].bounds[1])
             for n, v in current_values(next(iter(clusters.values())), names).items()}

    def to_x(values: Mapping[str, float]) -> np.ndarray:
        return np.array([math.log(values[n]) if KNOBS[n].log else values[n] for n in names])

    def from_x(x: np.ndarray) -> dict[str, float]:
        return {n: float(math.exp(v) if KNOBS[n].log else v) for n, v in zip(names, x,
                                                                              strict=True)}

    def residuals(x: np.ndarray) -> np.ndarray:
        values = from_x(x)
        return log_errors(runs, {k: with_values(c, values) for k, c in clusters.items()})

    bounds = ([math.log(KNOBS[n].bounds[0]) if KNOBS[n].log else KNOBS[n].bounds[0]
               for n in names],
              [math.log(KNOBS[n].bounds[1]) if KNOBS[n].log else KNOBS[n].bounds[1]
               for n in names])  # fmt: skip
    x0 = np.clip(to_x(start), np.array(bounds[0]) + 1e-9, np.array(bounds[1]) - 1e-9)
    result = least_squares(residuals, x0, bounds=bounds, loss="soft_l1", f_scale=ROBUST_SCALE,
                           diff_step=1e-3, xtol=1e-4, ftol=1e-6)  # fmt: skip
    values = {n: _rounded(v) for n, v in from_x(result.x).items()}
    final = residuals(to_x(values))
    # on a bound: scipy's active constraint, or the bound itself to the file's four digits
    at_bounds: dict[str, float] = {}
    for n, side in zip(names, result.active_mask, strict=True):
        low, high = KNOBS[n].bounds
        if side < 0 or values[n] == _rounded(low):
            at_bounds[n] = low
        elif side > 0 or values[n] == _rounded(high):
            at_bounds[n] = high
    return Fit(values=values, rms_log_error=float(np.sqrt(np.mean(final**2))), runs=len(runs),
               at_bounds=at_bounds)


def _rounded(value: float) -> float:
    """Four significant digits: more than the runs can tell apart, and a stable file (a value
    the optimiser left at its zero bound, give or take 1e-6, is that bound)."""
    return 0.0 if abs(value) < 1e-6 else float(f"{value:.4g}")


def gemm_of(values: Mapping[str, float], base: GemmEfficiency) -> GemmEfficiency:
    """``base`` with the fitted GEMM knobs of ``values``."""
    fields = {KNOBS[n].field: v for n, v in values.items() if KNOBS[n].block == "gemm"}
    return base.model_copy(update=fields)
