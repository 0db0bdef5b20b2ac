"""How sure a prediction is: the error band of the published runs closest to it.

``planner calibrate --write`` stores, in the cluster file's ``device.efficiency.validation``,
how far the calibrated cost model missed the device's runs of each kind of parallelism. A
prediction takes the band of its own kind; a device with no such runs says so instead of
borrowing a number it has not earned. The band is a :class:`planner.plan.schema.ErrorBand`,
the record a plan keeps; this module computes it.

>>> from planner.spec import DeviceSpec, ValidationBand
>>> band = ValidationBand(parallelism="model-parallel", runs=9, p80_abs_error=0.031,
...                       median_error=-0.004, families=("megatron",))
>>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
...                  peak_tflops={"bf16": 300}, efficiency={"validation": [band]})
>>> error_band(gpu, "model-parallel").text
'+/- 4 %'
>>> error_band(gpu, "model-parallel").closest
'80 % of 9 model-parallel runs on x were within it; attention kernel uncalibrated'
>>> error_band(gpu, "sharded-data-parallel").runs, error_band(gpu, "sharded-data-parallel").text
(9, '+/- 4 %')
>>> bare = error_band(DeviceSpec(name="y", memory_gib=80, memory_bandwidth_gb_s=2000,
...                              peak_tflops={"bf16": 300}), "data-parallel")
>>> bare.text, bare.runs, bare.closest
('uncalibrated', 0, "no published runs on y; the data sheet's roofline")
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.plan.schema import ErrorBand, StageParallel
from planner.spec import DeviceSpec, GemmEfficiency
from planner.vocabulary import ParallelismKind


def parallelism_kind(*, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
                     expert_parallel: int = 1, zero: int) -> ParallelismKind:  # fmt: skip
    """The kind of parallelism a configuration is, as the validation bands group runs.

    >>> parallelism_kind(tensor_parallel=1, pipeline_parallel=1, zero=3)
    'sharded-data-parallel'
    >>> parallelism_kind(tensor_parallel=8, pipeline_parallel=2, zero=1)
    'model-parallel'
    >>> parallelism_kind(tensor_parallel=8, pipeline_parallel=2, context_parallel=2, zero=1)
    'context-parallel'
    """
    if expert_parallel > 1:
        return "expert-parallel"
    if context_parallel > 1:
        return "context-parallel"
    if tensor_parallel * pipeline_parallel > 1:
        return "model-parallel"
    return "sharded-data-parallel" if zero == 3 else "data-parallel"


def stages_kind(stages: Sequence[StageParallel]) -> ParallelismKind:
    """The kind of parallelism of a plan's stages (the search's, which may differ from stage to
    stage): expert- or context-parallel when any stage is; model-parallel when any stage has
    tensor parallelism or there is more than one stage; else as the one stage's ZeRO stage
    says.

    >>> stages_kind([StageParallel(tp=1, dp=8, zero=3)])
    'sharded-data-parallel'
    >>> stages_kind([StageParallel(tp=1, dp=8, zero=1)] * 2)
    'model-parallel'
    """
    return parallelism_kind(
        tensor_parallel=max(s.tp for s in stages), pipeline_parallel=len(stages),
        context_parallel=max(s.cp for s in stages), expert_parallel=max(s.ep for s in stages),
        zero=min(s.zero for s in stages),
    )  # fmt: skip


def error_band(device: DeviceSpec, kind: ParallelismKind) -> ErrorBand:
    """The band of ``device``'s validated runs of ``kind``; without any, the widest of its
    bands over all its runs; without runs at all, an uncalibrated band that says whether the
    device's efficiencies are fitted at all (a GEMM curve at its defaults is the data sheet's
    roofline)."""
    bands = device.efficiency.validation
    name = device.name
    # The runs a band rests on may all share one sequence length: without an attention curve,
    # fused attention is timed as GEMMs, and long sequences are outside what the band covers.
    caveat = ("; attention kernel uncalibrated" if device.efficiency.attention is None
              else "")  # fmt: skip
    for band in bands:
        if band.parallelism == kind:
            return ErrorBand(fraction=band.p80_abs_error, runs=band.runs, parallelism=kind,
                             closest=f"80 % of {band.runs} {kind} runs on {name} were "
                             f"within it{caveat}")  # fmt: skip
    if bands:
        runs = sum(b.runs for b in bands)
        # Each band holds 80 % of its runs, so the widest holds at least 80 % of them all.
        return ErrorBand(fraction=max(b.p80_abs_error for b in bands), runs=runs,
                         parallelism=kind,
                         closest=f"widest over {runs} runs on {name} (none {kind})"
                         f"{caveat}")  # fmt: skip
    gemm = device.efficiency.gemm
    roofline = (gemm.max_fraction, gemm.half_saturation_gflop) == (
        GemmEfficiency().max_fraction, GemmEfficiency().half_saturation_gflop)
    closest = (f"no published runs on {name}; the data sheet's roofline" if roofline
               else f"no validated runs on {name}, accuracy not measured")  # fmt: skip
    return ErrorBand(fraction=None, runs=0, parallelism=kind, closest=closest)
