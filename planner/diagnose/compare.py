"""Several planning methods on one problem, side by side, priced by the same cost model.

Each method is a function ``(model, cluster, options, *, progress) -> Plan``: the ILP search
(:func:`planner.search.targets.solve`: for a framework, every configuration it launches; for
``any``, the ILP search), Megatron users' rule of thumb
(:func:`planner.baselines.heuristic_plan`) and the exhaustive grid over uniform configurations
(:func:`planner.baselines.grid_plan`). A method that finds no plan is reported with its reason
rather than stopping the comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from planner.baselines import grid_plan, heuristic_plan
from planner.errors import ConfigError, InfeasibleError, InputError
from planner.frameworks import ANY, profile
from planner.options import ProgressFn, SolveOptions
from planner.plan.schema import Plan
from planner.search.targets import solve
from planner.spec import ClusterSpec, ModelSpec

Method = Literal["ilp", "heuristic", "grid"]
METHODS: dict[str, Callable[..., Plan]] = {
    "ilp": solve,
    "heuristic": heuristic_plan,
    "grid": grid_plan,
}
"""Each method's function ``(model, cluster, options, *, progress) -> Plan``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodResult:
    """One method's answer: its plan (None when it found none, with ``error`` saying why)
    and the wall time it took."""

    method: str
    """The method (``ilp``, ``heuristic``, ``grid``) or framework target that ran."""
    plan: Plan | None
    """Its best plan (None: it found none)."""
    solve_time_s: float
    """Wall-clock seconds the method took, failed ones included."""
    error: str | None = None
    """Why it found no plan (the infeasibility or configuration error's message); None with a
    plan."""
    label: str = "method"
    """What ``method`` names: a ``method``, or a ``framework`` target."""

    @property
    def step_time_s(self) -> float | None:
        """Predicted seconds per step, or None without a plan."""
        return self.plan.predicted.step_time_s if self.plan is not None else None


def compare(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions,
    methods: Sequence[str] = ("ilp", "heuristic", "grid"),
    *,
    progress: Callable[[str], ProgressFn | None] | None = None,
) -> list[MethodResult]:
    """Run each method on the same problem, in the order given.

    ``progress(method)`` may return a progress callback for that method's search. Raises
    :class:`~planner.errors.InfeasibleError` only when no method finds a plan (with every
    method's reason), and :class:`~planner.errors.InputError` for an unknown method.

    >>> from planner.spec.reading import load_cluster, load_model
    >>> from pathlib import Path
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> rows = compare(load_model(root / "models/llama3-8b.json"),
    ...                load_cluster(root / "clusters/dgx-h100-80gb.json", 1),
    ...                SolveOptions(global_batch_size=64), methods=("heuristic", "grid"))
    >>> [r.method for r in rows], rows[1].step_time_s <= rows[0].step_time_s
    (['heuristic', 'grid'], True)
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InputError(f"--methods: {', '.join(unknown) or 'none given'}: choose from "
                         f"{', '.join(METHODS)}")  # fmt: skip
    results = []
    for method in dict.fromkeys(methods):
        started = time.perf_counter()
        callback = progress(method) if progress is not None else None
        try:
            plan = METHODS[method](model, cluster, options, progress=callback)
        except (InfeasibleError, ConfigError) as exc:
            results.append(MethodResult(method=method, plan=None,
                                        solve_time_s=time.perf_counter() - started,
                                        error=str(exc)))
            continue
        results.append(MethodResult(method=method, plan=plan,
                                    solve_time_s=time.perf_counter() - started))
    if all(r.plan is None for r in results):
        reasons = "; ".join(f"{r.method}: {r.error}" for r in results)
        raise InfeasibleError(f"no method found a plan ({reasons})")
    return results


def compare_frameworks(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions,
    targets: Sequence[str],
    *,
    progress: Callable[[str], ProgressFn | None] | None = None,
) -> list[MethodResult]:
    """The best plan each framework target launches, by the planner's search and the same cost
    model (``any``: per-operator shardings, what no framework's rules restrict), in the order
    given; a target with no plan keeps its row with the reason. Raises
    :class:`~planner.errors.InfeasibleError` only when no target has a plan."""
    if not targets:
        raise InputError("--frameworks: none given")
    results = []
    for target in dict.fromkeys(targets):
        started = time.perf_counter()
        callback = progress(target) if progress is not None else None
        refused = None if target == ANY else profile(target).platform_refusal(cluster.device)
        if refused is not None:
            results.append(MethodResult(method=target, plan=None, solve_time_s=0.0,
                                        error=refused, label="framework"))  # fmt: skip
            continue
        try:
            plan = solve(model, cluster, replace(options, framework=target), progress=callback)
        except (InfeasibleError, ConfigError) as exc:
            results.append(MethodResult(method=target, plan=None,
                                        solve_time_s=time.perf_counter() - started, error=str(exc),

                                        label="framework"))  # fmt: skip
            continue
        results.append(MethodResult(method=target, plan=plan,
                                    solve_time_s=time.perf_counter() - started,
                                    label="framework"))  # fmt: skip
    if all(r.plan is None for r in results):
        reasons = "; ".join(f"{r.method}: {r.error}" for r in results)
        raise InfeasibleError(f"no framework has a plan ({reasons})")
    return results


def best_step_s(results: Sequence[MethodResult]) -> float:
    """The least predicted step time among the methods that found a plan."""
    return min(r.step_time_s for r in results if r.step_time_s is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Yardstick:
    """What a comparison's rows are measured against: the table's last column and the
    picture's ratios divide each row's step by ``step_s``."""

    name: str
    """``any`` (per-operator sharding) or ``best`` (the fastest row)."""
    step_s: float
    """Its predicted seconds per step."""

    def ratio(self, step_s: float) -> float:
        """A row's step over the yardstick's."""
        return step_s / self.step_s

    @property
    def meaning(self) -> str:
        """What ``x any`` or ``x best`` means, in words."""
        over = "any's (per-operator sharding)" if self.name == "any" else "the fastest row's"
        return f"x {self.name}: step over {over}"


def yardstick(results: Sequence[MethodResult]) -> Yardstick:
    """Frameworks are measured against per-operator sharding (``any``) when it is a row with
    a plan, which says what each framework's rules cost; otherwise, and for methods, against
    the fastest row."""
    any_s = next((r.step_time_s for r in results if r.label == "framework"
                  and r.method == "any" and r.step_time_s is not None), None)  # fmt: skip
    if any_s is not None:
        return Yardstick(name="any", step_s=any_s)
    return Yardstick(name="best", step_s=best_step_s(results))


def to_json(results: Sequence[MethodResult]) -> list[dict[str, Any]]:
    """The ``planner compare --json`` list: one object per method, with the plan."""
    best = best_step_s(results)
    out = []
    for r in results:
        p = r.plan.predicted if r.plan is not None else None
        out.append({
            r.label: r.method,
            "summary": r.plan.summary() if r.plan is not None else None,
            "step_time_s": p.step_time_s if p else None,
            "tokens_per_s": p.tokens_per_s if p else None,
            "mfu": p.mfu if p else None,
            "peak_memory_gib": p.peak_memory_gib if p else None,
            "ratio_to_best": p.step_time_s / best if p else None,
            "solve_time_s": r.solve_time_s,
            "error": r.error,
            "plan": r.plan.model_dump(mode="json") if r.plan is not None else None,
        })  # fmt: skip
    return out
