"""A step's rates: tokens per second, model and hardware FLOP/s per device, MFU; and the
headline numbers a plan records, with their error band."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.regimes import communication_share, regime_of
from planner.cost.step import StepCost
from planner.cost.uncertainty import error_band, memory_band
from planner.plan.schema import Predicted
from planner.spec import ClusterSpec, TrainingSpec
from planner.vocabulary import GIB, Mechanism


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """A step's rates: tokens, model and hardware FLOP/s per device, model FLOPs utilisation."""

    tokens_per_s: float
    """Tokens trained per second."""
    model_tflops_per_gpu: float
    """Model FLOPs (three times the forward's) per second and device, in TFLOP/s."""
    hardware_tflops_per_gpu: float
    """Model FLOPs plus recomputation per second and device, in TFLOP/s."""
    mfu: float
    """Model FLOPs utilisation: model FLOP/s over the device's peak."""
    hfu: float
    """Hardware FLOPs utilisation: hardware FLOP/s over the device's peak, the rate the error
    band holds against the validated runs' (:func:`~planner.cost.uncertainty.
    utilization_above`)."""
    forward_flops_per_sequence: float
    """Model FLOPs of one sequence's forward: the model's size as the error bands measure it
    (:func:`~planner.cost.regimes.regime_of`)."""


def throughput(
    step_s: float,
    training: TrainingSpec,
    cluster: ClusterSpec,
    *,
    forward_flops_per_sequence: float,
    executed_flops_per_sequence: float,
    recompute_flops_per_sequence: float,
) -> Throughput:
    """A step's rates. Model FLOPs are three times the forward's, full attention scores
    included (forward, and backward twice: Narayanan et al., SC'21, Eq. 3; the convention MFU
    is reported in). Hardware FLOPs are what the GPUs execute
    (:func:`planner.cost.executed_flops`: fused causal attention computes half the scores and
    recomputes them in its backward) plus the forward work recomputation reruns; they are
    timed by the same cost model, so hardware FLOP/s never exceed the device's peak."""
    sequences = training.global_batch_size
    model = 3 * forward_flops_per_sequence * sequences
    hardware = (executed_flops_per_sequence + recompute_flops_per_sequence) * sequences
    per_device_s = step_s * cluster.num_devices
    peak = cluster.device.peak_flops_per_s(training.precision)
    return Throughput(
        tokens_per_s=sequences * training.seq_length / step_s,
        model_tflops_per_gpu=model / per_device_s / 1e12,
        hardware_tflops_per_gpu=hardware / per_device_s / 1e12,
        mfu=model / per_device_s / peak,
        hfu=hardware / per_device_s / peak,
        forward_flops_per_sequence=forward_flops_per_sequence,
    )


def headline(
    step: StepCost, rates: Throughput, *, cluster: ClusterSpec, training: TrainingSpec,
    moe: bool, used: tuple[Mechanism, ...], profiled: tuple[str, ...] = (),
) -> Predicted:
    """A priced step's headline numbers as a plan records them, with the error band of its
    regime (the mechanisms ``used``, :func:`~planner.cost.regimes.regime_of`) on the
    cluster's device (:mod:`planner.cost.uncertainty`): every planner (the search's assembly,
    ``estimate``) reports these through this one function; ``profiled``: what a layer profile
    measured of it (:func:`~planner.cost.profiled.profile_coverage`)."""
    regime = regime_of(training, cluster, used=used, moe=moe,
                       forward_flops_per_sequence=rates.forward_flops_per_sequence)  # fmt: skip
    return Predicted(
        step_time_s=step.step_s,
        time=step.time,
        tokens_per_s=rates.tokens_per_s,
        model_tflops_per_gpu=rates.model_tflops_per_gpu,
        hardware_tflops_per_gpu=rates.hardware_tflops_per_gpu,
        mfu=rates.mfu,
        peak_memory_gib=step.peak_memory_bytes.total / GIB,
        bubble_fraction=step.bubble_fraction,
        error_band=error_band(cluster.device, regime, utilization=rates.hfu,
                              communication_share=communication_share(step.time.model_dump())),
        memory_band=memory_band(cluster.device, training.stack),
        profiled=profiled,
    )
