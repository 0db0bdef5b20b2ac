"""The zero-bubble schedules (Qi et al., ICLR'24; PyTorch's orders): their closed forms for the
step and the activations held, against the event-driven simulator over many random stage
profiles, and their op orders against PyTorch's by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner import cost
from planner.cost.compute import (
    ELEMENTWISE_BACKWARD_FACTOR,
    compute_time_s,
    executed_flops,
    op_time,
    sharded_bytes,
)
from planner.errors import ConfigError, InputError
from planner.graph import lowered
from planner.options import SolveOptions
from planner.pipeline.zero_bubble import zero_bubble_order
from planner.plan.config import ParallelConfig
from planner.plan.files import plan_from_json
from planner.simulate.events import StageDurations, closed_form_in_flight, simulate, simulate_plan
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.plan import uniform_plan
from planner.uniform.space import grid_space
from planner.vocabulary import ZERO_BUBBLE

ROOT = Path(__file__).resolve().parents[1]

PROFILES = 600
"""Random stage profiles per schedule (the issue asks for at least 500)."""


def _profiles(seed: int, *, v_shape: bool) -> list[tuple[int, int, float, float, float]]:
    """(p, m, F, B, W): 1 to 9 stages, any ``m`` for ZB-H1 (fewer than ``p`` included),
    ``m >= 2p - 1`` for ZB-V; passes of 0 to 5 s, some of them zero or equal."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(PROFILES):
        p = int(rng.integers(1, 10))
        low = 2 * p - 1 if v_shape else 1
        m = int(rng.integers(low, low + 3 * p + 3))
        f, b, w = (float(x) for x in rng.uniform(0.0, 5.0, size=3))
        if k % 10 == 0:
            f = b = w  # Qi et al.'s equal passes
        elif k % 10 == 1:
            w = 0.0  # nothing to move: 1F1B
        out.append((p, m, f, b, w))
    return out


def _simulated(schedule: str, p: int, m: int, f: float, b: float, w: float):
    stages = [StageDurations(forward_s=f, backward_s=b + w, weight_s=w)] * p
    return simulate(stages, num_microbatches=m, schedule=schedule,  # type: ignore[arg-type]
                    virtual_stages=2 if schedule == "zb-v" else 1)  # fmt: skip


@pytest.mark.parametrize(("schedule", "seed"), [("zb-h1", 1), ("zb-v", 2)])
def test_closed_forms_match_the_simulator(schedule: str, seed: int) -> None:
    """Step, bubble and activations held on every stage, exactly (to rounding), over
    :data:`PROFILES` random equal-stage profiles."""
    for p, m, f, b, w in _profiles(seed, v_shape=schedule == "zb-v"):
        sim = _simulated(schedule, p, m, f, b, w)
        bubble = cost.zero_bubble_bubble(schedule, forward_s=f, input_s=b, weight_s=w,  # type: ignore[arg-type]
                                         pp=p, num_microbatches=m)  # fmt: skip
        expected = m * (f + b + w) + bubble
        assert sim.pipeline_s == pytest.approx(expected, rel=1e-12, abs=1e-12), (p, m, f, b, w)
        held = [cost.in_flight_microbatches(schedule, stage=i, pp=p, vpp=1,  # type: ignore[arg-type]
                                            num_microbatches=m) for i in range(p)]  # fmt: skip
        assert list(sim.peak_in_flight) == held, (p, m)


def test_activations_held_for_any_microbatches() -> None:
    """The peak depends on the order alone: ZB-V's ``min(p, m, (m + 1 + i) / 2)`` holds for
    every ``m`` (fewer than ``2p - 1`` too, which the configuration refuses), ZB-H1's
    ``min(p, m)`` likewise."""
    stage = StageDurations(forward_s=1.0, backward_s=2.0, weight_s=1.0)
    for p in range(1, 9):
        for m in range(1, 2 * p + 3):
            for schedule in ZERO_BUBBLE:
                sim = simulate([stage] * p, num_microbatches=m, schedule=schedule,
                               virtual_stages=2 if schedule == "zb-v" else 1)  # fmt: skip
                held = [cost.in_flight_microbatches(schedule, stage=i, pp=p, vpp=1,
                                                    num_microbatches=m)
                        for i in range(p)]  # fmt: skip
                assert list(sim.peak_in_flight) == held, (schedule, p, m)


def test_zero_bubble_known_answers() -> None:
    """F = B = W = 1 s, p = 4, m = 8: 1F1B's bubble is (p - 1)(F + B + W) = 9 s, ZB-H1's
    (p - 1)(F + B - W) = 3 s (Qi et al., Sec. 3.1); ZB-V leaves one half-stage forward per hop,
    1.5 s. ZB-H1 and ZB-V hold p microbatches on every stage, what 1F1B holds on its first."""
    stage = StageDurations(forward_s=1.0, backward_s=2.0, weight_s=1.0)
    one = simulate([stage] * 4, num_microbatches=8, schedule="1f1b")
    h1 = simulate([stage] * 4, num_microbatches=8, schedule="zb-h1")
    v = simulate([stage] * 4, num_microbatches=8, schedule="zb-v", virtual_stages=2)
    assert (one.pipeline_s, h1.pipeline_s, v.pipeline_s) == (33.0, 27.0, 25.5)
    assert h1.peak_in_flight == v.peak_in_flight == (4.0, 4.0, 4.0, 4.0)
    assert one.peak_in_flight[0] == 4.0
    # Without weight gradients to move, ZB-H1 is 1F1B.
    flat = StageDurations(forward_s=1.0, backward_s=2.0)
    assert (simulate([flat] * 4, num_microbatches=8, schedule="zb-h1").pipeline_s
            == simulate([flat] * 4, num_microbatches=8, schedule="1f1b").pipeline_s)


def stage_actions(schedule: str, *, stage: int, pp: int, m: int) -> list[str]:
    """A stage's order as PyTorch's pipelining writes it, ``<virtual stage><F|B|W><microbatch>``
    (its ``I``, the input gradient, written ``B``)."""
    kind, microbatch, _, virtual = zero_bubble_order(schedule, stage=stage, pp=pp, m=m)  # type: ignore[arg-type]
    return [f"{v}{'FBW'[k]}{j}" for k, j, v in zip(kind, microbatch, virtual, strict=True)]


def test_orders_are_pytorchs() -> None:
    """The op orders PyTorch's schedules generate, written out by hand from
    ``torch/distributed/pipelining/schedules.py`` (v2.13.0): ZB-H1 is
    ``ScheduleInterleavedZeroBubble`` with one stage per rank (rank ``i`` delays ``i`` weight
    gradients), ZB-V ``ScheduleZBVZeroBubble`` (rank 0 holds virtual stages 0 and 3 of 4)."""
    assert stage_actions("zb-h1", stage=0, pp=2, m=3) == [
        "0F0", "0F1", "0B0", "0W0", "0F2", "0B1", "0W1", "0B2", "0W2"]
    assert stage_actions("zb-h1", stage=1, pp=2, m=3) == [
        "1F0", "1B0", "1F1", "1B1", "1W0", "1F2", "1B2", "1W1", "1W2"]
    assert stage_actions("zb-v", stage=0, pp=2, m=3) == [
        "0F0", "0F1", "0F2", "3F0", "3B0", "3W0", "3F1", "3B1", "3W1",
        "0B0", "0W0", "3F2", "3B2", "3W2", "0B1", "0W1", "0B2", "0W2"]
    assert stage_actions("zb-v", stage=1, pp=2, m=3) == [
        "1F0", "2F0", "1F1", "2F1", "2B0", "2W0", "1F2", "1B0", "1W0", "2F2", "2B1", "2W1",
        "1B1", "2B2", "1B2", "1W1", "2W2", "1W2"]  # fmt: skip
    for schedule, v in (("zb-h1", 1), ("zb-v", 2)):
        for stage in range(3):
            ops = stage_actions(schedule, stage=stage, pp=3, m=7)
            assert sorted(ops) == sorted({op for op in ops}) and len(ops) == 3 * v * 7


def test_checks() -> None:
    """ZB-V runs exactly two chunks per stage; a weight gradient is part of the backward."""
    stage = StageDurations(forward_s=1.0, backward_s=2.0, weight_s=1.0)
    with pytest.raises(ConfigError, match=r"virtual_stages\(1\) must be 2"):
        simulate([stage] * 2, num_microbatches=4, schedule="zb-v")
    with pytest.raises(ConfigError, match=r"virtual_stages\(2\) must be 1"):
        simulate([stage] * 2, num_microbatches=4, schedule="zb-h1", virtual_stages=2)
    with pytest.raises(InputError, match=r"weight_s\(3.0\) is more than its backward_s"):
        simulate([StageDurations(forward_s=1.0, backward_s=2.0, weight_s=3.0)],
                 num_microbatches=4, schedule="zb-h1")  # fmt: skip


# --------------------------------------------------------------------------- the cost model


def _node() -> tuple[ModelSpec, ClusterSpec]:
    """Llama 3 8B on one DGX H100 node."""
    model = load_model(ROOT / "instances/models/llama3-8b.json")
    node = load_cluster(ROOT / "instances/clusters/dgx-h100-80gb.json")
    return model, node.model_copy(update={"num_nodes": 1})


def test_weight_gradient_is_one_gemm_of_the_backwards_two() -> None:
    """A GEMM with a weight: its weight gradient is the roofline of a GEMM of the forward's
    FLOPs and half the backward's bytes (dW = X^T dY), within the backward; the attention
    core and elementwise ops have none."""
    model, node = _node()
    training = TrainingSpec(global_batch_size=8, seq_length=8192)
    ops = lowered(model, training, 1)[1].ops_by_layer
    seen = set()
    for op in (op for layer in ops.values() for op in layer):
        t = op_time(op, node.device, "bf16", activation_degrees={}, weight_degrees={},
                    compute_degree=1)  # fmt: skip
        assert 0.0 <= t.weight_s <= t.backward_s
        if op.is_gemm and op.weight is not None:
            seen.add("gemm")
            moved = sum(sharded_bytes(x, {}) for x in (*op.inputs, op.output))
            moved += sharded_bytes(op.weight, {})
            flops = executed_flops(op, flash_attention=True)
            want = compute_time_s(node.device, "bf16", flops=flops.backward - flops.forward,
                                  bytes_moved=ELEMENTWISE_BACKWARD_FACTOR * moved / 2)  # fmt: skip
            assert t.weight_s == pytest.approx(min(want, t.backward_s), rel=1e-12)
            assert t.weight_s > 0
        elif op.kind in ("attention", "elementwise", "norm"):
            seen.add(op.kind)
            assert t.weight_s == 0.0 or op.weight is not None
    assert {"gemm", "attention"} <= seen


@pytest.mark.parametrize(("schedule", "vpp"), [("zb-h1", 1), ("zb-v", 2)])
def test_a_plan_prices_its_schedule_at_or_above_its_simulation(schedule: str, vpp: int) -> None:
    """Llama 3 8B, TP2 x PP4, 32 microbatches: the estimate charges every stage as the
    slowest (the head's), so it bounds the simulated step from above, by under 3 %; the
    activations held are the simulator's on every stage; 1F1B's default predictions do not
    move (the weight-gradient seconds sit inside the backward)."""
    model, node = _node()
    config = ParallelConfig(tp=2, pp=4, vpp=vpp, mbs=1, global_batch=32, schedule=schedule)
    plan = uniform_plan(model, node, config)  # type: ignore[arg-type]
    sim = simulate_plan(plan)
    assert plan.schedule.name == schedule
    assert sim.step_s <= plan.predicted.step_time_s <= 1.03 * sim.step_s
    assert list(sim.peak_in_flight) == closed_form_in_flight(plan)
    assert all(0 < s.time.weight_s < s.time.backward_s for s in plan.stages)
    one = uniform_plan(model, node, ParallelConfig(tp=2, pp=4, mbs=1, global_batch=32))
    assert plan.predicted.step_time_s < one.predicted.step_time_s
    backward = [s.time.backward_s for s in plan.stages]
    if schedule == "zb-v":  # the V runs the head's chunk on the first stage
        ends = [s.time.backward_s for s in one.stages]
        assert backward[0] > ends[0] and backward[-1] < ends[-1]
        compute = [[s.time.compute_s for s in p.stages] for p in (plan, one)]
        assert sum(compute[0]) == pytest.approx(sum(compute[1]), rel=1e-12)
    else:
        assert backward == [s.time.backward_s for s in one.stages]


def test_plans_round_trip_and_old_plans_load() -> None:
    """A ZB-V plan reads back as itself; a plan written before weight gradients were priced
    apart (no ``weight_s``) still loads, with none."""
    model, node = _node()
    plan = uniform_plan(model, node, ParallelConfig(tp=2, pp=4, vpp=2, mbs=1, global_batch=32,
                                                    schedule="zb-v"))  # fmt: skip
    assert plan_from_json(plan.to_json()) == plan
    data = json.loads(plan.to_json())
    for stage in data["stages"]:
        del stage["time"]["weight_s"]
    old = plan_from_json(json.dumps(data))
    assert all(s.time.weight_s == 0.0 for s in old.stages)


def test_the_search_offers_them_only_where_launched() -> None:
    """The uniform space holds ZB-H1 and ZB-V configurations for torchtitan, none for
    Megatron-LM, and no ZB-V without interleaving."""
    model, node = _node()
    def offered(**options: object) -> set[str]:
        space = grid_space(model, node, SolveOptions(global_batch_size=32, **options))  # type: ignore[arg-type]
        return {c.schedule for c in space if c.pp > 1}

    assert offered(framework="torchtitan") == {"1f1b", "zb-h1", "zb-v"}
    assert offered(framework="torchtitan", interleaved=False) == {"1f1b", "zb-h1"}
    assert offered(framework="megatron") == {"1f1b"}
