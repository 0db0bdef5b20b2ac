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

from pydantic import ValidationError

from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.spec import ClusterSpec, GemmEfficiency, ModelSpec
from planner.spec.limits import MAX_DEVICES
from planner.spec.messages import describe_validation_error, short_repr
from planner.spec.reading import load_cluster, read_json
from planner.uniform.estimate import estimate


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRun:
    """One published run, ready to estimate."""

    id: str
    """The record's id in ``calibration_runs.json``."""
    model: ModelSpec
    """The model the record describes (:func:`model_from_record`)."""
    config: ParallelConfig
    """The configuration it ran with (:func:`config_from_record`)."""
    num_devices: int
    """Devices (GPUs) of the run."""
    device: str
    """``A100`` or ``H100``: which bundled cluster type ran it."""
    measured_step_time_s: float
    """The step time the record gives or implies (:func:`measured_step_time_s`)."""
    basis: str
    """How the measured step time was obtained from the record."""


def narayanan_eq3_flops(*, batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one step with full recomputation, Narayanan et al. (SC'21) Eq. 3:
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab  # noqa: E741 (the paper's letters)
    return 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))


def model_flops_eq(*, batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one step (no recomputation), Korthikanti et al. (MLSys'23) Eq. 7:
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab  # noqa: E741 (the paper's letters)
    return 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))


def _is_megatron_core_2024(record: dict[str, Any]) -> bool:
    # The 2024 Megatron-Core table states its flags; the 2021 runs predate all of them.
    return "--tp-comm-overlap" in record["source"]


def model_from_record(record: dict[str, Any]) -> ModelSpec:
    """The GPT model a record describes (Megatron's GPT: GeLU, LayerNorm, biases, dropout 0.1
    as Megatron-LM's defaults; tied learned positions for the 2021 runs, untied RoPE for the
    2024 table, whose parameter counts imply it)."""
    m = record["model"]
    modern = _is_megatron_core_2024(record)
    return ModelSpec(
        name=m["name"],
        num_layers=m["layers"],
        hidden_size=m["hidden"],
        num_attention_heads=m["heads"],
        num_query_groups=m.get("kv_heads") or m["heads"],
        ffn_hidden_size=m["ffn_hidden"],
        vocab_size=m["vocab"],
        max_position_embeddings=m["seq_len"],
        position_embedding="rope" if modern else "learned",
        tie_word_embeddings=not modern,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )


def config_from_record(record: dict[str, Any]) -> ParallelConfig:
    """The configuration a record ran with; open fields take the software's defaults.

    2021 Megatron-LM (Narayanan et al.; the GPT-3 README example): no fused attention, no
    communication overlap, no distributed optimizer. 2024 Megatron-Core table: the flags its
    README lists (``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap``, the
    distributed optimizer, sequence parallelism, which tensor-parallel overlap needs), fused
    attention; microbatch 1 and no recomputation, Megatron's defaults, where not stated.
    """
    p = record["parallel"]
    modern = _is_megatron_core_2024(record)
    recompute = p.get("recompute") or "none"
    zero = p.get("zero") or 0
    precision = record["precision"].lower()
    return ParallelConfig(
        tp=p["tp"],
        pp=p["pp"],
        dp=p["dp"],
        cp=p.get("cp") or 1,
        ep=p.get("ep") or 1,
        vpp=p.get("vpp") or 1,
        sp=p["sp"] if p.get("sp") is not None else modern,
        mbs=p.get("microbatch") or 1,
        global_batch=p["global_batch"],
        seq_len=record["model"]["seq_len"],
        recompute="full" if recompute.startswith("full") else recompute,
        zero=1 if isinstance(zero, str) and "distributed optimizer" in zero else int(zero),
        precision="fp16" if precision.startswith("fp16") else "bf16",
        flash_attention=modern,
        overlap_grad_reduce=modern,
        overlap_param_gather=modern,
        tp_comm_overlap=modern,
    )


def measured_step_time_s(record: dict[str, Any]) -> tuple[float, str]:
    """The run's step time and how it was obtained.

    A published step time is used as it is; otherwise the published TFLOP/s per GPU are turned
    back into seconds with the FLOP count their definition names (Narayanan's Eq. 3 counts the
    recomputed forward; "model FLOPs" do not).
    """
    measured = record["measured"]
    if measured.get("step_time_s"):
        return float(_number(measured, "step_time_s")), "published step time"
    m, p = record["model"], record["parallel"]
    size = dict(batch=_number(p, "global_batch"), seq=_number(m, "seq_len"),
                layers=_number(m, "layers"), hidden=_number(m, "hidden"),
                vocab=_number(m, "vocab"))  # fmt: skip
    definition = measured["tflops_definition"]
    if "Eq.3" in definition:
        flops, basis = narayanan_eq3_flops(**size), "Eq. 3 FLOPs / published TFLOP/s"
    elif "model FLOPs" in definition:
        flops, basis = model_flops_eq(**size), "model FLOPs / published TFLOP/s"
    else:
        raise InputError(f"{record['id']}: unknown tflops_definition {definition!r}")
    per_gpu = _number(measured, "tflops_per_gpu") * 1e12
    return flops / (per_gpu * _number(record["cluster"], "num_gpus")), basis


def _number(section: dict[str, Any], key: str) -> float:
    """``section[key]``, which must be a finite number: a record is read by indexing, and a
    string would repeat itself in the FLOP formula instead of failing."""
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{key} must be a number, got {short_repr(value)}")
    return value


def run_from_record(record: dict[str, Any]) -> CalibrationRun:
    """A record of ``calibration_runs.json`` as estimate inputs and a measured step time."""
    seconds, basis = measured_step_time_s(record)
    if not (isinstance(seconds, float) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the measured step time is {seconds!r} s, not a positive number")
    gpu = record["cluster"]["gpu"]
    num_gpus = record["cluster"]["num_gpus"]
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
        raise TypeError(f"cluster.num_gpus must be an integer, got {short_repr(num_gpus)}")
    if not 0 < num_gpus <= MAX_DEVICES:
        raise ValueError(f"cluster.num_gpus {num_gpus} is not in 1..{MAX_DEVICES}")
    return CalibrationRun(
        id=str(record["id"]),
        model=model_from_record(record),
        config=config_from_record(record),
        num_devices=num_gpus,
        device="H100" if "H100" in gpu else "A100",
        measured_step_time_s=seconds,
        basis=basis,
    )


def load_runs(path: str | Path) -> list[CalibrationRun]:
    """Every record of a ``calibration_runs.json`` whose configuration is complete."""
    records = read_json(Path(path))
    if not isinstance(records, list):
        raise InputError(f"{path}: expected a JSON list of run records")
    runs = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"{path}: record {index}: expected a JSON object, got "
                             f"{type(record).__name__}")  # fmt: skip
        if record.get("config_complete", True):
            runs.append(_run_of(record, f"{path}: record {index} ({short_repr(record.get('id'))})"))
    return runs


def _run_of(record: dict[str, Any], where: str) -> CalibrationRun:
    """:func:`run_from_record`, every way a hand-edited record can be wrong an InputError
    that names the record (the records are read by plain indexing, not a schema)."""
    try:
        return run_from_record(record)
    except ValidationError as exc:
        raise InputError(describe_validation_error(where, exc)) from None
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except KeyError as exc:
        raise InputError(f"{where}: required field {short_repr(exc.args[0])} is missing") from None
    except (TypeError, AttributeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        text = " ".join(str(exc).split())  # one line, whatever the exception said
        raise InputError(f"{where}: malformed ({type(exc).__name__}: {text[:200]})") from None


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


# Which bundled cluster file ran each GPU's records.
BUNDLED_CLUSTERS = {"A100": "dgx-a100-80gb.json", "H100": "dgx-h100-80gb.json"}


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
