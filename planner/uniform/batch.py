"""Price many uniform configurations at once: :func:`estimate_batch`.

The same cost model as :func:`~planner.uniform.estimate.estimate`, not a copy of it. A
configuration's price splits into parts that depend on few of its knobs, so each part is priced
once per distinct value of those knobs, by the functions ``estimate`` calls, and the rest is
arithmetic over arrays, by the formulas ``estimate`` runs on floats:

- the divisibility rules (:data:`planner.plan.divisibility.RULES`), on arrays;
- a stage's mesh and groups (:func:`~planner.uniform.estimate.placed_stage`), once per
  degrees and rank order;
- a layer's parts (:func:`~planner.sharding.uniform.uniform_parts`), once per mesh,
  microbatch and kernel switches, under each recomputation mode;
- a stage's data-parallel traffic, state bytes and optimizer step
  (:func:`~planner.cost.step.stage_sync` and its neighbours), once per mesh, layer split and
  ZeRO stage; the pipeline sends once per mesh, microbatch and virtual stages;
- the step (:func:`~planner.cost.step.step_totals`) and its rates
  (:func:`~planner.cost.step.throughput`), over arrays of the configurations that share a
  layer split and a schedule.

Columns are named as ``planner estimate --json``'s keys, nested ones joined by dots
(``time.compute_s``, ``memory.weights_gib``, ``error_band.fraction``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np

from planner import cost
from planner.cost.layer import layer_cost
from planner.cost.rates import throughput
from planner.cost.step import (
    PipelineKnobs,
    step_totals,
)
from planner.cost.uncertainty import error_band, parallelism_kind
from planner.errors import ConfigError
from planner.graph import forward_flops
from planner.graph.ops import TRANSFORMER_KINDS
from planner.placement.ranks import megatron_order
from planner.plan.config import ParallelConfig
from planner.plan.divisibility import RULES, Degrees, Derived, Shape, derive, first_broken
from planner.plan.schema import MemoryBreakdown, StepTime
from planner.sharding.uniform import UniformQuery, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import fill_training
from planner.uniform.columns import (
    codes,
    config_from_row,
    factorize,
    normalized,
    optional_int,
    python_value,
)
from planner.uniform.estimate import estimate
from planner.uniform.recompute_layers import recomputed_counts, stage_chunks
from planner.uniform.stage_runs import LAYER_FIELDS, run_costs, stage_runs, static_costs
from planner.uniform.stages import (
    UniformStage,
    host_fits,
    layer_index,
    pipeline_sends_s,
    placed_stage,
    recompute_flops,
)
from planner.vocabulary import GIB, RECOMPUTE_MODES, schedule_name

_MEMORY = tuple(f"memory.{name}" for name in MemoryBreakdown.model_fields)
_TIME = tuple(f"time.{name}" for name in StepTime.model_fields)
_FLOATS = ("step_time_s", *_TIME, "tokens_per_s", "model_tflops_per_gpu",
           "hardware_tflops_per_gpu", "mfu", "peak_memory_gib", "bubble_fraction",
           "error_band.fraction", *_MEMORY, "host_memory_gib")  # fmt: skip
_INTS = ("error_band.runs", "num_microbatches", "dp", "num_devices")
_TEXTS = ("error_band.parallelism", "error_band.closest")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchEstimate:
    """Many configurations priced: one array per ``planner estimate --json`` key, an element
    per configuration (NaN, 0, False or None where it does not divide)."""

    columns: dict[str, np.ndarray]
    """The priced numbers by key, with ``divides`` and ``fits`` (bool)."""
    refused_by: np.ndarray
    """Per configuration, the index in :data:`planner.plan.divisibility.RULES` of the first
    rule it breaks (``len(RULES)``: a rank order Megatron cannot spell, or an operator the
    mesh does not split evenly); -1 where it divides."""
    configs: dict[str, np.ndarray]
    """The configurations as priced, a column per :class:`ParallelConfig` field (0 for a
    field left to its default of None)."""
    model: ModelSpec
    """The model priced."""
    cluster: ClusterSpec
    """The cluster priced on."""

    def __len__(self) -> int:
        return len(self.refused_by)

    def config(self, i: int) -> ParallelConfig:
        """Configuration ``i`` as a :class:`ParallelConfig`."""
        return config_from_row({k: v[i] for k, v in self.configs.items()})

    def refusal(self, i: int) -> str | None:
        """Why configuration ``i`` does not divide, in :func:`planner.estimate`'s words; None
        when it divides."""
        if self.refused_by[i] < 0:
            return None
        try:
            estimate(self.model, self.cluster, self.config(i))
        except ConfigError as exc:
            return str(exc)
        raise AssertionError(f"configuration {i} was refused but prices")


def estimate_batch(
    model: ModelSpec, cluster: ClusterSpec,
    configs: Mapping[str, Any] | Sequence[ParallelConfig], *,
    memory_margin_gib: float | None = None,
) -> BatchEstimate:  # fmt: skip
    """Price every configuration of ``configs`` (columns named as :class:`ParallelConfig`'s
    fields, each an array or one value for all, missing ones at their defaults; or a list of
    configurations) for training ``model`` on ``cluster``, as
    :func:`~planner.uniform.estimate.estimate` prices each (its numbers to rounding), with
    ``fits`` as it decides it with ``memory_margin_gib``.

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt3-175b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=128)
    >>> b = estimate_batch(model, cluster, {"tp": [8, 8, 3], "pp": [16, 8, 8]})
    >>> b.columns["divides"].tolist(), b.columns["dp"].tolist()
    ([True, True, False], [8, 16, 0])
    >>> b.refusal(2)
    'tp(3) x pp(8) x cp(1) = 24 does not divide the 1024 devices'
    """
    cols = normalized(configs)
    n = len(cols["tp"])
    out: dict[str, np.ndarray] = {k: np.full(n, np.nan) for k in _FLOATS}
    out.update({k: np.zeros(n, dtype=np.int64) for k in _INTS})
    out.update({k: np.empty(n, dtype=object) for k in _TEXTS})  # None until priced
    out["fits"] = np.zeros(n, dtype=bool)
    refused = np.full(n, -1, dtype=np.int16)
    runs = (cols["global_batch"].astype(np.int64), cols["seq_len"].astype(np.int64),
            codes(cols["precision"])[1])  # fmt: skip
    first, inverse = factorize(*runs)
    for t, row in enumerate(first):
        rows = np.flatnonzero(inverse == t)
        training = fill_training(
            model, seq_length=optional_int(cols["seq_len"][row]),
            global_batch_size=optional_int(cols["global_batch"][row]),
            precision=python_value(cols["precision"][row]),
        )  # fmt: skip
        group = cols if len(first) == 1 else {k: v[rows] for k, v in cols.items()}
        _price(model, cluster, training, group, rows, out, refused, memory_margin_gib)
    out["divides"] = refused < 0
    return BatchEstimate(columns=out, refused_by=refused, configs=cols, model=model,
                         cluster=cluster)  # fmt: skip


_KindCosts = tuple[np.ndarray, tuple[tuple[tuple[int, ...], float], ...]]


@lru_cache(maxsize=1 << 16)
def _kind_costs(model: ModelSpec, cluster_json: str, query: UniformQuery) -> _KindCosts:
    """A layer kind's :class:`LayerCost` fields under each recomputation mode (one row per
    mode), and its parameters by the mesh axes holding copies, on the cluster of
    ``cluster_json``; remembered per input (a few hundred bytes each)."""
    parts = uniform_parts(model, ClusterSpec.model_validate_json(cluster_json), query)
    transformer = query.kind in TRANSFORMER_KINDS
    rows = np.array([[getattr(layer_cost(parts, mode if transformer else "none"), f)
                      for f in LAYER_FIELDS] for mode in RECOMPUTE_MODES])  # fmt: skip
    return rows, parts.weight_groups()


_LayerTable = tuple[np.ndarray, dict[str, np.ndarray],
                    dict[int, dict[str, tuple[tuple[tuple[int, ...], float], ...]]], np.ndarray]


def _layer_table(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, c: dict[str, np.ndarray],
    placed: list[UniformStage], p_of: np.ndarray, sp: np.ndarray, ulysses: np.ndarray,
    flags: dict[str, np.ndarray],
) -> _LayerTable:  # fmt: skip
    """Each distinct layer's costs, once per mesh, microbatch and kernel switch, under every
    recomputation mode: (each row's layer, the costs by kind as
    ``[layer, mode, field]``, the parameters by layer and kind, which layers' meshes do not
    split an operator evenly)."""
    kinds = tuple(layer_index(model, training, 1).layers_by_kind)
    cluster_json = cluster.model_dump_json()
    # (The mesh's strides, not the degrees: the same layer sits on many pipelines.)
    strides = np.array([[s.mesh.stride(a) for a in range(3)] for s in placed])[p_of]
    l_first, l_of = factorize(c["tp"], c["cp"], c["ep"], sp, ulysses, *strides.T,
                               c["mbs"], flags["flash_attention"],
                               flags["tp_comm_overlap"])  # fmt: skip
    by_kind = {k: np.zeros((len(l_first), len(RECOMPUTE_MODES), len(LAYER_FIELDS)))
               for k in kinds}  # fmt: skip
    params_of: dict[int, dict[str, tuple[tuple[tuple[int, ...], float], ...]]] = {}  # by layer
    unsplit = np.zeros(len(l_first), dtype=bool)
    for u, r in enumerate(l_first):
        stage = placed[p_of[r]]
        for kind in kinds:
            query = UniformQuery(kind=kind, layout=stage.layout, micro_batch_size=int(c["mbs"][r]),
                                 seq_length=training.seq_length, precision=training.precision,
                                 flash_attention=bool(flags["flash_attention"][r]),
                                 tp_comm_overlap=bool(flags["tp_comm_overlap"][r]),
                                 strides=stage.mesh.strides)  # type: ignore[arg-type]  # fmt: skip
            try:
                costs, weights = _kind_costs(model, cluster_json, query)
            except ConfigError:  # an operator the mesh does not split evenly
                unsplit[u] = True
                break
            params_of.setdefault(u, {})[kind] = weights
            by_kind[kind][u] = costs
    return l_of, by_kind, params_of, unsplit


def _price(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cols: dict[str, np.ndarray],
    rows: np.ndarray, out: dict[str, np.ndarray], refused: np.ndarray,
    memory_margin_gib: float | None,
) -> None:  # fmt: skip
    """Price the configurations ``rows`` (of one sequence length, batch and precision) into
    ``out``, and record which rule each that does not divide breaks in ``refused``."""
    if len(rows) == 0:
        return
    shape = Shape(num_devices=cluster.num_devices, num_layers=model.num_layers,
                  global_batch=training.global_batch_size)  # fmt: skip
    gpipe = cols["schedule"] == "gpipe"
    ulysses = cols["cp_algo"] == "ulysses"
    d = Degrees(tp=cols["tp"], pp=cols["pp"], cp=cols["cp"], dp=cols["dp"], ep=cols["ep"],
                vpp=cols["vpp"], first=cols["first_stage_layers"],
                last=cols["last_stage_layers"], mbs=cols["mbs"], ulysses=ulysses,
                sp=cols["sp"].astype(bool), tp_comm_overlap=cols["tp_comm_overlap"].astype(bool),
                gpipe=gpipe, zb_h1=cols["schedule"] == "zb-h1",
                zb_v=cols["schedule"] == "zb-v")  # fmt: skip
    derived = derive(shape, d)
    code = first_broken(model, training.seq_length, shape, d, derived)
    orders, order = codes(cols["rank_order"])
    for i, spelling in enumerate(orders):
        try:
            megatron_order(spelling, tp=1, cp=1, dp=1, pp=1)
        except ConfigError:
            code[(order == i) & (code < 0)] = len(RULES)
    refused[rows] = code
    ok = code < 0
    if not ok.any():
        return
    rows = rows[ok]
    c = {k: np.asarray(v)[ok] for k, v in cols.items()}
    x = Derived(**{f.name: np.asarray(getattr(derived, f.name))[ok] for f in fields(Derived)})
    dp = x.dp.astype(np.int64)
    sp = c["sp"].astype(bool) & (c["tp"] > 1)
    order = order[ok]
    modes, mode_of = codes(c["recompute"])
    recompute = np.array([RECOMPUTE_MODES.index(mode) for mode in modes])[mode_of]
    flags = {k: c[k].astype(bool) for k in ("flash_attention", "tp_comm_overlap",
                                             "overlap_grad_reduce", "overlap_param_gather")}
    # The stages' meshes: once per degrees and rank order.
    p_first, p_of = factorize(c["tp"], c["cp"], c["ep"], sp, ulysses[ok], dp, c["pp"], order)
    placed = [placed_stage(tp=int(c["tp"][r]), cp=int(c["cp"][r]), ep=int(c["ep"][r]),
                           sp=bool(sp[r]), ulysses=bool(ulysses[ok][r]), dp=int(dp[r]),
                           pp=int(c["pp"][r]), rank_order=orders[order[r]])
              for r in p_first]  # fmt: skip
    table = _layer_table(model, cluster, training, c, placed, p_of, sp, ulysses[ok], flags)
    l_of, by_kind, params_of, unsplit = table
    if unsplit.any():  # refused as estimate refuses them; price the rest
        bad = unsplit[l_of]
        refused[rows[bad]] = len(RULES)
        keep = np.flatnonzero(ok)[~bad]
        _price(model, cluster, training, {k: np.asarray(v)[keep] for k, v in cols.items()},
               rows[~bad], out, refused, memory_margin_gib)  # fmt: skip
        return
    # The layer splits and the runs of equal stages in them.
    # (With only some layers recomputed, the chunks too: they say which.)
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
    z_first, static_of = factorize(p_of, split_of, c["zero"], offload_of)
    static = [static_costs(model, cluster, training, placed[p_of[r]], params_of[int(l_of[r])],
                           splits[split_of[r]], zero=int(c["zero"][r]), tp=int(c["tp"][r]),
                           pp=int(c["pp"][r]), v_shape=bool(v_shape[r]),
                           offload=offloads[offload_of[r]])
              for r in z_first]  # fmt: skip
    sends_first, sends_of = factorize(p_of, c["mbs"], c["vpp"])
    sends = np.array([pipeline_sends_s(model, cluster, placed[p_of[r]], mbs=int(c["mbs"][r]),
                                       training=training, cp=int(c["cp"][r]),
                                       tp=int(c["tp"][r]), sp=bool(sp[r]), vpp=int(c["vpp"][r]),
                                       pp=int(c["pp"][r])) for r in sends_first])  # fmt: skip
    index = layer_index(model, training, 1)
    counts = [{} if chunk is None else recomputed_counts(chunk) for chunk in chunks]
    flops = recompute_flops(
        {k: by_kind[k][l_of, recompute, LAYER_FIELDS.index("recompute_flops")] for k in by_kind},
        index, {k: np.array([n.get(k, len(layers)) for n in counts])[split_of]
                for k, layers in index.layers_by_kind.items()})  # fmt: skip
    data_ways = np.array([s.layout.data_ways for s in placed])[p_of]
    step = np.full(len(rows), np.nan)
    peak = np.zeros((5, len(rows)))
    parts_s = {name: np.zeros(len(rows)) for name in StepTime.model_fields}
    bubble = np.zeros(len(rows))
    interleaved = c["vpp"] > 1
    zb_h1, zb_v = cols["schedule"][ok] == "zb-h1", cols["schedule"][ok] == "zb-v"
    g_first, group_of = factorize(split_of, interleaved, gpipe[ok], zb_h1, zb_v)
    for g, r0 in enumerate(g_first):
        g_rows = np.flatnonzero(group_of == g)
        schedule = schedule_name(c["schedule"][r0], int(c["vpp"][r0]))
        runs = run_costs(splits[split_of[r0]], by_kind, static, static_of[g_rows],
                         l_of[g_rows], recompute[g_rows], sends[sends_of[g_rows]],
                         x.num_microbatches[g_rows])  # fmt: skip
        knobs = PipelineKnobs(
            num_microbatches=x.num_microbatches[g_rows],
            vpp=c["vpp"][g_rows] if schedule in ("interleaved", "zb-v")  # type: ignore[arg-type]
            else 1,
            precision=training.precision,
            overlap_grad_reduce=flags["overlap_grad_reduce"][g_rows],  # type: ignore[arg-type]
            overlap_param_gather=flags["overlap_param_gather"][g_rows],  # type: ignore[arg-type]
        )  # fmt: skip
        optimizer = np.array([s.optimizer_s for s in static])[static_of[g_rows]]
        totals = step_totals(cluster, knobs, runs, schedule=schedule,
                             num_stages=int(c["pp"][r0]), optimizer_s=optimizer)  # fmt: skip
        step[g_rows] = totals.step_s
        bubble[g_rows] = totals.bubble_fraction
        for name, value in totals.parts_s.items():
            parts_s[name][g_rows] = value
        for k in range(5):
            peak[k, g_rows] = totals.peak_memory_bytes[k]
    host = cluster.devices_per_node * np.where(
        x.num_microbatches > 1, np.array([s.accumulating_host_bytes for s in static])[static_of],
        np.array([s.host_bytes for s in static])[static_of])
    _write(model, cluster, training, c, rows, out, step=step, parts_s=parts_s, bubble=bubble,
           host=host,
           peak=peak, recompute_flops=flops / (c["mbs"] * data_ways), dp=dp,
           num_microbatches=x.num_microbatches, memory_margin_gib=memory_margin_gib)  # fmt: skip


def _write(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, c: dict[str, np.ndarray],
    rows: np.ndarray, out: dict[str, np.ndarray], *, step: np.ndarray,
    parts_s: dict[str, np.ndarray], bubble: np.ndarray, peak: np.ndarray, host: np.ndarray,
    recompute_flops: np.ndarray, dp: np.ndarray, num_microbatches: np.ndarray,
    memory_margin_gib: float | None,
) -> None:  # fmt: skip
    """The rates, the memory, the error band and the counts of the priced rows."""
    mbs = c["mbs"].astype(np.int64)
    flash = c["flash_attention"].astype(bool)
    f_first, f_of = factorize(mbs, flash)
    forward = np.array([forward_flops(model, training, int(mbs[r])) / mbs[r] for r in f_first])
    executed = np.array([cost.executed_training_flops(model, training, int(mbs[r]),
                                                      flash_attention=bool(flash[r])) / mbs[r]
                         for r in f_first])  # fmt: skip
    rates = throughput(step, training, cluster, forward_flops_per_sequence=forward[f_of],
                       executed_flops_per_sequence=executed[f_of],
                       recompute_flops_per_sequence=recompute_flops)  # fmt: skip
    total = sum(peak[k] for k in range(5))
    out["step_time_s"][rows] = step
    for name, value in parts_s.items():
        out[f"time.{name}"][rows] = value
    for name in ("tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu"):
        out[name][rows] = getattr(rates, name)
    out["peak_memory_gib"][rows] = total / GIB
    out["bubble_fraction"][rows] = bubble
    for k, name in enumerate(_MEMORY):
        out[name][rows] = peak[k] / GIB
    out["fits"][rows] = cost.fits(total, cluster.device, memory_margin_gib) & host_fits(cluster,
                                                                                         host)
    out["host_memory_gib"][rows] = host / GIB
    out["num_microbatches"][rows] = num_microbatches
    out["dp"][rows] = dp
    out["num_devices"][rows] = cluster.num_devices
    k_first, k_of = factorize(c["tp"] > 1, c["pp"] > 1, c["cp"] > 1, c["ep"] > 1,
                               c["zero"] == 3)  # fmt: skip
    bands = [error_band(cluster.device, parallelism_kind(
        tensor_parallel=int(c["tp"][r]), pipeline_parallel=int(c["pp"][r]),
        context_parallel=int(c["cp"][r]), expert_parallel=int(c["ep"][r]),
        zero=int(c["zero"][r]))) for r in k_first]  # fmt: skip
    out["error_band.fraction"][rows] = np.array(
        [np.nan if b.fraction is None else b.fraction for b in bands])[k_of]
    out["error_band.runs"][rows] = np.array([b.runs for b in bands])[k_of]
    out["error_band.parallelism"][rows] = np.array([b.parallelism for b in bands],
                                                   dtype=object)[k_of]  # fmt: skip
    out["error_band.closest"][rows] = np.array([b.closest for b in bands], dtype=object)[k_of]
