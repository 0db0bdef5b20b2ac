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
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.step import (
    PipelineKnobs,
    StageCost,
    StageRun,
    optimizer_params,
    stage_state_bytes,
    stage_sync,
    step_totals,
    throughput,
    tied_sync_s,
    with_tied_copy,
)
from planner.cost.uncertainty import error_band, parallelism_kind
from planner.errors import ConfigError, InputError
from planner.graph import forward_flops
from planner.placement.ranks import megatron_order
from planner.plan.config import ParallelConfig
from planner.plan.divisibility import RULES, Degrees, Derived, Shape, derive, first_broken
from planner.plan.schema import MemoryBreakdown, StepTime
from planner.sharding.uniform import UniformQuery, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import fill_training
from planner.uniform.estimate import (
    estimate,
    layer_index,
    pipeline_sends_s,
    placed_stage,
    stage_kinds,
    stage_weights,
    tied_copy,
)
from planner.vocabulary import GIB, RECOMPUTE_MODES, ScheduleName

_DEFAULTS = {name: f.default for name, f in ParallelConfig.model_fields.items()}
_OPTIONAL = ("dp", "first_stage_layers", "last_stage_layers", "global_batch", "seq_len")
"""Integer fields whose None (the default) a column writes as 0."""
_LAYER_FIELDS = tuple(f.name for f in fields(LayerCost))
_MEMORY = tuple(f"memory.{name}" for name in MemoryBreakdown.model_fields)
_TIME = tuple(f"time.{name}" for name in StepTime.model_fields)
_FLOATS = ("step_time_s", *_TIME, "tokens_per_s", "model_tflops_per_gpu",
           "hardware_tflops_per_gpu", "mfu", "peak_memory_gib", "bubble_fraction",
           "error_band.fraction", *_MEMORY)  # fmt: skip
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


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def config_from_row(row: Mapping[str, Any]) -> ParallelConfig:
    """One row of configuration columns (0 for None) as a :class:`ParallelConfig`."""
    values = {k: _python(v) for k, v in row.items()}
    return ParallelConfig(**{k: (None if k in _OPTIONAL and v == 0 else v)
                             for k, v in values.items()})  # fmt: skip


def config_columns(configs: Sequence[ParallelConfig]) -> dict[str, np.ndarray]:
    """The columns of ``configs``, a numpy array per :class:`ParallelConfig` field (0 for a
    field left to its default of None)."""
    rows = [c.model_dump() for c in configs]
    return {name: np.array([(0 if r[name] is None and name in _OPTIONAL else r[name])
                            for r in rows]) for name in _DEFAULTS}  # fmt: skip


def _normalized(configs: Mapping[str, Any] | Sequence[ParallelConfig]) -> dict[str, np.ndarray]:
    """Every field as a column: given columns broadcast to one length, the rest defaults."""
    if not isinstance(configs, Mapping):
        return config_columns(list(configs))
    unknown = sorted(set(configs) - set(_DEFAULTS))
    if unknown:
        raise InputError(f"estimate_batch: no configuration field {unknown[0]!r}; fields: "
                         f"{', '.join(_DEFAULTS)}")  # fmt: skip
    given = {k: np.asarray(v) for k, v in configs.items()}
    length = max((v.size for v in given.values()), default=0)
    columns = {}
    for name, default in _DEFAULTS.items():
        if name in given:
            columns[name] = np.broadcast_to(given[name], (length,))
        else:  # one value for every row, as a view
            value = 0 if default is None and name in _OPTIONAL else default
            columns[name] = np.broadcast_to(np.array(value, dtype=object if value is None
                                                     else None), (length,))  # fmt: skip
    return columns


def _factorize(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct key, each row's key number) of the rows' tuples of
    non-negative integers, numbered in the order of the tuples."""
    n = len(keys[0])
    code = np.zeros(n, dtype=np.int64)
    distinct = 1
    for k in keys:
        k = np.asarray(k, dtype=np.int64)
        top = int(k.max()) + 1 if n else 1
        code, distinct = _compact(code * top + k, distinct * top)
    first = np.empty(distinct, dtype=np.int64)
    first[code[::-1]] = np.arange(n - 1, -1, -1)
    return first, code


def _compact(code: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """``code`` renumbered 0, 1, ... in order of value, and how many distinct values: by a
    table when the values span little (the usual case: a few knobs' few values), else by a
    sort."""
    if span <= max(4 * len(code), 1 << 16):
        seen = np.zeros(span, dtype=bool)
        seen[code] = True
        number = np.cumsum(seen) - 1
        return number[code], int(seen.sum())
    values, inverse = np.unique(code, return_inverse=True)
    return inverse.ravel(), len(values)


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
    cols = _normalized(configs)
    n = len(cols["tp"])
    out: dict[str, np.ndarray] = {k: np.full(n, np.nan) for k in _FLOATS}
    out.update({k: np.zeros(n, dtype=np.int64) for k in _INTS})
    out.update({k: np.empty(n, dtype=object) for k in _TEXTS})  # None until priced
    out["fits"] = np.zeros(n, dtype=bool)
    refused = np.full(n, -1, dtype=np.int16)
    runs = (cols["global_batch"].astype(np.int64), cols["seq_len"].astype(np.int64),
            _codes(cols["precision"])[1])  # fmt: skip
    first, inverse = _factorize(*runs)
    for t, row in enumerate(first):
        rows = np.flatnonzero(inverse == t)
        training = fill_training(
            model, seq_length=_optional(cols["seq_len"][row]),
            global_batch_size=_optional(cols["global_batch"][row]),
            precision=_python(cols["precision"][row]),
        )  # fmt: skip
        group = cols if len(first) == 1 else {k: v[rows] for k, v in cols.items()}
        _price(model, cluster, training, group, rows, out, refused, memory_margin_gib)
    out["divides"] = refused < 0
    return BatchEstimate(columns=out, refused_by=refused, configs=cols, model=model,
                         cluster=cluster)  # fmt: skip


def _optional(value: Any) -> int | None:
    value = _python(value)
    return None if value is None or value == 0 else int(value)


def _codes(column: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """(distinct values, each row's value number) of a column of any values (a knob's few
    values: one comparison over the column per value)."""
    codes = np.full(len(column), -1, dtype=np.int64)
    values: list[Any] = []
    left = np.flatnonzero(codes < 0)
    while len(left):
        value = column[left[0]]
        codes[column == value] = len(values)
        values.append(_python(value))
        left = np.flatnonzero(codes < 0)
    return values, codes


_KindCosts = tuple[np.ndarray, tuple[tuple[tuple[int, ...], float], ...]]


def _kind_costs(model: ModelSpec, cluster: ClusterSpec, query: UniformQuery) -> _KindCosts:
    """A layer kind's :class:`LayerCost` fields under each recomputation mode (one row per
    mode), and its parameters by the mesh axes holding copies; remembered per input."""
    return _kind_costs_of(model, cluster.model_dump_json(), query)


@lru_cache(maxsize=4096)
def _kind_costs_of(model: ModelSpec, cluster_json: str, query: UniformQuery) -> _KindCosts:
    parts = uniform_parts(model, ClusterSpec.model_validate_json(cluster_json), query)
    transformer = query.kind in ("dense", "moe")
    rows = np.array([[getattr(layer_cost(parts, mode if transformer else "none"), f)
                      for f in _LAYER_FIELDS] for mode in RECOMPUTE_MODES])  # fmt: skip
    return rows, parts.weight_groups()


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
                gpipe=gpipe)  # fmt: skip
    derived = derive(shape, d)
    code = first_broken(model, training.seq_length, shape, d, derived)
    orders, order = _codes(cols["rank_order"])
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
    modes, mode_of = _codes(c["recompute"])
    recompute = np.array([RECOMPUTE_MODES.index(mode) for mode in modes])[mode_of]
    flags = {k: c[k].astype(bool) for k in ("flash_attention", "tp_comm_overlap",
                                             "overlap_grad_reduce", "overlap_param_gather")}
    # The stages' meshes: once per degrees and rank order.
    p_first, p_of = _factorize(c["tp"], c["cp"], c["ep"], sp, ulysses[ok], dp, c["pp"], order)
    placed = [placed_stage(tp=int(c["tp"][r]), cp=int(c["cp"][r]), ep=int(c["ep"][r]),
                           sp=bool(sp[r]), ulysses=bool(ulysses[ok][r]), dp=int(dp[r]),
                           pp=int(c["pp"][r]), rank_order=orders[order[r]])
              for r in p_first]  # fmt: skip
    kinds = tuple(layer_index(model, training, 1).layers_by_kind)
    # A layer's parts: once per mesh, microbatch and kernel switches, under every mode.
    # (The mesh's strides, not the degrees: the same layer sits on many pipelines.)
    strides = np.array([[s.mesh.stride(a) for a in range(3)] for s in placed])[p_of]
    l_first, l_of = _factorize(c["tp"], c["cp"], c["ep"], sp, ulysses[ok], *strides.T,
                               c["mbs"], flags["flash_attention"],
                               flags["tp_comm_overlap"])  # fmt: skip
    by_kind = {k: np.zeros((len(l_first), len(RECOMPUTE_MODES), len(_LAYER_FIELDS)))
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
                costs, weights = _kind_costs(model, cluster, query)
            except ConfigError:  # an operator the mesh does not split evenly
                unsplit[u] = True
                break
            params_of.setdefault(u, {})[kind] = weights
            by_kind[kind][u] = costs
    if unsplit.any():  # refused as estimate refuses them; price the rest
        bad = unsplit[l_of]
        refused[rows[bad]] = len(RULES)
        keep = np.flatnonzero(ok)[~bad]
        _price(model, cluster, training, {k: np.asarray(v)[keep] for k, v in cols.items()},
               rows[~bad], out, refused, memory_margin_gib)  # fmt: skip
        return
    # The layer splits and the runs of equal stages in them.
    s_first, split_of = _factorize(c["pp"], x.first_layers, x.last_layers)
    splits = [_stage_runs(model, training, _layers_of(x, r)) for r in s_first]
    # Per stage run: data-parallel traffic, state bytes; per configuration the optimizer.
    z_first, static_of = _factorize(p_of, split_of, c["zero"])
    static = [_static(model, cluster, training, placed[p_of[r]], params_of[int(l_of[r])],
                      splits[split_of[r]], zero=int(c["zero"][r]), tp=int(c["tp"][r]),
                      pp=int(c["pp"][r])) for r in z_first]  # fmt: skip
    sends_first, sends_of = _factorize(p_of, c["mbs"], c["vpp"])
    sends = np.array([pipeline_sends_s(model, cluster, placed[p_of[r]], mbs=int(c["mbs"][r]),
                                       training=training, cp=int(c["cp"][r]),
                                       tp=int(c["tp"][r]), sp=bool(sp[r]), vpp=int(c["vpp"][r]),
                                       pp=int(c["pp"][r])) for r in sends_first])  # fmt: skip
    recompute_flops = sum(
        by_kind[k][l_of, recompute, _LAYER_FIELDS.index("recompute_flops")] * len(layers)
        for k, layers in layer_index(model, training, 1).layers_by_kind.items()
    )
    data_ways = np.array([s.layout.data_ways for s in placed])[p_of]
    step = np.full(len(rows), np.nan)
    peak = np.zeros((5, len(rows)))
    parts_s = {name: np.zeros(len(rows)) for name in StepTime.model_fields}
    bubble = np.zeros(len(rows))
    interleaved = c["vpp"] > 1
    g_first, group_of = _factorize(split_of, interleaved, gpipe[ok])
    for g, r0 in enumerate(g_first):
        g_rows = np.flatnonzero(group_of == g)
        schedule: ScheduleName = ("gpipe" if gpipe[ok][r0] else
                                  "interleaved" if interleaved[r0] else "1f1b")  # fmt: skip
        runs = _runs(splits[split_of[r0]], by_kind, static, static_of[g_rows],
                     l_of[g_rows], recompute[g_rows], sends[sends_of[g_rows]])  # fmt: skip
        knobs = PipelineKnobs(
            num_microbatches=x.num_microbatches[g_rows],
            vpp=c["vpp"][g_rows] if schedule == "interleaved" else 1,  # type: ignore[arg-type]
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
    _write(model, cluster, training, c, rows, out, step=step, parts_s=parts_s, bubble=bubble,
           peak=peak, recompute_flops=recompute_flops / (c["mbs"] * data_ways), dp=dp,
           num_microbatches=x.num_microbatches, memory_margin_gib=memory_margin_gib)  # fmt: skip


Split = tuple[tuple[int, int, tuple[tuple[str, int], ...]], ...]
"""A layer split's runs of equal stages: (first stage, stages, layer kinds and counts)."""


def _layers_of(x: Any, r: int) -> tuple[int, ...]:
    pp = int(x.pp[r])
    if pp == 1:
        return (int(x.first_layers[r]),)
    return (int(x.first_layers[r]), *[int(x.middle_layers[r])] * (pp - 2), int(x.last_layers[r]))


def _stage_runs(model: ModelSpec, training: TrainingSpec, layers: tuple[int, ...]) -> Split:
    """The runs of equal stages of a layer split, the first and the last stage alone (as the
    step composer runs them)."""
    stages = stage_kinds(model, training, 1, layers)
    runs: list[tuple[int, int, tuple[tuple[str, int], ...]]] = []
    for i, kinds in enumerate(stages):
        if runs and 0 < i < len(stages) - 1 and runs[-1][0] > 0 and runs[-1][2] == kinds:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, kinds)
        else:
            runs.append((i, 1, kinds))
    return tuple(runs)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Static:
    """What a stage run costs that no microbatch, schedule or switch changes."""

    syncs: tuple[cost.DataParallelSync, ...]
    """Each run's data-parallel traffic."""
    state_bytes: tuple[tuple[float, float, float], ...]
    """Each run's weights, gradients and optimizer states per device."""
    tied_s: float
    """The tied embedding copies' all-reduce (first and last stages)."""
    optimizer_s: float
    """The optimizer step of the busiest stage."""


def _static(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, stage: Any,
    params_by_kind: dict[str, tuple[tuple[tuple[int, ...], float], ...]], split: Split, *,
    zero: int, tp: int, pp: int,
) -> _Static:  # fmt: skip
    """A split's runs' weights on ``stage``'s mesh, as :func:`estimate` gathers them."""
    stages = []
    for _, _, kinds in split:
        params: dict[tuple[int, ...], float] = {}
        for kind, count in kinds:
            for axes, n in params_by_kind[kind]:
                params[axes] = params.get(axes, 0.0) + n * count
        stages.append(StageCost(time=LayerCost.zero(), weights=stage_weights(params, stage),
                                zero=zero))  # fmt: skip
    tied = tied_copy(model, stage, tp=tp, pp=pp)
    stages = with_tied_copy(stages, tied)
    precision = training.precision
    return _Static(
        syncs=tuple(stage_sync(s.weights, zero, cluster, precision) for s in stages),
        state_bytes=tuple(stage_state_bytes(s.weights, zero, precision) for s in stages),
        tied_s=tied_sync_s(cluster, tied, precision),
        optimizer_s=cost.optimizer_step_s(
            cluster.device, precision, params=max(optimizer_params(s.weights, zero)
                                                  for s in stages)),
    )  # fmt: skip


def _runs(
    split: Split, by_kind: dict[str, np.ndarray], static: list[_Static], static_of: np.ndarray,
    layer_of: np.ndarray, recompute: np.ndarray, sends: np.ndarray,
) -> list[StageRun]:  # fmt: skip
    """A group's stage runs, each number an array over the group's configurations."""
    used_rows, local = _factorize(static_of)
    used = static_of[used_rows]
    last = split[-1][0] + split[-1][1] - 1
    runs = []
    for j, (first, count, kinds) in enumerate(split):
        time = LayerCost.zero()
        for kind, n in kinds:
            values = by_kind[kind][layer_of, recompute]
            one = LayerCost(**{f: values[:, i] for i, f in enumerate(_LAYER_FIELDS)})
            time = time + one.scaled(n)
        sync = np.array([[getattr(static[u].syncs[j], f.name) for f in
                          fields(cost.DataParallelSync)] for u in used])[local]  # fmt: skip
        held = np.array([static[u].state_bytes[j] for u in used])[local]
        tied = np.array([static[u].tied_s for u in used])[local]
        runs.append(StageRun(
            time=time.with_pipeline_comm(sends),
            sync=cost.DataParallelSync(**{f.name: sync[:, i] for i, f in
                                          enumerate(fields(cost.DataParallelSync))}),
            state_bytes=(held[:, 0], held[:, 1], held[:, 2]),
            first=first, count=count, tied_s=tied if first in (0, last) else 0.0,
        ))  # fmt: skip
    return runs


def _write(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, c: dict[str, np.ndarray],
    rows: np.ndarray, out: dict[str, np.ndarray], *, step: np.ndarray,
    parts_s: dict[str, np.ndarray], bubble: np.ndarray, peak: np.ndarray,
    recompute_flops: np.ndarray, dp: np.ndarray, num_microbatches: np.ndarray,
    memory_margin_gib: float | None,
) -> None:  # fmt: skip
    """The rates, the memory, the error band and the counts of the priced rows."""
    mbs = c["mbs"].astype(np.int64)
    flash = c["flash_attention"].astype(bool)
    f_first, f_of = _factorize(mbs, flash)
    forward = np.array([forward_flops(model, training, int(mbs[r])) / mbs[r] for r in f_first])
    executed = np.array([cost.executed_training_flops(model, training, int(mbs[r]),
                                                      flash_attention=bool(flash[r])) / mbs[r]
                         for r in f_first])  # fmt: skip
    rates = throughput(step, training, cluster, forward_flops_per_sequence=forward[f_of],
                       executed_flops_per_sequence=executed[f_of],
                       recompute_flops_per_sequence=recompute_flops)  # fmt: skip
    total = sum(peak[k] for k in range(5))
    margin = cost.memory_margin_bytes(cluster.device.memory_gib, memory_margin_gib)
    out["step_time_s"][rows] = step
    for name, value in parts_s.items():
        out[f"time.{name}"][rows] = value
    for name in ("tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu"):
        out[name][rows] = getattr(rates, name)
    out["peak_memory_gib"][rows] = total / GIB
    out["bubble_fraction"][rows] = bubble
    for k, name in enumerate(_MEMORY):
        out[name][rows] = peak[k] / GIB
    out["fits"][rows] = total + margin <= cluster.device.memory_bytes
    out["num_microbatches"][rows] = num_microbatches
    out["dp"][rows] = dp
    out["num_devices"][rows] = cluster.num_devices
    k_first, k_of = _factorize(c["tp"] > 1, c["pp"] > 1, c["cp"] > 1, c["ep"] > 1,
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
