"""The Gantt chart's communication lanes: what the cost model hides and exposes per stage, as
the plan records it and the chart draws it.

The cost model's parts are pinned by identities that hold exactly: turning an overlap on
moves traffic from exposed to hidden and changes nothing else (so exposed + hidden with the
flag equals exposed without it), and ring attention's K/V exchange moves the same bytes
however fast the compute beside it is. The chart is read back from its artists: its lanes'
names, and the stretches whose widths add up to the plan's seconds.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from matplotlib.collections import PolyCollection

from planner.plan.config import ParallelConfig
from planner.plan.schema import Plan, StageTime
from planner.report.comm_lanes import comm_segments, stage_comm
from planner.report.gantt import MAX_LANE_ROWS, gantt_figure
from planner.simulate.events import simulate_plan
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.plan import uniform_plan
from tests.conftest import CLUSTERS, MODELS

NODE = load_cluster(CLUSTERS / "dgx-h100-80gb.json")
"""H100 nodes; their overlap contention is 0, so hidden traffic costs the compute nothing."""


def plan_of(config: ParallelConfig, *, model: str = "llama3-8b.json", nodes: int = 1,
            cluster: ClusterSpec = NODE) -> Plan:  # fmt: skip
    """The uniform plan of ``config`` on ``nodes`` of ``cluster``."""
    return uniform_plan(load_model(MODELS / model),
                        cluster.model_copy(update={"num_nodes": nodes}), config)  # fmt: skip


def test_no_overlap_no_hidden_traffic_and_the_parts_add_up() -> None:
    """Without any overlap nothing hides, and the kinds add up to the stage's communication."""
    plan = plan_of(ParallelConfig(tp=2, pp=2, dp=2, zero=3, mbs=1, global_batch=16, sp=True))
    for s in plan.stages:
        t = s.time
        assert t.attributed_comm_s == pytest.approx(t.communication_s, rel=1e-12)
        assert (t.tensor_parallel_hidden_s, t.context_parallel_hidden_s,
                t.data_parallel_hidden_s, t.grad_reduce_hidden_s,
                t.param_gather_hidden_s) == (0.0, 0.0, 0.0, 0.0, 0.0)  # fmt: skip
        assert t.tensor_parallel_comm_s > 0 and t.data_parallel_comm_s > 0


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_overlapping_data_parallel_traffic_moves_it_from_exposed_to_hidden(zero: int) -> None:
    """ZeRO-1's once-per-step reduction and gather, ZeRO-2/3's per-microbatch
    reduce-scatters (and ZeRO-3's gathers): with --overlap-grad-reduce and
    --overlap-param-gather, exposed + hidden is what was exposed without them."""
    base = ParallelConfig(tp=1, pp=2, dp=4, zero=zero, mbs=1, global_batch=32)
    off = plan_of(base)
    on = plan_of(base.model_copy(update={"overlap_grad_reduce": True,
                                         "overlap_param_gather": True}))  # fmt: skip
    hidden_any = 0.0
    for a, b in zip(off.stages, on.stages, strict=True):
        assert b.time.data_parallel_comm_s + b.time.data_parallel_hidden_s == pytest.approx(
            a.time.data_parallel_comm_s, rel=1e-12)  # fmt: skip
        once_on = b.time.sync_tail_s + b.time.grad_reduce_hidden_s + b.time.param_gather_hidden_s
        assert once_on == pytest.approx(a.time.sync_tail_s, rel=1e-12)
        hidden_any += b.time.data_parallel_hidden_s + b.time.grad_reduce_hidden_s
        assert a.time.tensor_parallel_comm_s == b.time.tensor_parallel_comm_s
    assert hidden_any > 0


def test_tp_comm_overlap_moves_tensor_parallel_traffic_from_exposed_to_hidden() -> None:
    """Megatron's --tp-comm-overlap: the same resharding, part of it behind the matmuls."""
    base = ParallelConfig(tp=8, pp=1, dp=1, mbs=1, global_batch=8, sp=True, recompute="full")
    off, on = plan_of(base), plan_of(base.model_copy(update={"tp_comm_overlap": True}))
    a, b = off.stages[0].time, on.stages[0].time
    assert b.tensor_parallel_hidden_s > 0 and a.tensor_parallel_hidden_s == 0
    assert b.tensor_parallel_comm_s + b.tensor_parallel_hidden_s == pytest.approx(
        a.tensor_parallel_comm_s, rel=1e-9)  # fmt: skip


def test_ring_attention_moves_the_same_bytes_however_fast_the_compute() -> None:
    """Context parallelism over two nodes: on a device 8x faster the ring exposes more of
    its K/V exchange (less compute to hide behind), and exposed + hidden stays the same."""
    config = ParallelConfig(tp=4, cp=4, pp=1, dp=1, mbs=1, global_batch=4, seq_len=16384,
                            zero=1)  # fmt: skip
    device = NODE.device
    fast = NODE.model_copy(update={"device": device.model_copy(update={
        "peak_tflops": {k: v * 8 for k, v in device.peak_tflops.items()}})})  # fmt: skip
    base_t = plan_of(config, nodes=2).stages[0].time
    fast_t = plan_of(config, nodes=2, cluster=fast).stages[0].time
    assert base_t.context_parallel_hidden_s > 0
    assert fast_t.context_parallel_comm_s > base_t.context_parallel_comm_s
    assert (fast_t.context_parallel_comm_s + fast_t.context_parallel_hidden_s
            == pytest.approx(base_t.context_parallel_comm_s + base_t.context_parallel_hidden_s,
                             rel=1e-9))  # fmt: skip


def _drawn(plan: Plan) -> tuple[dict[tuple[int, str, bool], float], list[str], object]:
    """Seconds of each (stage, kind, hidden) the chart draws, read back from its collections'
    rectangles, the collections' labels, and the axes."""
    sim = simulate_plan(plan)
    figure = gantt_figure(sim, comm=stage_comm(plan))
    ax = figure.axes[0]
    unit_s = 1e-3 if sim.step_s < 1.0 else 1.0
    drawn: dict[tuple[int, str, bool], float] = defaultdict(float)
    labels = []
    for collection in ax.collections:
        label = collection.get_label()
        if not isinstance(collection, PolyCollection) or label.startswith("_"):
            continue
        labels.append(label)
        kind, state = label.split()
        for path in collection.get_paths():
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            stage = round(ys.mean())
            drawn[(stage, kind, state == "hidden")] += (xs.max() - xs.min()) * unit_s
    return drawn, labels, ax


def _expected(t: StageTime, m: int) -> dict[tuple[str, bool], float]:
    """What a stage's lanes hold over a step of ``m`` microbatches, from its plan times."""
    return {
        ("TP", False): m * t.tensor_parallel_comm_s, ("TP", True): m * t.tensor_parallel_hidden_s,
        ("CP", False): m * t.context_parallel_comm_s, ("CP", True): m * t.context_parallel_hidden_s,
        ("EP", False): m * t.expert_parallel_comm_s, ("EP", True): m * t.expert_parallel_hidden_s,
        ("DP", False): m * t.data_parallel_comm_s + t.sync_tail_s,
        ("DP", True): m * t.data_parallel_hidden_s + t.grad_reduce_hidden_s
        + t.param_gather_hidden_s,
    }  # fmt: skip


PLANS = {
    "tp2-pp4-sp-zero1": (ParallelConfig(tp=2, pp=4, dp=1, mbs=1, global_batch=16, sp=True,
                                             zero=1), "llama3-8b.json", 1),
    "cp-ring-two-nodes": (ParallelConfig(tp=4, cp=4, pp=1, dp=1, mbs=1, global_batch=4,
                                         seq_len=65536, recompute="full", zero=1),
                          "llama3-8b.json", 2),
    "moe-ep": (ParallelConfig(tp=1, pp=1, dp=8, ep=8, zero=2, mbs=1, global_batch=16,
                              overlap_grad_reduce=True, overlap_param_gather=True),
               "mixtral-8x7b.json", 1),
    "tp-comm-overlap": (ParallelConfig(tp=8, pp=2, dp=1, mbs=1, global_batch=16, sp=True,
                                       tp_comm_overlap=True), "llama3-8b.json", 2),
    "interleaved-dp2-zero3": (ParallelConfig(tp=1, pp=4, vpp=2, dp=2, zero=3, mbs=1,
                                             global_batch=32, overlap_grad_reduce=True,
                                             overlap_param_gather=True),
                              "llama3-8b.json", 1),
}  # fmt: skip


@pytest.mark.parametrize("name", PLANS)
def test_lanes_hold_the_cost_models_seconds(name: str) -> None:
    """Per stage and kind, the widths of the exposed stretches and of the hidden ones add up
    to the plan's seconds over the step (to the float rounding of drawing them); the lanes
    are the kinds that occur, one per kind, named beside each stage."""
    config, model, nodes = PLANS[name]
    plan = plan_of(config, model=model, nodes=nodes)
    drawn, labels, ax = _drawn(plan)
    m = plan.num_microbatches
    kinds = set()
    for s in plan.stages:
        for (kind, hidden), seconds in _expected(s.time, m).items():
            assert drawn.get((s.index, kind, hidden), 0.0) == pytest.approx(
                seconds, rel=1e-9, abs=1e-12), (s.index, kind, hidden)  # fmt: skip
            if seconds > 0:
                kinds.add(kind)
        sends = sum(e.end_s - e.start_s for e in simulate_plan(plan).events
                    if e.stage == s.index and e.phase == "send")  # fmt: skip
        assert drawn.get((s.index, "PP", False), 0.0) == pytest.approx(sends, rel=1e-9)
    if len(plan.stages) > 1:
        kinds.add("PP")
    assert {label.split()[0] for label in labels} == kinds
    lanes = [k for k in ("TP", "CP", "EP", "DP", "PP") if k in kinds]
    assert [t.get_text() for t in ax.get_yticklabels(minor=True)] == lanes * len(plan.stages)


def test_every_case_has_its_kind() -> None:
    """The cases above draw what the picture is for: a CP ring hiding, EP all-to-alls,
    ZeRO-3 gathers hiding, pipeline sends, tensor-parallel traffic behind the matmuls."""
    seen = {}
    for name, (config, model, nodes) in PLANS.items():
        drawn, _, _ = _drawn(plan_of(config, model=model, nodes=nodes))
        seen[name] = {(kind, hidden) for (_, kind, hidden), s in drawn.items() if s > 0}
    assert ("CP", True) in seen["cp-ring-two-nodes"]
    assert ("EP", False) in seen["moe-ep"] and ("DP", True) in seen["moe-ep"]
    assert {("DP", True), ("PP", False)} <= seen["interleaved-dp2-zero3"]
    assert ("TP", True) in seen["tp-comm-overlap"]


def test_a_deep_pipeline_draws_one_lane_of_all_kinds() -> None:
    """Past MAX_LANE_ROWS lanes (stages x kinds) each stage keeps one lane of all kinds, and
    no lane names crowd the axis."""
    plan = plan_of(ParallelConfig(tp=1, pp=32, dp=2, zero=1, mbs=1, global_batch=64),
                   model="gpt3-175b.json", nodes=8)  # fmt: skip
    kinds = {s.kind for s in comm_segments(simulate_plan(plan), stage_comm(plan))}
    assert len(plan.stages) * len(kinds) > MAX_LANE_ROWS
    _, labels, ax = _drawn(plan)
    ys = {round((p.vertices[:, 1].min() - round(p.vertices[:, 1].mean())), 6)
          for c in ax.collections if c.get_label() in labels for p in c.get_paths()}
    assert len(ys) == 1  # every kind in the same lane under its stage
    assert ax.get_yticklabels(minor=True) == []


def test_a_plan_without_the_parts_draws_its_communication_unattributed() -> None:
    """A plan written before the parts were recorded: its communication in one lane of
    collectives, as much as it has."""
    plan = plan_of(ParallelConfig(tp=2, pp=1, dp=4, zero=3, mbs=1, global_batch=16, sp=True))
    fields = ("tensor_parallel_comm_s", "context_parallel_comm_s", "expert_parallel_comm_s",
              "data_parallel_comm_s", "tensor_parallel_hidden_s", "data_parallel_hidden_s")
    old = plan.model_copy(update={"stages": tuple(
        s.model_copy(update={"time": s.time.model_copy(update=dict.fromkeys(fields, 0.0))})
        for s in plan.stages)})  # fmt: skip
    drawn, labels, _ = _drawn(old)
    assert labels == ["other exposed"] or sorted(labels) == ["DP exposed", "other exposed"]
    assert drawn[(0, "other", False)] == pytest.approx(
        plan.num_microbatches * plan.stages[0].time.communication_s, rel=1e-9)  # fmt: skip
