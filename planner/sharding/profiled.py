"""A layer profile set beside a cluster: each measurement turned into factors over the cost
model's own price of the same shard (:func:`with_profile`), which every search and estimate
then prices operators with (:mod:`planner.cost.profiled`).

A tensor-parallel shard runs some operators split (the projections, the attention core, the
vocabulary) and, without sequence parallelism, the residual stream's (norms, residual adds)
whole, as one rank of Megatron's tensor parallelism does. Pricing reads an operator's factor
at its own shard, so the residual stream's operators take the unsplit layer's factor. The
split operators' factor is then what makes the shard's price equal its measurement:
``(measured - f_1 * residual) / split``, where ``f_1`` is the unsplit layer's factor at the
same microbatch and ``residual`` the residual stream's priced seconds or bytes. Without an
unsplit measurement at that microbatch the whole layer's ratio is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import cost
from planner.cost.profiled import Shard, measured_scale, profiled_kind, routed_rows
from planner.errors import InputError
from planner.graph.ops import TENSOR_PARALLEL_DIMS
from planner.plan.degrees import Degrees
from planner.sharding.layout import canonical
from planner.sharding.uniform import UniformQuery, uniform_layer, uniform_layout
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.profile import (
    LayerFactor,
    LayerMeasurement,
    LayerProfile,
    ProfileFactors,
    shape_difference,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Priced:
    """A shard's priced seconds and bytes: its split operators' and its residual stream's."""

    split: tuple[float, float, float]
    """The operators split on the tensor-parallel dims: forward, backward, kept bytes."""
    residual: tuple[float, float, float]
    """The rest (norms, residual adds, the router), run whole: the same three."""

    def total(self, k: int) -> float:
        """The whole shard's forward (0), backward (1) or kept bytes (2)."""
        return self.split[k] + self.residual[k]

    def summed(self) -> _Priced:
        """Forward and backward as one, in both of their places (only their sum measured)."""

        def both(x: tuple[float, float, float]) -> tuple[float, float, float]:
            return x[0] + x[1], x[0] + x[1], x[2]

        return _Priced(split=both(self.split), residual=both(self.residual))


def _priced(model: ModelSpec, cluster: ClusterSpec, profile: LayerProfile,
            m: LayerMeasurement) -> _Priced:  # fmt: skip
    """``m``'s shard priced by the cost model alone: forward, backward and kept bytes of the
    operators it measured (an MoE layer's routed experts apart from the rest of it)."""
    experts = m.kind == "experts"
    degrees = Degrees(tp=m.tensor_parallel, ep=m.expert_parallel)
    query = UniformQuery(kind="moe" if experts else m.kind, layout=uniform_layout(degrees),
                         micro_batch_size=m.micro_batch_size, seq_length=m.seq_length,
                         precision=profile.precision, stack=profile.stack)  # fmt: skip
    layer = uniform_layer(model, cluster, query)
    split, residual = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for node in layer.nodes:
        if (profiled_kind(node.ops[0]) == "experts") != experts:  # folded ops share it
            continue
        s = node.strategies[0]
        ways = 1
        for axis, dim in enumerate(s.assignment):
            if dim is not None and canonical(dim) in TENSOR_PARALLEL_DIMS:
                ways *= layer.mesh.size(axis)
        into = split if ways > 1 else residual
        into[0] += s.forward_s
        into[1] += s.backward_s
        into[2] += s.kept_bytes
    return _Priced(split=tuple(split), residual=tuple(residual))  # type: ignore[arg-type]


def _factor(measured: float, priced: _Priced, k: int, whole: float | None) -> float:
    """Measured over priced, the residual stream at the unsplit layer's factor ``whole``."""
    if whole is not None and priced.split[k] > 0:
        rest = measured - whole * priced.residual[k]
        if rest > 0.1 * measured:  # else the split ops would be priced near nothing: noise
            return rest / priced.split[k]
    return measured / priced.total(k)


def _kind_in(model: ModelSpec, kind: str) -> bool:
    if kind in ("embedding", "head"):
        return True
    if kind in ("moe", "experts"):
        return model.moe is not None
    return kind in ("dense", "local")


def with_profile(cluster: ClusterSpec, model: ModelSpec, profile: LayerProfile) -> ClusterSpec:
    """``cluster`` with ``profile``'s measurements of ``model``'s layers as factors in its
    device's ``efficiency.profile`` (one there before replaced). Refused, naming the
    difference, when the profile measured another device or another model's layers."""
    if profile.device != cluster.device.name:
        raise InputError(f"the profile was measured on {profile.device}, the cluster's device "
                         f"is {cluster.device.name}: profile the cluster's own device")  # fmt: skip
    difference = shape_difference(profile, model)
    if difference is not None:
        raise InputError(f"the profile measured {profile.model}'s layers, not {model.name}'s: "
                         f"{difference}")  # fmt: skip
    bare = _with_factors(cluster, None)
    factors: list[LayerFactor] = []
    # Unsplit shards first: a split shard's factor leans on the unsplit one at its microbatch.
    for m in sorted(profile.measured, key=lambda m: m.tensor_parallel):
        if _kind_in(model, m.kind):
            factors.append(_layer_factor(model, bare, profile, m, ProfileFactors(
                model=model.name, stack=profile.stack, precision=profile.precision,
                layers=tuple(factors))))  # fmt: skip
    optimizer = None
    if profile.optimizer is not None:
        states = cost.states_precision(profile.precision, profile.stack)
        priced = cost.optimizer_step_s(bare.device, states, params=profile.optimizer.parameters)
        optimizer = profile.optimizer.step_s / priced
    return _with_factors(cluster, ProfileFactors(
        model=model.name, stack=profile.stack, precision=profile.precision,
        layers=tuple(factors), optimizer=optimizer))  # fmt: skip


def _layer_factor(model: ModelSpec, bare: ClusterSpec, profile: LayerProfile,
                  m: LayerMeasurement, before: ProfileFactors) -> LayerFactor:  # fmt: skip
    """``m`` over the price of its shard on ``bare``; a split shard's split operators
    against the unsplit shard's factor at its microbatch among ``before``."""
    priced = _priced(model, bare, profile, m)
    whole = None
    if m.tensor_parallel > 1 and m.kind != "experts":  # the experts run no residual stream
        whole = measured_scale(before, Shard(
            kind=m.kind, stack=profile.stack, precision=profile.precision, tensor_parallel=1,
            micro_batch_size=m.micro_batch_size, seq_length=m.seq_length))  # fmt: skip
    kept = None
    if m.kept_bytes and priced.total(2) > 0:  # an embedding keeps no activation
        kept = _factor(m.kept_bytes, priced, 2, None if whole is None else whole.kept)
    if m.forward_s is not None and m.backward_s is not None:
        forward = _factor(m.forward_s, priced, 0, None if whole is None else whole.forward)
        backward = _factor(m.backward_s, priced, 1, None if whole is None else whole.backward)
    else:  # only the sum measured: both passes scaled alike
        assert m.forward_backward_s is not None
        forward = backward = _factor(m.forward_backward_s, priced.summed(), 0,
                                     None if whole is None else whole.forward)  # fmt: skip
    rows = None
    if m.kind == "experts":  # read along the rows the rank's experts compute, as op_scale does
        assert model.moe is not None  # _kind_in
        rows = routed_rows(model.moe, tokens=m.tokens, expert_parallel=m.expert_parallel)
    return LayerFactor(kind=m.kind, tensor_parallel=m.tensor_parallel,
                       expert_parallel=m.expert_parallel, micro_batch_size=m.micro_batch_size,
                       seq_length=m.seq_length, routed_rows=rows, forward=forward,
                       backward=backward, kept=kept)  # fmt: skip


def _with_factors(cluster: ClusterSpec, profile: ProfileFactors | None) -> ClusterSpec:
    efficiency = cluster.device.efficiency.model_copy(update={"profile": profile})
    device = cluster.device.model_copy(update={"efficiency": efficiency})
    return cluster.model_copy(update={"device": device})
