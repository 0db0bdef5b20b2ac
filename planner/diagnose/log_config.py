"""The configuration a training log states, as :class:`~planner.plan.config.ParallelConfig`'s
fields: a Megatron-LM log's arguments dump (``_print_args``, NVIDIA/Megatron-LM@d98e8a64ddf3
megatron/training/arguments.py:1990-2001, every argument by its ``dest``) and iteration lines,
a torchtitan log's start-up lines (:func:`~planner.diagnose.log_models.titan_config_fields`).
What the planner does not price is refused in one line rather than priced as something else.

>>> _cp_algo("['a2a']")
'ulysses'
"""

from __future__ import annotations

from typing import Any

from planner.diagnose.logs import OVERLAPS, LogRun
from planner.errors import InputError
from planner.graph.stacks import grouped_experts
from planner.vocabulary import Precision, Stack, with_switch

# Megatron argument names (arguments.py) to the configuration fields they set.
_MEGATRON_INTS = {
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
    "data_parallel_size": "dp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "micro_batch_size": "mbs", "global_batch_size": "global_batch", "seq_length": "seq_len",
}  # fmt: skip


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
    experts = arguments.get("num_experts", "None") != "None"
    for name, field in _MEGATRON_INTS.items():
        value = arguments.get(name, "None")
        # A dense run's dump prints the expert tensor-parallel default (1) all the same.
        if value != "None" and (experts or name != "expert_tensor_parallel_size"):
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
    for name in OVERLAPS:
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
    if experts:
        # A dump that prints neither bf16 nor fp16 True ran in fp32.
        _check_grouped_gemm(arguments, precision=fields.get("precision", "fp32" if "bf16"
                                                            in arguments else "bf16"),
                            stack=fields.get("stack", "megatron-te"))
    if "use_flash_attn" in arguments or "attention_backend" in arguments:
        # Megatron-Core picks Transformer Engine's flash or fused kernel unless told
        # otherwise (--attention-backend auto, transformer_config.py:151; enums.py:51-58);
        # --use-flash-attn is the older switch, False in a dump of a run that chose neither.
        backend = arguments.get("attention_backend", "AttnBackend.unfused")
        fields["flash_attention"] = (arguments.get("use_flash_attn") == "True"
                                     or backend not in ("AttnBackend.unfused",
                                                        "AttnBackend.local"))  # fmt: skip
    return fields


def _check_grouped_gemm(
    arguments: dict[str, str], *, precision: Precision, stack: Stack
) -> None:
    """Refuse a Megatron MoE run whose ``moe_grouped_gemm`` is not what the planner prices for
    its stack and precision: a rank's experts as one grouped GEMM (``TEGroupedMLP``) in bf16,
    one GEMM per expert in turn (``SequentialMLP``) otherwise
    (:func:`~planner.graph.stacks.grouped_experts`); no configuration field says which."""
    printed = arguments.get("moe_grouped_gemm")
    if printed is None or (printed == "True") == grouped_experts(stack, precision):
        return
    if printed == "True":
        raise InputError(f"arguments: moe_grouped_gemm True in {precision}: the planner prices "
                         f"grouped expert GEMMs in bf16 only, a {precision} run's experts one "
                         f"GEMM each in turn")  # fmt: skip
    raise InputError(f"arguments: moe_grouped_gemm {printed}: the planner prices Megatron MoE "
                     f"runs in bf16 with --moe-grouped-gemm only (one grouped GEMM over a "
                     f"rank's experts), not one GEMM per expert in turn")  # fmt: skip


def _int(name: str, value: str) -> int:
    """A dumped argument as an integer, or an InputError naming it."""
    try:
        return int(value)
    except ValueError:
        raise InputError(f"arguments: {name} {value!r} is not an integer") from None
