"""The input limits of :mod:`planner.spec.limits`: each one's message names the file, the field (as
the file spells it), the value given, the limit and why; the largest real inputs stay inside;
and the ways a file can be unreadable (too big, too deep, an integer too long, NaN) are each
one InputError."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from planner.cli.app import check_options, option_error
from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.plan.files import plan_from_json
from planner.spec import limits as lim
from planner.spec.hf import model_from_hf_config
from planner.spec.reading import json_schema, load_cluster, load_model, model_from_dict, read_json
from tests.conftest import CLUSTERS, HF, MODELS, shared

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "tests" / "fuzz_plan_uniform.json"


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``data`` with the field at ``dotted`` (``moe.num_experts``, ``network.1.latency_us``)
    set to ``value``."""
    out = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return out


def _above(
    source: str, field: str, value: int | float, limit: int | float, *, shown: str = ""
) -> str:
    """The message for ``value`` of ``field`` (dotted) past ``limit``, as a regular expression;
    ``shown`` is how the message names the field, if not as ``field``."""
    why = lim.reason(field.rsplit(".", 1)[-1])
    message = f"{source}: {shown or field}: {value} is above the limit of {limit} ({why})"
    return re.escape(message) + r"( \(and \d+ more\))?$"


# --------------------------------------------------------------------------- model.json

MODEL_LIMITS = [
    ("gpt3-175b", "num_layers", lim.MAX_LAYERS),
    ("gpt3-175b", "hidden_size", lim.MAX_HIDDEN_SIZE),
    ("gpt3-175b", "num_attention_heads", lim.MAX_ATTENTION_HEADS),
    ("llama3-70b", "num_query_groups", lim.MAX_ATTENTION_HEADS),
    ("gpt3-175b", "kv_channels", lim.MAX_HEAD_DIM),
    ("gpt3-175b", "ffn_hidden_size", lim.MAX_FFN_HIDDEN_SIZE),
    ("gpt3-175b", "vocab_size", lim.MAX_VOCAB_SIZE),
    ("gpt3-175b", "max_position_embeddings", lim.MAX_SEQ_LENGTH),
    ("gpt3-175b", "training.seq_length", lim.MAX_SEQ_LENGTH),
    ("gpt3-175b", "training.global_batch_size", lim.MAX_GLOBAL_BATCH_SIZE),
    ("mixtral-8x7b", "moe.num_experts", lim.MAX_EXPERTS),
    ("mixtral-8x7b", "moe.ffn_hidden_size", lim.MAX_FFN_HIDDEN_SIZE),
    ("deepseek-v3", "moe.shared_experts", lim.MAX_EXPERTS),
    ("deepseek-v3", "mla.kv_lora_rank", lim.MAX_HIDDEN_SIZE),
    ("deepseek-v3", "mla.qk_rope_head_dim", lim.MAX_HEAD_DIM),
    ("deepseek-v3", "mtp_layers", lim.MAX_MTP_LAYERS),
]


@pytest.mark.parametrize(("stem", "field", "limit"), MODEL_LIMITS,
                         ids=[f"{s}-{f}" for s, f, _ in MODEL_LIMITS])  # fmt: skip
def test_model_limit_message(stem: str, field: str, limit: int) -> None:
    """One past the limit: the file, the field, the value, the limit and why, on one line."""
    data = _with(_json(MODELS / f"{stem}.json"), field, limit + 1)
    with pytest.raises(InputError, match=_above("m.json", field, limit + 1, limit)):
        model_from_dict(data, source="m.json")


def test_a_model_at_the_limits_is_accepted() -> None:
    """The limits are inclusive: 256 layers, a 1M vocabulary, 2^25 positions and sequences."""
    data = _json(MODELS / "llama3-8b.json") | {
        "num_layers": lim.MAX_LAYERS,
        "vocab_size": lim.MAX_VOCAB_SIZE,
        "max_position_embeddings": lim.MAX_SEQ_LENGTH,
    }
    data["training"] |= {"seq_length": lim.MAX_SEQ_LENGTH,
                         "global_batch_size": lim.MAX_GLOBAL_BATCH_SIZE}  # fmt: skip
    assert model_from_dict(data).num_layers == lim.MAX_LAYERS


def test_every_bundled_input_is_inside_the_limits() -> None:
    """The bundled models and clusters all load."""
    for path in sorted(MODELS.glob("*.json")):
        load_model(path)
    for path in sorted(CLUSTERS.glob("*.json")):
        load_cluster(path)


def test_every_reference_config_is_inside_the_limits() -> None:
    """The published Hugging Face configs all load."""
    paths = sorted(shared(HF).glob("*.json"))
    assert paths
    for path in paths:
        load_model(path)


@pytest.mark.parametrize(
    ("value", "needle"),
    [(True, "expected a number, got true"), (float("nan"), "finite number, got nan"),
     (float("inf"), "finite number, got inf"), (1e308, "got 1e+308"), ("x", "got 'x'"),
     (2.5, "must be a whole number, got 2.5"), ([96], "got [96]")],
    ids=["true", "nan", "inf", "1e308", "text", "fraction", "list"],
)  # fmt: skip
def test_wrong_number_names_the_field_and_the_value(value: Any, needle: str) -> None:
    """A number that is not one (a bool, NaN, a float for an integer, text) is refused with
    the value quoted."""
    data = _json(MODELS / "gpt3-175b.json") | {"num_layers": value}
    with pytest.raises(InputError, match=r"^m\.json: num_layers: .*" + re.escape(needle)):
        model_from_dict(data, source="m.json")


def test_nan_in_a_float_field_is_refused() -> None:
    """NaN passes ``ge=0`` in Python; the models refuse it outright."""
    data = _json(MODELS / "gpt3-175b.json") | {"hidden_dropout": float("nan")}
    with pytest.raises(InputError, match=r"hidden_dropout: Input should be a finite number"):
        model_from_dict(data, source="m.json")


@pytest.mark.parametrize("name", ["a\nb", "", "x" * 300])
def test_a_name_is_one_printable_line(name: str) -> None:
    """Names appear in messages: a newline would break the CLI's one line."""
    data = _json(MODELS / "gpt3-175b.json") | {"name": name}
    with pytest.raises(InputError, match=r"^m\.json: name: "):
        model_from_dict(data, source="m.json")


def test_an_odd_key_is_quoted_in_the_message() -> None:
    """An unknown key holding a newline is quoted, so the message stays one line."""
    data = _json(MODELS / "gpt3-175b.json") | {"a\nb": 1}
    with pytest.raises(InputError, match=r"^m\.json: 'a\\nb': unknown field$"):
        model_from_dict(data, source="m.json")


# --------------------------------------------------------------------------- config.json


@pytest.mark.parametrize(
    ("stem", "key", "field", "limit"),
    [("Meta-Llama-3.1-8B", "num_hidden_layers", "num_layers", lim.MAX_LAYERS),
     ("Meta-Llama-3.1-8B", "intermediate_size", "ffn_hidden_size", lim.MAX_FFN_HIDDEN_SIZE),
     ("Meta-Llama-3.1-8B", "vocab_size", "vocab_size", lim.MAX_VOCAB_SIZE),
     ("gpt2", "n_embd", "hidden_size", lim.MAX_HIDDEN_SIZE),
     ("gpt2", "n_positions", "max_position_embeddings", lim.MAX_SEQ_LENGTH),
     ("Mixtral-8x7B-v0.1", "num_local_experts", "moe.num_experts", lim.MAX_EXPERTS),
     ("DeepSeek-V3", "n_routed_experts", "moe.num_experts", lim.MAX_EXPERTS),
     ("Qwen3-30B-A3B", "moe_intermediate_size", "moe.ffn_hidden_size", lim.MAX_FFN_HIDDEN_SIZE)],
)  # fmt: skip
def test_hf_limit_names_the_key_as_the_file_spells_it(
    stem: str, key: str, field: str, limit: int
) -> None:
    """A config.json past a limit names its own key and the ModelSpec field it became."""
    data = _json(shared(HF / f"{stem}.config.json")) | {key: limit + 1}
    shown = field if key == field else f"{key} (read as {field})"
    with pytest.raises(InputError, match=_above("c.json", field, limit + 1, limit, shown=shown)):
        model_from_hf_config(data, source="c.json")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [("num_hidden_layers", -3, "num_hidden_layers (read as num_layers): Input should be "
      "greater than 0, got -3"),
     ("num_hidden_layers", 10**40, "num_hidden_layers (read as num_layers): "
      "10000000000000000000000000000000000000000 is above the limit of 256"),
     ("attention_dropout", float("nan"), "attention_dropout: Input should be a finite number"),
     ("num_attention_heads", [32], "num_attention_heads must be an integer, got [32]"),
     ("hidden_act", "x" * 500, "hidden_act 'xxxxxxxx")],
)  # fmt: skip
def test_hf_bad_values_name_the_key(key: str, value: Any, needle: str) -> None:
    """Negative, huge, NaN or mistyped values of a config.json name the key (and quote long
    values cut short)."""
    data = _json(shared(HF / "Meta-Llama-3.1-8B.config.json")) | {key: value}
    with pytest.raises(InputError, match=r"^c\.json: " + re.escape(needle)) as caught:
        model_from_hf_config(data, source="c.json")
    assert len(str(caught.value)) < 200


# --------------------------------------------------------------------------- cluster.json


def test_cluster_limit_on_devices(tmp_path: Path) -> None:
    """Nodes x devices per node past 2^20 is refused with the arithmetic and the reason."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_json(CLUSTERS / "dgx-a100-80gb.json") | {"num_nodes": 200_000}))
    with pytest.raises(InputError, match=re.escape(
        "num_nodes(200000) x devices_per_node(8) = 1600000 devices is above the limit of "
        f"1048576 ({lim.reason('num_devices')})"
    )):  # fmt: skip
        load_cluster(path)


@pytest.mark.parametrize("nodes", [200_000, 0, -1])
def test_nodes_override_is_checked(nodes: int) -> None:
    """``--nodes`` (``ClusterSpec.with_nodes``) keeps to the same limit and must be positive."""
    needle = "is above the limit of 1048576" if nodes > 0 else "must be a positive integer"
    with pytest.raises(InputError, match=rf"^--nodes .*{needle}"):
        load_cluster(CLUSTERS / "dgx-a100-80gb.json", nodes=nodes)


@pytest.mark.parametrize(
    ("field", "limit"),
    [("devices_per_node", lim.MAX_DEVICES_PER_NODE),
     ("device.memory_gib", lim.MAX_DEVICE_MEMORY_GIB),
     ("device.peak_tflops.bf16", lim.MAX_PEAK_TFLOPS)],
)  # fmt: skip
def test_cluster_field_limits(field: str, limit: float) -> None:
    """A device or node past what any hardware has is refused by field."""
    from planner.spec import ClusterSpec
    from planner.spec.messages import describe_validation_error

    data = _with(_json(CLUSTERS / "dgx-a100-80gb.json"), field, limit * 2)
    with pytest.raises(ValidationError) as caught:
        ClusterSpec.model_validate(data)
    message = describe_validation_error("c.json", caught.value)
    assert message.startswith(f"c.json: {field}: {limit * 2} is above the limit of {limit}")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("device.memory_gib", 81920, "; GiB, not MiB: 80"),
     ("device.efficiency.gemm.max_fraction", 70, "got 70; a fraction, not a percent: 0.7"),
     ("network.1.efficiency.bandwidth_fraction", 92, "a fraction, not a percent: 0.92"),
     ("device.platform", "rocm", "(a device of another vendor leaves it out: then no "
      "framework is refused on it)")],
)  # fmt: skip
def test_a_value_in_another_unit_says_which(field: str, value: Any, needle: str) -> None:
    """Memory written in MiB and a fraction written as a percent name the value meant; a
    platform the planner does not know says how to write another vendor's device."""
    from planner.spec import ClusterSpec
    from planner.spec.messages import describe_validation_error

    data = _with(_json(CLUSTERS / "dgx-h100-80gb.json"), field, value)
    with pytest.raises(ValidationError) as caught:
        ClusterSpec.model_validate(data)
    assert describe_validation_error("c.json", caught.value).endswith(needle)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("network", [], "network: needs at least 1 item(s), got 0"),
     ("network", {"name": "nvlink"}, "network: must be a list [...], got an object"),
     ("device", [], "device: must be an object {...}, got a list"),
     ("device.memory_gib", None, "device.memory_gib: Input should be a valid number, got null")],
)  # fmt: skip
def test_a_value_of_the_wrong_shape_is_said_in_jsons_words(field: str, value: Any,
                                                           said: str) -> None:  # fmt: skip
    """A list where an object goes, an object where a list goes, an empty list of levels, a
    null: said as the file holds them, not as Python's types ("a valid dictionary or
    instance of DeviceSpec", "got None")."""
    from planner.spec import ClusterSpec
    from planner.spec.messages import describe_validation_error

    data = _with(_json(CLUSTERS / "dgx-h100-80gb.json"), field, value)
    with pytest.raises(ValidationError) as caught:
        ClusterSpec.model_validate(data)
    assert describe_validation_error("c.json", caught.value) == f"c.json: {said}"


@pytest.mark.parametrize("text", ["", " \n"])
def test_an_empty_file_is_said_to_be_empty(text: str, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(InputError, match=r"c.json: the file is empty \(no JSON in it\)$"):
        load_cluster(path)


# --------------------------------------------------------------------------- plans


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("global_batch_size", 200_000, "global_batch_size 200000 is above the limit of 131072"),
     ("num_microbatches", 200_000, "num_microbatches 200000 is above the limit of 131072"),
     ("seq_length", 2**26, "seq_length 67108864 is above the limit of 33554432")],
)  # fmt: skip
def test_plan_limits(field: str, value: int, needle: str) -> None:
    """A plan file past a limit is refused before anything walks its microbatches."""
    text = json.dumps(_json(PLAN) | {field: value})
    with pytest.raises(InputError, match=r"^p\.json: " + re.escape(needle)):
        plan_from_json(text, source="p.json")


def test_plan_not_an_object() -> None:
    with pytest.raises(InputError, match=r"^p\.json: expected a JSON object, got list$"):
        plan_from_json("[]", source="p.json")


# --------------------------------------------------------------------------- files


def test_file_larger_than_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file past MAX_INPUT_BYTES is refused before it is parsed (/dev/zero would not end)."""
    monkeypatch.setattr(lim, "MAX_INPUT_BYTES", 100)
    path = tmp_path / "big.json"
    path.write_text(" " * 101)
    with pytest.raises(InputError, match=r"larger than the limit of 100 bytes"):
        read_json(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read"),
     ('{"num_layers": ' + "9" * 5000 + "}", "invalid JSON: Exceeds the limit (4300 digits)"),
     ('{\n "a": 1,\n "b": }', "invalid JSON at line 3, column 7"),
     ("", "the file is empty (no JSON in it)")],
    ids=["deep", "long-int", "syntax", "empty"],
)  # fmt: skip
def test_unreadable_json(text: str, needle: str, tmp_path: Path) -> None:
    """Every way json.loads can fail is one InputError naming the file."""
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(f"{path}: {needle}")):
        read_json(path)


def test_binary_and_folders_are_refused(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_bytes(bytes(range(256)))
    with pytest.raises(InputError, match=r"not a text file"):
        read_json(tmp_path / "b.json")
    with pytest.raises(InputError, match=r"cannot read \(Is a directory\)"):
        read_json(tmp_path)


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """Editors on Windows write one; it is not part of the JSON."""
    path = tmp_path / "m.json"
    path.write_bytes(b"\xef\xbb\xbf" + (MODELS / "gpt3-175b.json").read_bytes())
    assert load_model(path).num_layers == 96


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"pp": 300}, "--pp 300 is above the limit of 256"),
     ({"mbs": 200_000}, "--mbs 200000 is above the limit of 131072"),
     ({"seq_len": 2**26}, "--seq-len 67108864 is above the limit of 33554432"),
     ({"global_batch": 200_000}, "--global-batch 200000 is above the limit of 131072"),
     ({"tp": 0}, "--tp 0: input should be greater than 0")],
)  # fmt: skip
def test_configuration_option_limits(kwargs: dict[str, int], needle: str) -> None:
    """``planner estimate``'s options are named as typed, with the limit and its reason."""
    with pytest.raises(ValidationError) as caught:
        ParallelConfig(**kwargs)
    assert str(option_error(caught.value)).startswith(needle)


@pytest.mark.parametrize(
    ("options", "needle"),
    [({"--seq-len": 2**26}, "--seq-len 67108864 is above the limit of 33554432 (3.2x"),
     ({"--microbatches": 10**9}, "--microbatches 1000000000 is above the limit of 131072"),
     ({"--budget-gib": float("nan")}, "--budget-gib must be a number, got nan"),
     ({"--time-limit": -1.0}, "--time-limit must not be negative, got -1.0"),
     ({"--time-limit": float("inf")}, "--time-limit inf is above the limit of 1000000.0")],
)  # fmt: skip
def test_command_option_limits(options: dict[str, float], needle: str) -> None:
    """Options the library takes without a spec to bound them are checked by the CLI."""
    with pytest.raises(InputError, match=r"^" + re.escape(needle)):
        check_options(options)


def test_schema_states_the_limits() -> None:
    """``planner schema`` shows each limit as the field's JSON Schema maximum."""
    model = json_schema("model")
    assert model["properties"]["num_layers"]["maximum"] == lim.MAX_LAYERS
    assert model["$defs"]["TrainingSpec"]["properties"]["global_batch_size"]["maximum"] == (
        lim.MAX_GLOBAL_BATCH_SIZE
    )
    cluster = json_schema("cluster")
    assert cluster["properties"]["devices_per_node"]["maximum"] == lim.MAX_DEVICES_PER_NODE
