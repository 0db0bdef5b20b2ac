"""How sure a prediction is: a band built from the validated runs nearest to it, widened with
the distance to them and with the communication its step leaves exposed.

A device's cluster file keeps every run that validated it (``device.efficiency.evidence``,
:class:`~planner.spec.ValidatedRun`): the regime it ran in (stack, mechanisms, sequence length,
devices, network, model size, experts, precision), how far the cost model missed it and the
share of its step priced as exposed communication. A prediction's band is the spread of the
errors of its :data:`NEAREST` nearest runs (:func:`distance`), each net of its allowance for
exposed communication, plus :data:`WIDENING` times their mean distance and
:data:`COMMUNICATION` times the prediction's own exposed share: near the evidence the band is
what the evidence shows, far from it the band grows by a rule fitted on held-out families
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
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from planner.cost.regimes import kind_of
from planner.plan.bands import ErrorBand, Extrapolation, MemoryBand
from planner.spec import (
    DeviceSpec,
    GemmEfficiency,
    Regime,
    ValidatedRun,
)
from planner.vocabulary import Mechanism, ParallelismKind, Stack, evidence_stack

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

WIDENING = {0.8: 0.0321, 0.95: 0.0535}
"""How much a band widens per unit of mean distance to its nearest runs, at each quantile:
fitted by ``benchmarks/band_coverage.py --refit`` on the four shared runs files so that,
leaving each framework family out of its chip's runs (the efficiencies refitted without it),
the families' runs fall inside their bands at about that rate on average (the README's coverage
table)."""

COMMUNICATION = {0.8: 0.25, 0.95: 0.25}
"""How far the price of the communication a step leaves exposed may be off, as a fraction of
that price, at each quantile: a band widens by it times the step's exposed share
(:func:`~planner.cost.regimes.communication_share`). Exposed communication is the least
checked price of a step (an overlap assumed, a network's achieved rate); of the three families
whose exposed share varies, two are missed more as it grows (``benchmarks/band_coverage.py
--refit``, its last table: rank correlation +0.70 on BLOOM's runs, +0.44 on the A100's Megatron
runs, -0.17 on the H100's, whose two most exposed runs are nonetheless its two widest misses
in the bundled fit). A run's own exposed share times this is set apart from its error before
the nearest runs' spread is taken (:meth:`Nearest.set_apart`), so a run that missed its
communication does not widen the band of a step without any. Fitted with :data:`WIDENING` by
``benchmarks/band_coverage.py --refit`` (:func:`planner.diagnose.coverage.fit_bands`): the
value at which the left-out families' coverage lies closest to the quantile. Kept from an
earlier fit: the refit with Megatron's loss priced op by op picks 0.2 and 0.3 (widening 0.0307
and 0.0463), near these; the one before it, with one H100 run fewer inside its band, had
picked 0.05 and 0.2 (the README's "How sure")."""

QUANTILES = tuple(WIDENING)
"""The quantiles a band is given at: the printed one (0.8) and the one ``--objective p95``
reads."""


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
    "utilization": ("compute_s",), "tensor": ("tensor_parallel_comm_s",),
    "pipeline": ("pipeline_comm_s", "pipeline_bubble_s"),
    "context": ("context_parallel_comm_s",), "expert": ("expert_parallel_comm_s",),
    "zero-3": ("data_parallel_comm_exposed_s",), "offload": ("optimizer_s",),
    "deepep": ("expert_parallel_comm_s",),
    "mfu": ("compute_s",),  # what plan files written before "utilization" name it
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
    apart: dict[float, float]
    """:meth:`set_apart` at each of :data:`QUANTILES` with :data:`COMMUNICATION`'s allowance,
    taken once: a search builds a band for every exposed share it prices, and these do not
    depend on it."""
    nearest_spread: dict[float, float] | None = None
    """At each of :data:`QUANTILES`, the spread of the runs of the prediction's very regime
    (distance 0) alone, where some of the nearest are and some are not (often one run: the
    user's own, of the configuration predicted): no band may claim less than the evidence
    at it missed by. None: no run is at distance 0, or all are."""

    def set_apart(self, quantile: float, communication: float) -> float:
        """Their |error| at ``quantile`` once each run's allowance for its exposed
        communication (``communication`` times its share of its step) is taken off, at
        least 0."""
        if communication == COMMUNICATION[quantile]:
            return self.apart[quantile]
        return _set_apart(self.runs, quantile, communication)

    def half_width(
        self, quantile: float, share: float = 0.0, *,
        widening: Mapping[float, float] = WIDENING,
        communication: Mapping[float, float] = COMMUNICATION,
    ) -> float:  # fmt: skip
        """The band's half-width at ``quantile`` for a step with ``share`` of it exposed
        communication: the runs' spread with their communication set apart, widened for their
        distance and for the step's exposed communication; never below their spread."""
        c = communication[quantile]
        widened = (self.set_apart(quantile, c) + widening[quantile] * self.mean_distance
                   + c * share)  # fmt: skip
        closest = 0.0 if self.nearest_spread is None else self.nearest_spread[quantile]
        return max(self.spread[quantile], widened, closest)


def _set_apart(runs: Sequence[ValidatedRun], quantile: float, communication: float) -> float:
    """:meth:`Nearest.set_apart`, computed."""
    return float(np.percentile([max(0.0, abs(r.error) - communication * r.communication_share)
                                for r in runs], 100 * quantile))  # fmt: skip


def nearest(prediction: Regime, evidence: Sequence[ValidatedRun]) -> Nearest:
    """The :data:`NEAREST` runs of ``evidence`` nearest ``prediction`` (ties: the first
    kept), their spread and mean distance."""
    d = np.array([distance(prediction, r) for r in evidence])
    order = np.lexsort((np.arange(len(d)), d))[:NEAREST]
    runs = tuple(evidence[i] for i in order)
    errors = np.array([abs(r.error) for r in runs])
    # at distance 0 only: a run a hair nearer than the rest is no better evidence than they
    same = errors[d[order] == 0.0]
    return Nearest(runs=runs,
                   spread={q: float(np.percentile(errors, 100 * q)) for q in QUANTILES},
                   mean_distance=float(d[order].mean()),
                   apart={q: _set_apart(runs, q, COMMUNICATION[q]) for q in QUANTILES},
                   nearest_spread=None if same.size in (0, errors.size) else {
                       q: float(np.percentile(same, 100 * q)) for q in QUANTILES})  # fmt: skip


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
    if len(_MEMO) >= 16384:
        _MEMO.clear()
    value = compute()
    _MEMO[(id(evidence), *key)] = (evidence, value)
    return value


def error_band(device: DeviceSpec, prediction: Regime, *, utilization: float | None = None,
               communication_share: float = 0.0) -> ErrorBand:  # fmt: skip
    """The band of a prediction in regime ``prediction`` on ``device`` with
    ``communication_share`` of its step exposed communication
    (:func:`~planner.cost.regimes.communication_share`):
    at each of :data:`QUANTILES`, the spread of the errors of its :data:`NEAREST` nearest
    validated runs (:func:`nearest`) with their own exposed communication set apart, widened
    by :data:`WIDENING` times their mean distance and by :data:`COMMUNICATION` times the
    share (:meth:`Nearest.half_width`), never below their spread. ``utilization``, the
    predicted hardware FLOPs utilisation, is flagged when above the highest any run of the
    device's stack reached (:func:`utilization_above`)."""
    evidence = device.efficiency.evidence
    if not evidence:
        return _band_by_kind(device, kind_of(prediction.mechanisms))
    share = round(communication_share, 3)
    band = _memo(evidence, ("band", device.name, prediction, share),
                 lambda: _band(device, prediction, share))  # fmt: skip
    above = (None if utilization is None
             else utilization_above(device, prediction.stack, utilization))
    if above is None:
        return band
    return band.model_copy(update={"extrapolated": (*band.extrapolated, above)})


def _band(device: DeviceSpec, prediction: Regime, share: float) -> ErrorBand:
    """:func:`error_band` without the utilisation's check, on a device with evidence."""
    evidence = device.efficiency.evidence
    near = _memo(evidence, ("nearest", prediction), lambda: nearest(prediction, evidence))
    spread, widened = near.spread[0.8], near.half_width(0.8, share)
    families = ", ".join(sorted({r.family for r in near.runs}))
    closest = (f"the {len(near.runs)} nearest of {len(evidence)} validated runs on "
               f"{device.name} ({families}), 80 % within {_percent(spread)}")  # fmt: skip
    if widened > spread:
        apart = near.set_apart(0.8, COMMUNICATION[0.8])
        if _percent(apart) != _percent(spread):
            closest += f" ({_percent(apart)} net of their exposed communication)"
        reasons = []
        if WIDENING[0.8] * near.mean_distance >= 0.005:
            reasons.append(f"{_percent(WIDENING[0.8] * near.mean_distance)} for their "
                           f"distance {near.mean_distance:.1f}")  # fmt: skip
        if COMMUNICATION[0.8] * share >= 0.005:
            reasons.append(f"{_percent(COMMUNICATION[0.8] * share)} for the step's "
                           f"{_percent(share)} in exposed communication")
        if reasons:
            closest += ", widened " + " and ".join(reasons)
    least = near.nearest_spread
    if least is not None and least[0.8] > replace(near, nearest_spread=None).half_width(0.8,
                                                                                       share):
        closest += (f"; at least the {_percent(least[0.8])} the runs of this very regime "
                    f"missed by")  # fmt: skip
    return ErrorBand(fraction=round(widened, 4),
                     fraction_p95=round(near.half_width(0.95, share), 4),
                     runs=len(near.runs), parallelism=kind_of(prediction.mechanisms),
                     closest=closest, extrapolated=_memo(
                         evidence, ("gaps", device.name, prediction),
                         lambda: gaps(prediction, evidence, device.name)))


def run_utilization(run: ValidatedRun) -> float:
    """The hardware FLOPs utilisation ``run`` reached; its MFU in a file written before runs
    kept it."""
    return run.mfu if run.hfu is None else run.hfu


def highest_utilization(device: DeviceSpec, stack: Stack) -> float:
    """The highest hardware FLOPs utilisation (:func:`run_utilization`) any validated run of
    ``stack`` reached on ``device``; for a stack no run ran, the highest any stack reached
    there (a stack never checked is no licence to go above what every checked one reached);
    infinity without runs: nothing to be above."""
    evidence = device.efficiency.evidence
    stack = evidence_stack(stack)
    return _memo(evidence, ("utilization", stack), lambda: max(
        (run_utilization(r) for r in evidence if r.stack == stack),
        default=max((run_utilization(r) for r in evidence), default=math.inf)))


def memory_band(device: DeviceSpec, stack: Stack) -> MemoryBand:
    """The band of a peak predicted for ``stack`` on ``device``: the 80th and 95th
    percentiles of |error| of the peaks its validated runs of that stack measured (allocated,
    or nvidia-smi's memory in use where that is what a run gave). Memory errors come from
    what a stack keeps, not from the mechanisms (:mod:`planner.cost.activations`), so the
    band is the stack's (:func:`~planner.vocabulary.evidence_stack`'s), not the nearest
    runs'."""
    stack = evidence_stack(stack)
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


def utilization_above(device: DeviceSpec, stack: Stack,
                      utilization: float) -> Extrapolation | None:  # fmt: skip
    """The extrapolation of a hardware FLOPs ``utilization`` above
    :func:`highest_utilization`; None within it.

    Hardware FLOPs, not the model's: what the device is asked to sustain is the work it
    executes, recomputation included, and the runs that reach the highest rates recompute
    (Megatron-LM's A100 runs of Narayanan et al. all ran full recomputation, a third more work
    than their model FLOPs count), so a plan without recomputation is above their MFU at the
    very rate they ran at."""
    stack = evidence_stack(stack)
    best = highest_utilization(device, stack)
    if utilization <= best:
        return None
    evidence = device.efficiency.evidence
    ran = _memo(evidence, ("ran", stack), lambda: any(r.stack == stack for r in evidence))
    # One decimal where whole percents would print the two alike ("51 % above ... (51 %)").
    digits = 0 if _percent(utilization) != _percent(best) else 1
    return Extrapolation(feature="utilization", text=(
        f"hardware FLOPs {_percent(utilization, digits)} of peak, above the highest validated "
        f"on {device.name} with {stack if ran else 'any stack'} ({_percent(best, digits)})"))


def _percent(fraction: float, digits: int = 0) -> str:
    return f"{100 * fraction:.{digits}f} %"


BY_KIND_ONLY = ("; the file keeps bands by kind only, not what their runs ran (stacks, "
                "models, lengths), so what this prediction extrapolates is unknown: "
                "`planner validate RUNS --cluster FILE --write` records it")
"""What a band from an older file's table by kind adds to what it rests on: it cannot say
what it extrapolates (:func:`gaps` needs the runs' regimes)."""


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
                             f"within it{BY_KIND_ONLY}")  # fmt: skip
    if bands:
        runs = sum(b.runs for b in bands)
        # Each band holds 80 % of its runs, so the widest holds at least 80 % of them all.
        return ErrorBand(fraction=max(b.p80_abs_error for b in bands), runs=runs,
                         parallelism=kind,
                         closest=f"widest over {runs} runs on {name} (none "
                         f"{kind}){BY_KIND_ONLY}")  # fmt: skip
    gemm = device.efficiency.gemm
    roofline = (gemm.max_fraction, gemm.half_saturation_gflop) == (
        GemmEfficiency().max_fraction, GemmEfficiency().half_saturation_gflop)
    efficiency = device.efficiency
    # a file with a fitted GEMM curve may still leave the rest at the data sheet's figures
    unfitted = [what for what, at in (
        ("HBM at its data sheet's bandwidth", efficiency.memory_bound_fraction == 1.0),
        ("kernels launched for free", efficiency.kernel_launch_us == 0.0),
        ("attention on the GEMM curve", efficiency.attention is None)) if at]
    closest = (f"no validated runs on {name}; the data sheet's roofline" if roofline
               else f"no validated runs on {name}, accuracy not measured"
               + (f"; {', '.join(unfitted)}" if unfitted else ""))  # fmt: skip
    return ErrorBand(fraction=None, runs=0, parallelism=kind, closest=closest)
