"""Published training runs read as test cases: the model, configuration, device, measured
step time and measured memory of each record of a runs file (``calibration_runs.json``,
``fsdp_runs.json``, or a user's file of the same layout), and the records left out with the
reason.

What one record says about its software, model, configuration and measured step time is read
by :mod:`planner.diagnose.run_records`; this module names the device, checks the sizes, and
reads whole files, one bad record not hiding the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.diagnose.run_records import (
    config_from_record,
    measured_memory,
    measured_step_time_s,
    model_from_record,
    software_of,
)
from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.spec import ModelSpec
from planner.spec.limits import MAX_DEVICES
from planner.spec.messages import describe_validation_error, short_repr
from planner.spec.reading import read_json


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRun:
    """One published run, ready to estimate."""

    id: str
    """The record's id."""
    model: ModelSpec
    """The model the record describes (:func:`~planner.diagnose.run_records.model_from_record`)."""
    config: ParallelConfig
    """The configuration it ran with (:func:`~planner.diagnose.run_records.config_from_record`)."""
    num_devices: int
    """Devices (GPUs) of the run."""
    device: str
    """The device that ran it: a key of :data:`DEVICES`, or for a device none of them names
    (a run read to be priced on the user's own cluster file) its GPU name as written."""
    family: str
    """The framework family (:class:`~planner.diagnose.run_records.Software`)."""
    measured_step_time_s: float | None
    """The step time the record gives or implies
    (:func:`~planner.diagnose.run_records.measured_step_time_s`); None for a run that ran out
    of memory before one was measured."""
    basis: str
    """How the measured step time was obtained from the record."""
    measured_peak_memory_gib: float | None = None
    """The peak memory allocated to tensors, where the record measured it
    (:class:`~planner.diagnose.run_records.MeasuredMemory`)."""
    measured_reserved_memory_gib: float | None = None
    """The peak the caching allocator reserved, where the record measured it."""
    measured_device_memory_gib: float | None = None
    """The device memory in use as nvidia-smi showed it, where the record gives it."""
    measured_oom: bool = False
    """Whether the run ran out of memory (a record that does not say ran)."""
    site: str | None = None
    """The machine of :data:`SITES` the record names, whose network it is priced on; None:
    its device's bundled cluster (or the user's cluster file)."""

    @property
    def cluster_key(self) -> str:
        """The key of the cluster it is priced on: its device's, or ``device@site``."""
        return self.device if self.site is None else f"{self.device}@{self.site}"

    @property
    def chip(self) -> str:
        """The accelerator, whatever its memory: what a fitted efficiency belongs to (a device
        that is not bundled is its own chip)."""
        bundled = DEVICES.get(self.device)
        return self.device if bundled is None else bundled.chip


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """A device of the published runs and the bundled cluster that models it."""

    chip: str
    """The accelerator (``A100``): runs of one chip share its fitted efficiencies."""
    cluster_file: str
    """The bundled cluster file of that device."""


# Record GPU names to bundled clusters: the first key whose words all appear in the name wins.
DEVICES = {
    "A100-40GB": Device(chip="A100", cluster_file="dgx-a100-40gb.json"),
    "A100": Device(chip="A100", cluster_file="dgx-a100-80gb.json"),
    "H100": Device(chip="H100", cluster_file="dgx-h100-80gb.json"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Site:
    """A machine whose runs are priced on its own nodes and network."""

    device: str
    """The key of :data:`DEVICES` of its accelerators."""
    file: str
    """Its file in ``instances/clusters/sites``: nodes, network and notes, laid over the
    device's bundled cluster."""


SITES = {"Jean Zay": Site(device="A100", file="jean-zay.json")}
"""Machines whose published runs are priced on their own network (a file of
``instances/clusters/sites``: its nodes, network and notes over the device's bundled cluster),
found by name in a record's ``cluster`` block: BLOOM's runs on IDRIS's Jean Zay
(``../shared/validation/deepspeed_runs.json``) crossed nodes over Omni-Path, not DGX A100's
InfiniBand."""


def site_of(record: dict[str, Any]) -> str | None:
    """The site of :data:`SITES` a record's ``cluster`` block names, or None.

    >>> site_of({"cluster": {"inter_node": "Omni-Path (4 OPA links per node) (Jean Zay)"}})
    'Jean Zay'
    >>> site_of({"cluster": {"gpu": "A100-SXM4-80GB"}}) is None
    True
    """
    words = " ".join(str(v) for v in record.get("cluster", {}).values()).lower()
    return next((site for site in SITES if site.lower() in words), None)


def site_run(record: dict[str, Any], device: str) -> str | None:
    """The site a record of ``device`` is priced at: the one it names whose accelerators are
    that device (Jean Zay's V100 partition is not its A100 one), else None."""
    site = site_of(record)
    return site if site is not None and SITES[site].device == device else None


def device_of(gpu: str) -> str:
    """The key of :data:`DEVICES` for a record's GPU name.

    >>> device_of("A100 40GB"), device_of("A100-SXM4-80GB"), device_of("H100-SXM5-80GB")
    ('A100-40GB', 'A100', 'H100')
    """
    key = bundled_device(gpu)
    if key is None:
        raise InputError(f"cluster.gpu {gpu!r} is none of the bundled devices "
                         f"({', '.join(DEVICES)}); pass --cluster FILE to price it on a "
                         f"cluster file of that device")  # fmt: skip
    return key


def bundled_device(gpu: str) -> str | None:
    """The key of :data:`DEVICES` for a record's GPU name, or None when none matches.

    >>> bundled_device("Ascend-910B") is None
    True
    """
    words = gpu.upper().replace("-", " ").split()
    return next((key for key in DEVICES if all(w in words for w in key.split("-"))), None)


def device_key(gpu: str) -> str:
    """The device key of a run priced on a cluster file the user names: the bundled key where
    one matches (so its chip is the published runs' chip), else the GPU name as written.

    >>> device_key("A100-SXM4-80GB"), device_key("Ascend-910B")
    ('A100', 'Ascend-910B')
    """
    return bundled_device(gpu) or gpu



def run_from_record(
    record: dict[str, Any], *, any_device: bool = False
) -> CalibrationRun | None:
    """A record as estimate inputs, a measured step time and measured memory; None when it
    measures no step time and did not run out of memory (a run that did is kept without a
    step time, to price whether it fits). A GPU none of :data:`DEVICES` names is an error,
    unless ``any_device`` (the run is to be priced on a cluster file the caller gives:
    :func:`device_key`)."""
    memory = measured_memory(record)
    measured = measured_step_time_s(record)
    if measured is None and not memory.oom:
        return None
    seconds, basis = measured or (None, "ran out of memory, no step time measured")
    if seconds is not None and not (isinstance(seconds, float) and math.isfinite(seconds)
                                    and seconds > 0):  # fmt: skip
        raise ValueError(f"the measured step time is {seconds!r} s, not a positive number")
    num_gpus = record["cluster"]["num_gpus"]
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
        raise TypeError(f"cluster.num_gpus must be an integer, got {short_repr(num_gpus)}")
    if not 0 < num_gpus <= MAX_DEVICES:
        raise ValueError(f"cluster.num_gpus {num_gpus} is not in 1..{MAX_DEVICES}")
    device = (device_key if any_device else device_of)(str(record["cluster"]["gpu"]))
    return CalibrationRun(
        id=str(record["id"]),
        model=model_from_record(record),
        config=config_from_record(record),
        num_devices=num_gpus,
        device=device,
        family=software_of(record).family,
        measured_step_time_s=seconds,
        basis=basis,
        measured_peak_memory_gib=memory.peak_allocated_gib,
        measured_reserved_memory_gib=memory.peak_reserved_gib,
        measured_device_memory_gib=memory.device_gib,
        measured_oom=memory.oom,
        # On the user's own cluster file every run is priced on that file's network.
        site=None if any_device else site_run(record, device),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedRuns:
    """The runs of some files, and the records left out with the reason."""

    runs: list[CalibrationRun]
    """Every complete record that measures a step time or throughput, or ran out of
    memory."""
    skipped: list[str]
    """One line per record left out: its id (or file and index) and why."""


def load_runs_noting(*paths: str | Path, any_device: bool = False) -> LoadedRuns:
    """Every complete, measured record of the runs files at ``paths``, in order; a GPU that is
    not bundled is refused unless ``any_device`` (:func:`run_from_record`).

    A record that cannot be read (a missing or malformed field, a GPU, framework or
    configuration this reader refuses) is left out with the refusal, not the end of the
    reading: one hand-edited record must not hide the others. A file that is not JSON, or not
    a list of records (a benchmark's or a cluster's file given with the runs), is left out
    likewise when other files were given; alone, it is the error."""
    runs: list[CalibrationRun] = []
    skipped: list[str] = []
    for path in paths:
        try:
            records = read_json(Path(path))
            if not isinstance(records, list):
                raise InputError(f"{path}: expected a JSON list of run records, got a JSON "
                                 f"{type(records).__name__}")  # fmt: skip
        except InputError as error:
            if len(paths) == 1:
                raise
            skipped.append(f"{Path(path).name}: {str(error).removeprefix(f'{path}: ')}")
            continue
        left: list[tuple[str, str]] = []  # this file's records left out: name, why
        for index, record in enumerate(records):
            read = _read_record(record, path, index, any_device=any_device)
            if isinstance(read, CalibrationRun):
                runs.append(read)
            else:
                left.append(read)
        reasons = {why for _, why in left}
        if len(left) > 1 and len(left) == len(records) and len(reasons) == 1:
            # A file of something else (parameter counts, say): one line, not one per record.
            skipped.append(f"{Path(path).name}: all {len(left)} records: {reasons.pop()}")
        else:
            skipped += [f"{name}: {why}" for name, why in left]
    return LoadedRuns(runs=runs, skipped=skipped)


def _read_record(
    record: object, path: str | Path, index: int, *, any_device: bool
) -> CalibrationRun | tuple[str, str]:
    """The run of one record, or how to name it and why it is left out."""
    if not isinstance(record, dict):
        return f"{Path(path).name} record {index}", (f"expected a JSON object, got "
                                                     f"{type(record).__name__}")  # fmt: skip
    name = _name(record, path, index)
    if not record.get("config_complete", True):
        return name, "configuration incomplete"
    where = f"{path}: record {index} ({short_repr(record.get('id'))})"
    try:
        run = _run_of(record, where, any_device=any_device)
    except InputError as exc:
        return name, str(exc).removeprefix(where + ": ")
    if run is not None:
        return run
    return name, "no measured step time or throughput"


def _name(record: dict[str, Any], path: str | Path, index: int) -> str:
    """How a skipped record is named: its id, or its file and index when it has none."""
    run_id = record.get("id")
    return run_id if isinstance(run_id, str) and run_id else f"{Path(path).name} record {index}"


def load_runs(*paths: str | Path, any_device: bool = False) -> list[CalibrationRun]:
    """Every complete, measured record of the runs files at ``paths``
    (:func:`load_runs_noting`; the records left out are not said)."""
    return load_runs_noting(*paths, any_device=any_device).runs


def _run_of(record: dict[str, Any], where: str, *, any_device: bool) -> CalibrationRun | None:
    """:func:`run_from_record`, every way a hand-edited record can be wrong an InputError
    that names the record (the records are read by plain indexing, not a schema)."""
    try:
        return run_from_record(record, any_device=any_device)
    except ValidationError as exc:
        raise InputError(describe_validation_error(where, exc)) from None
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except KeyError as exc:
        raise InputError(f"{where}: required field {short_repr(exc.args[0])} is missing") from None
    except (TypeError, AttributeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        text = " ".join(str(exc).split())  # one line, whatever the exception said
        raise InputError(f"{where}: malformed ({type(exc).__name__}: {text[:200]})") from None
