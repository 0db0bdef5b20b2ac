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

import numpy as np

from planner import cost
from planner.ilp.layer import LayerSolution
from planner.sharding.assignment import LayerParts
from planner.sharding.layout import LogicalMesh
from planner.sharding.weights import weight_states, weight_syncs
from planner.vocabulary import RECOMPUTE_MODES, ZERO_STAGES, Precision

TRANSFORMER_KINDS = ("dense", "moe")


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
    """Compute precision (the gradients' bytes on the wire)."""
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
    this layer's compute (the once-per-step part shared among the microbatches); memory is the
    weight states, the kept activations per in-flight microbatch and the transient peak.
    """
    parts = solution.parts
    if parts is None:
        return []
    modes = RECOMPUTE_MODES if solution.kind in TRANSFORMER_KINDS else ("none",)
    base = parts.forward_s + parts.backward_s + parts.tp_comm_s + parts.cp_comm_s
    base += parts.ep_comm_s
    states = [0.0] * len(ZERO_STAGES)
    syncs = [cost.NO_SYNC] * len(ZERO_STAGES)
    for axes, params in parts.weight_groups():
        group = ctx.mesh.replica_group(axes, ctx.replicas)
        group_states = weight_states(group, params=params, precision=ctx.precision)
        group_syncs = weight_syncs(cluster, group, params=params, precision=ctx.precision)
        for zero in ZERO_STAGES:
            states[zero] += group_states[zero]
            syncs[zero] += group_syncs[zero]
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
                latency_s=base + parts.rerun_total_s(mode) + sync, state_bytes=states[zero],
                kept_bytes=parts.kept_bytes[k], working_bytes=parts.working_bytes[k],
            ))  # fmt: skip
    return options


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
    a_idx, b_idx = np.triu_indices(n + 1, k=1)
    choices = _choices(names, options)
    latency = np.full((p, n + 1, n + 1), np.inf)
    choice = np.full((p, n + 1, n + 1), -1, dtype=np.int64)
    memory = np.full((p, n + 1, n + 1), np.inf)
    for i in range(p):
        extras = [kind for kind, on in (("embedding", i == 0), ("head", i == p - 1)) if on]
        best_lat = np.full(len(vectors), np.inf)
        best_choice = np.full(len(vectors), -1, dtype=np.int64)
        least_mem = np.full(len(vectors), np.inf)
        for c, stage in enumerate(choices):
            if not _relevant(stage, extras, options):
                continue  # differs from another choice only in an extra this stage lacks
            lat, mem = _totals(stage, names, vectors, extras, options, in_flight[i])
            if lat is None:
                continue
            least_mem = np.minimum(least_mem, np.where(np.isfinite(lat), mem, np.inf))
            better = (mem <= memory_bytes) & (lat < best_lat)
            best_lat = np.where(better, lat, best_lat)
            best_choice = np.where(better, c, best_choice)
        latency[i, a_idx, b_idx] = best_lat[inverse] + fixed_latency_s[i]
        choice[i, a_idx, b_idx] = best_choice[inverse]
        memory[i, a_idx, b_idx] = least_mem[inverse]
    if allowed is not None:
        latency = np.where(allowed, latency, np.inf)
        memory = np.where(allowed, memory, np.inf)
    return StageTable(latency=latency, choice=choice, choices=tuple(choices), memory=memory)


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


def _totals(
    stage: StageChoice,
    names: Sequence[str],
    vectors: np.ndarray,
    extras: Sequence[str],
    options: Mapping[str, Sequence[LayerOption]],
    in_flight: float,
) -> tuple[np.ndarray | None, np.ndarray]:
    """Latency and memory of ``stage`` for every count vector (infinite latency where the
    stage holds a kind the choice has no option for; None if it lacks an extra it needs)."""
    lat = np.zeros(len(vectors))
    mem = np.zeros(len(vectors))
    working = np.zeros(len(vectors))
    for k, kind in enumerate(names):
        option = stage.options.get(kind)
        present = vectors[:, k] > 0
        if option is None:
            lat[present] = np.inf  # stages holding this kind cannot use the choice
            continue
        lat += vectors[:, k] * option.latency_s
        mem += vectors[:, k] * (option.state_bytes + in_flight * option.kept_bytes)
        working = np.where(present, np.maximum(working, option.working_bytes), working)
    for kind in extras:
        option = stage.options.get(kind)
        if option is None:
            if options.get(kind):
                return None, mem
            continue
        lat += option.latency_s
        mem += option.state_bytes + in_flight * option.kept_bytes
    return lat, mem + working
