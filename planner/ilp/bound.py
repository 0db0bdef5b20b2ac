"""A lower bound on a layer's time on a mesh, without solving its ILP.

The search bounds most candidates away before it shards their layers (:func:`planner.search.
per_operator.evaluate`); the bound it needs per layer is the least time any sharding takes, whatever
its memory, recomputation or ZeRO stage. That is the layer ILP with only its strategy and edge
variables (recomputation reruns and the gradient sync only add time): a min-sum problem over
the layer graph whose LP relaxation (the local polytope: each edge's pair variables summing to
its two nodes' choices) is solved by OR-Tools' GLOP in milliseconds, where CBC takes ten times
longer on the whole layer ILP. The relaxation's optimum is a lower bound on the integer one
(and on the layer graphs measured it equals it, as the whole ILP's does).

A stage must also hold its layers: :func:`fitting_time_bound` bounds the time of the choices
whose memory fits a budget, from the nodes alone (no LP: the search asks it hundreds of times a
candidate).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from planner.ilp.backends import relaxation_bound
from planner.ilp.formulation import LayerProblem, build_layer_milp
from planner.ilp.prune import prune_dominated


def time_only(problem: LayerProblem) -> LayerProblem:
    """``problem`` with nothing but time left to choose by: no recomputation, ZeRO 0, no
    memory budget, and no rerun, sync or memory per strategy (so that dominance pruning,
    :func:`planner.ilp.prune.prune_dominated`, compares time and resharding alone)."""
    nodes = tuple(
        replace(
            n,
            forward_ns=(0,) * len(n.strategies),
            attention_ns=(0,) * len(n.strategies),
            activation_kib={"none": (0,) * len(n.strategies)},
            state_kib=((0,) * len(n.strategies),) * 4,
            sync_ns=((0,) * len(n.strategies),) * 4,
        )
        for n in problem.nodes
    )  # fmt: skip
    return replace(problem, nodes=nodes, recompute_modes=("none",), zero_stages=(0,),
                   budget_kib=None)  # fmt: skip


def least_time_ns(problem: LayerProblem) -> float:
    """A lower bound, in nanoseconds, on the compute, own communication and resharding of one
    microbatch through the layer under any choice of its strategies (the LP relaxation of
    :func:`time_only`'s program, after dominance pruning).

    >>> from planner.ilp.formulation import EdgeCosts, NodeCosts
    >>> def node(name, ns):
    ...     n = len(ns)
    ...     return NodeCosts(name=name, strategies=tuple("ab"[:n]), time_ns=ns,
    ...                      forward_ns=(0,) * n, attention_ns=(0,) * n,
    ...                      activation_kib={"none": (0,) * n}, state_kib=((0,) * n,) * 4,
    ...                      sync_ns=((0,) * n,) * 4)
    >>> edge = EdgeCosts(src="x", dst="y", cost_ns=((0, 50), (50, 0)),
    ...                  forward_ns=((0, 0), (0, 0)))
    >>> problem = LayerProblem(nodes=(node("x", (10, 40)), node("y", (100, 20))),
    ...                        edges=(edge,))
    >>> round(least_time_ns(problem), 3)  # both b: 40 + 20, less half a ns per term
    58.5
    """
    reduced, _ = prune_dominated(time_only(problem))
    value = relaxation_bound(build_layer_milp(reduced))
    if value is None:
        return 0.0  # no bound rather than a wrong one
    # Each term was rounded to whole nanoseconds (half of one off at most), and the simplex
    # has a tolerance: the bound stays that much below the optimum.
    rounding = (len(reduced.nodes) + len(reduced.edges)) / 2
    return max(0.0, value * (1 - 1e-9) - rounding)


def fitting_time_bound(times: np.ndarray, memory: np.ndarray, budget: float) -> float:
    """A lower bound on ``sum_v times[v, i_v]`` over the choices of one column ``i_v`` per row
    ``v`` whose ``sum_v memory[v, i_v]`` is at most ``budget``; infinite when none is (rows:
    a layer's nodes; columns: their strategies, ``inf`` times where a node has fewer).

    The Lagrangian dual of that knapsack: for every ``lam >= 0``, ``sum_v min_i (times +
    lam * memory) - lam * budget`` is at most the time of every choice that fits, so the best
    of the values tried is a bound whatever the search over ``lam`` finds (bisection on the
    sign of the chosen memory's excess, which is where the dual peaks). Memory has no edge
    terms, so whether any choice fits is exact (each row's leanest).

    >>> times = np.array([[10.0, 30.0], [5.0, 6.0]])
    >>> memory = np.array([[8.0, 2.0], [4.0, 1.0]])
    >>> round(fitting_time_bound(times, memory, 12.0), 3)  # the fastest fits
    15.0
    >>> round(fitting_time_bound(times, memory, 3.0), 3)  # only the leanest: 30 + 6
    36.0
    >>> round(fitting_time_bound(times, memory, 9.0), 3)  # 10 + 6, exact here
    16.0
    >>> round(fitting_time_bound(times, memory, 7.0), 3)  # below the best fit, 30 + 5
    22.667
    >>> fitting_time_bound(times, memory, 2.0)
    inf
    """
    return float(fitting_time_bounds(times, memory[None], budget)[0])


def fitting_time_bounds(times: np.ndarray, memory: np.ndarray, budget: float) -> np.ndarray:
    """:func:`fitting_time_bound` for several memory tables at once (``memory[k]``, each the
    shape of ``times``): one bound each, the same budget.

    >>> times = np.array([[10.0, 30.0], [5.0, 6.0]])
    >>> memory = np.array([[[8.0, 2.0], [4.0, 1.0]], [[16.0, 4.0], [8.0, 2.0]]])
    >>> [round(float(b), 3) for b in fitting_time_bounds(times, memory, 12.0)]  # best fit 35
    [15.0, 26.0]
    """
    bounds = np.full(len(memory), np.inf)
    leanest = np.where(np.isfinite(times), memory, np.inf).min(axis=2).sum(axis=1)
    fits = leanest <= budget
    if not fits.any():
        return bounds
    if budget <= 0:  # only memory-free choices: the unconstrained least is below them
        bounds[fits] = times.min(axis=1).sum()
        return bounds
    share = memory[fits] / budget  # the row's unit: the budget
    best = np.full(len(share), times.min(axis=1).sum())
    spread = math.log10(float(np.nanmax(np.where(np.isfinite(times), times, np.nan))) + 1.0)
    low, high = np.full(len(share), spread - 9), np.full(len(share), spread + 6)
    for _ in range(40):
        mid = (low + high) / 2
        lam = 10.0**mid
        priced = times[None] + lam[:, None, None] * share
        chosen = priced.argmin(axis=2)[..., None]
        best = np.maximum(best, np.take_along_axis(priced, chosen, 2).sum(axis=(1, 2)) - lam)
        over = np.take_along_axis(share, chosen, 2).sum(axis=(1, 2)) > 1
        low, high = np.where(over, mid, low), np.where(over, high, mid)
    bounds[fits] = best * (1 - 1e-9)
    return bounds
