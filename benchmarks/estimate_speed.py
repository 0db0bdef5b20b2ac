"""How many configurations per second `planner.uniform.estimate` prices, through the Python API.

GPT-3 175B (global batch 1536, seq 2048) on 1,024 A100 (dgx-a100-80gb, 128 nodes): every
uniform configuration of TP {1,2,4,8} x PP {1,2,4,8,16,32} x microbatch {1,2,4} x recompute
{none, selective, full} x ZeRO {0,1} x SP {off,on} that divides. Prints the median of five
timed passes over the whole sweep. Run from the repository root:

    python benchmarks/estimate_speed.py
"""

from __future__ import annotations

import itertools
import statistics
import time

import planner
from planner.errors import ConfigError


def sweep() -> list[planner.ParallelConfig]:
    """The configurations to price."""
    configs = []
    for tp, pp, mbs, recompute, zero, sp in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (1, 2, 4), ("none", "selective", "full"), (0, 1),
        (False, True),
    ):
        if sp and tp == 1:
            continue
        configs.append(planner.ParallelConfig(tp=tp, pp=pp, mbs=mbs, recompute=recompute,
                                              zero=zero, sp=sp))  # fmt: skip
    return configs


def main() -> None:
    """Time five passes; print configurations per second (median) and how many fit."""
    model = planner.load_model("instances/models/gpt3-175b.json")
    cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json")
    configs = sweep()
    priced = fits = 0
    rates = []
    for repeat in range(5):
        start = time.perf_counter()
        count = 0
        for config in configs:
            try:
                result = planner.estimate(model, cluster, config)
            except ConfigError:
                continue
            count += 1
            fits += repeat == 0 and result.fits
        rates.append(count / (time.perf_counter() - start))
        priced = count
    print(f"gpt3-175b on {cluster.num_devices} x {cluster.device.name}: {priced} configurations "
          f"priced per pass ({fits} fit in memory)")  # fmt: skip
    print(f"configurations per second: median {statistics.median(rates):,.0f} "
          f"(min {min(rates):,.0f}, max {max(rates):,.0f}) over {len(rates)} passes")  # fmt: skip


if __name__ == "__main__":
    main()
