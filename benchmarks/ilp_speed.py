"""How big the per-layer sharding ILP is and how fast each backend solves it.

For GPT-3 175B (seq 2048), Llama-3 70B (GQA, seq 8192) and Mixtral 8x7B (MoE, seq 4096) on
the dgx-h100-80gb cluster, every layer kind of the model (embedding, dense or moe, head) on
the logical meshes 1x8, 2x4, 4x8 and 8x8 (``--quick``: 1x8 and 2x4 only):

- the ILP's size (variables, constraints) after dominance pruning;
- the build time: :func:`planner.ilp.layer_problem` (lowering, strategies, resharding costs,
  pruning) plus :func:`planner.ilp.build_layer_milp`, the median of ``--repeats`` builds;
- per backend, the solve time of :func:`planner.ilp.solve_milp` measured around the whole
  call (so it includes handing the program to the solver: building OR-Tools' model, or
  writing PuLP's file and starting CBC), as the median and the minimum of ``--repeats``
  solves (the machine is shared and noisy), the status and the objective.

The query of each case is the one the inter-operator pass would ask: micro batch = the mesh's
first axis (so the batch can split along axis 0), 16 microbatches, 1 microbatch in flight.
The memory budgets are per-layer shares of a device's 80 GiB, as in Alpa, where a stage's
budget is shared by the layers it holds: 80 GiB / (a realistic number of decoder layers per
stage), namely GPT-3 96 layers / 16 stages = 6 per stage (13.3 GiB), Llama-3 70B 80 / 8 = 10
(8 GiB), Mixtral 32 / 4 = 8 (10 GiB). The embedding and head layers get the whole 80 GiB.

The target is that every layer ILP solves to optimality in under 0.5 s with the faster
backend. The "agree" column checks that all backends that proved optimality found the same
objective (the programs have integer coefficients, so the optima must be equal exactly); the
script exits with status 1 if any two differ. Run from the repository root:

    python benchmarks/ilp_speed.py                    # all meshes, ortools and pulp
    python benchmarks/ilp_speed.py --quick            # 1x8 and 2x4 only
    python benchmarks/ilp_speed.py --backends ortools,pulp,cpsat

The output is a markdown table (for docs/benchmarks.md) followed by summary lines; progress goes to
stderr. On a 2-core machine the default run takes about 20 s; adding cpsat, about 90 s (CP-SAT
needs seconds on the 2-D meshes' decoder layers, which is why it is not a default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast, get_args

from planner.graph import index_layers, lower
from planner.ilp import (
    Backend,
    LayerQuery,
    SolverReport,
    build_layer_milp,
    layer_problem,
    solve_milp,
)
from planner.ilp.milp import Milp
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model

CLUSTER = "instances/clusters/dgx-h100-80gb.json"
DEVICE_GIB = 80.0
TARGET_S = 0.5
MESHES: tuple[tuple[int, int], ...] = ((1, 8), (2, 4), (4, 8), (8, 8))
QUICK_MESHES: tuple[tuple[int, int], ...] = ((1, 8), (2, 4))
NUM_MICROBATCHES = 16
IN_FLIGHT = 1
FULL_BUDGET_KINDS = ("embedding", "head")


@dataclass(frozen=True, slots=True)
class Workload:
    """One model, its sequence length and how many decoder layers a stage holds."""

    name: str
    path: str
    seq_length: int
    layers_per_stage: int

    @property
    def layer_budget_gib(self) -> float:
        """A decoder layer's share of the device memory."""
        return DEVICE_GIB / self.layers_per_stage


WORKLOADS: tuple[Workload, ...] = (
    Workload("gpt3-175b", "instances/models/gpt3-175b.json", 2048, 96 // 16),
    Workload("llama3-70b", "instances/models/llama3-70b.json", 8192, 80 // 8),
    Workload("mixtral-8x7b", "instances/models/mixtral-8x7b.json", 4096, 32 // 4),
)


@dataclass(frozen=True, slots=True)
class Timing:
    """One backend on one case: the median and fastest of the repeated solves."""

    backend: Backend
    median_s: float
    min_s: float
    report: SolverReport
    """The report of the last solve (status and objective do not vary between solves)."""

    @property
    def optimal(self) -> bool:
        """Whether the backend proved optimality."""
        return self.report.status == "optimal"


@dataclass(frozen=True, slots=True)
class Case:
    """One (model, layer kind, mesh) and its measurements."""

    model: str
    kind: str
    mesh: tuple[int, int]
    budget_gib: float
    num_variables: int
    num_constraints: int
    build_s: float
    timings: tuple[Timing, ...]

    @property
    def fastest(self) -> Timing:
        """The backend with the least median solve time among those that proved optimality
        (among all, if none did)."""
        pool = [t for t in self.timings if t.optimal] or list(self.timings)
        return min(pool, key=lambda t: t.median_s)

    @property
    def objectives(self) -> dict[Backend, float]:
        """The proven optima, by backend."""
        return {t.backend: t.report.objective for t in self.timings
                if t.optimal and t.report.objective is not None}  # fmt: skip

    @property
    def agree(self) -> bool | None:
        """Whether all proven optima are equal; None when fewer than two backends proved one."""
        values = list(self.objectives.values())
        return None if len(values) < 2 else all(v == values[0] for v in values)

    @property
    def meets_target(self) -> bool:
        """Solved to optimality under the target time by the faster backend."""
        return self.fastest.optimal and self.fastest.median_s < TARGET_S


def layer_kinds(model: ModelSpec, seq_length: int) -> list[str]:
    """Every layer kind of the model, in the order the graph meets them."""
    training = TrainingSpec(seq_length=seq_length, global_batch_size=1)
    return list(index_layers(lower(model, training)).layers_by_kind)


def build(model: ModelSpec, cluster: ClusterSpec, query: LayerQuery, repeats: int
          ) -> tuple[Milp, float]:  # fmt: skip
    """The layer's program and the median time to build it."""
    times = []
    milp: Milp | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        problem, _ = layer_problem(model, cluster, query)
        milp = build_layer_milp(problem)
        times.append(time.perf_counter() - start)
    assert milp is not None
    return milp, statistics.median(times)


def time_backend(milp: Milp, backend: Backend, repeats: int, time_limit_s: float) -> Timing:
    """Solve ``milp`` ``repeats`` times with ``backend``, timing each whole call."""
    times = []
    report: SolverReport | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        report = solve_milp(milp, backend=backend, time_limit_s=time_limit_s).report
        times.append(time.perf_counter() - start)
    assert report is not None
    return Timing(backend, statistics.median(times), min(times), report)


def run_case(
    workload: Workload,
    model: ModelSpec,
    cluster: ClusterSpec,
    kind: str,
    mesh: tuple[int, int],
    backends: Sequence[Backend],
    repeats: int,
    time_limit_s: float,
) -> Case:
    """Build and solve one layer ILP with every backend."""
    budget = DEVICE_GIB if kind in FULL_BUDGET_KINDS else workload.layer_budget_gib
    query = LayerQuery(
        kind=kind,
        mesh=mesh,
        mesh_micro_batch_size=mesh[0],
        seq_length=workload.seq_length,
        memory_budget_gib=budget,
        in_flight=IN_FLIGHT,
        num_microbatches=NUM_MICROBATCHES,
    )
    milp, build_s = build(model, cluster, query, repeats)
    timings = tuple(time_backend(milp, b, repeats, time_limit_s) for b in backends)
    return Case(workload.name, kind, mesh, budget, milp.num_variables, len(milp.constraints),
                build_s, timings)  # fmt: skip


def _objective(value: float) -> str:
    return f"{value:,.0f}"


def _agree_cell(case: Case) -> str:
    if case.agree is None:
        return "n/a"
    if case.agree:
        return "yes"
    return "NO: " + ", ".join(f"{b} {_objective(v)}" for b, v in case.objectives.items())


def _time_cell(timing: Timing) -> str:
    cell = f"{timing.median_s:.3f} (min {timing.min_s:.3f})"
    return cell if timing.optimal else f"{cell} {timing.report.status}"


def _objective_cell(case: Case) -> str:
    objective = case.fastest.report.objective
    return "-" if objective is None else _objective(objective)


def print_table(cases: Sequence[Case], backends: Sequence[Backend]) -> None:
    """The cases as a markdown table."""
    header = ["model", "kind", "mesh", "budget GiB", "vars", "constraints", "build s",
              *(f"{b} s (median)" for b in backends),
              "objective (ns)", "faster", "agree"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for case in cases:
        row = [
            case.model, case.kind, f"{case.mesh[0]}x{case.mesh[1]}", f"{case.budget_gib:.1f}",
            f"{case.num_variables:,}", f"{case.num_constraints:,}", f"{case.build_s:.3f}",
            *(_time_cell(t) for t in case.timings), _objective_cell(case),
            case.fastest.backend, _agree_cell(case),
        ]  # fmt: skip
        print("| " + " | ".join(row) + " |")


def print_summary(cases: Sequence[Case], backends: Sequence[Backend], total_s: float) -> None:
    """The slowest faster-backend solve, the cases on target, statuses and the run time."""
    slowest = max(cases, key=lambda c: c.fastest.median_s)
    print()
    print(f"slowest faster-backend solve: {slowest.fastest.median_s:.3f} s median "
          f"({slowest.fastest.backend}, {slowest.model} {slowest.kind} "
          f"{slowest.mesh[0]}x{slowest.mesh[1]})")  # fmt: skip
    on_target = sum(c.meets_target for c in cases)
    print(f"cases solved to optimality in < {TARGET_S} s by the faster backend: "
          f"{on_target} of {len(cases)}")  # fmt: skip
    for backend in backends:
        timings = [t for c in cases for t in c.timings if t.backend == backend]
        optimal = sum(t.optimal for t in timings)
        wins = sum(c.fastest.backend == backend for c in cases)
        print(f"{backend}: optimal in {optimal} of {len(timings)} cases, faster in {wins}, "
              f"slowest median {max(t.median_s for t in timings):.3f} s")  # fmt: skip
    disagreements = sum(c.agree is False for c in cases)
    print(f"cases where backends' optima differ: {disagreements}")
    print(f"total run time: {total_s:.1f} s")


def parse_backends(text: str) -> list[Backend]:
    """``ortools,pulp`` -> the backends, checked."""
    known: tuple[str, ...] = get_args(Backend)
    chosen = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in known]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(known)}"
        )
    return [cast(Backend, b) for b in dict.fromkeys(chosen)]  # in the order given, once each


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case, print the table and the summary; 1 if backends' optima differ."""
    parser = argparse.ArgumentParser(description="Size and solve time of the layer ILPs.")
    parser.add_argument("--quick", action="store_true", help="only the 1x8 and 2x4 meshes")
    parser.add_argument("--backends", type=parse_backends, default=["ortools", "pulp"],
                        help="comma-separated, from ortools, pulp, cpsat "
                             "(default ortools,pulp)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3,
                        help="solves (and builds) per case; the median is "
                             "reported (default 3)")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="seconds per solve (default 30)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    backends: list[Backend] = args.backends
    meshes = QUICK_MESHES if args.quick else MESHES
    start = time.perf_counter()
    cluster = load_cluster(CLUSTER)
    cases: list[Case] = []
    for workload in WORKLOADS:
        model = load_model(workload.path)
        for kind in layer_kinds(model, workload.seq_length):
            for mesh in meshes:
                case = run_case(workload, model, cluster, kind, mesh, backends, args.repeats,
                                args.time_limit)  # fmt: skip
                cases.append(case)
                print(f"{case.model} {case.kind} {mesh[0]}x{mesh[1]}: "
                      f"{case.fastest.median_s:.3f} s", file=sys.stderr, flush=True)  # fmt: skip
    total_s = time.perf_counter() - start
    print(f"Layer ILPs on {cluster.name}: micro batch = mesh axis 0, {NUM_MICROBATCHES} "
          f"microbatches, {IN_FLIGHT} in flight; solve times are the median (and min) of "
          f"{args.repeats} solves.")  # fmt: skip
    print()
    print_table(cases, backends)
    print_summary(cases, backends, total_s)
    return 1 if any(c.agree is False for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
