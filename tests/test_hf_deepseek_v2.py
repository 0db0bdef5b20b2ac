"""DeepSeek-V2 and V2-Lite from their ``config.json``: read as DeepSeek's own modeling builds them
(V3's layer with softmax routing, not renormalized, and no routing bias), counted to the
published sizes, and launched or refused by each framework as its source says.

The configs under tests/data/hf/ are quoted from public code (tests/data/hf/SOURCES.md). The
published sizes: DeepSeek-V2 236B parameters, 21B active a token; V2-Lite 15.7B and 2.4B
(DeepSeek's model cards; the active counts leave the input embedding out, a lookup).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner.errors import InputError
from planner.frameworks import _colossalai_models as cai
from planner.frameworks import torchtitan as tt
from planner.frameworks._megatron_model_flags import router_flags
from planner.graph import lower, parameter_count
from planner.spec import ModelSpec, TrainingSpec
from planner.spec.hf import model_from_hf_config
from planner.spec.reading import load_model
from tests.conftest import REPO
from tests.framework_cases import load, without_mtp
from tests.test_framework_torchtitan import configure, expected, launched, read_back

DATA = REPO / "tests/data/hf"


def _config(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.config.json").read_text())


def _model(name: str) -> ModelSpec:
    return load_model(DATA / f"{name}.config.json")


@pytest.mark.parametrize(("name", "total", "active"),
                         [("DeepSeek-V2", (235.5e9, 236.5e9), (20.5e9, 21.5e9)),
                          ("DeepSeek-V2-Lite", (15.65e9, 15.75e9), (2.4e9, 2.5e9))])  # fmt: skip
def test_sizes_match_the_model_cards(name: str, total: tuple[float, float],
                                     active: tuple[float, float]) -> None:
    """The cards' figures to their last digit (V2-Lite's 2.4B active is 2.45B cut, not
    rounded: its 26 MoE layers of 83 M active, one dense of 81 M and the 0.21 B head); a wrong
    expert width, shared-expert count, dense prefix or query compression moves them by more."""
    model = _model(name)
    count = parameter_count(lower(model, TrainingSpec(seq_length=4096, global_batch_size=1)))
    assert total[0] <= count.total < total[1]
    assert active[0] <= count.active - model.vocab_size * model.hidden_size < active[1]


def test_v2_routing_is_read_as_its_gate_runs() -> None:
    """V2: softmax over 160 experts, the top 6 of the best 3 of 8 groups, weights scaled by 16
    and not renormalized. V2-Lite's greedy top-k has no groups, and its config leaves
    ``topk_method`` and ``scoring_func`` at DeepseekV2Config's defaults (greedy, softmax)."""
    v2, lite = _model("DeepSeek-V2"), _model("DeepSeek-V2-Lite")
    assert v2.moe is not None and lite.moe is not None
    routing = ("router_score_function", "router_topk_normalized", "router_topk_scaling_factor",
               "router_num_groups", "router_group_topk", "router_expert_bias")
    assert [getattr(v2.moe, k) for k in routing] == ["softmax", False, 16.0, 8, 3, False]
    assert [getattr(lite.moe, k) for k in routing] == ["softmax", False, 1.0, None, None, False]
    assert (v2.moe.first_dense_layers, v2.moe.shared_ffn_hidden_size) == (1, 2 * 1536)
    assert lite.mla is not None and lite.mla.q_lora_rank is None
    assert v2.mtp_layers == lite.mtp_layers == 0
    # The same config under V3's reader routes as V3's gate: sigmoid, renormalized, x2.5.
    as_v3 = model_from_hf_config(_config("DeepSeek-V2-Lite") | {"model_type": "deepseek_v3"},
                                 source="t.json")
    assert as_v3.moe is not None and as_v3.moe.router_topk_scaling_factor == 1.0


def test_v2_weights_are_renormalized_or_scaled_and_balanced_by_its_loss() -> None:
    """DeepSeek-V2's gate renormalizes the top-k weights with ``norm_topk_prob`` and scales
    them otherwise, never both (the export kept the x16 beside the renormalization); a model
    without the routing bias trains with its balancing loss, ``aux_loss_alpha`` (the export
    left it at Megatron's 0)."""
    normalized = model_from_hf_config(_config("DeepSeek-V2") | {"norm_topk_prob": True},
                                      source="t.json").moe
    assert normalized is not None
    assert (normalized.router_topk_normalized, normalized.router_topk_scaling_factor) == (
        True, 1.0)
    moe = _model("DeepSeek-V2").moe
    assert moe is not None and moe.router_aux_loss_coeff == 0.001


@pytest.mark.parametrize(("change", "message"), [
    ({"topk_method": "noaux_tc"}, r"topk_method 'noaux_tc' is not supported; supported: "
                                  r"greedy, group_limited_greedy$"),
    ({"n_group": None}, r"topk_method 'group_limited_greedy' needs n_group and topk_group"),
    ({"scoring_func": "sigmoid"}, r"scoring_func 'sigmoid' is not supported; DeepSeek-V2's "
                                  r"gate scores with softmax$"),
])  # fmt: skip
def test_v2_routing_it_does_not_run_is_refused(change: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=r"^t\.json: " + message):
        model_from_hf_config(_config("DeepSeek-V2") | change, source="t.json")


def test_megatron_routes_v2_with_softmax_before_the_top_k() -> None:
    """Unrenormalized softmax weights are Megatron-Core's pre-softmax routing
    (``moe_utils.py:900-914``), with V2's groups and scale."""
    flags = dict(router_flags(_model("DeepSeek-V2").moe))  # type: ignore[arg-type]
    assert flags == {"--moe-router-pre-softmax": None, "--moe-router-topk-scaling-factor": 16.0,
                     "--moe-router-num-groups": 8, "--moe-router-group-topk": 3,
                     "--moe-aux-loss-coeff": 0.001}


@pytest.mark.parametrize(("name", "flavor"), [("DeepSeek-V2-Lite", "16B"),
                                              ("DeepSeek-V2", "236B")])  # fmt: skip
def test_torchtitan_launches_v2_as_its_deepseek_flavors(name: str, flavor: str) -> None:
    """torchtitan v0.2.2 registers V2-Lite's and V2's shapes as deepseek_v3 16B and 236B
    (``deepseek_v3/__init__.py:78-129``); its MoEArgs keep the expert bias
    (``load_balance_coeff`` 1e-3, ``moe.py:38``), which the notes say V2 does not have."""
    model = _model(name)
    split = {"last_stage_layers": model.num_layers // 2} if model.num_layers % 2 else {}
    resolved = configure(model, 64, pp=2, ep=8, zero=1, overlap_param_gather=True,
                         global_batch=256, seq_len=4096, recompute="full", **split)
    toml = launched(resolved, model)
    assert toml["model"] == {"name": "deepseek_v3", "flavor": flavor}
    assert read_back(toml, 64) == expected(resolved)
    (differs,) = [n for n in tt.PROFILE.launch(resolved, model).notes if "differs from" in n]
    assert "(the flavor's softmax not renormalized" in differs
    assert differs.endswith(", expert bias)")


def test_colossalai_builds_deepseek_v3_only_with_v3s_gate() -> None:
    """Colossal-AI trains DeepSeek through the checkpoint's own modeling_deepseek.py
    (``auto_policy.py:170-176``), whose MoEGate raises for any scoring but sigmoid and any
    top-k method but noaux_tc: V2's routing is no architecture it builds."""
    assert cai.family(_model("DeepSeek-V2")) is None
    assert cai.family(_model("DeepSeek-V2-Lite")) is None
    assert cai.family(without_mtp("DeepSeek-V3")) == "deepseek_v3"
    assert cai.family(load("deepseek-v3")) == "deepseek_v3"
