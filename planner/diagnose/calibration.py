"""Published runs against the cost model: validation, and calibration of a chip.

:func:`validate` prices every run of some runs files (:mod:`planner.diagnose.runs`) on the
bundled cluster of its device and compares. :func:`calibrate` fits a chip's efficiencies
(:mod:`planner.diagnose.fit`) on its runs, optionally leaving a framework family out to
validate out of family, and can write the fit and the error bands that rest on it into every
cluster file of that chip. Everything else in a cluster file (bandwidths, network
efficiencies, HBM efficiency) comes from data sheets and published micro-benchmarks and is
not fitted.

Given ``cluster`` (a user's own cluster file), both price every run of the files that ran on
that file's device on that file instead (a run on another device is left out, with why): the
same code, given a mapping from each run's device key to that one cluster instead of the
bundled mapping.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.diagnose.evidence import validated_runs, write_evidence
from planner.diagnose.fit import (
    KNOBS,
    Fit,
    fit_knobs,
    kernel_attention,
    with_values,
    without_fits,
)
from planner.diagnose.run_records import FAMILIES
from planner.diagnose.runs import (
    DEVICES,
    SITES,
    CalibrationRun,
    LoadedRuns,
    device_key,
    load_runs_noting,
)
from planner.diagnose.validation_rows import ValidationRow, validation_rows
from planner.errors import InputError, PlannerError
from planner.spec import ClusterSpec, ValidatedRun, ValidationBand
from planner.spec.reading import load_cluster, read_json

# Which bundled cluster file ran each device's records.
BUNDLED_CLUSTERS = {key: device.cluster_file for key, device in DEVICES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Priced:
    """The runs the planner can price with their rows, and the ones it cannot with why."""

    runs: list[CalibrationRun]
    """The runs priced, in order."""
    rows: list[ValidationRow]
    """Their rows, one per run."""
    skipped: list[str]
    """One line per run not priced: its id and the refusal."""


def priced_rows(runs: Sequence[CalibrationRun], clusters: Mapping[str, ClusterSpec]) -> Priced:
    """:func:`validation_rows` run by run: a run the planner cannot price (a configuration
    the model does not divide, a run on part of a node) is left out with the refusal rather
    than ending the validation."""
    priced = Priced(runs=[], rows=[], skipped=[])
    for run in runs:
        try:
            priced.rows.extend(validation_rows([run], clusters))
        except PlannerError as exc:
            priced.skipped.append(f"{run.id}: {str(exc).removeprefix(f'run {run.id}: ')}")
        else:
            priced.runs.append(run)
    return priced


def bundled_clusters(clusters_dir: str | Path) -> dict[str, ClusterSpec]:
    """The cluster of every device of the published runs, from ``clusters_dir`` (a site's,
    :func:`at_site`, is added where its runs are priced)."""
    return {key: load_cluster(Path(clusters_dir) / f) for key, f in BUNDLED_CLUSTERS.items()}


def at_site(cluster: ClusterSpec, clusters_dir: str | Path, site: str) -> ClusterSpec:
    """``cluster``'s device on ``site``'s nodes and network (its file in ``clusters_dir`` /
    ``sites``, :data:`~planner.diagnose.runs.SITES`): the device, with its fitted efficiencies,
    stays the bundled file's, so a calibration of the chip prices the site's runs too."""
    overlay = read_json(Path(clusters_dir) / "sites" / SITES[site].file)
    return ClusterSpec.model_validate(cluster.model_dump() | overlay)


def cluster_files(
    runs: Sequence[CalibrationRun], clusters_dir: str | Path, cluster: str | Path | None
) -> dict[str, Path]:
    """The cluster file each run's device is priced on: the bundled file of its device, or
    for every run the user's ``cluster`` when one is given."""
    if cluster is not None:
        return {run.device: Path(cluster) for run in runs}
    return {key: Path(clusters_dir) / f for key, f in BUNDLED_CLUSTERS.items()}


def _loaded(
    paths: Mapping[str, Path], runs: Sequence[CalibrationRun], clusters_dir: str | Path
) -> dict[str, ClusterSpec]:
    """The clusters of ``paths``, each file read once (every run shares a user's file), and
    each site's of ``runs`` (:func:`at_site`)."""
    specs = {path: load_cluster(path) for path in set(paths.values())}
    clusters = {key: specs[path] for key, path in paths.items()}
    return clusters | {r.cluster_key: at_site(clusters[r.device], clusters_dir, r.site)
                       for r in runs if r.site is not None}  # fmt: skip


def run_clusters(
    runs: Sequence[CalibrationRun], clusters_dir: str | Path
) -> dict[str, ClusterSpec]:
    """The bundled cluster every run of ``runs`` is priced on, by
    :attr:`~planner.diagnose.runs.CalibrationRun.cluster_key` (its site's where it names one),
    as :func:`validate` prices them."""
    return _loaded(cluster_files(runs, clusters_dir, None), runs, clusters_dir)


def _runs_of(runs_paths: Sequence[str | Path], cluster: str | Path | None) -> LoadedRuns:
    """The runs of the files, each once: on the user's ``cluster`` any GPU name is read, and a
    run on another device than the file's is left out (the published A100 runs beside your
    H100 runs would fit your H100 file to A100 steps); otherwise only the bundled devices
    (with the error naming the record and ``--cluster``). A record given twice (a file named
    twice) is read once: counted twice, it would weigh twice in a fit."""
    loaded = load_runs_noting(*runs_paths, any_device=cluster is not None)
    runs: list[CalibrationRun] = []
    skipped: list[str] = list(loaded.skipped)
    seen: list[CalibrationRun] = []
    mine = None if cluster is None else load_cluster(Path(cluster)).device.name
    for run in loaded.runs:
        if run in seen:  # the same record (two logs both named train.log differ: both kept)
            skipped.append(f"{run.id}: given twice, read once")
        elif mine is not None and not _same_device(run.device, mine):
            skipped.append(f"{run.id}: ran on {run.device}, not {Path(cluster or '').name}'s "
                           f"{mine}")  # fmt: skip
        else:
            runs.append(run)
        seen.append(run)
    return LoadedRuns(runs=runs, skipped=skipped)


def _same_device(run_device: str, cluster_device: str) -> bool:
    """Whether a run's device key (:func:`~planner.diagnose.runs.device_key`) is the cluster
    file's device: the same bundled device, its memory too (MPT's A100 40GB runs are not an
    A100 80GB file's), or the same name where the file's is not bundled (a record ``planner
    runs from-log`` wrote names the cluster file's device).

    >>> _same_device("A100-40GB", "A100-SXM4-80GB"), _same_device("H100", "H100 80GB (site)")
    (False, True)
    """
    return run_device == device_key(cluster_device)


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """Every run of some files against its estimate, and the records left out."""

    rows: list[ValidationRow]
    """One per run priced (none when no record could be)."""
    skipped: list[str]
    """Records left out, each with why."""
    written: tuple[str, ...] = ()
    """The cluster files whose evidence was written (none without ``write``)."""


def validate(
    runs_paths: Sequence[str | Path], clusters_dir: str | Path, *,
    cluster: str | Path | None = None, write: bool = False,
) -> Validation:
    """Every run of ``runs_paths`` against the bundled cluster of its device, or with
    ``cluster`` against that cluster file (sized to each run). A record that cannot be read
    or priced is left out and listed in ``skipped`` with why (:func:`load_runs_noting`,
    :func:`priced_rows`). With ``write``, the runs priced become the evidence of every bundled
    cluster file of their chip (with ``cluster``: of that file), the efficiencies unchanged:
    what the error bands rest on (:mod:`planner.cost.uncertainty`)."""
    loaded = _runs_of(runs_paths, cluster)
    paths = cluster_files(loaded.runs, clusters_dir, cluster)
    clusters = _loaded(paths, loaded.runs, clusters_dir)
    priced = priced_rows(loaded.runs, clusters)
    written: list[str] = []
    if write:
        for path, chip in written_files(paths, clusters_dir, cluster).items():
            mine = [r for r in priced.rows if chip is None or DEVICES[r.device].chip == chip]
            if mine:
                write_evidence(path, validated_runs(mine))
                written.append(str(path))
    return Validation(rows=priced.rows, skipped=loaded.skipped + priced.skipped,
                      written=tuple(written))  # fmt: skip


def written_files(
    paths: Mapping[str, Path], clusters_dir: str | Path, cluster: str | Path | None
) -> dict[Path, str | None]:
    """The cluster files a ``--write`` writes, each with its chip: with ``cluster``, that file
    (chip None: every run is its); else the bundled file of each device of ``paths``
    (:func:`cluster_files`) and every other file in ``clusters_dir`` of the same device (a
    design on another network, ``h100-3level-oversubscribed.json``), whose device block is
    that file's."""
    if cluster is not None:
        return {Path(cluster): None}
    out: dict[Path, str | None] = {path: DEVICES[key].chip for key, path in paths.items()}
    names = {load_cluster(path).device.name: chip for path, chip in out.items()}
    for path in sorted(Path(clusters_dir).glob("*.json")):
        if path not in out and (name := read_json(path)["device"].get("name")) in names:
            out[path] = names[name]
    return out


# Fewer runs of a kind than this make no band of their own: a prediction of that kind takes
# the device's widest band instead (planner.cost.uncertainty.error_band).
MIN_BAND_RUNS = 3


def error_bands(rows: Sequence[ValidationRow]) -> tuple[ValidationBand, ...]:
    """The runs' errors by kind of parallelism, for kinds with at least
    :data:`MIN_BAND_RUNS` runs: how many, the 80th percentile of |error|, the median signed
    error, the families."""
    rows = [r for r in rows if r.error is not None]
    bands = []
    for kind in sorted({r.parallelism for r in rows}):
        mine = [r for r in rows if r.parallelism == kind]
        if len(mine) < MIN_BAND_RUNS:
            continue
        errors = [r.error for r in mine if r.error is not None]
        bands.append(ValidationBand(
            parallelism=kind, runs=len(mine),  # type: ignore[arg-type]
            p80_abs_error=round(float(np.percentile(np.abs(errors), 80)), 4),
            median_error=round(statistics.median(errors), 4),
            families=tuple(sorted({r.family for r in mine})),
        ))  # fmt: skip
    return tuple(bands)


def fittable_knobs(runs: Sequence[CalibrationRun], *,
                   kernel_curve: bool = False) -> tuple[str, ...]:
    """The knobs the runs can tell apart: the GEMM curve's ceiling always, its half
    saturation beside it (one run's step fits any split between the two, so the file's half
    saturation is kept); the fused-attention curve when fused-attention runs span several
    sequence lengths (and its head-dim term several head dims), unless the file's was fitted
    on kernels (``kernel_curve``: kept); the overlap contention when some run overlaps its
    data-parallel traffic. In that order, and no more than one for the first run and one for
    every two more (the half saturation from three runs on): a knob a run fits exactly leaves
    no residual to check it (``tests/test_own_cluster.py`` holds the counts)."""
    groups = [["gemm.max_fraction"], ["gemm.half_saturation_gflop"] * (len(runs) >= 2)]
    fused = [r for r in runs if r.config.flash_attention]
    if len({r.config.seq_len for r in fused}) >= 2 and not kernel_curve:
        # the curve's ceiling and half saturation come together (a block needs both)
        attention = ["attention.max_fraction", "attention.half_saturation_tokens"]
        head_dims = {r.model.hidden_size // r.model.num_attention_heads for r in fused}
        groups.append(attention + ["attention.half_saturation_head_dim"] * (len(head_dims) >= 2))
    if any(r.config.overlap_grad_reduce or r.config.overlap_param_gather for r in runs):
        groups.append(["overlap_contention"])
    names: list[str] = []
    for group in groups:
        if len(names) + len(group) <= 1 + (len(runs) - 1) // 2:
            names += group
    return tuple(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A chip's fit, the runs before and after it, and the bands that rest on it."""

    chip: str
    """The chip fitted (``A100``), or the device of the user's cluster file."""
    fit: Fit
    """The fitted knobs."""
    fitted_on: tuple[str, ...]
    """The families of the runs fitted on."""
    before: list[ValidationRow]
    """The chip's runs with the cluster files' efficiencies."""
    after: list[ValidationRow]
    """The same with the fit, every family (the left-out ones out of family)."""
    bands: tuple[ValidationBand, ...]
    """The error bands of ``after``."""
    written: tuple[str, ...]
    """The cluster files written (none without ``write``)."""
    skipped: list[str]
    """Records left out, each with why."""


def calibrate(
    runs_paths: Sequence[str | Path],
    clusters_dir: str | Path,
    *,
    chip: str | None = None,
    cluster: str | Path | None = None,
    exclude_families: Sequence[str] = (),
    write: bool = False,
) -> Calibration:
    """Fit ``chip``'s efficiencies on its runs (those of ``exclude_families`` left out of
    the fit but still priced after it) and, with ``write``, write the fit and the error bands
    into every bundled cluster file of the chip in ``clusters_dir``. Given ``cluster`` instead
    of ``chip``, fit that file's device on every run of the files and write into that file
    only."""
    if (chip is None) == (cluster is None):
        raise InputError("calibrate takes exactly one of --gpu CHIP (the bundled A100 or H100 "
                         "files) and --cluster FILE (your own cluster file)")  # fmt: skip
    if write and exclude_families:
        raise InputError("--write with --exclude-family would store a fit that left runs out")
    known = sorted({family for _, family in FAMILIES})
    unknown = [f for f in exclude_families if f not in known]
    if unknown:
        raise InputError(f"--exclude-family {unknown[0]!r}: not a framework family; the "
                         f"families are {', '.join(known)}")  # fmt: skip
    loaded = _runs_of(runs_paths, cluster)
    paths = cluster_files(loaded.runs, clusters_dir, cluster)
    if cluster is None:
        mine = [r for r in loaded.runs if r.chip == chip]
        paths = {k: p for k, p in paths.items() if DEVICES[k].chip == chip}
        command = f"--gpu {chip}"
    else:
        mine = loaded.runs
        command = f"--cluster {Path(cluster).name}"
    files = _loaded(paths, mine, clusters_dir)
    # A run that ran out of memory has no step time to fit; one the planner cannot price is
    # left out of the fit and listed, as validate lists it.
    untimed = [f"{r.id}: ran out of memory, no step time to fit" for r in mine
               if r.measured_step_time_s is None]  # fmt: skip
    priced = priced_rows([r for r in mine if r.measured_step_time_s is not None], files)
    mine, before = priced.runs, priced.rows
    skipped = loaded.skipped + untimed + priced.skipped
    fitted_on = [r for r in mine if r.family not in exclude_families]
    if mine and not fitted_on:
        left_out = ", ".join(sorted({r.family for r in mine}))
        raise InputError(f"every run to fit is of an excluded family ({left_out}): leave one "
                         f"family in to fit on")  # fmt: skip
    if not fitted_on:
        chips = sorted({r.chip for r in loaded.runs})
        what = repr(chip) if cluster is None else f"--cluster {cluster}"
        many = len(skipped) > 1
        left = (f"; {len(skipped)} record{'s' * many} left out"
                f"{' (`planner validate` lists each with why), the first' * many}: {skipped[0]}"
                if skipped else "")  # fmt: skip
        raise InputError(f"no runs on {what} to fit (runs are on: {', '.join(chips) or 'none'})"
                         f"{left}")  # fmt: skip
    name = chip or next(iter(files.values())).device.name
    clusters = {k: without_fits(c) for k, c in files.items()}
    # one file's kernel-fitted curve keeps the runs off every file's (a runs' ceiling written
    # into a block that still names its kernel would say it was measured)
    kernels = any(kernel_attention(c) for c in clusters.values())
    fit = fit_knobs(fitted_on, clusters, fittable_knobs(fitted_on, kernel_curve=kernels))
    after = validation_rows(mine, {k: with_values(c, fit.values) for k, c in clusters.items()})
    bands = error_bands(after)
    families = tuple(sorted({r.family for r in fitted_on}))
    written: list[str] = []
    if write:
        for path in written_files(paths, clusters_dir, cluster):
            _write_fit(path, fit, validated_runs(after), chip=name, families=families,
                       command=command)  # fmt: skip
            written.append(str(path))
    return Calibration(chip=name, fit=fit, fitted_on=families, before=before, after=after,
                       bands=bands, written=tuple(written), skipped=skipped)  # fmt: skip


def _write_fit(
    path: Path, fit: Fit, runs: Sequence[ValidatedRun], *, chip: str,
    families: Sequence[str], command: str,
) -> None:
    """Write the fitted knobs and the validated runs into the cluster file at ``path``,
    keeping the rest of the file as it is; ``command`` is the option that chose the runs
    (``--gpu A100``, ``--cluster mine.json``), named in the ``source``."""
    source = (f"fitted by `planner calibrate {command} --write` on {fit.runs} {chip} runs "
              f"({', '.join(families)}): robust least squares on log step time, RMS log error "
              f"{fit.rms_log_error:.3f}")  # fmt: skip

    def edit(eff: dict[str, Any]) -> None:
        # A knob the runs could not determine is cleared, as it was during the fit; an
        # attention curve fitted on kernels stays.
        if not (eff.get("attention") or {}).get("kernel"):
            eff.pop("attention", None)
        eff["overlap_contention"] = 0.0
        for block in ("gemm", "attention"):
            fields = {KNOBS[n].field: v for n, v in fit.values.items() if KNOBS[n].block == block}
            if fields:
                eff[block] = (eff.get(block) or {}) | fields | {"source": source}
        for name, value in fit.values.items():
            if not KNOBS[name].block:
                eff[KNOBS[name].field] = value

    write_evidence(path, runs, edit)
