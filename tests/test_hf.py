"""Hugging Face config translation (planner.spec.hf) and the model instances in instances/models.

The expected values below were read off the reference ``config.json`` files by hand (and, for
the layer placement rules, off transformers' modeling code), not produced by the code under test.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner.errors import InputError
from planner.spec import ModelSpec
from planner.spec.hf import model_from_hf_config
from planner.spec.reading import load_model, model_from_dict
from tests.conftest import CALIBRATION_RUNS, HF, MODELS, shared

LLAMA_SHAPE: dict[str, Any] = {
    "kv_channels": None,
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rope",
    "tie_word_embeddings": False,
    "bias": False,
    "qkv_bias": None,
    "qk_layernorm": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "moe": None,
    "mla": None,
    "training": None,
}


def _moe(experts: int, top_k: int, width: int, **rest: Any) -> dict[str, Any]:
    base = {
        "num_experts": experts,
        "top_k": top_k,
        "ffn_hidden_size": width,
        "shared_experts": 0,
        "shared_ffn_hidden_size": None,
        "first_dense_layers": 0,
        "layer_freq": 1,
        "router_expert_bias": False,
        "router_score_function": None,
        "router_topk_normalized": True,
        "router_topk_scaling_factor": None,
        "router_num_groups": None,
        "router_group_topk": None,
        "capacity_factor": None,  # Hugging Face's MoE configs are dropless
        "expert_load_cv": 0.0,  # and say nothing of the router's spread: taken as balanced
        "router_aux_loss_coeff": None,
    }
    return {**base, **rest}


def _rope(theta: float, epsilon: float, scaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """RoPE's base and scaling and the norm epsilon as the config states them."""
    keys = ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
            "beta_fast", "beta_slow", "mscale", "mscale_all_dim")  # fmt: skip
    full = None if scaling is None else {key: None for key in keys} | scaling
    return {"rotary_base": theta, "norm_epsilon": epsilon, "rope_scaling": full}


_LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int, max_pos: int) -> dict:
    return {
        **LLAMA_SHAPE,
        # Llama 3.1's configs stretch RoPE for 128K tokens; Llama 3's does not.
        **_rope(500000.0, 1e-5, _LLAMA31_SCALING if max_pos == 131072 else None),
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": 8,
        "ffn_hidden_size": ffn,
        "vocab_size": 128256,
        "max_position_embeddings": max_pos,
    }


def _mixtral(name: str, layers: int, hidden: int, heads: int, ffn: int, max_pos: int,
             aux: float) -> dict:
    return {
        **LLAMA_SHAPE,
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": 8,
        "ffn_hidden_size": ffn,
        "vocab_size": 32000,
        "max_position_embeddings": max_pos,
        **_rope(1e6, 1e-5),
        "moe": _moe(8, 2, ffn, router_aux_loss_coeff=aux),
    }


def _qwen3_moe(name: str, layers: int, hidden: int, heads: int, ffn: int, expert: int) -> dict:
    return {
        **LLAMA_SHAPE,
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": 4,
        "kv_channels": 128,
        "ffn_hidden_size": ffn,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "qk_layernorm": True,
        **_rope(1e6, 1e-6),
        "moe": _moe(128, 8, expert, router_topk_normalized=True, router_aux_loss_coeff=0.001),
    }


EXPECTED: dict[str, dict[str, Any]] = {
    "DeepSeek-V3": {
        **LLAMA_SHAPE,
        "name": "DeepSeek-V3",
        "num_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_query_groups": None,
        "ffn_hidden_size": 18432,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        **_rope(10000.0, 1e-6, {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096}),
        "moe": _moe(
            256, 8, 2048, shared_experts=1, shared_ffn_hidden_size=2048, first_dense_layers=3,
            router_expert_bias=True, router_score_function="sigmoid",
            router_topk_scaling_factor=2.5, router_num_groups=8, router_group_topk=4,
        ),
        "mla": {
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
        },
    },
    "Meta-Llama-3-8B-Instruct": _llama3("Meta-Llama-3-8B-Instruct", 32, 4096, 32, 14336, 8192),
    "Meta-Llama-3.1-8B": _llama3("Meta-Llama-3.1-8B", 32, 4096, 32, 14336, 131072),
    "Meta-Llama-3.1-70B": _llama3("Meta-Llama-3.1-70B", 80, 8192, 64, 28672, 131072),
    "Meta-Llama-3.1-405B": _llama3("Meta-Llama-3.1-405B", 126, 16384, 128, 53248, 131072),
    "Mixtral-8x7B-v0.1": _mixtral("Mixtral-8x7B-v0.1", 32, 4096, 32, 14336, 32768, 0.02),
    "Mixtral-8x22B-v0.1": _mixtral("Mixtral-8x22B-v0.1", 56, 6144, 48, 16384, 65536, 0.001),
    "Qwen2.5-72B": {
        **LLAMA_SHAPE,
        "name": "Qwen2.5-72B",
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 29568,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "qkv_bias": True,
        **_rope(1e6, 1e-5),
    },
    "Qwen3-8B": {**_qwen3_moe("Qwen3-8B", 36, 4096, 32, 12288, 0), "moe": None,
                 "num_query_groups": 8, "max_position_embeddings": 40960},
    "Qwen3-32B": {**_qwen3_moe("Qwen3-32B", 64, 5120, 64, 25600, 0), "moe": None,
                  "num_query_groups": 8, "max_position_embeddings": 40960},
    "Qwen3-30B-A3B": _qwen3_moe("Qwen3-30B-A3B", 48, 2048, 32, 6144, 768),
    "Qwen3-235B-A22B": _qwen3_moe("Qwen3-235B-A22B", 94, 4096, 64, 12288, 1536),
    "gpt2": {
        "name": "gpt2",
        "num_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_query_groups": None,
        "kv_channels": None,
        "ffn_hidden_size": 3072,
        "vocab_size": 50257,
        "max_position_embeddings": 1024,
        "activation": "gelu",
        "normalization": "layernorm",
        "position_embedding": "learned",
        "tie_word_embeddings": True,
        "bias": True,
        "qkv_bias": None,
        "qk_layernorm": False,
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        **_rope(10000.0, 1e-5),
        "moe": None,
        "mla": None,
        "training": None,
    },
}

# Instance file -> the reference config it was translated from.
HF_INSTANCES = {
    "llama3-8b": "Meta-Llama-3-8B-Instruct",
    "llama3-70b": "Meta-Llama-3.1-70B",
    "llama3.1-405b": "Meta-Llama-3.1-405B",
    "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "deepseek-v3": "DeepSeek-V3",
}

NARAYANAN_INSTANCES = {
    "gpt-1.7b": "1.7B",
    "gpt-3.6b": "3.6B",
    "gpt-7.5b": "7.5B",
    "gpt-18.4b": "18.4B",
    "gpt-39.1b": "39.1B",
    "gpt-76.1b": "76.1B",
    "gpt-145.6b": "145.6B",
    "gpt-310.1b": "310.1B",
    "gpt-529.6b": "529.6B",
    "gpt-1t": "1008.0B",
}

OTHER_INSTANCES = ["gpt3-175b", "pangu-alpha-2.6b", "pangu-alpha-13b", "pangu-alpha-200b"]
ALL_INSTANCES = sorted([*HF_INSTANCES, *NARAYANAN_INSTANCES, *OTHER_INSTANCES])


def _reference(stem: str) -> dict[str, Any]:
    return json.loads(shared(HF / f"{stem}.config.json").read_text())


def _translate(data: dict[str, Any]) -> ModelSpec:
    return model_from_hf_config(data, source="test.json")


def _llama_config(**changes: Any) -> dict[str, Any]:
    return {**_reference("Meta-Llama-3.1-8B"), **changes}


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def _fields(spec: ModelSpec, expected: dict[str, Any]) -> bool:
    # Only the fields spelled out, so that a new ModelSpec field with a default breaks nothing.
    dumped = spec.model_dump()
    return {key: dumped[key] for key in expected} == expected


def _moe_layers(spec: ModelSpec) -> list[int]:
    return [i for i in range(spec.num_layers) if spec.is_moe_layer(i)]


# --- Reference configs --------------------------------------------------------------------------


def test_every_reference_config_has_an_expectation() -> None:
    files = {p.name.removesuffix(".config.json") for p in shared(HF).glob("*.config.json")}
    assert files == set(EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_reference_config_translates_to_expected_fields(stem: str) -> None:
    expected = EXPECTED[stem]
    spec = load_model(shared(HF / f"{stem}.config.json"))
    assert _fields(spec, expected)


def test_name_comes_from_name_or_path_when_present() -> None:
    spec = _translate(_llama_config(_name_or_path="meta-llama/Llama-3.1-8B"))
    assert spec.name == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(
    ("source", "name"),
    [("dir/Foo.config.json", "Foo"), ("Bar.json", "Bar"), ("weird", "weird")],
)
def test_name_falls_back_to_the_file_name(source: str, name: str) -> None:
    assert model_from_hf_config(_llama_config(), source=source).name == name


# --- Family details -----------------------------------------------------------------------------


def test_llama_without_kv_heads_is_multi_head() -> None:
    spec = _translate(_without(_llama_config(), "num_key_value_heads"))
    assert spec.query_groups == 32


def test_llama_with_biases_everywhere() -> None:
    spec = _translate(_llama_config(attention_bias=True, mlp_bias=True))
    assert spec.bias is True
    assert spec.has_qkv_bias is True


def test_head_dim_becomes_kv_channels() -> None:
    # Mistral-Nemo's shape: 5120 / 32 heads would be 160, the file says 128.
    data = _llama_config(model_type="mistral", hidden_size=5120, head_dim=128)
    assert _translate(data).kv_channels == 128


def test_transformers_5_rope_parameters() -> None:
    """transformers 5 writes RoPE's base and scaling as one ``rope_parameters`` object (one
    per layer type where they differ, the full-attention one the model's): Llama 3.1 8B so
    written reads as its transformers 4 file does (it read base 10000 and no scaling, and
    exported that); beside a disagreeing ``rope_theta`` it is refused."""
    old = _reference("Meta-Llama-3.1-8B")
    params = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    new = _without(_without(old, "rope_theta"), "rope_scaling") | {"rope_parameters": params}
    expected = _translate(old)
    assert expected.rotary_base == 500000 and expected.rope_scaling is not None
    for data in (new, new | {"rope_parameters": {"full_attention": params,
                                                 "sliding_attention": {"rope_theta": 1e4}}},
                 new | {"rope_theta": 500000}):  # fmt: skip
        spec = _translate(data)
        assert (spec.rotary_base, spec.rope_scaling) == (500000, expected.rope_scaling)
    plain = _translate(new | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert (plain.rotary_base, plain.rope_scaling) == (1e6, None)
    with pytest.raises(InputError, match="rope_theta disagree with rope_parameters"):
        _translate(new | {"rope_theta": 10000})
    with pytest.raises(InputError, match="rope_parameters must be an object"):
        _translate(new | {"rope_parameters": 5})
    with pytest.raises(InputError, match="rope_type 'llama4' is none of transformers'"):
        _translate(old | {"rope_scaling": {**old["rope_scaling"], "rope_type": "llama4"}})
    gemma3 = {"model_type": "gemma3", "text_config": None}
    with pytest.raises(InputError, match="keeps its decoder in text_config, an object; got"):
        _translate(gemma3)


def test_mistral_window_covers_every_layer() -> None:
    """Mistral 7B v0.1's sliding_window (4096) masks every layer (transformers'
    MistralAttention), as Phi-3's does: carried, not dropped; null (later checkpoints) is no
    window. A Mixtral config with one is refused by the spec in its own words (local and
    global MoE layers would be one kind), never planned without it."""
    windowed = _translate(_llama_config(model_type="mistral", sliding_window=4096))
    assert windowed.sliding_window is not None and windowed.sliding_window.window == 4096
    assert all(windowed.sliding_window.is_local(i) for i in range(windowed.num_layers))
    assert _translate(_llama_config(model_type="mistral", sliding_window=None)).sliding_window \
        is None
    with pytest.raises(InputError, match=r"^test\.json: sliding_window with moe is not "):
        _translate({**_reference("Mixtral-8x7B-v0.1"), "sliding_window": 4096})


def test_a_check_names_the_keys_the_file_has() -> None:
    """A check over the whole model speaks the config's keys (head_dim, not kv_channels),
    without pydantic's "Value error," or a "(top level)" field."""
    with pytest.raises(InputError, match=r"^test\.json: hidden_size \(4100\) is not divisible "
                                         r"by num_attention_heads \(32\); set head_dim$"):
        _translate(_llama_config(hidden_size=4100))


def test_a_config_without_model_type_says_so() -> None:
    """Hugging Face's keys without model_type are not read as a planner model.json (whose
    error would be "architectures: unknown field")."""
    with pytest.raises(InputError, match=r"^x\.json: a Hugging Face config\.json without "
                                         r"model_type: add"):
        model_from_dict(_without(_llama_config(), "model_type"), source="x.json")


@pytest.mark.parametrize("stem", ["Qwen2.5-72B", "Qwen3-8B", "Qwen3-30B-A3B"])
def test_qwen_window_from_max_window_layers(stem: str) -> None:
    """transformers windows Qwen's layers from ``max_window_layers`` on under
    ``use_sliding_window`` (``layer_types`` where given): refused for Qwen2 and Qwen3's MoE as
    for Qwen3 (they read as unwindowed); a window no layer reaches is no window."""
    data = _reference(stem)
    layers = data["num_hidden_layers"]
    windowed = data | {"use_sliding_window": True, "sliding_window": 4096,
                       "max_window_layers": layers // 2}  # fmt: skip
    with pytest.raises(InputError, match="use_sliding_window=true is not supported"):
        _translate(windowed)
    typed = data | {"layer_types": ["full_attention"] * (layers - 1) + ["sliding_attention"]}
    with pytest.raises(InputError, match="use_sliding_window=true is not supported"):
        _translate(typed)
    unreached = _translate(windowed | {"max_window_layers": layers})
    assert unreached == _translate(data)


def test_qwen2_moe_shared_expert() -> None:
    # Shaped like Qwen1.5-MoE-A2.7B.
    data = {
        "model_type": "qwen2_moe",
        "num_hidden_layers": 24,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "vocab_size": 151936,
        "max_position_embeddings": 8192,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    spec = _translate(data)
    assert spec.qkv_bias is True and spec.bias is False
    assert spec.ffn_hidden_size == 5632
    assert spec.moe is not None
    # Without norm_topk_prob the k weights are the softmax over all experts, not renormalized
    # (Qwen2MoeConfig's default false): Megatron's --moe-router-pre-softmax.
    assert spec.moe.model_dump() == _moe(60, 4, 1408, shared_experts=1, shared_ffn_hidden_size=5632,
                                         router_topk_normalized=False,
                                         router_aux_loss_coeff=0.001)


def _hf_qwen_moe_layers(num_layers: int, step: int, mlp_only: list[int]) -> list[int]:
    # The placement rule of transformers' Qwen2-MoE / Qwen3-MoE decoder layers.
    return [i for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0]


@pytest.mark.parametrize(
    ("step", "mlp_only", "first_dense", "freq"),
    [(1, [], 0, 1), (1, [0, 1], 2, 1), (2, [], 1, 2), (2, [1], 3, 2), (2, [0, 2, 1], 3, 2)],
)
def test_qwen_moe_layer_placement(
    step: int, mlp_only: list[int], first_dense: int, freq: int
) -> None:
    data = _reference("Qwen3-30B-A3B") | {"decoder_sparse_step": step, "mlp_only_layers": mlp_only}
    spec = _translate(data)
    assert spec.moe is not None
    assert (spec.moe.first_dense_layers, spec.moe.layer_freq) == (first_dense, freq)
    assert _moe_layers(spec) == _hf_qwen_moe_layers(48, step, mlp_only)


def test_qwen_moe_without_sparse_layers_is_dense() -> None:
    data = _reference("Qwen3-30B-A3B") | {"mlp_only_layers": list(range(48))}
    spec = _translate(data)
    assert spec.moe is None
    assert spec.ffn_hidden_size == 6144


@pytest.mark.parametrize(("first_k", "freq", "first_dense"), [(3, 1, 3), (3, 2, 4), (0, 3, 0)])
def test_deepseek_moe_layer_placement(first_k: int, freq: int, first_dense: int) -> None:
    data = _reference("DeepSeek-V3") | {"first_k_dense_replace": first_k, "moe_layer_freq": freq}
    spec = _translate(data)
    assert spec.moe is not None
    assert (spec.moe.first_dense_layers, spec.moe.layer_freq) == (first_dense, freq)
    # transformers' rule for DeepSeek-V3 decoder layers.
    assert _moe_layers(spec) == [i for i in range(61) if i >= first_k and i % freq == 0]


@pytest.mark.parametrize(
    ("shared", "experts", "width"), [(2, 2, 4096), (None, 0, None), (0, 0, None)]
)
def test_deepseek_shared_experts_are_one_wide_mlp(
    shared: int | None, experts: int, width: int | None
) -> None:
    spec = _translate(_reference("DeepSeek-V3") | {"n_shared_experts": shared})
    assert spec.moe is not None
    assert (spec.moe.shared_experts, spec.moe.shared_ffn_hidden_size) == (experts, width)


def test_deepseek_without_query_compression() -> None:
    spec = _translate(_reference("DeepSeek-V3") | {"q_lora_rank": None})
    assert spec.mla is not None
    assert spec.mla.q_lora_rank is None


def test_gpt2_defaults_and_overrides() -> None:
    data = _reference("gpt2") | {"n_inner": None, "tie_word_embeddings": False}
    del data["activation_function"]
    spec = _translate(data)
    assert spec.ffn_hidden_size == 4 * 768
    assert spec.tie_word_embeddings is False
    assert spec.activation == "gelu"


# --- Errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["bert", None, ["llama"]])
def test_unsupported_model_type(model_type: Any) -> None:
    data = _llama_config(model_type=model_type)
    with pytest.raises(
        InputError,
        match=r"^test\.json: model_type .* is not supported; supported: deepseek_v2, deepseek_v3, "
        r"gemma2, "
        r"gemma3, gemma3_text, gpt2, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, "
        r"qwen3_moe$",
    ):
        _translate(data)


def test_unknown_model_type_through_load_model_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bert.config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(InputError, match=rf"^{path}: model_type 'bert' is not supported"):
        load_model(path)


@pytest.mark.parametrize(
    ("stem", "key"),
    [
        ("Meta-Llama-3.1-8B", "num_hidden_layers"),
        ("Meta-Llama-3.1-8B", "intermediate_size"),
        ("Mixtral-8x7B-v0.1", "num_local_experts"),
        ("Mixtral-8x7B-v0.1", "num_key_value_heads"),
        ("Qwen3-30B-A3B", "moe_intermediate_size"),
        ("DeepSeek-V3", "kv_lora_rank"),
        ("DeepSeek-V3", "q_lora_rank"),
        ("DeepSeek-V3", "first_k_dense_replace"),
        ("gpt2", "n_positions"),
    ],
)
def test_missing_key(stem: str, key: str) -> None:
    with pytest.raises(InputError, match=rf"^test\.json: required key '{key}' is missing$"):
        _translate(_without(_reference(stem), key))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_size", "4096", r"hidden_size must be an integer, got '4096'"),
        ("num_hidden_layers", 32.0, r"num_hidden_layers must be an integer, got 32\.0"),
        ("num_hidden_layers", True, r"num_hidden_layers must be an integer, got True"),
        ("num_hidden_layers", None, r"num_hidden_layers must be an integer, got None"),
        ("tie_word_embeddings", "no", r"tie_word_embeddings must be true or false, got 'no'"),
        ("attention_dropout", "0.1", r"attention_dropout must be a number, got '0\.1'"),
        ("hidden_act", 3, r"hidden_act must be a string, got 3"),
    ],
)
def test_wrong_type(key: str, value: Any, message: str) -> None:
    with pytest.raises(InputError, match=rf"^test\.json: {message}$"):
        _translate(_llama_config(**{key: value}))


def test_wrong_type_in_a_list() -> None:
    data = _reference("Qwen3-30B-A3B") | {"mlp_only_layers": [0, "1"]}
    with pytest.raises(InputError, match=r"mlp_only_layers must be an integer, got '1'"):
        _translate(data)


def test_heads_not_divisible_by_kv_heads() -> None:
    with pytest.raises(
        InputError,
        match=r"^test\.json: num_attention_heads \(32\) is not "
        r"divisible by num_key_value_heads \(5\)$",
    ):
        _translate(_llama_config(num_key_value_heads=5))


def test_sizes_modelspec_rejects_are_reported_by_field() -> None:
    with pytest.raises(InputError, match=r"^test\.json: hidden_size: .*greater than 0"):
        _translate(_llama_config(hidden_size=0))


def test_top_k_above_experts() -> None:
    with pytest.raises(InputError, match=r"^test\.json: moe: .*top_k \(2\) > num_experts \(1\)"):
        _translate(_reference("Mixtral-8x7B-v0.1") | {"num_local_experts": 1})


def test_mlp_only_layers_that_are_not_a_prefix() -> None:
    data = _reference("Qwen3-30B-A3B") | {"mlp_only_layers": [5]}
    with pytest.raises(InputError, match=r"mlp_only_layers \[5\] cannot be expressed"):
        _translate(data)


@pytest.mark.parametrize(
    ("stem", "key"), [("Qwen3-30B-A3B", "decoder_sparse_step"), ("DeepSeek-V3", "moe_layer_freq")]
)
def test_zero_moe_frequency(stem: str, key: str) -> None:
    with pytest.raises(InputError, match=rf"{key} must be a positive integer, got 0"):
        _translate(_reference(stem) | {key: 0})


@pytest.mark.parametrize(("attention", "mlp"), [(True, False), (False, True)])
def test_llama_mixed_biases_are_rejected(attention: bool, mlp: bool) -> None:
    with pytest.raises(InputError, match=r"mlp_bias=.* is not supported: ModelSpec has one bias"):
        _translate(_llama_config(attention_bias=attention, mlp_bias=mlp))


@pytest.mark.parametrize("stem", ["Qwen3-30B-A3B", "DeepSeek-V3"])
def test_attention_bias_is_rejected_where_the_mlp_has_none(stem: str) -> None:
    with pytest.raises(InputError, match=r"attention_bias=true is not supported"):
        _translate(_reference(stem) | {"attention_bias": True})


def test_non_silu_gated_activation_is_rejected() -> None:
    with pytest.raises(InputError, match=r"hidden_act 'gelu' is not supported for model_type"):
        _translate(_llama_config(hidden_act="gelu"))


def test_gpt2_unknown_activation_is_rejected() -> None:
    with pytest.raises(InputError, match=r"activation_function 'relu' is not supported"):
        _translate(_reference("gpt2") | {"activation_function": "relu"})


def test_non_object_config() -> None:
    with pytest.raises(InputError, match=r"^test\.json: expected a JSON object, got list$"):
        model_from_hf_config([], source="test.json")  # type: ignore[arg-type]


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_damaged_configs_give_input_error_or_a_model(stem: str) -> None:
    # Whatever one key is deleted or replaced with, only InputError may escape.
    original = _reference(stem)
    for key in original:
        for damage in ("delete", None, "x", -1, [1], {"a": 1}, 1.5):
            data = copy.deepcopy(original)
            if damage == "delete":
                del data[key]
            else:
                data[key] = damage
            with contextlib.suppress(InputError):
                _translate(data)


# --- Instance files -----------------------------------------------------------------------------


def test_instance_directory_holds_exactly_the_listed_models() -> None:
    assert sorted(p.stem for p in MODELS.glob("*.json")) == ALL_INSTANCES


@pytest.mark.parametrize("stem", ALL_INSTANCES)
def test_instance_loads_with_its_name_and_training(stem: str) -> None:
    spec = load_model(MODELS / f"{stem}.json")
    assert spec.name == stem
    assert spec.training is not None


@pytest.mark.parametrize(("stem", "reference"), sorted(HF_INSTANCES.items()))
def test_hf_instance_matches_its_reference_config(stem: str, reference: str) -> None:
    instance = load_model(MODELS / f"{stem}.json")
    translated = load_model(shared(HF / f"{reference}.config.json"))
    skip = {"name", "training"}
    assert instance.model_dump(exclude=skip) == translated.model_dump(exclude=skip)


@pytest.mark.parametrize(
    ("stem", "seq", "batch"),
    [
        ("llama3-8b", 8192, 512),
        ("llama3-70b", 8192, 1024),
        ("llama3.1-405b", 8192, 2048),
        ("mixtral-8x7b", 4096, 256),
        ("deepseek-v3", 4096, 15360),
    ],
)
def test_hf_instance_training(stem: str, seq: int, batch: int) -> None:
    training = load_model(MODELS / f"{stem}.json").training
    assert training is not None
    assert training.model_dump() == {
        "seq_length": seq,
        "global_batch_size": batch,
        "precision": "bf16",
    }


GPT_STYLE = {
    "num_query_groups": None,
    "kv_channels": None,
    "activation": "gelu",
    "normalization": "layernorm",
    "position_embedding": "learned",
    "tie_word_embeddings": True,
    "bias": True,
    "qkv_bias": None,
    "qk_layernorm": False,
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "moe": None,
    "mla": None,
}


@pytest.mark.parametrize(("stem", "size"), sorted(NARAYANAN_INSTANCES.items()))
def test_narayanan_instance_matches_calibration_record(stem: str, size: str) -> None:
    runs = {run["id"]: run for run in json.loads(shared(CALIBRATION_RUNS).read_text())}
    run = runs[f"narayanan21_t1_{size}"]
    model = run["model"]
    spec = load_model(MODELS / f"{stem}.json")
    assert _fields(
        spec,
        {
            **GPT_STYLE,
            "num_layers": model["layers"],
            "hidden_size": model["hidden"],
            "num_attention_heads": model["heads"],
            "ffn_hidden_size": model["ffn_hidden"],
            "vocab_size": model["vocab"],
            "max_position_embeddings": 2048,
        },
    )
    assert spec.training is not None
    assert spec.training.model_dump() == {
        "seq_length": model["seq_len"],
        "global_batch_size": run["parallel"]["global_batch"],
        "precision": "fp16",
    }


@pytest.mark.parametrize(
    ("stem", "layers", "hidden", "heads", "ffn", "vocab", "seq", "batch", "precision"),
    [
        ("gpt3-175b", 96, 12288, 96, 49152, 51200, 2048, 1536, "bf16"),
        ("pangu-alpha-2.6b", 32, 2560, 40, 10240, 40000, 1024, 1024, "fp16"),
        ("pangu-alpha-13b", 40, 5120, 40, 20480, 40000, 1024, 1024, "fp16"),
        ("pangu-alpha-200b", 64, 16384, 128, 65536, 40000, 1024, 1024, "fp16"),
    ],
)
def test_gpt_style_instance(
    stem: str,
    layers: int,
    hidden: int,
    heads: int,
    ffn: int,
    vocab: int,
    seq: int,
    batch: int,
    precision: str,
) -> None:
    spec = load_model(MODELS / f"{stem}.json")
    assert _fields(
        spec,
        {
            **GPT_STYLE,
            "num_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "ffn_hidden_size": ffn,
            "vocab_size": vocab,
            "max_position_embeddings": seq,
        },
    )
    assert spec.training is not None
    assert spec.training.model_dump() == {
        "seq_length": seq,
        "global_batch_size": batch,
        "precision": precision,
    }
