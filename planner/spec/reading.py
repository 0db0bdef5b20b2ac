"""Reading the planner's inputs: files and options into the specs of :mod:`planner.spec`.

Every way an input can be wrong (unreadable, not text, too large, malformed JSON, a field
the spec refuses) becomes one :class:`~planner.errors.InputError` line naming the file, the
field, what was given and what is allowed; :mod:`planner.spec.hf` translates Hugging Face
configs through the same messages.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from planner.errors import ConfigError, InputError
from planner.spec import ClusterSpec, DeviceSpec, ModelSpec, TrainingSpec, physics
from planner.spec import limits as lim
from planner.spec.hf import model_from_hf_config
from planner.spec.messages import describe_validation_error
from planner.spec.profile import PROFILE_SCHEMA, LayerProfile
from planner.vocabulary import FP8_STACKS, Precision, Stack

OPTION_NAMES = {"seq_length": "--seq-len", "global_batch_size": "--global-batch",
                "precision": "--precision", "stack": "--stack"}  # fmt: skip
"""The command-line option behind each field of a training run given as options."""


def training_run(
    seq_length: int, global_batch_size: int, precision: Precision = "bf16",
    stack: Stack = "megatron-te",
) -> TrainingSpec:
    """A :class:`TrainingSpec` from options rather than a file: out-of-range values raise
    :class:`~planner.errors.InputError` naming the option (``--seq-len``), not a pydantic
    error."""
    try:
        return TrainingSpec(seq_length=seq_length, global_batch_size=global_batch_size,
                            precision=precision, stack=stack)  # fmt: skip
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])
        message = describe_validation_error("options", exc)
        raise InputError(message.replace(f"options: {field}", OPTION_NAMES.get(field, field),
                                         1)) from None  # fmt: skip


def fill_training(
    model: ModelSpec,
    *,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    precision: Precision | None = None,
    stack: Stack | None = None,
) -> TrainingSpec:
    """The run's sequence length, global batch, precision and stack: each as given (an
    option), else the model's training block's, else (precision and stack only) bf16 and
    megatron-te.

    A sequence length or global batch that neither gives raises one
    :class:`~planner.errors.InputError` naming the options to pass, as the command line
    spells them (``--seq-len``, ``--global-batch``); out-of-range values raise it as
    :func:`training_run` does.

    >>> from planner.spec import ModelSpec
    >>> model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                   vocab_size=128, max_position_embeddings=256)
    >>> fill_training(model, seq_length=256, global_batch_size=8).precision
    'bf16'
    >>> fill_training(model, global_batch_size=8)
    Traceback (most recent call last):
    planner.errors.InputError: tiny: no sequence length (the model has no training block): \
pass --seq-len
    """
    block = model.training
    if block is not None:
        seq_length = block.seq_length if seq_length is None else seq_length
        global_batch_size = block.global_batch_size if global_batch_size is None else (
            global_batch_size)  # fmt: skip
        precision = block.precision if precision is None else precision
    if seq_length is None or global_batch_size is None:
        missing = {name: option for name, value, option in (
            ("sequence length", seq_length, "--seq-len"),
            ("global batch size", global_batch_size, "--global-batch"),
        ) if value is None}  # fmt: skip
        raise InputError(f"{model.name}: no {' and no '.join(missing)} (the model has no "
                         f"training block): pass {' and '.join(missing.values())}")  # fmt: skip
    return training_run(seq_length, global_batch_size, precision or "bf16",
                        stack_for(model, stack))


def stack_for(model: ModelSpec, stack: Stack | None = None) -> Stack:
    """The stack that runs ``model``'s layers: ``stack``, else its training block's, else
    Megatron-LM with Transformer Engine.

    >>> from planner.spec import ModelSpec
    >>> tiny = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                  vocab_size=128, max_position_embeddings=256)
    >>> stack_for(tiny), stack_for(tiny, "hf-eager")
    ('megatron-te', 'hf-eager')
    """
    if stack is not None:
        return stack
    return "megatron-te" if model.training is None else model.training.stack


def read_text(path: Path) -> str:
    """A file's text (UTF-8, with or without a byte-order mark); a file that cannot be read,
    is not text, or is larger than :data:`~planner.spec.limits.MAX_INPUT_BYTES` raises
    :class:`InputError`."""
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(lim.MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > lim.MAX_INPUT_BYTES:
        raise InputError(f"{path}: larger than the limit of {lim.MAX_INPUT_BYTES} bytes for an "
                         "input file (a plan for the largest cluster is ~25 MB)")  # fmt: skip
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (not UTF-8)") from None


def parse_json(text: str, *, source: Path | str) -> Any:
    """Parse JSON text from ``source``; malformed text raises :class:`InputError` with the
    line and column, and so does a key given twice in one object (JSON keeps the last
    silently: a model file with ``num_layers`` twice would plan the second unsaid).

    >>> parse_json('{"num_layers": 32, "num_layers": 40}', source="m.json")
    Traceback (most recent call last):
    planner.errors.InputError: m.json: key 'num_layers' given twice in one object
    """
    if not text.strip():
        raise InputError(f"{source}: the file is empty (no JSON in it)")
    try:
        return json.loads(text, object_pairs_hook=partial(_unique_keys, source))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply to read") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's own limit)
        raise InputError(f"{source}: invalid JSON: {exc}") from None


def _unique_keys(source: Path | str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refused when one key is given twice."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise InputError(f"{source}: key {key!r} given twice in one object")
        seen.add(key)
    return out


def read_json(path: Path) -> Any:
    """Parse a JSON file; unreadable or malformed files raise :class:`InputError`."""
    return parse_json(read_text(path), source=path)


def model_from_dict(data: Any, *, source: str = "<model>") -> ModelSpec:
    """Build a :class:`ModelSpec` from our native dict or a Hugging Face config dict."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if "model_type" in data:
        return model_from_hf_config(data, source=source)
    if "architectures" in data or "num_hidden_layers" in data:
        # Hugging Face's keys without the one that says which family reads them.
        raise InputError(f"{source}: a Hugging Face config.json without model_type: add the "
                         f"model's \"model_type\" (\"llama\", \"qwen3\", ...), as its "
                         f"published config.json has it")  # fmt: skip
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc, spec=ModelSpec)) from None


def load_model(path: str | Path) -> ModelSpec:
    """Read a model from our ``model.json`` or a Hugging Face ``config.json``.

    >>> from planner import load_model
    >>> model = load_model("instances/models/gpt3-175b.json")
    >>> model.name, model.num_layers, model.hidden_size, model.num_attention_heads
    ('gpt3-175b', 96, 12288, 96)
    >>> hf = load_model("tests/data/hf/gemma-2-9b.config.json")  # a Hugging Face config.json
    >>> hf.name, hf.num_layers, hf.hidden_size
    ('gemma-2-9b', 42, 3584)

    A file that cannot be read, or is not a model, is an :class:`InputError`:

    >>> load_model("no-such-model.json")
    Traceback (most recent call last):
    ...
    planner.errors.InputError: no-such-model.json: cannot read (No such file or directory)
    """
    path = Path(path)
    return model_from_dict(read_json(path), source=str(path))


def load_cluster(path: str | Path, nodes: int | None = None) -> ClusterSpec:
    """Read a ``cluster.json``; ``nodes`` overrides ``num_nodes``. A figure no hardware has
    (:func:`planner.spec.physics.check_cluster`) or more devices than the outermost network
    level holds is an :class:`InputError`; what is only unlikely is
    :func:`planner.spec.physics.cluster_warnings`.

    >>> from planner import load_cluster
    >>> cluster = load_cluster("instances/clusters/dgx-a100-80gb.json")
    >>> cluster.num_nodes, cluster.devices_per_node, cluster.device.name, cluster.device.memory_gib
    (128, 8, 'A100-SXM4-80GB', 80.0)
    >>> load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=4).num_devices
    32
    """
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        cluster = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(path, exc, spec=ClusterSpec)) from None
    physics.check_cluster(cluster, source=str(path))
    if nodes is None:
        physics.check_fabric(cluster, field=f"{path}: num_nodes")
        return cluster
    cluster = cluster.with_nodes(nodes)
    physics.check_fabric(cluster, field="--nodes")
    return cluster


def check_cluster(cluster: ClusterSpec, *, source: str = "cluster",
                  nodes_field: str | None = None) -> tuple[str, ...]:
    """The checks :func:`load_cluster` makes of a file, for a cluster built in code (a
    :class:`ClusterSpec` validates each field alone): an :class:`InputError` for a figure no
    hardware has (a 400 Gb/s NIC written as 400 GB/s) or more devices than the outermost
    network level holds; the warnings, one line each, for what is only unlikely (an H100 of
    192 GiB), as the commands print them; ``nodes_field`` names the node count in the first
    (a sweep's ``cluster.num_nodes``).

    >>> from planner import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> check_cluster(h100)
    ()
    >>> data = h100.model_dump()
    >>> data["device"]["memory_gib"] = 800
    >>> try:
    ...     check_cluster(ClusterSpec.model_validate(data), source="inventory")
    ... except InputError as error:
    ...     print(str(error)[:67])
    inventory: device.memory_gib: 800 GiB is outside the range 1 to 640
    """
    physics.check_cluster(cluster, source=source)
    physics.check_fabric(cluster, field=nodes_field or f"{source}: num_nodes")
    return physics.cluster_warnings(cluster, source=source)


def json_schema(kind: Literal["model", "cluster"]) -> dict[str, Any]:
    """The JSON Schema of our ``model.json`` or ``cluster.json``."""
    return (ModelSpec if kind == "model" else ClusterSpec).model_json_schema()


def read_profile(path: Path) -> LayerProfile:
    """The profile in the JSON file at ``path``; one line naming the field or the version
    when it is not one this version reads."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a layer profile (a JSON object is expected)")
    version = data.get("schema_version")
    if version is None:
        raise InputError(f"{path}: not a layer profile (no schema_version: `planner profile` "
                         f"writes one)")  # fmt: skip
    if version != PROFILE_SCHEMA:
        raise InputError(f"{path}: profile schema version {version}; this planner reads "
                         f"version {PROFILE_SCHEMA} (run `planner profile` again)")  # fmt: skip
    try:
        return LayerProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise InputError(f"{path}: {where}: {err['msg']}") from None


def check_stack(stack: Stack, model: ModelSpec) -> None:
    """Refuse a stack the planner does not price for ``model``, in one line:
    ``torchtitan-compiled`` counts its fused chains on whole dense blocks, while torchtitan
    compiles a mixture of experts' block submodule by submodule, its routed experts left eager
    (``apply_compile`` in ``torchtitan/models/llama4/infra/parallelize.py:593-656`` at
    pytorch/torchtitan@73a0e69). A :class:`~planner.errors.ConfigError`: the stack is a field
    of the configuration, so a batch refuses that row and prices the rest.

    >>> from planner.spec import MoESpec
    >>> model = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                   vocab_size=128, max_position_embeddings=256,
    ...                   moe=MoESpec(num_experts=8, top_k=2, ffn_hidden_size=32))
    >>> check_stack("torchtitan-compiled", model)
    Traceback (most recent call last):
    ...
    planner.errors.ConfigError: stack torchtitan-compiled: torchtitan compiles tiny-moe's \
blocks submodule by submodule, its routed experts eager, which the stack (counted on whole \
dense blocks) does not price; use torchtitan-eager
    """
    if stack == "torchtitan-compiled" and model.moe is not None:
        raise ConfigError(f"stack {stack}: torchtitan compiles {model.name}'s blocks submodule "
                          f"by submodule, its routed experts eager, which the stack (counted "
                          f"on whole dense blocks) does not price; use torchtitan-eager")


def check_device(stack: Stack, device: DeviceSpec) -> None:
    """Refuse an FP8 stack on a device with no measured FP8 GEMM speedup
    (``efficiency.fp8``), in one line saying what to do.

    >>> from planner.spec import DeviceSpec
    >>> check_device("megatron-te-fp8", DeviceSpec(name="A100", memory_gib=80,
    ...              memory_bandwidth_gb_s=2039, peak_tflops={"bf16": 312}))
    Traceback (most recent call last):
    ...
    planner.errors.InputError: stack megatron-te-fp8: device A100 has no FP8 GEMM speedup \
(device.efficiency.fp8 in the cluster file); price it on megatron-te, or measure it on the \
device: planner bench CLUSTER --model MODEL --fp8 --write
    """
    if stack in FP8_STACKS and device.efficiency.fp8 is None:
        raise InputError(f"stack {stack}: device {device.name} has no FP8 GEMM speedup "
                         "(device.efficiency.fp8 in the cluster file); price it on megatron-te, "
                         "or measure it on the device: planner bench CLUSTER --model MODEL "
                         "--fp8 --write")  # fmt: skip
