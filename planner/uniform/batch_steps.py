"""The steps of a batch of uniform configurations, composed as
:func:`~planner.uniform.estimate.estimate` composes one (:mod:`planner.uniform.stages`,
:func:`~planner.cost.step.step_totals`), each part priced once per distinct value of the knobs
it depends on (:func:`~planner.uniform.batch.estimate_batch`'s plan):

1. :func:`dividing`: the configurations that divide (the rules of
   :mod:`planner.plan.divisibility`, on arrays), as :class:`Rows`;
2. :func:`layer_table`: each distinct layer's costs under every recomputation mode, once per
   mesh, microbatch and kernel switch (a mesh that does not split an operator evenly refuses
   its configurations, as ``estimate`` does);
3. :func:`compose`: the layer splits and their runs of equal stages, each run's static costs
   once per mesh, split and ZeRO stage, the pipeline sends once per mesh, microbatch and
   virtual stages, and the step over arrays of the configurations that share a split and a
   schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from planner import cost
from planner.cost.layer import layer_cost
from planner.cost.memory import MemoryParts
from planner.cost.step import PipelineKnobs, step_totals
from planner.errors import ConfigError
from planner.graph.ops import TRANSFORMER_KINDS
from planner.plan.config import recompute_modules_of
from planner.plan.degrees import Derived, Shape, degrees_of, derive
from planner.plan.divisibility import first_broken
from planner.plan.schema import StepTime
from planner.sharding.uniform import UniformQuery, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.columns import codes, factorize
from planner.uniform.recompute_layers import recomputed_counts, stage_chunks
from planner.uniform.stage_runs import LAYER_FIELDS, run_costs, stage_runs, static_costs
from planner.uniform.stages import (
    UniformStage,
    WeightGroups,
    communicator_bytes,
    deepep_refusal,
    embedding_group_bytes,
    layer_index,
    pipeline_sends_s,
    placed_stage,
    recompute_flops,
)
from planner.vocabulary import RECOMPUTE_MODES, schedule_name

_SWITCHES = ("flash_attention", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
             "overlap_moe_expert_parallel_comm")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rows:
    """Configurations of one sequence length, global batch and precision that divide."""

    model: ModelSpec
    """The model priced."""
    cluster: ClusterSpec
    """The cluster priced on."""
    training: TrainingSpec
    """Their sequence length, global batch and precision."""
    rows: np.ndarray
    """Their places in the batch."""
    c: dict[str, np.ndarray]
    """Their columns, one per :class:`~planner.plan.config.ParallelConfig` field."""
    x: Derived
    """What follows from their degrees (data-parallel ranks, microbatches, layer split)."""
    orders: list[str]
    """The rank orders spelled in the batch; ``c["rank_order"]`` holds indices into it."""

    def subset(self, keep: np.ndarray) -> Rows:
        """The rows ``keep`` (a mask) selects."""
        x = Derived(**{f.name: np.asarray(getattr(self.x, f.name))[keep]
                       for f in fields(Derived)})  # fmt: skip
        return Rows(model=self.model, cluster=self.cluster, training=self.training,
                    rows=self.rows[keep], c={k: v[keep] for k, v in self.c.items()}, x=x,
                    orders=self.orders)  # fmt: skip

    @property
    def sp(self) -> np.ndarray:
        """Sequence parallelism, where it applies (tensor parallelism over one rank has none)."""
        return self.c["sp"].astype(bool) & (self.c["tp"] > 1)

    @property
    def recompute(self) -> np.ndarray:
        """The recomputation mode, as an index into :data:`RECOMPUTE_MODES`."""
        modes, mode_of = codes(self.c["recompute"])
        return np.array([RECOMPUTE_MODES.index(mode) for mode in modes])[mode_of]

    @property
    def deepep(self) -> np.ndarray:
        """Where DeepEP exchanges the experts' tokens (else NCCL's all-to-all)."""
        return self.c["moe_dispatcher"] == "deepep"

    def switch(self, name: str) -> np.ndarray:
        """One of the boolean switches (:data:`_SWITCHES`)."""
        return self.c[name].astype(bool)


def dividing(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cols: dict[str, np.ndarray],
    rows: np.ndarray, refused: np.ndarray,
) -> Rows | None:  # fmt: skip
    """The configurations ``cols`` (at ``rows`` of the batch) that divide, with what follows
    from their degrees; each that does not gets the index of the first rule it breaks in
    ``refused``. None when none divides. (A rank order Megatron cannot spell is refused with
    its column, as :class:`ParallelConfig` refuses it.)"""
    shape = Shape(num_devices=cluster.num_devices, num_layers=model.num_layers,
                  global_batch=training.global_batch_size)  # fmt: skip
    d = degrees_of(cols)
    derived = derive(shape, d)
    code = first_broken(model, training.seq_length, shape, d, derived)
    orders, order = codes(cols["rank_order"])
    refused[rows] = code
    ok = code < 0
    if not ok.any():
        return None
    every = Rows(model=model, cluster=cluster, training=training, rows=rows,
                 c=cols | {"rank_order": order}, x=derived, orders=list(orders))  # fmt: skip
    return every.subset(ok)


def placed(b: Rows) -> tuple[list[UniformStage], np.ndarray]:
    """The stages' meshes and groups, once per placed degrees and rank order
    (:meth:`~planner.plan.degrees.Degrees.placed`): each distinct one, and each row's."""
    degrees = degrees_of(b.c).placed(dp=b.x.dp.astype(np.int64))
    first, of = factorize(*degrees.columns(), b.c["rank_order"])
    stages = [placed_stage(degrees.at(r), rank_order=b.orders[b.c["rank_order"][r]])
              for r in first]  # fmt: skip
    return stages, of


class LayerTable(NamedTuple):
    """Each distinct layer's costs, once per mesh, microbatch and kernel switch."""

    layer_of: np.ndarray
    """Each row's layer."""
    by_kind: dict[str, np.ndarray]
    """Each kind's :class:`~planner.cost.layer.LayerCost` fields as ``[layer, mode, field]``
    (modes as :data:`RECOMPUTE_MODES`, fields as :data:`LAYER_FIELDS`)."""
    weights: dict[int, dict[str, WeightGroups]]
    """Each layer's parameters by kind and the mesh axes holding copies."""
    unsplit: np.ndarray
    """The layers whose mesh does not split an operator evenly."""


@lru_cache(maxsize=1 << 16)
def _kind_costs(
    model: ModelSpec, cluster_json: str, query: UniformQuery
) -> tuple[np.ndarray, WeightGroups]:
    """A layer kind's :class:`LayerCost` fields under each recomputation mode (one row per
    mode), and its parameters by the mesh axes holding copies, on the cluster of
    ``cluster_json``; remembered per input (a few hundred bytes each)."""
    parts = uniform_parts(model, ClusterSpec.model_validate_json(cluster_json), query)
    transformer = query.kind in TRANSFORMER_KINDS
    costs = [layer_cost(parts, mode if transformer else "none") for mode in RECOMPUTE_MODES]
    rows = np.array([[getattr(c, f) for f in LAYER_FIELDS] for c in costs])
    return rows, parts.weight_groups()


def layer_table(b: Rows, stages: list[UniformStage], stage_of: np.ndarray) -> LayerTable:
    """Each distinct layer's costs under every recomputation mode, on ``stages[stage_of]``."""
    c, training = b.c, b.training
    kinds = tuple(layer_index(b.model, training, 1).layers_by_kind)
    cluster_json = b.cluster.priced_json()
    flash, overlap = b.switch("flash_attention"), b.switch("tp_comm_overlap")
    # (The layout and the mesh's strides, not the degrees: the same layer sits on many
    # pipelines.)
    meshes: dict[tuple[object, ...], int] = {}
    mesh_of = np.array([meshes.setdefault((s.layout, s.mesh.strides), len(meshes))
                        for s in stages])[stage_of]  # fmt: skip
    module_texts, module_of = codes(c["recompute_modules"])
    deepep = b.deepep
    allgather = (c["cp_algo"] == "allgather") & (c["cp"] > 1)
    first, of = factorize(mesh_of, c["mbs"], flash, overlap, module_of, deepep, allgather)
    by_kind = {k: np.zeros((len(first), len(RECOMPUTE_MODES), len(LAYER_FIELDS)))
               for k in kinds}  # fmt: skip
    weights: dict[int, dict[str, WeightGroups]] = {}
    unsplit = np.zeros(len(first), dtype=bool)
    for u, r in enumerate(first):
        stage = stages[stage_of[r]]
        if deepep[r] and deepep_refusal(b.cluster, stage):
            unsplit[u] = True
            continue
        for kind in kinds:
            query = UniformQuery(kind=kind, layout=stage.layout, micro_batch_size=int(c["mbs"][r]),
                                 seq_length=training.seq_length, precision=training.precision,
                                 stack=training.stack,
                                 flash_attention=bool(flash[r]), tp_comm_overlap=bool(overlap[r]),
                                 # Only a transformer layer is priced under selective
                                 # recomputation (_kind_costs), so the others share one.
                                 recompute_modules=recompute_modules_of(
                                     module_texts[module_of[r]]
                                     if kind in TRANSFORMER_KINDS else None),
                                 deepep=bool(deepep[r]), kv_allgather=bool(allgather[r]),
                                 strides=stage.mesh.strides)  # type: ignore[arg-type]  # fmt: skip
            try:
                costs, groups = _kind_costs(b.model, cluster_json, query)
            except ConfigError:  # an operator the mesh does not split evenly
                unsplit[u] = True
                break
            weights.setdefault(u, {})[kind] = groups
            by_kind[kind][u] = costs
    return LayerTable(layer_of=of, by_kind=by_kind, weights=weights, unsplit=unsplit)


@dataclass(frozen=True, slots=True, kw_only=True)
class Steps:
    """The composed steps of :class:`Rows`, an element per row."""

    step_s: np.ndarray
    """Seconds of one step."""
    parts_s: dict[str, np.ndarray]
    """Seconds by category on the critical stage (:class:`StepTime`'s fields)."""
    bubble_fraction: np.ndarray
    """The pipeline's bubble over the step."""
    peak_bytes: np.ndarray
    """The most loaded stage's memory, ``[part, row]`` (parts as
    :class:`~planner.cost.MemoryParts`)."""
    host_bytes: np.ndarray
    """Host memory per node the offloaded states take."""
    recompute_flops: np.ndarray
    """FLOPs the recomputation reruns per sequence."""


def compose(b: Rows, stages: list[UniformStage], stage_of: np.ndarray, t: LayerTable) -> Steps:
    """The steps of ``b``'s configurations, on ``stages[stage_of]`` with the layers of ``t``."""
    model, training, c, x = b.model, b.training, b.c, b.x
    # The layer splits and the runs of equal stages in them (with only some layers
    # recomputed, the chunks too: they say which).
    partial = c["recompute_layers"].astype(np.int64)
    v_shape = c["schedule"] == "zb-v"  # the head on the first stage
    s_first, split_of = factorize(c["pp"], x.first_layers, x.last_layers, partial,
                                  np.where(partial > 0, c["vpp"], 0), v_shape)  # fmt: skip
    chunks = [None if partial[r] == 0 else
              stage_chunks(model, training, x.stage_layers_of(r), vpp=int(c["vpp"][r]),
                           recompute_layers=int(partial[r])) for r in s_first]  # fmt: skip
    splits = [stage_runs(model, training, x.stage_layers_of(r), chunks[s],
                         head_first=bool(v_shape[r])) for s, r in enumerate(s_first)]  # fmt: skip
    # Per stage run: data-parallel traffic, state bytes; per configuration the optimizer.
    offloads, offload_of = codes(c["offload"])
    moments = c["optimizer_moments"] == "bf16"
    z_first, static_of = factorize(stage_of, split_of, c["zero"], offload_of, moments)
    static = [static_costs(model, b.cluster, training, stages[stage_of[r]],
                           t.weights[int(t.layer_of[r])], splits[split_of[r]],
                           zero=int(c["zero"][r]), v_shape=bool(v_shape[r]),
                           offload=offloads[offload_of[r]],
                           moments="bf16" if moments[r] else "fp32")
              for r in z_first]  # fmt: skip
    sends_first, sends_of = factorize(stage_of, c["mbs"], c["vpp"])
    sends = np.array([pipeline_sends_s(model, b.cluster, training, stages[stage_of[r]],
                                       mbs=int(c["mbs"][r]), vpp=int(c["vpp"][r]))
                      for r in sends_first])  # fmt: skip
    deepep = b.deepep
    comm_first, comm_of = factorize(stage_of, deepep)
    comms = np.array([communicator_bytes(model, b.cluster, training, stages[stage_of[r]],
                                         deepep=bool(deepep[r])) for r in comm_first])
    ends = np.broadcast_to(embedding_group_bytes(model, c["pp"], v_shape=v_shape),
                           v_shape.shape)  # fmt: skip
    steps = _steps(b, splits, split_of, t, static, static_of, sends[sends_of], comms[comm_of],
                   ends)  # fmt: skip
    index = layer_index(model, training, 1)
    counts = [{} if chunk is None else recomputed_counts(chunk) for chunk in chunks]
    flops = recompute_flops(
        {k: table[t.layer_of, b.recompute, LAYER_FIELDS.index("recompute_flops")]
         for k, table in t.by_kind.items()},
        index, {k: np.array([n.get(k, len(layers)) for n in counts])[split_of]
                for k, layers in index.layers_by_kind.items()})  # fmt: skip
    data_ways = np.array([s.layout.data_ways for s in stages])[stage_of]
    host = b.cluster.devices_per_node * np.where(
        x.num_microbatches > 1, np.array([s.accumulating_host_bytes for s in static])[static_of],
        np.array([s.host_bytes for s in static])[static_of])  # fmt: skip
    return Steps(**steps, host_bytes=host, recompute_flops=flops / (c["mbs"] * data_ways))


def _steps(
    b: Rows, splits: list, split_of: np.ndarray, t: LayerTable, static: list,
    static_of: np.ndarray, sends: np.ndarray, communicator_bytes: np.ndarray,
    end_communicator_bytes: np.ndarray,
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:  # fmt: skip
    """The step, its parts, bubble and peak memory of each row, over the groups of rows that
    share a layer split and a schedule (:func:`~planner.cost.step.step_totals` on arrays)."""
    c, x, n = b.c, b.x, len(b.rows)
    out = {"step_s": np.full(n, np.nan), "bubble_fraction": np.zeros(n),
           "peak_bytes": np.zeros((len(MemoryParts._fields), n)),
           "parts_s": {name: np.zeros(n) for name in StepTime.model_fields}}  # fmt: skip
    recompute = b.recompute
    g_first, group_of = factorize(split_of, c["vpp"] > 1, codes(c["schedule"])[1])
    for g, r0 in enumerate(g_first):
        rows = np.flatnonzero(group_of == g)
        schedule = schedule_name(c["schedule"][r0], int(c["vpp"][r0]))
        runs = run_costs(splits[split_of[r0]], t.by_kind, static, static_of[rows],
                         t.layer_of[rows], recompute[rows], sends[rows],
                         x.num_microbatches[rows])  # fmt: skip
        knobs = PipelineKnobs(
            num_microbatches=x.num_microbatches[rows],
            vpp=c["vpp"][rows] if schedule in ("interleaved", "zb-v")  # type: ignore[arg-type]
            else 1,
            states_precision=cost.states_precision(b.training.precision, b.training.stack),
            stack=b.training.stack,
            overlap_grad_reduce=b.switch("overlap_grad_reduce")[rows],  # type: ignore[arg-type]
            overlap_param_gather=b.switch("overlap_param_gather")[rows],  # type: ignore[arg-type]
            overlap_moe_comm=b.switch("overlap_moe_expert_parallel_comm")[rows],
            deepep=b.deepep[rows],
            communicator_bytes=communicator_bytes[rows],
            end_communicator_bytes=end_communicator_bytes[rows],
        )  # fmt: skip
        optimizer = np.array([s.optimizer_s for s in static])[static_of[rows]]
        totals = step_totals(b.cluster, knobs, runs, schedule=schedule,
                             num_stages=int(c["pp"][r0]), optimizer_s=optimizer)  # fmt: skip
        out["step_s"][rows] = totals.step_s  # type: ignore[index]
        out["bubble_fraction"][rows] = totals.bubble_fraction  # type: ignore[index]
        for name, value in totals.parts_s.items():
            out["parts_s"][name][rows] = value  # type: ignore[index]
        for k in range(len(MemoryParts._fields)):
            out["peak_bytes"][k, rows] = totals.peak_memory_bytes[k]  # type: ignore[call-overload]
    return out
