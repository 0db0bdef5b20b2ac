"""What each stack (:data:`~planner.vocabulary.Stack`) runs beyond its GEMMs and its fused
attention: the memory-bound kernels, each launched on its own, counted per element of the
tensor they walk (bytes read plus written, forward and backward) from the stack's source.

``hf-eager`` is a Hugging Face Llama layer (``transformers/models/llama/modeling_llama.py``) in
eager PyTorch under ``torch.autocast`` with fp32 weights, its backward as autograd runs it
(``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``). Three
things make it costly: the residual stream and the norms are fp32 (the embedding runs outside
autocast, and a block's bf16 output added to it promotes); every op is its own kernel; and
autograd casts each gradient back to its input's dtype (``validate_outputs`` in
``torch/csrc/autograd/engine.cpp``) and sums the gradients of a tensor read twice. Per element:

- ``LlamaRMSNorm`` on fp32: ``pow`` (8 B), ``mean`` (4), ``add`` and ``rsqrt`` on one value a
  token, the normalising ``mul`` (8), the weight's ``mul`` (8): 28 B in 6 kernels. Backward:
  each ``mul``'s two gradients (a product, and a product then a sum over tokens or hidden: 8 +
  16 B, three kernels, twice), ``rsqrt``'s on one value a token (three small kernels),
  ``mean``'s expanded division (4), ``pow``'s ``grad * 2 * x.pow(1)`` (``pow_backward``: three
  kernels, 28 B), and the sum of the two paths into the input (12): 92 B in 14 kernels.
- A projection reading the fp32 norm output: autocast's cast to bf16 per projection (6 B a
  kernel); backward, the cast's gradient back to fp32 (6) and, for each reader past the
  first, its sum into the norm output's gradient (12).
- An fp32 weight: autocast's bf16 copy each forward (6 B a parameter, one kernel); backward,
  the bf16 weight gradient cast to fp32 (6) and added into ``.grad`` (12; an accumulating
  microbatch's, and a step's first when ``.grad`` was not set to None).
- ``apply_rotary_pos_emb`` on q and on k, with the fp32 ``cos``/``sin`` the rotary embedding
  computes from the fp32 residual stream (so ``q * cos`` promotes): ``q * cos`` (6 B),
  ``-x2`` on half (2), ``cat`` (4), ``rotate_half(q) * sin`` (6), the fp32 ``add`` (12), then
  ``scaled_dot_product_attention``'s autocast cast to bf16 (6): 36 B in 6 kernels. Backward:
  the cast's gradient (6), each ``mul``'s gradient in fp32 and its cast to bf16 (14, twice),
  ``neg`` (2), the two slices' ``zeros`` and copies (8), the three gradients of q summed in
  bf16 (12): 56 B in 12 kernels.
- The residual add, fp32 plus bf16 into fp32 (10 B). Backward: the gradient cast to bf16 for
  the block (6) and the residual stream's two gradients summed where it branches (12).
- SwiGLU, ``act_fn(gate) * up`` on bf16, per output element: ``silu`` (4) and ``mul`` (6).
  Backward: the product's two gradients (12) and ``silu_backward`` (6) in 3 kernels.
- The loss (``transformers/loss/loss_utils.py``: ``cross_entropy`` on ``logits.float()``), per
  logit: the upcast (6 B), ``log_softmax`` reading its fp32 input for the row's maximum, again
  for the sum of exponentials and a third time to write (16; ``aten/src/ATen/native/cuda/
  SoftMax.cu``), ``nll_loss`` on one value a token: 22 B in 3 kernels. Backward:
  ``nll_loss_backward``'s zero-filled fp32 gradient (4, with its scatter), ``log_softmax``'s
  backward reading the gradient twice (its row sum, then the product) and the output once and
  writing (16), the cast back to bf16 (6): 26 B in 4 kernels.

``hf-compiled`` is the same layer under ``torch.compile``: Inductor fuses each chain of
pointwise ops into one kernel (and a norm with its casts), so a chain reads its inputs and
writes its outputs once. Which chains it forms is inferred, not read from generated code (its
kept bytes, :mod:`planner.graph.stacks`, are what the shared measurements pin): the norm reads
fp32 and writes bf16 (6 B; its backward a row pass and a weight-column pass over the fp32 input
and the bf16 gradient, writing the fp32 gradient, 16 B); the rotary embedding with its cast (4
B each way); the residual add (10; its gradient's cast 6); SwiGLU (6; backward, one kernel
reading the gradient, gate and up and writing both gradients, SiLU recomputed: 10). The weight
casts are autocast's, as eager's. The decoder layer is compiled; the head runs eager.

``torchtitan-eager`` is torchtitan's block (``torchtitan/models/llama3/model/model.py`` at v0.2.2)
eager, in bf16 throughout (FSDP2 gathers the weights in bf16: no autocast, no weight casts).
``nn.RMSNorm`` is one fused kernel each way on CUDA (PyTorch's ``_fused_rms_norm``), as on the
fused stacks. Beyond it, per element:

- The norm's output read by separate projections (``wq``, ``wk``, ``wv``; ``w1``, ``w3``):
  backward, each reader past the first adds its gradient in bf16 (6 B).
- ``apply_rotary_emb`` on q and on k: ``xq.float()`` (6 B), the complex product with the
  frequencies in fp32 (8), ``type_as`` back to bf16 (6): 20 B in 3 kernels. Backward: the
  gradient to fp32, its product with the conjugate frequencies, back to bf16: 20 B in 3. The
  Qwen3 block (``torchtitan/models/qwen3/model/model.py``, which torchtitan builds for q/k
  norms or experts) rotates halves by real tables in bf16 instead, as Hugging Face does but
  before the transpose: 20 B in 5 kernels, backward 28 in 7.
- The residual add in bf16 (6 B). Backward: the residual stream's two gradients summed where
  it branches (6).
- SwiGLU, ``F.silu(w1(x)) * w3(x)``: as ``hf-eager``'s, all bf16.
- The loss (``torchtitan/components/loss.py``: ``cross_entropy`` on ``pred.float()``): as
  ``hf-eager``'s.

``torchtitan-compiled`` is the same block under ``torch.compile`` (its final norm and output
layer eager, its loss compiled): as
``hf-compiled``, each chain of pointwise ops one kernel, inferred, not read from generated code.
The separate projections' input gradients are summed inside the norm's backward (2 B for each
reader past the first, no kernel of its own); the residual add writes the stream once (6 B; its
backward's sum where the stream branches is read inside the norm's backward, 2 B); SwiGLU as
``hf-compiled``'s (6 B; backward 10, SiLU recomputed). The rotary embedding stays as eager's:
Inductor generates no code for complex operators (``torch/_inductor/lowering.py`` falls back to
ATen for them), so the fp32 complex product and the casts around it run as three kernels each
way; a Qwen3 block's rotation by real tables is one fused kernel each way (4 B).
The loss is compiled too (``compile.components`` holds ``"loss"`` by default), per logit: one
pass over the bf16 logits for the row's maximum and sum of exponentials (2 B: Inductor's online
softmax on a GPU, ``prepare_softmax_online`` in ``torch/_inductor/fx_passes/post_grad.py``;
two passes, 4 B, on the CPU, which has no such kernel) and a kernel a token for the target's
term; backward, the logits read and their bf16 gradient written (4 B), and a kernel a token.
Counted from the code Inductor generates (``benchmarks/fused_loss_code.py --code
torchtitan``).

``colossalai-hf`` is Hugging Face's Llama layer cast whole to bf16 (Colossal-AI's
``HybridParallelModule``): as ``torchtitan-eager`` but for two things. ``LlamaRMSNorm`` runs as
written on a bf16 input: the upcast to fp32 (6 B), ``pow`` (8), ``mean`` (4), ``add`` and
``rsqrt`` on a value a token, the normalizing ``mul`` (8), the cast back (6), the weight's
``mul`` in bf16 (4): 36 B in 8 kernels; backward, the weight's two gradients (4 and 6, and a
sum over tokens, 2), the cast to fp32 (6), the normalizing ``mul``'s two (12 and 8, a sum 4),
``rsqrt``'s and ``mean``'s on a value a token, ``div`` (8), ``pow``'s (8 and 12), the two
paths' sum (12) and the cast back (6): 96 B in 16 kernels. ``apply_rotary_pos_emb`` rotates
the halves in bf16 with bf16 ``cos``/``sin``: ``q * cos`` (4), ``-x2`` on half (2), ``cat``
(4), ``* sin`` (4), ``add`` (6): 20 B in 5 kernels; backward, the two products' gradients (4
each), ``neg`` (2), each half's ``slice_backward`` into a zeroed whole (3 each), the sums
(6 each) and the gradient's copy back into the projection's layout (4): 32 B in 8.

``benchmarks/eager_layer_bytes.py`` lists the kernels torchtitan's own block and Hugging Face's
layer in bf16 dispatch.

The other stacks run Transformer Engine's or Megatron's fused kernels: each memory-bound op one
kernel over its inputs and output (the op's own tensors; no
:class:`~planner.graph.ops.Unfused`), but for Megatron's loss. Megatron-Core's vocab-parallel
cross entropy (``megatron/core/tensor_parallel/cross_entropy.py``, what
``compute_language_model_loss`` in
``megatron/core/models/common/language_module/language_module.py`` runs unless
``--cross-entropy-loss-fusion``, off by default in ``model_parallel_config.py``, which the
planner's export sets on the ``-fused-loss`` stacks only) is eager PyTorch on the rank's slice
of the logits, per logit: the ``.float()`` upcast (6 B), ``max`` over the vocabulary (4), the
in-place subtraction of the maximum (8), ``exp`` in place (8), its ``sum`` (4) and the in-place
division into the softmax it keeps (8): 38 B; with the target's masks, gathers and the per-token
log, 20 kernels. Backward: the in-place product with the loss's gradient (8) and autograd's cast
of the fp32 gradient back to the logits' type (6): 14 B in 8 kernels. Megatron-LM 2021 and
BigScience's Megatron-DeepSpeed run the same ops (``megatron/mpu/cross_entropy.py``) on the
logits upcast before the call (``output.contiguous().float()`` in ``GPTModelPipe``'s loss,
``megatron/model/gpt_model.py`` at bigscience-workshop/Megatron-DeepSpeed b9883f44), so
``megatron-deepspeed`` counts them too. With ``--cross-entropy-loss-fusion`` (the
``-fused-loss`` stacks, :data:`~planner.vocabulary.FUSED_LOSS_STACKS`) Megatron-Core runs the
same steps as three functions under ``torch.compile`` (``jit_fuser``, ``megatron/core/jit.py``)
with the all-reduces between them (``megatron/core/fusions/fused_cross_entropy.py``, its native
implementation; ``--cross-entropy-fusion-impl te`` is refused by
``megatron/training/arguments.py`` at d98e8a64ddf3), per logit: the upcast with the maximum (6
B), the subtraction, ``exp`` and sum written back in place (8), the division in place (8): 22 B.
Its backward is one compiled function that updates the kept softmax in place
(``calculate_gradients``), which Inductor turns functional: it clones the softmax (8 B),
scatters the target's correction into the clone, then multiplies by the loss's gradient, writing
the 16-bit gradient and the clone back into the softmax (10 B): 18 B, the clone, 4 B a logit,
held through it. Counted from the code Inductor generates for these functions
(``benchmarks/fused_loss_code.py``, torch 2.13 on the CPU, whose loops walk the same buffers;
the upcast and the maximum took two passes there, 10 B, where a GPU's reduction kernel stores
the upcast as it reduces, 6 B), not timed. Composer's flash-attn cross entropy is one fused
kernel.

Measured against one H100's layers (``../shared/validation/h100/layers.jsonl``) in
``benchmarks/layer_times.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.graph.ops import Tensor, Unfused
from planner.graph.stacks import AUTOCAST_STACKS, FP32_BYTES
from planner.vocabulary import FUSED_LOSS_STACKS, Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernels:
    """Bytes read and written per element, and kernels launched, by pass."""

    forward_bytes: float
    """The forward's bytes per element."""
    backward_bytes: float
    """The backward's bytes per element."""
    forward_kernels: int
    """Kernels the forward launches."""
    backward_kernels: int
    """Kernels the backward launches."""

    def times(self, n: int) -> Kernels:
        """These kernels run ``n`` times (none for ``n <= 0``)."""
        n = max(n, 0)
        return Kernels(forward_bytes=n * self.forward_bytes, backward_bytes=n * self.backward_bytes,
                       forward_kernels=n * self.forward_kernels,
                       backward_kernels=n * self.backward_kernels)  # fmt: skip

    def over(self, tensor: Tensor) -> Unfused:
        """These kernels walking ``tensor``."""
        return Unfused(forward=(Tensor(tensor.dims, self.forward_bytes),),
                       backward=(Tensor(tensor.dims, self.backward_bytes),),
                       forward_kernels=self.forward_kernels,
                       backward_kernels=self.backward_kernels)  # fmt: skip


_EAGER_GLU = Kernels(forward_bytes=10.0, backward_bytes=18.0, forward_kernels=2,
                     backward_kernels=3)
"""``act(gate) * up`` in eager 16-bit ops, per output element."""
_EAGER_ACTIVATION = Kernels(forward_bytes=4.0, backward_bytes=6.0, forward_kernels=1,
                            backward_kernels=1)
"""An activation alone, one 16-bit kernel each way."""
_FP32_LOSS = Kernels(forward_bytes=22.0, backward_bytes=26.0, forward_kernels=3,
                     backward_kernels=4)
"""``cross_entropy`` on logits upcast to fp32, per logit."""
_MEGATRON_LOSS = Kernels(forward_bytes=38.0, backward_bytes=14.0, forward_kernels=20,
                         backward_kernels=8)
"""Megatron's vocab-parallel cross entropy on the rank's logits upcast to fp32, per logit."""
_MEGATRON_FUSED_LOSS = Kernels(forward_bytes=22.0, backward_bytes=18.0, forward_kernels=6,
                               backward_kernels=3)
"""The same under ``--cross-entropy-loss-fusion``: three compiled functions forward (with the
masks, the target's gather and the per-token loss); backward, the softmax cloned, the scatter,
and the product cast to 16 bits with the clone written back."""
_EAGER_16BIT = {
    "gradient_sum": Kernels(forward_bytes=0.0, backward_bytes=6.0,
                            forward_kernels=0, backward_kernels=1),
    "residual": Kernels(forward_bytes=6.0, backward_bytes=6.0,
                        forward_kernels=1, backward_kernels=1),
    "glu": _EAGER_GLU, "activation": _EAGER_ACTIVATION, "loss": _FP32_LOSS,
}  # fmt: skip
"""What an eager layer in 16 bits outside autocast runs apart (torchtitan's, and Hugging
Face's cast to bf16): the separate projections' gradient sums, residual adds, activations and
the fp32 loss."""

_COMPILED_GRADIENT_SUM = Kernels(forward_bytes=0.0, backward_bytes=2.0, forward_kernels=0,
                                 backward_kernels=0)
"""A separate projection's input gradient read into the norm's backward kernel, compiled."""
_COMPILED_GLU = Kernels(forward_bytes=6.0, backward_bytes=10.0, forward_kernels=1,
                        backward_kernels=1)
"""``act(gate) * up`` as one compiled kernel each way, SiLU recomputed in the backward."""
_COMPLEX_ROTARY = Kernels(forward_bytes=20.0, backward_bytes=20.0, forward_kernels=3,
                          backward_kernels=3)
"""torchtitan's Llama 3 rotary embedding, q or k to fp32, the complex product, back to bf16,
per element: eager, and compiled (Inductor falls back to ATen for complex operators)."""
_HALVES_ROTARY = Kernels(forward_bytes=20.0, backward_bytes=28.0, forward_kernels=5,
                         backward_kernels=7)
"""torchtitan's Qwen3 rotary embedding, eager (``apply_rotary_emb`` in
``torchtitan/models/qwen3/model/model.py``: ``x * cos + rotate_half(x) * sin`` in bf16 with the
tables cast to bf16, on ``[batch, seq, heads, head_dim]`` before the transpose), per element:
``colossalai-hf``'s count of Hugging Face's same rotation without its backward's copy back into
the transposed layout (4 B, one kernel)."""
_FUSED_ROTARY = Kernels(forward_bytes=4.0, backward_bytes=4.0, forward_kernels=1,
                        backward_kernels=1)
"""A rotation by real tables compiled: one kernel each way reading the tensor (or its
gradient) and writing it, the tables broadcast."""

UNFUSED: dict[Stack, dict[str, Kernels]] = {
    "hf-eager": {
        "norm": Kernels(forward_bytes=28.0, backward_bytes=92.0,
                        forward_kernels=6, backward_kernels=14),
        "input_cast": Kernels(forward_bytes=6.0, backward_bytes=6.0,
                              forward_kernels=1, backward_kernels=1),
        "gradient_sum": Kernels(forward_bytes=0.0, backward_bytes=12.0,
                                forward_kernels=0, backward_kernels=1),
        "rotary": Kernels(forward_bytes=36.0, backward_bytes=56.0,
                          forward_kernels=6, backward_kernels=12),
        "residual": Kernels(forward_bytes=10.0, backward_bytes=18.0,
                            forward_kernels=1, backward_kernels=2),
        "glu": _EAGER_GLU, "activation": _EAGER_ACTIVATION, "loss": _FP32_LOSS,
    },
    "hf-compiled": {
        "norm": Kernels(forward_bytes=6.0, backward_bytes=16.0,
                        forward_kernels=1, backward_kernels=2),
        "input_cast": Kernels(forward_bytes=0.0, backward_bytes=0.0,
                              forward_kernels=0, backward_kernels=0),
        "gradient_sum": _COMPILED_GRADIENT_SUM, "rotary": _FUSED_ROTARY,
        "residual": Kernels(forward_bytes=10.0, backward_bytes=6.0,
                            forward_kernels=1, backward_kernels=1),
        "glu": _COMPILED_GLU, "activation": _EAGER_ACTIVATION,
    },
    "megatron-te": {"loss": _MEGATRON_LOSS},
    "megatron-te-fp8": {"loss": _MEGATRON_LOSS},
    **{fused: {"loss": _MEGATRON_FUSED_LOSS} for fused in FUSED_LOSS_STACKS},
    "megatron-deepspeed": {"loss": _MEGATRON_LOSS},
    "torchtitan-eager": _EAGER_16BIT | {"rotary": _COMPLEX_ROTARY, "rotary_halves": _HALVES_ROTARY},
    "torchtitan-compiled": {
        "gradient_sum": _COMPILED_GRADIENT_SUM, "rotary": _COMPLEX_ROTARY,
        "rotary_halves": _FUSED_ROTARY,
        "residual": Kernels(forward_bytes=6.0, backward_bytes=2.0,
                            forward_kernels=1, backward_kernels=0),
        "glu": _COMPILED_GLU, "activation": _EAGER_ACTIVATION,
        "loss": Kernels(forward_bytes=2.0, backward_bytes=4.0,
                        forward_kernels=2, backward_kernels=2),
    },
    "colossalai-hf": _EAGER_16BIT | {
        "norm": Kernels(forward_bytes=36.0, backward_bytes=96.0,
                        forward_kernels=8, backward_kernels=16),
        "rotary": Kernels(forward_bytes=20.0, backward_bytes=32.0,
                          forward_kernels=5, backward_kernels=8),
    },
}
"""Each stack's kernels per element of the tensor they walk (see the module's docstring for
the count): a norm's input, a projection's input per reader, the gradient summed per reader
past the first, q and k through the rotary embedding, the residual stream, an activation's
output."""

_AUTOCAST_WEIGHT = Kernels(forward_bytes=6.0, backward_bytes=18.0, forward_kernels=1,
                           backward_kernels=2)
WEIGHT_CAST: dict[Stack, Kernels] = {"hf-eager": _AUTOCAST_WEIGHT, "hf-compiled": _AUTOCAST_WEIGHT}
"""Autocast's per-parameter traffic for an fp32 weight: the bf16 copy, and the gradient cast
and accumulated into ``.grad``."""


def _kernels(stack: Stack, part: str) -> Kernels | None:
    return UNFUSED.get(stack, {}).get(part)


def norm(stack: Stack, x: Tensor) -> Unfused | None:
    """A norm over ``x``'s last dim as ``stack`` runs it; None: one fused kernel.

    >>> x = Tensor((("seq", 1024), ("hidden", 64)), 2.0)
    >>> work = norm("hf-eager", x)
    >>> work.forward[0].bytes / x.numel, work.forward_kernels, norm("megatron-te", x)
    (28.0, 6, None)
    """
    kernels = _kernels(stack, "norm")
    return kernels.over(x) if kernels else None


def linear(stack: Stack, x: Tensor, weight: Tensor, readers: int) -> Unfused | None:
    """What ``stack`` runs beside a projection of input ``x`` and ``weight``: the weight's
    cast (autocast's), and where ``readers`` separate projections read one input, a cast each
    (an fp32 input under autocast) and their gradients summed; None when it runs nothing.

    >>> x = Tensor((("seq", 1024), ("hidden", 64)), 2.0)
    >>> w = Tensor((("hidden", 64), ("heads", 64)), 2.0)
    >>> qkv = linear("torchtitan-eager", x, w, 3)
    >>> qkv.backward[0].bytes / x.numel, qkv.weight_backward_bytes, linear("megatron-te", x, w, 3)
    (12.0, 0.0, None)
    """
    weight_cast = WEIGHT_CAST.get(stack)
    work = None if weight_cast is None else Unfused(
        weight_forward_bytes=weight_cast.forward_bytes,
        weight_backward_bytes=weight_cast.backward_bytes,
        forward_kernels=weight_cast.forward_kernels,
        backward_kernels=weight_cast.backward_kernels)  # fmt: skip
    separate = [kernels.times(n).over(x) for part, n in (("input_cast", readers),
                                                          ("gradient_sum", readers - 1))
                if n > 0 and (kernels := _kernels(stack, part)) is not None]  # fmt: skip
    for part in separate:
        work = part if work is None else work.plus(part)
    return work


def rotary(stack: Stack, q: Tensor, k: Tensor, *, halves: bool = False) -> Unfused | None:
    """The rotary embedding on ``q`` and ``k`` as ``stack`` runs it beside the attention
    core (``halves``: rotating their halves by real tables, where the stack's code for the
    model does, torchtitan's Qwen3 block); None: fused into the core's input (Transformer
    Engine's ``apply_rope_fusion``).

    >>> q = Tensor((("seq", 1024), ("heads", 64)), 2.0)
    >>> [rotary("torchtitan-eager", q, q, halves=h).backward[0].bytes / q.numel for h in (0, 1)]
    [20.0, 28.0]
    """
    kernels = (halves and _kernels(stack, "rotary_halves")) or _kernels(stack, "rotary")
    return kernels.over(q).plus(kernels.over(k)) if kernels else None


def residual(stack: Stack, x: Tensor) -> Unfused | None:
    """A residual add on ``x`` as ``stack`` runs it; None: one fused kernel."""
    kernels = _kernels(stack, "residual")
    return kernels.over(x) if kernels else None


def activation(stack: Stack, out: Tensor, *, gated: bool) -> Unfused | None:
    """An MLP's activation writing ``out`` (SwiGLU/GeGLU when ``gated``) as ``stack`` runs
    it; None: one fused kernel."""
    kernels = _kernels(stack, "glu" if gated else "activation")
    return kernels.over(out) if kernels else None


def loss(stack: Stack, logits: Tensor) -> Unfused | None:
    """The cross entropy over ``logits`` as ``stack`` runs it; None: one fused kernel
    (flash-attn's fused cross entropy).

    >>> logits = Tensor((("seq", 4096), ("vocab", 32000)), 2.0)
    >>> stacks = ("megatron-te", "megatron-te-fused-loss", "hf-eager")
    >>> [loss(s, logits).forward[0].bytes / logits.numel for s in stacks]
    [38.0, 22.0, 22.0]
    >>> loss("composer-fsdp", logits) is None
    True
    """
    kernels = _kernels(stack, "loss")
    return kernels.over(logits) if kernels else None


MAIN_GRAD_STACKS: tuple[Stack, ...] = ("megatron-te", "megatron-te-fp8", *FUSED_LOSS_STACKS)
"""Stacks whose data parallelism keeps an fp32 ``main_grad`` beside each 16-bit weight
(Megatron-Core's ``DistributedDataParallel``): a linear's weight-gradient GEMM accumulates into
it (``gradient_accumulation_fusion``), anything else's gradient is added by the parameter's
hook."""


def embedding_gradient_bytes(stack: Stack, gradient_bytes: float) -> float:
    """Bytes per parameter of the local table that the embedding's backward moves beyond the
    rows its tokens touch, on ``stack`` whose embedding gradient has ``gradient_bytes`` an
    element. However few tokens a microbatch holds, PyTorch's backward of a lookup returns a
    dense gradient of the whole table, zero-filled before the rows are added into it
    (``embedding_backward_cuda_kernel``: ``at::zeros({num_weights, ...})`` in
    ``aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu``; the CPU's
    ``embedding_dense_backward_cpu`` in ``aten/src/ATen/native/Embedding.cpp`` alike). That
    gradient is then summed into the weight's:

    - under autocast (:data:`~planner.graph.stacks.AUTOCAST_STACKS`) the table is fp32 and the
      lookup runs outside autocast, so its gradient is fp32, and it is added in fp32, reading
      two tables and writing one: into ``.grad`` by ``AccumulateGrad`` after a step's first
      microbatch, or, with the head's weight tied to it, into the head's gradient by autograd's
      input buffer every microbatch (``torch/csrc/autograd/input_buffer.cpp``); as
      :data:`WEIGHT_CAST` counts a linear's accumulation every microbatch, so is this;
    - on :data:`MAIN_GRAD_STACKS`, Megatron-Core's backward hook adds the 16-bit gradient into
      the fp32 ``main_grad`` (``param.main_grad.add_(param.grad.data)``,
      ``megatron/core/distributed/distributed_data_parallel.py``): the gradient read, the
      main gradient read and written;
    - elsewhere the stack accumulates the embedding's gradient as it does every weight's,
      priced over all parameters (:func:`~planner.cost.data_parallel.gradient_accumulation`),
      or not at all: only the zero-fill is the embedding's own.

    Not priced: Megatron-Core ties the head to the embedding on one stage by handing autograd
    a zeroed dummy gradient for the head's weight (``zero_out_wgrad``,
    ``megatron/core/models/common/language_module/language_module.py``), which autograd sums
    with the lookup's (16-bit: about 8 bytes a parameter more).

    >>> embedding_gradient_bytes("hf-eager", 4.0), embedding_gradient_bytes("megatron-te", 2.0)
    (16.0, 12.0)
    >>> embedding_gradient_bytes("torchtitan-eager", 2.0)
    2.0
    """
    if stack in AUTOCAST_STACKS:
        return gradient_bytes + 3 * gradient_bytes
    if stack in MAIN_GRAD_STACKS:
        return gradient_bytes + (gradient_bytes + 2 * FP32_BYTES)
    return gradient_bytes


def embedding(stack: Stack, *, gradient_bytes: float) -> Unfused:
    """What ``stack`` runs over the embedding's whole local table in the backward
    (:func:`embedding_gradient_bytes`): the zero-fill, and the sum into the weight's gradient
    where the stack runs one for it.

    >>> work = embedding("hf-compiled", gradient_bytes=4.0)
    >>> work.weight_backward_bytes, work.backward_kernels, work.forward_kernels
    (16.0, 2, 0)
    """
    moved = embedding_gradient_bytes(stack, gradient_bytes)
    return Unfused(weight_backward_bytes=moved, backward_kernels=2 if moved > gradient_bytes else 1)
