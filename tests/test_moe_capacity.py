"""The capacity factor of routed experts: the stated assumption behind every MoE price. Without
one, routing is taken as balanced and dropless (each expert its share of the tokens); with
one, each expert computes its capacity, padded to it, as Megatron-Core's
``--moe-expert-capacity-factor --moe-pad-expert-input-to-capacity`` runs it, and the exports
say so."""

from __future__ import annotations

import pytest

import planner
from planner.frameworks import profile
from planner.graph import lowered
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ModelSpec
from planner.spec.reading import fill_training
from tests.conftest import REPO

MIXTRAL = REPO / "instances" / "models" / "mixtral-8x7b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"


def capped(model: ModelSpec, factor: float | None) -> ModelSpec:
    """``model`` with its experts' capacity factor set."""
    assert model.moe is not None
    return model.model_copy(update={"moe": model.moe.model_copy(
        update={"capacity_factor": factor})})  # fmt: skip


def expert_ops(model: ModelSpec) -> dict[str, tuple[float, int]]:
    """One microbatch's routed-expert ops of the first MoE layer: FLOPs and output
    elements, by the op's name in the layer."""
    graph, _ = lowered(model, fill_training(model), 1)
    ops = [data["op"] for _, data in graph.nodes(data=True)]
    return {op.name.removeprefix("layer1."): (op.flops, op.output.numel) for op in ops
            if op.name.startswith("layer1.")
            and op.kind in ("expert_linear", "dispatch", "combine")}


def test_capacity_scales_the_experts_work_and_traffic() -> None:
    """Mixtral's 4,096 tokens on 8 experts, top 2: 1,024 a balanced expert; at capacity
    factor 1.25, 1,280 each, so the expert GEMMs' FLOPs and the tokens dispatched grow
    1.25 times and the combine's output (the token's hidden state) does not."""
    model = planner.load_model(MIXTRAL)
    balanced = expert_ops(model)
    padded = expert_ops(capped(model, 1.25))
    for name in ("expert_up", "expert_down"):
        assert padded[name][0] == pytest.approx(1.25 * balanced[name][0], rel=1e-12)
    assert padded["dispatch"][1] == 1.25 * balanced["dispatch"][1]
    assert padded["combine"] == balanced["combine"]


def test_a_step_with_capacity_is_slower_and_exported_as_priced() -> None:
    """The same plan at capacity factor 2 prices more expert compute and all-to-all; Megatron's
    launch pads each expert to that capacity and DeepSpeed's says the factor (1 where the model
    states none: DeepSpeed always drops and pads to a capacity)."""
    model = planner.load_model(MIXTRAL)
    cluster = planner.load_cluster(H100, 8)
    config = ParallelConfig(tp=1, pp=4, ep=8, zero=1, mbs=1, global_batch=256, seq_len=4096)
    plain = planner.estimate(model, cluster, config)
    doubled = planner.estimate(capped(model, 2.0), cluster, config)
    assert doubled.time.compute_s > plain.time.compute_s
    assert doubled.time.expert_parallel_comm_s == pytest.approx(
        2 * plain.time.expert_parallel_comm_s, rel=0.05)  # fmt: skip
    megatron = profile("megatron").launch(resolve(capped(model, 2.0), cluster, config),
                                          capped(model, 2.0)).text  # fmt: skip
    assert "--moe-expert-capacity-factor 2.0" in megatron
    assert "--moe-pad-expert-input-to-capacity" in megatron
    assert "capacity" not in profile("megatron").launch(resolve(model, cluster, config),
                                                        model).text  # fmt: skip
    deepspeed = profile("deepspeed")
    ds_config = config.model_copy(update={"stack": "megatron-deepspeed"})
    assert "--moe-train-capacity-factor 2.0" in deepspeed.launch(
        resolve(capped(model, 2.0), cluster, ds_config), capped(model, 2.0)).text
    assert "--moe-train-capacity-factor 1.0" in deepspeed.launch(
        resolve(model, cluster, ds_config), model).text


def test_the_factor_is_bounded() -> None:
    """A non-positive factor, or one past any expert's whole batch, is refused when read."""
    model = planner.load_model(MIXTRAL)
    for bad in (0.0, -1.0, 100.0):
        with pytest.raises(ValueError, match="capacity_factor"):
            assert model.moe is not None
            type(model.moe).model_validate(model.moe.model_dump() | {"capacity_factor": bad})
