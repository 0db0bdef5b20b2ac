"""Sharding strategies of one operator on a 2-D logical mesh, priced by :mod:`planner.cost`.

A strategy assigns each mesh axis to one of the op's parallel dims, or to none (the axis then
repeats the op's work). From that assignment follow the layouts of its inputs, output and
weight (:mod:`planner.graph.layout`): a dim the output lacks (a contraction) leaves a partial
sum; an input without the dim is broadcast, so its gradient comes back as a partial sum.
Data parallelism is ``batch`` on an axis, sequence/context parallelism ``seq``, tensor
parallelism ``heads``/``ffn``/``vocab`` (column-parallel when the output has the dim,
row-parallel when only the input does), expert parallelism ``experts``.

Weights are replicated along axes that split a dim the weight lacks; their gradients are
summed over those axes (all-reduce, or reduce-scatter and all-gather under ZeRO), and ZeRO
shards their optimizer state, gradients and weights along the same axes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from planner import cost
from planner.graph.layout import Layout, LogicalMesh, canonical, degrees, tensor_degrees
from planner.graph.ops import Op, Tensor
from planner.spec import ClusterSpec, Precision

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, slots=True)
class StrategyContext:
    """What pricing a strategy needs besides the op and the mesh."""

    cluster: ClusterSpec
    precision: Precision
    flash_attention: bool = True
    num_microbatches: int = 1
    """Microbatches per step: once-per-step gradient sync is shared among them."""
    replicas: int = 1
    """Data-parallel copies of the whole pipeline: every weight is replicated over them too."""


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to run an op on the mesh, with its costs for one microbatch on one device."""

    name: str
    assignment: tuple[str | None, str | None]
    inputs: tuple[Layout, ...]
    input_grads: tuple[Layout, ...]
    output: Layout
    output_grad: Layout
    forward_s: float
    backward_s: float
    comm_s: float
    """The op's own collectives, forward and backward (ring attention, vocab-parallel loss,
    expert all-to-all)."""
    attention_forward_s: float
    """What selective recomputation reruns."""
    weights: tuple[tuple[float, tuple[int, ...]], ...]
    """Local parameters and the mesh axes holding copies of them (their gradients summed),
    per weight (followers folded into the op add theirs)."""
    state_bytes: tuple[float, float, float, float]
    """Weights, gradients and optimizer state per device under ZeRO 0..3."""
    sync_s: tuple[float, float, float, float]
    """Gradient sync (and ZeRO gathers) per microbatch under ZeRO 0..3."""
    kept_bytes: float
    kept_selective_bytes: float
    input_bytes: float
    """The first kept tensor (the layer input, for the first op): what full recomputation
    keeps."""

    @property
    def time_s(self) -> float:
        """Compute and own communication, forward and backward."""
        return self.forward_s + self.backward_s + self.comm_s


def _parallel_dims(op: Op) -> tuple[str, ...]:
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
        "dispatch": ("experts",),
        "combine": ("experts",),
    }.get(op.kind, ())
    if op.kind == "elementwise" and op.output.dim_names & {"experts"}:
        return ("experts", "capacity", *extra)
    return (*tokens, *extra)


def _dim_size(op: Op, dim: str) -> int | None:
    for t in (*op.inputs, op.output, *((op.weight,) if op.weight else ())):
        for name, size in t.dims:
            if canonical(name) == dim:
                return size
    return None


def _assignments(op: Op, mesh: LogicalMesh) -> list[tuple[str | None, str | None]]:
    """Every assignment of the mesh axes to the op's dims that divides evenly (an axis of one
    device is always unassigned, so equivalent strategies appear once)."""
    choices = (None, *_parallel_dims(op))
    out = []
    for pair in itertools.product(*(choices if mesh.size(a) > 1 else (None,) for a in (0, 1))):
        split: dict[str, int] = {}
        for axis, dim in enumerate(pair):
            if dim is not None:
                split[dim] = split.get(dim, 1) * mesh.size(axis)
        ok = True
        for dim, degree in split.items():
            size = _dim_size(op, dim)
            # The vocabulary is padded to a multiple of the split, as Megatron pads it.
            ok &= size is not None and (dim == "vocab" or op.splittable(dim, size, degree))
        if ok:
            out.append(pair)
    return out


def _layout(op: Op, tensor: Tensor, pair: tuple[str | None, str | None], role: str) -> Layout:
    """The layout of one of ``op``'s tensors under an axis assignment (see module docstring)."""
    names = {canonical(n) for n, _ in tensor.dims}
    placements = []
    for dim in pair:
        if dim is None:
            placements.append("R")
        elif op.kind in ("dispatch", "combine") and dim in ("batch", "seq", "experts"):
            placements.append(_routing_placement(op, dim, role))
        elif dim in names:
            placements.append(dim)
        elif role == "output" and op.kind != "loss":
            placements.append("P")
        else:
            placements.append("R")
    return (placements[0], placements[1])


def _routing_placement(op: Op, dim: str, role: str) -> str:
    """Dispatch turns tokens split by batch/seq into routed tokens split by capacity (each rank
    routes its own tokens) or by experts (an all-to-all sends tokens to their experts' ranks);
    combine does the reverse."""
    tokens_side = "input" if op.kind == "dispatch" else "output"
    if role == tokens_side:
        return "seq" if dim == "experts" else dim
    return "experts" if dim == "experts" else "capacity"


def _grad_layout(layout: Layout, pair: tuple[str | None, str | None]) -> Layout:
    """An input broadcast along an axis that splits the work gets a partial gradient."""
    return (
        "P" if layout[0] == "R" and pair[0] is not None else layout[0],
        "P" if layout[1] == "R" and pair[1] is not None else layout[1],
    )


def _own_collectives(
    op: Op, pair: tuple[str | None, str | None], mesh: LogicalMesh, ctx: StrategyContext,
    forward_s: float,
) -> float:  # fmt: skip
    """Collectives inside the op: ring attention's K/V exchange (hidden behind the attention
    it feeds, as Megatron's context parallelism overlaps them), the vocab-parallel loss's
    three small all-reduces, the experts' all-to-all both ways."""
    total = 0.0
    for axis, dim in enumerate(pair):
        group = mesh.group(axis)
        if dim == "seq" and op.kind == "attention":
            kv = sum(cost.sharded_bytes(t, tensor_degrees(t, _other(pair, axis), mesh))
                     for t in op.inputs[1:])  # fmt: skip
            ring = cost.collective_time_s(ctx.cluster, "all_gather", kv, group)
            ring += cost.collective_time_s(ctx.cluster, "reduce_scatter", kv, group)
            total += cost.exposed_s(ring, 3 * forward_s)
        elif dim == "vocab" and op.kind == "loss":
            total += 3 * cost.collective_time_s(ctx.cluster, "all_reduce", op.output.bytes, group)
        elif dim == "experts" and op.kind in ("dispatch", "combine"):
            routed = op.output if op.kind == "dispatch" else op.inputs[0]
            per_rank = routed.bytes / mesh.size(axis)
            total += 2 * cost.collective_time_s(ctx.cluster, "all_to_all", per_rank, group)
    return total


def _other(pair: tuple[str | None, str | None], axis: int) -> Layout:
    keep = pair[1 - axis] or "R"
    return (keep, "R") if axis == 1 else ("R", keep)


def weight_copies(
    op: Op, pair: tuple[str | None, str | None], mesh: LogicalMesh
) -> tuple[float, tuple[int, ...]]:
    """The local parameters of ``op`` under ``pair`` and the mesh axes holding copies of them
    (axes that split work the weight does not see: their gradients differ and are summed)."""
    if op.params == 0 or op.tied_to is not None:
        return 0.0, ()
    weight_dims = {canonical(n) for n, _ in op.weight.dims} if op.weight else set()
    split = degrees((pair[0] or "R", pair[1] or "R"), mesh)
    params = op.local_params({n: split.get(canonical(n), 1) for n, _ in
                              (op.weight.dims if op.weight else ())})  # fmt: skip
    return params, tuple(a for a, d in enumerate(pair) if d is not None and d not in weight_dims)


def weight_syncs(
    cluster: ClusterSpec, group: cost.CommGroup | None, *, params: float, precision: Precision
) -> tuple[cost.DataParallelSync, ...]:
    """The data-parallel traffic under ZeRO 0..3 of ``params`` parameters replicated on
    ``group``."""
    return tuple(
        cost.data_parallel_sync(cluster, group, params=params, precision=precision, zero=z)
        for z in ZERO_STAGES
    )


def weight_states(
    group: cost.CommGroup | None, *, params: float, precision: Precision
) -> tuple[float, ...]:
    """State bytes per device under ZeRO 0..3 of ``params`` parameters replicated on
    ``group`` (their states sharded over it)."""
    shards = group.size if group is not None else 1
    return tuple(
        params * cost.state_bytes_per_param(precision, zero=z, shards=shards).total
        for z in ZERO_STAGES
    )


def weight_costs(
    cluster: ClusterSpec,
    group: cost.CommGroup | None,
    *,
    params: float,
    precision: Precision,
    num_microbatches: int,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """State bytes per device (:func:`weight_states`) and gradient sync seconds per
    microbatch (:func:`weight_syncs`, the once-per-step part shared) under ZeRO 0..3."""
    if params == 0:
        return (0.0,) * 4, (0.0,) * 4
    syncs = weight_syncs(cluster, group, params=params, precision=precision)
    states = weight_states(group, params=params, precision=precision)
    return states, tuple(s.per_microbatch_s(num_microbatches) for s in syncs)


def op_strategies(op: Op, mesh: LogicalMesh, ctx: StrategyContext) -> list[Strategy]:
    """Every strategy of ``op`` on ``mesh``, priced.

    >>> from planner.graph.ops import Op, Tensor
    >>> from planner.spec import ClusterSpec
    >>> x = Tensor((("batch", 1), ("seq", 8), ("hidden", 4)), 2.0)
    >>> y = Tensor((("batch", 1), ("seq", 8), ("ffn", 16)), 2.0)
    >>> up = Op(name="up", kind="linear", layer=1, layer_kind="dense", inputs=(x,), output=y,
    ...         weight=Tensor((("hidden", 4), ("ffn", 16)), 2.0), flops=1024.0, saved=(x,))
    >>> c = ClusterSpec.model_validate({"name": "c", "num_nodes": 1, "devices_per_node": 2,
    ...     "device": {"name": "g", "memory_gib": 1, "memory_bandwidth_gb_s": 1,
    ...                "peak_tflops": {"bf16": 1}},
    ...     "network": [{"name": "l", "domain_devices": 2, "bandwidth_gb_s": 1,
    ...                  "latency_us": 1}]})
    >>> [s.name for s in op_strategies(up, LogicalMesh((1, 2)), StrategyContext(c, "bf16"))]
    ['R,R', 'R,seq', 'R,hidden', 'R,ffn', 'R,ffn+kept-seq@1']
    """
    strategies = []
    for pair in _assignments(op, mesh):
        strategy = _price(op, pair, mesh, ctx)
        strategies.append(strategy)
        strategies += _kept_sharded(op, pair, strategy, mesh, ctx)
    return strategies


def _kept_sharded(
    op: Op, pair: tuple[str | None, str | None], strategy: Strategy, mesh: LogicalMesh,
    ctx: StrategyContext,
) -> list[Strategy]:  # fmt: skip
    """Megatron's sequence-parallel trick for a tensor-parallel matmul: the input, replicated
    along the axis that splits the weight, is kept for backward only as this rank's slice of
    the sequence and all-gathered again in backward (Korthikanti et al., Sec. 4.2.2). One
    variant per such axis: less memory for one more all-gather."""
    if op.kind != "linear" or not op.saved or op.saved[0] is not op.inputs[0]:
        return []
    x = op.inputs[0]
    weight_dims = {canonical(n) for n, _ in op.weight.dims} if op.weight else set()
    seq = dict(x.dims).get("seq")
    out = []
    for axis, dim in enumerate(pair):
        if dim not in weight_dims or strategy.inputs[0][axis] != "R" or seq is None:
            continue
        if "seq" in pair or not op.splittable("seq", seq, mesh.size(axis)):
            continue
        other = _other(pair, axis)
        held = cost.sharded_bytes(x, tensor_degrees(x, other, mesh))
        saved = held * (1 - 1 / mesh.size(axis))
        regather = cost.collective_time_s(ctx.cluster, "all_gather", held, mesh.group(axis))
        out.append(replace(
            strategy, name=f"{strategy.name}+kept-seq@{axis}",
            comm_s=strategy.comm_s + regather, kept_bytes=strategy.kept_bytes - saved,
            kept_selective_bytes=strategy.kept_selective_bytes - saved,
        ))  # fmt: skip
    return out


def _price(
    op: Op, pair: tuple[str | None, str | None], mesh: LogicalMesh, ctx: StrategyContext
) -> Strategy:
    inputs = tuple(_layout(op, t, pair, "input") for t in op.inputs)
    output = _layout(op, op.output, pair, "output")
    split = degrees((pair[0] or "R", pair[1] or "R"), mesh)
    if op.kind in ("dispatch", "combine") and "experts" in split:
        split["seq"] = split.get("seq", 1) * split["experts"]  # tokens leave split too
    activation = {n: split[canonical(n)] for t in (*op.inputs, op.output) for n, _ in t.dims
                  if canonical(n) in split}  # fmt: skip
    weight = {n: split[canonical(n)] for n, _ in op.weight.dims
              if canonical(n) in split} if op.weight else {}  # fmt: skip
    work = 1
    for axis, dim in enumerate(pair):
        work *= mesh.size(axis) if dim is not None else 1
    calls = max(1, op.gemm_calls // split.get("experts", 1))
    times = cost.op_time(op, ctx.cluster.device, ctx.precision, activation_degrees=activation,
                         weight_degrees=weight, compute_degree=work, gemm_calls=calls,
                         flash_attention=ctx.flash_attention)  # fmt: skip
    params, copies = weight_copies(op, pair, mesh)
    states, sync = weight_costs(ctx.cluster, mesh.replica_group(copies, ctx.replicas),
                                params=params, precision=ctx.precision,
                                num_microbatches=ctx.num_microbatches)  # fmt: skip
    kept = cost.saved_activation_bytes(
        op, lambda t: tensor_degrees(t, _as_layout(pair), mesh), recompute="none",
        flash_attention=ctx.flash_attention,
    )  # fmt: skip
    selective = cost.saved_activation_bytes(
        op, lambda t: tensor_degrees(t, _as_layout(pair), mesh), recompute="selective",
        flash_attention=ctx.flash_attention,
    )  # fmt: skip
    first = op.saved[0] if op.saved else None
    return Strategy(
        name=",".join(d or "R" for d in pair),
        assignment=pair,
        inputs=inputs,
        input_grads=tuple(_grad_layout(layout, pair) for layout in inputs),
        output=output,
        output_grad=(
            "R" if output[0] == "P" else output[0], "R" if output[1] == "P" else output[1]
        ),
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        comm_s=_own_collectives(op, pair, mesh, ctx, times.forward_s),
        attention_forward_s=times.forward_s if op.kind == "attention" else 0.0,
        weights=((params, copies),) if params else (),
        state_bytes=states,  # type: ignore[arg-type]
        sync_s=sync,  # type: ignore[arg-type]
        kept_bytes=kept,
        kept_selective_bytes=selective,
        input_bytes=cost.sharded_bytes(first, tensor_degrees(first, _as_layout(pair), mesh))
        if first is not None else 0.0,
    )  # fmt: skip


def _as_layout(pair: tuple[str | None, str | None]) -> Layout:
    return (pair[0] or "R", pair[1] or "R")


def follow(op: Op, layout: Layout, mesh: LogicalMesh, ctx: StrategyContext) -> Strategy | None:
    """``op`` (elementwise, one input) run in the layout its input arrives in; None if that
    layout is a partial sum (an activation of a partial sum is not the partial of one)."""
    if "P" in layout:
        return None
    pair = (None if layout[0] == "R" else layout[0], None if layout[1] == "R" else layout[1])
    names = {canonical(n) for t in (*op.inputs, op.output) for n, _ in t.dims}
    if any(d is not None and d not in names for d in pair):
        return None
    return _price(op, pair, mesh, ctx)
