"""The models people train: Qwen3 dense, Gemma 2/3 and Phi-3 read from their ``config.json``,
their sliding-window layers priced by the window, and each framework launching them or refusing
the feature it does not build.

The configs under tests/data/hf/ are the published ones (see tests/data/hf/SOURCES.md); the
expected counts are the model cards' (Gemma-2-9B 9,241,705,984 parameters, Gemma-2-27B
27,227,128,320, Phi-3-mini 3,821,079,552, Phi-3-medium 13,960,238,080, Qwen3-8B 8.19B,
Qwen3-32B 32.8B) and, exactly, the sum of the layers' matrices written out below.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from planner.errors import InputError
from planner.frameworks import (
    _colossalai_rules,
    deepspeed,
    megatron,
    mindspeed,
    torchtitan,
)
from planner.frameworks import _megatron_model_flags as mmf
from planner.graph import index_layers, lower, parameter_count
from planner.ilp.problem import LayerQuery, layer_graph_of
from planner.plan.config import ParallelConfig, resolve
from planner.plan.inputs import model_hashes
from planner.sharding.assignment import layer_parts
from planner.sharding.uniform import uniform_layer, uniform_parts
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.attention import SlidingWindowSpec
from planner.spec.hf import model_from_hf_config
from planner.spec.reading import load_cluster, load_model
from planner.uniform.batch import estimate_batch
from planner.uniform.estimate import estimate
from planner.uniform.stages import uniform_query, uniform_stage
from tests.conftest import CLUSTERS, HF, REPO, shared
from tests.test_estimate_batch import agree, random_config

DATA = REPO / "tests/data/hf"


def _load(name: str) -> ModelSpec:
    return load_model(DATA / f"{name}.config.json")


def _decoder_params(*, layers: int, hidden: int, heads: int, groups: int, head_dim: int,
                    ffn: int, vocab: int, norms: int, qk_norm: bool, tied: bool) -> int:
    """Gated-MLP, bias-free decoder: Q, K, V and O; gate, up and down; ``norms`` RMSNorm weights
    per layer; per-head q/k norm weights; embedding (and head unless tied); final norm."""
    attention = hidden * head_dim * (heads + 2 * groups) + heads * head_dim * hidden
    per_layer = attention + 3 * hidden * ffn + norms * hidden + 2 * head_dim * qk_norm
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


@pytest.mark.parametrize(
    ("path", "shape", "published"),
    [
        (DATA / "gemma-2-9b.config.json",
         dict(layers=42, hidden=3584, heads=16, groups=8, head_dim=256, ffn=14336,
              vocab=256000, norms=4, qk_norm=False, tied=True), (9_241_705_984, 0)),
        (DATA / "gemma-2-27b.config.json",
         dict(layers=46, hidden=4608, heads=32, groups=16, head_dim=128, ffn=36864,
              vocab=256000, norms=4, qk_norm=False, tied=True), (27_227_128_320, 0)),
        # 27.4B with the SigLIP vision tower; the text decoder alone is 27.01B.
        (DATA / "gemma-3-27b-it.config.json",
         dict(layers=62, hidden=5376, heads=32, groups=16, head_dim=128, ffn=21504,
              vocab=262208, norms=4, qk_norm=True, tied=True), (27.01e9, 0.005e9)),
        (DATA / "Phi-3-mini-4k-instruct.config.json",
         dict(layers=32, hidden=3072, heads=32, groups=32, head_dim=96, ffn=8192,
              vocab=32064, norms=2, qk_norm=False, tied=False), (3_821_079_552, 0)),
        (DATA / "Phi-3-medium-4k-instruct.config.json",
         dict(layers=40, hidden=5120, heads=40, groups=10, head_dim=128, ffn=17920,
              vocab=32064, norms=2, qk_norm=False, tied=False), (13_960_238_080, 0)),
        (shared(HF / "Qwen3-8B.config.json"),
         dict(layers=36, hidden=4096, heads=32, groups=8, head_dim=128, ffn=12288,
              vocab=151936, norms=2, qk_norm=True, tied=False), (8.19e9, 0.005e9)),
        (shared(HF / "Qwen3-32B.config.json"),
         dict(layers=64, hidden=5120, heads=64, groups=8, head_dim=128, ffn=25600,
              vocab=151936, norms=2, qk_norm=True, tied=False), (32.8e9, 0.05e9)),
    ],
)  # fmt: skip
def test_parameter_counts_match_published(path: Path, shape: dict[str, Any],
                                          published: tuple[float, float]) -> None:
    """Exact where the card gives the count, else to the card's last digit."""
    model = load_model(path)
    count = parameter_count(lower(model, TrainingSpec(seq_length=1024, global_batch_size=1)))
    assert count.total == _decoder_params(**shape)
    value, half_digit = published
    assert abs(count.total - value) <= half_digit


def test_gemma_layer_patterns() -> None:
    """Gemma 2: layer i is local when i is even (Gemma2DecoderLayer); Gemma 3: global when
    (i + 1) % 6 == 0, so 27B's 62 layers hold 10 global ones (5, 11, ..., 59)."""
    gemma2, gemma3 = _load("gemma-2-9b"), _load("gemma-3-27b-it")
    assert gemma2.sliding_window == SlidingWindowSpec(window=4096, global_every=2)
    assert [gemma2.sliding_window.is_local(i) for i in range(4)] == [True, False, True, False]
    assert gemma3.sliding_window == SlidingWindowSpec(window=1024, global_every=6)
    index = index_layers(lower(gemma3, TrainingSpec(seq_length=1024, global_batch_size=1)))
    assert index.layers_by_kind["dense"] == tuple(range(6, 63, 6))
    assert len(index.layers_by_kind["local"]) == 52
    phi = _load("Phi-3-mini-4k-instruct")
    assert phi.sliding_window == SlidingWindowSpec(window=2047, global_every=0)
    kinds = index_layers(lower(phi, TrainingSpec(seq_length=4096, global_batch_size=1)))
    assert set(kinds.layers_by_kind) == {"embedding", "dense", "head"}  # all alike: one kind


def test_gemma_features_read() -> None:
    gemma2, gemma3 = _load("gemma-2-27b"), _load("gemma-3-27b-it")
    for model in (gemma2, gemma3):
        assert (model.activation, model.post_norms, model.scale_embeddings,
                model.tie_word_embeddings, model.kv_channels) == ("geglu", True, True, True, 128)
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert (gemma3.attn_logit_softcapping, gemma3.final_logit_softcapping) == (None, None)
    assert (gemma2.qk_layernorm, gemma3.qk_layernorm) == (False, True)


def test_gemma3_nested_text_config_reads_as_the_text_model() -> None:
    data = json.loads((DATA / "gemma-3-27b-it.config.json").read_text())
    nested = model_from_hf_config(data, source="gemma-3-27b-it.config.json")
    flat = model_from_hf_config(data["text_config"], source="gemma-3-27b-it.config.json")
    assert nested == flat
    assert nested.name == "gemma-3-27b-it"
    with pytest.raises(InputError, match=r"text_config: required key 'head_dim' is missing"):
        model_from_hf_config({**data, "text_config": {
            k: v for k, v in data["text_config"].items() if k != "head_dim"}}, source="g.json")


def test_layer_types_must_fit_the_pattern() -> None:
    data = json.loads((DATA / "gemma-2-9b.config.json").read_text())
    types = ["sliding_attention", "full_attention"] * 21
    assert model_from_hf_config({**data, "layer_types": types}, source="g") == \
        model_from_hf_config(data, source="g")  # fmt: skip
    with pytest.raises(InputError, match="layer_types cannot be expressed"):
        model_from_hf_config({**data, "layer_types": types[::-1]}, source="g")


def test_qwen3_sliding_window_refused() -> None:
    data = json.loads(shared(HF / "Qwen3-8B.config.json").read_text())
    with pytest.raises(InputError, match="use_sliding_window=true is not supported"):
        model_from_hf_config({**data, "use_sliding_window": True, "sliding_window": 4096,
                              "max_window_layers": 18}, source="q")  # fmt: skip


def test_key_span_against_pairs_counted() -> None:
    """Half the key span times the sequence is the causal window's query-key pairs (counted one
    by one), to within the diagonal's s / 2 that the s x s convention also drops."""
    for s, w in ((64, 16), (100, 37), (64, 64), (64, 200)):
        pairs = sum(min(i + 1, w) for i in range(s))
        span = SlidingWindowSpec(window=w).key_span(s)
        assert abs(span * s / 2 - pairs) <= s / 2 + w / 2


def test_local_attention_flops_bounded_by_window() -> None:
    """At 8K tokens a 4K window scores 3/4 of the causal square; at 4K it changes nothing."""
    model = _load("gemma-2-9b")
    for seq, ratio in ((8192, 0.75), (4096, 1.0)):
        graph = lower(model, TrainingSpec(seq_length=seq, global_batch_size=1))
        local, full = graph.nodes["layer1.attention"]["op"], graph.nodes["layer2.attention"]["op"]
        assert local.flops == pytest.approx(ratio * full.flops, rel=1e-12)


def _h100() -> ClusterSpec:
    return load_cluster(CLUSTERS / "dgx-h100-80gb.json").with_nodes(1)


def _step_s(model: ModelSpec, seq: int) -> float:
    config = ParallelConfig(tp=8, seq_len=seq, global_batch=8, recompute="full")
    return estimate(model, _h100(), config).step_time_s


def test_window_prices_only_past_it() -> None:
    """A window at least as long as the sequence costs nothing; a shorter one saves step time."""
    model = _load("gemma-2-9b")
    global_only = model.model_copy(update={"sliding_window": None})
    assert _step_s(model, 4096) == pytest.approx(_step_s(global_only, 4096), rel=1e-12)
    assert _step_s(model, 16384) < _step_s(global_only, 16384)


def _refusals(model: ModelSpec) -> dict[str, str | None]:
    resolved = resolve(model, _h100(), ParallelConfig(seq_len=4096, global_batch=64))
    return {"megatron": megatron.layer_architecture(resolved, model),
            "mindspeed": mindspeed.layer_architecture(resolved, model),
            "deepspeed": deepspeed.architecture(resolved, model),
            "colossalai": _colossalai_rules.architecture(resolved, model),
            "torchtitan": torchtitan.model_flavor(resolved, model)}  # fmt: skip


def test_frameworks_launch_or_name_the_missing_feature() -> None:
    gemma = _refusals(_load("gemma-2-9b"))
    assert gemma["megatron"] == ("gemma-2-9b has post-norms (a norm on each block's output, "
                                 "Gemma's), which Megatron-LM does not build")
    assert "post-norms" in str(gemma["mindspeed"]) and "post-norms" in str(gemma["colossalai"])
    assert "none of torchtitan" in str(gemma["torchtitan"])
    phi = _refusals(_load("Phi-3-mini-4k-instruct"))
    assert phi["megatron"] is None
    assert phi["mindspeed"] == ("Phi-3-mini-4k-instruct has sliding-window attention, which "
                                f"MindSpeed on {mindspeed.CORE} does not build")
    assert "sliding-window attention" in str(phi["deepspeed"])
    qwen = _refusals(load_model(shared(HF / "Qwen3-8B.config.json")))
    assert qwen["megatron"] is None and qwen["colossalai"] is None
    assert qwen["torchtitan"] is None
    assert torchtitan.flavor(load_model(shared(HF / "Qwen3-32B.config.json"))).flavor == "32B"


def test_megatron_window_flags() -> None:
    """A causal window of w keys is TE's (w - 1, 0); Gemma 3's 5:1 is --window-attn-skip-freq 6
    (megatron/core/transformer/utils.py:531-545: layer_number % 6 != 0 is local)."""
    phi = _load("Phi-3-mini-4k-instruct")
    assert mmf.window_flags(phi) == [("--window-size", "2046,0")]
    gemma3_like = phi.model_copy(update={"sliding_window": SlidingWindowSpec(window=1024,
                                                                             global_every=6)})
    assert mmf.window_flags(gemma3_like) == [("--window-size", "1023,0"),
                                            ("--window-attn-skip-freq", 6)]
    assert mmf.window_flags(load_model(shared(HF / "Qwen3-8B.config.json"))) == []


def test_plans_made_before_the_new_fields_name_the_same_model() -> None:
    """A plan made before the fields Gemma and Phi-3 added still names its model while they
    are at their defaults: the stored fuzzing plan names gpt-1.7b, not gpt-1.7b with a
    window."""
    stored = json.loads((REPO / "tests/fuzz_plan_ilp.json").read_text())["model"]
    model = load_model(REPO / "instances/models/gpt-1.7b.json")
    assert stored["sha256"] in model_hashes(model)
    windowed = model.model_copy(update={"sliding_window": SlidingWindowSpec(window=1024)})
    assert stored["sha256"] not in model_hashes(windowed)


def test_batch_and_ilp_price_local_layers_as_estimate_does() -> None:
    """The one pricer holds for the sliding-window kind: estimate_batch agrees with estimate on
    random Gemma 2 configurations (pipelines split local and global layers unevenly), and the
    uniform local layer is the ILP's layer at the same strategies."""
    model = _load("gemma-2-9b").model_copy(
        update={"training": TrainingSpec(seq_length=8192, global_batch_size=64)})
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", nodes=4)
    rng = random.Random(25)
    configs = [random_config(rng, model, cluster) for _ in range(60)]
    configs += [ParallelConfig(tp=4, pp=7, sp=True, seq_len=8192, global_batch=64)]
    assert agree(estimate_batch(model, cluster, configs), configs, model, cluster) >= 10
    resolved = resolve(model, cluster, ParallelConfig(tp=4, sp=True, mbs=2, seq_len=8192,
                                                      global_batch=64))
    stage = uniform_stage(resolved)
    parts = {}
    for kind in ("local", "head"):  # the head holds the final soft-cap
        query = uniform_query(resolved, stage, kind)
        uniform = uniform_layer(model, cluster, query)
        names = [n.strategies[0].name for n in uniform.nodes]
        ilp = layer_graph_of(model, cluster, LayerQuery(
            kind=kind, mesh=stage.layout.shape,
            mesh_micro_batch_size=2 * stage.layout.data_ways, seq_length=8192,
            precision=resolved.training.precision))  # fmt: skip
        chosen = [[s.name for s in n.strategies].index(name)
                  for n, name in zip(ilp.nodes, names, strict=True)]  # fmt: skip
        ours, theirs = uniform_parts(model, cluster, query), layer_parts(ilp, chosen)
        for field in dataclasses.fields(ours):
            if field.name != "weights":
                assert getattr(ours, field.name) == pytest.approx(getattr(theirs, field.name),
                                                                  rel=1e-9, abs=0.0), field.name
        parts[kind] = ours
    dense = uniform_parts(model, cluster, uniform_query(resolved, stage, "dense"))
    assert parts["local"].forward_s < dense.forward_s  # at 8K a 4K window leaves 1/4 undone


def test_final_soft_cap_keeps_the_capped_logits() -> None:
    """Gemma 2's c tanh(logits / c) keeps its tanh for the backward: one bf16 tensor of
    batch x sequence x vocabulary more in the head, and none without the cap."""
    model = _load("gemma-2-9b")
    training = TrainingSpec(seq_length=4096, global_batch_size=1)
    head = lower(model, training, micro_batch_size=2).nodes["logit_softcap"]["op"]
    assert head.saved_bytes == 2 * 4096 * 256000 * 2.0
    uncapped = model.model_copy(update={"final_logit_softcapping": None})
    assert "logit_softcap" not in lower(uncapped, training)


def test_gemma2_soft_caps_default_only_when_absent() -> None:
    """Gemma2Config's caps default to 50 and 30; an explicit null turns them off."""
    data = json.loads((DATA / "gemma-2-9b.config.json").read_text())
    absent = {k: v for k, v in data.items() if not k.endswith("softcapping")}
    assert model_from_hf_config(absent, source="g").attn_logit_softcapping == 50.0
    off = model_from_hf_config({**data, "final_logit_softcapping": None}, source="g")
    assert (off.attn_logit_softcapping, off.final_logit_softcapping) == (50.0, None)
