"""Transformer Engine's FP8 linear layers as Megatron-Core runs them: the ``megatron-te-fp8``
stack (``--fp8-format hybrid``, Megatron's default ``--fp8-recipe delayed``:
``megatron/core/transformer/transformer_config.py:587-600`` at NVIDIA/Megatron-LM d98e8a6).

Which operators: the decoder layers' projections, which Megatron-Core builds from Transformer
Engine's modules (``megatron/core/extensions/transformer_engine.py``: the layer-norm-fused and
plain column- and row-parallel linears, and the grouped linear of the routed experts) and runs
under TE's FP8 autocast. The router (``megatron/core/transformer/moe/router.py``, a plain
``torch`` matmul), the embedding and the output layer (Megatron's own ``ColumnParallelLinear``,
``megatron/core/tensor_parallel/layers.py``) stay in the compute precision, as do the attention
core, the norms and the elementwise work.

What an FP8 linear changes, read at NVIDIA/TransformerEngine d0067d0
(``transformer_engine/pytorch/module/linear.py``, ``layernorm_linear.py``):

- Its three GEMMs (forward, input gradient, weight gradient) run on FP8 operands: priced at
  the device's measured FP8 speedup over its 16-bit GEMMs (``efficiency.fp8``,
  :func:`planner.cost.compute.op_time`).
- The forward quantizes its input: one kernel reading the 16-bit input and writing it in FP8
  row-wise and column-wise (the transposed copy the weight gradient reads), 2 + 1 + 1 bytes an
  element. A linear fused with the norm before it (``LayerNormLinear``) gets its input from
  the norm kernel already quantized (``with_quantized_norm``, ``layernorm_linear.py:244-263``),
  at no extra traffic.
- The backward quantizes the output's gradient the same way: 4 bytes an element, one kernel.
- The backward keeps the input in FP8, 1 byte an element where 16-bit training keeps 2: the
  column-wise copy alone (``linear.py:599-616`` discards the row-wise data it does not need),
  or under sequence parallelism the row-wise shard it gathers again (FP8 column-wise data
  cannot be all-gathered).
- Each weight has an FP8 copy row-wise and column-wise, 2 bytes a parameter, made at a step's
  first microbatch and kept through it (Megatron-Core passes ``is_first_microbatch`` to TE's
  modules: ``megatron/core/extensions/transformer_engine.py:1338-1345``): counted with the
  weights' states (:data:`planner.cost.memory.HELD_STATE`), on every parameter, the
  embedding's, the head's and the router's included (an over-count of 2 bytes a parameter of
  theirs).

Under sequence parallelism the input is all-gathered in FP8, and in the backward the output's
gradient (``base.py`` ``grad_output_preprocess``): :func:`planner.sharding.assignment.
fp8_gathers`. Not priced: delayed scaling's amax history and scale updates (a few numbers a
tensor) and the weights' quantization (4 bytes a parameter once a step).
"""

from __future__ import annotations

from planner.graph.ops import TRANSFORMER_KINDS, Tensor, Unfused
from planner.vocabulary import FP8_STACKS, Stack

FP8_BYTES = 1.0
"""Bytes of an FP8 element (E4M3 or E5M2)."""
QUANTIZE_BYTES = 4.0
"""Bytes a quantization moves per element: the 16-bit tensor read, its FP8 copies row-wise and
column-wise written."""


def runs_fp8(stack: Stack, layer_kind: str) -> bool:
    """Whether ``stack`` runs the linear layers of a layer of ``layer_kind`` in FP8: a
    decoder layer's, not the embedding's or the head's.

    >>> runs_fp8("megatron-te-fp8", "moe"), runs_fp8("megatron-te-fp8", "head")
    (True, False)
    >>> runs_fp8("megatron-te", "dense")
    False
    """
    return stack in FP8_STACKS and layer_kind in TRANSFORMER_KINDS


def quantization(x: Tensor, y: Tensor, *, quantized_by_norm: bool) -> Unfused:
    """The quantization kernels of an FP8 linear reading ``x`` and writing ``y``: the input's
    (none when the norm before it quantizes it) and, in the backward, the output gradient's.

    >>> x = Tensor((("seq", 1000), ("hidden", 10)), 2.0)
    >>> q = quantization(x, x, quantized_by_norm=True)
    >>> q.forward_kernels, q.backward_kernels, q.backward[0].bytes
    (0, 1, 40000.0)
    """
    forward = () if quantized_by_norm else (Tensor(x.dims, QUANTIZE_BYTES),)
    return Unfused(forward=forward, backward=(Tensor(y.dims, QUANTIZE_BYTES),),
                   forward_kernels=len(forward), backward_kernels=1)  # fmt: skip


def fp8_copy_ratio(element_bytes: float) -> float:
    """An FP8 copy's bytes over those of the tensor of ``element_bytes`` an element it copies:
    what an FP8 linear keeps of its input, and what an FP8 all-gather moves.

    >>> fp8_copy_ratio(2.0)
    0.5
    """
    return FP8_BYTES / element_bytes
