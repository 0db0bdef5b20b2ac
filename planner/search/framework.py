"""The fastest uniform configuration a framework launches, by enumeration.

The answer is the least predicted step time (or, with ``options.objective``, the least step time
at that quantile of its error band: :mod:`planner.cost.risk`) among the configurations that
divide and fit, ties
broken by the smallest ``(tp, pp, first, last, cp, ep, vpp, mbs, recompute, zero,
recompute_layers)``. Every configuration of the space is priced, and beside each that fits
with full recomputation the fewest layers per chunk recomputed that still fit
(:mod:`planner.uniform.fewest_recomputed`), by :func:`~planner.uniform.batch.estimate_batch` (the
cost model of :func:`~planner.uniform.estimate.estimate`, over arrays), a few thousand at a
time: whole branches (degrees ``(tp, pp, cp, ep)`` and one layer split), so that a time limit
stops between them. When none fits, the optimizer-offloaded variants of those that fit only
without their optimizer states are priced, where the framework launches them and the cluster
has host figures (:func:`~planner.uniform.launched.offload_variants`): offload is chosen only
where it is the only way to fit.

The plan's ``solver.configurations`` counts the configurations priced: those the batch
refused as not dividing (the batch over ``dp x mbs``, interleaving's microbatches over ``pp``)
are not counted, nor the bisection's probes of recomputed layers (only the fewest that fit),
and the winner's re-pricing as a plan is not either. ``solver.time_s`` is the
wall time of the whole search. When nothing fits, the error gives the least memory per device
and what would fit (:func:`planner.uniform.leanest.infeasible_message`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from planner import cost
from planner.cost.risk import objective_column, objective_s
from planner.errors import TimeLimitError
from planner.options import DEFAULT_OPTIONS, Progress, ProgressFn, SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.plan.invariants import check_plan
from planner.plan.schema import Plan, SolverSummary
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.batch import BatchEstimate, estimate_batch
from planner.uniform.failure import nothing_found
from planner.uniform.fewest_recomputed import fewest_recomputed
from planner.uniform.launched import offload_variants, offloads
from planner.uniform.plan import uniform_plan
from planner.uniform.space import branch_space, config_key
from planner.uniform.stages import host_fits
from planner.vocabulary import GIB, Objective

CHUNK = 4096
"""Configurations priced per batch: whole branches up to about this many."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Search:
    """The best configuration so far, the leanest one that did not fit, and how many were
    priced; each batch gives the next tally."""

    usable_bytes: float
    """What a plan may use of a device (its memory less the margin)."""
    objective: Objective = "expected"
    """What configurations are ranked by (:mod:`planner.cost.risk`)."""
    best: tuple[float, tuple[int, ...], ParallelConfig] | None = None
    """The :attr:`objective`'s step time, tie-break key and configuration of the best that
    fits."""
    leanest: tuple[float, ParallelConfig] | None = None
    """The peak memory (GiB) and configuration of the leanest that did not fit."""
    first_refusal: str | None = None
    """Why the first configuration that did not divide was refused."""
    priced: int = 0
    """Configurations priced (refusals not counted)."""
    offloadable: tuple[ParallelConfig, ...] = ()
    """Configurations that might fit without their optimizer states and gradients: their
    offloaded variants are priced if nothing fits without offload."""

    @property
    def best_step_s(self) -> float | None:
        """The best step so far, as :attr:`objective` counts it (None before one fits)."""
        return None if self.best is None else self.best[0]

    def price(self, model: ModelSpec, cluster: ClusterSpec, configs: list[ParallelConfig],
              options: SolveOptions | None = None) -> _Search:  # fmt: skip
        """The tally with ``configs`` priced (:meth:`tally`); with ``options``, also each
        fitting full recomputation's fewest recomputed layers that fit
        (:func:`~planner.uniform.fewest_recomputed.fewest_recomputed`), and the configurations
        that fit only without their optimizer states kept, whose offloaded variants are priced
        should nothing fit (:func:`~planner.uniform.launched.offload_variants`)."""
        batch = estimate_batch(model, cluster, configs)
        found = self.tally(batch, configs)
        if options is None:
            return found
        if found.best is not None:
            fewer = fewest_recomputed(model, cluster, configs, self.fits(batch),
                                      steps=objective_column(batch.columns, self.objective),
                                      best_s=found.best[0], usable_bytes=self.usable_bytes,
                                      options=options)  # fmt: skip
            if fewer:
                found = found.price(model, cluster, fewer)
        if not offloads(cluster, options):
            return found
        c = batch.columns
        peak = c["peak_memory_gib"]
        # At most the optimizer states and the gradients leave, with the allocator's slack on
        # them: Megatron's offload moves the first, DeepSpeed's ZeRO-Offload both (its states
        # then kept in Megatron's layout: the held bf16 gradients of BF16_Optimizer go too).
        # A bound, so that no variant that would fit is dropped; the variants are priced.
        freed = (c["memory.optimizer_gib"] + c["memory.gradients_gib"]) * GIB
        offloaded = peak - (freed + cost.allocator_slack_bytes(cluster.device, freed)) / GIB
        lighter = (c["divides"] & (peak * GIB > self.usable_bytes)
                   & (offloaded * GIB <= self.usable_bytes))
        kept = tuple(configs[i] for i in np.flatnonzero(lighter))
        return replace(found, offloadable=found.offloadable + kept)

    def fits(self, batch: BatchEstimate) -> np.ndarray:
        """Which of ``batch`` divide and fit: the device's memory beside the margin, and the
        node's host memory what its devices offload."""
        c = batch.columns
        host = c["host_memory_gib"] * GIB
        return (c["divides"] & (c["peak_memory_gib"] * GIB <= self.usable_bytes)
                & host_fits(batch.cluster, host))

    def tally(self, batch: BatchEstimate, configs: list[ParallelConfig]) -> _Search:
        """The tally with ``batch`` (of ``configs``) priced: the fastest that fits (ties to
        the smallest :func:`config_key`), the fastest as :attr:`objective` counts, the leanest
        that does not (ties to the first)."""
        divides = batch.columns["divides"]
        peak = batch.columns["peak_memory_gib"]
        step = objective_column(batch.columns, self.objective)
        fits = self.fits(batch)
        big = divides & ~fits
        found = replace(self, priced=self.priced + int(divides.sum()))
        if self.first_refusal is None and not divides.all():
            found = replace(found, first_refusal=batch.refusal(int(np.argmin(divides))))
        if big.any():
            i = int(np.flatnonzero(big)[np.argmin(peak[big])])
            if found.leanest is None or peak[i] < found.leanest[0]:
                found = replace(found, leanest=(float(peak[i]), configs[i]))
        if fits.any():
            least = np.min(step[fits])
            tied = np.flatnonzero(fits & (step == least))
            key = min(((float(least), config_key(configs[i]), configs[i]) for i in tied),
                      key=lambda k: k[:2])  # fmt: skip
            if found.best is None or key[:2] < found.best[:2]:
                found = replace(found, best=key)
        return found


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
    usable = options.usable_bytes(cluster.device, training.stack)
    search = _Search(usable_bytes=usable, objective=options.objective)
    done = 0
    cut = False
    for chunk, named in _chunks(work):
        if options.time_limit_s is not None and (
            time.perf_counter() - started >= options.time_limit_s
        ):
            cut = True
            break
        if progress is not None:
            progress(Progress(done=done, total=total, best_step_s=search.best_step_s,
                              searching=named))  # fmt: skip
        search = search.price(model, cluster, chunk, options)
        done += len(chunk)
    if search.best is None and not cut:
        # Offload only where it is the only way to fit: its CPU Adam is priced at the host's
        # peak memory bandwidth, a lower bound, not to be traded against a device-only plan.
        variants = offload_variants(model, cluster, search.offloadable, options=options)
        for start in range(0, len(variants), CHUNK):
            chunk = variants[start : start + CHUNK]
            # The leanest that does not fit stays the device-only one the message describes.
            search = replace(search.tally(estimate_batch(model, cluster, chunk), chunk),
                             leanest=search.leanest)
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
                        memory_margin_gib=options.margin_bytes(cluster.device,
                                                                 training.stack) / GIB)
    summary = SolverSummary(time_s=time.perf_counter() - started,
                            status="time_limit" if cut else "optimal",
                            objective=objective_s(plan.predicted.step_time_s,
                                                  plan.predicted.error_band, options.objective),
                            ranked_by=options.objective, configurations=search.priced)  # fmt: skip
    return check_plan(plan.model_copy(update={"solver": summary}), model)


def _chunks(
    work: list[tuple[ParallelConfig, list[list[ParallelConfig]]]],
) -> Iterator[tuple[list[ParallelConfig], str]]:
    """Whole branches, about :data:`CHUNK` configurations at a time, each with the degrees of
    its first branch (what the progress line names)."""
    chunk: list[ParallelConfig] = []
    named = ""
    for leanest, groups in work:
        if not chunk:
            named = f"TP{leanest.tp} PP{leanest.pp} CP{leanest.cp} EP{leanest.ep}"
        chunk.extend(config for group in groups for config in group)
        if len(chunk) >= CHUNK:
            yield chunk, named
            chunk = []
    if chunk:
        yield chunk, named
