"""Fitting a device's efficiency block to the bench's timings.

The fitted quantities are those of :class:`planner.spec.DeviceEfficiency` that kernels alone
show: ``memory_bound_fraction`` and ``kernel_launch_us`` from the memory-bound kernels, the
GEMM curve (``gemm.max_fraction``, ``gemm.half_saturation_gflop``) from the GEMMs, and the
attention curve from the fused attention kernels, in that order, each with the ones before
it fixed. Every prediction is the cost model's own (:func:`planner.cost.compute_time_s`,
:func:`planner.cost.attention_fraction`, :func:`planner.cost.optimizer_step_s`): the fit
never restates a formula, so what it writes is what the planner prices with. The residual is
the log of predicted over measured time, so a kernel of 5 us weighs as much as one of 5 ms,
under a soft-L1 loss so that a few kernels far off the curve do not move it.

``overlap_contention`` and the validation bands come from whole training runs (``planner
calibrate``), not from kernels: the first is kept, the second dropped on a write, since the
residuals it holds were of the block being replaced.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.cost import (
    compute_time_s,
    device_fp8_speedup,
    fused_attention_s,
    optimizer_step_s,
)
from planner.diagnose.bench_cases import BenchCase, BenchKind
from planner.diagnose.bench_torch import Timings
from planner.diagnose.evidence import cluster_json
from planner.diagnose.expert_gemms import ExpertGemm, fit_grouped_gemm, priced_s
from planner.errors import InputError
from planner.spec import (
    AttentionEfficiency,
    DeviceEfficiency,
    DeviceSpec,
    Fp8Efficiency,
    GemmEfficiency,
)
from planner.spec import limits as lim
from planner.spec.reading import load_cluster, read_json
from planner.vocabulary import AttentionKernel, Precision

OUTLIER_SCALE = 0.05
"""Log residuals beyond about 5 % weigh less than their square (soft-L1, as ``planner
calibrate`` fits runs): one kernel slowed by something else on the machine, or one the
roofline does not describe, does not drag the curve away from the rest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One timed kernel against the cost model before and after the fit."""

    label: str
    """Where its shape comes from."""
    kind: BenchKind
    """The part of the block it measures."""
    shape: tuple[int, ...]
    """Its shape (:attr:`BenchCase.shape`)."""
    flops: float
    """FLOPs priced."""
    bytes_moved: float
    """Bytes priced."""
    measured_s: float
    """Seconds per call (the fastest timed batch's)."""
    before_s: float
    """Predicted with the cluster file as it was."""
    after_s: float
    """Predicted with the fitted block."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchFit:
    """A device's efficiency block fitted to the bench."""

    cluster: str
    """The cluster file."""
    device: str
    """Its device's name."""
    timings: Timings
    """What was measured, and on what."""
    before: DeviceEfficiency
    """The block as the file had it."""
    after: DeviceEfficiency
    """The fitted block."""
    rows: tuple[BenchRow, ...]
    """Every case that ran."""
    notes: tuple[str, ...]
    """What the fit could not pin and kept, and what a write drops."""
    source: str
    """What the fitted parts' ``source`` says after a write."""
    updated_json: str
    """The cluster file with the fitted block in, every other key where it was."""

    def median_error(self, kind: BenchKind, *, fitted: bool) -> float:
        """Median of |predicted / measured - 1| over the cases of ``kind``."""
        errors = [abs((r.after_s if fitted else r.before_s) / r.measured_s - 1)
                  for r in self.rows if r.kind == kind]  # fmt: skip
        return statistics.median(errors) if errors else float("nan")


def predicted_s(case: BenchCase, device: DeviceSpec, precision: Precision) -> float:
    """The cost model's seconds for ``case`` on ``device``, as it prices the op the case
    stands for (:func:`planner.cost.op_time`'s roofline; Adam as the optimizer step)."""
    if case.kind == "optimizer":
        return optimizer_step_s(device, precision, params=case.shape[0])
    if case.kind == "grouped_gemm":
        return priced_s(_expert_gemm(case, 0.0), device)
    if case.kind == "attention":
        return fused_attention_s(device, precision, flops=case.flops,
                                 bytes_moved=case.bytes_moved, calls=case.calls,
                                 keys_per_query=case.keys_per_query, head_dim=case.head_dim,
                                 backward=case.kernel == "attention_backward")  # fmt: skip
    speedup = device_fp8_speedup(device) if case.kind == "fp8_gemm" else 1.0
    return compute_time_s(device, precision, flops=case.flops, bytes_moved=case.bytes_moved,
                          calls=case.calls, speedup=speedup)  # fmt: skip


def _expert_gemm(case: BenchCase, seconds: float) -> ExpertGemm:
    """A grouped-GEMM case as the expert GEMMs' fit reads one, timed at ``seconds``."""
    experts, tokens, k, n = case.shape
    return ExpertGemm(label=case.label, experts=experts, tokens_per_expert=tokens, k=k, n=n,
                      grouped_s=seconds, bmm_s=seconds)  # fmt: skip


def with_efficiency(device: DeviceSpec, **changes: object) -> DeviceSpec:
    """``device`` with the fields ``changes`` names of its efficiency block replaced."""
    efficiency = device.efficiency.model_copy(update=changes)
    return device.model_copy(update={"efficiency": efficiency})


def _fit(cases: Sequence[BenchCase], measured: np.ndarray, precision: Precision,
         make: Callable[[np.ndarray], DeviceSpec], start: Sequence[float],
         bounds: tuple[Sequence[float], Sequence[float]]) -> np.ndarray:
    """Robust least squares of log(predicted / measured) over ``cases`` (soft-L1 at
    :data:`OUTLIER_SCALE`), the device built from the parameters by ``make``."""
    from scipy.optimize import least_squares  # scipy loads only when a fit runs

    def residuals(x: np.ndarray) -> np.ndarray:
        device = make(x)
        return np.log([predicted_s(c, device, precision) for c in cases]) - np.log(measured)

    lower, upper = np.array(bounds[0], float), np.array(bounds[1], float)
    x0 = np.clip(np.array(start, float), lower, upper)
    return least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", loss="soft_l1",
                         f_scale=OUTLIER_SCALE).x


def _check_peak(cluster: str, device: DeviceSpec, what: str, fraction: float, achieved: str,
                limit: str) -> None:
    if fraction > 1:
        raise InputError(f"{cluster}: {what} ran at {achieved}, above device {device.name}'s "
                         f"{limit}; expected the cluster file of the device that was measured")


def fit_bench(
    cluster_path: str | Path,
    cases: Sequence[BenchCase],
    timings: Timings,
    *,
    model_name: str,
    seq_length: int,
    date: str | None = None,
) -> BenchFit:
    """Fit the cluster's device to the bench's ``timings`` of ``cases`` (run on that device at
    ``timings.precision``), returning the fitted block and the file with it written in."""
    cluster_path = Path(cluster_path)
    device = load_cluster(cluster_path).device
    precision = timings.precision
    ran = [(c, s) for c, s in zip(cases, timings.seconds, strict=True) if s is not None]

    def of(kind: BenchKind) -> tuple[list[BenchCase], np.ndarray]:
        picked = [(c, s) for c, s in ran if c.kind == kind]
        return [c for c, _ in picked], np.array([s for _, s in picked])

    notes: list[str] = []
    fitted = _fit_memory_bound(cluster_path, device, *of("memory"), precision)
    fitted = _fit_gemms(cluster_path, device, fitted, *of("gemm"), precision)
    attention, t_attention = of("attention")
    if attention:
        # What the runner calls (bench_torch.py): PyTorch's SDPA on CUDA, Ascend's FA on NPU.
        kernel: AttentionKernel = "ascend-fa" if timings.backend == "npu" else "torch-sdpa"
        curve = fit_attention(str(cluster_path), attention, t_attention, fitted, precision,
                              notes, kernel)
        fitted = with_efficiency(fitted, attention=curve)
    else:
        notes.append("no attention kernel ran: the attention curve is kept as it was")
        fitted = with_efficiency(fitted, attention=device.efficiency.attention)
    notes += _replaced_notes(device)
    counts = {k: sum(c.kind == k for c, _ in ran)
              for k in ("gemm", "grouped_gemm", "attention", "memory")}  # fmt: skip
    source = (f"measured by `planner bench` on {timings.device_name} ({timings.backend}, torch "
              f"{timings.torch_version}) in {precision}, {date or datetime.date.today()}, with "
              f"{model_name}'s shapes at sequence {seq_length}: {counts['gemm']} GEMMs, "
              f"{counts['grouped_gemm']} grouped expert GEMMs, "
              f"{counts['attention']} attention kernels, {counts['memory']} memory-bound "
              f"kernels; robust (soft-L1) least squares on log time through the cost "
              f"model's roofline")
    fitted = _fit_grouped(fitted, *of("grouped_gemm"), timings.backend, source, notes)
    fitted = _fit_fp8(fitted, *of("fp8_gemm"), precision, source, notes,
                      asked=any(c.kind == "fp8_gemm" for c in cases))  # fmt: skip
    rows = tuple(BenchRow(label=c.label, kind=c.kind, shape=c.shape, flops=c.flops,
                          bytes_moved=c.bytes_moved, measured_s=s,
                          before_s=predicted_s(c, device, precision),
                          after_s=predicted_s(c, fitted, precision)) for c, s in ran)
    return BenchFit(cluster=str(cluster_path), device=device.name, timings=timings,
                    before=device.efficiency, after=fitted.efficiency, rows=rows,
                    notes=tuple(notes), source=source,
                    updated_json=_updated(cluster_path, fitted.efficiency, source))


def _fit_memory_bound(
    cluster_path: Path, device: DeviceSpec, memory: list[BenchCase], t_memory: np.ndarray,
    precision: Precision,
) -> DeviceSpec:  # fmt: skip
    """``device`` with its memory-bound fraction and kernel launch cost fitted to the
    memory-bound kernels' times."""
    if len(memory) < 2:
        raise InputError(f"{cluster_path}: fewer than two memory-bound kernels ran; expected "
                         f"their times to fit the memory-bound fraction and launch cost")
    fraction, launch = _fit(
        memory, t_memory, precision,
        lambda x: with_efficiency(device, memory_bound_fraction=min(x[0], 1.0),
                                  kernel_launch_us=x[1]),
        (device.efficiency.memory_bound_fraction, device.efficiency.kernel_launch_us or 1.0),
        ((1e-4, 0.0), (1.0, lim.MAX_LATENCY_US)))
    # The fit stops at the data sheet's bandwidth; the largest add says whether the data wanted
    # more (a small add's time is nearly all launch, and its remainder says nothing).
    largest = max(range(len(memory)), key=lambda i: memory[i].bytes_moved)
    spent = max(float(t_memory[largest]) - launch * 1e-6, 1e-12)
    best = memory[largest].bytes_moved / spent / device.memory_bandwidth_bytes_s
    _check_peak(str(cluster_path), device, "memory-bound kernels", best,
                f"{best * device.memory_bandwidth_gb_s:.0f} GB/s",
                f"memory_bandwidth_gb_s {device.memory_bandwidth_gb_s:g}")
    return with_efficiency(device, memory_bound_fraction=round(float(fraction), 4),
                           kernel_launch_us=round(float(launch), 2))


def _fit_gemms(
    cluster_path: Path, device: DeviceSpec, fitted: DeviceSpec, gemms: list[BenchCase],
    t_gemm: np.ndarray, precision: Precision,
) -> DeviceSpec:  # fmt: skip
    """``fitted`` with its GEMM curve fitted to the GEMMs' times (checked against
    ``device``'s peak)."""
    if not gemms:
        raise InputError(f"{cluster_path}: no GEMM ran; expected their times to fit the GEMM "
                         f"curve")
    peak = device.peak_flops_per_s(precision)
    fastest = max(c.flops / s for c, s in zip(gemms, t_gemm, strict=True))
    _check_peak(str(cluster_path), device, "GEMMs", fastest / peak,
                f"{fastest / 1e12:.1f} TFLOP/s", f"{precision} peak {peak / 1e12:g} TFLOP/s")
    gmax, ghalf = _fit(
        gemms, t_gemm, precision,
        lambda x: with_efficiency(fitted, gemm=GemmEfficiency(max_fraction=x[0],
                                                              half_saturation_gflop=x[1])),
        (fastest / peak, 1.0), ((1e-6, 0.0), (1.0, lim.MAX_HALF_SATURATION_GFLOP)))
    return with_efficiency(fitted, gemm=GemmEfficiency(
        max_fraction=round(float(gmax), 4), half_saturation_gflop=round(float(ghalf), 3)))


def _fit_grouped(fitted: DeviceSpec, cases: list[BenchCase], measured: np.ndarray,
                 backend: str, source: str, notes: list[str]) -> DeviceSpec:
    """``fitted`` with its grouped-GEMM curve fitted to the grouped expert GEMMs' times
    (:func:`~planner.diagnose.expert_gemms.fit_grouped_gemm`, through the launch cost and
    roofline just fitted), or kept, with a note, when none ran."""
    if not cases:
        notes.append("no grouped expert GEMM ran (a dense model, or not bf16): the "
                     "grouped-GEMM curve is kept as it was")
        return fitted
    if backend != "cuda":
        notes.append(f"the grouped expert GEMMs ran as one torch.bmm each on {backend} "
                     f"(torch._grouped_mm is CUDA's): the curve is the batched GEMM's")
    gemms = [_expert_gemm(c, float(t)) for c, t in zip(cases, measured, strict=True)]
    curve = fit_grouped_gemm(gemms, fitted, source=f"grouped_gemm: {source}")
    return with_efficiency(fitted, grouped_gemm=curve)


def _fit_fp8(fitted: DeviceSpec, cases: list[BenchCase], measured: np.ndarray,
             precision: Precision, source: str, notes: list[str], *, asked: bool) -> DeviceSpec:
    """``fitted`` with the FP8 speedup that prices the FP8 twins of the forward GEMMs
    (:func:`~planner.diagnose.bench_cases.fp8_gemm_cases`) as they ran, through the launch
    cost and roofline just fitted; kept when none ran (with a note if they were asked for)."""
    if not cases:
        if asked:
            notes.append("no FP8 GEMM ran (see below): the FP8 speedup is kept as it was")
        return fitted
    (speedup,) = _fit(cases, measured, precision, lambda x: with_efficiency(
        fitted, fp8=Fp8Efficiency(gemm_speedup=float(x[0]))), start=[1.5],
        bounds=([0.01], [lim.MAX_FP8_SPEEDUP]))  # fmt: skip
    return with_efficiency(fitted, fp8=Fp8Efficiency(
        gemm_speedup=round(float(speedup), 3),
        source=f"fp8: {len(cases)} forward GEMMs on FP8 operands (torch._scaled_mm, E4M3, "
               f"per-tensor scales) beside their 16-bit twins, {source}"))  # fmt: skip


def _replaced_notes(device: DeviceSpec) -> list[str]:
    """What the fit replaces in ``device``'s file that a user should know of."""
    notes = []
    if "planner calibrate" in (device.efficiency.gemm.source or ""):
        notes.append("the file's GEMM curve was fitted to whole training runs (`planner "
                     "calibrate`), which lose time outside the kernels (launch gaps, unfused "
                     "ops, communication beside compute): steps priced with the kernels' "
                     "curve usually come out faster than those runs measured")
    if device.efficiency.validation or device.efficiency.evidence:
        notes.append("the validated runs the error bands rest on (their errors with the old "
                     "block) are dropped on --write: `planner validate RUNS --cluster FILE "
                     "--write` with runs on this device measures the new block's error")
    return notes


def fit_attention(cluster: str, cases: Sequence[BenchCase], measured: np.ndarray,
                   device: DeviceSpec, precision: Precision, notes: list[str],
                   kernel: AttentionKernel | None = None) -> AttentionEfficiency:
    """The attention curve, each half-saturation term fitted only when the kernels vary what
    it describes (else kept from the file, or 0); the backward's rate and each pass's fixed
    cost per call when both passes ran."""
    old = device.efficiency.attention
    both = {c.kernel for c in cases} == {"attention_forward", "attention_backward"}
    free = {"tokens": len({c.keys_per_query for c in cases}) > 1,
            "head_dim": len({c.head_dim for c in cases}) > 1,
            "backward": both, "forward_us": both, "backward_us": both}
    kept = {"tokens": old.half_saturation_tokens if old else 0.0,
            "head_dim": old.half_saturation_head_dim if old else 0.0,
            "backward": old.backward_fraction if old else 1.0,
            "forward_us": old.forward_call_us if old else 0.0,
            "backward_us": old.backward_call_us if old else 0.0}
    for term in ("tokens", "head_dim"):
        if not free[term]:
            notes.append(f"the attention kernels ran at one {term.replace('_', ' ')}: its "
                         f"half-saturation term is kept at {kept[term]:g}")
    names = ["max"] + [t for t in kept if free[t]]
    peak = device.peak_flops_per_s(precision)
    fastest = max(c.flops / s for c, s in zip(cases, measured, strict=True)) / peak
    _check_peak(cluster, device, "attention", fastest, f"{fastest * peak / 1e12:.1f} TFLOP/s",
                f"{precision} peak {peak / 1e12:g} TFLOP/s")

    def curve(x: np.ndarray) -> AttentionEfficiency:
        values = kept | dict(zip(names, x, strict=True))
        return AttentionEfficiency(
            max_fraction=values["max"], half_saturation_tokens=values["tokens"],
            half_saturation_head_dim=values["head_dim"], backward_fraction=values["backward"],
            forward_call_us=values["forward_us"], backward_call_us=values["backward_us"],
            kernel=kernel)  # fmt: skip

    upper = {"max": 1.0, "tokens": lim.MAX_SEQ_LENGTH, "head_dim": lim.MAX_HEAD_DIM,
             "backward": 2.0, "forward_us": lim.MAX_LATENCY_US,
             "backward_us": lim.MAX_LATENCY_US}  # fmt: skip
    # From the fastest kernel's fraction, not the file's: a start far below the data leaves
    # every kernel on the roofline's memory side, where the curve has no gradient.
    start = {"max": fastest, "tokens": max(kept["tokens"], 64.0),
             "head_dim": max(kept["head_dim"], 16.0), "backward": kept["backward"],
             "forward_us": max(kept["forward_us"], 10.0),
             "backward_us": max(kept["backward_us"], 10.0)}  # fmt: skip
    x = _fit(cases, measured, precision, lambda x: with_efficiency(device, attention=curve(x)),
             [start[n] for n in names],
             ([1e-6 if n in ("max", "backward") else 0.0 for n in names],
              [upper[n] for n in names]))  # fmt: skip
    fitted = curve(x)
    fields = {"max": "max_fraction", "tokens": "half_saturation_tokens",
              "head_dim": "half_saturation_head_dim", "backward": "backward_fraction",
              "forward_us": "forward_call_us", "backward_us": "backward_call_us"}  # fmt: skip
    # a term on its ceiling is the ceiling's, not the kernels' (a loaded machine's timings put
    # the backward's rate at 2.0 and the head-dim term at 4,096, written unsaid)
    notes += [f"attention.{fields[n]} is at its bound, {upper[n]:g}: the kernels do not pin it"
              for n, value in zip(names, x, strict=True) if value >= upper[n] * (1 - 1e-6)]
    return fitted.model_copy(update={
        "max_fraction": round(fitted.max_fraction, 4),
        "half_saturation_tokens": round(fitted.half_saturation_tokens, 1),
        "half_saturation_head_dim": round(fitted.half_saturation_head_dim, 2),
        "backward_fraction": round(fitted.backward_fraction, 4),
        "forward_call_us": round(fitted.forward_call_us, 1),
        "backward_call_us": round(fitted.backward_call_us, 1)})


def _updated(path: Path, efficiency: DeviceEfficiency, source: str) -> str:
    """The cluster file's JSON with the device's fitted fields replaced, each with
    ``source``; ``overlap_contention`` and every other key kept where it was, the validated
    runs (and the bands by kind of older files) dropped: their errors were the old block's."""
    data = read_json(path)
    block = data["device"].get("efficiency") or {}
    block["gemm"] = {"max_fraction": efficiency.gemm.max_fraction,
                     "half_saturation_gflop": efficiency.gemm.half_saturation_gflop,
                     "source": source}  # fmt: skip
    if efficiency.attention is not None:
        curve = efficiency.attention
        # Every field of the curve (the fixed costs, the backward's rate and the kernel too).
        block["attention"] = curve.model_dump(mode="json", exclude_none=True) | {
            "source": curve.source or source}
    for curve in ("grouped_gemm", "fp8"):
        if getattr(efficiency, curve) is not None:
            block[curve] = getattr(efficiency, curve).model_dump(mode="json", exclude_none=True)
    block["memory_bound_fraction"] = efficiency.memory_bound_fraction
    block["kernel_launch_us"] = efficiency.kernel_launch_us
    block["source"] = f"memory_bound_fraction, kernel_launch_us: {source}"
    block.pop("validation", None)
    block.pop("evidence", None)
    data["device"]["efficiency"] = block
    return cluster_json(data)
