"""How sure a prediction is: a band built from the validated runs nearest to it, widened with
the distance to them.

A device's cluster file keeps every run that validated it (``device.efficiency.evidence``,
:class:`~planner.spec.ValidatedRun`): the regime it ran in (stack, mechanisms, sequence length,
devices, network, model size, experts, precision) and how far the cost model missed it. A
prediction's band is the spread of the errors of its :data:`NEAREST` nearest runs
(:func:`distance`), plus :data:`WIDENING` times their mean distance: near the evidence the band
is what the evidence shows, far from it the band grows by a rule fitted on held-out families
(``benchmarks/band_coverage.py``). The band names what it extrapolates (:func:`gaps`). A
device with no evidence says so instead of borrowing a number it has not earned; a file
written before runs were kept falls back to its bands by kind of parallelism.

>>> from planner.spec import DeviceSpec, Regime, ValidatedRun
>>> near = Regime(stack="megatron-te", mechanisms=("tensor",), seq_length=4096,
...               num_devices=64, network_gb_s=24.0, gflop_per_token=14.0)
>>> runs = [ValidatedRun(**near.model_dump(), id=f"r{i}", family="megatron", error=e, mfu=0.4)
...         for i, e in enumerate([0.01, -0.02, 0.03, -0.01, 0.02])]
>>> gpu = DeviceSpec(name="x", memory_gib=80, memory_bandwidth_gb_s=2000,
...                  peak_tflops={"bf16": 300}, efficiency={"evidence": runs})
>>> error_band(gpu, near).text
'+/- 3 %'
>>> far = near.model_copy(update={"mechanisms": ("tensor", "zero-3"), "seq_length": 32768})
>>> [e.text for e in error_band(gpu, far).extrapolated]
['no validated run with ZeRO-3 on x', '32,768 tokens a sequence (validated 4,096)']
>>> error_band(gpu, far).fraction > error_band(gpu, near).fraction
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from planner.plan.bands import ErrorBand, Extrapolation, MemoryBand
from planner.plan.config import ParallelConfig
from planner.plan.schema import StageParallel
from planner.spec import (
    ClusterSpec,
    DeviceSpec,
    GemmEfficiency,
    Regime,
    TrainingSpec,
    ValidatedRun,
)
from planner.vocabulary import GB, MECHANISMS, Mechanism, Offload, ParallelismKind, Stack

T = TypeVar("T")

NEAREST = 5
"""Runs a band rests on: enough for a spread, few enough to stay near the prediction."""

STACK_DISTANCE = 2.0
"""Distance between runs on different software stacks: another stack keeps other bytes and
launches other kernels (on the H100, eager Hugging Face layers run 22-35 % slower than their
kernels, ``../shared/validation/h100/layers.jsonl``), so it counts as much as two mechanisms."""
MOE_DISTANCE = 2.0
"""Distance between a mixture of experts and a dense model: routing, grouped GEMMs and the
all-to-all are terms a dense run never checks."""
PRECISION_DISTANCE = 1.0
"""Distance between compute precisions (bf16 and fp16 run the same kernels at the same peak)."""
MISSING_MECHANISM = 1.0
"""Distance for each mechanism the prediction uses and the run did not: its terms unchecked."""
EXTRA_MECHANISM = 0.5
"""Distance for each mechanism the run used and the prediction does not: the run's error has a
term the prediction lacks, so it says less about it."""
PER_DOUBLING = {"seq_length": 0.5, "num_devices": 0.25, "network_gb_s": 0.25,
                "gflop_per_token": 0.25}  # fmt: skip
"""Distance per doubling of the sequence (attention's share grows with it), the devices (more
of the step is communication), the bandwidth of the slowest link crossed (a network's
collectives are checked only by runs on it) and the model's FLOPs a token (the GEMMs'
shapes)."""

WIDENING = {0.8: 0.032, 0.95: 0.0535}
"""How much a band widens per unit of mean distance to its nearest runs, at each quantile:
fitted by ``benchmarks/band_coverage.py --refit`` on the four shared runs files so that,
leaving each framework family out of its chip's runs (the efficiencies refitted without it),
the families' runs fall inside their bands at about that rate on average (the README's coverage
table)."""

QUANTILES = tuple(WIDENING)
"""The quantiles a band is given at: the printed one (0.8) and the one ``--objective p95``
reads."""


def mechanisms(
    *, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
    expert_parallel: int = 1, zero: int = 0, offload: Offload = "none", deepep: bool = False,
) -> tuple[Mechanism, ...]:  # fmt: skip
    """The mechanisms a configuration uses, in :data:`~planner.vocabulary.MECHANISMS` order.

    >>> mechanisms(tensor_parallel=8, pipeline_parallel=1, zero=3)
    ('tensor', 'zero-3')
    """
    used = {"tensor": tensor_parallel > 1, "pipeline": pipeline_parallel > 1,
            "context": context_parallel > 1, "expert": expert_parallel > 1,
            "zero-3": zero == 3, "offload": offload != "none",
            "deepep": deepep and expert_parallel > 1}  # fmt: skip
    return tuple(m for m in MECHANISMS if used[m])


def config_mechanisms(config: ParallelConfig) -> tuple[Mechanism, ...]:
    """The mechanisms of a uniform configuration (:func:`mechanisms`)."""
    return mechanisms(tensor_parallel=config.tp, pipeline_parallel=config.pp,
                      context_parallel=config.cp, expert_parallel=config.ep, zero=config.zero,
                      offload=config.offload,
                      deepep=config.moe_dispatcher == "deepep")  # fmt: skip


def regime_of(
    training: TrainingSpec, cluster: ClusterSpec, *, used: tuple[Mechanism, ...], moe: bool,
    forward_flops_per_sequence: float,
) -> Regime:
    """The regime of a prediction for ``training`` on ``cluster`` with the mechanisms
    ``used``, for a model of ``forward_flops_per_sequence`` (routing experts when ``moe``)."""
    gflop_per_token = forward_flops_per_sequence / training.seq_length / 1e9
    spanned = next((level for level in cluster.network
                    if level.domain_devices >= cluster.num_devices), cluster.network[-1])
    return Regime(stack=training.stack, mechanisms=used, seq_length=training.seq_length,
                  num_devices=cluster.num_devices, network_gb_s=spanned.bandwidth_bytes_s / GB,
                  gflop_per_token=gflop_per_token, moe=moe,
                  precision=training.precision)  # fmt: skip


def stage_mechanisms(
    stages: Sequence[StageParallel], *, deepep: bool = False
) -> tuple[Mechanism, ...]:
    """The mechanisms of a plan's stages (the search's, which may differ from stage to stage):
    any mechanism a stage uses; pipeline when there is more than one stage; DeepEP where it
    exchanges the experts' tokens (``deepep``) and some stage spreads them.

    >>> stage_mechanisms([StageParallel(tp=1, dp=8, zero=3)] * 2)
    ('pipeline', 'zero-3')
    """
    return mechanisms(
        tensor_parallel=max(s.tp for s in stages), pipeline_parallel=len(stages),
        context_parallel=max(s.cp for s in stages), expert_parallel=max(s.ep for s in stages),
        zero=max(s.zero for s in stages), deepep=deepep,
    )  # fmt: skip


def parallelism_kind(*, tensor_parallel: int, pipeline_parallel: int, context_parallel: int = 1,
                     expert_parallel: int = 1, zero: int) -> ParallelismKind:  # fmt: skip
    """The kind of parallelism a configuration is, as bands by kind (files written before
    runs were kept) group runs.

    >>> parallelism_kind(tensor_parallel=1, pipeline_parallel=1, zero=3)
    'sharded-data-parallel'
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


def kind_of(used: Sequence[Mechanism]) -> ParallelismKind:
    """The kind of parallelism of a set of mechanisms (:func:`parallelism_kind`)."""
    return parallelism_kind(
        tensor_parallel=2 if "tensor" in used else 1,
        pipeline_parallel=2 if "pipeline" in used else 1,
        context_parallel=2 if "context" in used else 1,
        expert_parallel=2 if "expert" in used else 1, zero=3 if "zero-3" in used else 0,
    )  # fmt: skip


def distance(prediction: Regime, run: Regime) -> float:
    """How far a run's regime is from a prediction's, in units of about one mechanism.

    >>> a = Regime(stack="megatron-te", seq_length=2048, num_devices=8, network_gb_s=231.0,
    ...            gflop_per_token=3.0)
    >>> distance(a, a.model_copy(update={"seq_length": 8192, "mechanisms": ("tensor",)}))
    1.5
    """
    d = STACK_DISTANCE * (prediction.stack != run.stack)
    d += MOE_DISTANCE * (prediction.moe != run.moe)
    d += PRECISION_DISTANCE * (_precision_class(prediction) != _precision_class(run))
    d += MISSING_MECHANISM * len(set(prediction.mechanisms) - set(run.mechanisms))
    d += EXTRA_MECHANISM * len(set(run.mechanisms) - set(prediction.mechanisms))
    for field, weight in PER_DOUBLING.items():
        d += weight * abs(math.log2(getattr(prediction, field) / getattr(run, field)))
    return d


def _precision_class(regime: Regime) -> str:
    return "fp32" if regime.precision == "fp32" else "16-bit"


MECHANISM_WORDS: dict[Mechanism, str] = {
    "tensor": "tensor parallelism", "pipeline": "pipeline parallelism",
    "context": "context parallelism", "expert": "expert parallelism", "zero-3": "ZeRO-3",
    "offload": "optimizer offload", "deepep": "DeepEP",
}
"""Each mechanism as a sentence names it."""

TERMS: dict[str, tuple[str, ...]] = {
    "stack": ("compute_s",), "moe": ("compute_s", "expert_parallel_comm_s"),
    "precision": ("compute_s",), "seq_length": ("compute_s", "context_parallel_comm_s"),
    "num_devices": ("data_parallel_comm_exposed_s", "pipeline_comm_s"),
    "mfu": ("compute_s",), "tensor": ("tensor_parallel_comm_s",),
    "pipeline": ("pipeline_comm_s", "pipeline_bubble_s"),
    "context": ("context_parallel_comm_s",), "expert": ("expert_parallel_comm_s",),
    "zero-3": ("data_parallel_comm_exposed_s",), "offload": ("optimizer_s",),
    "deepep": ("expert_parallel_comm_s",),
}
"""The parts of a step (:class:`~planner.plan.schema.StepTime`) each extrapolated feature
prices: what ``explain`` says rests on extrapolation."""


def gaps(prediction: Regime, evidence: Sequence[ValidatedRun], device: str,
         ) -> tuple[Extrapolation, ...]:  # fmt: skip
    """What the prediction extrapolates: each feature no validated run on ``device`` shares
    or spans."""
    out = []
    if all(r.stack != prediction.stack for r in evidence):
        out.append(("stack", f"no validated run on the {prediction.stack} stack on {device}"))
    out += [(m, f"no validated run with {MECHANISM_WORDS[m]} on {device}")
            for m in prediction.mechanisms
            if all(m not in r.mechanisms for r in evidence)]  # fmt: skip
    if prediction.moe and not any(r.moe for r in evidence):
        out.append(("moe", f"no validated mixture of experts on {device}"))
    if all(_precision_class(r) != _precision_class(prediction) for r in evidence):
        out.append(("precision", f"no validated {prediction.precision} run on {device}"))
    for field, words in (("seq_length", "tokens a sequence"), ("num_devices", "devices")):
        low, high = (f(getattr(r, field) for r in evidence) for f in (min, max))
        value = getattr(prediction, field)
        if not low <= value <= high:
            span = f"{low:,}" if low == high else f"{low:,}-{high:,}"
            out.append((field, f"{value:,} {words} (validated {span})"))
    return tuple(Extrapolation(feature=f, text=t) for f, t in out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nearest:
    """The validated runs nearest a prediction, and what a band makes of them."""

    runs: tuple[ValidatedRun, ...]
    """The :data:`NEAREST` nearest, nearest first."""
    spread: dict[float, float]
    """Their |error| at each of :data:`QUANTILES`."""
    mean_distance: float
    """Their mean :func:`distance` from the prediction."""

    def half_width(self, quantile: float, widening: Mapping[float, float] = WIDENING) -> float:
        """The band's half-width at ``quantile``: the spread widened for the distance."""
        return self.spread[quantile] + widening[quantile] * self.mean_distance


def nearest(prediction: Regime, evidence: Sequence[ValidatedRun]) -> Nearest:
    """The :data:`NEAREST` runs of ``evidence`` nearest ``prediction`` (ties: the first
    kept), their spread and mean distance."""
    d = np.array([distance(prediction, r) for r in evidence])
    order = np.lexsort((np.arange(len(d)), d))[:NEAREST]
    errors = np.array([abs(evidence[i].error) for i in order])
    return Nearest(runs=tuple(evidence[i] for i in order),
                   spread={q: float(np.percentile(errors, 100 * q)) for q in QUANTILES},
                   mean_distance=float(d[order].mean()))  # fmt: skip


_MEMO: dict[tuple[object, ...], tuple[Sequence[ValidatedRun], object]] = {}
"""Bands by the identity of the evidence they rest on and their arguments: a search prices the
same regime on the same device thousands of times, and a band is a pure function of them. The
evidence is held with each entry, so its identity cannot be reused while the entry lives."""


def _memo(evidence: Sequence[ValidatedRun], key: tuple[object, ...],
          compute: Callable[[], T]) -> T:  # fmt: skip
    """``compute()``, once per ``evidence`` object and ``key``."""
    hit = _MEMO.get((id(evidence), *key))
    if hit is not None and hit[0] is evidence:
        return hit[1]  # type: ignore[return-value]
    if len(_MEMO) >= 4096:
        _MEMO.clear()
    value = compute()
    _MEMO[(id(evidence), *key)] = (evidence, value)
    return value


def error_band(device: DeviceSpec, prediction: Regime, *, mfu: float | None = None) -> ErrorBand:
    """The band of a prediction in regime ``prediction`` on ``device``: the spread of the
    errors of its :data:`NEAREST` nearest validated runs at each of :data:`QUANTILES`, widened
    by :data:`WIDENING` times their mean distance (:func:`nearest`). ``mfu``, the predicted
    MFU, is flagged when above the highest any run of the device's stack reached."""
    evidence = device.efficiency.evidence
    if not evidence:
        return _band_by_kind(device, kind_of(prediction.mechanisms))
    band = _memo(evidence, ("band", device.name, prediction),
                 lambda: _band(device, prediction))  # fmt: skip
    above = None if mfu is None else mfu_above(device, prediction.stack, mfu)
    if above is None:
        return band
    return band.model_copy(update={"extrapolated": (*band.extrapolated, above)})


def _band(device: DeviceSpec, prediction: Regime) -> ErrorBand:
    """:func:`error_band` without the MFU's check, on a device with evidence."""
    evidence = device.efficiency.evidence
    near = nearest(prediction, evidence)
    spread, widened = near.spread[0.8], near.half_width(0.8)
    families = ", ".join(sorted({r.family for r in near.runs}))
    closest = (f"the {len(near.runs)} nearest of {len(evidence)} validated runs on "
               f"{device.name} ({families}), 80 % within {_percent(spread)}")  # fmt: skip
    if widened > spread:
        closest += (f", widened {_percent(widened - spread)} for their distance "
                    f"{near.mean_distance:.1f}")  # fmt: skip
    return ErrorBand(fraction=round(widened, 4), fraction_p95=round(near.half_width(0.95), 4),
                     runs=len(near.runs), parallelism=kind_of(prediction.mechanisms),
                     closest=closest, extrapolated=gaps(prediction, evidence, device.name))


def highest_mfu(device: DeviceSpec, stack: Stack) -> float:
    """The highest MFU any validated run of ``stack`` reached on ``device`` (infinity without
    one: nothing to be above)."""
    evidence = device.efficiency.evidence
    return _memo(evidence, ("mfu", stack), lambda: max(
        (r.mfu for r in evidence if r.stack == stack), default=math.inf))


def memory_band(device: DeviceSpec, stack: Stack) -> MemoryBand:
    """The band of a peak predicted for ``stack`` on ``device``: the 80th and 95th
    percentiles of |error| of the peaks its validated runs of that stack measured (allocated,
    or nvidia-smi's memory in use where that is what a run gave). Memory errors come from
    what a stack keeps, not from the mechanisms (:mod:`planner.cost.activations`), so the
    band is the stack's, not the nearest runs'."""
    return _memo(device.efficiency.evidence, ("memory", device.name, stack),
                 lambda: _memory_band(device, stack))  # fmt: skip


def _memory_band(device: DeviceSpec, stack: Stack) -> MemoryBand:
    """:func:`memory_band`, computed."""
    errors = np.abs([r.memory_error for r in device.efficiency.evidence
                     if r.stack == stack and r.memory_error is not None])  # fmt: skip
    if not len(errors):
        return MemoryBand(fraction=None, runs=0, closest=(
            f"no run on the {stack} stack measured its peak on {device.name}"))
    p80, p95 = (round(float(np.percentile(errors, 100 * q)), 4) for q in QUANTILES)
    peaks = f"{len(errors)} peak{'s' * (len(errors) > 1)}"
    return MemoryBand(fraction=p80, fraction_p95=p95, runs=len(errors), closest=(
        f"80 % of {peaks} measured with {stack} on {device.name} were within it"))


def mfu_above(device: DeviceSpec, stack: Stack, mfu: float) -> Extrapolation | None:
    """The extrapolation of an ``mfu`` above :func:`highest_mfu`; None within it."""
    best = highest_mfu(device, stack)
    if mfu <= best:
        return None
    return Extrapolation(feature="mfu", text=f"MFU {_percent(mfu)} above the highest "
                         f"validated on {device.name} with {stack} ({_percent(best)})")


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def _band_by_kind(device: DeviceSpec, kind: ParallelismKind) -> ErrorBand:
    """A file without evidence: the band of ``device``'s runs of ``kind`` as an older
    ``planner calibrate`` wrote them; without any, the widest of its bands over all its runs;
    without runs at all, an uncalibrated band that says whether the device's efficiencies are
    fitted at all (a GEMM curve at its defaults is the data sheet's roofline)."""
    bands = device.efficiency.validation
    name = device.name
    for band in bands:
        if band.parallelism == kind:
            return ErrorBand(fraction=band.p80_abs_error, runs=band.runs, parallelism=kind,
                             closest=f"80 % of {band.runs} {kind} runs on {name} were "
                             "within it")  # fmt: skip
    if bands:
        runs = sum(b.runs for b in bands)
        # Each band holds 80 % of its runs, so the widest holds at least 80 % of them all.
        return ErrorBand(fraction=max(b.p80_abs_error for b in bands), runs=runs,
                         parallelism=kind,
                         closest=f"widest over {runs} runs on {name} (none {kind})")  # fmt: skip
    gemm = device.efficiency.gemm
    roofline = (gemm.max_fraction, gemm.half_saturation_gflop) == (
        GemmEfficiency().max_fraction, GemmEfficiency().half_saturation_gflop)
    closest = (f"no published runs on {name}; the data sheet's roofline" if roofline
               else f"no validated runs on {name}, accuracy not measured")  # fmt: skip
    return ErrorBand(fraction=None, runs=0, parallelism=kind, closest=closest)
