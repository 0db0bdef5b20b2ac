"""A stage's per-microbatch costs as the step composer sees them, and the rank order of a
uniform configuration's groups."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from planner.errors import ConfigError
from planner.graph.assignment import LayerParts

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


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One device's seconds and bytes for one microbatch through some layers."""

    forward_s: float = 0.0
    """Forward compute."""
    backward_s: float = 0.0
    """Backward compute."""
    recompute_s: float = 0.0
    """Forward recomputed in backward, with its collectives."""
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    pipeline_comm_s: float = 0.0
    activation_bytes: float = 0.0
    """Kept per in-flight microbatch."""
    working_bytes: float = 0.0
    """Transient peak on top (a fully recomputed layer's activations)."""
    recompute_flops: float = 0.0
    """Extra forward FLOPs of recomputation (whole model replica, not per device)."""

    @classmethod
    def zero(cls) -> LayerCost:
        """Nothing."""
        return cls()

    @property
    def compute_s(self) -> float:
        """Forward, backward and recomputation."""
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def time_s(self) -> float:
        """Everything on the critical path of one microbatch."""
        comm = self.tp_comm_s + self.cp_comm_s + self.ep_comm_s + self.pipeline_comm_s
        return self.compute_s + comm

    def scaled(self, count: int) -> LayerCost:
        """``count`` identical copies (the transient peak does not add up)."""
        values = {f.name: getattr(self, f.name) * count for f in fields(self)
                  if f.name != "working_bytes"}  # fmt: skip
        return replace(self, **values)

    def __add__(self, other: LayerCost) -> LayerCost:
        values = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                  if f.name != "working_bytes"}  # fmt: skip
        return LayerCost(**values, working_bytes=max(self.working_bytes, other.working_bytes))

    def with_pipeline_comm(self, seconds: float) -> LayerCost:
        """The same with ``seconds`` of pipeline sends added."""
        return replace(self, pipeline_comm_s=self.pipeline_comm_s + seconds)


def layer_cost(parts: LayerParts, recompute: str, *, count: int = 1) -> LayerCost:
    """``count`` layers of one priced sharding (:class:`~planner.graph.assignment.LayerParts`)
    under ``recompute``, as the step composer sees them."""
    k = parts.mode(recompute)
    rerun = parts.rerun_comm_s if recompute == "full" else (0.0, 0.0, 0.0)
    one = LayerCost(
        forward_s=parts.forward_s, backward_s=parts.backward_s, recompute_s=parts.rerun_s[k],
        tp_comm_s=parts.tp_comm_s + rerun[0], cp_comm_s=parts.cp_comm_s + rerun[1],
        ep_comm_s=parts.ep_comm_s + rerun[2],
        activation_bytes=parts.kept_bytes[k], working_bytes=parts.working_bytes[k],
        recompute_flops=parts.rerun_flops[k],
    )  # fmt: skip
    return one.scaled(count)
