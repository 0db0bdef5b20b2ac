"""Solving a :class:`~planner.ilp.milp.Milp`: OR-Tools' MIP interface (CBC in process),
PuLP (CBC as a subprocess), or OR-Tools CP-SAT (a different algorithm, used to cross-check).

All run single-threaded with a fixed seed (the same inputs give the same answer), honour a
time limit, and report status, objective, best bound, gap and wall time; on a time-out the best
incumbent is returned with its gap. The layer formulation's LP relaxation is tight, which
favours the LP-based MIP solvers; CP-SAT proves the same optima, more slowly on 2-D meshes.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from planner.errors import SolverError
from planner.ilp.milp import Milp

Backend = Literal["ortools", "pulp", "cpsat"]
Status = Literal["optimal", "feasible", "infeasible", "timed_out"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverReport:
    """How a solve went."""

    backend: Backend
    """The solver that ran."""
    status: Status
    """optimal; feasible (time limit hit with an incumbent); infeasible; timed_out (no
    solution found in time)."""
    objective: float | None
    """The returned solution's objective, in the program's units (the layer ILP's: nanoseconds,
    or KiB when it minimises memory); None without a solution."""
    bound: float | None
    """The best proven lower bound on the objective; None without a solution or when the solver did
    not report one."""
    gap: float | None
    """The relative gap ``|objective - bound| / |objective|``; None when either is unknown."""
    wall_s: float
    """Wall-clock seconds of the solve."""
    num_variables: int
    """Binary and integer variables in the program."""
    num_constraints: int
    """Constraints in the program."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MilpSolution:
    """A report and, when a solution was found, every variable's value."""

    report: SolverReport
    """How the solve went."""
    values: dict[str, int]
    """Every variable's value by name (empty when no solution was found)."""


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    return abs(objective - bound) / max(abs(objective), 1e-9)


def _load(solver: Any, milp: Milp, *, relaxed: bool) -> tuple[dict[str, Any], Any]:
    """``milp`` into an OR-Tools linear solver (its variables continuous in their bounds when
    ``relaxed``): the variables by name, and the objective to minimise."""
    if relaxed:
        var = {name: solver.NumVar(0.0, 1.0, name) for name in milp.binaries}
        var |= {name: solver.NumVar(lo, hi, name) for name, (lo, hi) in milp.integers.items()}
    else:
        var = {name: solver.BoolVar(name) for name in milp.binaries}
        var |= {name: solver.IntVar(lo, hi, name) for name, (lo, hi) in milp.integers.items()}
    infinity = solver.infinity()
    for c in milp.constraints:
        lower = -infinity if c.sense == "<=" else c.rhs
        upper = infinity if c.sense == ">=" else c.rhs
        row = solver.Constraint(lower, upper, c.name)
        for v, coef in c.terms:
            row.SetCoefficient(var[v], coef)
    objective = solver.Objective()
    for v, coef in milp.objective.items():
        objective.SetCoefficient(var[v], coef)
    objective.SetMinimization()
    return var, objective


def solve_ortools(milp: Milp, *, time_limit_s: float) -> MilpSolution:
    """OR-Tools' linear-solver interface with CBC, in process."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("CBC")
    if solver is None:
        raise SolverError("this OR-Tools build has no CBC; use --backend pulp or cpsat")
    var, objective = _load(solver, milp, relaxed=False)
    # Milliseconds in a C int: a limit past ~24 days (or infinite) means "none" anyway.
    solver.SetTimeLimit(max(1, min(2**31 - 1, round(1000 * min(time_limit_s, 2e6)))))
    solver.SetNumThreads(1)
    start = time.perf_counter()
    code = solver.Solve()
    wall = time.perf_counter() - start
    status: Status = {
        pywraplp.Solver.OPTIMAL: "optimal", pywraplp.Solver.FEASIBLE: "feasible",
        pywraplp.Solver.INFEASIBLE: "infeasible",
    }.get(code, "timed_out")  # fmt: skip
    if code in (pywraplp.Solver.ABNORMAL, pywraplp.Solver.MODEL_INVALID):
        raise SolverError(f"OR-Tools CBC failed on the model (status {code})")
    found = status in ("optimal", "feasible")
    value = objective.Value() if found else None
    bound = objective.BestBound() if found else None
    values = {name: round(v.solution_value()) for name, v in var.items()} if found else {}
    report = SolverReport(backend="ortools", status=status, objective=value, bound=bound,
                          gap=_gap(value, bound), wall_s=wall, num_variables=milp.num_variables,
                          num_constraints=len(milp.constraints))  # fmt: skip
    return MilpSolution(report=report, values=values)


def solve_cpsat(milp: Milp, *, time_limit_s: float) -> MilpSolution:
    """OR-Tools CP-SAT (exact on integer programs)."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    var = {name: model.NewBoolVar(name) for name in milp.binaries}
    var |= {name: model.NewIntVar(lo, hi, name) for name, (lo, hi) in milp.integers.items()}
    for c in milp.constraints:
        expr = sum(coef * var[v] for v, coef in c.terms)
        if c.sense == "<=":
            model.Add(expr <= c.rhs)
        elif c.sense == ">=":
            model.Add(expr >= c.rhs)
        else:
            model.Add(expr == c.rhs)
    model.Minimize(sum(coef * var[v] for v, coef in milp.objective.items()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    start = time.perf_counter()
    code = solver.Solve(model)
    wall = time.perf_counter() - start
    status: Status = {
        cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }.get(code, "timed_out")  # fmt: skip
    if code == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT rejected the model: {model.Validate()}")
    found = status in ("optimal", "feasible")
    objective = solver.ObjectiveValue() if found else None
    bound = solver.BestObjectiveBound() if found else None
    values = {name: int(solver.Value(v)) for name, v in var.items()} if found else {}
    report = SolverReport(backend="cpsat", status=status, objective=objective, bound=bound,
                          gap=_gap(objective, bound), wall_s=wall, num_variables=milp.num_variables,
                          num_constraints=len(milp.constraints))  # fmt: skip
    return MilpSolution(report=report, values=values)


def solve_pulp(milp: Milp, *, time_limit_s: float) -> MilpSolution:
    """CBC through PuLP; the best bound is read from CBC's log."""
    import pulp

    problem = pulp.LpProblem(milp.name, pulp.LpMinimize)
    var = {name: problem.add_variable(name, 0, 1, cat="Binary") for name in milp.binaries}
    var |= {name: problem.add_variable(name, lo, hi, cat="Integer")
            for name, (lo, hi) in milp.integers.items()}  # fmt: skip
    problem += pulp.lpSum(coef * var[v] for v, coef in milp.objective.items())
    for c in milp.constraints:
        expr = pulp.lpSum(coef * var[v] for v, coef in c.terms)
        problem += (expr <= c.rhs if c.sense == "<=" else expr >= c.rhs if c.sense == ">="
                    else expr == c.rhs), c.name  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cbc.log"
        command = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0, threads=1,
                                    logPath=str(log),
                                    # CBC's presolve costs more than it saves on these
                                    # LP-tight programs (measured 2x on an 8x8 MoE layer).
                                    options=["randomSeed 0", "presolve off"])  # fmt: skip
        start = time.perf_counter()
        problem.solve(command)
        wall = time.perf_counter() - start
        text = log.read_text() if log.exists() else ""
    status = _pulp_status(problem.status, problem.sol_status, text)
    found = status in ("optimal", "feasible")
    objective = pulp.value(problem.objective) if found else None
    if objective is None and found:
        objective = 0.0  # an objective with no terms
    bound = objective if status == "optimal" else _cbc_bound(text)
    values = {name: round(v.value() or 0) for name, v in var.items()} if found else {}
    report = SolverReport(backend="pulp", status=status, objective=objective, bound=bound,
                          gap=_gap(objective, bound), wall_s=wall, num_variables=milp.num_variables,
                          num_constraints=len(milp.constraints))  # fmt: skip
    return MilpSolution(report=report, values=values)


def _pulp_status(status: int, sol_status: int, log: str) -> Status:
    if status == 1 and sol_status == 1:
        return "optimal"
    if status == -1 or ("infeasible" in log.lower() and sol_status != 2):
        return "infeasible"
    if sol_status == 2:
        return "feasible"
    return "timed_out"


def _cbc_bound(log: str) -> float | None:
    match = re.search(r"Lower bound:\s*([-+0-9.eE]+)", log)
    return float(match.group(1)) if match else None


def relaxation_bound(milp: Milp) -> float | None:
    """The optimum of ``milp``'s LP relaxation (every variable in its bounds, none integral),
    a lower bound on its integer optimum, by OR-Tools' GLOP (a deterministic simplex); None
    when the relaxation has no optimum."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    _, objective = _load(solver, milp, relaxed=True)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return float(objective.Value())


def solve_milp(milp: Milp, *, backend: Backend, time_limit_s: float) -> MilpSolution:
    """Solve ``milp`` with ``backend``."""
    if time_limit_s <= 0:
        raise SolverError(f"time limit must be positive, got {time_limit_s}")
    if backend == "ortools":
        return solve_ortools(milp, time_limit_s=time_limit_s)
    if backend == "pulp":
        return solve_pulp(milp, time_limit_s=time_limit_s)
    if backend == "cpsat":
        return solve_cpsat(milp, time_limit_s=time_limit_s)
    raise SolverError(f"unknown backend {backend!r}; choose ortools, pulp or cpsat")
