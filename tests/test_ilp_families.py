"""Each constraint family of the layer ILP, on a problem small enough to check by hand:
two nodes of two strategies and one edge between them."""

from __future__ import annotations

from planner.ilp import EdgeCosts, LayerProblem, Milp, NodeCosts, solve_milp
from planner.ilp.formulation import (
    add_edge_constraints,
    add_memory_constraints,
    add_recompute_constraints,
    add_strategy_variables,
    add_zero_constraints,
    build_layer_milp,
)
from planner.vocabulary import RECOMPUTE_MODES


def _node(name: str, time: tuple[int, int], memory: tuple[int, int]) -> NodeCosts:
    return NodeCosts(
        name=name, strategies=("a", "b"), time_ns=time, forward_ns=(10, 10),
        attention_ns=(0, 0),
        activation_kib={"none": memory, "selective": memory, "full": (1, 1)},
        state_kib=((100, 100), (50, 50), (25, 25), (10, 10)),
        sync_ns=((0, 0), (5, 5), (50, 50), (500, 500)),
    )  # fmt: skip


def _problem(**changes: object) -> LayerProblem:
    nodes = (_node("u", (100, 10), (0, 0)), _node("v", (100, 10), (0, 0)))
    # Resharding is free on the diagonal (same layout) and dear off it.
    edge = EdgeCosts(src="u", dst="v", cost_ns=((0, 1000), (1000, 0)), forward_ns=((0, 7), (7, 0)))
    return LayerProblem(nodes=nodes, edges=(edge,), **changes)  # type: ignore[arg-type]


def test_strategy_variables_are_one_hot() -> None:
    """One binary per strategy and one equality per node; the objective has their times."""
    milp = Milp(name="t")
    add_strategy_variables(milp, _problem())
    assert milp.binaries == ["s_0_0", "s_0_1", "s_1_0", "s_1_1"]
    assert [c.name for c in milp.constraints] == ["one_strategy_0", "one_strategy_1"]
    assert milp.objective == {"s_0_0": 100, "s_0_1": 10, "s_1_0": 100, "s_1_1": 10}


def test_edge_constraints_tie_both_ends() -> None:
    """rows x cols edge binaries, one row-sum and one column-sum equality per strategy (each
    its own class here: no two rows or columns are equal)."""
    milp = Milp(name="t")
    problem = _problem()
    add_strategy_variables(milp, problem)
    add_edge_constraints(milp, problem)
    assert len([b for b in milp.binaries if b.startswith("e_")]) == 4
    assert len([c for c in milp.constraints if c.name.startswith("edge_")]) == 4
    assert milp.objective["e_0_0_1"] == 1000


def test_recompute_choice_is_one_hot_with_products() -> None:
    """One binary per mode plus a product per (node, strategy, mode); full recomputation adds
    the rerun copies of the edge."""
    milp = Milp(name="t")
    problem = _problem(recompute_modes=RECOMPUTE_MODES)
    add_strategy_variables(milp, problem)
    add_edge_constraints(milp, problem)
    memory = add_recompute_constraints(milp, problem)
    assert {"recompute_none", "recompute_selective", "recompute_full"} <= set(milp.binaries)
    assert len([b for b in milp.binaries if b.startswith("y_")]) == 2 * 2 * 3
    assert len([b for b in milp.binaries if b.startswith("f_")]) == 4
    assert sorted(set(memory.values())) == [0, 1]


def test_zero_choice_prices_memory_and_sync() -> None:
    """Without a budget the cheapest sync wins (ZeRO 0); a budget of 60 KiB forces ZeRO 2
    (2 x 25 KiB of states), whose per-microbatch sync the objective then pays."""
    free = solve_milp(build_layer_milp(_problem(zero_stages=(0, 1, 2, 3))),
                      backend="ortools", time_limit_s=5)  # fmt: skip
    assert free.values["zero_0"] == 1 and free.report.objective == 20
    tight = solve_milp(build_layer_milp(_problem(zero_stages=(0, 1, 2, 3), budget_kib=60)),
                       backend="ortools", time_limit_s=5)  # fmt: skip
    assert tight.values["zero_2"] == 1 and tight.report.objective == 20 + 2 * 50


def test_memory_constraint_only_with_a_budget() -> None:
    """No budget, no memory row; a budget adds exactly one."""
    for budget, rows in ((None, 0), (500, 1)):
        milp = Milp(name="t")
        problem = _problem(budget_kib=budget)
        add_strategy_variables(milp, problem)
        memory = add_recompute_constraints(milp, problem) | add_zero_constraints(milp, problem)
        add_memory_constraints(milp, problem, memory)
        assert len([c for c in milp.constraints if c.name == "memory"]) == rows


def test_edges_steer_the_choice() -> None:
    """Both nodes prefer b (10 ns); with free diagonal resharding they agree on b: 20 ns."""
    result = solve_milp(build_layer_milp(_problem()), backend="pulp", time_limit_s=5)
    assert result.report.objective == 20
    assert result.values["s_0_1"] == result.values["s_1_1"] == 1
