"""The search on thousands of small random valid problems: every solve must give a plan that
keeps the invariants (:mod:`planner.plan.invariants`) or a PlannerError, never another exception.

The problems and the property are ``tests/valid_problems.py``'s (the CI test runs 25 of
them). Cases are split over worker processes, each its own hypothesis seed; a case that breaks
the property is counted and printed, not shrunk, so one run reports every failure. Run from
the repository root:

    python benchmarks/fuzz_solve.py                     # 10,000 cases, about an hour on 2 cores
    python benchmarks/fuzz_solve.py --cases 200 --workers 1
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.valid_problems holds the strategies


def run_worker(
    cases: int, seed: int, time_limit_s: float
) -> tuple[Counter[str], list[float], list[str]]:
    """``cases`` problems from hypothesis seed ``seed``, each search cut at ``time_limit_s``:
    outcomes counted by kind, each solve's wall time, and every case that broke the
    property."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as with_seed

    from planner.plan.schema import Plan
    from tests.valid_problems import FUZZ_OPTIONS, clusters, models, solve_checked

    options = dataclasses.replace(FUZZ_OPTIONS, time_limit_s=time_limit_s)

    outcomes: Counter[str] = Counter()
    walls: list[float] = []
    failures: list[str] = []

    @with_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(models(), clusters())
    def case(model, cluster) -> None:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            result = solve_checked(model, cluster, options)
        except Exception:  # the property broke: record it and go on
            outcomes["property broken"] += 1
            failures.append(f"{model.model_dump_json()} | {cluster.model_dump_json()}\n"
                            f"{traceback.format_exc()}")  # fmt: skip
        else:
            if isinstance(result, Plan):
                outcomes[f"plan ({result.solver.status})"] += 1
            else:
                outcomes[type(result).__name__] += 1
        walls.append(time.perf_counter() - started)

    case()
    return outcomes, walls, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=1.0,
                        help="Seconds per search (the property must hold when it cuts one "
                        "short, so a short limit costs no coverage and makes 10,000 cases "
                        "affordable).")  # fmt: skip
    args = parser.parse_args()
    shares = [args.cases // args.workers + (i < args.cases % args.workers)
              for i in range(args.workers)]  # fmt: skip
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        seeds = range(args.seed, args.seed + args.workers)
        results = list(pool.map(run_worker, shares, seeds, [args.time_limit] * args.workers))
    wall = time.perf_counter() - started
    outcomes = sum((r[0] for r in results), Counter())
    walls = [w for r in results for w in r[1]]
    failures = [f for r in results for f in r[2]]
    print(f"{len(walls):,} cases, {args.workers} workers, searches cut at {args.time_limit:g} s, "
          f"{wall / 60:.1f} min; solve wall time "
          f"median {statistics.median(walls):.2f} s, max {max(walls):.1f} s\n")  # fmt: skip
    print("| outcome | cases |")
    print("|---|---|")
    for outcome, count in sorted(outcomes.items()):
        print(f"| {outcome} | {count:,} |")
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)


if __name__ == "__main__":
    main()
