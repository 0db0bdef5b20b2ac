"""Activation memory per layer against Korthikanti et al., "Reducing Activation Recomputation
in Large Transformer Models" (MLSys'23), Table 2, for their GPT-3 175B / 530B / 1T at TP 8.

Per layer, 16-bit activations with dropout, s = 2048, b = 1, t = 8:
no SP ``sbh(10 + 24/t + 5as/(ht))``; SP ``sbh(34/t + 5as/(ht))``; selective ``sbh(10 + 24/t)``;
SP + selective ``sbh(34/t)``; full recomputation ``2sbh`` (Megatron keeps the SP shard, 2sbh/t).
"""

from __future__ import annotations

import pytest

from planner import cost
from planner.plan.config import ParallelConfig, resolve
from planner.sharding.uniform import uniform_parts
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.stages import uniform_query, uniform_stage

S, B, T = 2048, 1, 8
MODELS = {  # name: (layers, hidden, heads), Korthikanti Table 3
    "gpt3-175b": (96, 12288, 96),
    "mt-nlg-530b": (105, 20480, 128),
    "gpt-1t": (128, 25600, 160),
}


def _model(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name="gpt", num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        vocab_size=51200, max_position_embeddings=S, hidden_dropout=0.1, attention_dropout=0.1,
    )  # fmt: skip


def _layer_bytes(model: ModelSpec, cluster: ClusterSpec, **knobs: object) -> float:
    config = ParallelConfig(tp=T, mbs=B, global_batch=cluster.num_devices, seq_len=S,
                            precision="bf16", flash_attention=False, **knobs)  # type: ignore[arg-type]
    resolved = resolve(model, cluster, config)
    query = uniform_query(resolved, uniform_stage(resolved), "dense")
    parts = uniform_parts(model, cluster, query)
    return parts.kept_bytes[parts.mode(resolved.config.recompute)]


def _formula(hidden: int, heads: int, variant: str) -> float:
    sbh, a, h, t, s = S * B * hidden, heads, hidden, T, S
    return sbh * {
        "tp": 10 + 24 / t + 5 * a * s / (h * t),
        "tp+sp": 34 / t + 5 * a * s / (h * t),
        "tp+selective": 10 + 24 / t,
        "tp+sp+selective": 34 / t,
        "full": 2,
        "full+sp": 2 / t,
    }[variant]


KNOBS = {
    "tp": {"sp": False, "recompute": "none"},
    "tp+sp": {"sp": True, "recompute": "none"},
    "tp+selective": {"sp": False, "recompute": "selective"},
    "tp+sp+selective": {"sp": True, "recompute": "selective"},
    "full": {"sp": False, "recompute": "full"},
    "full+sp": {"sp": True, "recompute": "full"},
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("variant", KNOBS)
def test_layer_activations_match_korthikanti(name: str, variant: str, a100: ClusterSpec) -> None:
    """The graph's saved tensors, sharded as Megatron shards them, add up to the paper's
    formula exactly (all quantities are whole bytes)."""
    layers, hidden, heads = MODELS[name]
    got = _layer_bytes(_model(layers, hidden, heads), a100, **KNOBS[variant])
    assert got == _formula(hidden, heads, variant)


def test_first_stage_holds_all_layers_under_1f1b() -> None:
    """Korthikanti Sec. 4.2.3: with 1F1B, stage 0 of p holds p microbatches of L/p layers,
    i.e. the activations of all L layers, whatever p is."""
    for p in (2, 4, 8, 16, 64):
        in_flight = cost.in_flight_microbatches("1f1b", stage=0, pp=p, vpp=1,
                                                num_microbatches=4 * p)  # fmt: skip
        assert in_flight * (96 / p) == 96


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (8, 3), (16, 4)])
def test_interleaving_factor(p: int, v: int) -> None:
    """Korthikanti Sec. 4.2.3: interleaving multiplies stage 0's memory by 1 + (p-1)/(p v)."""
    in_flight = cost.in_flight_microbatches("1f1b", stage=0, pp=p, vpp=v,
                                            num_microbatches=8 * p)  # fmt: skip
    assert in_flight / p == pytest.approx(1 + (p - 1) / (p * v))


def test_stage_memory_decreases_along_the_pipeline() -> None:
    """1F1B: stage i of p holds p - i microbatches; GPipe holds all m on every stage."""
    got = [cost.in_flight_microbatches("1f1b", stage=i, pp=4, vpp=1, num_microbatches=16)
           for i in range(4)]  # fmt: skip
    assert got == [4, 3, 2, 1]
    assert cost.in_flight_microbatches("gpipe", stage=3, pp=4, vpp=1, num_microbatches=16) == 16
