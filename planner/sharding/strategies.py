"""Sharding strategies of one operator on a logical mesh, priced by :mod:`planner.cost`.

A strategy assigns each mesh axis to one of the op's parallel dims, or to none (the axis then
repeats the op's work). From that assignment follow the layouts of its inputs, output and
weight (:mod:`planner.sharding.layout`): a dim the output lacks (a contraction) leaves a partial
sum; an input without the dim is broadcast, so its gradient comes back as a partial sum.
Data parallelism is ``batch`` on an axis, sequence/context parallelism ``seq``, tensor
parallelism ``heads``/``ffn``/``vocab`` (column-parallel when the output has the dim,
row-parallel when only the input does), expert parallelism ``experts``.

Weights are replicated along axes that split a dim the weight lacks; their gradients are
summed over those axes (all-reduce, or reduce-scatter and all-gather under ZeRO), and ZeRO
shards their optimizer state, gradients and weights along the same axes.

Every operator kind's strategies and the prices each carries (compute, its own collectives,
the weight-gradient sync, hidden and exposed parts); which splits an op admits and the layouts
they imply live in :mod:`planner.sharding.splits` (MoE routing ops' sides too), layouts in
:mod:`planner.sharding.layout`, the resharding between them in
:mod:`planner.sharding.assignment`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner import cost
from planner.cost.profiled import op_scale
from planner.graph.ops import Op
from planner.sharding.collectives import gathered_kv_bytes, own_collectives
from planner.sharding.context import StrategyContext
from planner.sharding.layout import Layout, LogicalMesh, canonical, tensor_degrees
from planner.sharding.splits import (
    EXPERTS_BY_BATCH,
    Assignment,
    as_layout,
    assignments,
    axes_of,
    dim_size,
    grad_layout,
    kept_degrees,
    layout_of,
    split_degrees,
    without,
)
from planner.sharding.weights import weight_costs
from planner.spec import ClusterSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One way to run an op on the mesh, with its costs for one microbatch on one device."""

    name: str
    """The assignment as text, e.g. ``R,ffn`` (``+kept-seq@<axis>``: the variant that keeps its
    input's sequence slice)."""
    assignment: Assignment
    """Per mesh axis, the dim it splits (None: the axis repeats the op's work)."""
    inputs: tuple[Layout, ...]
    """The layout each input must arrive in, in ``op.inputs`` order."""
    input_grads: tuple[Layout, ...]
    """The layout each input's gradient comes out in (``P`` along axes that split the work but not
    the input)."""
    output: Layout
    """The layout the output comes out in (``P`` along axes that split a contracted dim)."""
    output_grad: Layout
    """The layout the output's gradient must arrive in (the output's, with partial sums
    replicated)."""
    forward_s: float
    """Forward compute, communication apart."""
    backward_s: float
    """Backward compute, communication apart."""
    comm_s: float
    """The op's own collectives, forward and backward (ring attention, vocab-parallel loss,
    expert all-to-all), as far as they are not hidden behind its compute."""
    forward_comm_s: float
    """The forward's part of ``comm_s``: what full recomputation runs again."""
    selective_forward_s: float
    """What selective recomputation reruns of the op: its forward, when one of the context's
    recompute modules reruns it."""
    weights: tuple[tuple[float, tuple[int, ...]], ...]
    """Local parameters and the mesh axes holding copies of them (their gradients summed),
    per weight (followers folded into the op add theirs)."""
    state_bytes: tuple[float, float, float, float]
    """Weights, gradients and optimizer state per device under ZeRO 0..3."""
    sync_s: tuple[float, float, float, float]
    """Gradient sync (and ZeRO gathers) per microbatch under ZeRO 0..3."""
    kept_bytes: float
    """Activations kept for backward with no recomputation (with the ``s x s`` tensors only
    without flash attention)."""
    kept_selective_bytes: float
    """Activations kept for backward under selective recomputation (no ``s x s`` tensors)."""
    input_bytes: float
    """The first kept tensor (the layer input, for the first op): what full recomputation
    keeps."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradients (:attr:`planner.cost.compute.OpTime.weight_s`)."""
    working_bytes: float = 0.0
    """Transient bytes while the op's backward runs, beyond what it keeps (the loss's
    gradients over the vocabulary: :attr:`planner.graph.ops.Op.working`)."""
    hidden_comm_s: float = 0.0
    """The op's own collectives, forward and backward, hidden behind its compute (ring
    attention's K/V exchange within each step, a gather under ``tp_comm_overlap``): not in
    ``comm_s``, not on the critical path."""
    hidden_forward_comm_s: float = 0.0
    """The forward's part of ``hidden_comm_s``."""
    gathered_bytes: float = 0.0
    """Inputs all-gathered for the op's compute and held while it runs, forward and backward
    (the whole sequence's K/V under PyTorch's context parallelism): a transient on top of
    what the layer keeps."""

    @property
    def time_s(self) -> float:
        """Compute and own communication, forward and backward."""
        return self.forward_s + self.backward_s + self.comm_s


def weight_copies(op: Op, pair: Assignment, mesh: LogicalMesh) -> tuple[float, tuple[int, ...]]:
    """The local parameters of ``op`` under ``pair`` and the mesh axes holding copies of them
    (axes that split work the weight does not see: their gradients differ and are summed)."""
    if op.params == 0 or op.tied_to is not None:
        return 0.0, ()
    weight_dims = {canonical(n) for n, _ in op.weight.dims} if op.weight else set()
    split = split_degrees(op, pair, mesh)
    params = op.local_params({n: split.get(canonical(n), 1) for n, _ in
                              (op.weight.dims if op.weight else ())})  # fmt: skip
    return params, tuple(a for a, d in enumerate(pair) if d is not None and d not in weight_dims)


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
    >>> ctx = StrategyContext(cluster=c, precision="bf16")
    >>> [s.name for s in op_strategies(up, LogicalMesh((1, 2)), ctx)]
    ['R,R', 'R,seq', 'R,hidden', 'R,ffn', 'R,ffn+kept-seq@1']
    """
    strategies = []
    for pair in assignments(op, mesh):
        experts = axes_of(pair, "experts", EXPERTS_BY_BATCH)
        if ctx.deepep is not None and deepep_refused(experts, mesh, ctx.cluster):
            continue
        strategy = price_strategy(op, pair, mesh, ctx)
        strategies.append(strategy)
        strategies += kept_sharded(op, strategy, mesh, ctx)
    return strategies


def deepep_refused(axes: tuple[int, ...], mesh: LogicalMesh, cluster: ClusterSpec) -> bool:
    """Whether experts spread over ``mesh``'s ``axes`` sit on ranks DeepEP cannot exchange
    tokens among (:func:`cost.deepep_group_refusal`: a group size it has no configuration
    for, or a group beyond one node without 8 ranks in each): under DeepEP no op may take
    such a layout, so no resharding can bring it about either.

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> [deepep_refused(axes, LogicalMesh((2, 8)), h100) for axes in ((0,), (1,), (0, 1))]
    [True, False, False]
    """
    group = mesh.axes_group(axes)
    if group.size <= 1:
        return False
    per_node = cost.members_per_level(cluster, group)[0]
    return cost.deepep_group_refusal(group.size, per_node) is not None


def kept_sharded(op: Op, strategy: Strategy, mesh: LogicalMesh,
                 ctx: StrategyContext) -> list[Strategy]:  # fmt: skip
    """Megatron's sequence-parallel trick for a tensor-parallel matmul: the input, replicated
    along the axis that splits the weight, is kept for backward only as this rank's slice of
    the sequence and all-gathered again in backward (Korthikanti et al., Sec. 4.2.2). One
    variant per such axis: less memory for one more all-gather."""
    if op.kind != "linear" or not op.saved or op.saved[0] is not op.inputs[0]:
        return []
    pair = strategy.assignment
    x = op.inputs[0]
    weight_dims = {canonical(n) for n, _ in op.weight.dims} if op.weight else set()
    seq = dict(x.dims).get("seq")
    out = []
    for axis, dim in enumerate(pair):
        if dim not in weight_dims or strategy.inputs[0][axis] != "R" or seq is None:
            continue
        other = without(pair, (axis,))
        held_split = tensor_degrees(x, other, mesh)
        if not op.splittable("seq", seq, held_split.get("seq", 1) * mesh.size(axis)):
            continue
        # An FP8 linear keeps (and gathers again) its input in FP8.
        held = cost.sharded_bytes(x, held_split) * cost.kept_fraction(op, x)
        saved = held * (1 - 1 / mesh.size(axis))
        gather = cost.collective_time_s(ctx.cluster, "all_gather", held, mesh.group(axis))
        regather = gather
        if ctx.tp_comm_overlap:  # the backward's all-gather overlaps its GEMMs too
            regather = cost.exposed_s(gather, strategy.backward_s)
        # selective recomputation may keep no input to slice (a module discards it)
        kept_selective = cost.keeps_inputs(op, recompute="selective",
                                           modules=ctx.recompute_modules)  # fmt: skip
        out.append(replace(
            strategy, name=f"{strategy.name}+kept-seq@{axis}",
            comm_s=strategy.comm_s + regather,
            hidden_comm_s=strategy.hidden_comm_s + gather - regather,
            kept_bytes=strategy.kept_bytes - saved,
            kept_selective_bytes=strategy.kept_selective_bytes - saved * kept_selective,
        ))  # fmt: skip
    return out


def price_strategy(op: Op, pair: Assignment, mesh: LogicalMesh, ctx: StrategyContext) -> Strategy:
    """``op`` run on ``mesh`` with its dims split as ``pair`` says, priced: the one function
    every sharding of an operator is priced by (the ILP's choices and uniform
    configurations alike)."""
    inputs = tuple(layout_of(op, t, pair, "input") for t in op.inputs)
    output = layout_of(op, op.output, pair, "output")
    split = split_degrees(op, pair, mesh)
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
                         flash_attention=ctx.flash_attention,
                         grouped_experts=ctx.grouped_experts)  # fmt: skip
    scale = op_scale(ctx.cluster.device.efficiency.profile, op, split, stack=ctx.stack,
                     precision=ctx.precision)  # fmt: skip
    load = _routed_load(op, split, ctx)
    times = cost.OpTime(forward_s=times.forward_s * scale.forward * load,
                        backward_s=times.backward_s * scale.backward * load,
                        weight_s=times.weight_s * scale.backward * load,
                        stack_forward_s=times.stack_forward_s * scale.forward * load)  # fmt: skip
    params, copies = weight_copies(op, pair, mesh)
    states, sync = weight_costs(ctx.cluster, mesh.replica_group(copies, ctx.replicas),
                                params=params, precision=ctx.states_precision or ctx.precision,
                                num_microbatches=ctx.num_microbatches,
                                stack=ctx.stack)  # fmt: skip
    layout = as_layout(pair)
    kept = cost.saved_activation_bytes(
        op, lambda t: kept_degrees(op, t, pair, mesh), recompute="none",
        flash_attention=ctx.flash_attention,
    )  # fmt: skip
    selective = cost.saved_activation_bytes(
        op, lambda t: kept_degrees(op, t, pair, mesh), recompute="selective",
        flash_attention=ctx.flash_attention, modules=ctx.recompute_modules,
    )  # fmt: skip
    working = sum(cost.sharded_bytes(t, kept_degrees(op, t, pair, mesh)) for t in op.working)
    first = op.saved[0] if op.saved else None
    comm = tuple(load * c for c in own_collectives(op, pair, mesh, ctx, times))
    return Strategy(
        name=",".join(d or "R" for d in pair),
        assignment=pair,
        inputs=inputs,
        input_grads=tuple(grad_layout(layout, pair) for layout in inputs),
        output=output,
        output_grad=tuple("R" if p == "P" else p for p in output),
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        weight_s=times.weight_s,
        comm_s=comm[0],
        forward_comm_s=comm[1],
        hidden_comm_s=comm[2],
        hidden_forward_comm_s=comm[3],
        selective_forward_s=_selective_rerun_s(op, times, ctx.recompute_modules),
        weights=((params, copies),) if params else (),
        state_bytes=states,  # type: ignore[arg-type]
        sync_s=sync,  # type: ignore[arg-type]
        kept_bytes=kept * scale.kept,
        kept_selective_bytes=selective * scale.kept,
        working_bytes=working,
        gathered_bytes=gathered_kv_bytes(op, pair, mesh, ctx),
        input_bytes=cost.sharded_bytes(first, tensor_degrees(first, layout, mesh))
        if first is not None else 0.0,
    )  # fmt: skip


def _routed_load(op: Op, split: dict[str, int], ctx: StrategyContext) -> float:
    """The busiest expert-parallel rank's routed tokens over its share, for an op on the
    routed tokens (:func:`planner.cost.busiest_rank_load`): its compute and its exchange
    wait for that rank. What each rank keeps is priced at its share: a rank is the busiest in
    some layers, not in all, and its stage's layers average out."""
    if ctx.expert_load_cv <= 0 or not op.routed:
        return 1.0
    experts = dim_size(op, "experts") or 1
    return cost.busiest_rank_load(experts=experts, expert_parallel=split.get("experts", 1),
                                  cv=ctx.expert_load_cv)


def _selective_rerun_s(op: Op, times: cost.OpTime, modules: tuple[str, ...]) -> float:
    """The forward seconds selective recomputation of ``modules`` runs again: all of it, but
    the share of its own kernel whose output torchtitan's per-operator policy saved."""
    if not op.reruns(modules):
        return 0.0
    own = times.forward_s - times.stack_forward_s
    return times.forward_s - own * op.output_saved(modules)


def follow(op: Op, layout: Layout, mesh: LogicalMesh, ctx: StrategyContext) -> Strategy | None:
    """``op`` (elementwise, one input) run in the layout its input arrives in; None if that
    layout is a partial sum (an activation of a partial sum is not the partial of one)."""
    if "P" in layout:
        return None
    pair = tuple(None if p == "R" else p for p in layout)
    names = {canonical(n) for t in (*op.inputs, op.output) for n, _ in t.dims}
    if any(d is not None and d not in names for d in pair):
        return None
    return price_strategy(op, pair, mesh, ctx)
