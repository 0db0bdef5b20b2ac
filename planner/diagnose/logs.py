"""A user's training log as a run record of the validation runs' layout, so ``planner
validate`` and ``planner calibrate`` read a user's own runs beside the published ones.

The log's lines are read by :mod:`planner.diagnose.log_lines` (Megatron-LM's iteration lines
and arguments dump, torchtitan's metrics lines, one run a log) and
:mod:`planner.diagnose.log_models` (what the log says of its model and torchtitan's
configuration); :mod:`planner.diagnose.log_config` reads its configuration. A Megatron line's
elapsed time per iteration is the step time; torchtitan's ``tps`` is tokens per second per
device (pytorch/torchtitan@73a0e69 torchtitan/components/metrics.py:421-424: the
data-parallel rank's tokens over the time and the non-data-parallel size), so the step takes
``global batch x sequence / (tps x devices)``.

>>> log = read_log("\\n".join(f" iteration {i}/ 9 | elapsed time per iteration (ms): 1500.0 |"
...                            for i in range(1, 6)), where="x")
>>> log.step_time_s, log.steps, log.iterations
(1.5, 2, 2)
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from planner.diagnose.log_lines import (
    StepLine,
    check_one_run,
    megatron_arguments,
    megatron_steps,
    one_source,
    titan_device,
    titan_steps,
)
from planner.diagnose.log_models import (
    TitanModel,
    check_megatron_model,
    check_titan_model,
    megatron_dropout,
    titan_checkpointing,
    titan_compiled,
    titan_config_fields,
    titan_model,
)
from planner.diagnose.run_records import stack_of
from planner.errors import InputError
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.vocabulary import counted

LogFormat = Literal["megatron", "torchtitan"]
# Warm-up lines left out by default: the first iterations build the CUDA graphs, allocate the
# caching allocator's blocks and tune kernels (cuDNN, NCCL's channels), so they run slower than
# the steady state the cost model prices; Megatron's own first log line also carries the
# initialisation overhead (training.py:3559-3560). Three lines are enough to pass all of that
# in the runs we read, and leave most of a short benchmark's lines.
DEFAULT_SKIP = 3

OVERLAPS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
            "overlap_moe_expert_parallel_comm")
"""Megatron's overlap arguments, the ParallelConfig fields of the same names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRun:
    """What a log measured, before it is tied to a model and a configuration."""

    format: LogFormat
    """Which framework printed it."""
    steps: int
    """Step lines (Megatron's iteration lines, torchtitan's metrics lines) in the median: log
    lines, not iterations (at a log interval of n, a line reports n iterations)."""
    iterations: int
    """The iterations the kept lines report (their step numbers less the previous line's)."""
    step_time_s: float | None
    """Median step time of the kept Megatron lines; None for torchtitan."""
    tokens_per_s_per_gpu: float | None
    """Median ``tps`` of the kept torchtitan lines; None for Megatron."""
    arguments: dict[str, str]
    """Megatron's arguments dump, name to value as printed; empty when absent."""
    global_batch: int | None
    """The global batch size the Megatron lines print, when they all print one."""
    left_out: tuple[str, ...] = ()
    """Why step lines after the warm-up were left out of the median, a sentence each."""
    device: str | None = None
    """The device the log names (torchtitan's ``CUDA capacity`` line), None when it names none."""
    titan_model: TitanModel | None = None
    """The model torchtitan says it built (:func:`~planner.diagnose.log_models.titan_model`)."""
    titan_checkpointing: str | None = None
    """torchtitan's activation checkpointing mode (``full``, ``selective``, ``none``)."""
    titan_fields: dict[str, Any] | None = None
    """The configuration torchtitan's lines state
    (:func:`~planner.diagnose.log_models.titan_config_fields`)."""
    titan_compiled: tuple[str, ...] = ()
    """What torchtitan compiled, ``model`` and ``loss``
    (:func:`~planner.diagnose.log_models.titan_compiled`)."""
    peak_memory_reserved_gib: float | None = None
    """The most the allocator reserved over the kept step lines (torchtitan's ``memory``
    field), GiB; None where the lines print none."""


def read_log(text: str, *, where: str, skip: int = DEFAULT_SKIP) -> LogRun:
    """The measured step time (Megatron) or tokens/s per GPU (torchtitan) of a log of one run:
    the median over its step lines after the first ``skip`` (a median, so a checkpoint save or
    an evaluation that slows one step does not move it), less those that skipped iterations or
    lost the loss to NaN (:func:`kept_steps`)."""
    lines = text.splitlines()
    check_one_run(lines, where=where)
    megatron = one_source(megatron_steps(lines))
    found = megatron or one_source(titan_steps(lines))
    if not found:
        raise InputError(f"{where}: expected Megatron-LM iteration lines ('elapsed time per "
                         f"iteration (ms): X |') or torchtitan metrics lines ('step: N ... "
                         f"tps: T ... mfu: M%'); found neither")  # fmt: skip
    if len(found) <= skip:
        raise InputError(f"{where}: {len(found)} step lines, all within the {skip} warm-up "
                         f"lines skipped (--skip); expected more")  # fmt: skip
    kept, left_out = kept_steps(found, skip=skip, where=where)
    median = statistics.median(s.value for s in kept)
    # Each framework logs its first step alone (training.py:3539, metrics.py:393-394).
    covered = {s.line: s.step - found[i - 1].step if i else 1 for i, s in enumerate(found)}
    measured: dict[str, Any] = dict(steps=len(kept), left_out=left_out,
                                    iterations=sum(covered[s.line] for s in kept))
    if megatron:
        # A batch-size ramp prints several sizes; only one size states the run's batch.
        batches = {s.global_batch for s in found if s.global_batch is not None}
        return LogRun(format="megatron", step_time_s=median, tokens_per_s_per_gpu=None,
                      arguments=megatron_arguments(lines),
                      global_batch=batches.pop() if len(batches) == 1 else None,
                      **measured)  # fmt: skip
    built = titan_model(lines)
    # the kept lines only: the warm-up's compilation and first allocations are no steady step
    reserved = [s.reserved_gib for s in kept if s.reserved_gib is not None]
    measured["peak_memory_reserved_gib"] = max(reserved) if reserved else None
    return LogRun(format="torchtitan", step_time_s=None, tokens_per_s_per_gpu=median,
                  arguments={}, global_batch=None, device=titan_device(lines),
                  titan_model=built, titan_checkpointing=titan_checkpointing(lines),
                  titan_fields=titan_config_fields(lines, built),
                  titan_compiled=titan_compiled(lines), **measured)  # fmt: skip


def kept_steps(
    found: list[StepLine], *, skip: int, where: str
) -> tuple[list[StepLine], tuple[str, ...]]:
    """The step lines after the first ``skip`` that trained, and why the others were left out,
    a sentence each: a line whose interval skipped iterations (the optimizer found an inf or
    NaN gradient and did not step, as fp16's loss scaler does while it backs off) runs faster
    than a step; one whose loss or gradient norm is not a number is a diverged run's. A log
    whose every line is left out is an error."""
    after = found[skip:]
    nan = [s for s in after if s.nan]
    skipped = [s for s in after if s.skipped and not s.nan]
    kept = [s for s in after if not (s.nan or s.skipped)]
    if not kept:
        raise InputError(f"{where}: all {len(after)} step lines after the {skip} warm-up lines "
                         f"report skipped iterations or a loss that is not a number; expected "
                         f"steps that trained")  # fmt: skip
    left_out = []
    if skipped:
        left_out.append(f"left out of the median: {counted(len(skipped), 'step line')} with "
                        f"skipped iterations (from line {skipped[0].line}), which ran no "
                        f"optimizer step (an inf or NaN gradient)")  # fmt: skip
    if nan:
        left_out.append(f"left out of the median: {counted(len(nan), 'step line')} whose loss "
                        f"or gradient norm is not a number (from line {nan[0].line}): the run "
                        f"diverged there")  # fmt: skip
    return kept, tuple(left_out)


def check_device(log: LogRun, device: str, *, where: str) -> None:
    """Refuse a cluster whose device (``device``, the cluster file's name) is not the one the
    log names: another model or another memory size, each compared where both names state it
    (:func:`same_device`)."""
    if log.device is not None and not same_device(log.device, device):
        raise InputError(f"{where}: the log ran on {log.device} (torchtitan's "
                         f"'capacity:' line), the cluster file's device is {device}; expected the "
                         f"cluster of the GPUs that ran it")  # fmt: skip


_GPU_MODEL = re.compile(r"\b[A-Z]{1,2}\d{2,4}[A-Z]?\b")  # H100, A100, GB200, MI300X
_GPU_MEMORY = re.compile(r"(\d+)\s*GB\b")


def same_device(logged: str, ours: str) -> bool:
    """Whether two names of a device can be one device: a model in common (H100, A100, ...)
    where both name one, and the same memory (80GB, 40GB) where both state it.

    >>> same_device("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB")
    True
    >>> same_device("NVIDIA A100-SXM4-80GB", "A100-SXM4-40GB")
    False
    >>> same_device("NVIDIA H100 80GB HBM3", "A100-SXM4-80GB")
    False
    """
    names = [name.upper() for name in (logged, ours)]
    models = [set(_GPU_MODEL.findall(name)) for name in names]
    memory = [set(_GPU_MEMORY.findall(name)) for name in names]
    return all(not (a and b) or bool(a & b) for a, b in (models, memory))


def priced_nearby(log: LogRun) -> tuple[str, ...]:
    """What the log ran that its record prices as the nearest thing the planner has, a
    sentence each: Transformer Engine's fused loss (``cross_entropy_fusion_impl te``, which
    Megatron-LM refuses since NVIDIA/Megatron-LM#5115) as Megatron-Core's native one;
    torchtitan's blocks compiled without its loss (or its loss without its blocks) as both
    compiled (or neither), the ``torchtitan-compiled`` stack (or ``torchtitan-eager``)."""
    if log.format == "torchtitan" and len(log.titan_compiled) == 1:
        done, priced = log.titan_compiled[0], ("both" if "model" in log.titan_compiled
                                               else "neither")  # fmt: skip
        return (f"the log compiled its {'blocks' if done == 'model' else 'loss'} alone, which "
                f"no stack prices: the record prices {priced} compiled",)
    arguments = log.arguments
    if (arguments.get("cross_entropy_loss_fusion") == "True"
            and arguments.get("cross_entropy_fusion_impl") == "te"):
        return ("the log's loss ran Transformer Engine's fused cross entropy "
                "(cross_entropy_fusion_impl te), which the planner does not price: the record "
                "prices Megatron-Core's native fused loss in its place",)
    return ()


def model_of_run(log: LogRun, model: ModelSpec, *, where: str) -> ModelSpec:
    """The model that ran: ``model``, refused where the log's own account of the model
    (Megatron's arguments, torchtitan's model args and parameter count) contradicts it, with
    the dropout the Megatron log ran."""
    if log.titan_model is not None:
        check_titan_model(log.titan_model, model, where=where)
    check_megatron_model(log.arguments, model, where=where)
    return model.model_copy(update=megatron_dropout(log.arguments))


def run_record(
    log: LogRun, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *, run_id: str,
    source: str,
) -> dict[str, Any]:
    """The run as a record of ``calibration_runs.json``'s layout (read by
    :func:`planner.diagnose.runs.run_from_record`)."""
    resolved = resolve(model, cluster, config)
    seq = resolved.training.seq_length
    batch = resolved.training.global_batch_size
    if log.step_time_s is not None:
        step = log.step_time_s
        basis = "median Megatron-LM iteration time"
    else:
        assert log.tokens_per_s_per_gpu is not None  # a torchtitan log has its tps
        step = batch * seq / (log.tokens_per_s_per_gpu * resolved.num_devices)
        basis = "global batch x sequence / (median torchtitan tps x devices)"
    framework = "Megatron-LM" if log.format == "megatron" else "torchtitan"
    precision = resolved.training.precision
    return {
        "id": run_id,
        "source": f"{source} ({counted(log.steps, 'log line')} of "
                  f"{counted(log.iterations, 'iteration')} after the warm-up; {basis})",
        "source_kind": "user log",
        **({"note": "; ".join(log.left_out)} if log.left_out else {}),
        "software": {"framework": framework, "fused_attention": config.flash_attention,
                     "dropout": model.hidden_dropout,
                     # The framework's name says the stack but for FP8 and a fused loss
                     # (run_records.stack_of).
                     **({"stack": resolved.training.stack}
                        if resolved.training.stack != stack_of(framework) else {})},
        # The sizes for readers of the published runs' layout; "spec" is the model that ran,
        # whatever its architecture (planner.diagnose.run_records.model_from_record reads it).
        "model": {"name": model.name, "layers": model.num_layers, "hidden": model.hidden_size,
                  "heads": model.num_attention_heads, "kv_heads": model.query_groups,
                  "ffn_hidden": model.ffn, "vocab": model.vocab_size,
                  "seq_len": seq, "spec": model.model_dump(mode="json", exclude={"training"})},
        "cluster": {"gpu": cluster.device.name, "num_gpus": resolved.num_devices},
        "parallel": {"tp": config.tp, "pp": config.pp, "dp": resolved.dp, "cp": config.cp,
                     **({"cp_algo": config.cp_algo}
                        if config.cp > 1 and config.cp_algo != "ring" else {}),
                     "ep": config.ep, "vpp": config.vpp, "sp": resolved.sp,
                     **({"etp": 1} if resolved.etp == 1 else {}),
                     "microbatch": config.mbs, "global_batch": batch,
                     "recompute": config.recompute, "zero": config.zero,
                     **({"recompute_modules": config.recompute_modules}
                        if config.recompute_modules is not None else {}),
                     **({"moe_dispatcher": "deepep"}
                        if config.moe_dispatcher == "deepep" else {}),
                     **({"optimizer_moments": "bf16"}
                        if config.optimizer_moments == "bf16" else {}),
                     # The overlaps the log states; without them the reader assumes the
                     # framework's era's (planner.diagnose.run_records.config_from_record).
                     **{name: getattr(config, name) for name in OVERLAPS
                        if name in log.arguments}},
        "precision": precision,
        "measured": {"step_time_s": step,
                     **({"peak_memory_reserved_gib": log.peak_memory_reserved_gib}
                        if log.peak_memory_reserved_gib is not None else {})},
        "config_complete": True,
    }
