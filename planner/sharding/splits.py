"""Which ways an operator can be split over a logical mesh, and the layouts each way implies
for its tensors: the assignments :mod:`planner.sharding.strategies` prices.

An assignment gives each mesh axis one of the op's parallel dims, or none (the axis then
repeats the op's work). MoE routing ops name their routed side and, when it differs from the
default, the dim the tokens are split by on their other side: ``experts`` sends tokens split
along the sequence to their experts' ranks, ``experts:batch`` tokens split along the batch
(expert parallelism over data-parallel ranks, as Megatron-Core lays it out); ``batch`` and
``seq`` keep each rank's tokens on the rank (split by ``capacity``).
"""

from __future__ import annotations

import itertools

from planner.graph.ops import Op, Tensor
from planner.sharding.layout import Layout, LogicalMesh, canonical, degrees, tensor_degrees

Assignment = tuple[str | None, ...]
"""Per mesh axis, the dim it splits (None: the axis repeats the op's work)."""
EXPERTS_BY_BATCH = "experts:batch"
"""A routing op's split that sends tokens split by batch to their experts' ranks."""


def parallel_dims(op: Op) -> tuple[str, ...]:
    """The dims a strategy may split, in canonical names."""
    tokens = ("batch", "seq")
    if op.kind in ("linear", "expert_linear"):
        assert op.weight is not None  # every linear has a weight
        lead = ("experts", "capacity") if op.kind == "expert_linear" else tokens
        return (*lead, canonical(op.weight.dims[-2][0]), canonical(op.weight.dims[-1][0]))
    extra = {
        "attention": ("heads",),
        "residual": ("hidden",),
        "elementwise": (canonical(op.output.dims[-1][0]),),
        "embedding": ("vocab", "hidden"),
        "loss": ("vocab",),
        "dispatch": ("experts", EXPERTS_BY_BATCH),
        "combine": ("experts", EXPERTS_BY_BATCH),
    }.get(op.kind, ())
    if op.kind == "elementwise" and op.output.dim_names & {"experts"}:
        return ("experts", "capacity", *extra)
    return (*tokens, *extra)


def dim_size(op: Op, dim: str) -> int | None:
    """The size of ``dim`` (a canonical name) in the op's tensors, None if it has none."""
    for t in (*op.inputs, op.output, *((op.weight,) if op.weight else ())):
        for name, size in t.dims:
            if canonical(name) == dim:
                return size
    return None


def is_routing(op: Op) -> bool:
    """Whether ``op`` moves tokens to their experts or back (dispatch, combine)."""
    return op.kind in ("dispatch", "combine")


def routing_sides(pair: Assignment) -> tuple[Layout, Layout]:
    """A routing op's token-side and routed-side layouts: a token split by ``batch`` or
    ``seq`` stays on its rank (the routed tokens split by ``capacity``); ``experts`` sends
    tokens split along the sequence to their experts' ranks, ``experts:batch`` tokens split
    along the batch."""
    token: list[str] = []
    routed: list[str] = []
    for dim in pair:
        if dim is None:
            token.append("R")
            routed.append("R")
        elif dim in ("experts", EXPERTS_BY_BATCH):
            token.append("batch" if dim == EXPERTS_BY_BATCH else "seq")
            routed.append("experts")
        else:
            token.append(dim)
            routed.append("capacity")
    return tuple(token), tuple(routed)


def split_degrees(op: Op, pair: Assignment, mesh: LogicalMesh) -> dict[str, int]:
    """How many ways each dim the op computes on is split (a routing op's tokens on both of
    its sides)."""
    if is_routing(op):
        token, routed = routing_sides(pair)
        return degrees(token, mesh) | degrees(routed, mesh)
    return degrees(as_layout(pair), mesh)


def divides(op: Op, pair: Assignment, mesh: LogicalMesh) -> bool:
    """Whether every dim ``pair`` splits is one of the op's and splits evenly."""
    for dim, degree in split_degrees(op, pair, mesh).items():
        size = dim_size(op, dim)
        # The vocabulary is padded to a multiple of the split, as Megatron pads it.
        if size is None or not (dim == "vocab" or op.splittable(dim, size, degree)):
            return False
    return True


def assignments(op: Op, mesh: LogicalMesh) -> list[Assignment]:
    """Every assignment of the mesh axes to the op's dims that divides evenly (an axis of one
    device is always unassigned, so equivalent strategies appear once)."""
    choices = (None, *parallel_dims(op))
    axes = range(mesh.ndim)
    pairs = itertools.product(*(choices if mesh.size(a) > 1 else (None,) for a in axes))
    return [pair for pair in pairs if divides(op, pair, mesh)]


def layout_of(op: Op, tensor: Tensor, pair: Assignment, role: str) -> Layout:
    """The layout of one of ``op``'s tensors under an axis assignment (see module docstring)."""
    if is_routing(op):
        token, routed = routing_sides(pair)
        tokens_side = "input" if op.kind == "dispatch" else "output"
        return token if role == tokens_side else routed
    names = {canonical(n) for n, _ in tensor.dims}
    placements = []
    for dim in pair:
        if dim is None:
            placements.append("R")
        elif dim in names:
            placements.append(dim)
        elif role == "output" and op.kind != "loss":
            placements.append("P")
        else:
            placements.append("R")
    return tuple(placements)


def grad_layout(layout: Layout, pair: Assignment) -> Layout:
    """An input broadcast along an axis that splits the work gets a partial gradient."""
    return tuple("P" if p == "R" and d is not None else p for p, d in zip(layout, pair,
                                                                          strict=True))


def axes_of(pair: Assignment, *dims: str) -> tuple[int, ...]:
    """The mesh axes ``pair`` gives one of ``dims``."""
    return tuple(a for a, d in enumerate(pair) if d in dims)


def without(pair: Assignment, axes: tuple[int, ...]) -> Layout:
    """The layout of the other axes' splits, with ``axes`` replicated."""
    return tuple("R" if a in axes else (d or "R") for a, d in enumerate(pair))


def kept_degrees(op: Op, tensor: Tensor, pair: Assignment, mesh: LogicalMesh) -> dict[str, int]:
    """How a kept tensor is split: as the op computes on it (a routing op's tensors by their
    own side's layout)."""
    if is_routing(op):
        token, routed = routing_sides(pair)
        side = routed if "experts" in tensor.dim_names else token
        return tensor_degrees(tensor, side, mesh)
    return tensor_degrees(tensor, as_layout(pair), mesh)


def as_layout(pair: Assignment) -> Layout:
    """``pair`` as a layout: each axis's dim, ``R`` where it has none."""
    return tuple(d or "R" for d in pair)
