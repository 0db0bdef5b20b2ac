"""``--time-limit`` bounds the whole search: past it the best plan so far comes back marked
``time_limit`` with its gap to the least bound left, or, with no plan yet, a TimeLimitError;
the progress callback says what is being searched."""

from __future__ import annotations

import time

import pytest

import planner
from planner.cli.plans import time_limit_note
from planner.errors import PlannerError, TimeLimitError
from planner.options import Progress, SolveOptions, training_of
from planner.plan.invariants import plan_violations
from planner.plan.schema import Plan
from planner.search.per_operator import candidates, solve_per_operator
from planner.spec.reading import load_cluster
from tests.cli_process import cli
from tests.conftest import CLUSTERS, MODELS
from tests.test_cli import _assert_one_line_error

GPT_1T = MODELS / "gpt-1t.json"


@pytest.fixture(scope="module")
def cut() -> tuple[Plan, list[Progress], float]:
    """GPT-1T on 3,072 A100 with a limit of a quarter of its whole search's time on this
    machine now (about 2 s unloaded: a fixed limit would not cut a faster search), or twice
    the time its first candidate took if that is more (on a loaded machine the first candidate
    alone may take a quarter; capped at three quarters, so that the search is still cut), what
    the progress callback saw, and the limit. The machine is shared: where its load changed
    between the two searches, so that the limit passed before any candidate fitted or not at
    all, the limit is moved and the search run again (a few times at most)."""
    model = planner.load_model(GPT_1T)
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 384)
    start = time.perf_counter()
    first_done: list[float] = []

    def note(p: Progress) -> None:
        if p.done >= 1 and not first_done:
            first_done.append(time.perf_counter() - start)

    whole = solve_per_operator(model, cluster, SolveOptions(), progress=note)
    whole_s = whole.solver.time_s
    limit = min(max(whole_s / 4, 2 * first_done[0]), 0.75 * whole_s)
    for _ in range(6):
        seen: list[Progress] = []
        try:
            plan = solve_per_operator(model, cluster, SolveOptions(time_limit_s=limit),
                                      progress=seen.append)  # fmt: skip
        except TimeLimitError:  # slower now: nothing had fitted by the limit
            limit *= 1.5
            continue
        if plan.solver.status == "time_limit":
            return plan, seen, limit
        limit /= 2  # faster now: the whole search ran inside the limit
    pytest.fail(f"no limit near {limit:.3g} s cut the search with a plan found")


def test_cut_search_returns_its_best_plan_marked_with_its_gap(
    cut: tuple[Plan, list[Progress], float],
) -> None:
    """The plan is valid, marked ``time_limit``, and its gap is what is left to win: the best
    step against the least lower bound of the candidates not searched, so it lies in [0, 1)."""
    plan, _, limit = cut
    assert plan.solver.status == "time_limit"
    assert plan.solver.gap is not None and 0 <= plan.solver.gap < 1
    assert plan_violations(plan, planner.load_model(GPT_1T)) == []
    # The whole search stopped near its limit: the last layer ILP it started was cut to what
    # was left, so only pricing the plan can run over (generous slack: a shared machine).
    assert plan.solver.time_s < limit + 5.0
    # what solve says under its table (it said nothing, exit 0, a plan 3.7x too slow)
    said = time_limit_note(plan)
    assert said.startswith(f"the search stopped at its time limit after "
                           f"{plan.solver.time_s:.1f} s") and "--time-limit" in said
    assert f"(up to {100 * plan.solver.gap:.1f} % faster)" in said


def test_gap_is_against_the_first_candidate_not_searched(
    cut: tuple[Plan, list[Progress], float],
) -> None:
    """Candidates are sorted by bound, so the least bound left is the next candidate's."""
    plan, _, limit = cut
    model = planner.load_model(GPT_1T)
    cluster = load_cluster(CLUSTERS / "dgx-a100-80gb.json", 384)
    options = SolveOptions(time_limit_s=limit)
    todo = candidates(model, cluster, training_of(model, options), options)
    searched = plan.solver.configurations
    next_bound = todo[searched].lower_bound_s
    assert plan.solver.gap == pytest.approx(1 - next_bound / plan.predicted.step_time_s)


def test_progress_names_each_candidate_before_searching_it(
    cut: tuple[Plan, list[Progress], float],
) -> None:
    """Each candidate is announced (done, total, what) before it is searched, and the last
    report says the search is over."""
    plan, seen, _ = cut
    named = [p for p in seen if p.searching]
    assert len(named) >= plan.solver.configurations
    assert all(p.searching.startswith("PP") and "meshes" in p.searching for p in named)
    assert [p.done for p in named] == sorted(p.done for p in named)
    assert seen[-1].searching == "" and seen[-1].done == seen[-1].total


def test_no_plan_before_the_limit_is_a_time_limit_error() -> None:
    """A limit that passes before the first candidate is searched leaves nothing to return."""
    model = planner.load_model(MODELS / "gpt3-175b.json")
    with pytest.raises(TimeLimitError, match=r"time limit \(0 s\) passed after 0 of \d+"):
        solve_per_operator(model, load_cluster(CLUSTERS / "dgx-a100-80gb.json"),
                           SolveOptions(time_limit_s=0))
    assert issubclass(TimeLimitError, PlannerError)


def test_cli_time_limit_zero_is_one_line() -> None:
    """From the command line it is one line and exit code 2."""
    done = cli("solve", "instances/models/gpt3-175b.json", "instances/clusters/dgx-a100-80gb.json",
                "--time-limit", "0", "--json")  # fmt: skip
    _assert_one_line_error(done, "time limit", "--time-limit")
