"""How a uniform Megatron-style configuration shards each operator.

An op's role follows from its dims, not from its name: one whose input has no
tensor-parallel dim (``heads``, ``kv_heads``, ``ffn``, ``vocab``) but whose output has one is
*column-parallel* (Shoeybi et al. 2019, Fig. 3a); one whose input or weight-input has such a
dim and whose output has none is *row-parallel*; ops with those dims on both sides are local to
the tensor-parallel region; the rest (norms, residuals, routers, replicated projections) act on
the residual stream, which sequence parallelism splits along ``seq`` (Korthikanti et al. 2023).

The collectives are Megatron's ``f``/``g`` operators: without sequence parallelism, a
row-parallel output is all-reduced forward and a column-parallel input gradient backward; with
it, all-gather / reduce-scatter pairs replace them and the column-parallel input is gathered
again in backward because only its shard is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.graph.ops import EXPERT_PARALLEL_DIMS, TENSOR_PARALLEL_DIMS, Op, Tensor

MeshAxis = Literal["tp", "cp", "ep"]
Phase = Literal["forward", "backward"]
CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
Role = Literal["sequence", "column", "row", "tensor"]
# Dims that follow the tokens: split by context parallelism, and by sequence parallelism in
# the residual stream.
TOKEN_DIMS = ("seq", "capacity")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective an op needs per microbatch."""

    kind: CollectiveKind
    nbytes: float
    axis: MeshAxis
    phase: Phase


@dataclass(frozen=True, slots=True)
class OpSharding:
    """An op's sharding on one device: degrees per dim, and the collectives it needs."""

    role: Role
    activation_degrees: dict[str, int]
    """How its inputs and outputs are split while it computes."""
    stream_degrees: dict[str, int]
    """How the residual stream (tensors without tensor-parallel dims) is split."""
    weight_degrees: dict[str, int]
    compute_degree: int
    gemm_calls: int
    collectives: tuple[Collective, ...]
    weight_sync_axes: tuple[str, ...]
    """Axes over which its weight gradients are summed: ``dp`` (data x context parallel),
    ``edp`` (expert data parallel), ``tp`` (sequence-parallel replicated weights)."""


def _has(tensor: Tensor | None, dims: frozenset[str]) -> bool:
    return tensor is not None and bool(tensor.dim_names & dims)


def op_role(op: Op) -> Role:
    """The op's place in Megatron's tensor-parallel pattern (see the module docstring)."""
    weight_in = op.weight.dims[-2][0] if op.weight is not None else None
    weight_out = op.weight.dims[-1][0] if op.weight is not None else None
    tp_in = any(_has(t, TENSOR_PARALLEL_DIMS) for t in op.inputs) or (
        weight_in in TENSOR_PARALLEL_DIMS
    )
    tp_out = _has(op.output, TENSOR_PARALLEL_DIMS) or weight_out in TENSOR_PARALLEL_DIMS
    if tp_in and tp_out:
        return "tensor"
    if tp_out:
        return "column"
    if tp_in:
        return "row"
    return "sequence"


def _token_bytes(tensor: Tensor, token_degree: int) -> float:
    """Bytes of ``tensor`` with its token dims split ``token_degree`` ways (dims unsplit else)."""
    numel = 1
    for name, size in tensor.dims:
        numel *= -(-size // token_degree) if name in TOKEN_DIMS else size
    return numel * tensor.element_bytes


def megatron_sharding(op: Op, *, tp: int, sp: bool, cp: int, ep: int) -> OpSharding:
    """The sharding Megatron-LM gives ``op`` under TP ``tp`` (with SP if ``sp``), CP ``cp``
    and EP ``ep`` (experts' FFN dims split by TP too, Megatron's default expert-TP).

    >>> from planner.graph.ops import Op, Tensor
    >>> x = Tensor((("batch", 1), ("seq", 8), ("hidden", 4)), 2.0)
    >>> y = Tensor((("batch", 1), ("seq", 8), ("ffn", 16)), 2.0)
    >>> up = Op(name="up", kind="linear", layer=1, layer_kind="dense", inputs=(x,), output=y,
    ...         weight=Tensor((("hidden", 4), ("ffn", 16)), 2.0), flops=1024.0, saved=(x,))
    >>> s = megatron_sharding(up, tp=2, sp=False, cp=1, ep=1)
    >>> s.role, s.compute_degree, [(c.kind, c.phase) for c in s.collectives]
    ('column', 2, [('all_reduce', 'backward')])
    """
    role = op_role(op)
    sp_degree = tp if sp and tp > 1 else 1
    tensor_dims = dict.fromkeys(TENSOR_PARALLEL_DIMS, tp)
    stream = {name: cp * sp_degree for name in TOKEN_DIMS}  # the residual stream's split
    local = {name: cp for name in TOKEN_DIMS} | tensor_dims  # inside the TP region

    activation = stream if role == "sequence" else local
    weight = dict(tensor_dims)
    if op.kind == "expert_linear":  # routers keep all experts' columns on every rank
        weight.update(dict.fromkeys(EXPERT_PARALLEL_DIMS, ep))
    compute = cp * (sp_degree if role == "sequence" else tp)

    collectives: list[Collective] = []
    if tp > 1 and role == "column":
        full = _token_bytes(op.inputs[0], cp)
        if sp_degree > 1:
            collectives += [
                Collective("all_gather", full, "tp", "forward"),
                Collective("reduce_scatter", full, "tp", "backward"),
                Collective("all_gather", full, "tp", "backward"),
            ]
        else:
            collectives.append(Collective("all_reduce", full, "tp", "backward"))
    if tp > 1 and role == "row":
        full = _token_bytes(op.output, cp)
        if sp_degree > 1:
            collectives += [
                Collective("reduce_scatter", full, "tp", "forward"),
                Collective("all_gather", full, "tp", "backward"),
            ]
        else:
            collectives.append(Collective("all_reduce", full, "tp", "forward"))
    if ep > 1 and op.kind in ("dispatch", "combine"):
        routed = op.output if op.kind == "dispatch" else op.inputs[0]
        local_bytes = _token_bytes(routed, cp * sp_degree)
        collectives += [
            Collective("all_to_all", local_bytes, "ep", "forward"),
            Collective("all_to_all", local_bytes, "ep", "backward"),
        ]
    if cp > 1 and op.kind == "attention":
        # Ring attention passes every K/V block around the CP group (an all-gather's traffic)
        # and their gradients back (a reduce-scatter's).
        kv = sum(_token_bytes(t, 1) / tp for t in op.inputs[1:])
        collectives += [
            Collective("all_gather", kv, "cp", "forward"),
            Collective("reduce_scatter", kv, "cp", "backward"),
        ]

    sync: tuple[str, ...] = ()
    if op.params:
        sync = ("edp",) if op.kind == "expert_linear" else ("dp",)
        if role == "sequence" and sp_degree > 1:
            sync += ("tp",)
    return OpSharding(
        role=role,
        activation_degrees=activation,
        stream_degrees=stream,
        weight_degrees=weight,
        compute_degree=compute,
        gemm_calls=max(1, op.gemm_calls // ep),
        collectives=tuple(collectives),
        weight_sync_axes=sync,
    )


def saved_degrees(sharding: OpSharding, tensor: Tensor) -> dict[str, int]:
    """How a kept activation is split: residual-stream tensors (no tensor-parallel dim) as the
    stream is, so under SP a column-parallel op keeps only its input's shard and re-gathers it
    in backward, and the embedding's dropout mask is split too (Megatron scatters to the
    sequence-parallel region before that dropout); the rest as the op computes them."""
    if _has(tensor, TENSOR_PARALLEL_DIMS):
        return sharding.activation_degrees
    return sharding.stream_degrees


def local_params(op: Op, sharding: OpSharding) -> float:
    """Parameters of ``op`` held by one device under ``sharding`` (tied weights count 0)."""
    return op.local_params(sharding.weight_degrees)
