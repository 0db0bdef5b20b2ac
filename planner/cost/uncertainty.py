"""How sure a prediction is: the error band of the published runs closest to it.

``planner calibrate --write`` stores, in the cluster file's ``device.efficiency.validation``,
how far the calibrated cost model missed the device's runs of each kind of parallelism. A
prediction takes the band of its own kind; a device with no such runs says so instead of
borrowing a number it has not earned.

>>> from planner.spec import DeviceSpec, ValidationBand
>>> band = ValidationBand(parallelism="model-parallel", runs=9, p80_abs_error=0.031,
...                       median_error=-0.004, families=("megatron",))
>>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
...                  peak_tflops={"bf16": 300}, efficiency={"validation": [band]})
>>> error_band(gpu, "model-parallel").text
'+/- 4 %'
>>> error_band(gpu, "sharded-data-parallel").runs, error_band(gpu, "sharded-data-parallel").text
(9, '+/- 4 %')
>>> error_band(DeviceSpec(name="y", memory_gib=80, memory_bandwidth_gb_s=2000,
...                       peak_tflops={"bf16": 300}), "data-parallel").text
'uncalibrated'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.spec import DeviceSpec

ParallelismKind = Literal["sharded-data-parallel", "data-parallel", "model-parallel"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBand:
    """The relative error a prediction carries, and what it rests on."""

    fraction: float | None
    """80th percentile of the |relative error| of the closest validated runs; None when the
    device has none (its efficiencies are not calibrated)."""
    runs: int
    """How many runs the band rests on."""
    parallelism: ParallelismKind
    """The prediction's kind of parallelism."""
    closest: str
    """Which runs: the same kind on this device, or (none of that kind) all of this device's
    runs, or none."""

    @property
    def text(self) -> str:
        """``+/- 6 %`` (whole percent, rounded up), or ``uncalibrated``."""
        if self.fraction is None:
            return "uncalibrated"
        return f"+/- {max(1, math.ceil(100 * self.fraction - 1e-9))} %"

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {"fraction": self.fraction, "runs": self.runs, "parallelism": self.parallelism,
                "closest": self.closest}  # fmt: skip


def parallelism_kind(*, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
                     expert_parallel: int = 1, zero: int) -> ParallelismKind:  # fmt: skip
    """The kind of parallelism a configuration is, as the validation bands group runs.

    >>> parallelism_kind(tensor_parallel=1, pipeline_parallel=1, zero=3)
    'sharded-data-parallel'
    >>> parallelism_kind(tensor_parallel=8, pipeline_parallel=2, zero=1)
    'model-parallel'
    """
    if tensor_parallel * pipeline_parallel * context_parallel * expert_parallel > 1:
        return "model-parallel"
    return "sharded-data-parallel" if zero == 3 else "data-parallel"


def error_band(device: DeviceSpec, kind: ParallelismKind) -> ErrorBand:
    """The band of ``device``'s validated runs of ``kind``; without any, the widest of its
    bands over all its runs; without runs at all, an uncalibrated band."""
    bands = device.efficiency.validation
    for band in bands:
        if band.parallelism == kind:
            return ErrorBand(fraction=band.p80_abs_error, runs=band.runs, parallelism=kind,
                             closest=f"{band.runs} {kind} runs on {device.name}")  # fmt: skip
    if not bands:
        return ErrorBand(fraction=None, runs=0, parallelism=kind,
                         closest=f"no published runs on {device.name}")  # fmt: skip
    runs = sum(b.runs for b in bands)
    return ErrorBand(fraction=max(b.p80_abs_error for b in bands), runs=runs, parallelism=kind,
                     closest=f"no {kind} runs on {device.name}; the widest band of its "
                     f"{runs} runs")  # fmt: skip
