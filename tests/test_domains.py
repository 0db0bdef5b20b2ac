"""Clusters as they are built (issue 14, item 2): a scale-up domain wider than a node (GB200
NVL72: 72 GPUs in trays of 4), more than two network levels, an oversubscribed spine."""

from __future__ import annotations

import json
import re

import pytest

from planner import cost
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig
from planner.plan.invariants import check_plan
from planner.report.tables import group_spans
from planner.search.targets import solve
from planner.spec import ClusterSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.groups import tp_degrees, within_scale_up
from planner.uniform.plan import uniform_plan
from tests.conftest import CLUSTERS, MODELS

NVL72 = CLUSTERS / "gb200-nvl72.json"
THREE_LEVEL = CLUSTERS / "h100-3level-oversubscribed.json"


def test_a_scale_up_domain_of_whole_nodes_is_accepted_and_a_partial_one_named() -> None:
    nvl72 = load_cluster(NVL72)
    assert (nvl72.devices_per_node, nvl72.scale_up_devices) == (4, 72)
    data = json.loads(NVL72.read_text())
    data["network"][0]["domain_devices"] = 6
    data["network"][1]["domain_devices"] = 32760 - 32760 % 6
    with pytest.raises(ValueError, match=r"network\[0\] \(nvlink5\) is the scale-up domain and "
                                         r"must hold whole nodes: domain_devices 6 is not a "
                                         r"multiple of devices_per_node 4"):  # fmt: skip
        ClusterSpec.model_validate(data)


@pytest.mark.parametrize(("domain", "said"), [
    (72, "network[1].domain_devices 32768 is not a whole multiple of network[0]'s 72 (set it to "
         "a multiple such as 32832)"),
    (96, "network[1].domain_devices 128 is not a whole multiple of network[0]'s 96 (set it to "
         "a multiple such as 192)"),
    (32768, "network[1].domain_devices 32768 is not larger than network[0]'s 32768 (set it to a "
            "multiple such as 65536)"),
])  # fmt: skip
def test_a_level_that_does_not_grow_names_the_outer_size_to_set(domain: int, said: str) -> None:
    """A 72-GPU domain on DGX H100's 32,768-device fabric (a co-design sweep's slip): the
    refusal names the outer level to change and a size that works; it named neither."""
    data = json.loads((CLUSTERS / "dgx-h100-80gb.json").read_text())
    data["network"][0]["domain_devices"] = domain
    if domain == 96:  # a leaf level of 128 beside it: rounded down, 96 itself
        data["network"][1]["domain_devices"] = 128
        data["num_nodes"] = 12
    with pytest.raises(ValueError, match=re.escape(said)):
        ClusterSpec.model_validate(data)


def test_levels_listed_outermost_first_are_named_so() -> None:
    """DGX H100's levels in reverse (the fabric first, the node's NVLink last): the refusal
    says to reverse them, not to grow the node's level to a multiple of the fabric; a
    scale-up domain wider than the fabric is still the slip named above."""
    data = json.loads((CLUSTERS / "dgx-h100-80gb.json").read_text())
    data["network"] = data["network"][::-1]
    with pytest.raises(ValueError, match=re.escape(
            "network levels go innermost first (the scale-up domain, then outwards): "
            "domain_devices [32768, 8] list them outermost first; reverse the levels' order")):
        ClusterSpec.model_validate(data)
    data["network"] = data["network"][::-1]
    data["network"][0]["domain_devices"] = 65536
    with pytest.raises(ValueError, match=r"network\[1\].domain_devices 32768 is not larger"):
        ClusterSpec.model_validate(data)


def test_oversubscription_divides_what_crosses_the_level() -> None:
    """A 7:1 spine gives each device a seventh of its NIC when all send: an all-gather over two
    leaf domains moves its spine share seven times slower than on a non-blocking fabric."""
    blocking = load_cluster(THREE_LEVEL)
    spine = blocking.network[2]
    assert spine.bandwidth_bytes_s == pytest.approx(
        spine.bandwidth_gb_s * 1e9 * spine.efficiency.bandwidth_fraction / 7)
    data = blocking.model_dump()
    data["network"][2]["oversubscription"] = 1.0
    free = ClusterSpec.model_validate(data)
    group = cost.CommGroup(size=2, stride=3072)  # one rank in each of two leaf domains
    nbytes = 1e9
    slow = cost.collective_time_s(blocking, "all_gather", nbytes, group)
    fast = cost.collective_time_s(free, "all_gather", nbytes, group)
    latency = spine.latency_s  # one ring step of two ranks
    assert (slow - latency) == pytest.approx(7 * (fast - latency))


def test_tensor_parallelism_spans_trays_inside_the_rack_and_tiles_it() -> None:
    """On NVL72, TP 8 crosses two trays of 4 over NVLink; a TP x CP group of 16 would straddle
    racks (72 is not a multiple of 16) and is not offered."""
    nvl72 = load_cluster(NVL72)
    llama = load_model(MODELS / "llama3.1-405b.json")
    assert tp_degrees(llama, nvl72) == [1, 2, 4, 8]
    assert within_scale_up(nvl72, tp=8, cp=1) and not within_scale_up(nvl72, tp=4, cp=4)


@pytest.mark.parametrize(("path", "nodes"), [(NVL72, 576), (THREE_LEVEL, 2048)])
def test_llama_405b_plans_keep_tensor_and_context_groups_in_one_domain(path, nodes) -> None:
    """Llama 3.1 405B on 2,304 GB200 and 16,384 H100 on the three-level fabric: the plan is
    valid, and its tensor- and context-parallel groups sit inside one scale-up domain."""
    cluster = load_cluster(path, nodes)
    plan = solve(load_model(MODELS / "llama3.1-405b.json"), cluster, SolveOptions())
    check_plan(plan)
    spans = group_spans(plan)
    for name in ("TP", "CP"):
        if name in spans:
            assert spans[name][2] == 1, (name, spans[name])
    expected = 72 if path == NVL72 else None
    assert plan.cluster.scale_up_devices == expected


@pytest.mark.parametrize(("degrees", "ranks"), [
    # folded: the 8 expert ranks are 4 tensor groups of 2, consecutive: ranks 0-7
    (dict(tp=2, sp=True, ep=8, etp=1), (0, 1, 2, 3, 4, 5, 6, 7)),
    # not folded: one rank of each tensor group, 2 apart: 0, 2, ..., 14 (two nodes)
    (dict(tp=2, sp=True, ep=8), (0, 2, 4, 6, 8, 10, 12, 14)),
    # context ranks first, then data: 4 apart, 0, 4, 8, 12
    (dict(tp=4, sp=True, cp=2, ep=4), (0, 4, 8, 12)),
])
def test_expert_groups_are_megatrons(degrees: dict, ranks: tuple[int, ...]) -> None:
    """A uniform plan's expert-parallel group is the one Megatron-Core's expert RankGenerator
    builds (etp apart from the first rank, in the tensor-context-data order), and the plan's
    summary says how many nodes it spans."""
    model = load_model(MODELS / "mixtral-8x7b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 4)
    config = ParallelConfig(global_batch=256, seq_len=4096, **degrees)
    plan = uniform_plan(model, cluster, config, framework="megatron")
    per_node = plan.cluster.devices_per_node
    assert group_spans(plan)["EP"] == (len(ranks), len({r // per_node for r in ranks}),
                                       len({r // per_node for r in ranks}))  # fmt: skip
    flat = [rank for replica in plan.stages[0].ranks for rank in replica]
    assert flat[:16] == list(range(16))  # the stage's ranks in Megatron's dense order
