"""What a record of a runs file says about its run: the software that ran it, the model, the
configuration, the measured step time and peak memory (``calibration_runs.json``,
``fsdp_runs.json``, ``h100/runs_one_gpu.json``, or a user's file of the same layout).

A record with a ``software`` block is read from it (framework, fused attention, dropout, FSDP
sharding, checkpointing); one without is a Megatron-LM run of its era, read by the rules in
:func:`config_from_record`. Those rules depend only on what the record's source says about the
software, never on the measured number. :mod:`planner.diagnose.runs` puts these together into
runs to estimate.

>>> record = {"id": "r", "software": {"framework": "PyTorch FSDP", "dropout": 0.0,
...           "fused_attention": True}}
>>> software_of(record).family, software_of(record).fused_attention
('fsdp', True)
>>> software_of({"software": {"framework": "PyTorch eager with torch.compile of each decoder "
...                                        "layer (Hugging Face transformers)"}}).stack
'hf-compiled'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.errors import InputError
from planner.frameworks._deepspeed_partition import (
    DEFAULT_METHOD,
    as_ends,
    deepspeed_stage_layers,
)
from planner.plan.config import ParallelConfig
from planner.spec import ModelSpec
from planner.spec.messages import short_repr
from planner.vocabulary import STACKS, Stack

# The software fields a record may state; anything else is refused rather than ignored, so a
# field this reader does not understand cannot silently fall back to a default.
SOFTWARE_FIELDS = frozenset({
    "framework", "fused_attention", "dropout", "data_parallel", "activation_checkpointing",
    "pipeline_or_tensor_parallel", "stack",
})  # fmt: skip
# Framework families, by a word their name contains, the first that matches: a family is what
# the error bands and the out-of-family validation group runs by. Megatron-DeepSpeed runs
# DeepSpeed's engines (its pipeline partition too), so "deepspeed" is looked for first; a
# Hugging Face model in plain PyTorch (no sharding framework named) is the "pytorch" family.
FAMILIES = (("deepspeed", "deepspeed"), ("megatron", "megatron"), ("fsdp", "fsdp"),
            ("torchtitan", "fsdp"), ("hugging face", "pytorch"), ("transformers", "pytorch"),
            ("pytorch eager", "pytorch"))  # fmt: skip
# Words of a framework's name that say its layers run as Hugging Face transformers code in
# eager PyTorch (the hf-* stacks); anything else runs Megatron-Core's fused layers.
HF_WORDS = ("hugging face", "transformers", "pytorch eager")
# The measured memory fields a record may state, each a positive number of GiB: torch's peaks,
# and the device memory in use as nvidia-smi shows it (BLOOM's chronicles' "Mem" column,
# ``memory_gb``: nvidia-smi prints MiB and the record does not say how it was converted, so it
# is read as GiB, the larger of the two readings).
MEMORY_FIELDS = ("peak_memory_allocated_gib", "peak_memory_reserved_gib", "memory_gb")
# FSDP's sharding strategies as ZeRO stages (torch/distributed/fsdp/api.py, ShardingStrategy).
FSDP_SHARDING = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Software:
    """What a record says about the software that ran it."""

    family: str
    """``megatron``, ``fsdp``, ``deepspeed`` or ``pytorch``."""
    stack: Stack = "megatron-te"
    """The software that runs each layer (:data:`~planner.vocabulary.Stack`): the block's
    ``stack`` (a Megatron-LM run in FP8, ``megatron-te-fp8``), else :func:`stack_of` the
    framework's name."""
    fused_attention: bool
    """Whether attention ran as one fused kernel (FlashAttention or cuDNN's)."""
    dropout: float
    """Hidden and attention dropout probability."""
    megatron_core_2024: bool
    """The 2024 Megatron-Core table, whose README states its overlap flags."""


def software_of(record: dict[str, Any]) -> Software:
    """The record's ``software`` block, or the Megatron-LM of its era when it has none."""
    modern = "--tp-comm-overlap" in str(record.get("source", ""))
    block = record.get("software")
    if block is None:
        return Software(family="megatron", fused_attention=modern, dropout=0.1,
                        megatron_core_2024=modern)  # fmt: skip
    if not isinstance(block, dict):
        raise InputError(f"software must be an object, got {short_repr(block)}")
    unknown = sorted(set(block) - SOFTWARE_FIELDS)
    if unknown:
        raise InputError(f"software.{unknown[0]} is not a field this reader knows (known: "
                         f"{', '.join(sorted(SOFTWARE_FIELDS))})")  # fmt: skip
    framework = str(block.get("framework", ""))
    family = next((f for word, f in FAMILIES if word in framework.lower()), None)
    if family is None:
        raise InputError(f"software.framework {framework!r} names no known framework "
                         f"(Megatron, FSDP, DeepSpeed, torchtitan, Hugging Face transformers, "
                         f"PyTorch eager)")  # fmt: skip
    fused = block.get("fused_attention", modern)
    dropout = block.get("dropout", 0.1 if family == "megatron" else 0.0)
    if not isinstance(fused, bool):
        raise InputError(f"software.fused_attention must be true or false, got {fused!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise InputError(f"software.dropout must be a probability, got {short_repr(dropout)}")
    stack = block.get("stack", stack_of(framework))
    if stack not in STACKS:
        raise InputError(f"software.stack {short_repr(stack)} is not one of {', '.join(STACKS)}")
    return Software(family=family, stack=stack, fused_attention=fused,
                    dropout=float(dropout), megatron_core_2024=modern)  # fmt: skip


def stack_of(framework: str) -> Stack:
    """The stack a framework's name says runs its layers: MosaicML's Composer is
    ``composer-fsdp``; Hugging Face transformers or PyTorch eager is ``hf-eager``,
    ``hf-compiled`` with ``torch.compile`` named; Megatron-DeepSpeed (DeepSpeed's engine under
    Megatron's layers) ``megatron-deepspeed``; torchtitan ``torchtitan-eager``,
    ``torchtitan-compiled`` with ``compile`` named; anything else Megatron-Core's
    ``megatron-te``.

    >>> stack_of("PyTorch eager (Hugging Face transformers)"), stack_of("PyTorch FSDP")
    ('hf-eager', 'megatron-te')
    >>> stack_of("Megatron-DeepSpeed (bigscience fork) with DeepSpeed's pipeline engine")
    'megatron-deepspeed'
    >>> stack_of("MosaicML Composer + PyTorch FSDP (llm-foundry scripts/train/benchmarking)")
    'composer-fsdp'
    >>> stack_of("torchtitan"), stack_of("torchtitan with torch.compile")
    ('torchtitan-eager', 'torchtitan-compiled')
    """
    name = framework.lower()
    if "composer" in name:
        return "composer-fsdp"
    if "deepspeed" in name and "megatron" in name:
        return "megatron-deepspeed"
    if "torchtitan" in name:
        return "torchtitan-compiled" if "compile" in name else "torchtitan-eager"
    if not any(word in name for word in HF_WORDS):
        return "megatron-te"
    return "hf-compiled" if "torch.compile" in name else "hf-eager"


def model_from_record(record: dict[str, Any]) -> ModelSpec:
    """The GPT model a record describes: GeLU, LayerNorm, biases (Megatron's GPT and MPT as
    benchmarked, whose parameter counts imply them); tied learned positions, except the 2024
    Megatron-Core table, whose parameter counts imply untied RoPE. A record with
    ``model.spec`` (``planner runs from-log``'s) carries its model as model.json does, and is
    read as such."""
    m = record["model"]
    if "spec" in m:
        return ModelSpec.model_validate(m["spec"])
    software = software_of(record)
    modern = software.megatron_core_2024
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
        hidden_dropout=software.dropout,
        attention_dropout=software.dropout,
    )


def config_from_record(record: dict[str, Any]) -> ParallelConfig:
    """The configuration a record ran with; open fields take the software's defaults.

    2021 Megatron-LM (Narayanan et al.; the GPT-3 README example): no fused attention, no
    communication overlap, no distributed optimizer. 2024 Megatron-Core table: the flags its
    README lists (``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap``, the
    distributed optimizer, sequence parallelism, which tensor-parallel overlap needs), fused
    attention; microbatch 1 and no recomputation, Megatron's defaults, where not stated.
    A Hugging Face model in PyTorch (AMP: fp32 weights under bf16 autocast) runs its layers
    on the stack its framework names (:func:`stack_of`). PyTorch FSDP:
    ``parallel.fsdp_sharding`` names the ZeRO stage; it reduce-scatters each
    layer's gradients during the backward and prefetches the next layer's weights
    (``torch/distributed/fsdp``: ``backward_prefetch`` and ``forward_prefetch``), which is
    what the two overlap flags mean here.
    """
    p = record["parallel"]
    software = software_of(record)
    modern = software.megatron_core_2024
    fsdp = software.family == "fsdp"
    recompute = p.get("recompute") or "none"
    zero = p.get("zero") or 0
    if p.get("fsdp_sharding") is not None:
        if p["fsdp_sharding"] not in FSDP_SHARDING:
            raise InputError(f"parallel.fsdp_sharding {p['fsdp_sharding']!r} is not one of "
                             f"{', '.join(FSDP_SHARDING)}")  # fmt: skip
        zero = FSDP_SHARDING[p["fsdp_sharding"]]
    precision = record["precision"].lower()
    first, last = (pipeline_ends(record) if software.family == "deepspeed" and p["pp"] > 1
                   else (None, None))  # fmt: skip
    return ParallelConfig(
        tp=p["tp"],
        pp=p["pp"],
        first_stage_layers=first,
        last_stage_layers=last,
        dp=p["dp"],
        cp=p.get("cp") or 1,
        cp_algo=p.get("cp_algo", "ring"),
        ep=p.get("ep") or 1,
        etp=p.get("etp"),
        vpp=p.get("vpp") or 1,
        sp=p["sp"] if p.get("sp") is not None else modern,
        mbs=p.get("microbatch") or 1,
        global_batch=p["global_batch"],
        seq_len=record["model"]["seq_len"],
        recompute="full" if recompute.startswith("full") else recompute,
        recompute_modules=p.get("recompute_modules"),
        zero=1 if isinstance(zero, str) and "distributed optimizer" in zero else int(zero),
        precision="fp16" if precision.startswith("fp16") else "bf16",
        stack=software.stack,
        flash_attention=software.fused_attention,
        # A user's log states its overlaps (planner runs from-log); the published runs' era
        # and framework say theirs.
        overlap_grad_reduce=p.get("overlap_grad_reduce", modern or fsdp),
        overlap_param_gather=p.get("overlap_param_gather", modern or fsdp),
        tp_comm_overlap=p.get("tp_comm_overlap", modern),
        overlap_moe_expert_parallel_comm=p.get("overlap_moe_expert_parallel_comm", False),
        moe_dispatcher=p.get("moe_dispatcher", "alltoall"),
        optimizer_moments=p.get("optimizer_moments", "fp32"),
    )


def pipeline_ends(record: dict[str, Any]) -> tuple[int | None, int | None]:
    """The first and last stage's decoder layers of a DeepSpeed pipeline run (None: as the
    middle stages): DeepSpeed's partition of ``GPTModelPipe`` by ``parallel.pp_partition``
    (its first word; default Megatron-DeepSpeed's ``type:transformer``), as
    :func:`~planner.frameworks._deepspeed_partition.deepspeed_stage_layers` computes it.

    >>> pipeline_ends({"model": {"layers": 70}, "parallel": {"pp": 12,
    ...                "pp_partition": "type:transformer|embedding (embed as a slot)"}})
    (5, 5)
    """
    p, m = record["parallel"], record["model"]
    stated = p.get("pp_partition")
    method = str(stated).split()[0] if stated else DEFAULT_METHOD
    layers = deepspeed_stage_layers(m["layers"], pp=p["pp"], method=method,
                                    tied_embeddings=not software_of(record).megatron_core_2024,
                                    moe=bool(m.get("moe")))  # fmt: skip
    ends = as_ends(layers)
    if ends is None:
        raise InputError(f"parallel.pp_partition {method!r}: DeepSpeed puts {list(layers)} "
                         f"decoder layers on the stages, and the planner prices equal stages "
                         f"between the first and the last only")  # fmt: skip
    return ends


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


def measured_step_time_s(record: dict[str, Any]) -> tuple[float, str] | None:
    """The run's step time and how it was obtained; None when the record measures neither a
    step time nor a throughput.

    A published step time is used as it is; a token throughput gives the step's tokens over
    it; published TFLOP/s per GPU are turned back into seconds with the FLOP count their
    definition names (Narayanan's Eq. 3 counts the recomputed forward; "model FLOPs" do not).
    """
    measured = record["measured"]
    m, p = record["model"], record["parallel"]
    if measured.get("step_time_s"):
        return float(_number(measured, "step_time_s")), "published step time"
    if measured.get("tokens_per_s"):
        tokens = _number(p, "global_batch") * _number(m, "seq_len")
        return tokens / _number(measured, "tokens_per_s"), "tokens per step / published tokens/s"
    if not measured.get("tflops_per_gpu"):
        return None
    size = dict(batch=_number(p, "global_batch"), seq=_number(m, "seq_len"),
                layers=_number(m, "layers"), hidden=_number(m, "hidden"),
                vocab=_number(m, "vocab"))  # fmt: skip
    definition = measured.get("tflops_definition", "")
    if "Eq.3" in definition:
        flops, basis = narayanan_eq3_flops(**size), "Eq. 3 FLOPs / published TFLOP/s"
    elif "model FLOPs" in definition:
        flops, basis = model_flops_eq(**size), "model FLOPs / published TFLOP/s"
    else:
        raise InputError(f"unknown measured.tflops_definition {definition!r}")
    per_gpu = _number(measured, "tflops_per_gpu") * 1e12
    return flops / (per_gpu * _number(record["cluster"], "num_gpus")), basis


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredMemory:
    """What a record measured of its device memory."""

    peak_allocated_gib: float | None
    """The peak the allocator handed to tensors (``torch.cuda.max_memory_allocated``)."""
    peak_reserved_gib: float | None
    """The peak the caching allocator reserved (``torch.cuda.max_memory_reserved``)."""
    device_gib: float | None = None
    """The device memory in use as ``nvidia-smi`` showed it at some moment of the run (the
    CUDA context, NCCL's buffers and the allocator's cache with the tensors): a snapshot, at
    most the peak."""
    oom: bool
    """Whether the run ran out of memory (a record that does not say ran, as every published
    run with a step time did)."""


def measured_memory(record: dict[str, Any]) -> MeasuredMemory:
    """The record's ``measured.peak_memory_allocated_gib``, ``peak_memory_reserved_gib``,
    ``memory_gb`` (each a positive number where given) and ``oom`` (true or false where given).

    >>> measured_memory({"measured": {"oom": True}})
    MeasuredMemory(peak_allocated_gib=None, peak_reserved_gib=None, device_gib=None, oom=True)
    """
    measured = record["measured"]
    if not isinstance(measured, dict):
        raise InputError(f"measured must be an object, got {short_repr(measured)}")
    peaks = []
    for name in MEMORY_FIELDS:
        value = measured.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value <= 0):  # fmt: skip
            raise InputError(f"measured.{name} must be a positive number of GiB, got "
                             f"{short_repr(value)}")  # fmt: skip
        peaks.append(None if value is None else float(value))
    oom = measured.get("oom", False)
    if not isinstance(oom, bool):
        raise InputError(f"measured.oom must be true or false, got {short_repr(oom)}")
    return MeasuredMemory(peak_allocated_gib=peaks[0], peak_reserved_gib=peaks[1],
                          device_gib=peaks[2], oom=oom)


def _number(section: dict[str, Any], key: str) -> float:
    """``section[key]``, which must be a finite number: a record is read by indexing, and a
    string would repeat itself in the FLOP formula instead of failing."""
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{key} must be a number, got {short_repr(value)}")
    return value

