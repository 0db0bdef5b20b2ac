"""torchtitan v0.2.2's rules: what it refuses, or cannot run as the planner prices it, each
citing the source that establishes it (pytorch/torchtitan at v0.2.2, 73a0e69, and
pytorch/pytorch at v2.13.0, cf30153).

Split from :mod:`planner.frameworks.torchtitan`, whose profile and launch use :data:`RULES`.
"""

from __future__ import annotations

from planner.frameworks._torchtitan_checkpointing import (
    CHECKPOINTING,
    partial_recompute,
    selective_recompute,
)
from planner.frameworks._torchtitan_flavors import (
    FLAVORS,
    REPO,
    VERSION,
    flavor,
)
from planner.frameworks.base import (
    Rule,
    bf16_moments_not_written,
    moe_comm_in_line,
    ranks_in_order,
    unsupported_layers,
)
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

TORCH = "pytorch/pytorch@cf30153"
"""PyTorch v2.13.0, for FSDP2, pipelining and context parallelism."""
_PARALLELIZE = f"{REPO} torchtitan/models/llama3/infra/parallelize.py"
_STAGE = f"{TORCH} torch/distributed/pipelining/stage.py"


def _fsdp(resolved: ResolvedConfig) -> bool:
    """Whether data parallelism is FSDP2 (sharded) rather than DDP or none."""
    return resolved.dp > 1 and resolved.config.zero > 0


# --- checks: why a configuration cannot be launched, or None --------------------------------


def model_flavor(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """torchtitan's TOML picks a registered model; it cannot describe a new one (nor
    multi-token prediction, which v0.2.2's DeepSeek-V3 does not build)."""
    if flavor(model) is not None:
        return None
    if model.mtp_layers and flavor(model.model_copy(update={"mtp_layers": 0})) is not None:
        return unsupported_layers(model, framework=f"torchtitan {VERSION}")
    known = ", ".join(f"{f.name} {f.flavor}" for f in FLAVORS)
    return f"{model.name} is none of torchtitan {VERSION}'s registered models ({known})"


def pipeline_model(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Some train specs have no pipelining function."""
    found, pp = flavor(model), resolved.config.pp
    if found is None or found.pipeline or pp == 1:
        return None
    return f"pp({pp}): torchtitan {VERSION} does not pipeline {found.name} models"


def fp16(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Mixed precision is bfloat16 or float32."""
    if resolved.training.precision != "fp16":
        return None
    return "precision fp16: torchtitan trains in bfloat16 or float32 only"


def moe_capacity(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """torchtitan's MoE routes every token to its top-k experts: no capacity to pad or drop
    to (``MoEArgs`` has no capacity factor)."""
    if model.moe is None or model.moe.capacity_factor is None:
        return None
    return (f"moe capacity_factor {model.moe.capacity_factor:g}: torchtitan's MoE is dropless "
            f"(no capacity factor); drop it from the model to price torchtitan's routing")


def deepep_dispatch(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``expert_parallel_comm_backend = "deepep"`` is read by DeepSeek-V3's (and Llama 4's)
    parallelization only, and refused there with the experts tensor-parallel (etp > 1)."""
    c = resolved.config
    if c.moe_dispatcher != "deepep":
        return None
    found = flavor(model)
    if found is not None and found.name != "deepseek_v3":
        return (f"moe_dispatcher deepep: torchtitan {VERSION}'s {found.name} models exchange "
                f"the experts' tokens with all-to-alls whatever the backend says")
    if c.tp > 1 and resolved.etp is None:
        return f"moe_dispatcher deepep with the experts tensor-parallel (etp {c.tp}): use etp 1"
    return None


def mixed_precision_without_fsdp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """bf16 with fp32 master weights is FSDP2's MixedPrecisionPolicy; without FSDP2 torchtitan
    autocasts fp32 weights (DDP, one device) or trains TP/PP in fp32."""
    if resolved.training.precision != "bf16" or _fsdp(resolved):
        return None
    return (f"bf16 with dp({resolved.dp}) and zero({resolved.config.zero}): torchtitan runs bf16 "
            f"mixed precision through FSDP2 only (dp > 1 and zero >= 1); otherwise it keeps "
            f"fp32 weights or trains in fp32")  # fmt: skip


def context_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Training never sets the rotate method: PyTorch's default all-gathers K/V (``cp_algo``
    allgather, :func:`planner.cost.allgather_attention_exposed_s`)."""
    c = resolved.config
    if c.cp == 1 or c.cp_algo == "allgather":
        return None
    how = "ring attention" if c.cp_algo == "ring" else "Ulysses all-to-alls"
    return (f"cp({c.cp}) as {how}: torchtitan {VERSION}'s training context parallelism "
            f"all-gathers keys and values (PyTorch's default rotate method; cp_algo allgather)")


def flex_attention_context_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Context parallelism runs SDPA only; the DeepSeek flavors attend with FlexAttention."""
    found, cp = flavor(model), resolved.config.cp
    if cp == 1 or found is None or not found.flex_attention:
        return None
    return (f"cp({cp}): torchtitan's {found.name} {found.flavor} attends with FlexAttention, and "
            f"its context parallelism supports SDPA only")


def tensor_parallel_without_sp(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Tensor parallelism always shards the norms along the sequence."""
    tp = resolved.config.tp
    if tp == 1 or resolved.sp:
        return None
    return (f"tp({tp}) without sp: torchtitan's tensor parallelism always shards the norms "
            f"along the sequence (SequenceParallel)")


def sequence_divisor(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """seq_len must divide by tp x 2 x cp."""
    c, seq = resolved.config, resolved.training.seq_length
    divisor = c.tp * 2 * c.cp
    if seq % divisor == 0:
        return None
    return f"seq_len({seq}) is not divisible by tp({c.tp}) x 2 x cp({c.cp}) = {divisor}"


def unfused_attention(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Attention is SDPA with the cuDNN and flash kernels first."""
    if resolved.config.flash_attention:
        return None
    return "flash_attention off: torchtitan's attention is fused (SDPA: cuDNN, then flash)"


def tp_comm_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Async TP (``enable_async_tensor_parallel``) runs only compiled, its all-gathers and
    reduce-scatters fused with the matmuls into micro-pipelined ops, which are not priced."""
    c = resolved.config
    if not c.tp_comm_overlap or c.tp == 1:
        return None
    return (f"tp_comm_overlap with tp({c.tp}): torchtitan's async TP runs only compiled, its "
            "collectives fused with the matmuls into micro-pipelined ops, which the planner "
            "does not price")


def ddp_with_model_parallel(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Replicated data parallelism is DDP, which torchtitan runs alone only."""
    c = resolved.config
    if c.zero > 0 or resolved.dp == 1 or c.tp * c.pp * c.cp == 1:
        return None
    return (f"zero(0) with dp({resolved.dp}) is DDP, which torchtitan refuses next to "
            f"tp({c.tp}) x pp({c.pp}) x cp({c.cp}) (DDP has not supported > 1D parallelism)")


def ddp_every_microbatch(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The training loop accumulates without no_sync: DDP all-reduces every microbatch."""
    c, n = resolved.config, resolved.num_microbatches
    if c.zero > 0 or resolved.dp == 1 or c.pp > 1 or n == 1:
        return None
    return (f"zero(0) with {n} microbatches: torchtitan's loop accumulates without no_sync, so "
            f"DDP all-reduces after each of the {n}, not once per step")


def ddp_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """DDP's bucketed all-reduce always overlaps the backward."""
    c = resolved.config
    if c.zero > 0 or resolved.dp == 1 or c.overlap_grad_reduce:
        return None
    return ("zero(0) is DDP, which always overlaps its all-reduce with the backward: "
            "overlap_grad_reduce is off")


def fsdp_zero1_without_pipeline(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """FSDP2 reduce-scatters and shards the gradients in every backward."""
    c = resolved.config
    if c.zero != 1 or c.pp > 1 or resolved.dp == 1:
        return None
    return ("ZeRO-1 without pipelines: FSDP2 reduce-scatters and shards the gradients in every "
            "backward (ZeRO-2 or ZeRO-3), it never keeps them whole")


def fsdp_zero2_microbatches(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Without resharding after forward FSDP2 still reshards after backward."""
    c, n = resolved.config, resolved.num_microbatches
    if c.zero != 2 or c.pp > 1 or resolved.dp == 1 or n == 1:
        return None
    return (f"ZeRO-2 with {n} microbatches: FSDP2 reshards after every backward and gathers the "
            f"weights again for each of the {n} forwards, not once per step")


def fsdp_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """FSDP2 always prefetches its all-gathers and overlaps its reduce-scatters."""
    c = resolved.config
    if c.zero < 2 or c.pp > 1 or resolved.dp == 1:
        return None
    if c.overlap_grad_reduce and c.overlap_param_gather:
        return None
    return (f"ZeRO-{c.zero} is FSDP2, which always overlaps its all-gathers and reduce-scatters: "
            f"overlap_grad_reduce and overlap_param_gather must both be on")


def fsdp_pipeline_sharding(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Under pipelines FSDP2 keeps gradients and weights whole until the last microbatch."""
    c = resolved.config
    if c.pp == 1 or c.zero < 2 or resolved.dp == 1:
        return None
    return (f"ZeRO-{c.zero} with pp({c.pp}): PyTorch's pipelining keeps FSDP2's gradients and "
            f"weights whole until the last microbatch, which is ZeRO-1")


def fsdp_pipeline_overlap(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Under pipelines FSDP2 reduces after the schedule and gathers under the first forward."""
    c = resolved.config
    if c.pp == 1 or c.zero != 1 or resolved.dp == 1:
        return None
    if not c.overlap_grad_reduce and c.overlap_param_gather:
        return None
    return (f"ZeRO-1 with pp({c.pp}): FSDP2 reduce-scatters after the last microbatch's backward "
            f"(overlap_grad_reduce must be off) and prefetches its gather under the next "
            f"forward (overlap_param_gather must be on)")


def zero_bubble_rounds(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """ZB-H1 is PyTorch's interleaved zero-bubble schedule with one stage per rank, which
    takes the microbatches in rounds of ``m // max(1, m // p)`` and refuses a remainder."""
    c, m = resolved.config, resolved.num_microbatches
    rounds = max(1, m // c.pp)
    if c.schedule != "zb-h1" or c.pp == 1 or m % rounds == 0:
        return None
    return (f"zb-h1 with pp({c.pp}): InterleavedZeroBubble needs microbatches({m}) to be a "
            f"multiple of its rounds max(1, {m} // {c.pp}) = {rounds}")


def compiled_zero_bubble(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """PyTorch's zero-bubble schedules split each backward into its input and weight halves,
    which they cannot do through a compiled module: ``ScheduleInterleavedZeroBubble`` and
    ``ScheduleZBVZeroBubble`` raise on a stage holding one
    (``_check_torch_compile_compatibility``), and torchtitan compiles every block before it
    builds the schedule."""
    c = resolved.config
    if resolved.training.stack != "torchtitan-compiled" or c.pp == 1:
        return None
    if c.schedule not in ("zb-h1", "zb-v"):
        return None
    return (f"{c.schedule} with compile: PyTorch's zero-bubble schedules refuse a stage whose "
            f"blocks torch.compile wrapped (they split the backward, which a compiled block "
            f"cannot); use 1f1b, or torchtitan-eager")


def rank_order(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """torchtitan's mesh is pp, dp, cp, tp: tp fastest."""
    c = resolved.config
    if ranks_in_order(resolved, ("tp", "cp", "dp", "pp")):
        return None
    return f"rank_order {c.rank_order!r}: torchtitan numbers ranks tp, then cp, dp, pp"



def optimizer_offload(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """``training.enable_cpu_offload`` is FSDP2's ``CPUOffloadPolicy``: the parameters and
    gradients live on the host too and are copied in for every forward and backward, which is
    not priced."""
    if resolved.config.offload == "none":
        return None
    return ("optimizer offload: torchtitan's enable_cpu_offload (FSDP2's CPUOffloadPolicy) "
            "offloads the parameters and gradients too, which is not priced")


RULES: tuple[Rule, ...] = (
    Rule(name="model-flavor", check=model_flavor,
         source=f"{REPO} torchtitan/models/llama3/__init__.py:29-99; "
                f"torchtitan/models/qwen3/__init__.py:30-190; "
                f"torchtitan/models/deepseek_v3/__init__.py:29-157; "
                f"torchtitan/models/deepseek_v3/model/args.py (no multi-token prediction)"),
    Rule(name="pipeline-model", check=pipeline_model,
         source=f"{REPO} torchtitan/models/qwen3/__init__.py:199; "
                f"torchtitan/models/deepseek_v3/__init__.py:165"),
    Rule(name="flex-attention-context-parallel", check=flex_attention_context_parallel,
         source=f"{REPO} torchtitan/models/deepseek_v3/infra/parallelize.py:67-73; "
                f"torchtitan/models/deepseek_v3/model/args.py:101-109"),
    Rule(name="fp16", check=fp16, source=f"{REPO} torchtitan/config/job_config.py:282"),
    Rule(name="moe-comm-overlap", check=moe_comm_in_line,
         source=f"{REPO} torchtitan/models/moe/moe.py:473-530"),
    Rule(name="moe-capacity", check=moe_capacity,
         source=f"{REPO} torchtitan/models/moe/moe.py:22-41"),
    Rule(name="bf16-moments", check=bf16_moments_not_written,
         source=f"{REPO} torchtitan/components/optimizer.py (torch.optim.AdamW, its moments "
                f"in the fp32 parameters' dtype)"),
    Rule(name="deepep", check=deepep_dispatch,
         source=f"{REPO} torchtitan/models/deepseek_v3/infra/parallelize.py:99-121; "
                f"torchtitan/models/qwen3/infra/parallelize.py:108-118"),
    Rule(name="mixed-precision-without-fsdp", check=mixed_precision_without_fsdp,
         source=f"{REPO} torchtitan/distributed/utils.py:243-263"),
    Rule(name="context-parallel", check=context_parallel,
         source=f"{REPO} torchtitan/distributed/context_parallel.py:53-68 (SDPA through "
                f"PyTorch's _ContextParallel); torchtitan/components/validate.py:213 (the only "
                f"caller of set_rotate_method); {TORCH} "
                f"torch/distributed/tensor/experimental/_context_parallel/_attention.py:77"),
    Rule(name="tp-without-sp", check=tensor_parallel_without_sp,
         source=f"{_PARALLELIZE}:173-241"),
    Rule(name="seq-len-divisor", check=sequence_divisor,
         source=f"{_PARALLELIZE}:69-74; {REPO} torchtitan/distributed/parallel_dims.py:365-372"),
    Rule(name="selective-recompute", check=selective_recompute,
         source=f"{CHECKPOINTING}:174-190; torchtitan/distributed/activation_checkpoint.py:98-122; "
                f"torchtitan/models/llama3/infra/parallelize.py:36-51; "
                f"torchtitan/models/qwen3/infra/parallelize.py:39-55; "
                f"torchtitan/config/job_config.py:661"),
    Rule(name="partial-recompute", check=partial_recompute, source=f"{CHECKPOINTING}:24-49"),
    Rule(name="unfused-attention", check=unfused_attention,
         source=f"{REPO} torchtitan/models/attention.py:168-190"),
    Rule(name="tp-comm-overlap", check=tp_comm_overlap,
         source=f"{REPO} torchtitan/distributed/tensor_parallel.py:16-23"),
    Rule(name="ddp-with-model-parallel", check=ddp_with_model_parallel,
         source=f"{_PARALLELIZE}:148-151"),
    Rule(name="ddp-every-microbatch", check=ddp_every_microbatch,
         source=f"{REPO} torchtitan/train.py:542; torchtitan/train.py:577-584"),
    Rule(name="ddp-overlap", reads_overlaps=True,
         check=ddp_overlap, source=f"{_PARALLELIZE}:363-372"),
    Rule(name="fsdp-zero-1-without-pipeline", check=fsdp_zero1_without_pipeline,
         source=f"{_PARALLELIZE}:287-357; {REPO} torchtitan/train.py:542"),
    Rule(name="fsdp-zero-2-microbatches", check=fsdp_zero2_microbatches,
         source=f"{_PARALLELIZE}:319-346"),
    Rule(name="fsdp-overlap", reads_overlaps=True,
         check=fsdp_overlap, source=f"{_PARALLELIZE}:319-357"),
    Rule(name="fsdp-pipeline-sharding", check=fsdp_pipeline_sharding,
         source=f"{_STAGE}:844-848; {_STAGE}:1172-1191"),
    Rule(name="fsdp-pipeline-overlap", reads_overlaps=True, check=fsdp_pipeline_overlap,
         source=f"{_STAGE}:1165-1191; {_PARALLELIZE}:324-327"),
    Rule(name="zero-bubble-rounds", check=zero_bubble_rounds,
         source=f"{TORCH} torch/distributed/pipelining/schedules.py:3046-3053"),
    Rule(name="compiled-zero-bubble", check=compiled_zero_bubble,
         source=f"{TORCH} torch/distributed/pipelining/schedules.py "
                f"(_check_torch_compile_compatibility); "
                f"{REPO} torchtitan/models/llama3/infra/parallelize.py:256-266"),
    Rule(name="rank-order", check=rank_order,
         source=f"{REPO} torchtitan/distributed/parallel_dims.py:143-158"),
    Rule(name="optimizer-offload", check=optimizer_offload,
         source=f"{_PARALLELIZE}:137, 146-147, 317"),
)  # fmt: skip
"""Everything torchtitan refuses, or cannot run as the planner prices it."""
