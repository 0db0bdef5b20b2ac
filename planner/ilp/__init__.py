"""The intra-operator pass: one layer's sharding on a logical mesh, as an integer program."""

from planner.ilp.backends import Backend, MilpSolution, SolverReport, solve_milp
from planner.ilp.formulation import EdgeCosts, LayerProblem, NodeCosts, build_layer_milp
from planner.ilp.layer import (
    IlpOptions,
    LayerSolution,
    OpChoice,
    Resharding,
    layer_query,
    solve_layer,
)
from planner.ilp.milp import Milp
from planner.ilp.problem import LayerQuery, layer_problem

__all__ = [
    "Backend",
    "EdgeCosts",
    "IlpOptions",
    "LayerProblem",
    "LayerQuery",
    "LayerSolution",
    "Milp",
    "MilpSolution",
    "NodeCosts",
    "OpChoice",
    "Resharding",
    "SolverReport",
    "build_layer_milp",
    "layer_problem",
    "layer_query",
    "solve_layer",
    "solve_milp",
]
