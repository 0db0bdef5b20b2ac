"""The intra-operator ILP of one layer (ARCHITECTURE.md, "Intra-operator pass"), built one
constraint family at a time.

Data: a :class:`LayerProblem` of nodes (one cost vector per strategy) and edges (one cost
matrix per producer/consumer pair), in integer nanoseconds and KiB.

Variables: ``s[v,i]`` picks strategy ``i`` of node ``v``; ``e[u,v,i,j]`` is ``s[u,i] AND
s[v,j]``, linearised by ``sum_j e = s[u,i]`` and ``sum_i e = s[v,j]``; ``r[mode]`` picks the
layer's recomputation, ``z[k]`` the ZeRO stage of its weights; four integer aggregates carry
what those choices change (activation memory, weight-state memory, recomputed time, gradient
sync time), each bounded below per choice with a big-M that vanishes for the chosen one.

Objective: compute + own communication + resharding + recomputation + gradient sync, for one
microbatch forward and backward. Constraint: weight states + activations <= the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.ilp.milp import Milp

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class NodeCosts:
    """One ILP node (an op, with the elementwise ops that follow it folded in)."""

    name: str
    strategies: tuple[str, ...]
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


@dataclass(frozen=True, slots=True)
class EdgeCosts:
    """Resharding between a producer's strategies (rows) and a consumer's (columns)."""

    src: str
    dst: str
    cost_ns: tuple[tuple[int, ...], ...]
    """Forward and backward resharding."""
    forward_ns: tuple[tuple[int, ...], ...]
    """The forward part, rerun by full recomputation."""


@dataclass(frozen=True, slots=True)
class LayerProblem:
    """Everything the layer ILP needs, as numbers."""

    nodes: tuple[NodeCosts, ...]
    edges: tuple[EdgeCosts, ...]
    recompute_modes: tuple[str, ...] = ("none",)
    zero_stages: tuple[int, ...] = (0,)
    budget_kib: int | None = None


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


def add_edge_constraints(milp: Milp, problem: LayerProblem) -> None:
    """Edge variables for every producer/consumer strategy pair, tied to both nodes' choices,
    with the resharding cost in the objective."""
    index = {node.name: v for v, node in enumerate(problem.nodes)}
    for k, edge in enumerate(problem.edges):
        u, v = index[edge.src], index[edge.dst]
        rows, cols = len(problem.nodes[u].strategies), len(problem.nodes[v].strategies)
        for i in range(rows):
            for j in range(cols):
                milp.add_binary(_e(k, i, j))
                milp.minimise({_e(k, i, j): edge.cost_ns[i][j]})
        for i in range(rows):
            terms = {_e(k, i, j): 1 for j in range(cols)} | {_s(u, i): -1}
            milp.add_constraint(f"edge_{k}_row_{i}", terms, "==", 0)
        for j in range(cols):
            terms = {_e(k, i, j): 1 for i in range(rows)} | {_s(v, j): -1}
            milp.add_constraint(f"edge_{k}_col_{j}", terms, "==", 0)


def _choice(milp: Milp, prefix: str, options: tuple[object, ...]) -> dict[object, str]:
    """One binary per option, exactly one chosen."""
    variables = {option: milp.add_binary(f"{prefix}_{option}") for option in options}
    milp.add_constraint(f"one_{prefix}", dict.fromkeys(variables.values(), 1), "==", 1)
    return variables


def _bounded_below(
    milp: Milp, name: str, per_option: dict[str, dict[str, int]], chosen: dict[object, str],
) -> str:  # fmt: skip
    """An integer ``X >= expr_o - M_o (1 - chosen_o)`` for every option ``o``: equal to the
    chosen option's expression wherever X is minimised or bounded above. ``M_o`` is the
    expression's largest value: one strategy per node, one strategy pair per edge."""
    bounds = {option: _largest_value(terms) for option, terms in per_option.items()}
    x = milp.add_integer(name, 0, max(bounds.values(), default=0))
    for option, terms in per_option.items():
        big_m = bounds[option]
        milp.add_constraint(f"{name}_{option}", {x: 1} | {v: -c for v, c in terms.items()}
                            | {chosen[option]: -big_m}, ">=", -big_m)  # fmt: skip
    return x


def _largest_value(terms: dict[str, int]) -> int:
    """The most ``terms`` can add up to when each node (``s_v_*``) and each edge (``e_k_*``)
    takes one strategy (pair)."""
    best: dict[str, int] = {}
    for var, coef in terms.items():
        kind, index = var.split("_")[:2]
        key = f"{kind}_{index}"
        best[key] = max(best.get(key, 0), coef)
    return sum(best.values())


def add_recompute_constraints(milp: Milp, problem: LayerProblem) -> tuple[str, str]:
    """The recomputation choice: activation memory and the time of what it reruns."""
    modes = _choice(milp, "recompute", problem.recompute_modes)
    memory = {str(mode): {_s(v, i): kib for v, node in enumerate(problem.nodes)
                          for i, kib in enumerate(node.activation_kib[str(mode)])}
              for mode in modes}  # fmt: skip
    activations = _bounded_below(milp, "activation_kib", memory, modes)
    rerun: dict[str, dict[str, int]] = {}
    for mode in modes:
        terms: dict[str, int] = {}
        if mode == "full":
            for v, node in enumerate(problem.nodes):
                terms |= {_s(v, i): t for i, t in enumerate(node.forward_ns)}
            for k, edge in enumerate(problem.edges):
                terms |= {_e(k, i, j): t for i, row in enumerate(edge.forward_ns)
                          for j, t in enumerate(row)}  # fmt: skip
        elif mode == "selective":
            for v, node in enumerate(problem.nodes):
                terms |= {_s(v, i): t for i, t in enumerate(node.attention_ns)}
        rerun[str(mode)] = terms
    recompute = _bounded_below(milp, "recompute_ns", rerun, modes)
    milp.minimise({recompute: 1})
    return activations, recompute


def add_zero_constraints(milp: Milp, problem: LayerProblem) -> str:
    """The ZeRO stage of the layer's weights: their memory and their gradient sync."""
    stages = _choice(milp, "zero", problem.zero_stages)
    memory, sync = {}, {}
    for stage in stages:
        k = int(stage)  # type: ignore[call-overload]
        memory[str(stage)] = {
            _s(v, i): kib for v, node in enumerate(problem.nodes)
            for i, kib in enumerate(node.state_kib[k])
        }  # fmt: skip
        sync[str(stage)] = {
            _s(v, i): ns for v, node in enumerate(problem.nodes)
            for i, ns in enumerate(node.sync_ns[k])
        }  # fmt: skip
    states = _bounded_below(milp, "state_kib", memory, {str(k): v for k, v in stages.items()})
    sync_ns = _bounded_below(milp, "sync_ns", sync, {str(k): v for k, v in stages.items()})
    milp.minimise({sync_ns: 1})
    return states


def add_memory_constraints(
    milp: Milp, problem: LayerProblem, states: str, activations: str
) -> None:
    """Weight states plus kept activations fit the per-device budget."""
    if problem.budget_kib is not None:
        milp.add_constraint("memory", {states: 1, activations: 1}, "<=", problem.budget_kib)


def build_layer_milp(problem: LayerProblem, *, minimise_memory: bool = False) -> Milp:
    """The layer ILP. With ``minimise_memory`` the objective is memory and there is no budget:
    the least memory any choice needs (reported when the budget is infeasible)."""
    milp = Milp("layer")
    add_strategy_variables(milp, problem)
    add_edge_constraints(milp, problem)
    activations, _ = add_recompute_constraints(milp, problem)
    states = add_zero_constraints(milp, problem)
    if minimise_memory:
        milp.objective = {states: 1, activations: 1}
    else:
        add_memory_constraints(milp, problem, states, activations)
    return milp


def strategy_var(v: int, i: int) -> str:
    """The name of ``s[v,i]`` (to read a solution back)."""
    return _s(v, i)


def edge_var(k: int, i: int, j: int) -> str:
    """The name of ``e[k,i,j]``."""
    return _e(k, i, j)
