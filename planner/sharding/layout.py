"""Tensor layouts on a logical mesh, and what it costs to convert between them.

A *layout* says, for each of the mesh's axes, how a tensor lives along it: replicated
(``"R"``), a partial sum pending reduction (``"P"``), or split along one of the tensor's named
dims (the dim's name). A dim split on several axes is split by their product. The last axis is
the fast one (inside a node). The search's meshes have two axes (Alpa's ``d0 x d1``); a uniform
configuration's have three (data-parallel ways that expert parallelism needs, context, tensor).

Converting a tensor from one layout to another is done axis by axis (Alpa, Sec. 4.1):
R->S slices locally, S->R all-gathers, S->S' is an all-to-all, P->R all-reduces and P->S
reduce-scatters. Each collective runs on the group of that axis and is priced by
:func:`planner.cost.collective_time_s` on the network levels the group spans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import cost
from planner.graph.ops import Tensor
from planner.spec import ClusterSpec
from planner.vocabulary import CollectiveKind

Placement = str
"""``"R"``, ``"P"`` or a dim name."""
Layout = tuple[Placement, ...]
"""One placement per mesh axis."""
# Dims that are one parallel dimension under two names (the K/V heads follow the query heads).
_CANONICAL = {"kv_heads": "heads"}


def canonical(dim: str) -> str:
    """The name a dim is matched by across operators (``kv_heads`` is split with ``heads``)."""
    return _CANONICAL.get(dim, dim)


@dataclass(frozen=True, slots=True)
class LogicalMesh:
    """``d0 x d1 x ...`` devices numbered row-major: the last axis is contiguous in rank order
    (inside a node) and each axis strides over the ones after it. Its devices start at rank 0
    of the cluster's order (placement moves them). A small value built positionally
    (``LogicalMesh((2, 4))``), unlike the records."""

    shape: tuple[int, ...]
    """Devices along each axis; without ``strides`` the last axis is contiguous in rank order."""
    strides: tuple[int, ...] | None = None
    """Ranks between neighbours along each axis when they are not row-major (a uniform
    configuration numbered in another rank order, ``--rank-order``)."""

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)

    @property
    def num_devices(self) -> int:
        """Devices in the mesh."""
        return math.prod(self.shape)

    def size(self, axis: int) -> int:
        """Devices along ``axis``."""
        return self.shape[axis]

    def stride(self, axis: int) -> int:
        """Ranks between neighbours along ``axis``."""
        if self.strides is not None:
            return self.strides[axis]
        return math.prod(self.shape[axis + 1 :])

    def group(self, axis: int) -> cost.CommGroup:
        """The communication group of one line of devices along ``axis``."""
        return cost.CommGroup(size=self.shape[axis], stride=self.stride(axis))

    def axes_group(self, axes: tuple[int, ...]) -> cost.CommGroup:
        """The group of the devices that differ only along ``axes`` (one collective over all
        of them, as a framework runs it over its process group). Consecutive axes make an
        evenly spaced group; others are priced as one of the same size and innermost
        spacing, which keeps how many of its ranks share a node.

        >>> LogicalMesh((2, 4, 8)).axes_group((0, 1))
        CommGroup(size=8, stride=8)
        """
        size = math.prod(self.shape[a] for a in axes)
        return cost.CommGroup(size=size, stride=min((self.stride(a) for a in axes), default=1))

    def replica_group(self, axes: tuple[int, ...], replicas: int = 1) -> cost.CommGroup | None:
        """The ranks holding the same shard of a weight replicated along ``axes`` and over
        ``replicas`` copies of the mesh placed side by side (None: a single copy).

        The copies' ranks are ``num_devices`` apart, so a group along axis 1 and the copies
        together is a contiguous run only when the mesh is one node row; otherwise it is
        priced as one, which keeps its node count and in-node size right.

        >>> LogicalMesh((2, 8)).replica_group((0,), replicas=4)
        CommGroup(size=8, stride=8)
        >>> LogicalMesh((1, 8)).replica_group((), replicas=4)
        CommGroup(size=4, stride=8)
        """
        size = replicas * math.prod(self.size(axis) for axis in axes)
        if size <= 1:
            return None
        if not axes:
            return cost.CommGroup(size=replicas, stride=self.num_devices)
        return cost.CommGroup(size=size, stride=min(self.stride(a) for a in axes))


def degrees(layout: Layout, mesh: LogicalMesh) -> dict[str, int]:
    """How many ways each dim is split under ``layout``.

    >>> degrees(("batch", "heads"), LogicalMesh((2, 4)))
    {'batch': 2, 'heads': 4}
    """
    out: dict[str, int] = {}
    for axis, placement in enumerate(layout):
        if placement not in ("R", "P") and mesh.size(axis) > 1:
            out[placement] = out.get(placement, 1) * mesh.size(axis)
    return out


def tensor_degrees(tensor: Tensor, layout: Layout, mesh: LogicalMesh) -> dict[str, int]:
    """:func:`degrees` keyed by ``tensor``'s own dim names (``kv_heads`` split as ``heads``)."""
    split = degrees(layout, mesh)
    return {name: split[canonical(name)] for name, _ in tensor.dims if canonical(name) in split}


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One collective of a layout conversion."""

    kind: CollectiveKind
    """The collective."""
    nbytes: float
    """Its buffer in bytes as :func:`planner.cost.collective_time_s` takes it: the tensor as
    the other axes split it (an all-to-all's per-rank share)."""
    axis: int
    """The mesh axis whose group runs it (an index into the mesh's ``shape``)."""


def reshard(src: Layout, dst: Layout, tensor: Tensor, mesh: LogicalMesh) -> tuple[Transfer, ...]:
    """The collectives that turn ``tensor`` from ``src`` into ``dst``, axis by axis.

    ``nbytes`` follows :func:`planner.cost.collective_time_s`: the tensor as split by the other
    axis (the all-to-all's per-rank buffer is split by this axis too).

    >>> x = Tensor((("batch", 1), ("seq", 8), ("hidden", 4)), 2.0)
    >>> reshard(("R", "P"), ("R", "seq"), x, LogicalMesh((1, 4)))
    (Transfer(kind='reduce_scatter', nbytes=64.0, axis=1),)
    """
    transfers = []
    for axis in range(mesh.ndim):
        s, d = src[axis], dst[axis]
        n = mesh.size(axis)
        # Nothing moves for the same placement, a single device, a partial sum made from a
        # whole value (keep it on one rank), or a slice of a replicated tensor.
        if s == d or n == 1 or d == "P" or s == "R":
            continue
        other = tuple("R" if a == axis else p for a, p in enumerate(src))
        nbytes = cost.sharded_bytes(tensor, tensor_degrees(tensor, other, mesh))
        if s == "P":
            kind: CollectiveKind = "all_reduce" if d == "R" else "reduce_scatter"
        elif d == "R":
            kind = "all_gather"
        else:
            kind, nbytes = "all_to_all", nbytes / n
        transfers.append(Transfer(kind=kind, nbytes=nbytes, axis=axis))
    return tuple(transfers)


def transfer_time_s(
    transfers: tuple[Transfer, ...], cluster: ClusterSpec, mesh: LogicalMesh
) -> float:
    """Seconds of ``transfers`` on ``mesh`` (run one after the other)."""
    return sum(
        cost.collective_time_s(cluster, t.kind, t.nbytes, mesh.group(t.axis)) for t in transfers
    )
