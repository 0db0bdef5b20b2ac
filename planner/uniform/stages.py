"""A uniform configuration's pipeline stages, for pricing one configuration
(:func:`~planner.uniform.estimate.estimate`) or many (:func:`~planner.uniform.batch.
estimate_batch`) the same way: each stage's layer kinds, its mesh and groups, its weights
and their tied copy, its pipeline sends, and a stage's time, parameters and recomputed
FLOPs composed from its layer kinds' costs (floats for one configuration, arrays for many).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from planner import cost
from planner.cost.elementwise import Real, where
from planner.cost.layer import LayerCost
from planner.cost.stage_weights import TiedCopy, Weights
from planner.graph import LayerIndex, lowered
from planner.graph.ops import TRANSFORMER_KINDS
from planner.graph.stacks import pipeline_transfers
from planner.placement.ranks import RankOrder, megatron_order
from planner.plan.config import ResolvedConfig
from planner.plan.degrees import Degrees, degrees_of
from planner.sharding.layout import LogicalMesh
from planner.sharding.uniform import (
    CONTEXT,
    DATA,
    TENSOR,
    UniformLayout,
    UniformQuery,
    uniform_layout,
)
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.recompute_layers import Chunk, chunks_cost
from planner.vocabulary import Precision

StageKinds = tuple[tuple[str, int], ...]
"""A stage's layer kinds and how many layers of each (sorted by kind)."""

WeightGroups = tuple[tuple[tuple[int, ...], float], ...]
"""A layer's parameters by the mesh axes holding copies of them
(:meth:`~planner.sharding.assignment.LayerParts.weight_groups`)."""


@lru_cache(maxsize=64)
def layer_index(model: ModelSpec, training: TrainingSpec, micro_batch_size: int) -> LayerIndex:
    """The model's layers by kind, as lowered for ``micro_batch_size`` (remembered)."""
    return lowered(model, training, micro_batch_size)[1]


@lru_cache(maxsize=256)
def stage_kinds(
    model: ModelSpec, training: TrainingSpec, micro_batch_size: int, layers: tuple[int, ...],
    *, head_first: bool = False,
) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Layer kinds per stage (sorted (kind, count) pairs): contiguous blocks of ``layers[i]``
    layers, embedding first and head last; ``head_first``: the head on the first stage too,
    as a V schedule places it (ZB-V runs the last model chunk on the first stage)."""
    index = layer_index(model, training, micro_batch_size)
    kind_of = {layer: kind for kind, layers in index.layers_by_kind.items() for layer in layers}
    stages = []
    first = 1
    for stage, count in enumerate(layers):
        kinds = Counter(kind_of[layer] for layer in range(first, first + count))
        kinds["embedding"] += stage == 0
        kinds["head"] += stage == (0 if head_first else len(layers) - 1)
        stages.append(tuple(sorted((k, n) for k, n in kinds.items() if n)))
        first += count
    return tuple(stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformStage:
    """How a uniform configuration's stage sits on the ranks: its mesh (three axes, see
    :mod:`planner.sharding.uniform`) with their rank strides, and its data-parallel copies."""

    degrees: Degrees
    """The degrees that placed it (:meth:`~planner.plan.degrees.Degrees.placed`)."""
    layout: UniformLayout
    """The stage's sharding: its mesh's axes and what each splits."""
    mesh: LogicalMesh
    """The stage's mesh, with the rank strides of its axes."""
    replicas: int
    """Copies of the stage (data-parallel ranks outside its mesh)."""
    replica_stride: int
    """Ranks between a device and the same device of the next copy."""
    rank_order: RankOrder
    """How the configuration numbers its ranks (:func:`planner.placement.ranks.megatron_order`)."""

    @property
    def pipeline_distance(self) -> int:
        """Ranks between a device and the same device of the next stage."""
        return self.rank_order.stride("pp")

    @property
    def tensor_group(self) -> cost.CommGroup:
        """The tensor-parallel ranks of a device."""
        return self.rank_order.group("tp")

    def group(self, axes: tuple[int, ...]) -> cost.CommGroup | None:
        """The ranks holding copies of a weight replicated along the mesh ``axes`` and over
        the stage's copies (None: no other copy)."""
        members = [(self.mesh.size(a), self.mesh.stride(a)) for a in axes]
        members.append((self.replicas, self.replica_stride))
        size = 1
        for n, _ in members:
            size *= n
        if size <= 1:
            return None
        return cost.CommGroup(size=size, stride=min(stride for n, stride in members if n > 1))


def uniform_stage(resolved: ResolvedConfig) -> UniformStage:
    """The mesh and groups of ``resolved``'s stages, its ranks numbered in its rank order."""
    c = resolved.config
    degrees = degrees_of(dict(c)).placed(dp=resolved.dp)
    return placed_stage(degrees, rank_order=c.rank_order)


@lru_cache(maxsize=4096)
def placed_stage(d: Degrees, *, rank_order: str) -> UniformStage:
    """The mesh and groups of the stages of a uniform configuration of degrees ``d`` (as
    :meth:`~planner.plan.degrees.Degrees.placed` keeps them), its ranks numbered in
    ``rank_order`` (:func:`planner.placement.ranks.megatron_order`)."""
    layout = uniform_layout(d)
    ranks = megatron_order(rank_order, d)
    s = ranks.strides()
    data, context, tensor = layout.shape
    if layout.data_ways > 1 or data == 1:  # the first axis is data-parallel ranks
        strides = (s["dp"], s["cp"], s["tp"])
    else:  # the first axis is the outer part of the context-parallel ranks
        strides = (s["cp"] * context, s["cp"], s["tp"])
    replicas = d.dp // layout.data_ways
    row_major = (context * tensor, tensor, 1)
    # An axis of one rank has no neighbours: its stride is moot, and left row-major the same
    # layer on other pipelines (or rank orders) is the same layer to price.
    strides = tuple(r if n == 1 else s for s, r, n in zip(strides, row_major, layout.shape,
                                                          strict=True))  # fmt: skip
    mesh = LogicalMesh(layout.shape, None if strides == row_major else strides)
    return UniformStage(degrees=d, layout=layout, mesh=mesh, replicas=replicas,
                        replica_stride=s["dp"] * layout.data_ways, rank_order=ranks)


def uniform_query(resolved: ResolvedConfig, stage: UniformStage, kind: str) -> UniformQuery:
    """The layer query of one layer kind of ``resolved``."""
    c, training = resolved.config, resolved.training
    return UniformQuery(kind=kind, layout=stage.layout, micro_batch_size=c.mbs,
                        seq_length=training.seq_length, precision=training.precision,
                        stack=training.stack, flash_attention=c.flash_attention,
                        tp_comm_overlap=c.tp_comm_overlap,
                        recompute_modules=resolved.recompute_modules,
                        deepep=c.moe_dispatcher == "deepep",
                        kv_allgather=c.cp > 1 and c.cp_algo == "allgather",
                        strides=stage.mesh.strides)  # type: ignore[arg-type]  # fmt: skip




def host_fits(cluster: ClusterSpec, node_bytes: Any) -> Any:
    """Whether a node's host memory holds ``node_bytes`` of offloaded states (a float or an
    array; nothing offloaded always fits, with or without host figures)."""
    if cluster.host is None:
        return node_bytes <= 0
    return node_bytes <= cluster.host.memory_bytes


def stage_weights(
    params: dict[tuple[int, ...], float], stage: UniformStage
) -> tuple[Weights, ...]:
    """The stage's parameters by the groups their gradients are summed over.

    Megatron-LM reduces every gradient over the data-parallel ranks holding the same shard
    (data x context ranks; for experts, the ranks holding the same experts), and those of
    weights sequence parallelism replicates across tensor-parallel ranks (the norms) over
    those ranks first, in a separate all-reduce
    (``_allreduce_non_tensor_model_parallel_grads``,
    ``megatron/core/distributed/finalize_model_grads.py``); the distributed optimizer
    shards their states over the data-parallel ranks only."""
    weights = []
    for axes, n in sorted(params.items()):
        tensor = TENSOR in axes
        outer = tuple(a for a in axes if a != TENSOR)
        weights.append(Weights(params=n, data_parallel=stage.group(outer),
                               also_reduced_over=stage.tensor_group if tensor else None))
    return tuple(weights)


def tied_copy(model: ModelSpec, stage: UniformStage) -> TiedCopy | None:
    """The last stage's copy of the word embeddings, tied to the output layer or read by the
    multi-token-prediction modules (:attr:`~planner.spec.ModelSpec.embedding_on_last_stage`),
    split over tensor-parallel ranks (none under ZB-V, whose first stage holds the embedding
    and the head: callers skip it)."""
    if not model.embedding_on_last_stage or stage.degrees.pp == 1:
        return None
    return TiedCopy(params=model.vocab_size * model.hidden_size / stage.degrees.tp,
                    data_parallel=stage.group((DATA, CONTEXT)),
                    sync_group=stage.rank_order.ends_group("pp"))  # fmt: skip


def communicators(
    stage: UniformStage, *, cluster: ClusterSpec, deepep_bytes: float = 0.0
) -> cost.Communicators:  # fmt: skip
    """The NCCL communicators every device of ``stage`` connects (NCCL connects a
    communicator's buffers on first use, ``NCCL_RUNTIME_CONNECT``, so only those the step
    runs): its tensor- and context-parallel groups (Ulysses' and the experts' as
    all-to-alls), the gradients' data-parallel groups (the experts' own) and the pipeline's
    neighbours; the embedding group only the end stages connect
    (:func:`embedding_group_bytes`). Where DeepEP exchanges the experts' tokens
    (``deepep_bytes``: its buffers, :func:`deepep_bytes`), their group runs no all-to-all:
    DeepEP's ``Buffer`` only gathers its peers' handles over it (deepseek-ai/DeepEP
    ``deep_ep/buffers/legacy.py``), a collective group's buffers. Each all-to-all counts its
    ranks inside one of ``cluster``'s scale-up domains (:func:`in_domain`).

    >>> from planner.plan.degrees import Degrees
    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json", 32)
    >>> stage = placed_stage(Degrees(tp=8, pp=4, dp=16), rank_order="tp-cp-ep-dp-pp")
    >>> communicators(stage, cluster=h100)
    Communicators(groups=(8, 1, 16), all_to_all=(), pairs=1, deepep_bytes=0.0)
    >>> experts = placed_stage(Degrees(tp=4, dp=64, ep=64, etp=1, sp=True),
    ...                        rank_order="tp-cp-ep-dp-pp")
    >>> communicators(experts, cluster=h100).all_to_all
    ((64, 8),)
    """
    d, layout = stage.degrees, stage.layout
    sequence = (d.cp,) if not d.ulysses else ()
    experts_all_to_all = d.ep > 1 and not deepep_bytes
    all_to_all = tuple(in_domain(stage, axes, cluster) for axes, on in (
        (layout.expert_axes, experts_all_to_all), ((CONTEXT,), bool(d.ulysses))) if on)
    dense = stage.group((DATA, CONTEXT))
    groups = [d.tp, *sequence, dense.size if dense else 1]
    if d.ep > 1:
        experts = stage.group(tuple(a for a in (DATA, CONTEXT) if a not in layout.expert_axes))
        groups.append(experts.size if experts else 1)
    if deepep_bytes:
        groups.append(deepep_ranks(stage))
    return cost.Communicators(groups=tuple(groups), all_to_all=all_to_all, pairs=int(d.pp > 1),
                              deepep_bytes=deepep_bytes)  # fmt: skip


def in_domain(stage: UniformStage, axes: tuple[int, ...],
              cluster: ClusterSpec) -> tuple[int, int]:  # fmt: skip
    """The group along the mesh ``axes`` of ``stage``: its ranks, and how many of them share
    one of ``cluster``'s scale-up domains (each axis' members there,
    :func:`~planner.cost.communication.members_per_level`: Megatron's ranks fill a domain
    axis by axis)."""
    ranks, inside = 1, 1
    for axis in axes:
        size, stride = stage.mesh.size(axis), stage.mesh.stride(axis)
        ranks *= size
        inside *= cost.members_per_level(cluster, cost.CommGroup(size=size, stride=stride))[0]
    return ranks, inside


def deepep_ranks(stage: UniformStage) -> int:
    """The ranks DeepEP exchanges the experts' tokens over: Megatron-Core's expert tensor x
    expert-parallel group (``MoEFlexTokenDispatcher``'s ``tp_ep_group``,
    ``megatron/core/transformer/moe/token_dispatcher.py``), the expert-parallel ranks when
    the experts are folded over the tensor-parallel ones."""
    d = stage.degrees
    return int(d.ep * (d.etp or d.tp))


def deepep_refusal(cluster: ClusterSpec, stage: UniformStage) -> str | None:
    """Why DeepEP cannot run ``stage``'s expert-parallel group (:func:`deepep_ranks`, ranks
    in Megatron's order: its tensor and expert axes together) on ``cluster``, or None
    (:func:`cost.deepep_group_refusal`)."""
    tensor = (TENSOR,) if stage.degrees.tp > 1 else ()
    group = stage.mesh.axes_group(tuple(sorted({*tensor, *stage.layout.expert_axes})))
    ranks = deepep_ranks(stage)
    if group.size != ranks:  # experts not folded over tp: Megatron's tp x ep group
        group = cost.CommGroup(size=ranks, stride=group.stride)
    return cost.deepep_group_refusal(ranks, cost.members_per_level(cluster, group)[0])


def deepep_bytes(model: ModelSpec, training: TrainingSpec, stage: UniformStage) -> float:
    """DeepEP's buffers on every device of ``stage`` (:func:`deepep_group_bytes` of its
    :func:`deepep_ranks`)."""
    return deepep_group_bytes(model, training.precision, deepep_ranks(stage))


def deepep_group_bytes(model: ModelSpec, precision: Precision, ranks: int) -> float:
    """DeepEP's buffers on every device of an expert-parallel group of ``ranks``
    (:func:`cost.deepep_buffer_bytes`), for hidden states of the compute ``precision``, at
    least 2 bytes an element (Megatron-Core's ``get_hidden_bytes``,
    ``megatron/core/transformer/moe/fused_a2a.py``); none without experts spread over ranks."""
    if model.moe is None or ranks <= 1:
        return 0.0
    element = max(int(cost.hidden_state_bytes(micro_batch_size=1, seq_length=1, hidden_size=1,
                                              precision=precision)), 2)  # fmt: skip
    return float(cost.deepep_buffer_bytes(ranks, model.hidden_size * element))


def communicator_bytes(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, stage: UniformStage, *,
    deepep: bool,
) -> float:  # fmt: skip
    """What every device of ``stage`` holds for its communicators (:func:`communicators`, on
    ``cluster``'s scale-up domain), with DeepEP's buffers where it exchanges the experts'
    tokens (:func:`deepep_bytes`): what :func:`~planner.uniform.estimate.estimate` and the
    batch both charge."""
    buffers = deepep_bytes(model, training, stage) if deepep else 0.0
    return communicators(stage, cluster=cluster, deepep_bytes=buffers).bytes


def embedding_group_bytes(model: ModelSpec, pp: Real, *, v_shape: Real = False) -> Real:
    """NCCL's buffers for the embedding group, which sums the last stage's copy of the word
    embeddings with the first stage's (:func:`tied_copy`): a two-rank communicator that only
    a pipeline's first and last stages connect (Megatron-LM's ``_EMBEDDING_GROUP``, the
    pipeline's first and last ranks: ``megatron/core/parallel_state.py``); none under ZB-V,
    whose first stage holds both ends. ``pp`` and ``v_shape`` may be arrays.

    >>> from planner.spec.reading import load_model
    >>> gpt3 = load_model("instances/models/gpt3-175b.json")  # tied
    >>> [round(float(b) / 1e6) for b in (embedding_group_bytes(gpt3, 8),
    ...                                   embedding_group_bytes(gpt3, 1))]
    [544, 0]
    """
    if not model.embedding_on_last_stage:
        return 0.0
    return where((pp > 1) & (v_shape == False), cost.Communicators(pairs=1).bytes, 0.0)  # noqa: E712


def pipeline_sends_s(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, stage: UniformStage, *,
    mbs: int, vpp: int,
) -> float:  # fmt: skip
    """Per-microbatch pipeline send time of one stage (forward activation + backward grad),
    times ``vpp`` chunk boundaries (:func:`planner.cost.pipeline_send_s`). Each context-parallel
    rank holds ``1/cp`` of the tokens; Megatron sends a 1/t slice of them and all-gathers it
    over NVLink (Narayanan et al., Sec. 4.1), or the SP shard as it is; DeepSpeed's engine
    (:func:`~planner.graph.stacks.pipeline_transfers`) the same slices, one blocking transfer
    at a time."""
    d = stage.degrees
    hidden = cost.hidden_state_bytes(micro_batch_size=mbs, seq_length=training.seq_length,
                                     hidden_size=model.hidden_size,
                                     precision=training.precision) / d.cp  # fmt: skip
    gather = stage.tensor_group if d.tp > 1 and not d.sp else None
    return cost.pipeline_send_s(cluster, hidden, stage.pipeline_distance, chunks=vpp,
                                stages=d.pp, slices=d.tp, gather=gather,
                                transfers=pipeline_transfers(training.stack, d.pp))  # fmt: skip


def stage_time(
    kinds: StageKinds, chunks: tuple[Chunk, ...] | None, costs: Mapping[str, LayerCost],
    kept: Mapping[str, LayerCost] | None = None,
) -> LayerCost:  # fmt: skip
    """One stage's per-microbatch costs from its layer kinds' (``costs``: each kind's under
    the configuration's recomputation), pipeline sends aside. With ``chunks`` (only some
    layers recompute: :func:`~planner.uniform.recompute_layers.stage_chunks`) its decoder
    layers are priced chunk by chunk, those kept from ``kept`` (each kind's without
    recomputation)."""
    time = LayerCost.zero()
    for kind, count in kinds:
        if chunks is None or kind not in TRANSFORMER_KINDS:
            time = time + costs[kind].scaled(count)
    if chunks is not None:
        assert kept is not None  # chunks say which layers keep their activations
        time = time + chunks_cost(chunks, every=costs, kept=kept)
    return time


def stage_params(
    kinds: StageKinds, weights: Mapping[str, WeightGroups]
) -> dict[tuple[int, ...], float]:
    """One stage's parameters by the mesh axes holding copies, from its layer kinds'."""
    params: dict[tuple[int, ...], float] = {}
    for kind, count in kinds:
        for axes, n in weights[kind]:
            params[axes] = params.get(axes, 0.0) + n * count
    return params


def recompute_flops(
    flops: Mapping[str, Real], index: LayerIndex, recomputed: Mapping[str, Real]
) -> Real:
    """The FLOPs one microbatch's recomputation reruns over the model: each layer kind's
    (``flops``) times its layers that recompute (``recomputed``, by kind; every layer of a
    kind it does not name)."""
    return sum(flops[kind] * recomputed.get(kind, len(layers))
               for kind, layers in index.layers_by_kind.items())  # fmt: skip
