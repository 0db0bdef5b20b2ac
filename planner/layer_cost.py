"""Pricing one layer's ops under a uniform configuration, on one device, per microbatch.

Composes :func:`planner.graph.sharding.megatron_sharding` (what each op is split into and which
collectives it needs) with :mod:`planner.cost` (what that costs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial

from planner import cost
from planner.config import ResolvedConfig
from planner.errors import ConfigError
from planner.graph.ops import Op
from planner.graph.sharding import (
    MeshAxis,
    OpSharding,
    local_params,
    megatron_sharding,
    saved_degrees,
)
from planner.spec import ClusterSpec

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
class Placement:
    """The communication groups of a uniform configuration, in Megatron's rank order
    (tensor fastest, then context, expert, data, pipeline: ``tp-cp-ep-dp-pp``)."""

    tp: cost.CommGroup
    cp: cost.CommGroup
    ep: cost.CommGroup
    dp: cost.CommGroup
    """Dense gradients: data x context parallel ranks."""
    edp: cost.CommGroup
    """Expert gradients: the data-parallel ranks holding the same experts."""
    pipeline_distance: int
    """Ranks between neighbouring pipeline stages."""

    @classmethod
    def megatron(cls, cluster: ClusterSpec, *, tp: int, cp: int, dp: int, ep: int) -> Placement:
        """Megatron-LM's default placement (``tp-cp-ep-dp-pp``; pipeline stages outermost)."""
        del cluster  # the groups are rank arithmetic; the cluster prices them later
        return cls.from_order(DEFAULT_RANK_ORDER, tp=tp, cp=cp, dp=dp, ep=ep, pp=1)

    @classmethod
    def from_order(
        cls, order: str, *, tp: int, cp: int, dp: int, ep: int, pp: int
    ) -> Placement:
        """The groups when ranks are numbered in ``order`` (fastest first), as Megatron's
        ``order`` string of its process groups: ``tp-cp-ep-dp-pp`` puts tensor-parallel
        ranks side by side in a node; ``cp-ep-dp-tp-pp`` spreads them across nodes.

        >>> Placement.from_order("cp-ep-dp-tp-pp", tp=8, cp=1, dp=4, ep=1, pp=2).tp
        CommGroup(size=8, stride=4)
        """
        strides = rank_strides(order, tp=tp, cp=cp, dp=dp, pp=pp)
        s_cp = strides["cp"]
        return cls(
            tp=cost.CommGroup(tp, strides["tp"]),
            cp=cost.CommGroup(cp, s_cp),
            # Expert-parallel ranks are the first of the data x context block.
            ep=cost.CommGroup(ep, s_cp),
            dp=cost.CommGroup(dp * cp, s_cp),
            edp=cost.CommGroup(dp * cp // ep, s_cp * ep),
            pipeline_distance=strides["pp"],
        )

    def group(self, axis: MeshAxis) -> cost.CommGroup:
        """The group of a mesh axis."""
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep}[axis]


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
    params_by_sync: dict[str, float] = field(default_factory=dict)
    """Local parameters by the axes their gradients are summed over (``dp``, ``dp+tp``,
    ``edp``)."""

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
        values = {
            f.name: getattr(self, f.name) * count
            for f in fields(self)
            if f.name not in ("working_bytes", "params_by_sync")
        }
        params = {k: v * count for k, v in self.params_by_sync.items()}
        return replace(self, **values, params_by_sync=params)

    def __add__(self, other: LayerCost) -> LayerCost:
        values = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("working_bytes", "params_by_sync")
        }
        params = dict(self.params_by_sync)
        for k, v in other.params_by_sync.items():
            params[k] = params.get(k, 0.0) + v
        return LayerCost(
            **values,
            working_bytes=max(self.working_bytes, other.working_bytes),
            params_by_sync=params,
        )

    def with_pipeline_comm(self, seconds: float) -> LayerCost:
        """The same with ``seconds`` of pipeline sends added."""
        return replace(self, pipeline_comm_s=self.pipeline_comm_s + seconds)


@dataclass(slots=True)
class _Accumulator:
    forward_s: float = 0.0
    backward_s: float = 0.0
    forward_comm: dict[str, float] = field(default_factory=dict)
    backward_comm: dict[str, float] = field(default_factory=dict)
    kept: float = 0.0
    kept_without_recompute: float = 0.0
    attention_forward_s: float = 0.0
    attention_flops: float = 0.0
    flops: float = 0.0
    params: dict[str, float] = field(default_factory=dict)


def _exposed_collectives(
    op: Op,
    sharding: OpSharding,
    times: cost.OpTime,
    cluster: ClusterSpec,
    resolved: ResolvedConfig,
    placement: Placement,
    acc: _Accumulator,
) -> None:
    """Add ``op``'s collectives to ``acc`` as far as they are not hidden behind compute.

    Context-parallel ring traffic overlaps the attention it feeds (Megatron's CP does);
    tensor-parallel collectives overlap the adjacent GEMM only with ``tp_comm_overlap``.
    """
    totals: dict[tuple[str, str], float] = {}
    for coll in sharding.collectives:
        group = placement.group(coll.axis)
        seconds = cost.collective_time_s(cluster, coll.kind, coll.nbytes, group)
        key = (coll.axis, coll.phase)
        totals[key] = totals.get(key, 0.0) + seconds
    for (axis, phase), seconds in totals.items():
        own = times.forward_s if phase == "forward" else times.backward_s
        hidden = axis == "cp" or (axis == "tp" and resolved.config.tp_comm_overlap)
        exposed = cost.exposed_s(seconds, own if hidden else 0.0)
        bucket = acc.forward_comm if phase == "forward" else acc.backward_comm
        bucket[axis] = bucket.get(axis, 0.0) + exposed


def price_layer(
    ops: Sequence[Op],
    cluster: ClusterSpec,
    resolved: ResolvedConfig,
    placement: Placement,
    *,
    transformer_layer: bool,
) -> LayerCost:
    """Costs of one layer's ``ops`` on one device for one microbatch.

    Recomputation applies to transformer layers only (as in Megatron): ``full`` keeps the
    layer's input and reruns its forward, collectives included, in backward; ``selective``
    drops the attention core's ``s x s`` tensors and reruns the attention core.
    """
    c = resolved.config
    precision = resolved.training.precision
    recompute = c.recompute if transformer_layer else "none"
    acc = _Accumulator()
    first_kept_input = 0.0
    for i, op in enumerate(ops):
        sh = megatron_sharding(op, tp=c.tp, sp=resolved.sp, cp=c.cp, ep=c.ep)
        times = cost.op_time(
            op, cluster.device, precision,
            activation_degrees=sh.activation_degrees, weight_degrees=sh.weight_degrees,
            compute_degree=sh.compute_degree, gemm_calls=sh.gemm_calls,
            flash_attention=c.flash_attention,
        )  # fmt: skip
        acc.forward_s += times.forward_s
        acc.backward_s += times.backward_s
        acc.flops += op.flops
        if op.kind == "attention":
            acc.attention_forward_s += times.forward_s
            acc.attention_flops += op.flops
        _exposed_collectives(op, sh, times, cluster, resolved, placement, acc)
        degrees = partial(saved_degrees, sh)
        acc.kept += cost.saved_activation_bytes(
            op, degrees, recompute=recompute, flash_attention=c.flash_attention
        )
        acc.kept_without_recompute += cost.saved_activation_bytes(
            op, degrees, recompute="none", flash_attention=c.flash_attention
        )
        if i == 0 and op.saved:
            first_kept_input = cost.sharded_bytes(op.saved[0], degrees(op.saved[0]))
        if op.params:
            key = "+".join(sh.weight_sync_axes)
            acc.params[key] = acc.params.get(key, 0.0) + local_params(op, sh)
    return _finish(acc, recompute, first_kept_input)


def _finish(acc: _Accumulator, recompute: str, layer_input_bytes: float) -> LayerCost:
    fwd_comm, bwd_comm = acc.forward_comm, acc.backward_comm
    kept, working, recompute_s, recompute_flops = acc.kept, 0.0, 0.0, 0.0
    comm = {axis: fwd_comm.get(axis, 0.0) + bwd_comm.get(axis, 0.0) for axis in ("tp", "cp", "ep")}
    if recompute == "full":
        kept = layer_input_bytes
        working = acc.kept_without_recompute
        recompute_s = acc.forward_s
        recompute_flops = acc.flops
        comm = {axis: comm[axis] + fwd_comm.get(axis, 0.0) for axis in comm}
    elif recompute == "selective":
        recompute_s = acc.attention_forward_s
        recompute_flops = acc.attention_flops
    return LayerCost(
        forward_s=acc.forward_s,
        backward_s=acc.backward_s,
        recompute_s=recompute_s,
        tp_comm_s=comm["tp"],
        cp_comm_s=comm["cp"],
        ep_comm_s=comm["ep"],
        activation_bytes=kept,
        working_bytes=working,
        recompute_flops=recompute_flops,
        params_by_sync=acc.params,
    )
