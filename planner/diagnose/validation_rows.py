"""A published run against its estimate: the row ``planner validate`` prints for it, and the
function that prices runs into rows (:func:`validation_rows`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from planner import cost
from planner.cost.memory import allocator_slack_bytes
from planner.cost.regimes import communication_share, config_mechanisms, parallelism_kind, regime_of
from planner.diagnose.fit import cluster_of, sized_for
from planner.diagnose.runs import CalibrationRun
from planner.errors import InputError
from planner.graph import forward_flops
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, Regime
from planner.uniform.estimate import estimate
from planner.vocabulary import COMPILED_STACKS, FP8_STACKS, FUSED_LOSS_STACKS, GIB, ZERO_BUBBLE


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """A published run against its estimate."""

    id: str
    """The record's id."""
    device: str
    """The device key (:attr:`planner.diagnose.runs.CalibrationRun.device`)."""
    family: str
    """The framework family that ran it."""
    parallelism: str
    """Its kind of parallelism (:func:`planner.cost.regimes.parallelism_kind`)."""
    num_devices: int
    """Devices (GPUs) of the run."""
    config: str
    """The configuration as a user would say it (:func:`describe`)."""
    measured_s: float | None
    """The measured step time (None: the run ran out of memory before one was measured)."""
    predicted_s: float
    """The estimated step time."""
    basis: str
    """How the measured step time was obtained from the record."""
    peak_memory_gib: float
    """The estimated peak memory per device, its reserve included (what fitting compares
    with the device's memory)."""
    predicted_fits: bool
    """Whether the estimate fits the device's memory with its stack's margin
    (:data:`~planner.cost.MEMORY_MARGIN`): what the search would accept."""
    predicted_over: bool = False
    """Whether the estimate is over the device's memory, margin aside: the prediction that
    the run cannot run. Between the two, the run is predicted to fit within the margin."""
    predicted_peak_memory_gib: float
    """The estimated peak allocated to tensors (``torch.cuda.max_memory_allocated``): the
    peak less its reserve."""
    predicted_reserved_memory_gib: float
    """The estimated peak the caching allocator reserves (``max_memory_reserved``): the
    allocated peak and the allocator's slack."""
    measured_peak_memory_gib: float | None = None
    """The measured allocated peak, where the record has it."""
    measured_reserved_memory_gib: float | None = None
    """The measured reserved peak, where the record has it."""
    measured_device_memory_gib: float | None = None
    """The device memory in use as nvidia-smi showed it, where the record has it: compared with
    :attr:`peak_memory_gib`, which counts what nvidia-smi sees (context, NCCL, the cache)."""
    measured_oom: bool = False
    """Whether the run ran out of memory (a published run that does not say ran)."""
    cluster: str = ""
    """The cluster file it was priced on (its ``name``): its device's, a site's
    (:data:`planner.diagnose.runs.SITES`) or the user's."""
    regime: Regime
    """Where it sits in the features the error bands measure distance in
    (:func:`planner.cost.regimes.regime_of`)."""
    mfu: float
    """Its model FLOPs utilisation: the predicted one at the measured step time (the
    predicted where none was measured)."""
    hfu: float
    """Its hardware FLOPs utilisation (:attr:`~planner.cost.rates.Throughput.hfu`), likewise
    at the measured step time."""
    communication_share: float = 0.0
    """The share of its predicted step that is exposed communication
    (:func:`planner.cost.regimes.communication_share`)."""

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1`` of the step time; None without a measured one."""
        return None if self.measured_s is None else self.predicted_s / self.measured_s - 1

    @property
    def memory_error(self) -> float | None:
        """``predicted / measured - 1`` of the allocated peak; None where not measured."""
        measured = self.measured_peak_memory_gib
        return None if measured is None else self.predicted_peak_memory_gib / measured - 1

    @property
    def reserved_error(self) -> float | None:
        """``predicted / measured - 1`` of the reserved peak; None where not measured."""
        measured = self.measured_reserved_memory_gib
        return None if measured is None else self.predicted_reserved_memory_gib / measured - 1

    @property
    def device_memory_error(self) -> float | None:
        """``predicted / measured - 1`` of the device memory in use (the whole peak against
        nvidia-smi's snapshot, which is at most the peak); None where not measured."""
        measured = self.measured_device_memory_gib
        return None if measured is None else self.peak_memory_gib / measured - 1

    @property
    def fit_missed(self) -> bool:
        """The fit verdict is wrong: a run that ran predicted over the device's memory, or one
        that ran out of memory predicted to fit beside its margin. A prediction within the
        margin misses neither way: the margin is the memory model's own uncertainty."""
        return self.predicted_fits if self.measured_oom else self.predicted_over

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with the errors and the verdict."""
        return asdict(self) | {"regime": self.regime.model_dump(mode="json"),
                               "error": self.error, "memory_error": self.memory_error,
                               "reserved_error": self.reserved_error,
                               "device_memory_error": self.device_memory_error,
                               "fit_missed": self.fit_missed}  # fmt: skip


def describe(config: ParallelConfig) -> str:
    """A configuration as a user would say it: ``TP8 PP16 DP8 mbs1 full-recompute``; an
    uneven pipeline says the end stages that differ (``PP12 (first 5, last 5 layers)``),
    context parallelism how it attends unless by the ring (``CP16-allgather``)."""
    ends = [f"{end} {n}" for end, n in (("first", config.first_stage_layers),
                                        ("last", config.last_stage_layers)) if n is not None]
    pp = f"PP{config.pp}" + (f" ({', '.join(ends)} layers)" if ends else "")
    parts = [f"TP{config.tp}", pp, f"DP{config.dp}"]
    attends = {"ring": "", "ulysses": "-Ulysses", "allgather": "-allgather"}[config.cp_algo]
    parts += [f"CP{config.cp}{attends}"] * (config.cp > 1)
    parts += [f"{k.upper()}{v}" for k, v in (("ep", config.ep), ("vpp", config.vpp)) if v > 1]
    parts += ["ETP1"] * (config.etp == 1 and config.tp > 1)
    parts += ["DeepEP"] * (config.moe_dispatcher == "deepep")
    parts += [config.schedule.upper()] * (config.schedule in ZERO_BUBBLE)
    parts += ["SP"] * config.sp + [f"mbs{config.mbs}"]
    parts += [f"{config.recompute}-recompute"] * (config.recompute != "none")
    parts += [f"({config.recompute_modules})"] * (config.recompute_modules is not None)
    n = config.recompute_layers or 0
    parts += [f"({n} layer{'s' * (n > 1)} per chunk)"] * (n > 0)
    parts += [f"ZeRO-{config.zero}"] * (config.zero > 0)
    parts += ["bf16-moments"] * (config.optimizer_moments == "bf16")
    parts += ["EP-all-to-all-overlap"] * config.overlap_moe_expert_parallel_comm
    parts += ["FP8"] * (config.stack in FP8_STACKS)
    parts += ["fused-loss"] * (config.stack in FUSED_LOSS_STACKS)
    parts += ["compiled"] * (config.stack in COMPILED_STACKS)
    offloads = {"none": [], "optimizer": ["optimizer-offload"], "zero-offload": ["zero-offload"]}
    return " ".join(parts + offloads[config.offload])


def kind_of(config: ParallelConfig) -> str:
    """The run's kind of parallelism, as the error bands group runs."""
    return parallelism_kind(tensor_parallel=config.tp, pipeline_parallel=config.pp,
                            context_parallel=config.cp, expert_parallel=config.ep,
                            zero=config.zero)  # fmt: skip


def validation_rows(
    runs: Sequence[CalibrationRun], clusters: Mapping[str, ClusterSpec]
) -> list[ValidationRow]:
    """Estimate every run on the cluster of its device (:func:`~planner.diagnose.fit.sized_for`
    its devices)."""
    rows = []
    for run in runs:
        try:
            cluster = sized_for(run, cluster_of(run, clusters))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        est = estimate(run.model, cluster, run.config)
        allocated = est.memory.allocated_gib
        training = resolve(run.model, cluster, run.config).training
        regime = regime_of(training, cluster, moe=run.model.moe is not None,
                           used=config_mechanisms(run.config),
                           forward_flops_per_sequence=forward_flops(run.model, training, 1))
        measured = run.measured_step_time_s
        at_measured = 1.0 if measured is None else est.step_time_s / measured
        rows.append(ValidationRow(
            id=run.id, device=run.device, family=run.family, parallelism=kind_of(run.config),
            num_devices=run.num_devices, config=describe(run.config),
            measured_s=run.measured_step_time_s, predicted_s=est.step_time_s, basis=run.basis,
            peak_memory_gib=est.peak_memory_gib, predicted_fits=est.fits,
            predicted_over=not cost.fits(est.peak_memory_gib * GIB, cluster.device,
                                         margin_gib=0.0),
            predicted_peak_memory_gib=allocated,
            predicted_reserved_memory_gib=allocated + allocator_slack_bytes(
                cluster.device, allocated * GIB) / GIB,
            measured_peak_memory_gib=run.measured_peak_memory_gib,
            measured_reserved_memory_gib=run.measured_reserved_memory_gib,
            measured_device_memory_gib=run.measured_device_memory_gib,
            measured_oom=run.measured_oom, cluster=cluster.name, regime=regime,
            mfu=est.mfu * at_measured,
            hfu=est.hardware_tflops_per_gpu * 1e12 / cluster.device.peak_flops_per_s(
                training.precision) * at_measured,
            communication_share=communication_share(est.time.model_dump()),
        ))  # fmt: skip
    return rows
