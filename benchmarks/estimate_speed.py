"""How many configurations per second `planner.estimate` and `planner.estimate_batch` price,
side by side, on the same space.

GPT-3 175B (global batch 1536, seq 2048) on 1,024 A100 (dgx-a100-80gb, 128 nodes). The space
is every combination of TP {1,2,4,8} x PP {1,2,4,8,16,32,64} x CP {1,2} (ring, Ulysses) x
microbatch {1,2,4,8} x virtual stages {1,2,3,4,6} x recompute {none, selective, full} x ZeRO
{0..3} x SP x flash attention x the three overlap switches x schedule {1F1B, GPipe} x two
rank orders: 3,440,640 configurations, of which about a fifth divide (Calculon's space for
the same case has about 5.9 million). Every configuration counts, refused ones included: a
sweep prices what it is given.

- ``estimate_batch``: the whole space in chunks of 500,000 columns, from a cold start (its
  layer pricing is the first chunk's), three passes in fresh processes would not change the
  picture; the first (cold) and the median of two more (warm caches) are printed.
- ``estimate``: a random sample of 3,000 configurations of the same space (seed 14), one by
  one, five passes, median; and the largest relative difference between the two on that
  sample (the agreement test, ``tests/test_estimate_batch.py``, checks it to 1e-9).

Run from the repository root (about a minute):

    python benchmarks/estimate_speed.py
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

import planner
from planner.errors import ConfigError
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_from_row

AXES: dict[str, list] = {
    "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16, 32, 64], "cp": [1, 2],
    "cp_algo": ["ring", "ulysses"], "mbs": [1, 2, 4, 8], "vpp": [1, 2, 3, 4, 6],
    "recompute": ["none", "selective", "full"], "zero": [0, 1, 2, 3], "sp": [False, True],
    "flash_attention": [False, True], "overlap_grad_reduce": [False, True],
    "overlap_param_gather": [False, True], "tp_comm_overlap": [False, True],
    "schedule": ["1f1b", "gpipe"], "rank_order": ["tp-cp-ep-dp-pp", "tp-pp-cp-ep-dp"],
}  # fmt: skip
CHUNK = 500_000


def space() -> dict[str, np.ndarray]:
    """Every combination of :data:`AXES`, a column per field."""
    values = [np.array(v, dtype=object if isinstance(v[0], str) else None) for v in AXES.values()]
    grids = np.meshgrid(*values, indexing="ij")
    return {name: grid.ravel() for name, grid in zip(AXES, grids, strict=True)}


def batch_pass(model, cluster, columns: dict[str, np.ndarray]) -> tuple[float, int, int]:
    """Seconds to price every configuration in chunks; how many divide and fit."""
    n = len(columns["tp"])
    start = time.perf_counter()
    divides = fits = 0
    for lo in range(0, n, CHUNK):
        b = estimate_batch(model, cluster, {k: v[lo:lo + CHUNK] for k, v in columns.items()})
        divides += int(b.columns["divides"].sum())
        fits += int(b.columns["fits"].sum())
    return time.perf_counter() - start, divides, fits


def main() -> None:
    """Print both rates and their ratio, and the agreement on the sample."""
    model = planner.load_model("instances/models/gpt3-175b.json")
    cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json")
    columns = space()
    n = len(columns["tp"])
    cold, divides, fits = batch_pass(model, cluster, columns)
    warm = statistics.median(batch_pass(model, cluster, columns)[0] for _ in range(2))
    rng = np.random.default_rng(14)
    sample = rng.choice(n, size=3000, replace=False)
    configs = [config_from_row({k: v[i] for k, v in columns.items()}) for i in sample]
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for config in configs:
            with contextlib.suppress(ConfigError):
                planner.estimate(model, cluster, config)
        rates.append(len(configs) / (time.perf_counter() - start))
    batch = estimate_batch(model, cluster, configs)
    worst = 0.0
    for i, config in enumerate(configs):
        try:
            one = planner.estimate(model, cluster, config)
        except ConfigError:
            continue
        for key in ("step_time_s", "peak_memory_gib", "mfu"):
            want = getattr(one, key)
            worst = max(worst, abs(batch.columns[key][i] - want) / abs(want))
    scalar = statistics.median(rates)
    print(f"gpt3-175b on {cluster.num_devices} x {cluster.device.name}: {n:,} configurations, "
          f"{divides:,} divide, {fits:,} fit")  # fmt: skip
    print(f"{'pricer':28s} {'configurations/s':>18s} {'x estimate':>11s}")
    print(f"{'estimate (one by one)':28s} {scalar:18,.0f} {1:11.0f}")
    print(f"{'estimate_batch, cold start':28s} {n / cold:18,.0f} {n / cold / scalar:11,.0f}")
    print(f"{'estimate_batch, warm':28s} {n / warm:18,.0f} {n / warm / scalar:11,.0f}")
    print(f"largest relative difference on the {len(configs):,}-configuration sample "
          f"(step time, peak memory, MFU): {worst:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
