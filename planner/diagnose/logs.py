"""A user's training log as a run record of the validation runs' layout, so ``planner
validate`` and ``planner calibrate`` read a user's own runs beside the published ones.

Two log formats are read, each by the line its framework prints:

- Megatron-LM's iteration line, ``training_log`` in NVIDIA/Megatron-LM@d98e8a64ddf34856e74b
  24714e3bedb2f5a39553 megatron/training/training.py:3568-3598 (`` iteration N/M | ... |
  elapsed time per iteration (ms): X | ... | global batch size: B |``), and its arguments
  dump, ``_print_args`` in megatron/training/arguments.py:1991-2001 of the same commit
  (``  name ....... value`` lines between ``--- arguments ---`` and ``--- end of arguments ---``);
- torchtitan's metrics line, pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a
  torchtitan/components/metrics.py:527-536 (``step: N  loss: ...  tps: T  ...``, ANSI colours
  around each field, ``tps`` with thousands commas); ``tps`` is tokens per second per device
  (metrics.py:480-483: the data-parallel rank's tokens over the time and the non-data-parallel
  size), so the step takes ``global batch x sequence / (tps x devices)``.

>>> megatron_step_times_s([" [x] iteration 3/ 9 | elapsed time per iteration (ms): 1500.0 |"])
[1.5]
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Literal

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
from planner.vocabulary import with_switch

LogFormat = Literal["megatron", "torchtitan"]
# Warm-up iterations left out by default: the first iterations build the CUDA graphs, allocate
# the caching allocator's blocks and tune kernels (cuDNN, NCCL's channels), so they run slower
# than the steady state the cost model prices; Megatron's own first log line also carries the
# initialisation overhead (training.py:3559-3560). Three is enough to pass all of that in the
# runs we read, and leaves most of a short benchmark's lines.
DEFAULT_SKIP = 3

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_TITAN_LINE = re.compile(r"\bstep:\s*(\d+)\s.*\btps:\s*([0-9,]+)")
_ARG_LINE = re.compile(r"^\s*(\w+) \.+ (.*?)\s*$")
_OVERLAPS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
             "overlap_moe_expert_parallel_comm")
"""Megatron's overlap arguments, the ParallelConfig fields of the same names."""

# Megatron argument names (arguments.py) to the configuration fields they set.
_MEGATRON_INTS = {
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
    "data_parallel_size": "dp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "micro_batch_size": "mbs", "global_batch_size": "global_batch", "seq_length": "seq_len",
}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRun:
    """What a log measured, before it is tied to a model and a configuration."""

    format: LogFormat
    """Which framework printed it."""
    steps: int
    """Iteration (or step) lines kept after the warm-up."""
    step_time_s: float | None
    """Median step time of the kept Megatron lines; None for torchtitan."""
    tokens_per_s_per_gpu: float | None
    """Median ``tps`` of the kept torchtitan lines; None for Megatron."""
    arguments: dict[str, str]
    """Megatron's arguments dump, name to value as printed; empty when absent."""
    global_batch: int | None
    """The global batch size the kept Megatron lines print, when they all print one."""
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


def megatron_step_times_s(lines: list[str]) -> list[float]:
    """The step time of every Megatron iteration line, in order."""
    times = []
    for line in lines:
        line = _ANSI.sub("", line)
        if _MEGATRON_ITER.search(line) and (ms := _MEGATRON_MS.search(line)):
            times.append(float(ms.group(1)) / 1000.0)
    return times


def titan_tps(lines: list[str]) -> list[float]:
    """The ``tps`` of every torchtitan metrics line, in order."""
    return [float(m.group(2).replace(",", "")) for line in lines
            if (m := _TITAN_LINE.search(_ANSI.sub("", line)))]  # fmt: skip


def megatron_arguments(lines: list[str]) -> dict[str, str]:
    """Megatron's ``arguments`` dump (the first one), name to printed value."""
    args: dict[str, str] = {}
    inside = False
    for line in lines:
        text = _ANSI.sub("", line).strip()
        if re.fullmatch(r"-+ arguments -+", text):
            inside = True
        elif inside and re.fullmatch(r"-+ end of arguments -+", text):
            break
        elif inside and (m := _ARG_LINE.match(text)):
            args[m.group(1)] = m.group(2)
    return args


def read_log(text: str, *, where: str, skip: int = DEFAULT_SKIP) -> LogRun:
    """The measured step time (Megatron) or tokens/s per GPU (torchtitan) of a log: the median
    over its step lines after the first ``skip`` (a median, so a checkpoint save or an
    evaluation that slows one step does not move it)."""
    lines = text.splitlines()
    times, tps = megatron_step_times_s(lines), titan_tps(lines)
    found = times or tps
    if not found:
        raise InputError(f"{where}: expected Megatron-LM iteration lines ('elapsed time per "
                         f"iteration (ms): X') or torchtitan metrics lines ('step: N ... "
                         f"tps: T'); found neither")  # fmt: skip
    if len(found) <= skip:
        raise InputError(f"{where}: {len(found)} step lines, all within the {skip} warm-up "
                         f"steps skipped (--skip); expected more")  # fmt: skip
    kept = found[skip:]
    if times:
        # A batch-size ramp prints several sizes; only one size states the run's batch.
        batches = {int(m.group(1)) for line in lines if _MEGATRON_ITER.search(line)
                   and (m := _MEGATRON_BATCH.search(line))}  # fmt: skip
        return LogRun(format="megatron", steps=len(kept), step_time_s=statistics.median(kept),
                      tokens_per_s_per_gpu=None, arguments=megatron_arguments(lines),
                      global_batch=batches.pop() if len(batches) == 1 else None)  # fmt: skip
    built = titan_model(lines)
    return LogRun(format="torchtitan", steps=len(kept), step_time_s=None,
                  tokens_per_s_per_gpu=statistics.median(kept), arguments={},
                  global_batch=None, titan_model=built,
                  titan_checkpointing=titan_checkpointing(lines),
                  titan_fields=titan_config_fields(lines, built),
                  titan_compiled=titan_compiled(lines))  # fmt: skip


def _flex_backend(arguments: dict[str, str]) -> str | None:
    """The backend of a Megatron log's flex dispatcher (``moe_flex_dispatcher_backend``, or
    the older ``moe_enable_deepep``), None for another dispatcher; only DeepEP's is priced
    (:mod:`planner.cost.deepep`), the rest refused. NCCL's all-to-all prices the others, as it
    did before the dispatcher was a field."""
    if arguments.get("moe_token_dispatcher_type") != "flex":
        return None
    backend = arguments.get("moe_flex_dispatcher_backend", "deepep" if arguments.get(
        "moe_enable_deepep") == "True" else "None")  # fmt: skip
    if backend != "deepep":
        raise InputError(f"arguments: moe_token_dispatcher_type flex ({backend}): of the flex "
                         "dispatcher's backends the planner prices DeepEP only")
    return backend


def _moments(arguments: dict[str, str]) -> str | None:
    """Adam's moments as a Megatron log's precision-aware optimizer keeps them (bf16 both, or
    None for fp32); another mix is refused: only bf16 moments are priced."""
    if arguments.get("use_precision_aware_optimizer") != "True":
        return None
    dtypes = {arguments.get(name, "torch.float32").removeprefix("torch.")
              for name in ("exp_avg_dtype", "exp_avg_sq_dtype")}  # fmt: skip
    if dtypes == {"float32"}:
        return None
    if dtypes == {"bfloat16"}:
        return "bf16"
    raise InputError(f"arguments: exp_avg_dtype / exp_avg_sq_dtype {sorted(dtypes)}: the "
                     "planner prices Adam's moments in fp32 or both in bf16")


_CP_COMM_TYPES = {"p2p": "ring", "a2a": "ulysses"}
"""Megatron-LM's ``--cp-comm-type`` values the planner prices, as ``cp_algo``
(megatron/training/arguments.py:3221 at NVIDIA/Megatron-LM@d98e8a64dd; Transformer Engine's
``all_gather`` and ``a2a+p2p`` are not priced)."""


def _cp_algo(printed: str) -> str:
    """``cp_algo`` for a dump's ``cp_comm_type``: one value for every layer (a list as
    Python prints it, ``['p2p']``, or a string), which the planner prices."""
    kinds = {k.strip(" '\"") for k in printed.strip("[]").split(",") if k.strip(" '\"")}
    if len(kinds) != 1 or (kind := kinds.pop()) not in _CP_COMM_TYPES:
        raise InputError(f"arguments: cp_comm_type {printed}: the planner prices Megatron's "
                         f"context parallelism as one of {', '.join(_CP_COMM_TYPES)} on every "
                         f"layer (ring attention, Ulysses all-to-alls)")  # fmt: skip
    return _CP_COMM_TYPES[kind]


_CP_ALGOS = {"megatron_cp_algo": "ring", "ulysses_cp_algo": "ulysses"}
"""MindSpeed's ``--context-parallel-algo`` values the planner prices, as ``cp_algo``
(Ascend/MindSpeed@028de58ca629 ``mindspeed/features_manager/context_parallel/
context_parallel_feature.py:21-23`` and ``ulysses_context_parallel.py:15-19``; its hybrid,
adaptive and K/V all-gather algorithms are not priced)."""


def _attends(arguments: dict[str, str]) -> str:
    """``cp_algo`` for a dump with context parallelism: MindSpeed's
    ``context_parallel_algo`` where the dump has one (MindSpeed selects its attention by it
    and passes Megatron's ``cp_comm_type`` through unread), else Megatron's
    ``cp_comm_type`` (p2p when absent)."""
    algo = arguments.get("context_parallel_algo")
    if algo is None:
        return _cp_algo(arguments.get("cp_comm_type", "['p2p']"))
    if algo not in _CP_ALGOS:
        raise InputError(f"arguments: context_parallel_algo {algo}: the planner prices "
                         f"MindSpeed's context parallelism as {' or '.join(_CP_ALGOS)} (ring "
                         f"attention, Ulysses all-to-alls)")  # fmt: skip
    return _CP_ALGOS[algo]


def config_fields(log: LogRun) -> dict[str, Any]:
    """The configuration fields a log states (names of :class:`ParallelConfig`): a Megatron
    log's arguments dump and iteration lines, a torchtitan log's mesh and model args; what it
    does not state is absent."""
    arguments = log.arguments
    fields: dict[str, Any] = dict(log.titan_fields or {})
    if log.global_batch is not None:
        fields["global_batch"] = log.global_batch
    for name, field in _MEGATRON_INTS.items():
        value = arguments.get(name, "None")
        if value != "None":
            fields[field] = _int(name, value)
    if "sequence_parallel" in arguments:
        fields["sp"] = arguments["sequence_parallel"] == "True"
    if arguments.get("recompute_granularity", "None") != "None":
        fields["recompute"] = arguments["recompute_granularity"]
    if fields.get("recompute") == "selective" and "recompute_modules" in arguments:
        # a list as Python prints it: ['moe_act', 'layernorm']
        fields["recompute_modules"] = arguments["recompute_modules"].strip("[]").replace("'", "")
    if arguments.get("use_distributed_optimizer") == "True":
        fields["zero"] = 1
    if fields.get("cp", 1) > 1 and ({"cp_comm_type", "context_parallel_algo"} & set(arguments)):
        fields["cp_algo"] = _attends(arguments)
    for name in _OVERLAPS:
        if arguments.get(name) in ("True", "False"):
            fields[name] = arguments[name] == "True"
    if _flex_backend(arguments) == "deepep":
        fields["moe_dispatcher"] = "deepep"
    moments = _moments(arguments)
    if moments is not None:
        fields["optimizer_moments"] = moments
    if arguments.get("bf16") == "True":
        fields["precision"] = "bf16"
    elif arguments.get("fp16") == "True":
        fields["precision"] = "fp16"
    if arguments.get("fp8", "None") != "None":
        # --fp8-format; Megatron-Core's recipe defaults to delayed scaling
        # (megatron/core/transformer/transformer_config.py:594-600 at d98e8a6).
        recipe = arguments.get("fp8_recipe", "delayed")
        if recipe.removeprefix("Fp8Recipe.") != "delayed":
            raise InputError(f"arguments: fp8_recipe {recipe}: the planner prices Transformer "
                             "Engine's delayed scaling (the megatron-te-fp8 stack) only")
        fields["stack"] = "megatron-te-fp8"
    if arguments.get("cross_entropy_loss_fusion") == "True":
        impl = arguments.get("cross_entropy_fusion_impl", "native")
        if impl not in ("native", "te"):
            raise InputError(f"arguments: cross_entropy_fusion_impl {impl}: Megatron-Core has "
                             "native and te")  # fmt: skip
        fields["stack"] = with_switch(fields.get("stack", "megatron-te"),
                                      "cross-entropy-loss-fusion", True)
    if "use_flash_attn" in arguments or "attention_backend" in arguments:
        # Megatron-Core picks Transformer Engine's flash or fused kernel unless told
        # otherwise (--attention-backend auto, transformer_config.py:151; enums.py:51-58);
        # --use-flash-attn is the older switch, False in a dump of a run that chose neither.
        backend = arguments.get("attention_backend", "AttnBackend.unfused")
        fields["flash_attention"] = (arguments.get("use_flash_attn") == "True"
                                     or backend not in ("AttnBackend.unfused",
                                                        "AttnBackend.local"))  # fmt: skip
    return fields


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


def _int(name: str, value: str) -> int:
    """A dumped argument as an integer, or an InputError naming it."""
    try:
        return int(value)
    except ValueError:
        raise InputError(f"arguments: {name} {value!r} is not an integer") from None


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
        "source": f"{source} ({log.steps} steps after warm-up; {basis})",
        "source_kind": "user log",
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
                     **{name: getattr(config, name) for name in _OVERLAPS
                        if name in log.arguments}},
        "precision": precision,
        "measured": {"step_time_s": step},
        "config_complete": True,
    }
