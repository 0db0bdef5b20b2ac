"""The stage table against a direct enumeration: for every stage and layer range, the fastest
choice (one option per layer kind, one recomputation mode and ZeRO stage for the stage) whose
memory fits beside the stage's in-flight microbatches."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.pipeline.options import LayerOption, stage_table
from planner.spec import ClusterSpec
from planner.spec.reading import load_model
from tests.conftest import MODELS


def option(kind: str, zero: int, mode: str, latency: float, state: float, kept: float,
           working: float = 0.0) -> LayerOption:  # fmt: skip
    # The table reads only the priced numbers, so no solved layer is needed behind them.
    return LayerOption(kind=kind, solution=None, recompute=mode, zero=zero,  # type: ignore[arg-type]
                       latency_s=latency, state_bytes=state, kept_bytes=kept,
                       working_bytes=working)  # fmt: skip


def brute_force(kinds, options, in_flight, fixed, memory, i, a, b) -> float:
    """Least latency of stage ``i`` holding layers ``a..b-1``, trying every choice."""
    p = len(in_flight)
    held = [*dict.fromkeys(kinds[a:b])]
    extras = [k for k, on in (("embedding", i == 0), ("head", i == p - 1)) if on]
    best = math.inf
    for zero, mode in itertools.product(range(4), ("none", "selective", "full")):
        pools = []
        for kind in (*held, *extras):
            want = mode if kind in ("dense", "moe") else "none"
            pools.append([o for o in options[kind] if o.zero == zero and o.recompute == want])
        for combo in itertools.product(*pools):
            lat = mem = working = 0.0
            for o in combo:
                count = kinds[a:b].count(o.kind) if o.kind in held else 1
                lat += count * o.latency_s
                mem += count * (o.state_bytes + in_flight[i] * o.kept_bytes)
                if o.kind in held:
                    working = max(working, o.working_bytes)
            if mem + working <= memory:
                best = min(best, lat + fixed[i])
    return best


@st.composite
def instances(draw: st.DrawFn):
    n = draw(st.integers(1, 5))
    kinds = draw(st.lists(st.sampled_from(["dense", "moe"]), min_size=n, max_size=n))
    number = st.integers(1, 9)
    options = {}
    for kind in (*dict.fromkeys(kinds), "embedding", "head"):
        modes = ("none", "selective", "full") if kind in ("dense", "moe") else ("none",)
        options[kind] = [
            option(kind, zero, mode, draw(number), draw(number), draw(number), draw(number))
            for zero in draw(st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True))
            for mode in modes
            for _ in range(draw(st.integers(1, 2)))
        ]
    p = draw(st.integers(1, n))
    in_flight = [p - i for i in range(p)]
    fixed = [draw(st.integers(0, 3)) / 2 for _ in range(p)]
    memory = draw(st.integers(10, 120))
    return kinds, options, in_flight, fixed, memory


@settings(max_examples=120, deadline=None)
@given(instances())
def test_matches_enumeration(instance) -> None:
    kinds, options, in_flight, fixed, memory = instance
    table = stage_table(kinds, options, in_flight=in_flight, fixed_latency_s=fixed,
                        allowed=None, memory_bytes=memory)  # fmt: skip
    n = len(kinds)
    for i in range(len(in_flight)):
        for a in range(n):
            for b in range(a + 1, n + 1):
                expected = brute_force(kinds, options, in_flight, fixed, memory, i, a, b)
                assert table.latency[i, a, b] == expected
                if math.isfinite(expected):
                    assert table.choice[i, a, b] >= 0
    assert np.isinf(table.latency[:, np.tril_indices(n + 1)[0], np.tril_indices(n + 1)[1]]).all()


def test_memory_forces_recomputation() -> None:
    """Two layers holding 3 microbatches: without recomputation they need 2 x (4 + 3 x 6) = 44
    bytes, with full recomputation 2 x (4 + 3 x 1) + 6 = 20; a budget of 30 picks the latter
    though it is slower, and a budget of 50 the former."""
    options = {
        "dense": [option("dense", 1, "none", 1.0, 4, 6),
                  option("dense", 1, "full", 1.5, 4, 1, working=6)],
        "embedding": [option("embedding", 1, "none", 0.0, 0, 0)],
        "head": [option("head", 1, "none", 0.0, 0, 0)],
    }  # fmt: skip
    for memory, latency in ((30, 3.0), (50, 2.0), (19, math.inf)):
        table = stage_table(["dense", "dense"], options, in_flight=[3], fixed_latency_s=[0.0],
                            allowed=None, memory_bytes=memory)  # fmt: skip
        assert table.latency[0, 0, 2] == latency


@pytest.mark.parametrize("stack", ["megatron-te", "megatron-deepspeed"])
def test_repricing_a_solved_layer_gives_the_ilps_numbers(a100: ClusterSpec, stack: str) -> None:
    """A solved layer taken apart (``LayerSolution.parts``) and priced again for the same
    replicas, microbatches, recomputation and ZeRO stage gives back the ILP's objective and
    memory: time to 0.1 % (the re-pricing buckets each group's gradients into one collective,
    the ILP pays one per weight, so it saves a few latencies), memory to the ILP's KiB
    rounding; on DeepSpeed's stack with its optimizers' gradient accumulation in both."""
    from planner.ilp import LayerQuery, solve_layer
    from planner.pipeline.options import SyncContext, layer_options
    from planner.sharding.layout import LogicalMesh

    gpt3 = load_model(MODELS / "gpt3-175b.json")
    for mesh, budget in (((1, 8), None), ((2, 4), 8.0), ((1, 4), 4.0)):
        query = LayerQuery(kind="dense", mesh=mesh, mesh_micro_batch_size=2, seq_length=2048,
                           memory_budget_gib=budget, in_flight=4, num_microbatches=16,
                           replicas=4, stack=stack)  # fmt: skip
        solution = solve_layer(gpt3, a100, query)
        sync = SyncContext(mesh=LogicalMesh(mesh), replicas=4, num_microbatches=16,
                           precision="bf16", stack=stack)  # fmt: skip
        options = layer_options(solution, a100, sync)
        same = next(o for o in options
                    if (o.recompute, o.zero) == (solution.recompute, solution.zero))  # fmt: skip
        assert same.latency_s == pytest.approx(solution.time_s, rel=1e-3)
        memory = same.state_bytes + 4 * same.kept_bytes + same.working_bytes
        assert memory == pytest.approx(solution.memory_bytes, abs=64 * 1024)
