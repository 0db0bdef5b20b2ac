"""Price many uniform configurations at once: :func:`estimate_batch`.

The same cost model as :func:`~planner.uniform.estimate.estimate`, not a copy of it. A
configuration's price splits into parts that depend on few of its knobs, so each part is priced
once per distinct value of those knobs, by the functions ``estimate`` calls, and the rest is
arithmetic over arrays, by the formulas ``estimate`` runs on floats:

- the divisibility rules (:data:`planner.plan.divisibility.RULES`), on arrays;
- a stage's mesh and groups (:func:`~planner.uniform.stages.placed_stage`), once per
  degrees and rank order;
- a layer's parts (:func:`~planner.sharding.uniform.uniform_parts`), once per mesh,
  microbatch and kernel switches, under each recomputation mode;
- a stage's data-parallel traffic, state bytes and optimizer step
  (:func:`~planner.cost.stage_weights.stage_statics`), once per mesh, layer split and ZeRO
  stage; the pipeline sends once per mesh, microbatch and virtual stages;
- the step (:func:`~planner.cost.step.step_totals`) and its rates
  (:func:`~planner.cost.rates.throughput`), over arrays of the configurations that share a
  layer split and a schedule.

The steps are composed in :mod:`planner.uniform.batch_steps`; this module writes them out.

Columns are named as ``planner estimate --json``'s keys, nested ones joined by dots
(``time.compute_s``, ``memory.weights_gib``, ``error_band.fraction``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import cost
from planner.cost.profiled import profile_coverage
from planner.cost.rates import throughput
from planner.cost.regimes import communication_share, mechanisms, regime_of
from planner.cost.uncertainty import (
    error_band,
    highest_utilization,
    memory_band,
    utilization_above,
)
from planner.errors import ConfigError
from planner.graph import forward_flops
from planner.plan.config import ParallelConfig
from planner.plan.divisibility import RULES
from planner.plan.schema import MemoryBreakdown, StepTime
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import check_stack, fill_training
from planner.uniform.batch_steps import Rows, Steps, compose, dividing, layer_table, placed
from planner.uniform.columns import (
    codes,
    config_from_row,
    factorize,
    normalized,
    optional_int,
    python_value,
)
from planner.uniform.estimate import estimate
from planner.uniform.stages import host_fits, layer_index
from planner.vocabulary import GIB

_MEMORY = tuple(f"memory.{name}" for name in MemoryBreakdown.model_fields)
_TIME = tuple(f"time.{name}" for name in StepTime.model_fields)
_FLOATS = ("step_time_s", *_TIME, "tokens_per_s", "model_tflops_per_gpu",
           "hardware_tflops_per_gpu", "mfu", "peak_memory_gib", "bubble_fraction",
           "error_band.fraction", "error_band.fraction_p95", "memory_band.fraction",
           "memory_band.fraction_p95", *_MEMORY,
           "host_memory_gib")  # fmt: skip
_INTS = ("error_band.runs", "memory_band.runs", "num_microbatches", "dp", "num_devices")
_TEXTS = ("error_band.parallelism", "error_band.closest", "error_band.extrapolated",
          "memory_band.closest", "profiled")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchEstimate:
    """Many configurations priced: one array per ``planner estimate --json`` key, an element
    per configuration (NaN, 0, False or None where it does not divide)."""

    columns: dict[str, np.ndarray]
    """The priced numbers by key, with ``divides`` and ``fits`` (bool)."""
    refused_by: np.ndarray
    """Per configuration, the index in :data:`planner.plan.divisibility.RULES` of the first
    rule it breaks (``len(RULES)``: an operator the mesh does not split evenly, bf16 moments
    or a stack the run cannot have); -1 where it divides."""
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
            codes(cols["precision"])[1], codes(cols["stack"])[1])  # fmt: skip
    first, inverse = factorize(*runs)
    for t, row in enumerate(first):
        rows = np.flatnonzero(inverse == t)
        training = fill_training(
            model, seq_length=optional_int(cols["seq_len"][row]),
            global_batch_size=optional_int(cols["global_batch"][row]),
            precision=python_value(cols["precision"][row]),
            stack=python_value(cols["stack"][row]),
        )  # fmt: skip
        try:
            check_stack(training.stack, model)
        except ConfigError:  # refused as estimate refuses it, with its message
            refused[rows] = len(RULES)
            continue
        try:
            cost.states_precision(training.precision, training.stack, "bf16")
        except ConfigError:  # bf16 moments are Megatron-LM's, on its stacks: refused there
            unkept = cols["optimizer_moments"][rows] == "bf16"
            refused[rows[unkept]] = len(RULES)
            rows = rows[~unkept]
        if len(rows):
            group = cols if len(rows) == n else {k: v[rows] for k, v in cols.items()}
            _price(model, cluster, training, group, rows, out, refused, memory_margin_gib)
    out["divides"] = refused < 0
    return BatchEstimate(columns=out, refused_by=refused, configs=cols, model=model,
                         cluster=cluster)  # fmt: skip


def _price(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cols: dict[str, np.ndarray],
    rows: np.ndarray, out: dict[str, np.ndarray], refused: np.ndarray,
    memory_margin_gib: float | None,
) -> None:  # fmt: skip
    """Price the configurations ``rows`` (of one sequence length, batch and precision) into
    ``out``, and record which rule each that does not divide breaks in ``refused``
    (:mod:`planner.uniform.batch_steps`)."""
    b = dividing(model, cluster, training, cols, rows, refused)
    while b is not None and len(b.rows):
        stages, stage_of = placed(b)
        table = layer_table(b, stages, stage_of)
        bad = table.unsplit[table.layer_of]
        if not bad.any():
            _write(b, compose(b, stages, stage_of, table), out, memory_margin_gib)
            return
        refused[b.rows[bad]] = len(RULES)  # refused as estimate refuses them; price the rest
        b = b.subset(~bad)


def _write(b: Rows, s: Steps, out: dict[str, np.ndarray], memory_margin_gib: float | None,
           ) -> None:  # fmt: skip
    """The rates, the memory, the error band and the counts of the priced rows."""
    model, cluster, training, c, rows = b.model, b.cluster, b.training, b.c, b.rows
    mbs = c["mbs"].astype(np.int64)
    flash = c["flash_attention"].astype(bool)
    f_first, f_of = factorize(mbs, flash)
    forward = np.array([forward_flops(model, training, int(mbs[r])) / mbs[r] for r in f_first])
    executed = np.array([cost.executed_training_flops(model, training, int(mbs[r]),
                                                      flash_attention=bool(flash[r])) / mbs[r]
                         for r in f_first])  # fmt: skip
    rates = throughput(s.step_s, training, cluster, forward_flops_per_sequence=forward[f_of],
                       executed_flops_per_sequence=executed[f_of],
                       recompute_flops_per_sequence=s.recompute_flops)  # fmt: skip
    peak = cost.MemoryParts(*s.peak_bytes)
    out["step_time_s"][rows] = s.step_s
    for name, value in s.parts_s.items():
        out[f"time.{name}"][rows] = value
    for name in ("tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu"):
        out[name][rows] = getattr(rates, name)
    out["peak_memory_gib"][rows] = peak.total / GIB
    out["bubble_fraction"][rows] = s.bubble_fraction
    for name, part in zip(_MEMORY, peak, strict=True):
        out[name][rows] = part / GIB
    out["fits"][rows] = (cost.fits(peak.total, cluster.device, memory_margin_gib, training.stack)
                         & host_fits(cluster, s.host_bytes))  # fmt: skip
    out["host_memory_gib"][rows] = s.host_bytes / GIB
    out["num_microbatches"][rows] = b.x.num_microbatches
    out["dp"][rows] = b.x.dp.astype(np.int64)
    out["num_devices"][rows] = cluster.num_devices
    _write_bands(b, out, rates.forward_flops_per_sequence, rates.hfu,
                 communication_share(s.parts_s))
    _write_profiled(b, out)


def _write_profiled(b: Rows, out: dict[str, np.ndarray]) -> None:
    """Each priced row's lines of what a layer profile measured, once per shard."""
    c, rows = b.c, b.rows
    kinds = tuple(layer_index(b.model, b.training, 1).layers_by_kind)
    first, of = factorize(c["tp"], c["mbs"], c["cp"], c["ep"], c["etp"])
    lines = np.empty(len(first), dtype=object)
    for k, r in enumerate(first):  # one by one: numpy would read equal lists as 2-D
        lines[k] = list(profile_coverage(
            b.cluster.device.efficiency.profile, kinds=kinds, stack=b.training.stack,
            precision=b.training.precision, tensor_parallel=int(c["tp"][r]),
            micro_batch_size=int(c["mbs"][r]),
            seq_length=b.training.seq_length // int(c["cp"][r]), moe=b.model.moe,
            expert_parallel=int(c["ep"][r]),
            expert_tensor_parallel=int(c["etp"][r]) or None))  # fmt: skip
    out["profiled"][rows] = lines[of]


def _write_bands(b: Rows, out: dict[str, np.ndarray], forward_flops: np.ndarray,
                 hfu: np.ndarray, share: np.ndarray) -> None:  # fmt: skip
    """Each priced row's error band, once per set of mechanisms and exposed communication's
    ``share`` of the step (the rest of a row's regime is the batch's), with each row's
    hardware FLOPs utilisation ``hfu`` checked against the highest validated."""
    c, rows = b.c, b.rows
    offloaded = np.array([o != "none" for o in c["offload"]], dtype=bool)
    deepep = c["moe_dispatcher"] == "deepep"
    share = np.broadcast_to(share, rows.shape)
    k_first, k_of = factorize(c["tp"] > 1, c["pp"] > 1, c["cp"] > 1, c["ep"] > 1,
                               c["zero"] == 3, offloaded, deepep,
                               np.rint(1000 * share))  # fmt: skip
    bands = [error_band(b.cluster.device, regime_of(
        b.training, b.cluster, moe=b.model.moe is not None,
        forward_flops_per_sequence=float(np.atleast_1d(forward_flops)[r]),
        used=mechanisms(tensor_parallel=int(c["tp"][r]), pipeline_parallel=int(c["pp"][r]),
                        context_parallel=int(c["cp"][r]), expert_parallel=int(c["ep"][r]),
                        zero=int(c["zero"][r]),
                        offload="optimizer" if offloaded[r] else "none",
                        deepep=bool(deepep[r])),
    ), communication_share=float(share[r])) for r in k_first]  # fmt: skip
    for name in ("fraction", "fraction_p95"):
        out[f"error_band.{name}"][rows] = np.array(
            [np.nan if getattr(band, name) is None else getattr(band, name)
             for band in bands])[k_of]  # fmt: skip
    out["error_band.runs"][rows] = np.array([band.runs for band in bands])[k_of]
    out["error_band.parallelism"][rows] = np.array([band.parallelism for band in bands],
                                                   dtype=object)[k_of]  # fmt: skip
    out["error_band.closest"][rows] = np.array([band.closest for band in bands],
                                               dtype=object)[k_of]  # fmt: skip
    gaps = np.empty(len(bands), dtype=object)
    for k, band in enumerate(bands):  # one by one: numpy would read equal lists as 2-D
        gaps[k] = [e.model_dump() for e in band.extrapolated]
    extrapolated = gaps[k_of]
    hfus = np.broadcast_to(hfu, rows.shape)
    device, stack = b.cluster.device, b.training.stack
    for i in np.flatnonzero(hfus > highest_utilization(device, stack)):
        above = utilization_above(device, stack, float(hfus[i]))
        extrapolated[i] = extrapolated[i] + [above.model_dump()] if above else extrapolated[i]
    out["error_band.extrapolated"][rows] = extrapolated
    memory = memory_band(device, stack)
    for name in ("fraction", "fraction_p95"):
        value = getattr(memory, name)
        out[f"memory_band.{name}"][rows] = np.nan if value is None else value
    out["memory_band.runs"][rows] = memory.runs
    out["memory_band.closest"][rows] = memory.closest
