"""A lower bound on a layer's time on a mesh, without solving its ILP.

The search bounds most candidates away before it shards their layers (:func:`planner.search.
per_operator.evaluate`); the bound it needs per layer is the least time any sharding takes, whatever
its memory, recomputation or ZeRO stage. That is the layer ILP with only its strategy and edge
variables (recomputation reruns and the gradient sync only add time): a min-sum problem over
the layer graph whose LP relaxation (the local polytope: each edge's pair variables summing to
its two nodes' choices) is solved by OR-Tools' GLOP in milliseconds, where CBC takes ten times
longer on the whole layer ILP. The relaxation's optimum is a lower bound on the integer one
(and on the layer graphs measured it equals it, as the whole ILP's does).
"""

from __future__ import annotations

from dataclasses import replace

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
