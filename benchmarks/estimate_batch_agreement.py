"""`estimate_batch` against `estimate` on N random configurations of EACH bundled model and
cluster (the test, ``tests/test_estimate_batch.py``, draws 6,000 over all the pairs, about
45 each, to stay inside CI's budget). Every ``--json`` key is compared to 1e-9 relative, the
same ``fits``, the same refusals. Prints one row per model with how many configurations were
drawn, priced and refused, and the largest relative difference seen. Run from the repository
root (about 0.5 ms a configuration):

    PYTHONPATH=. python benchmarks/estimate_batch_agreement.py 10000
"""

from __future__ import annotations

import math
import random
import sys
import time

import planner
from planner.errors import ConfigError
from planner.uniform.batch import estimate_batch
from tests.test_estimate_batch import CLUSTERS, MODELS, _flat, random_config


def worst_difference(model, cluster, configs) -> tuple[int, float]:
    """(configurations priced, largest relative difference over every key); raises on a
    disagreement beyond 1e-9 or a different refusal."""
    batch = estimate_batch(model, cluster, configs)
    priced, worst = 0, 0.0
    for i, config in enumerate(configs):
        try:
            want = _flat(planner.estimate(model, cluster, config).to_dict())
        except ConfigError as exc:
            assert batch.refusal(i) == str(exc), (config, batch.refusal(i), exc)
            continue
        priced += 1
        for key, value in want.items():
            got = batch.columns[key][i]
            if isinstance(value, float):
                diff = abs(got - value) / max(abs(value), 1e-300) if value else abs(got)
                assert diff <= 1e-9 or abs(got - value) <= 1e-12, (key, config, got, value)
                worst = max(worst, diff if not math.isnan(diff) else 0.0)
            elif value is not None:
                assert got == value, (key, config, got, value)
    return priced, worst


def main(per_pair: int) -> None:
    """One row per model: drawn, priced, largest relative difference, seconds."""
    rng = random.Random(14)
    print(f"{'model':22s} {'drawn':>8s} {'priced':>8s} {'largest rel. diff':>18s} {'s':>6s}")
    for model_path in MODELS:
        model = planner.load_model(model_path)
        start = time.perf_counter()
        drawn = priced = 0
        worst = 0.0
        for cluster_path in CLUSTERS:
            cluster = planner.load_cluster(cluster_path)
            configs = [random_config(rng, model, cluster) for _ in range(per_pair)]
            n, w = worst_difference(model, cluster, configs)
            drawn, priced, worst = drawn + len(configs), priced + n, max(worst, w)
        print(f"{model.name:22s} {drawn:8,d} {priced:8,d} {worst:18.1e} "
              f"{time.perf_counter() - start:6.0f}")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
