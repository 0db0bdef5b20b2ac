"""Operators and tensors of the lowered model, with named dimensions.

Vocabulary (as in torchtitan): a *dim* is a tensor dimension (``batch``, ``seq``, ``hidden``,
``heads``, ...); an *axis* is a device-mesh axis. Shardings map dims onto axes; this module
only describes what each operator computes, reads, writes and keeps for its backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from planner.vocabulary import OP_SAC

OpKind = Literal[
    "embedding",  # token (+ position) lookup
    "norm",  # LayerNorm / RMSNorm
    "linear",  # a matrix multiply with a weight
    "attention",  # the attention core: scores, softmax, weighted sum of values
    "elementwise",  # activation functions (GeLU, SwiGLU)
    "residual",  # residual add (+ dropout)
    "router",  # MoE gating scores
    "dispatch",  # MoE token permutation to experts
    "expert_linear",  # a batched matrix multiply over local experts
    "combine",  # MoE un-permutation and weighted sum of expert outputs
    "loss",  # softmax cross-entropy over the vocabulary
]

# Dims that tensor parallelism shards (Megatron's column/row-parallel split points).
TENSOR_PARALLEL_DIMS = frozenset({"heads", "kv_heads", "ffn", "vocab"})
# Dims that expert parallelism shards.
EXPERT_PARALLEL_DIMS = frozenset({"experts"})


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor as named dims with sizes, and the bytes of one element. A small value built
    positionally, as a tuple is (``Tensor(dims, element_bytes)``), unlike the records."""

    dims: tuple[tuple[str, int], ...]
    """(name, size) of each dim, in order: the whole tensor, before any sharding."""
    element_bytes: float
    """Bytes per element: the precision's, or 1 for dropout masks, 4 for token ids and fp32
    values (loss, router logits)."""

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(size for _, size in self.dims)

    @property
    def bytes(self) -> float:
        """Size in bytes."""
        return self.numel * self.element_bytes

    @property
    def dim_names(self) -> frozenset[str]:
        """The names of the dims."""
        return frozenset(name for name, _ in self.dims)

    def size(self, dim: str) -> int:
        """Size of ``dim`` (1 when the tensor does not have it)."""
        for name, size in self.dims:
            if name == dim:
                return size
        return 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Unfused:
    """The memory-bound kernels a stack runs for an op as separate launches
    (:mod:`planner.graph.unfused` counts them from each stack's source): for a norm, a residual
    add or an activation they are the op; beside a GEMM or the attention core, the casts and
    the rotary embedding around it. Traffic is in tensors whose ``element_bytes`` are the bytes
    read and written per element, so that a sharding divides it as it divides the tensor."""

    forward: tuple[Tensor, ...] = ()
    """The forward's traffic."""
    backward: tuple[Tensor, ...] = ()
    """The backward's traffic."""
    forward_kernels: int = 0
    """Kernels the forward launches."""
    backward_kernels: int = 0
    """Kernels the backward launches."""
    weight_forward_bytes: float = 0.0
    """Bytes read and written per local parameter in the forward (autocast's cast of an fp32
    weight to the compute precision)."""
    weight_backward_bytes: float = 0.0
    """Bytes per local parameter in the backward (the weight gradient cast to fp32 and added
    into ``.grad``)."""

    def plus(self, other: Unfused) -> Unfused:
        """Both sets of kernels."""
        return Unfused(
            forward=self.forward + other.forward, backward=self.backward + other.backward,
            forward_kernels=self.forward_kernels + other.forward_kernels,
            backward_kernels=self.backward_kernels + other.backward_kernels,
            weight_forward_bytes=self.weight_forward_bytes + other.weight_forward_bytes,
            weight_backward_bytes=self.weight_backward_bytes + other.weight_backward_bytes,
        )  # fmt: skip


TRANSFORMER_KINDS = ("dense", "local", "moe")
"""The decoder layers' kinds (:func:`planner.graph.lower.decoder_layer_kind`): what recomputes,
shards by heads and holds a transformer block, unlike the embedding and the head."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operator of one layer, for one microbatch, forward pass.

    ``flops`` counts multiply-adds as 2 FLOPs and only matrix multiplies (and the attention
    core's two batched matmuls, with the full ``s x s`` score matrix), as Narayanan et al.
    (SC'21, Eq. 3) and Korthikanti et al. (MLSys'23, Eq. 7) count model FLOPs; memory-bound
    operators are priced by ``bytes_moved`` instead.
    """

    name: str
    """Graph-wide name: ``layer<n>.<op>`` in decoder layers, the bare op name in the embedding and
    head layers."""
    kind: OpKind
    """What the op computes (:data:`OpKind`), which decides its strategies and pricing."""
    layer: int
    """0 = embedding, 1..L = decoder layers, L + 1 = final norm, LM head and loss."""
    layer_kind: str
    """Layers of the same kind are identical: ``embedding``, ``dense``, ``local`` (sliding-window
    attention), ``moe``, ``head``."""
    inputs: tuple[Tensor, ...]
    """The activations the forward reads, whole (one microbatch, unsharded)."""
    output: Tensor
    """The activation the forward writes, whole."""
    weight: Tensor | None = None
    """The weight as (input dim, output dim) or (experts, input dim, output dim)."""
    bias_params: int = 0
    """Bias parameters (split as the weight's output dim)."""
    extra_params: int = 0
    """Parameters outside ``weight`` and bias (e.g. learned position embeddings)."""
    flops: float = 0.0
    """Forward matmul FLOPs of the whole microbatch, unsharded (0 for memory-bound ops)."""
    saved: tuple[Tensor, ...] = ()
    """Activations kept for the backward pass (Korthikanti et al., Sec. 4)."""
    working: tuple[Tensor, ...] = ()
    """Transient tensors live while the op's forward or backward runs, beyond what it keeps
    (the loss's gradients over the vocabulary)."""
    gemm_calls: int = 1
    """Separate matrix multiplies the work is split into (one per local expert)."""
    active_fraction: float = 1.0
    """Fraction of the parameters a token uses (top_k / num_experts for routed experts)."""
    tied_to: str | None = None
    """Name of the op whose weight this op shares (tied LM head)."""
    score_tensors: tuple[Tensor, ...] = ()
    """The attention core's ``s x s`` tensors (softmax output, dropout mask and output): kept
    unless selective recompute or flash attention drops them."""
    key_span: float = 0.0
    """The attention core's keys per query in the full-square convention of ``flops`` (the ``s``
    of ``s x s``, which a causal kernel halves), bounded by a sliding window
    (:meth:`planner.spec.attention.SlidingWindowSpec.key_span`); 0: the whole sequence."""
    unfused: Unfused | None = None
    """The separate memory-bound kernels the stack runs for the op (:class:`Unfused`); None:
    one fused kernel reading its inputs and writing its output once (a GEMM or the attention
    core alone)."""
    fp8: bool = False
    """Its GEMMs run in FP8, and it keeps its input in FP8 (:mod:`planner.graph.fp8`)."""
    units: tuple[tuple[str, int], ...] = ()
    """Indivisible units of a dim when it is not its size: the ``heads`` dims hold
    ``heads x head_dim`` features but split only by whole (key/value) heads."""
    recomputed_by: tuple[str, ...] = ()
    """The recompute modules (Megatron-Core's ``--recompute-modules``,
    :data:`planner.vocabulary.RECOMPUTE_MODULES`) whose selective recomputation runs this op's
    forward again."""
    discarded_by: tuple[str, ...] = ()
    """The output-discarding recompute modules whose output this op reads: under any of them
    the op keeps none of its inputs (that module's rerun rebuilds them for the backward)."""
    checkpointed_by: tuple[str, ...] = ()
    """The checkpointed recompute modules this op runs inside: under any of them the op keeps
    nothing for its backward (but :attr:`checkpoint_input_of`'s), and its forward, its
    collectives and the resharding around it run again."""
    checkpoint_input_of: tuple[str, ...] = ()
    """The checkpointed modules whose input is this op's input: kept under them, once."""
    saves_output: float = 0.0
    """Under torchtitan's per-operator policy (:data:`~planner.vocabulary.OP_SAC`), the share
    of the op's output the policy saves, which is also the share of its own kernels' forward
    not run again (the fused qkv projection: ``wq``'s and ``wv``'s of its three matmuls);
    0: all of it recomputed."""
    output_unread: bool = False
    """Under the per-operator policy compiled, the backward reads none of the op's output
    (``w2``'s, which only a residual add takes): Inductor's partitioner keeps none of it, and
    none of it runs again."""

    @property
    def routed(self) -> bool:
        """Whether the op routes tokens to experts or computes on routed tokens (the
        dispatch and combine, the experts' linears and activations)."""
        return self.kind in ("dispatch", "combine", "expert_linear") or (
            self.kind == "elementwise" and "experts" in self.output.dim_names)

    def checkpointed(self, modules: Collection[str]) -> bool:
        """Whether the op runs inside a checkpointed recompute module among ``modules``: its
        forward, its collectives and the resharding around it run again."""
        return not set(self.checkpointed_by).isdisjoint(modules)

    def reruns(self, modules: Collection[str]) -> bool:
        """Whether selective recomputation of ``modules`` runs the op's forward again."""
        return not set(self.recomputed_by).isdisjoint(modules) or self.checkpointed(modules)

    def output_saved(self, modules: Collection[str]) -> float:
        """The share of the op's output that selective recomputation of ``modules`` keeps, and
        of its own kernels' forward that it does not rerun: :attr:`saves_output` under
        torchtitan's per-operator policy, else 0."""
        return self.saves_output if OP_SAC in modules and self.checkpointed(modules) else 0.0

    def output_kept(self, modules: Collection[str]) -> float:
        """The share of the op's output that selective recomputation of ``modules`` keeps:
        :meth:`output_saved`'s, but none where the backward never reads it
        (:attr:`output_unread`)."""
        return 0.0 if self.output_unread else self.output_saved(modules)

    def local_params(self, weight_degrees: Mapping[str, int]) -> float:
        """Parameters one device holds when weight dim ``d`` is split ``weight_degrees[d]``
        ways: the weight's shard, the bias split as the weight's output dim, the rest whole
        (tied weights count 0)."""
        if self.params == 0:
            return 0.0
        local = float(self.extra_params)
        if self.weight is not None:
            shard = 1
            for name, size in self.weight.dims:
                shard *= -(-size // weight_degrees.get(name, 1))
            local += shard + self.bias_params / weight_degrees.get(self.weight.dims[-1][0], 1)
        return local

    def splittable(self, dim: str, size: int, degree: int) -> bool:
        """Whether ``dim`` (of ``size``) splits evenly ``degree`` ways."""
        units = dict(self.units).get(dim, size)
        return units % degree == 0

    @property
    def params(self) -> int:
        """Trainable parameters owned by this op (0 for a tied weight)."""
        if self.tied_to is not None:
            return 0
        weight = self.weight.numel if self.weight is not None else 0
        return weight + self.bias_params + self.extra_params

    @property
    def bytes_moved(self) -> float:
        """Bytes read and written by the forward pass."""
        weight = self.weight.bytes if self.weight is not None else 0.0
        return sum(t.bytes for t in self.inputs) + self.output.bytes + weight

    @property
    def saved_bytes(self) -> float:
        """Bytes kept for backward with no recomputation and no parallelism."""
        return sum(t.bytes for t in self.saved) + sum(t.bytes for t in self.score_tensors)

    @property
    def head_dim(self) -> float:
        """Dims per query head of the attention core (its queries' features over the scores'
        heads); 0 for any other op."""
        if self.kind != "attention" or not self.score_tensors:
            return 0.0
        return self.inputs[0].size("heads") / self.score_tensors[0].size("heads")

    @property
    def is_gemm(self) -> bool:
        """Whether the op is priced as matrix multiplies (compute-bound)."""
        return self.kind in ("linear", "expert_linear", "attention")
