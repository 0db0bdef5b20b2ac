"""How ranks are numbered, and the groups and stages that numbering places.

One model serves every placement (:class:`RankOrder`): named dimensions, fastest first, each
with its size; a rank is ``sum_d coordinate_d x stride_d``, the stride of a dimension being the
product of the sizes before it. Ranks are numbered as the cluster's devices are (a node's
devices consecutive), so the fastest dimensions stay inside a node.

- A uniform (Megatron-style) configuration spells its order as Megatron does,
  ``tp-cp-ep-dp-pp`` by default (:func:`megatron_order`).
- The search's pipelines (:class:`PipelinePlacement`) number a stage's logical mesh as one
  contiguous block, ``mesh`` (axis 1 fastest, :class:`planner.sharding.layout.LogicalMesh`),
  then the pipeline's data-parallel replicas ``dp`` and stages ``pp`` in one of two orders:

  - ``replicas-inner`` (``mesh-dp-pp``, Megatron's default, data-parallel before pipeline):
    the replicas of one stage sit side by side, so their gradient reduction spans as few
    nodes as it must, and neighbouring stages are one block of replicas apart;
  - ``stages-inner`` (``mesh-pp-dp``): the stages of one replica sit side by side, so pipeline
    sends stay as close as they can, and the replicas of a stage are a whole pipeline apart.

  Which is faster depends on whether the step is bound by gradient reduction (once per step,
  large) or by pipeline sends (every microbatch, small); the search prices both.

A mesh of ``tp`` ranks is the same numbering in either spelling: Megatron's ``tp-cp-ep-dp-pp``
with ``cp = 1`` is ``replicas-inner``, and ``tp-pp-cp-ep-dp`` is ``stages-inner``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Literal

from planner import cost
from planner.errors import ConfigError
from planner.plan.degrees import Degrees
from planner.sharding.layout import LogicalMesh
from planner.vocabulary import rank_order_problem


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOrder:
    """How ranks are numbered: named dimensions, fastest first, with their sizes.

    >>> order = RankOrder(dims=(("tp", 2), ("dp", 2), ("pp", 2)))
    >>> order.strides(), order.ranks(at={"pp": 1}, over=("dp", "tp"))
    ({'tp': 1, 'dp': 2, 'pp': 4}, [4, 5, 6, 7])
    """

    dims: tuple[tuple[str, int], ...]
    """``(name, size)`` of each dimension, the fastest (neighbouring ranks) first."""

    def strides(self) -> dict[str, int]:
        """Rank distance between neighbours along each dimension."""
        strides, stride = {}, 1
        for name, size in self.dims:
            strides[name] = stride
            stride *= size
        return strides

    def stride(self, name: str) -> int:
        """Rank distance between neighbours along ``name``."""
        return self.strides()[name]

    def size(self, name: str) -> int:
        """The extent of ``name``."""
        return dict(self.dims)[name]

    @property
    def num_ranks(self) -> int:
        """Ranks numbered: the product of the sizes."""
        n = 1
        for _, size in self.dims:
            n *= size
        return n

    def ranks(self, *, at: Mapping[str, int], over: Sequence[str]) -> list[int]:
        """The ranks whose coordinates are ``at`` (0 for a dimension in neither argument),
        along the dimensions ``over``, the first of them outermost."""
        strides = self.strides()
        base = sum(strides[name] * coordinate for name, coordinate in at.items())
        extents = [range(self.size(name)) for name in over]
        return [base + sum(strides[name] * c for name, c in zip(over, coords, strict=True))
                for coords in product(*extents)]  # fmt: skip

    def group(self, name: str) -> cost.CommGroup:
        """The ranks along ``name`` (the others fixed): evenly spaced by its stride."""
        return cost.CommGroup(size=self.size(name), stride=self.stride(name))

    def ends_group(self, name: str) -> cost.CommGroup:
        """The first and last ranks along ``name`` (the others fixed), such as the first and
        last stages' corresponding ranks that tied embeddings' gradients are summed over."""
        return cost.CommGroup(size=2, stride=max(1, (self.size(name) - 1) * self.stride(name)))


# --------------------------------------------------------------------------- Megatron's order

"""Megatron-LM's order: tensor-parallel ranks adjacent inside a node, pipeline stages outermost."""


def megatron_order(order: str, d: Degrees) -> RankOrder:
    """The ranks of a configuration of degrees ``d`` (its data-parallel ranks as placed:
    :meth:`~planner.plan.degrees.Degrees.placed`) numbered in ``order``, a spelling like
    Megatron-LM's ``tp-cp-ep-dp-pp`` (the fastest first); ``cp-ep-dp`` must stay one block
    (context, expert and data parallel ranks share the gradient groups), ``tp`` and ``pp``
    may go anywhere around it. Expert parallelism takes no ranks of its own (``ep = 1``
    here: it splits the data-parallel ones).

    Raises :class:`~planner.errors.ConfigError` for any other spelling.

    >>> megatron_order("tp-cp-ep-dp-pp", Degrees(tp=2, dp=2, pp=2)).strides()
    {'tp': 1, 'cp': 2, 'ep': 2, 'dp': 2, 'pp': 4}
    """
    problem = rank_order_problem(order)
    if problem is not None:
        raise ConfigError(f"rank order {order!r}: {problem}")
    names = order.split("-")
    sizes = {"tp": d.tp, "cp": d.cp, "ep": 1, "dp": d.dp, "pp": d.pp}
    return RankOrder(dims=tuple((name, sizes[name]) for name in names))


# --------------------------------------------------------------------------- the search's order

Order = Literal["replicas-inner", "stages-inner"]
ORDERS: tuple[Order, ...] = ("replicas-inner", "stages-inner")
ORDER_DIMS: dict[Order, tuple[str, str, str]] = {
    "replicas-inner": ("mesh", "dp", "pp"),
    "stages-inner": ("mesh", "pp", "dp"),
}
"""Each of the search's orders as dimensions of a :class:`RankOrder`, fastest first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlacement:
    """Where a pipeline of ``num_stages`` equal meshes and its replicas live."""

    mesh: LogicalMesh
    """Every stage's logical mesh, one contiguous block of ranks."""
    num_stages: int
    """Pipeline stages."""
    replicas: int
    """Data-parallel replicas of the whole pipeline."""
    order: Order = "replicas-inner"
    """Which of stages and replicas is numbered first (:data:`ORDER_DIMS`)."""

    @property
    def rank_order(self) -> RankOrder:
        """The numbering: the mesh's block, then replicas and stages in :attr:`order`."""
        sizes = {"mesh": self.mesh.num_devices, "dp": self.replicas, "pp": self.num_stages}
        return RankOrder(dims=tuple((name, sizes[name]) for name in ORDER_DIMS[self.order]))

    @property
    def replica_stride(self) -> int:
        """Ranks between a device and the same device of the next replica."""
        return self.rank_order.stride("dp")

    @property
    def pipeline_distance(self) -> int:
        """Ranks between a device and the same device of the next stage."""
        return self.rank_order.stride("pp")

    @property
    def num_devices(self) -> int:
        """Devices of all stages and replicas."""
        return self.rank_order.num_ranks

    def stage_ranks(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The ranks of ``stage`` in each replica, its mesh row-major (axis 1 fastest).

        >>> PipelinePlacement(mesh=LogicalMesh((1, 2)), num_stages=2, replicas=2).stage_ranks(1)
        ((4, 5), (6, 7))
        >>> PipelinePlacement(mesh=LogicalMesh((1, 2)), num_stages=2, replicas=2,
        ...                   order="stages-inner").stage_ranks(1)
        ((2, 3), (6, 7))
        """
        order = self.rank_order
        return tuple(tuple(order.ranks(at={"pp": stage, "dp": r}, over=("mesh",)))
                     for r in range(self.replicas))  # fmt: skip

    def weight_group(self, axes: tuple[int, ...]) -> cost.CommGroup | None:
        """The ranks holding the same shard of a weight replicated along the mesh ``axes``
        and over the replicas: its gradients are reduced, and ZeRO shards its state, over them.

        A group along mesh axes and the replicas together is priced as one evenly spaced
        group of the same size starting from the mesh's own spacing; that keeps how many of
        its ranks share a node right when a replica's part of it fills its nodes.

        >>> PipelinePlacement(mesh=LogicalMesh((2, 8)), num_stages=4,
        ...                   replicas=2).weight_group((0,))
        CommGroup(size=4, stride=8)
        >>> PipelinePlacement(mesh=LogicalMesh((1, 8)), num_stages=4, replicas=2,
        ...                   order="stages-inner").weight_group(())
        CommGroup(size=2, stride=32)
        """
        if not axes:
            return self.rank_order.group("dp") if self.replicas > 1 else None
        return self.mesh.replica_group(axes, self.replicas)

    def neighbour_group(self) -> cost.CommGroup:
        """The first and last stages' corresponding ranks (tied embeddings' gradients)."""
        return self.rank_order.ends_group("pp")
