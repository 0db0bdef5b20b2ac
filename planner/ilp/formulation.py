"""The intra-operator ILP of one layer (ARCHITECTURE.md, "Intra-operator pass"), built one
constraint family at a time.

Data: a :class:`LayerProblem` of nodes (one cost vector per strategy) and edges (one cost
matrix per producer/consumer pair), in integer nanoseconds and KiB.

Variables: ``s[v,i]`` picks strategy ``i`` of node ``v``; ``e[u,v,a,b]`` is ``s[u,i] AND
s[v,j]`` for ``i`` in class ``a`` and ``j`` in class ``b``, linearised by ``sum_b e = sum_{i in
a} s[u,i]`` and ``sum_a e = sum_{j in b} s[v,j]``, where strategies whose rows (columns) of the
edge's resharding matrices are equal share a class (:func:`edge_classes`); ``r[mode]`` picks the
layer's recomputation and ``z[k]`` the ZeRO stage of its weights; ``y[v,i,mode]`` and
``w[v,i,k]`` are the products of a strategy with those choices, linearised the same way, and
carry what the choices change (activation memory and rerun time; weight-state memory and
gradient sync time).

Objective: compute + own communication + resharding + recomputation + gradient sync, for one
microbatch forward and backward. Constraint: weight states + activations <= the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.ilp.milp import Milp


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCosts:
    """One ILP node (an op, with the elementwise ops that follow it folded in)."""

    name: str
    """The node's leading op's name, by which edges refer to it."""
    strategies: tuple[str, ...]
    """The strategies' names; every per-strategy tuple is indexed like this one."""
    time_ns: tuple[int, ...]
    """Compute and own communication, forward and backward."""
    forward_ns: tuple[int, ...]
    """What full recomputation reruns."""
    attention_ns: tuple[int, ...]
    """What selective recomputation reruns."""
    activation_kib: dict[str, tuple[int, ...]]
    """Activation memory under each recomputation mode (in-flight microbatches included)."""
    state_kib: tuple[tuple[int, ...], ...]
    """Weight-state memory per ZeRO stage ``k`` (outer index) and strategy."""
    sync_ns: tuple[tuple[int, ...], ...]
    """Gradient sync per microbatch per ZeRO stage ``k`` and strategy."""


def rerun_ns(node: NodeCosts, mode: str) -> tuple[int, ...]:
    """What recomputation ``mode`` reruns of each of ``node``'s strategies: the forward under
    full recomputation, the attention core under selective, nothing otherwise."""
    if mode == "full":
        return node.forward_ns
    if mode == "selective":
        return node.attention_ns
    return (0,) * len(node.strategies)


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeCosts:
    """Resharding between a producer's strategies (rows) and a consumer's (columns)."""

    src: str
    """The producer node's name."""
    dst: str
    """The consumer node's name."""
    cost_ns: tuple[tuple[int, ...], ...]
    """Forward and backward resharding."""
    forward_ns: tuple[tuple[int, ...], ...]
    """The forward part, rerun by full recomputation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProblem:
    """Everything the layer ILP needs, as numbers."""

    nodes: tuple[NodeCosts, ...]
    """The layer's nodes; the variables ``s[v,i]`` index them by position."""
    edges: tuple[EdgeCosts, ...]
    """Producer -> consumer edges, with their resharding matrices."""
    recompute_modes: tuple[str, ...] = ("none",)
    """The recomputation modes the layer may choose from (names of
    :data:`planner.vocabulary.RECOMPUTE_MODES`)."""
    zero_stages: tuple[int, ...] = (0,)
    """The ZeRO stages (0..3) the layer's weights may take."""
    budget_kib: int | None = None
    """Memory one device may spend on the layer's weight states and kept activations, in KiB (None:
    no memory constraint)."""


def _s(v: int, i: int) -> str:
    return f"s_{v}_{i}"


def _e(k: int, i: int, j: int) -> str:
    return f"e_{k}_{i}_{j}"


def add_strategy_variables(milp: Milp, problem: LayerProblem) -> None:
    """One binary per (node, strategy), exactly one chosen per node."""
    for v, node in enumerate(problem.nodes):
        for i in range(len(node.strategies)):
            milp.add_binary(_s(v, i))
        milp.add_constraint(f"one_strategy_{v}", {_s(v, i): 1 for i in range(len(node.strategies))},
                            "==", 1)  # fmt: skip
        milp.minimise({_s(v, i): t for i, t in enumerate(node.time_ns)})


def edge_classes(edge: EdgeCosts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each producer strategy's class on ``edge`` (rows) and each consumer strategy's
    (columns): strategies whose rows (columns) of both resharding matrices are equal share
    one, numbered in order of first appearance. A pair of classes costs what any pair of its
    strategies costs, so one edge variable per pair of classes is exact, and its relaxation
    as tight (split a class's value among its strategies in proportion to their choices); on
    DeepSeek-V3's MoE layer on a 2x8 mesh, 5,179 variables where strategy pairs take 8,189,
    and CBC 10-40 % faster.

    >>> edge = EdgeCosts(src="x", dst="y", cost_ns=((0, 5, 5), (0, 5, 5), (7, 0, 0)),
    ...                  forward_ns=((0, 0, 0),) * 3)
    >>> edge_classes(edge)
    ((0, 0, 1), (0, 1, 1))
    """
    rows: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    cols: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    row_of = tuple(rows.setdefault((c, f), len(rows))
                   for c, f in zip(edge.cost_ns, edge.forward_ns, strict=True))  # fmt: skip
    col_of = tuple(cols.setdefault((c, f), len(cols))
                   for c, f in zip(zip(*edge.cost_ns, strict=True), zip(*edge.forward_ns,
                                                                        strict=True),
                                   strict=True))  # fmt: skip
    return row_of, col_of


def _members(classes: tuple[int, ...]) -> list[list[int]]:
    """The strategies of each class, classes in order."""
    members: list[list[int]] = [[] for _ in range(max(classes, default=-1) + 1)]
    for i, c in enumerate(classes):
        members[c].append(i)
    return members


def add_edge_constraints(milp: Milp, problem: LayerProblem) -> None:
    """Edge variables for every pair of producer and consumer strategy classes
    (:func:`edge_classes`), tied to both nodes' choices, with the resharding cost in the
    objective."""
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    for k, edge in enumerate(problem.edges):
        u, v = index[edge.src], index[edge.dst]
        rows, cols = (_members(c) for c in edge_classes(edge))
        for a, row in enumerate(rows):
            for b, col in enumerate(cols):
                milp.add_binary(_e(k, a, b))
                milp.minimise({_e(k, a, b): edge.cost_ns[row[0]][col[0]]})
        for a, row in enumerate(rows):
            terms = {_e(k, a, b): 1 for b in range(len(cols))} | {_s(u, i): -1 for i in row}
            milp.add_constraint(f"edge_{k}_row_{a}", terms, "==", 0)
        for b, col in enumerate(cols):
            terms = {_e(k, a, b): 1 for a in range(len(rows))} | {_s(v, j): -1 for j in col}
            milp.add_constraint(f"edge_{k}_col_{b}", terms, "==", 0)


def _choice(milp: Milp, prefix: str, options: tuple[object, ...]) -> dict[object, str]:
    """One binary per option, exactly one chosen."""
    variables = {option: milp.add_binary(f"{prefix}_{option}") for option in options}
    milp.add_constraint(f"one_{prefix}", dict.fromkeys(variables.values(), 1), "==", 1)
    return variables


def _disaggregate(
    milp: Milp, problem: LayerProblem, prefix: str, chosen: dict[object, str], nodes: list[int]
) -> dict[tuple[int, int, object], str]:
    """``y[v,i,o] = s[v,i] AND chosen[o]`` for the nodes whose costs depend on the option,
    linearised as the edges are (``sum_o y = s[v,i]``, ``sum_i y = chosen[o]``): a tight
    relaxation, where big-M bounds would leave the LP far from the integer optimum."""
    y: dict[tuple[int, int, object], str] = {}
    for v in nodes:
        count = len(problem.nodes[v].strategies)
        for i in range(count):
            for option in chosen:
                y[v, i, option] = milp.add_binary(f"{prefix}_{v}_{i}_{option}")
            split = {y[v, i, o]: 1 for o in chosen} | {_s(v, i): -1}
            milp.add_constraint(f"{prefix}_{v}_{i}_split", split, "==", 0)
        for option, var in chosen.items():
            one = {y[v, i, option]: 1 for i in range(count)} | {var: -1}
            milp.add_constraint(f"{prefix}_{v}_{option}_one", one, "==", 0)
    return y


def _add_rerun_resharding(
    milp: Milp, problem: LayerProblem, y: dict[tuple[int, int, object], str]
) -> None:
    """Full recomputation reruns each edge's forward resharding: ``f[k,a,b] = e[k,a,b] AND
    full``, linearised against ``y[.,.,full]`` exactly as ``e`` is against ``s``."""
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    for k, edge in enumerate(problem.edges):
        if not any(any(row) for row in edge.forward_ns):
            continue
        u, v = index[edge.src], index[edge.dst]
        rows, cols = (_members(c) for c in edge_classes(edge))
        f = {(a, b): milp.add_binary(f"f_{k}_{a}_{b}")
             for a in range(len(rows)) for b in range(len(cols))}  # fmt: skip
        for (a, b), var in f.items():
            milp.add_constraint(f"f_{k}_{a}_{b}_in_e", {var: 1, _e(k, a, b): -1}, "<=", 0)
            milp.minimise({var: edge.forward_ns[rows[a][0]][cols[b][0]]})
        for a, row in enumerate(rows):
            terms = ({f[a, b]: 1 for b in range(len(cols))}
                     | {y[u, i, "full"]: -1 for i in row})  # fmt: skip
            milp.add_constraint(f"f_{k}_row_{a}", terms, "==", 0)
        for b, col in enumerate(cols):
            terms = ({f[a, b]: 1 for a in range(len(rows))}
                     | {y[v, j, "full"]: -1 for j in col})  # fmt: skip
            milp.add_constraint(f"f_{k}_col_{b}", terms, "==", 0)


def add_recompute_constraints(milp: Milp, problem: LayerProblem) -> dict[str, int]:
    """The recomputation choice. Returns the activation-memory terms; adds the rerun time
    (a node's forward, or its attention core, and under full recomputation the forward
    resharding too) to the objective."""
    if len(problem.recompute_modes) == 1:
        return _fixed_recompute(milp, problem)
    modes = _choice(milp, "recompute", problem.recompute_modes)
    y = _disaggregate(milp, problem, "y", modes, list(range(len(problem.nodes))))
    memory: dict[str, int] = {}
    for (v, i, mode), var in y.items():
        node = problem.nodes[v]
        memory[var] = node.activation_kib[str(mode)][i]
        milp.minimise({var: rerun_ns(node, str(mode))[i]})
    if "full" in modes:
        _add_rerun_resharding(milp, problem, y)
    return memory


def _fixed_recompute(milp: Milp, problem: LayerProblem) -> dict[str, int]:
    """One recomputation mode: its choice variable is fixed, and its rerun time and memory
    go on the strategy and edge variables themselves (no products to linearise)."""
    (mode,) = problem.recompute_modes
    chosen = milp.add_binary(f"recompute_{mode}")
    milp.add_constraint("one_recompute", {chosen: 1}, "==", 1)
    memory: dict[str, int] = {}
    for v, node in enumerate(problem.nodes):
        for i in range(len(node.strategies)):
            memory[_s(v, i)] = node.activation_kib[mode][i]
            milp.minimise({_s(v, i): rerun_ns(node, mode)[i]})
    if mode == "full":
        for k, edge in enumerate(problem.edges):
            rows, cols = (_members(c) for c in edge_classes(edge))
            for a, row in enumerate(rows):
                for b, col in enumerate(cols):
                    milp.minimise({_e(k, a, b): edge.forward_ns[row[0]][col[0]]})
    return memory


def add_zero_constraints(milp: Milp, problem: LayerProblem) -> dict[str, int]:
    """The ZeRO stage of the layer's weights. Returns the weight-state memory terms; adds the
    gradient sync time to the objective."""
    stages = _choice(milp, "zero", problem.zero_stages)
    # Only nodes with weights depend on the stage.
    weighted = [v for v, node in enumerate(problem.nodes)
                if any(any(row) for row in (*node.state_kib, *node.sync_ns))]  # fmt: skip
    w = _disaggregate(milp, problem, "w", stages, weighted)
    memory: dict[str, int] = {}
    for (v, i, stage), var in w.items():
        node = problem.nodes[v]
        memory[var] = node.state_kib[int(stage)][i]  # type: ignore[call-overload]
        milp.minimise({var: node.sync_ns[int(stage)][i]})  # type: ignore[call-overload]
    return memory


def add_memory_constraints(
    milp: Milp, problem: LayerProblem, memory: dict[str, int]
) -> None:
    """Weight states plus kept activations fit the per-device budget."""
    if problem.budget_kib is not None:
        milp.add_constraint("memory", memory, "<=", problem.budget_kib)


def build_layer_milp(problem: LayerProblem, *, minimise_memory: bool = False) -> Milp:
    """The layer ILP. With ``minimise_memory`` the objective is memory and there is no budget:
    the least memory any choice needs (reported when the budget is infeasible)."""
    milp = Milp(name="layer")
    add_strategy_variables(milp, problem)
    add_edge_constraints(milp, problem)
    memory = add_recompute_constraints(milp, problem) | add_zero_constraints(milp, problem)
    if minimise_memory:
        milp.objective = dict(memory)
    else:
        add_memory_constraints(milp, problem, memory)
    return milp


def evaluate_ns(problem: LayerProblem, chosen: Sequence[int], recompute: str, zero: int) -> int:
    """The objective of one complete choice, computed directly (the aggregates of the
    program are only bounded, so a solution's value is recomputed from its choices)."""
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    total = sum(node.time_ns[i] + node.sync_ns[zero][i]
                for node, i in zip(problem.nodes, chosen, strict=True))  # fmt: skip
    for edge in problem.edges:
        i, j = chosen[index[edge.src]], chosen[index[edge.dst]]
        total += edge.cost_ns[i][j]
        if recompute == "full":
            total += edge.forward_ns[i][j]
    for node, i in zip(problem.nodes, chosen, strict=True):
        total += rerun_ns(node, recompute)[i]
    return total


def memory_kib(problem: LayerProblem, chosen: Sequence[int], recompute: str, zero: int) -> int:
    """Weight states plus kept activations of one complete choice."""
    return sum(node.state_kib[zero][i] + node.activation_kib[recompute][i]
               for node, i in zip(problem.nodes, chosen, strict=True))  # fmt: skip


def least_memory_kib(problem: LayerProblem) -> dict[str, int]:
    """Each recomputation mode's least memory over every choice: memory has no edge terms, so
    each node's leanest strategy under the layer's leanest ZeRO stage is exact, and a budget
    below it needs no solve to be found infeasible.

    >>> node = NodeCosts(name="mlp", strategies=("replicated", "column"), time_ns=(4, 2),
    ...                  forward_ns=(2, 1), attention_ns=(0, 0),
    ...                  activation_kib={"none": (8, 4), "full": (1, 1)},
    ...                  state_kib=((16, 8), (4, 6)), sync_ns=((0, 0), (0, 0)))
    >>> least_memory_kib(LayerProblem(nodes=(node,), edges=(), recompute_modes=("none", "full"),
    ...                               zero_stages=(0, 1)))
    {'none': 10, 'full': 5}
    """
    return {mode: min(sum(min(a + s for a, s in zip(node.activation_kib[mode], node.state_kib[k],
                                                     strict=True))
                          for node in problem.nodes)
                      for k in problem.zero_stages)
            for mode in problem.recompute_modes}  # fmt: skip


def strategy_var(v: int, i: int) -> str:
    """The name of ``s[v,i]`` (to read a solution back)."""
    return _s(v, i)


def edge_var(k: int, a: int, b: int) -> str:
    """The name of ``e[k,a,b]``, edge ``k``'s variable for its classes ``a`` and ``b``
    (:func:`edge_classes`)."""
    return _e(k, a, b)
