"""The kernels ``planner bench`` times: the shapes the cost model prices for one model.

Each case is one kernel as the cost model sees it, with the FLOPs and bytes
:func:`planner.cost.compute_time_s` prices it by, so that a measured time and a predicted one
are about the same work:

- every GEMM of a decoder layer and of the head, at each tensor-parallel degree that splits it
  and each microbatch, in its three orientations (the forward ``X W^T``, the input gradient
  ``dY W`` and the weight gradient ``dY^T X``, in Megatron-LM's operand layouts: the cost
  model prices all three by their FLOPs per call);
- for a mixture of experts, a rank's local experts as one grouped GEMM (torchtitan's
  ``torch._grouped_mm``, which prices Megatron-Core's ``--moe-grouped-gemm`` too), the first
  MoE layer's up and down projections with tokens per expert from a hundred to a few
  thousand (the experts' share of a microbatch's tokens at the expert-parallel degrees plans
  run): the grouped-GEMM curve's tokens and reduction terms need both to vary;
- with ``--fp8``, each decoder GEMM's forward again on FP8 operands (``torch._scaled_mm``):
  the device's FP8 speedup over its 16-bit GEMMs (:mod:`planner.diagnose.fp8_gemms`);
- fused causal attention, forward and backward, at the model's sequence length and shorter
  ones, with the model's head dim and the common 64 and 128 (the curve's head-dim term needs
  more than one);
- memory-bound kernels: an add (the residual, STREAM's "add") of a few kilobytes, which
  fixes the launch cost, and of more than the device's cache and the model's activations,
  which fixes the bandwidth;
- checks of the memory-bound price, not fitted: the model's norm and activation function at
  its activations' sizes, and one Adam step over a decoder layer's parameters.

Nothing here needs PyTorch; :mod:`planner.diagnose.bench_torch` runs the cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from planner.cost import CAUSAL_FRACTION, ELEMENTWISE_BACKWARD_FACTOR, FLASH_BACKWARD_FACTOR
from planner.graph import lowered
from planner.graph.lower import ACTIVATION_BYTES
from planner.graph.ops import TENSOR_PARALLEL_DIMS, Op
from planner.graph.stacks import grouped_experts
from planner.spec import ModelSpec, TrainingSpec

BenchKind = Literal["gemm", "grouped_gemm", "fp8_gemm", "attention", "memory", "elementwise",
                    "optimizer"]
Kernel = Literal["matmul", "grouped_matmul", "scaled_matmul", "attention_forward",
                 "attention_backward", "add", "layer_norm", "rms_norm", "gelu", "silu",
                 "adam"]  # fmt: skip

GROUPED_TOKENS = (128, 256, 512, 1024, 2048, 4096)
"""Tokens per expert of the grouped GEMMs timed: the range ``../shared/validation/h100/
expert_gemms.jsonl`` measured above the curve's fit floor, and plans run in."""
LOCAL_EXPERTS = 8
"""Local experts in a grouped GEMM timed (fewer when the model has fewer)."""

ATTENTION_HEAD_DIMS = (64, 128)
"""Head dims timed besides the model's own: the attention curve's head-dim term is fitted
only from more than one."""
SHORTEST_ATTENTION_SEQ = 128
"""Sequences shorter than this are not timed: the kernels' tiles are 64 to 128 rows."""
SMALL_ADD_ELEMENTS = (1 << 10, 1 << 12, 1 << 14)
"""Adds of a few kilobytes: their time is the launch cost."""
LARGE_ADD_ELEMENTS = (1 << 24, 1 << 25, 1 << 26)
"""Adds of 32 to 128 MiB a tensor in bf16, three tensors each: past every device's last-level
cache (50 MiB on H100, 192 MiB on Ascend 910B), so that their time is HBM's bandwidth. Sizes
between the two sets run in cache, which the roofline has no term for: they are not timed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchCase:
    """One kernel to time and the work the cost model prices it by."""

    kind: BenchKind
    """Which part of the efficiency block the case measures."""
    kernel: Kernel
    """What the runner executes."""
    label: str
    """Where the shape comes from, e.g. ``layer1.mlp_up tp2 mb1 dW``."""
    shape: tuple[int, ...]
    """``matmul``: (m, k, n) for an (m x k) by (k x n) product; attention: (batch, heads, seq,
    head_dim); memory-bound kernels: (rows, columns) of their input; ``adam``: (params,)."""
    transposed: Literal["", "a", "b"] = ""
    """``matmul``: which operand is read transposed (stored (k x m) for ``a``, (n x k) for
    ``b``), as the framework lays it out."""
    flops: float
    """FLOPs the cost model prices (a fused causal kernel's executed ones)."""
    bytes_moved: float
    """Bytes the kernel reads and writes."""
    keys_per_query: float = 0.0
    """Attention: keys each query attends to on average (half the sequence, causal)."""
    head_dim: float = 0.0
    """Attention: dims per head."""
    calls: int = 1
    """Kernels the cost model charges a launch for (two for attention's backward)."""


def _matmuls(op: Op, tokens: int, degree: int, mb: int, element_bytes: float
             ) -> list[BenchCase]:
    """The three GEMMs of a linear op's forward and backward on one of ``degree``
    tensor-parallel ranks (its weight split along the dim tensor parallelism splits), in the
    operand layouts Megatron-LM runs them with its weight stored (out, in): ``Y = X W^T``,
    ``dX = dY W``, ``dW = dY^T X`` (NVIDIA/Megatron-LM@d98e8a64dd
    ``megatron/core/tensor_parallel/layers.py:459, 683, 782``)."""
    assert op.weight is not None
    (in_name, k), (out_name, n) = op.weight.dims[-2:]
    k //= degree if in_name in TENSOR_PARALLEL_DIMS else 1
    n //= degree if out_name in TENSOR_PARALLEL_DIMS else 1
    m = tokens
    cases = []
    for suffix, (a, b, c), transposed in (("fwd", (m, k, n), "b"), ("dX", (m, n, k), ""),
                                          ("dW", (n, m, k), "a")):  # fmt: skip
        cases.append(BenchCase(
            kind="gemm", kernel="matmul", label=f"{op.name} tp{degree} mb{mb} {suffix}",
            shape=(a, b, c), transposed=transposed, flops=2.0 * a * b * c,  # type: ignore[arg-type]
            bytes_moved=(a * b + b * c + a * c) * element_bytes))  # fmt: skip
    return cases


def _splits(op: Op, degree: int) -> bool:
    """Whether tensor parallelism of ``degree`` splits the op's weight evenly."""
    assert op.weight is not None
    return any(op.splittable(name, size, degree) for name, size in op.weight.dims
               if name in TENSOR_PARALLEL_DIMS)  # fmt: skip


def gemm_cases(model: ModelSpec, training: TrainingSpec, *, tensor_parallel: Sequence[int],
               micro_batches: Sequence[int]) -> list[BenchCase]:
    """The GEMMs of the first decoder layer of each kind and of the head, per tensor-parallel
    degree that splits them and per microbatch; shapes met twice are timed once. A routed
    expert's GEMM is one expert's share of the tokens."""
    element_bytes = ACTIVATION_BYTES[training.precision]
    cases: dict[tuple[int | str, ...], BenchCase] = {}
    for mb in micro_batches:
        for op in _first_of_each_kind(model, training, mb):
            if op.kind not in ("linear", "expert_linear") or op.weight is None:
                continue
            k, n = (size for _, size in op.weight.dims[-2:])
            tokens = round(op.flops / op.gemm_calls / (2.0 * k * n))
            for degree in tensor_parallel:
                if degree > 1 and not _splits(op, degree):
                    continue
                for case in _matmuls(op, tokens, degree, mb, element_bytes):
                    cases.setdefault((*case.shape, case.transposed), case)
    return list(cases.values())


def fp8_gemm_cases(gemms: Sequence[BenchCase]) -> list[BenchCase]:
    """Each decoder layer's forward GEMM of ``gemms`` again on FP8 operands (E4M3, per-tensor
    scales: ``torch._scaled_mm``, the kernel ``../shared/validation/h100/gemms_fp8_vs_bf16.jsonl``
    times, whose second operand is stored transposed as the forward's weight is), reading
    half the bytes: the device's FP8 speedup is what prices them as they ran
    (``planner.diagnose.bench_fit``). The head stays 16-bit in FP8 runs."""
    return [replace(c, kind="fp8_gemm", kernel="scaled_matmul", label=f"{c.label} fp8",
                    bytes_moved=c.bytes_moved / 2)
            for c in gemms
            if c.kind == "gemm" and c.transposed == "b" and c.label.startswith("layer")]


def grouped_gemm_cases(model: ModelSpec, training: TrainingSpec) -> list[BenchCase]:
    """The first MoE layer's expert projections as one grouped GEMM over
    :data:`LOCAL_EXPERTS` local experts of each of :data:`GROUPED_TOKENS` tokens; none for a
    dense model or a precision the grouped kernels do not run in (bf16 only:
    :func:`planner.graph.stacks.grouped_experts`). ``shape`` is (experts, tokens per expert,
    k, n)."""
    if model.moe is None or not grouped_experts("megatron-te", training.precision):
        return []
    experts = min(LOCAL_EXPERTS, model.moe.num_experts)
    cases = []
    for op in _first_of_each_kind(model, training, 1):
        if op.kind != "expert_linear" or op.weight is None:
            continue
        k, n = (size for _, size in op.weight.dims[-2:])
        name = op.name.rsplit(".", 1)[-1]
        for tokens in GROUPED_TOKENS:
            cases.append(BenchCase(
                kind="grouped_gemm", kernel="grouped_matmul",
                label=f"{name} {experts}x{tokens}", shape=(experts, tokens, k, n),
                flops=2.0 * experts * tokens * k * n, bytes_moved=0.0))  # fmt: skip
    return cases


def attention_cases(model: ModelSpec, training: TrainingSpec) -> list[BenchCase]:
    """Fused causal attention, forward and backward, at the model's sequence length and its
    halvings down to :data:`SHORTEST_ATTENTION_SEQ`, with the model's head dim and
    :data:`ATTENTION_HEAD_DIMS`; the model's heads, one sequence a call."""
    element_bytes = ACTIVATION_BYTES[training.precision]
    core = next((op for op in _first_of_each_kind(model, training, 1)
                 if op.kind == "attention"), None)  # fmt: skip
    if core is None:
        return []
    heads = model.num_attention_heads
    head_dims = sorted({round(core.head_dim), *ATTENTION_HEAD_DIMS})
    seqs, seq = [], training.seq_length
    while seq >= SHORTEST_ATTENTION_SEQ or not seqs:
        seqs.append(seq)
        seq //= 2
    cases = []
    for s in seqs:
        for d in head_dims:
            forward = CAUSAL_FRACTION * 4.0 * heads * s * s * d
            qkvo = 4 * heads * s * d * element_bytes
            for kernel, flops, moved, calls in (
                ("attention_forward", forward, qkvo, 1),
                ("attention_backward", FLASH_BACKWARD_FACTOR * forward,
                 ELEMENTWISE_BACKWARD_FACTOR * qkvo, 2),
            ):
                cases.append(BenchCase(
                    kind="attention", kernel=kernel,  # type: ignore[arg-type]
                    label=f"attention s{s} d{d} {'fwd' if calls == 1 else 'bwd'}",
                    shape=(1, heads, s, d), flops=flops, bytes_moved=moved,
                    keys_per_query=CAUSAL_FRACTION * s, head_dim=d, calls=calls))  # fmt: skip
    return cases


def memory_cases(model: ModelSpec, training: TrainingSpec, *,
                 micro_batches: Sequence[int]) -> list[BenchCase]:
    """Adds of :data:`SMALL_ADD_ELEMENTS` and :data:`LARGE_ADD_ELEMENTS` (and of four times
    the largest microbatch's residual stream when that is larger still); then, as checks,
    the model's norm over the residual stream and its activation function over the FFN's
    activations (SwiGLU timed as its SiLU, one kernel), per microbatch."""
    element_bytes = ACTIVATION_BYTES[training.precision]
    hidden, tokens = model.hidden_size, training.seq_length
    stream = 4 * max(micro_batches) * tokens * hidden
    sizes = [*SMALL_ADD_ELEMENTS, *LARGE_ADD_ELEMENTS]
    if stream > sizes[-1]:
        sizes.append(stream)
    cases = [BenchCase(kind="memory", kernel="add", label=f"add {size}", shape=(1, size),
                       flops=0.0, bytes_moved=3.0 * size * element_bytes)
             for size in sizes]  # fmt: skip
    norm = "layer_norm" if model.normalization == "layernorm" else "rms_norm"
    activation = "silu" if model.activation == "swiglu" else "gelu"  # GeGLU's gate is GeLU
    for mb in micro_batches:
        rows = mb * tokens
        for kernel, columns in ((norm, hidden), (activation, model.ffn)):
            cases.append(BenchCase(
                kind="elementwise", kernel=kernel,  # type: ignore[arg-type]
                label=f"{kernel} mb{mb}", shape=(rows, columns), flops=0.0,
                bytes_moved=2.0 * rows * columns * element_bytes))  # fmt: skip
    return cases


def optimizer_case(model: ModelSpec, training: TrainingSpec) -> BenchCase:
    """Adam over the parameters of the first decoder layer (no tensor parallelism): fp32
    master weights, moments and gradients, then the compute-precision copy of the weights."""
    layer = next(ops for ops in _layers(model, training, 1) if ops[0].layer >= 1)
    params = sum(op.params for op in layer)
    return BenchCase(kind="optimizer", kernel="adam", label=f"adam {params} params",
                     shape=(params,), flops=0.0, bytes_moved=0.0)


def bench_cases(model: ModelSpec, training: TrainingSpec, *, tensor_parallel: Sequence[int],
                micro_batches: Sequence[int], fp8: bool = False) -> list[BenchCase]:
    """Every case of ``model`` at ``training``'s sequence length and precision (and, with
    ``fp8``, the FP8 twins of its forward GEMMs: :func:`fp8_gemm_cases`).

    >>> from planner.spec import ModelSpec, TrainingSpec
    >>> model = ModelSpec(name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4,
    ...                   vocab_size=512, max_position_embeddings=256)
    >>> cases = bench_cases(model, TrainingSpec(seq_length=256, global_batch_size=1),
    ...                     tensor_parallel=(1, 2), micro_batches=(1,))
    >>> sorted({c.kind for c in cases})
    ['attention', 'elementwise', 'gemm', 'memory', 'optimizer']
    >>> next(c.shape for c in cases if c.label == "layer1.mlp_up tp2 mb1 fwd")
    (256, 256, 512)
    """
    gemms = gemm_cases(model, training, tensor_parallel=tensor_parallel,
                       micro_batches=micro_batches)
    return [*gemms, *(fp8_gemm_cases(gemms) if fp8 else ()),
            *grouped_gemm_cases(model, training),
            *attention_cases(model, training),
            *memory_cases(model, training, micro_batches=micro_batches),
            optimizer_case(model, training)]  # fmt: skip


def _layers(model: ModelSpec, training: TrainingSpec, mb: int) -> list[tuple[Op, ...]]:
    """The ops of the first layer of each kind (embedding, dense, MoE, head)."""
    index = lowered(model, training, mb)[1]
    return [index.ops_by_layer[layers[0]] for layers in index.layers_by_kind.values()]


def _first_of_each_kind(model: ModelSpec, training: TrainingSpec, mb: int) -> list[Op]:
    return [op for ops in _layers(model, training, mb) for op in ops]
