"""From solved layers to the stage latencies the pipeline's dynamic program needs.

Each solved layer (an ILP sharding on the stage's mesh) is priced under every recomputation
mode and ZeRO stage (:class:`LayerOption`); a stage takes one sharding per layer kind and one
(recomputation, ZeRO) pair for all its layers, the fastest whose memory fits beside the
microbatches it holds in flight. Stages of equal layer-kind counts cost the same, so the table
is built once per distinct count vector and scattered over the layer ranges.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from planner import cost
from planner.graph.ops import TRANSFORMER_KINDS
from planner.ilp.layer import LayerSolution
from planner.sharding.assignment import LayerParts
from planner.sharding.layout import LogicalMesh
from planner.sharding.weights import weight_states, weight_syncs
from planner.vocabulary import RECOMPUTE_MODES, ZERO_STAGES, OptimizerMoments, Precision, Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerOption:
    """One layer kind's sharding under one recomputation mode and ZeRO stage, priced."""

    kind: str
    """The layer kind (``dense``, ``moe``, ``embedding``, ``head``)."""
    solution: LayerSolution
    """The solved sharding."""
    recompute: str
    """The recomputation mode."""
    zero: int
    """The ZeRO stage."""
    latency_s: float
    """One microbatch forward and backward, with the gradient sync amortised over the step's
    microbatches (the ILP's objective)."""
    state_bytes: float
    """Weights, gradients and optimizer states on one device."""
    kept_bytes: float
    """Activations kept for the backward, per in-flight microbatch."""
    working_bytes: float
    """The transient peak beside them."""

    @property
    def parts(self) -> LayerParts:
        """The solved layer's parts."""
        assert self.solution.parts is not None  # options come from feasible solutions only
        return self.solution.parts


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncContext:
    """Who else holds a stage's weights, and how long a step's sync is spread over."""

    mesh: LogicalMesh
    """The stage's mesh."""
    replicas: int
    """Data-parallel replicas of the whole pipeline."""
    num_microbatches: int
    """Microbatches of the step, over which the once-per-step sync is shared."""
    precision: Precision
    """Compute precision (with the stack, the states and the gradients' bytes on the wire)."""
    stack: Stack = "megatron-te"
    """The software that runs the layers (how it keeps the states; what ZeRO-3 holds
    unsharded)."""
    optimizer_moments: OptimizerMoments = "fp32"
    """Adam's moments as the optimizer keeps them (:func:`planner.cost.memory.states_precision`)."""
    overlap_grad_reduce: bool = False
    """Whether the gradient reduction overlaps the backward."""
    overlap_param_gather: bool = False
    """Whether the weights' all-gathers (ZeRO >= 1) overlap the compute."""


def layer_options(
    solution: LayerSolution, cluster: cost.ClusterSpec, ctx: SyncContext
) -> list[LayerOption]:
    """``solution``'s sharding under every recomputation mode (transformer layers only) and
    ZeRO stage.

    Time adds the gradient sync per microbatch that the overlap flags leave exposed beside
    this layer's compute (the once-per-step part shared among the microbatches) and the
    optimizer's gradient accumulation (:func:`~planner.cost.data_parallel.gradient_accumulation`);
    memory is the weight states, the kept activations per in-flight microbatch and the
    transient peak.
    """
    parts = solution.parts
    if parts is None:
        return []
    modes = RECOMPUTE_MODES if solution.kind in TRANSFORMER_KINDS else ("none",)
    base = parts.time_s
    states = [0.0] * len(ZERO_STAGES)
    syncs = [cost.NO_SYNC] * len(ZERO_STAGES)
    # The states as the stack keeps them (and their traffic: one switch, as the uniform
    # search prices them), as the layer's own strategies priced them.
    held = cost.states_precision(ctx.precision, ctx.stack, ctx.optimizer_moments)
    for axes, params in parts.weight_groups():
        group = ctx.mesh.replica_group(axes, ctx.replicas)
        group_states = weight_states(group, params=params, precision=held)
        group_syncs = weight_syncs(cluster, group, params=params, precision=held)
        for zero in ZERO_STAGES:
            states[zero] += group_states[zero]
            syncs[zero] += group_syncs[zero]
    # ZeRO-3's gathered layers (:func:`planner.cost.memory.gathered_bytes_per_param`).
    layer_params = sum(n for n, _ in parts.weights)
    per_param = cost.gathered_bytes_per_param(ctx.precision, ctx.stack)
    gathered = [layer_params * per_param if zero >= 3 else 0.0 for zero in ZERO_STAGES]
    # The optimizer's gradient accumulation after each backward (DeepSpeed's).
    accumulation_s = [cost.gradient_accumulation(held, zero=zero, stack=ctx.stack).seconds(
        cluster.device, params=layer_params, num_microbatches=ctx.num_microbatches)
        for zero in ZERO_STAGES]  # fmt: skip
    options = []
    for zero in ZERO_STAGES:
        for mode in modes:
            k = parts.mode(mode)
            exposed = cost.exposed_sync(
                syncs[zero], forward_s=parts.forward_s, backward_s=parts.backward_s,
                overlap_grad_reduce=ctx.overlap_grad_reduce,
                overlap_param_gather=ctx.overlap_param_gather,
            )  # fmt: skip
            sync = exposed.per_microbatch_s + exposed.once_s / ctx.num_microbatches
            options.append(LayerOption(
                kind=solution.kind, solution=solution, recompute=mode, zero=zero,
                latency_s=base + parts.rerun_total_s(mode) + sync + accumulation_s[zero],
                state_bytes=states[zero],
                kept_bytes=parts.kept_bytes[k],
                working_bytes=max(parts.working_bytes[k], parts.loss_bytes) + gathered[zero],
            ))  # fmt: skip
    return options


def held_bytes(layers: Any, state_bytes: Any, kept_bytes: Any, in_flight: float) -> Any:
    """What ``layers`` layers of one option hold on a device with ``in_flight`` microbatches
    in flight: their weight states and kept activations (a stage's transient peak comes on
    top, once). Numbers or numpy arrays (broadcast).

    >>> held_bytes(4, 2.0, 0.5, 3)
    14.0
    """
    return layers * (state_bytes + in_flight * kept_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageChoice:
    """The options a stage runs: one per layer kind it holds, plus its fixed extras."""

    options: Mapping[str, LayerOption]
    """The option of each layer kind, the embedding and head included."""
    recompute: str
    """The recomputation mode all its transformer layers share."""
    zero: int
    """The ZeRO stage all its layers share."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTable:
    """``latency[i, a, b]``: stage ``i`` holding layers ``a..b-1`` (0-based), or inf; and the
    choice behind each finite entry."""

    latency: np.ndarray
    """Per-microbatch seconds of stage ``i`` holding layers ``a..b-1`` with its fastest choice
    that fits (inf: none fits)."""
    choice: np.ndarray
    """Index into :attr:`choices` (-1 where nothing fits)."""
    choices: tuple[StageChoice, ...]
    """Every choice a stage may make."""
    memory: np.ndarray
    """``memory[i, a, b]``: the least bytes a device of stage ``i`` needs for layers ``a..b-1``
    under any choice, fitting or not (inf where none runs): how far a plan is from fitting."""


def kind_counts(kinds: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """The distinct kinds in order of first appearance, and prefix counts: ``prefix[j, k]``
    layers of kind ``k`` among the first ``j`` layers."""
    names = tuple(dict.fromkeys(kinds))
    prefix = np.zeros((len(kinds) + 1, len(names)), dtype=np.int64)
    for j, kind in enumerate(kinds):
        prefix[j + 1] = prefix[j]
        prefix[j + 1, names.index(kind)] += 1
    return names, prefix


def stage_table(
    kinds: Sequence[str],
    options: Mapping[str, Sequence[LayerOption]],
    *,
    in_flight: Sequence[float],
    fixed_latency_s: Sequence[float],
    allowed: np.ndarray | None,
    memory_bytes: float,
) -> StageTable:
    """The latency of every (stage, layer range) with the fastest fitting choice.

    ``kinds[j]`` is layer ``j``'s kind (``embedding`` and ``head`` go to the first and last
    stage); ``in_flight[i]`` the microbatches stage ``i`` holds; ``fixed_latency_s[i]`` what
    stage ``i`` adds regardless (pipeline sends); ``allowed[i, a, b]`` masks ranges the
    schedule forbids; ``memory_bytes`` what one device may use.
    """
    p, n = len(in_flight), len(kinds)
    names, vectors, inverse = _count_vectors(tuple(kinds))
    ranges = _ranges(n)
    choices = _choices(names, options)
    # Each stage's (a, b) table as one row of flat positions: writing a row through one
    # index is faster than through two, and the tables are the same.
    latency = np.full((p, (n + 1) ** 2), np.inf)
    choice = np.full((p, (n + 1) ** 2), -1, dtype=np.int64)
    memory = np.full((p, (n + 1) ** 2), np.inf)
    # A stage's extras decide which choices it weighs and their latencies; only its memory
    # depends on the microbatches it holds, so the columns are built once per set of extras.
    columns: dict[tuple[str, ...], _Columns] = {}
    for i in range(p):
        extras = tuple(kind for kind, on in (("embedding", i == 0), ("head", i == p - 1)) if on)
        if extras not in columns:
            columns[extras] = _columns(choices, names, vectors, extras, options)
        best_lat, best_choice, least_mem = columns[extras].best(in_flight[i], memory_bytes)
        latency[i, ranges] = best_lat[inverse] + fixed_latency_s[i]
        choice[i, ranges] = best_choice[inverse]
        memory[i, ranges] = least_mem[inverse]
    latency, choice, memory = (x.reshape(p, n + 1, n + 1) for x in (latency, choice, memory))
    if allowed is not None:
        latency = np.where(allowed, latency, np.inf)
        memory = np.where(allowed, memory, np.inf)
    return StageTable(latency=latency, choice=choice, choices=tuple(choices), memory=memory)


@lru_cache(maxsize=16)
def _ranges(n: int) -> np.ndarray:
    """The flat positions ``a * (n + 1) + b`` of the layer ranges ``a < b`` of ``n`` layers, in
    ``np.triu_indices`` order."""
    a_idx, b_idx = np.triu_indices(n + 1, k=1)
    return a_idx * (n + 1) + b_idx


@lru_cache(maxsize=16)
def _count_vectors(kinds: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """The distinct kind-count vectors of all layer ranges ``a < b`` (in ``np.triu_indices``
    order) and, per range, the index of its vector."""
    names, prefix = kind_counts(kinds)
    a_idx, b_idx = np.triu_indices(len(kinds) + 1, k=1)
    vectors, inverse = np.unique(prefix[b_idx] - prefix[a_idx], axis=0, return_inverse=True)
    return names, vectors, inverse.reshape(-1)


def _choices(
    names: Sequence[str], options: Mapping[str, Sequence[LayerOption]]
) -> list[StageChoice]:
    """Every combination of one sharding per kind under one shared (recompute, ZeRO) pair;
    the embedding and head are chosen per stage among their own shardings."""
    out = []
    for zero in ZERO_STAGES:
        for mode in RECOMPUTE_MODES:
            per_kind = []
            for kind in names:
                fits = [
                    o
                    for o in options.get(kind, ())
                    if o.zero == zero
                    and o.recompute == (mode if kind in TRANSFORMER_KINDS else "none")
                ]
                # None: no option of this kind here, so only stages without it can use it.
                per_kind.append(fits or [None])
            for extra in ("embedding", "head"):
                per_kind.append([o for o in options.get(extra, ()) if o.zero == zero] or [None])
            for combo in itertools.product(*per_kind):
                chosen = {o.kind: o for o in combo if o is not None}
                if chosen:
                    out.append(StageChoice(options=chosen, recompute=mode, zero=zero))
    return out


def _relevant(
    stage: StageChoice, extras: Sequence[str], options: Mapping[str, Sequence[LayerOption]]
) -> bool:
    """Whether ``stage`` is the representative of its choices for a stage with ``extras``:
    an extra the stage does not hold must be its kind's first option at that ZeRO stage."""
    for kind in ("embedding", "head"):
        if kind in extras or kind not in stage.options:
            continue
        first = next(o for o in options[kind] if o.zero == stage.zero)
        if stage.options[kind] is not first:
            return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class _KindColumns:
    """One layer kind's (or extra's) option in each choice a stage weighs, as columns."""

    held: np.ndarray
    """Whether the choice has an option of the kind."""
    latency_s: np.ndarray
    """The option's latency (0 where none)."""
    state_bytes: np.ndarray
    """Its weight states (0 where none)."""
    kept_bytes: np.ndarray
    """Its kept activations per in-flight microbatch (0 where none)."""
    working_bytes: np.ndarray
    """Its transient peak (0 where none)."""


def _kind_columns(stages: Sequence[StageChoice], kind: str) -> _KindColumns:
    """``kind``'s option in each of ``stages``, as columns."""
    found = [stage.options.get(kind) for stage in stages]

    def column(field: str) -> np.ndarray:
        return np.array([0.0 if o is None else getattr(o, field) for o in found], dtype=float)

    return _KindColumns(held=np.array([o is not None for o in found], dtype=bool),
                        latency_s=column("latency_s"), state_bytes=column("state_bytes"),
                        kept_bytes=column("kept_bytes"),
                        working_bytes=column("working_bytes"))  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class _Columns:
    """The choices a stage with some extras weighs, priced for every count vector: rows are
    choices, columns count vectors. Each number is computed as the sum for one choice would
    be, term by term in the same order, so the table is the same to the last bit."""

    index: np.ndarray
    """Each row's index into the stage table's choices, in their order."""
    vectors: np.ndarray
    """The distinct kind-count vectors (:func:`_count_vectors`)."""
    kinds: tuple[_KindColumns, ...]
    """Each layer kind's options, in the order of the vectors' columns."""
    extras: tuple[_KindColumns, ...]
    """Each extra's options (embedding, head) the stage holds."""
    latency_s: np.ndarray
    """Per-microbatch seconds (inf where the choice lacks a kind the range holds)."""
    working_bytes: np.ndarray
    """The transient peak of the kinds the range holds."""

    def memory_bytes(self, in_flight: float) -> np.ndarray:
        """Bytes a device needs holding ``in_flight`` microbatches."""
        mem = np.zeros(self.latency_s.shape)
        for k, kind in enumerate(self.kinds):
            added = mem + held_bytes(self.vectors[:, k][None, :], kind.state_bytes[:, None],
                                     kind.kept_bytes[:, None], in_flight)  # fmt: skip
            mem = np.where(kind.held[:, None], added, mem)
        for extra in self.extras:
            added = mem + held_bytes(1, extra.state_bytes, extra.kept_bytes, in_flight)[:, None]
            mem = np.where(extra.held[:, None], added, mem)
        return mem + self.working_bytes

    def best(
        self, in_flight: float, memory_bytes: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per count vector: the least latency of a choice that fits (inf: none), the first
        choice with it (-1: none), and the least memory of any choice that runs (inf: none)."""
        width = self.latency_s.shape[1]
        if len(self.index) == 0:
            nothing = np.full(width, np.inf)
            return nothing, np.full(width, -1, dtype=np.int64), nothing.copy()
        mem = self.memory_bytes(in_flight)
        lat = self.latency_s
        fitting = np.where((mem <= memory_bytes) & (lat < np.inf), lat, np.inf)
        first = np.argmin(fitting, axis=0)  # the first of equals, as a scan keeping "<" would
        best_lat = fitting[first, np.arange(width)]
        best_choice = np.where(np.isfinite(best_lat), self.index[first], -1)
        least_mem = np.where(np.isfinite(lat), mem, np.inf).min(axis=0)
        return best_lat, best_choice, least_mem


def _columns(
    choices: Sequence[StageChoice],
    names: Sequence[str],
    vectors: np.ndarray,
    extras: Sequence[str],
    options: Mapping[str, Sequence[LayerOption]],
) -> _Columns:
    """The choices a stage holding ``extras`` weighs: those that represent their kind
    (:func:`_relevant`) and have an option for each extra that has any."""
    index = [c for c, stage in enumerate(choices)
             if _relevant(stage, extras, options)
             and all(kind in stage.options or not options.get(kind) for kind in extras)]
    stages = [choices[c] for c in index]
    kinds = tuple(_kind_columns(stages, kind) for kind in names)
    lat = np.zeros((len(stages), len(vectors)))
    working = np.zeros((len(stages), len(vectors)))
    for k, kind in enumerate(kinds):
        present = vectors[:, k] > 0
        added = lat + vectors[:, k] * kind.latency_s[:, None]
        # A choice without an option of this kind cannot run a range that holds it.
        lat = np.where(kind.held[:, None], added, np.where(present, np.inf, lat))
        held = kind.held[:, None] & present
        working = np.where(held, np.maximum(working, kind.working_bytes[:, None]), working)
    priced_extras = tuple(_kind_columns(stages, kind) for kind in extras)
    for extra in priced_extras:
        lat = np.where(extra.held[:, None], lat + extra.latency_s[:, None], lat)
    return _Columns(index=np.array(index, dtype=np.int64), vectors=vectors, kinds=kinds,
                    extras=priced_extras, latency_s=lat, working_bytes=working)  # fmt: skip
