"""What each stack (:data:`~planner.vocabulary.Stack`) keeps for the backward, for the
lowering (:mod:`planner.graph.lower`) to apply operator by operator:

- ``megatron-te`` follows Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models" (MLSys'23), Sec. 4.1: for a GPT layer ``sbh(34 + 5as/h)`` bytes at 16-bit
  precision with dropout.
- ``hf-eager`` counts what autograd saves in Hugging Face's Llama code
  (``transformers/models/llama/modeling_llama.py``) under ``torch.autocast`` with fp32 weights:
  the residual stream is fp32 (the embedding runs outside autocast, and a bf16 block output
  added to it promotes); ``LlamaRMSNorm`` keeps its fp32 input and its fp32 normalized output
  (before the weight); autocast casts a linear's fp32 input per call (q, k and v each keep a
  bf16 copy of the norm's output; gate and up each another) and caches one bf16 copy of each
  weight, which the linear keeps; SiLU keeps the gate, and the product keeps SiLU's output and
  up. Rotary embedding keeps nothing new (its multiplicands are the constant cos and sin).
  On one H100 this count is the measured bytes of a Llama-3.2-1B and a Llama-3.1-8B layer
  (TP 1-8 shards) within 0.2 % (``tests/test_memory_stacks.py``).
- ``hf-compiled``: the same layer under ``torch.compile``. What Inductor's partitioner keeps,
  inferred from the same measurements: the fp32 residual into each norm, one bf16 copy of the
  attention's normed input, q, k, v and the attention output, the gate, up and their product
  (SiLU recomputed), and the bf16 weight copies; the MLP's normed input is recomputed. Read
  off the partitioner's own choice on the CPU since (``benchmarks/compiled_layer_kept.py
  --code transformers``: the H100's measured bytes to the byte), within 0.14 %.
- ``composer-fsdp``: MosaicML's MPT under Composer (mosaicml/examples v0.0.4): Megatron's
  accounting for the layers (a bf16 residual stream), flash-attn's fused cross entropy.
- ``megatron-deepspeed``: Megatron's layers, so Korthikanti's accounting; what differs is
  DeepSpeed's optimizers' states (:data:`planner.cost.memory.HELD_STATE`). Its pipeline
  engine keeps each checkpointed block's whole input per in-flight microbatch (DeepSpeed's
  ``activation_checkpointing/checkpointing.py`` without ``partition_activations``), as
  Megatron does without sequence parallelism.
- ``torchtitan-eager``: torchtitan's model code (``torchtitan/models/llama3/model/model.py`` at
  v0.2.2) in bf16 weights and activations (FSDP2's ``param_dtype``), eager. ``nn.RMSNorm`` on
  a bf16 input with a bf16 weight is PyTorch's fused kernel on CUDA (``rms_norm_symint`` in
  ``aten/src/ATen/native/layer_norm.cpp`` calls ``_fused_rms_norm`` since PyTorch 2.9), which
  keeps its bf16 input and a value a token; the projections keep the norm's bf16 output once
  (``wq``, ``wk`` and ``wv`` read one tensor); the rotary embedding's complex product keeps only
  the constant frequencies; SDPA keeps q, k, v and its output (which ``wo`` reads); SwiGLU's
  product keeps SiLU's output beside up, as Hugging Face's eager layer does. Megatron's
  accounting plus that SiLU output, so a layer keeps ``8h + 4q + 4kv + 8f`` bytes a token
  (hidden, query, key/value and FFN widths). ``benchmarks/eager_layer_bytes.py`` counts what
  torchtitan's own block saves.
- ``torchtitan-compiled``: torchtitan's blocks each under ``torch.compile``
  (``apply_compile`` in ``torchtitan/models/llama3/infra/parallelize.py`` at v0.2.2:
  ``fullgraph=True`` per ``TransformerBlock``) and its loss too (``components`` defaults to
  ``["model", "loss"]``, ``torchtitan/components/loss.py:33-35``: :data:`LOSS_KEPT`); the
  final norm and the output layer stay eager, as on ``torchtitan-eager``. Counted from what
  Inductor's partitioner keeps (``benchmarks/compiled_layer_kept.py``: the compiled block's
  saved tensors, read off its backward node on the CPU): everything ``torchtitan-eager`` keeps
  but SiLU's output, which the backward recomputes from the kept gate: ``8h + 4q + 4kv + 6f``
  bytes a token for a Llama block; Llama 3 8B's and Qwen3 8B's blocks, and the TP2 shard,
  within 0.6 % (the log-sum-exp, the norms' reciprocal RMS and Qwen3's rotary tables' slices,
  a few hundred bytes a token, are not counted). The same
  reading of Hugging Face's compiled layer gives the bytes measured on the H100 to the byte
  (0.6612 GiB for Llama 3.2 1B at 8,192 tokens), so the partitioner's choice on the CPU is the
  GPU's. MoE blocks are compiled per submodule with the routed experts eager
  (``torchtitan/models/llama4/infra/parallelize.py``), not counted: the stack is refused for them.
- ``colossalai-hf``: Hugging Face's Llama code (``transformers/models/llama/modeling_llama.py``)
  cast whole to the compute precision, as Colossal-AI's ``HybridParallelModule`` casts it
  (``colossalai/booster/plugin/hybrid_parallel_plugin.py``, lines 97-105 at
  hpcaitech/ColossalAI@4f9953b; its Llama policy keeps Hugging Face's RMSNorm unless
  ``enable_fused_normalization``, ``colossalai/shardformer/policies/llama.py`` lines 46-49, and
  rotates q and k with Hugging Face's ``apply_rotary_pos_emb``). As ``torchtitan-eager`` but
  for the norms: ``LlamaRMSNorm`` upcasts its 16-bit input to fp32 and keeps that copy and its
  normalized output cast back (``weight * x.to(input_dtype)`` keeps the latter), 6 bytes an
  element where a fused norm keeps its 2-byte input: ``16h + 4q + 4kv + 8f`` bytes a token.

The loss keeps fp32 softmax (or log-probabilities, or the fused loss's 16-bit logits) over the
vocabulary; its backward's transient tensors are the op's ``working``.
"""

from __future__ import annotations

from planner.spec import ModelSpec
from planner.vocabulary import FUSED_LOSS_STACKS, Precision, Stack

GROUPED_EXPERT_STACKS: tuple[Stack, ...] = ("megatron-te", "megatron-te-fp8", *FUSED_LOSS_STACKS,
                                            "torchtitan-eager")
"""Stacks that run a rank's routed experts as one grouped GEMM call in bf16, priced as one
grouped kernel: torchtitan's ``torch._grouped_mm``, and Megatron-Core's ``TEGroupedMLP`` under
``--moe-grouped-gemm`` (the Megatron and MindSpeed exports set it for bf16:
``planner/frameworks/_megatron_flags.py``), whose Transformer Engine call launches one cuBLAS
GEMM per expert over up to four streams on Hopper (``multi_stream_cublas_gemm``,
``transformer_engine/common/gemm/cublaslt_gemm.cu`` at NVIDIA/TransformerEngine@d0067d0),
which is not measured (docs/limits.md).
The others loop over the experts, one GEMM each in turn: Megatron-DeepSpeed's
``deepspeed/moe/experts.py`` (``Experts.forward``), Hugging Face's Mixtral and Qwen-MoE
blocks."""


def grouped_experts(stack: Stack, precision: Precision) -> bool:
    """Whether ``stack`` runs a rank's experts as one grouped GEMM at ``precision`` (Megatron-Core
    asserts bf16 for it: ``megatron/training/arguments.py`` at core_v0.12.1).

    >>> grouped_experts("megatron-te", "bf16"), grouped_experts("megatron-deepspeed", "bf16")
    (True, False)
    """
    return stack in GROUPED_EXPERT_STACKS and precision == "bf16"


SERIAL_PIPELINE_STACKS: tuple[Stack, ...] = ("megatron-deepspeed",)
"""Stacks whose pipeline engine moves each activation and gradient in its own blocking
transfer. DeepSpeed's ``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``, lines 197-243
at microsoft/DeepSpeed 38327e0) gives a stage with two neighbours four transfers a
microbatch, each a separate instruction: receive the activation, send the output, receive
the output's gradient, send the input's gradient; each is ``p2p.send``/``p2p.recv``
(``deepspeed/runtime/pipe/p2p.py``: ``dist.send``/``dist.recv``, ``async_op`` refused), so the
stage's stream waits out each one. Megatron's 1F1B pairs a send with the opposite receive in
one batched call (``send_forward_recv_backward``): two transfers' time a microbatch. Both
send a 1/TP slice and all-gather it (DeepSpeed's ``pipe_partitioned`` and
``grad_partitioned``, on by default: ``deepspeed/runtime/config.py``)."""


def pipeline_transfers(stack: Stack, stages: int) -> int:
    """Transfers a microbatch (per model chunk) that hold the busiest stage's stream: its
    activation forward and its gradient back (2), or, on a serial engine
    (:data:`SERIAL_PIPELINE_STACKS`), each of the four of a stage with two neighbours
    separately; a two-stage pipeline has no such stage.

    >>> pipeline_transfers("megatron-te", 8), pipeline_transfers("megatron-deepspeed", 8)
    (2, 4)
    >>> pipeline_transfers("megatron-deepspeed", 2)
    2
    """
    return 4 if stack in SERIAL_PIPELINE_STACKS and stages > 2 else 2


EAGER_HEAD_STACKS: dict[Stack, Stack] = {"hf-compiled": "hf-eager"}
"""Stacks whose head (the final norm, the output layer and the loss) runs as another stack:
Hugging Face's compiled layers with the head eager, as the H100's compiled step ran them
(``torch.compile`` of each decoder layer). torchtitan's compiled head differs from its eager one
in the loss alone, which its stack prices compiled."""


def rotates_halves(model: ModelSpec) -> bool:
    """Whether torchtitan's code for ``model`` rotates q's and k's halves by real tables (its
    Qwen3 block, which it builds for q/k norms or experts: ``planner.diagnose.titan_layers``),
    not by complex products (its Llama 3 block); the stacks that rotate halves anyway (Hugging
    Face's) ignore it.

    >>> from planner.spec.reading import load_model
    >>> rotates_halves(load_model("instances/models/llama3-8b.json"))
    False
    """
    return model.qk_layernorm or model.moe is not None


FP32_BYTES = 4.0
"""Bytes of an fp32 element."""
AUTOCAST_STACKS: tuple[Stack, ...] = ("hf-eager", "hf-compiled")
"""Stacks that run under ``torch.autocast`` with fp32 weights and an fp32 residual stream."""
SEPARATE_PROJECTION_STACKS: tuple[Stack, ...] = ("torchtitan-eager", "torchtitan-compiled",
                                                  "colossalai-hf")
"""Stacks outside autocast whose projections of one norm's output are separate modules (q, k
and v; gate and up), each reader past the first adding its gradient into the norm's."""
EAGER_GLU_STACKS: tuple[Stack, ...] = ("hf-eager", "torchtitan-eager", "colossalai-hf")
"""Stacks whose gated MLP runs ``silu(gate) * up`` as two eager ops, so the product keeps
SiLU's output beside up for its backward."""
UPCAST_NORM_STACKS: tuple[Stack, ...] = ("colossalai-hf",)
"""Stacks outside autocast whose RMSNorm is Hugging Face's hand-written one on a 16-bit input:
it keeps the input's fp32 copy and the normalized output cast back."""
LOSS_KEPT: dict[Stack, float] = {"megatron-te": 4.0, "megatron-te-fp8": 4.0, "hf-eager": 4.0,
                                  "hf-compiled": 4.0, "composer-fsdp": 2.0,
                                  "megatron-deepspeed": 4.0, "torchtitan-eager": 4.0,
                                  "torchtitan-compiled": 2.0, "colossalai-hf": 4.0}
"""Bytes per token and vocabulary entry the loss keeps for its backward: fp32 softmax (or
log-probabilities); flash-attn's fused cross entropy (``flash_attn/losses/cross_entropy.py``,
as MosaicGPT builds it) keeps the 16-bit logits themselves and an fp32 log-sum-exp a token, and
so does torchtitan's ``cross_entropy_loss`` under ``torch.compile`` (``compile.components``
holds ``"loss"``, its default): Inductor's partitioner saves the bf16 logits, the row's maximum
and log-sum-exp, and recomputes the fp32 log-probabilities in the backward
(``benchmarks/fused_loss_code.py --code torchtitan``)."""
LOSS_WORKING: dict[Stack, float] = {"megatron-te": 2.0, "megatron-te-fp8": 2.0, "hf-eager": 8.0,
                                    "hf-compiled": 8.0, "torchtitan-eager": 8.0,
                                    "torchtitan-compiled": 2.0, "colossalai-hf": 8.0,
                                    "composer-fsdp": 2.0, "megatron-deepspeed": 2.0}
"""Bytes per token and vocabulary entry the loss's backward holds beyond the fp32 softmax it
keeps. Hugging Face's loss (``transformers/loss/loss_utils.py``) runs ``cross_entropy`` on
logits upcast to fp32: its backward holds the dense fp32 gradient of the log-probabilities
(``nll_loss_backward``) and the fp32 gradient of the logits (``_log_softmax_backward_data``)
at once, 8 bytes, with the kept log-probabilities 12 (measured 12.26 GiB at 8,192 tokens and a
128,256 vocabulary on an H100, with the head's weight copy and input:
``../shared/validation/h100/layers.jsonl``); torchtitan's ``cross_entropy_loss``
(``torchtitan/components/loss.py``) is the same ``cross_entropy`` on ``pred.float()``.
Megatron-Core's vocab-parallel cross entropy (``megatron/core/tensor_parallel/cross_entropy.py``)
turns the kept fp32 softmax into the gradient in place; the gradient cast back to the logits'
16-bit type is the 2 bytes. The fused cross entropy without ``inplace_backward`` writes a new
16-bit gradient: 2 bytes; so does torchtitan's compiled loss, whose backward is one kernel from
the kept logits to their bf16 gradient (its only buffer over the logits in Inductor's code).
Megatron-DeepSpeed's (``megatron/mpu/cross_entropy.py`` at bigscience-workshop/Megatron-DeepSpeed
b9883f44) works as Megatron-Core's, on the fp32 logits its pipeline's last stage hands it
(``float16_to_fp32``)."""

LOGIT_KEEPING_STACKS: tuple[Stack, ...] = ("composer-fsdp", "torchtitan-compiled")
"""Stacks whose loss keeps the logits themselves and writes their gradient in their own type:
:data:`LOSS_KEPT`'s and :data:`LOSS_WORKING`'s 2 bytes are a 16-bit logit's, 4 in fp32."""


def loss_bytes(stack: Stack, logit_bytes: float) -> tuple[float, float]:
    """Bytes per token and vocabulary entry the loss on ``stack`` keeps for its backward, and
    holds beyond them through it, for logits of ``logit_bytes`` an element.

    >>> loss_bytes("torchtitan-compiled", 4.0), loss_bytes("torchtitan-eager", 4.0)
    ((4.0, 4.0), (4.0, 8.0))
    """
    scale = logit_bytes / 2.0 if stack in LOGIT_KEEPING_STACKS else 1.0
    return LOSS_KEPT[stack] * scale, LOSS_WORKING[stack] * scale


# Megatron's fused loss keeps the eager one's fp32 softmax (``ctx.save_for_backward(exp_logits,
# ...)``) and returns the same 16-bit gradient (``grad_input.to(torch.bfloat16)``:
# megatron/core/fusions/fused_cross_entropy.py); its compiled backward also holds an fp32 clone
# of the softmax, Inductor's functional form of the in-place update (planner.graph.unfused).
for _fused, _eager in FUSED_LOSS_STACKS.items():
    LOSS_KEPT[_fused] = LOSS_KEPT[_eager]
    LOSS_WORKING[_fused] = LOSS_WORKING[_eager] + FP32_BYTES
