"""How fast a stage can run its layers when it must also hold them: a bound from each layer
kind's strategies alone, before any layer ILP, that lets the search drop a candidate whose
pipeline cannot be split so that every stage both fits and keeps pace with the incumbent
(:func:`planner.search.bounds.split_reaches`).

A stage holding ``L`` layers of a kind with ``f`` microbatches in flight keeps
``L * (states + f * kept)`` of them, and under full recomputation one microbatch's rebuilt
activations on top (:func:`planner.pipeline.options.held_bytes`, the stage table's count).
Per layer that is a memory row over the layer's nodes, ``states + f * kept + rebuilt / L <=
budget / L``, and the least time of the strategies that meet it
(:func:`planner.ilp.bound.fitting_time_bound`) is below every option whose run fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.ilp.bound import fitting_time_bounds
from planner.ilp.formulation import rerun_ns
from planner.ilp.problem import KIB, NS
from planner.search.candidates import Candidate
from planner.search.layers import SearchContext, built_problem, memory_columns
from planner.vocabulary import RECOMPUTE_MODES, ZERO_STAGES


@dataclass(frozen=True, slots=True, kw_only=True)
class KindColumns:
    """One layer kind's nodes (rows) and strategies (columns, padded to the widest node) on a
    mesh: what :func:`fits_under` prices a stage's memory row and time with."""

    times_ns: dict[str, np.ndarray]
    """Per recomputation mode, compute, own communication and reruns (``inf``: no such
    strategy), and each edge's resharding into the node at its least over the producer's
    strategies (every edge counted once, at its consumer)."""
    states: np.ndarray
    """Weight states at the leanest ZeRO stage the pipeline allows, priced as if the mesh
    were replicated over the whole cluster (no more than a candidate's replicas hold)."""
    kept: dict[str, np.ndarray]
    """Per recomputation mode, the activations kept per microbatch in flight."""
    rebuilt: dict[str, np.ndarray]
    """Per recomputation mode, what full recomputation rebuilds (0 otherwise)."""


def kind_columns(ctx: SearchContext, kind: str, c: Candidate) -> KindColumns:
    """``kind``'s :class:`KindColumns` on ``c``'s mesh and microbatch, built once from its
    layer problem (whose dominated strategies are pruned: each dominates in time, reruns and
    every memory term the strategies it replaced)."""
    key = (kind, c.mesh, c.mesh_micro_batch_size, c.num_stages > 1)
    known = ctx.state.fitting_columns.get(key)
    if known is not None:
        return known
    problem, layer = built_problem(ctx, key[:3])
    shape = (len(problem.nodes), max(len(n.strategies) for n in problem.nodes))
    stages = list(ZERO_STAGES[:2] if c.num_stages > 1 else ZERO_STAGES)
    states = np.full(shape, np.inf)
    times = {m: np.full(shape, np.inf) for m in problem.recompute_modes}
    kept = {m: np.zeros(shape) for m in problem.recompute_modes}
    rebuilt = {m: np.zeros(shape) for m in problem.recompute_modes}
    # Each edge's resharding at its consumer, the least any producer strategy pays into it.
    index = {n.name: v for v, n in enumerate(problem.nodes)}
    into = np.zeros(shape)
    rerun_into = np.zeros(shape)
    for edge in problem.edges:
        v, k = index[edge.dst], len(edge.cost_ns[0])
        into[v, :k] += np.min(edge.cost_ns, axis=0)
        rerun_into[v, :k] += np.min(edge.forward_ns, axis=0)
    for v, (costs, (state, held, remade)) in enumerate(
            zip(problem.nodes, memory_columns(layer.nodes), strict=True)):
        k = len(costs.strategies)
        states[v, :k] = state[stages].min(axis=0)
        for mode in problem.recompute_modes:
            m = RECOMPUTE_MODES.index(mode)
            times[mode][v, :k] = np.add(costs.time_ns, rerun_ns(costs, mode)) + into[v, :k] + (
                rerun_into[v, :k] if mode == "full" else 0)
            kept[mode][v, :k] = held[m]
            rebuilt[mode][v, :k] = remade[m]
    columns = KindColumns(times_ns=times, states=states, kept=kept, rebuilt=rebuilt)
    ctx.state.fitting_columns[key] = columns
    return columns


def fits_under(
    ctx: SearchContext, kind: str, c: Candidate, *, layers: int, in_flight: Sequence[float],
    memory_bytes: float, within_s: float,
) -> np.ndarray:  # fmt: skip
    """For each of ``in_flight`` (microbatches a stage holds), whether ``layers`` layers of
    ``kind`` on ``c``'s mesh may hold at most ``memory_bytes`` and take under ``within_s`` a
    layer and a microbatch: False when, under every recomputation mode, a lower bound on the
    time of a layer whose run fits (sync left out) is ``within_s`` or more.

    The bound is taken on a looser row than asked (an eighth of a microbatch fewer in flight
    at most, up to 1/512 of a doubling more memory, and a KiB a node and term for the rounding
    the layer problem's dominance pruning compared memory at), kept, and reused by every
    candidate whose row it covers."""
    columns = kind_columns(ctx, kind, c)
    rows = len(columns.states)
    f = np.floor(np.asarray(in_flight, dtype=float) * 8) / 8
    g = 1 / layers
    budget = memory_bytes / layers + rows * (2 + float(f.max(initial=0.0))) * KIB
    budget = 2 ** (math.ceil(512 * math.log2(budget)) / 512)
    fits = np.zeros(len(f), dtype=bool)
    known = ctx.state.fitting_s
    for mode in RECOMPUTE_MODES:
        if mode not in columns.times_ns or fits.all():
            continue
        keys = [(kind, c.mesh, c.mesh_micro_batch_size, c.num_stages > 1, mode, x, g, budget)
                for x in f]  # fmt: skip
        missing = sorted({k[5] for k, done in zip(keys, fits, strict=True)
                          if not done and k not in known})  # fmt: skip
        if missing:
            held = (columns.states[None] + np.reshape(missing, (-1, 1, 1)) * columns.kept[mode]
                    + g * columns.rebuilt[mode])  # fmt: skip
            ns = fitting_time_bounds(columns.times_ns[mode], held, budget)
            for x, value in zip(missing, ns, strict=True):
                # Each node's time and rerun was rounded to a whole ns.
                known[(*keys[0][:5], x, g, budget)] = max(0.0, float(value) - rows) / NS
        fits |= np.array([known.get(k, np.inf) < within_s for k in keys])
    return fits
