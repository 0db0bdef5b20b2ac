"""The field's words, each defined once: units, precisions, recomputation modes, pipeline
schedules, context-parallel algorithms, ZeRO stages, collectives and parallelisms.

Every module that names one of these imports it from here, so a new schedule or collective is
added in one place and the type checker finds every ``match`` that misses it.
"""

from __future__ import annotations

from typing import Literal

GIB = 1024**3
"""Bytes in a GiB: memory sizes (``memory_gib``)."""
GB = 1e9
"""Bytes in a GB: bandwidths (``bandwidth_gb_s``), as data sheets quote them."""

Precision = Literal["bf16", "fp16", "fp32"]
"""Mixed-precision compute type."""

Stack = Literal["megatron-te", "megatron-te-fp8", "megatron-te-fused-loss",
                "megatron-te-fp8-fused-loss", "hf-eager", "hf-compiled", "composer-fsdp",
                "megatron-deepspeed", "torchtitan-eager", "torchtitan-compiled", "colossalai-hf"]
"""The software that runs a layer, beyond its kernels: what it keeps for the backward and how it
computes the loss. ``megatron-te``: Megatron-Core with Transformer Engine (fused norms, SwiGLU
and attention; a compute-precision residual stream; eager vocab-parallel loss), the accounting
of Korthikanti et al. (MLSys'23). ``megatron-te-fp8``: the same with Transformer Engine's
linear layers in FP8 (``--fp8-format hybrid``: E4M3 weights and activations, E5M2 gradients;
Megatron's default ``--fp8-recipe delayed``), the rest of the layer, the embedding and the
head in the compute precision (:mod:`planner.graph.fp8`). ``megatron-te-fused-loss`` and
``megatron-te-fp8-fused-loss``: the same two with ``--cross-entropy-loss-fusion``, Megatron-Core's
native fused vocab-parallel loss (:data:`FUSED_LOSS_STACKS`). ``hf-eager``: a Hugging Face
``transformers`` model in eager PyTorch under ``torch.autocast`` with fp32 weights (an fp32
residual stream and norms, a compute-precision copy of a linear's input and weight per
projection, the loss on fp32 logits).
``hf-compiled``: the same with each decoder layer under ``torch.compile``.
``composer-fsdp``: MosaicML's MPT (MosaicGPT) under Composer with PyTorch FSDP as its 2023
throughput benchmark ran it: a bf16 residual stream (Korthikanti's accounting), fp32 sharded
weights gathered in bf16 (FSDP ``MixedPrecision`` PURE), flash-attn's fused cross entropy.
``megatron-deepspeed``: Megatron-DeepSpeed, Megatron's layers (Korthikanti's accounting) under
DeepSpeed's engine and optimizers (bf16's ``BF16_Optimizer``, fp16's ZeRO optimizer) and its
pipeline engine.
``torchtitan-eager``: torchtitan's own model code (``torchtitan/models/llama3/model/model.py``
at v0.2.2) run eager in the compute precision, its weights gathered by FSDP2 in bf16 (no
autocast): a bf16 residual stream, ``nn.RMSNorm`` (one fused kernel on CUDA), separate
projections, the rotary embedding as complex products in fp32, SwiGLU unfused, the loss on
fp32 logits. ``torchtitan-compiled``: the same blocks each under ``torch.compile``, and the
loss (torchtitan's ``[compile] enable``, its default ``components``): Inductor's fused chains,
SiLU recomputed in the backward, the loss keeping the bf16 logits. ``colossalai-hf``: a Hugging Face
``transformers`` model as Colossal-AI's ``HybridParallelPlugin`` runs it, cast whole to the
compute precision (fp32 master weights in its optimizer, no autocast): a 16-bit residual
stream, Hugging Face's own RMSNorm (upcast to fp32 inside), separate projections, the rotary
embedding's halves rotated in the compute precision, SwiGLU unfused, the loss on fp32
logits."""
STACKS: tuple[Stack, ...] = ("megatron-te", "megatron-te-fp8", "megatron-te-fused-loss",
                             "megatron-te-fp8-fused-loss", "hf-eager", "hf-compiled",
                             "composer-fsdp", "megatron-deepspeed", "torchtitan-eager",
                             "torchtitan-compiled", "colossalai-hf")
FUSED_LOSS_STACKS: dict[Stack, Stack] = {"megatron-te-fused-loss": "megatron-te",
                                         "megatron-te-fp8-fused-loss": "megatron-te-fp8"}
"""Megatron-LM's stacks with ``--cross-entropy-loss-fusion``, each to the stack it runs
otherwise: the same layers, the same bytes kept, only the loss's kernels differ
(:data:`planner.graph.unfused.UNFUSED`)."""


COMPILED_STACKS: dict[Stack, Stack] = {"hf-compiled": "hf-eager",
                                       "torchtitan-compiled": "torchtitan-eager"}
"""Stacks that run their decoder layers under ``torch.compile``, each to the eager stack it
runs otherwise (and its embedding and head run on)."""

STACK_SWITCHES: dict[str, dict[Stack, Stack]] = {"cross-entropy-loss-fusion": FUSED_LOSS_STACKS,
                                                 "compile": COMPILED_STACKS}
"""A switch a user turns that changes the stack, as the framework names it (Megatron-LM's
``--cross-entropy-loss-fusion``, torchtitan's ``[compile] enable``): each stack with it on, to
the stack with it off."""


def stack_switch(stack: Stack | None) -> str | None:
    """The switch (:data:`STACK_SWITCHES`) that turns ``stack`` into another, or None.

    >>> stack_switch("megatron-te-fp8"), stack_switch("torchtitan-compiled")
    ('cross-entropy-loss-fusion', 'compile')
    >>> stack_switch("megatron-deepspeed") is None
    True
    """
    for name, stacks in STACK_SWITCHES.items():
        if stack in stacks or stack in stacks.values():
            return name
    return None


def with_switch(stack: Stack | None, switch: str, on: bool) -> Stack | None:
    """``stack`` with ``switch`` on or off, all else as it was; None where the switch does not
    apply to ``stack``.

    >>> with_switch("megatron-te-fp8", "cross-entropy-loss-fusion", True)
    'megatron-te-fp8-fused-loss'
    >>> with_switch("megatron-te-fused-loss", "cross-entropy-loss-fusion", False)
    'megatron-te'
    >>> with_switch("torchtitan-eager", "compile", True)
    'torchtitan-compiled'
    >>> with_switch("megatron-te", "compile", True) is None
    True
    """
    stacks = STACK_SWITCHES[switch]
    off = stacks.get(stack, stack) if stack is not None else None
    if off not in stacks.values():
        return None
    return next(s for s, o in stacks.items() if o == off) if on else off


def switched_on(stack: Stack) -> bool:
    """Whether ``stack`` is its switch's on side (fused loss, compiled).

    >>> switched_on("megatron-te-fused-loss"), switched_on("torchtitan-eager")
    (True, False)
    """
    return any(stack in stacks for stacks in STACK_SWITCHES.values())


def evidence_stack(stack: Stack) -> Stack:
    """The stack whose validated runs speak for ``stack`` in its error bands: a fused-loss
    stack's eager one (they differ in the loss's memory-bound kernels alone, a part of a step
    no run measured apart), else ``stack`` itself.

    >>> evidence_stack("megatron-te-fp8-fused-loss"), evidence_stack("hf-eager")
    ('megatron-te-fp8', 'hf-eager')
    """
    return FUSED_LOSS_STACKS.get(stack, stack)


FP8_STACKS: tuple[Stack, ...] = ("megatron-te-fp8", "megatron-te-fp8-fused-loss")
"""Stacks whose decoder layers' linear layers run in FP8 (:mod:`planner.graph.fp8`)."""

Mechanism = Literal["tensor", "pipeline", "context", "expert", "zero-3", "offload", "deepep"]
"""A way of splitting a run that the cost model prices with its own terms, as the error bands
tell predictions apart (:mod:`planner.cost.uncertainty`): tensor, pipeline, context and expert
parallelism, ZeRO-3/FSDP's gathered parameters, offloaded optimizer states, and the experts'
tokens exchanged by DeepEP."""
MECHANISMS: tuple[Mechanism, ...] = ("tensor", "pipeline", "context", "expert", "zero-3",
                                     "offload", "deepep")

Objective = Literal["expected", "p80", "p95"]
"""What the search ranks plans by (:mod:`planner.cost.risk`): the predicted step time, or the
slow end of its error band at the 80th or 95th percentile."""
OBJECTIVES: tuple[Objective, ...] = ("expected", "p80", "p95")

StatesPrecision = Literal["bf16", "fp16", "fp32", "bf16-deepspeed", "fp16-deepspeed", "bf16-fp8",
                          "fp16-fp8", "bf16-m16", "bf16-fp8-m16"]
"""How a run keeps its weights' states: a compute precision as Megatron-LM keeps them,
with Transformer Engine's FP8 weight copies beside them (``-fp8``), or DeepSpeed's optimizers'
layout of that precision; ``-m16``: Megatron-LM's precision-aware optimizer with Adam's
moments in bf16 (:func:`planner.cost.memory.states_precision`)."""

OptimizerMoments = Literal["fp32", "bf16"]
"""The precision of Adam's moments: fp32, or bf16 as Megatron-LM's precision-aware optimizer
keeps them (``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``),
Transformer Engine's FusedAdam then keeping the fp32 master weights as the 16 bits a bf16
weight lacks (:data:`planner.cost.memory.ADAM_STATE`)."""

AttentionKernel = Literal["flash-attention-2", "flash-attention-3", "cudnn", "triton",
                          "torch-sdpa", "ascend-fa"]
"""The fused attention kernel a device's attention curve was measured on: Dao's
FlashAttention-2 and -3, cuDNN's fused attention, a Triton kernel (flash-attn's 2023 Triton
port, which MPT's runs used), PyTorch's ``scaled_dot_product_attention`` (whichever of those it
dispatches to, with its own per-call overhead), Ascend's FlashAttention operator."""

Platform = Literal["cuda", "ascend"]
"""The software an accelerator runs kernels through: NVIDIA's CUDA, or Huawei's CANN with
``torch_npu`` on Ascend NPUs. A framework built on one runs on no other."""

Recompute = Literal["none", "selective", "full"]
"""Activation recomputation: none; selective (Megatron-LM's attention core,
``--recompute-activations``); full (each layer's whole forward, ``--recompute-granularity
full``)."""
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
"""From least to most recomputation (the index is the mode's position in per-mode tuples)."""

RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                          "shared_experts", "op"]
"""What selective recomputation reruns, as Megatron-Core's ``--recompute-modules`` names it
(``megatron/core/transformer/transformer_config.py``): checkpointed, their inputs kept and
their forward (collectives included) rerun, the attention core (its ``s x s`` tensors
dropped), a dense layer's MLP, an MoE layer's whole MoE block and its shared experts; and,
discarding their outputs for the backward to rebuild, the experts' activation function, the
norms that are modules of their own (MLA's input norm, an MoE layer's pre-MLP norm) and MLA's
up projections. One is not Megatron-Core's: ``op``, torchtitan's per-operator selective
checkpointing (``selective_ac_option = "op"``), which checkpoints each block and saves the
outputs of attention, of every other matmul and of the reduce-scatters (:data:`OP_SAC`)."""
RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = ("core_attn", "moe_act", "layernorm",
                                                   "mla_up_proj", "mlp", "moe",
                                                   "shared_experts", "op")  # fmt: skip
"""The recompute modules, in Megatron-Core's order, torchtitan's per-operator policy last."""
OP_SAC: RecomputeModule = "op"
"""torchtitan's per-operator selective activation checkpointing, as a recompute module: the
block's forward reruns in the backward but for the operators whose outputs the policy saves
(``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``)."""
DEFAULT_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = ("core_attn",)
"""What selective recomputation reruns unless told (Megatron-Core's default)."""

PipelineSchedule = Literal["1f1b", "gpipe", "zb-h1", "zb-v"]
"""The schedule as a configuration gives it; with virtual stages (``vpp > 1``) 1F1B runs
interleaved. The zero-bubble schedules (Qi et al., ICLR'24) split each backward into its input
gradient (B) and its weight gradient (W): ZB-H1 delays W to fill 1F1B's drain (``vpp = 1``),
ZB-V runs two model chunks per stage in a V (``vpp = 2``)."""
ZERO_BUBBLE: tuple[PipelineSchedule, ...] = ("zb-h1", "zb-v")
"""The schedules whose backward runs as separate input- and weight-gradient passes."""
ScheduleName = Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"]
"""The schedule as it runs (what a plan records and the simulator replays)."""

ContextParallelism = Literal["ring", "ulysses", "allgather"]
"""How context parallelism exchanges attention's inputs: ring attention (K/V passed around the
ring, Megatron-Core/Transformer Engine ``p2p``), Ulysses (all-to-all to head shards), or
PyTorch's context parallelism as torchtitan trains with it (K/V all-gathered once, their
gradients passed around the ring)."""
CONTEXT_PARALLELISMS: tuple[ContextParallelism, ...] = ("ring", "ulysses", "allgather")
"""Every way context parallelism attends, the simplest first (the search's tie-break)."""

ZeroStage = Literal[0, 1, 2, 3]
"""ZeRO stage (a level of sharding of optimizer states, gradients and weights, not a pipeline
stage): 0 none, 1 optimizer states (Megatron's distributed optimizer), 2 and gradients,
3 and weights (FSDP)."""
ZERO_STAGES: tuple[ZeroStage, ...] = (0, 1, 2, 3)

Offload = Literal["none", "optimizer", "zero-offload"]
"""What a configuration keeps in host memory, and how its step runs: nothing; or the optimizer
(Adam's states and fp32 master weights, a copy of the gradients, and the Adam step itself on the
CPU), either copied down and back after the backward in a pipeline with the CPU's step
(``optimizer``, Megatron-LM's ``--optimizer-cpu-offload``) or with the gradients copied down as
the backward reduces them (``zero-offload``, DeepSpeed's ZeRO-Offload)."""
OFFLOADS: tuple[Offload, ...] = ("none", "optimizer", "zero-offload")

MoeDispatcher = Literal["alltoall", "deepep"]
"""How the experts' tokens are exchanged: NCCL's all-to-all (Megatron-Core's ``alltoall``
dispatcher: a copy per chosen expert) or DeepSeek's DeepEP (the ``flex`` dispatcher's
``deepep`` backend: a copy per node over the network, forwarded over NVLink;
:mod:`planner.cost.deepep`)."""
MOE_DISPATCHERS: tuple[MoeDispatcher, ...] = ("alltoall", "deepep")

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
"""A collective over a group of ranks."""

DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"
"""Megatron-LM's process-group order, fastest-varying first (``--rank-order``'s default)."""


def rank_order_problem(order: str) -> str | None:
    """What a rank order must be where ``order`` is not one (Megatron-LM's spelling,
    ``tp-cp-ep-dp-pp`` fastest first: each degree once, ``cp-ep-dp`` one block, as the
    gradient groups need), or None; the caller names the order.

    >>> rank_order_problem("pp-tp-cp-ep-dp"), rank_order_problem("tp-dp-cp-ep-pp")[:28]
    (None, 'use tp, cp, ep, dp, pp once ')
    """
    if sorted(order.split("-")) == ["cp", "dp", "ep", "pp", "tp"] and "cp-ep-dp" in order:
        return None
    return (f"use tp, cp, ep, dp, pp once each, with cp-ep-dp together (default "
            f"{DEFAULT_RANK_ORDER})")

Parallelism = Literal["tp", "cp", "ep", "dp", "pp"]
"""A kind of parallelism, named by its degree's flag; not a mesh axis (an axis is a dimension
of a stage's logical device mesh, which may carry several of these)."""

ParallelismKind = Literal["sharded-data-parallel", "data-parallel", "model-parallel",
                          "context-parallel", "expert-parallel"]  # fmt: skip
"""What a run or a plan is, as the validation bands group runs: ZeRO-3/FSDP with no model
parallelism; plain data parallelism (ZeRO 0-2); tensor or pipeline parallelism; context
parallelism; expert parallelism (each of the last two also with any of the others: their own
exchanges are what a band of other runs would not cover)."""


def schedule_name(schedule: PipelineSchedule, vpp: int) -> ScheduleName:
    """The schedule that runs for a configuration's ``schedule`` and virtual stages.

    >>> schedule_name("1f1b", 2), schedule_name("1f1b", 1), schedule_name("zb-v", 2)
    ('interleaved', '1f1b', 'zb-v')
    """
    return "interleaved" if vpp > 1 and schedule == "1f1b" else schedule


def configured_schedule(name: ScheduleName) -> PipelineSchedule:
    """The configuration's schedule for a schedule as it runs (interleaving is 1F1B with
    virtual stages): the inverse of :func:`schedule_name`.

    >>> [configured_schedule(name) for name in ("interleaved", "gpipe", "zb-v")]
    ['1f1b', 'gpipe', 'zb-v']
    """
    return "1f1b" if name == "interleaved" else name


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` of ``noun`` in words that agree with the count (``plural``: the noun's
    plural, when adding "s" does not make it).

    >>> counted(1, "microbatch", "microbatches"), counted(16, "microbatch", "microbatches")
    ('1 microbatch', '16 microbatches')
    >>> counted(1, "stage"), counted(4, "stage")
    ('1 stage', '4 stages')
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
