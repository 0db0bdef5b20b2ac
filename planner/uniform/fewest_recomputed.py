"""The search's choice of how many layers recompute: for a configuration that fits with every
layer fully recomputed, the fewest recomputed layers per model chunk that still fit.

Recomputing one more layer of a chunk swaps that layer's kept activations for its input,
never more, and reruns its forward, never nothing: a stage's peak memory does not grow and
its time grows with the count, so the step does (the pipeline's sum and maximum both grow
at least as much as the data-parallel tail can shrink). Over the counts ``1 .. C - 1`` (``C``
the most layers a chunk holds; ``C`` and more recompute every layer, the configuration
already priced) the fastest that fits is therefore the fewest that fits, found by bisection,
``log2 C`` batches instead of ``C`` (``tests/test_recompute_layers.py`` holds it to pricing
every count).
"""

from __future__ import annotations

import numpy as np

from planner.errors import ConfigError
from planner.options import SolveOptions
from planner.plan.chunks import chunk_sizes
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.batch import estimate_batch
from planner.uniform.launched import launched_variant
from planner.vocabulary import GIB


def chunk_layers(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> int:
    """The most decoder layers one model chunk of ``config`` holds (0: it does not divide)."""
    try:
        resolved = resolve(model, cluster, config)
    except ConfigError:
        return 0
    cut = chunk_sizes(resolved.stage_layers, config.vpp, model.mtp_layers)
    return max(max(chunks) for chunks in cut)


def fewest_recomputed(
    model: ModelSpec, cluster: ClusterSpec, configs: list[ParallelConfig], fits: np.ndarray, *,
    steps: np.ndarray, best_s: float, usable_bytes: float, options: SolveOptions,
) -> list[ParallelConfig]:  # fmt: skip
    """For each of ``configs`` that fits (``fits``) with every layer fully recomputed, the
    same with the fewest layers per chunk recomputed that fits in ``usable_bytes`` and that
    ``options.framework`` launches, where fewer than all do; none when the recomputation is
    pinned.

    A configuration whose twin without recomputation is among ``configs`` (its step in
    ``steps``) is passed over when that twin fits or is no faster than ``best_s``: recomputing
    any layer is slower than recomputing none, so it could not win."""
    if options.pins.recompute is not None:
        return []
    twins = {c: (bool(f), float(s)) for c, f, s in zip(configs, fits, steps, strict=True)
             if c.recompute == "none"}  # fmt: skip
    lows, highs, bases = [], [], []
    for config, fit in zip(configs, fits, strict=True):
        if not fit or config.recompute != "full" or config.recompute_layers is not None:
            continue
        twin = twins.get(config.model_copy(update={"recompute": "none"}))
        if twin is not None and (twin[0] or twin[1] >= best_s):
            continue
        most = chunk_layers(model, cluster, config)
        probe = config.model_copy(update={"recompute_layers": 1})
        if most > 1 and launched_variant(probe, model, cluster=cluster,
                                         options=options) == probe:  # fmt: skip
            lows.append(1)
            highs.append(most)  # every layer: known to fit
            bases.append(config)
    low, high = np.array(lows, dtype=np.int64), np.array(highs, dtype=np.int64)
    while (open_ := np.flatnonzero(low < high)).size:
        middle = (low[open_] + high[open_]) // 2
        probes = [bases[i].model_copy(update={"recompute_layers": int(n)})
                  for i, n in zip(open_, middle, strict=True)]  # fmt: skip
        batch = estimate_batch(model, cluster, probes)
        peak = batch.columns["peak_memory_gib"] * GIB
        fit = batch.columns["divides"] & (peak <= usable_bytes)
        high[open_] = np.where(fit, middle, high[open_])
        low[open_] = np.where(fit, low[open_], middle + 1)
    fewest = []
    for base, n, most in zip(bases, high, highs, strict=True):
        # the fewest that fits, or more where the target recomputes only some counts
        # (torchtitan's every n-th block): more recomputed layers fit as well
        for count in range(int(n), most):
            probe = base.model_copy(update={"recompute_layers": count})
            if count == 1 or launched_variant(probe, model, cluster=cluster,
                                              options=options) == probe:  # fmt: skip
                fewest.append(probe)
                break
    return fewest
