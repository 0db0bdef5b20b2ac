"""Published training runs as test cases, and fitting a device's GEMM efficiency to them.

A record of ``calibration_runs.json`` gives a model, a cluster size, a parallel configuration
and a measured throughput. :func:`run_from_record` turns it into inputs for
:func:`~planner.uniform.estimate.estimate` and a measured step time; :func:`fit_gemm_efficiency`
chooses the two parameters of :class:`~planner.spec.GemmEfficiency` that minimise the squared
log error of the predicted step times of a device's runs. Everything else in the cluster file
(bandwidths, network efficiencies, HBM efficiency) comes from data sheets and published
micro-benchmarks and is not fitted.

Fields a record leaves open are filled by the rules in :func:`config_from_record`, which depend
only on what the record's source says about the software, never on the measured number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.diagnose.runs import DEVICES, CalibrationRun, load_runs
from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.spec import ClusterSpec, GemmEfficiency
from planner.spec.reading import load_cluster, read_json
from planner.uniform.estimate import estimate


def with_gemm_efficiency(cluster: ClusterSpec, gemm: GemmEfficiency) -> ClusterSpec:
    """``cluster`` with its device's GEMM efficiency replaced."""
    eff = cluster.device.efficiency.model_copy(update={"gemm": gemm})
    device = cluster.device.model_copy(update={"efficiency": eff})
    return cluster.model_copy(update={"device": device})


def _sized_for(run: CalibrationRun, cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` resized to the run's devices, in whole nodes of the cluster's own size;
    a run on a part of a node raises :class:`~planner.errors.InputError` naming it."""
    per_node = cluster.devices_per_node
    if run.num_devices % per_node:
        raise InputError(f"run {run.id}: {run.num_devices} devices are not a whole number of "
                         f"{cluster.name} nodes of {per_node}")  # fmt: skip
    return cluster.with_nodes(run.num_devices // per_node)


def predict_s(run: CalibrationRun, cluster: ClusterSpec) -> float:
    """The estimated step time of ``run`` on ``cluster`` resized to the run's devices."""
    return estimate(run.model, _sized_for(run, cluster), run.config).step_time_s


def log_errors(runs: Sequence[CalibrationRun], cluster: ClusterSpec) -> list[float]:
    """``log(predicted / measured)`` per run."""
    return [math.log(predict_s(r, cluster) / r.measured_step_time_s) for r in runs]


def _golden_min(f: Callable[[float], float], lo: float, hi: float, steps: int = 40) -> float:
    """Minimiser of a unimodal ``f`` on ``[lo, hi]`` by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_gemm_efficiency(
    runs: Sequence[CalibrationRun], cluster: ClusterSpec
) -> tuple[GemmEfficiency, float]:
    """The (max_fraction, half_saturation_gflop) minimising the mean squared log error of the
    runs' step times, and that error. A 1-D golden search on ``max_fraction`` nested in one on
    ``log10(half_saturation_gflop)``; deterministic."""

    def loss(gemm: GemmEfficiency) -> float:
        errors = log_errors(runs, with_gemm_efficiency(cluster, gemm))
        return sum(e * e for e in errors) / len(errors)

    def best_fraction(log_half: float) -> tuple[float, float]:
        half = 10**log_half

        def f(x: float) -> float:
            return loss(GemmEfficiency(max_fraction=x, half_saturation_gflop=half))

        x = _golden_min(f, 0.2, 1.0, steps=25)
        return x, f(x)

    log_half = _golden_min(lambda lh: best_fraction(lh)[1], -2.0, 3.0, steps=20)
    fraction, error = best_fraction(log_half)
    gemm = GemmEfficiency(
        max_fraction=round(fraction, 4), half_saturation_gflop=round(10**log_half, 3)
    )
    return gemm, error


# Which bundled cluster file ran each device's records.
BUNDLED_CLUSTERS = {key: device.cluster_file for key, device in DEVICES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """A published run against its estimate."""

    id: str
    """The record's id."""
    device: str
    """``A100`` or ``H100``."""
    num_devices: int
    """Devices (GPUs) of the run."""
    config: str
    """The configuration as a user would say it (:func:`describe`)."""
    measured_s: float
    """The measured step time."""
    predicted_s: float
    """The estimated step time."""
    basis: str
    """How the measured step time was obtained from the record."""
    peak_memory_gib: float
    """The estimated peak memory per device."""
    fits: bool
    """Whether the estimate fits the device's memory."""

    @property
    def error(self) -> float:
        """``predicted / measured - 1``."""
        return self.predicted_s / self.measured_s - 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with the error."""
        from dataclasses import asdict

        return asdict(self) | {"error": self.error}


def describe(config: ParallelConfig) -> str:
    """A configuration as a user would say it: ``TP8 PP16 DP8 mbs1 full-recompute``."""
    parts = [f"TP{config.tp}", f"PP{config.pp}", f"DP{config.dp}"]
    parts += [f"{k.upper()}{v}" for k, v in (("cp", config.cp), ("ep", config.ep),
                                              ("vpp", config.vpp)) if v > 1]  # fmt: skip
    parts += ["SP"] * config.sp + [f"mbs{config.mbs}"]
    parts += [f"{config.recompute}-recompute"] * (config.recompute != "none")
    return " ".join(parts + ([f"ZeRO-{config.zero}"] if config.zero else []))


def validation_rows(runs: Sequence[CalibrationRun], clusters: dict[str, ClusterSpec]) -> list[
    ValidationRow
]:  # fmt: skip
    """Estimate every run on the cluster of its GPU."""
    rows = []
    for run in runs:
        est = estimate(run.model, _sized_for(run, clusters[run.device]), run.config)
        rows.append(ValidationRow(
            id=run.id, device=run.device, num_devices=run.num_devices,
            config=describe(run.config), measured_s=run.measured_step_time_s,
            predicted_s=est.step_time_s, basis=run.basis,
            peak_memory_gib=est.peak_memory_gib, fits=est.fits,
        ))  # fmt: skip
    return rows


def validate(runs_path: str | Path, clusters_dir: str | Path) -> list[ValidationRow]:
    """Every run of ``runs_path`` against the bundled cluster of its GPU."""
    clusters = {gpu: load_cluster(Path(clusters_dir) / f) for gpu, f in BUNDLED_CLUSTERS.items()}
    return validation_rows(load_runs(runs_path), clusters)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    """The fitted GEMM efficiency and the runs it was fitted on, before and after."""

    gemm: GemmEfficiency
    """The fitted efficiency curve, with its source."""
    before: list[ValidationRow]
    """The runs estimated with the cluster file's efficiency."""
    after: list[ValidationRow]
    """The runs estimated with the fitted efficiency."""


def calibrate_file(
    runs_path: str | Path, cluster_path: str | Path, *, gpu: str, write: bool
) -> CalibrationFit:
    """Fit ``cluster_path``'s GEMM efficiency to the ``gpu`` runs; optionally write it back
    (only the ``device.efficiency.gemm`` block of the file changes)."""
    runs = [r for r in load_runs(runs_path) if r.device == gpu]
    if not runs:
        raise InputError(f"{runs_path}: no complete runs on {gpu!r}; have A100 and H100")
    cluster = load_cluster(cluster_path)
    gemm, error = fit_gemm_efficiency(runs, cluster)
    gemm = gemm.model_copy(update={"source": (
        f"fitted by `planner calibrate --gpu {gpu}` on the {len(runs)} {gpu} runs of "
        f"calibration_runs.json (least squares on log step time; RMS log error {error**0.5:.3f})"
    )})  # fmt: skip
    fitted = with_gemm_efficiency(cluster, gemm)
    fit = CalibrationFit(gemm=gemm, before=validation_rows(runs, {gpu: cluster}),
                         after=validation_rows(runs, {gpu: fitted}))  # fmt: skip
    if write:
        _write_gemm(Path(cluster_path), gemm)
    return fit


def _write_gemm(path: Path, gemm: GemmEfficiency) -> None:
    """Replace the ``device.efficiency.gemm`` block of the cluster file at ``path``, keeping
    the rest of the file as it is (an absent ``efficiency`` block is added)."""
    data = read_json(path)  # validated by load_cluster just before, so device is an object
    data["device"].setdefault("efficiency", {})["gemm"] = gemm.model_dump()
    try:
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
