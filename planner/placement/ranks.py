"""Stages and their logical meshes onto physical ranks, and the groups that placement makes.

Ranks are numbered as the cluster's devices are (a node's devices consecutive). Every stage's
logical mesh is a contiguous block of ranks with its axis 1 fastest, so the mesh's fast axis
stays inside a node (:class:`planner.sharding.layout.LogicalMesh`). The blocks of the pipeline's
stages and of its data-parallel replicas are then laid out in one of two orders:

- ``replicas-inner`` (Megatron's default, data-parallel before pipeline): the replicas of one
  stage sit side by side, so their gradient reduction spans as few nodes as it must, and
  neighbouring stages are one block of replicas apart (the next nodes);
- ``stages-inner``: the stages of one replica sit side by side, so pipeline sends stay as close
  as they can, and the replicas of a stage are a whole pipeline apart.

Which is faster depends on whether the step is bound by gradient reduction (once per step,
large) or by pipeline sends (every microbatch, small); the search prices both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner import cost
from planner.errors import ConfigError
from planner.sharding.layout import LogicalMesh

Order = Literal["replicas-inner", "stages-inner"]
ORDERS: tuple[Order, ...] = ("replicas-inner", "stages-inner")


@dataclass(frozen=True, slots=True)
class PipelinePlacement:
    """Where a pipeline of ``num_stages`` equal meshes and its replicas live."""

    mesh: LogicalMesh
    num_stages: int
    replicas: int
    order: Order = "replicas-inner"

    @property
    def replica_stride(self) -> int:
        """Ranks between a device and the same device of the next replica."""
        size = self.mesh.num_devices
        return size if self.order == "replicas-inner" else size * self.num_stages

    @property
    def pipeline_distance(self) -> int:
        """Ranks between a device and the same device of the next stage."""
        size = self.mesh.num_devices
        return size * self.replicas if self.order == "replicas-inner" else size

    @property
    def num_devices(self) -> int:
        """Devices of all stages and replicas."""
        return self.mesh.num_devices * self.num_stages * self.replicas

    def stage_ranks(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The ranks of ``stage`` in each replica, its mesh row-major (axis 1 fastest).

        >>> PipelinePlacement(LogicalMesh((1, 2)), num_stages=2, replicas=2).stage_ranks(1)
        ((4, 5), (6, 7))
        >>> PipelinePlacement(LogicalMesh((1, 2)), 2, 2, "stages-inner").stage_ranks(1)
        ((2, 3), (6, 7))
        """
        start = stage * self.pipeline_distance
        size = self.mesh.num_devices
        return tuple(
            tuple(range(start + r * self.replica_stride, start + r * self.replica_stride + size))
            for r in range(self.replicas)
        )

    def weight_group(self, axes: tuple[int, ...]) -> cost.CommGroup | None:
        """The ranks holding the same shard of a weight replicated along the mesh ``axes``
        and over the replicas: its gradients are reduced, and ZeRO shards its state, over them.

        A group along mesh axes and the replicas together is priced as one evenly spaced
        group of the same size starting from the mesh's own spacing; that keeps how many of
        its ranks share a node right when a replica's part of it fills its nodes.

        >>> PipelinePlacement(LogicalMesh((2, 8)), 4, replicas=2).weight_group((0,))
        CommGroup(size=4, stride=8)
        >>> PipelinePlacement(LogicalMesh((1, 8)), 4, 2, "stages-inner").weight_group(())
        CommGroup(size=2, stride=32)
        """
        if not axes:
            return cost.CommGroup(size=self.replicas,
                                  stride=self.replica_stride) if self.replicas > 1 else None
        return self.mesh.replica_group(axes, self.replicas)

    def neighbour_group(self) -> cost.CommGroup:
        """The first and last stages' corresponding ranks (tied embeddings' gradients)."""
        return cost.CommGroup(size=2, stride=max(1, (self.num_stages - 1) * self.pipeline_distance))


DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"


def rank_strides(order: str, *, tp: int, cp: int, dp: int, pp: int) -> dict[str, int]:
    """Rank distance between neighbours along each parallel dim when ranks are numbered in
    ``order``; ``cp-ep-dp`` must stay one block (context, expert and data parallel ranks share
    the gradient groups), ``tp`` and ``pp`` may go anywhere around it."""
    dims = order.split("-")
    if sorted(dims) != ["cp", "dp", "ep", "pp", "tp"] or "cp-ep-dp" not in order:
        raise ConfigError(
            f"rank order {order!r}: use tp, cp, ep, dp, pp once each, with cp-ep-dp together "
            f"(default {DEFAULT_RANK_ORDER})"
        )
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    strides, stride = {}, 1
    for dim in dims:
        strides[dim] = stride
        stride *= sizes[dim]
    return strides
