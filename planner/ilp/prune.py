"""Exact dominance pruning of a :class:`LayerProblem` before it is solved.

Strategy ``a`` of a node is dropped when another strategy ``b`` of the same node is never
worse: ``b`` needs no more memory under any recomputation mode or ZeRO stage, reruns and syncs
no more, and its own time plus its *most* expensive resharding on every incident edge is at
most ``a``'s time plus ``a``'s *least* expensive resharding. Any solution using ``a`` then stays
feasible and no dearer with ``b``, so the optimum is unchanged. Pruning one node tightens its
neighbours' bounds, so it repeats until nothing changes.
"""

from __future__ import annotations

from dataclasses import replace

from planner.ilp.formulation import EdgeCosts, LayerProblem, NodeCosts


def _incident(problem: LayerProblem, name: str) -> list[tuple[EdgeCosts, bool]]:
    """Edges touching node ``name``, with whether the node is their source (rows)."""
    return [(e, e.src == name) for e in problem.edges if name in (e.src, e.dst)]


def _edge_range(edge: EdgeCosts, index: int, as_source: bool, full: bool) -> tuple[int, int]:
    """Least and most resharding (with the rerun forward part under full recomputation) the
    strategy ``index`` can pay on ``edge``."""
    rows = range(len(edge.cost_ns))
    cols = range(len(edge.cost_ns[0]))
    pairs = [(index, j) for j in cols] if as_source else [(i, index) for i in rows]
    costs = [edge.cost_ns[i][j] + (edge.forward_ns[i][j] if full else 0) for i, j in pairs]
    return min(costs), max(costs)


def _profile(node: NodeCosts, i: int) -> tuple[int, ...]:
    """Everything besides time and edges that must not get worse."""
    return (
        *(node.activation_kib[m][i] for m in node.activation_kib),
        *(row[i] for row in node.state_kib),
        *(row[i] for row in node.sync_ns),
        node.forward_ns[i],
        node.attention_ns[i],
    )


def _dominated(problem: LayerProblem, v: int) -> set[int]:
    node = problem.nodes[v]
    full = "full" in problem.recompute_modes
    incident = _incident(problem, node.name)
    best, worst = [], []
    for i in range(len(node.strategies)):
        ranges = [_edge_range(e, i, src, full) for e, src in incident]
        best.append(node.time_ns[i] + sum(lo for lo, _ in ranges))
        worst.append(node.time_ns[i] + sum(hi for _, hi in ranges))
    profiles = [_profile(node, i) for i in range(len(node.strategies))]
    drop: set[int] = set()
    for a in range(len(node.strategies)):
        for b in range(len(node.strategies)):
            if a == b or b in drop:
                continue
            if worst[b] <= best[a] and all(x <= y for x, y in zip(profiles[b], profiles[a],
                                                                 strict=True)):  # fmt: skip
                drop.add(a)
                break
    return drop


def _keep(problem: LayerProblem, v: int, kept: list[int]) -> LayerProblem:
    node = problem.nodes[v]

    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[i] for i in kept)

    new_node = replace(
        node,
        strategies=tuple(node.strategies[i] for i in kept),
        time_ns=pick(node.time_ns), forward_ns=pick(node.forward_ns),
        attention_ns=pick(node.attention_ns),
        activation_kib={m: pick(a) for m, a in node.activation_kib.items()},
        state_kib=tuple(pick(r) for r in node.state_kib),
        sync_ns=tuple(pick(r) for r in node.sync_ns),
    )  # fmt: skip
    edges = []
    for e in problem.edges:
        cost, fwd = e.cost_ns, e.forward_ns
        if e.src == node.name:
            cost, fwd = tuple(cost[i] for i in kept), tuple(fwd[i] for i in kept)
        if e.dst == node.name:
            cost = tuple(tuple(row[j] for j in kept) for row in cost)
            fwd = tuple(tuple(row[j] for j in kept) for row in fwd)
        edges.append(replace(e, cost_ns=cost, forward_ns=fwd))
    nodes = tuple(new_node if k == v else n for k, n in enumerate(problem.nodes))
    return replace(problem, nodes=nodes, edges=tuple(edges))


def prune_dominated(problem: LayerProblem) -> tuple[LayerProblem, tuple[tuple[int, ...], ...]]:
    """The problem without dominated strategies, and for each node the original indices of
    the strategies it kept."""
    kept = [list(range(len(n.strategies))) for n in problem.nodes]
    changed = True
    while changed:
        changed = False
        for v in range(len(problem.nodes)):
            drop = _dominated(problem, v)
            if drop:
                local = [i for i in range(len(kept[v])) if i not in drop]
                problem = _keep(problem, v, local)
                kept[v] = [kept[v][i] for i in local]
                changed = True
    return problem, tuple(tuple(k) for k in kept)
