"""The fastest uniform configuration a framework launches, by enumeration.

The answer is the least predicted step time among the configurations that divide and fit, ties
broken by the smallest ``(tp, pp, first, last, cp, ep, vpp, mbs, recompute, zero)``. Two
prunings skip work without changing it: a branch (degrees ``(tp, pp, cp, ep)`` and one layer
split) is dropped when its leanest configuration (no interleaving, the smallest microbatch,
full recomputation, the highest ZeRO stage) does not fit, and within a branch a larger
microbatch is not tried once a smaller one does not fit (activations grow with the microbatch;
1F1B's in-flight count times the microbatch never shrinks).

The plan's ``solver.configurations`` counts the configurations :func:`estimate` priced, once
each: neither the pruned ones nor the ones it refused as not dividing (the batch over
``dp x mbs``, interleaving's microbatches over ``pp``) are counted, and the winner's re-pricing
as a plan is not either. ``solver.time_s`` is the wall time of the whole search. When nothing
fits, the error gives the least memory per device (the leanest branch's) and what would fit
(:func:`planner.uniform.remedies.infeasible_message`).
"""


from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

from planner.errors import ConfigError, TimeLimitError
from planner.options import DEFAULT_OPTIONS, Progress, ProgressFn, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.plan.invariants import check_plan
from planner.plan.schema import Plan, SolverSummary
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import Estimate, estimate
from planner.uniform.failure import nothing_found
from planner.uniform.plan import uniform_plan
from planner.uniform.space import branch_space, config_key
from planner.vocabulary import GIB

Verdict = Literal["fits", "too big", "refused"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Search:
    """The best configuration so far, the leanest one that did not fit, and how many were
    priced; each price gives the next tally."""

    usable_bytes: float
    """What a plan may use of a device (its memory less the margin)."""
    best: tuple[float, tuple[int, ...], ParallelConfig] | None = None
    """The step time, tie-break key and configuration of the fastest that fits."""
    leanest: tuple[float, ParallelConfig] | None = None
    """The peak memory (GiB) and configuration of the leanest that did not fit."""
    first_refusal: str | None = None
    """Why the first configuration that did not divide was refused."""
    priced: int = 0
    """Configurations :func:`estimate` priced (refusals not counted)."""

    @property
    def best_step_s(self) -> float | None:
        """The best step so far (None before one fits)."""
        return None if self.best is None else self.best[0]

    def price(
        self, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig
    ) -> tuple[Verdict, _Search]:
        """Price ``config``: the verdict, and the tally with ``config`` kept if it is the
        best or the leanest so far."""
        try:
            result: Estimate = estimate(model, cluster, config)
        except ConfigError as exc:
            return "refused", replace(self, first_refusal=self.first_refusal or str(exc))
        priced = replace(self, priced=self.priced + 1)
        if result.peak_memory_gib * GIB > self.usable_bytes:
            if self.leanest is None or result.peak_memory_gib < self.leanest[0]:
                priced = replace(priced, leanest=(result.peak_memory_gib, config))
            return "too big", priced
        key = (result.step_time_s, config_key(config), config)
        if self.best is None or key[:2] < self.best[:2]:
            priced = replace(priced, best=key)
        return "fits", priced


def enumerate_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
    method: str = "search",
) -> Plan:
    """The fastest uniform configuration ``options.framework`` launches that fits beside the
    memory margin, every knob not pinned searched, as a plan with the configurations priced
    in ``solver.configurations``.

    Raises :class:`~planner.errors.InfeasibleError` when none fits and
    :class:`~planner.errors.ConfigError` when none even divides. Past
    ``options.time_limit_s`` the best so far is returned with status ``time_limit`` (and no
    gap: the grid has no bound on what it did not price), or a TimeLimitError when none yet.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    work = branch_space(model, cluster, training=training, options=options)
    total = sum(len(group) for _, groups in work for group in groups)
    usable = cluster.device.memory_bytes - options.margin_bytes(cluster.device.memory_gib)
    search = _Search(usable_bytes=usable)
    done = 0
    cut = False
    for leanest, groups in work:
        if options.time_limit_s is not None and (
            time.perf_counter() - started >= options.time_limit_s
        ):
            cut = True
            break
        if progress is not None:
            progress(Progress(done=done, total=total, best_step_s=search.best_step_s,
                              searching=f"TP{leanest.tp} PP{leanest.pp} CP{leanest.cp} "
                                        f"EP{leanest.ep}"))  # fmt: skip
        search = _search_branch(model, cluster, leanest=leanest, groups=groups, search=search)
        done += sum(len(group) for group in groups)
    if progress is not None:
        progress(Progress(done=total, total=total, best_step_s=search.best_step_s))
    if search.best is None and cut:
        raise TimeLimitError(f"the time limit ({options.time_limit_s:g} s) passed after "
                             f"{search.priced} of {total} configurations and none of them "
                             f"fits yet; raise --time-limit")  # fmt: skip
    if search.best is None:
        raise nothing_found(model, cluster, training=training, options=options,
                            leanest=search.leanest,
                            first_refusal=search.first_refusal)
    plan = uniform_plan(model, cluster, search.best[2], method=method,
                        framework=options.framework,
                        memory_margin_gib=options.margin_bytes(cluster.device.memory_gib) / GIB)
    summary = SolverSummary(time_s=time.perf_counter() - started,
                            status="time_limit" if cut else "optimal",
                            objective=plan.predicted.step_time_s,
                            configurations=search.priced)  # fmt: skip
    return check_plan(plan.model_copy(update={"solver": summary}), model)


def _search_branch(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    leanest: ParallelConfig,
    groups: list[list[ParallelConfig]],
    search: _Search,
) -> _Search:
    """Price one branch's groups, pruned as the module says; the leanest is priced once."""
    verdict, search = search.price(model, cluster, leanest)
    if verdict == "too big":
        return search
    for group in groups:
        for config in group:
            if config is leanest:
                continue  # priced above: it fits or does not divide
            verdict, search = search.price(model, cluster, config)
            if verdict == "too big":
                break  # a larger microbatch holds more
    return search
