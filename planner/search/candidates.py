"""The per-operator search's space: what :func:`planner.search.per_operator.solve_per_operator`
may choose from, and the outer candidates it visits.

A candidate fixes what the layer ILP and the pipeline's dynamic program do not choose: the
data-parallel replicas of the whole pipeline, the submesh every stage runs on (hence the
number of stages), the pipeline's microbatch and the schedule. Candidates come sorted by a
lower bound on their step, their compute at the best GEMM efficiency stretched by the
pipeline's fill and drain, which lets the search stop early and state its gap when a time
limit cuts it short.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner import cost
from planner.graph import forward_flops
from planner.options import SolveOptions
from planner.pipeline.submeshes import submesh_shapes
from planner.sharding.layout import LogicalMesh
from planner.sharding.strategies import deepep_refused
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.space import divisors
from planner.uniform.stages import deepep_group_bytes
from planner.vocabulary import PipelineSchedule, Precision


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One setting of the outer knobs."""

    replicas: int
    """Data-parallel copies of the whole pipeline, side by side."""
    mesh: tuple[int, int]
    """Every stage's submesh as (nodes, devices per node), Alpa's shapes; the layer ILP's logical
    mesh ``d0 x d1``."""
    num_stages: int
    """Pipeline stages, each on a ``mesh`` of its own."""
    mesh_micro_batch_size: int
    """Sequences per pipeline microbatch on one stage's mesh (all its data-parallel ways)."""
    num_microbatches: int
    """Microbatches per step per pipeline replica (global batch / (``replicas`` x
    ``mesh_micro_batch_size``))."""
    schedule: PipelineSchedule
    """The pipeline schedule as configured (interleaved when ``vpp > 1``)."""
    vpp: int
    """Virtual stages (model chunks) per pipeline stage; 1: not interleaved."""
    lower_bound_s: float
    """A lower bound on the step, in seconds, that orders the search: the FLOPs the GPUs
    execute for a microbatch's forward and backward (:func:`planner.cost.executed_flops`, so
    causal attention's skipped half is not counted) at the GEMM efficiency ceiling, stretched
    by the pipeline's fill and drain."""


def candidates(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[Candidate]:
    """Every outer setting that divides, cheapest lower bound first."""
    n_dev = cluster.num_devices
    per_node = cluster.devices_per_node
    layers = model.num_layers
    gbs = training.global_batch_size
    flops = cost.executed_training_flops(  # FP8 GEMMs run up to the device's speedup faster
        model, training, 1, flash_attention=options.flash_attention,
        fp8_speedup=max(1.0, cost.device_fp8_speedup(cluster.device)))  # fmt: skip
    wide_domain = cluster.scale_up_devices > per_node  # nodes joined by NVLink (NVL72)
    max_nodes = options.max_mesh_nodes or (2 if model.moe or wide_domain else 1)
    out = []
    for replicas in divisors(n_dev):
        devices = n_dev // replicas
        nodes = max(1, devices // per_node)
        for mesh in submesh_shapes(nodes, per_node):
            size = mesh[0] * mesh[1]
            if size > devices or devices % size or (mesh[0] > 1 and devices % per_node):
                continue
            if mesh[0] & (mesh[0] - 1) or mesh[0] > max_nodes:
                continue
            stages = devices // size
            if stages > layers or not options.pins.admits(pp=stages):
                continue
            per_rank = options.micro_batch_sizes
            if options.pins.mbs is not None:
                per_rank = (options.pins.mbs,)
            for b in mesh_microbatches(per_rank, size):
                if gbs % (replicas * b):
                    continue
                m = gbs // (replicas * b)
                per_microbatch = cost.compute_lower_bound_s(
                    cluster.device, training.precision, flops=flops * b / devices
                )
                for schedule, v in _schedules(layers, stages, m, options.interleaved):
                    if not options.pins.admits(vpp=v):
                        continue
                    bound, _ = cost.fill_and_drain(sum_s=stages * per_microbatch,
                                                   max_s=per_microbatch, num_microbatches=m,
                                                   vpp=v)  # fmt: skip
                    out.append(Candidate(replicas=replicas, mesh=mesh, num_stages=stages,
                                         mesh_micro_batch_size=b, num_microbatches=m,
                                         schedule=schedule, vpp=v, lower_bound_s=bound))
    out.sort(key=lambda c: (c.lower_bound_s, -c.replicas, c.num_stages, c.mesh_micro_batch_size,
                            c.vpp))  # fmt: skip
    return out


def mesh_microbatches(per_rank: Sequence[int], mesh_size: int) -> list[int]:
    """Sequences one mesh takes per microbatch: a per-rank microbatch times the ways the
    layer ILP may split the batch inside the mesh (which it decides), so that a stage whose
    mesh is all data parallel can still run the per-rank microbatches a user would try.

    >>> mesh_microbatches((1, 2), 4)
    [1, 2, 4, 8]
    """
    ways = [d for d in divisors(mesh_size) if d & (d - 1) == 0 or d == mesh_size]
    return sorted({b * d for b in per_rank for d in ways})


def _schedules(
    layers: int, stages: int, m: int, interleaved: bool
) -> list[tuple[PipelineSchedule, int]]:
    """1F1B, and interleaved 1F1B with ``v`` chunks per stage (Megatron needs the
    microbatches to be a multiple of the stages; the split must give each stage a multiple of
    ``v`` layers, which the dynamic program enforces)."""
    out: list[tuple[PipelineSchedule, int]] = [("1f1b", 1)]
    if interleaved and stages > 1 and m % stages == 0:
        out += [("1f1b", v) for v in range(2, layers // stages + 1)]
    return out


def model_flops_per_sequence(model: ModelSpec, seq: int) -> float:
    """Forward FLOPs of one sequence through the whole model."""
    return forward_flops(model, TrainingSpec(seq_length=seq, global_batch_size=1), 1)


def describe(c: Candidate) -> str:
    """A candidate as a user would say it.

    >>> describe(Candidate(replicas=8, mesh=(1, 8), num_stages=16, mesh_micro_batch_size=4,
    ...                    num_microbatches=48, schedule="1f1b", vpp=3, lower_bound_s=0.0))
    'PP16 of 1x8 meshes, 8 pipeline replicas, microbatch of 4 sequences, v=3'
    >>> describe(Candidate(replicas=1, mesh=(1, 8), num_stages=1, mesh_micro_batch_size=1,
    ...                    num_microbatches=48, schedule="1f1b", vpp=1, lower_bound_s=0.0))
    'PP1 of 1x8 meshes, 1 pipeline replica, microbatch of 1 sequence'
    """
    replicas = f"{c.replicas} pipeline replica" + "s" * (c.replicas > 1)
    sequences = f"{c.mesh_micro_batch_size} sequence" + "s" * (c.mesh_micro_batch_size > 1)
    text = f"PP{c.num_stages} of {c.mesh[0]}x{c.mesh[1]} meshes, {replicas}, microbatch of "
    return text + sequences + (f", v={c.vpp}" if c.vpp > 1 else "")


def candidate_communicators(
    model: ModelSpec, cluster: ClusterSpec, c: Candidate, *, deepep: bool = False,
    precision: Precision = "bf16",
) -> cost.Communicators:  # fmt: skip
    """The NCCL communicators a device of candidate ``c`` connects: one per mesh axis and
    one over the replicas (an axis of a mixture-of-experts model counted as an all-to-all,
    which its experts may run), the pipeline's neighbours and the tied embeddings' group.
    Where DeepEP exchanges the experts' tokens (``deepep``), the axes are collective groups
    and DeepEP's buffers those of the largest group of axes it could exchange over
    (:func:`~planner.uniform.stages.deepep_group_bytes`; the layer ILP has not chosen yet)."""
    moe = model.moe is not None
    axes = tuple(n for n in c.mesh if n > 1)
    tied = model.embedding_on_last_stage and c.num_stages > 1
    pairs = int(c.num_stages > 1) + int(tied)
    if moe and deepep:
        buffers = max((deepep_group_bytes(model, precision, n)
                       for n in deepep_groups(cluster, c.mesh)), default=0.0)  # fmt: skip
        return cost.Communicators(groups=(*axes, c.replicas), pairs=pairs, deepep_bytes=buffers)
    # the mesh is (nodes, devices per node): a scale-up domain holds that many of each axis
    strides = (cluster.devices_per_node, 1)
    spans = tuple((n, cost.members_per_level(cluster, cost.CommGroup(size=n, stride=s))[0])
                  for n, s in zip(c.mesh, strides, strict=True) if n > 1)  # fmt: skip
    return cost.Communicators(groups=(*(() if moe else axes), c.replicas),
                              all_to_all=spans if moe else (), pairs=pairs)  # fmt: skip


def deepep_groups(cluster: ClusterSpec, mesh: tuple[int, ...]) -> list[int]:
    """The sizes of the groups of ``mesh``'s axes DeepEP can exchange tokens over
    (:func:`planner.sharding.strategies.deepep_refused`).

    >>> from planner.spec.reading import load_cluster
    >>> deepep_groups(load_cluster("instances/clusters/dgx-h100-80gb.json"), (2, 8))
    [8, 16]
    """
    logical = LogicalMesh(mesh)
    every = itertools.chain.from_iterable(itertools.combinations(range(len(mesh)), k)
                                          for k in range(1, len(mesh) + 1))  # fmt: skip
    return sorted({math.prod(mesh[a] for a in axes) for axes in every
                   if not deepep_refused(axes, logical, cluster)} - {1})  # fmt: skip
