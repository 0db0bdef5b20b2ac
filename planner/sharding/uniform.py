"""A uniform (Megatron-style) configuration as an assignment of the ILP's own strategies.

A stage of a uniform configuration is a logical mesh of three axes, numbered as Megatron-Core
numbers its ranks (tensor fastest, then context, then data: ``tp-cp-ep-dp``):

- ``data``: the data-parallel ranks expert parallelism needs inside the stage (experts are
  split over data x context ranks, with expert tensor parallelism equal to TP, or over the
  tensor x context x data ranks when folded, ``etp`` 1); 1 without EP;
- ``context``: the context-parallel ranks (or, when expert parallelism is narrower than
  context parallelism, the expert-parallel part of them, the rest going to the first axis);
- ``tensor``: the tensor-parallel ranks.

Every operator gets the strategy Megatron-LM gives it (:func:`megatron_assignment`):
column-parallel linears split their output dim on the tensor axis, row-parallel ones their
input dim, the attention core its heads, the embedding, output layer and loss the vocabulary;
operators on the residual stream (norms, residual adds, replicated projections, the router)
split the sequence on the tensor axis under sequence parallelism and repeat the work without
it; every token operator splits the sequence on the context axes and the batch on the data
axis; routed experts are split on the expert axes (folded, the tensor axis among them: the
routed tokens leave their sequence shard for their experts' ranks). The layer is then
priced by the same functions as the ILP's choices (:func:`planner.sharding.assignment.layer_parts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from planner import cost
from planner.errors import ConfigError
from planner.graph import lowered
from planner.graph.ops import TENSOR_PARALLEL_DIMS, TRANSFORMER_KINDS, Op
from planner.graph.stacks import grouped_experts
from planner.plan.degrees import Degrees, folded
from planner.sharding.assignment import (
    LayerGraph,
    LayerParts,
    StrategiesFn,
    layer_graph,
    layer_parts,
)
from planner.sharding.context import StrategyContext
from planner.sharding.layout import LogicalMesh, canonical
from planner.sharding.splits import EXPERTS_BY_BATCH, Assignment, divides
from planner.sharding.strategies import Strategy, kept_sharded, price_strategy
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.vocabulary import DEFAULT_RECOMPUTE_MODULES, Precision, Stack

DATA, CONTEXT, TENSOR = 0, 1, 2
"""The axes of a uniform stage's mesh."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UniformLayout:
    """What each axis of a stage's mesh does under a uniform configuration: one splits the
    tensor-parallel dims, some the sequence (context parallelism), the rest the batch (data
    parallelism), and some of them the routed experts too."""

    shape: tuple[int, ...]
    """Sizes of the mesh's axes: (data, context, tensor) for :func:`uniform_layout`."""
    tensor_axis: int | None = TENSOR
    """The axis that splits heads, FFN and vocabulary (None: no tensor parallelism)."""
    sequence_axes: tuple[int, ...]
    """Axes that split the sequence of every token operator (context parallelism)."""
    expert_axes: tuple[int, ...]
    """Axes that split the routed experts."""
    sequence_parallel: bool
    """Residual-stream operators split the sequence on the tensor axis too."""
    ulysses: bool = False
    """The attention core splits heads, not the sequence, on the sequence axes (all-to-alls
    before and after it: DeepSpeed-Ulysses); else ring attention."""

    @property
    def data_axes(self) -> tuple[int, ...]:
        """Axes that split the batch."""
        return tuple(a for a in range(len(self.shape))
                     if a != self.tensor_axis and a not in self.sequence_axes)  # fmt: skip

    @property
    def data_ways(self) -> int:
        """Data-parallel ranks inside the stage (each holds one microbatch of its own)."""
        return math.prod(self.shape[a] for a in self.data_axes)

    @property
    def num_devices(self) -> int:
        """Devices of the stage."""
        return math.prod(self.shape)


def uniform_layout(d: Degrees) -> UniformLayout:
    """The mesh of a stage of a configuration of degrees ``d``: its tensor (with sequence
    parallelism if asked for), context (ring or Ulysses) and expert parallelism.

    Megatron-Core takes the expert-parallel ranks from the context x data ranks, context
    first; so EP covers all of CP and ``ep / cp`` data-parallel ranks, or a part of CP.
    Folded (``etp`` 1), it takes the tensor-parallel ranks before them, and the rest of EP,
    ``ep / tp``, as above.

    >>> uniform_layout(Degrees(tp=2, ep=8, sp=True)).shape
    (8, 1, 2)
    >>> uniform_layout(Degrees(cp=4, ep=2)).shape
    (2, 2, 1)
    >>> folded_layout = uniform_layout(Degrees(tp=2, ep=8, etp=1, sp=True))
    >>> folded_layout.shape, folded_layout.expert_axes
    ((4, 1, 2), (0, 1, 2))
    """
    tp, cp, ep = d.tp, d.cp, d.ep
    sp = bool(d.sp) and tp > 1
    ulysses = bool(d.ulysses) and cp > 1
    fold = bool(folded(d))
    if fold and not (sp and ep % tp == 0):
        raise ConfigError(f"etp(1) folds whole tensor-parallel groups into the experts' "
                          f"groups under sequence parallelism: ep({ep}) over tp({tp})"
                          f"{'' if sp else ' without sp'}")  # fmt: skip
    tensor = (TENSOR,) if fold else ()
    ep //= tp if fold else 1
    if ep == 1:
        return UniformLayout(shape=(1, cp, tp), sequence_axes=(CONTEXT,), expert_axes=tensor,
                             sequence_parallel=sp, ulysses=ulysses)  # fmt: skip
    if ep % cp == 0:
        return UniformLayout(shape=(ep // cp, cp, tp), sequence_axes=(CONTEXT,),
                             expert_axes=(DATA, CONTEXT, *tensor), sequence_parallel=sp,
                             ulysses=ulysses)  # fmt: skip
    if cp % ep == 0:
        return UniformLayout(shape=(cp // ep, ep, tp), sequence_axes=(DATA, CONTEXT),
                             expert_axes=(CONTEXT, *tensor), sequence_parallel=sp,
                             ulysses=ulysses)  # fmt: skip
    raise ConfigError(f"ep({ep}) and cp({cp}): one must divide the other (Megatron-Core takes "
                      f"the expert-parallel ranks from the context-parallel ranks first)")


def _tensor_dim(op: Op, layout: UniformLayout) -> str | None:
    """What the tensor axis splits for ``op`` (Shoeybi et al. 2019; Korthikanti et al. 2023);
    folded, the routed experts' operators split the experts on it, the routing operators
    sending each rank's sequence shard to its experts' ranks."""
    residual = "seq" if layout.sequence_parallel else None
    if layout.tensor_axis in layout.expert_axes and op.routed:
        return "experts"
    if op.kind in ("linear", "expert_linear"):
        assert op.weight is not None  # every linear has a weight
        into, out = (canonical(op.weight.dims[-2][0]), canonical(op.weight.dims[-1][0]))
        if out in TENSOR_PARALLEL_DIMS:
            return out  # column-parallel
        if into in TENSOR_PARALLEL_DIMS:
            return into  # row-parallel
        return residual  # replicated (MLA's down projections): on the residual stream
    return {
        "attention": "heads",
        "embedding": "vocab",
        "loss": "vocab",
        "elementwise": canonical(op.output.dims[-1][0]),
    }.get(op.kind, residual)


def _token_dim(op: Op, *, axis: int, layout: UniformLayout) -> str:
    """What a data or context axis splits for ``op``."""
    tokens = "seq" if axis in layout.sequence_axes else "batch"
    if tokens == "seq" and layout.ulysses and op.kind == "attention":
        return "heads"  # Ulysses: all-to-alls trade the sequence shard for a head shard
    experts = axis in layout.expert_axes
    if op.kind in ("dispatch", "combine"):
        if not experts:
            return tokens
        return "experts" if tokens == "seq" else EXPERTS_BY_BATCH
    if op.routed:
        return "experts" if experts else "capacity"
    return tokens


def megatron_assignment(op: Op, layout: UniformLayout) -> Assignment:
    """The strategy Megatron-LM runs ``op`` with, as a split per mesh axis (None where an
    axis of one device, or one that repeats the op's work)."""
    pair = [_tensor_dim(op, layout) if axis == layout.tensor_axis
            else _token_dim(op, axis=axis, layout=layout)
            for axis in range(len(layout.shape))]  # fmt: skip
    return tuple(None if size == 1 else dim for dim, size in zip(pair, layout.shape,
                                                                 strict=True))  # fmt: skip


def _assigned(layout: UniformLayout) -> StrategiesFn:
    """The strategies function of a layer graph whose every op runs its Megatron strategy."""

    def strategies(op: Op, mesh: LogicalMesh, ctx: StrategyContext) -> list[Strategy]:
        pair = megatron_assignment(op, layout)
        if not divides(op, pair, mesh):
            split = ", ".join(f"{d} on {n}" for d, n in zip(pair, mesh.shape, strict=True) if d)
            raise ConfigError(f"{op.name} does not split evenly ({split} ranks)")
        strategy = price_strategy(op, pair, mesh, ctx)
        axis = layout.tensor_axis
        if layout.sequence_parallel and axis is not None and pair[axis] is not None:
            # Under SP a column-parallel matmul keeps only its input's sequence shard.
            kept = [k for k in kept_sharded(op, strategy, mesh, ctx)
                    if k.name.endswith(f"@{axis}")]  # fmt: skip
            strategy = kept[0] if kept else strategy
        return [strategy]

    return strategies


@dataclass(frozen=True, kw_only=True, slots=True)
class UniformQuery:
    """One layer kind of a uniform configuration's stage, on one device, per microbatch."""

    kind: str
    """The layer kind: ``embedding``, ``dense``, ``moe`` or ``head``."""
    layout: UniformLayout
    """What each axis of the stage's mesh splits."""
    micro_batch_size: int
    """Sequences per data-parallel rank."""
    seq_length: int
    """Tokens per sequence, before context parallelism splits it."""
    precision: Precision
    """Compute precision."""
    stack: Stack = "megatron-te"
    """The software that runs the layer (what it keeps for the backward)."""
    flash_attention: bool = True
    """The attention core runs fused: causal FLOPs halved, no ``s x s`` tensors kept."""
    tp_comm_overlap: bool = False
    """Tensor-parallel resharding next to a matmul hides behind it (Megatron-Core's
    ``--tp-comm-overlap``)."""
    strides: tuple[int, int, int] | None = None
    """Ranks between neighbours along each axis, when not Megatron's default order."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """What selective recomputation reruns (:data:`planner.vocabulary.RECOMPUTE_MODULES`)."""
    deepep: bool = False
    """DeepEP exchanges the experts' tokens (else NCCL's all-to-all)."""
    kv_allgather: bool = False
    """Context parallelism all-gathers K/V, as PyTorch's does (``cp_algo`` allgather), where
    the layout's sequence axes split the attention's sequence."""


def uniform_layer(model: ModelSpec, cluster: ClusterSpec, query: UniformQuery) -> LayerGraph:
    """The layer graph of ``query``'s layer kind with Megatron's strategy on every op."""
    layout = query.layout
    training = TrainingSpec(seq_length=query.seq_length, global_batch_size=1,
                            precision=query.precision, stack=query.stack)  # fmt: skip
    graph, index = lowered(model, training, query.micro_batch_size * layout.data_ways)
    ops = index.ops_by_layer[index.layers_by_kind[query.kind][0]]
    mesh = LogicalMesh(layout.shape, query.strides)
    ctx = StrategyContext(cluster=cluster, precision=query.precision,
                          states_precision=cost.states_precision(query.precision, query.stack),
                          flash_attention=query.flash_attention,
                          tp_comm_overlap=query.tp_comm_overlap,
                          grouped_experts=grouped_experts(query.stack, query.precision),
                          stack=query.stack,
                          recompute_modules=query.recompute_modules,
                          deepep=cost.Routing.of(model) if query.deepep else None,
                          expert_load_cv=model.moe.expert_load_cv if model.moe else 0.0,
                          kv_allgather=query.kv_allgather)
    return layer_graph(graph, ops, mesh, ctx, strategies=_assigned(layout),
                       transformer=query.kind in TRANSFORMER_KINDS)  # fmt: skip


def uniform_parts(model: ModelSpec, cluster: ClusterSpec, query: UniformQuery) -> LayerParts:
    """What one microbatch through one layer of ``query``'s kind costs one device, by part.

    Remembered per input: searches price the same layer under many pipeline, batch,
    recomputation and ZeRO settings, which do not change it."""
    return _parts(model, cluster.priced_json(), query)


@lru_cache(maxsize=4096)
def _parts(model: ModelSpec, cluster_json: str, query: UniformQuery) -> LayerParts:
    layer = uniform_layer(model, ClusterSpec.model_validate_json(cluster_json), query)
    return layer_parts(layer, [0] * len(layer.nodes))
