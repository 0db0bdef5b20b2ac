"""What a training log says about the model it trained, checked against the model the user
names, so that a run record carries the model that ran (``model.spec``) and nothing else.

- Megatron-LM's arguments dump (``_print_args``, NVIDIA/Megatron-LM@d98e8a64ddf3
  megatron/training/arguments.py:1990-2001) prints every argument by its ``dest``: those of
  ``--swiglu`` (2450), ``--untie-embeddings-and-output-weights`` (2460),
  ``--position-embedding-type`` (2397), ``--group-query-attention`` (2382), ``--num-experts``
  (3518), ``--moe-layer-freq`` (3520) and the MLA ranks (3548-3557), and the TransformerConfig
  fields that ``ArgumentGroupFactory`` turns into arguments (2373): ``num_query_groups``,
  ``kv_channels`` (set to hidden / heads when absent, 1331-1333), ``normalization``,
  ``add_bias_linear``, ``add_qkv_bias`` (true whenever ``add_bias_linear`` is, 1609-1610),
  ``qk_layernorm``, ``multi_latent_attention``, ``moe_router_topk``, ``moe_ffn_hidden_size``
  (the dense width when absent, 1650-1651), ``moe_shared_expert_intermediate_size``,
  ``moe_router_enable_expert_bias``, ``hidden_dropout`` and ``attention_dropout``.
- torchtitan (pytorch/torchtitan@73a0e69, v0.2.2) logs ``Building {name} {flavor}with {json of
  the model args}`` and ``Model {name} {flavor} size: {n:,} total parameters``
  (torchtitan/train.py:143-146, 174-177), and ``Building device mesh with parallelism: pp=..,
  dp_replicate=.., dp_shard=.., cp=.., tp=.., ep=.., etp=..``
  (torchtitan/distributed/parallel_dims.py:131-135), and ``Applied {mode} activation
  checkpointing to the model`` (torchtitan/distributed/activation_checkpoint.py:249; no line
  when the mode is ``none``), and ``Compiling each TransformerBlock with torch.compile``
  (torchtitan/models/llama3/infra/parallelize.py:269; no line when ``compile`` is off).

>>> titan_mesh(["Building device mesh with parallelism: pp=1, dp_replicate=2, dp_shard=4, "
...             "cp=1, tp=2, ep=1, etp=1"])
{'pp': 1, 'dp_replicate': 2, 'dp_shard': 4, 'cp': 1, 'tp': 2, 'ep': 1, 'etp': 1}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from planner.diagnose.log_lines import TITAN_BUILD, clean, texts
from planner.errors import InputError
from planner.graph import lower, parameter_count
from planner.spec import ModelSpec, TrainingSpec

_TITAN_SIZE = re.compile(r"Model (\S+) (\S+) size: ([0-9,]+) total parameters")
_TITAN_MESH = re.compile(r"Building device mesh with parallelism: (.*)$")
_TITAN_AC = re.compile(r"Applied (\w+) activation checkpointing to the model")
_TITAN_BATCH = re.compile(r"Trainer is initialized with local batch size (\d+), global batch "
                          r"size (\d+), gradient accumulation steps (\d+)")
_TITAN_PP_SCHEDULE = re.compile(r"Using pipeline schedule \S+ with (\d+) microbatches")
_TITAN_COMPILE = "Compiling each TransformerBlock with torch.compile"
_TITAN_COMPILE_LOSS = "Compiling the loss function with torch.compile"


def megatron_printed(model: ModelSpec) -> dict[str, str]:
    """How Megatron-LM's arguments dump prints the arguments of a run of ``model`` that
    describe the model (each as ``str`` of its value)."""
    m = model
    printed: dict[str, Any] = {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "ffn_hidden_size": m.ffn,
        "swiglu": m.activation == "swiglu",
        "normalization": {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[m.normalization],
        "position_embedding_type": {"learned": "learned_absolute",
                                    "rope": "rope"}[m.position_embedding],
        "untie_embeddings_and_output_weights": not m.tie_word_embeddings,
        "add_bias_linear": m.bias, "add_qkv_bias": m.has_qkv_bias,
        "qk_layernorm": m.qk_layernorm, "multi_latent_attention": m.mla is not None,
        "mtp_num_layers": m.mtp_layers or None,
    }  # fmt: skip
    if m.mla is None:
        printed |= {"kv_channels": m.head_dim,
                    "group_query_attention": m.query_groups != m.num_attention_heads}
    else:
        printed |= {"q_lora_rank": m.mla.q_lora_rank, "kv_lora_rank": m.mla.kv_lora_rank,
                    "qk_head_dim": m.mla.qk_nope_head_dim,
                    "qk_pos_emb_head_dim": m.mla.qk_rope_head_dim,
                    "v_head_dim": m.mla.v_head_dim}  # fmt: skip
    if m.moe is None:
        printed["num_experts"] = None
    else:
        layers = [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
        printed |= {"num_experts": m.moe.num_experts, "moe_router_topk": m.moe.top_k,
                    "moe_ffn_hidden_size": m.moe.ffn_hidden_size,
                    "moe_shared_expert_intermediate_size": m.moe.shared_ffn or None,
                    "moe_router_enable_expert_bias": m.moe.router_expert_bias,
                    "moe_layer_freq": 1 if all(layers) else layers}  # fmt: skip
    return {name: str(value) for name, value in printed.items()}


def check_megatron_model(arguments: dict[str, str], model: ModelSpec, *, where: str) -> None:
    """Refuse a model whose architecture the log's arguments dump contradicts (an argument the
    dump does not print is not checked)."""
    printed = megatron_printed(model)
    for name, expected in printed.items():
        logged = arguments.get(name)
        if logged is None or (name == "num_query_groups" and logged == "None"):
            continue
        if logged != expected and not _same_freq(name, logged, expected):
            raise InputError(f"{where}: the log ran {name} {logged}, the model "
                             f"{model.name} has {expected}; expected the log's model")  # fmt: skip
    if arguments.get("group_query_attention") == "True" and model.mla is None:
        logged = arguments.get("num_query_groups", "None")
        if logged != str(model.query_groups):
            raise InputError(f"{where}: the log ran num_query_groups {logged}, the model "
                             f"{model.name} has {model.query_groups}; expected the log's "
                             f"model")  # fmt: skip


def _same_freq(name: str, logged: str, expected: str) -> bool:
    # --moe-layer-freq N prints N; a list prints as one; 1 and [1, 1, ...] are one layout.
    if name != "moe_layer_freq":
        return False
    return logged == "1" and set(re.findall(r"\d", expected)) == {"1"}


def megatron_dropout(arguments: dict[str, str]) -> dict[str, float]:
    """The run's dropout probabilities (a training choice, not the architecture's): the
    ModelSpec fields the log states."""
    out = {}
    for name in ("hidden_dropout", "attention_dropout"):
        if arguments.get(name, "None") != "None":
            try:
                out[name] = float(arguments[name])
            except ValueError:
                raise InputError(f"arguments: {name} {arguments[name]!r} is not a number") from None
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TitanModel:
    """The model a torchtitan log says it built."""

    name: str
    """``[model] name`` (``llama3``, ``qwen3``, ...)."""
    flavor: str
    """``[model] flavor`` (``8B``, ...)."""
    args: dict[str, Any]
    """The model args as logged (JSON)."""
    total_parameters: int | None
    """The parameter count it printed, if it did."""


def titan_model(lines: list[str]) -> TitanModel | None:
    """The ``Building ... with {...}`` block and the size line of a torchtitan log, or None;
    the block's lines are those of the rank that printed its first (a log of several ranks may
    interleave theirs)."""
    cleaned = [(source, text.rstrip()) for source, text in map(clean, lines)]
    for i, (source, line) in enumerate(cleaned):
        if not (m := TITAN_BUILD.search(line)):
            continue
        block, depth = [], 0
        for part in [m.group(3), *(t for s, t in cleaned[i + 1:] if s == source)]:
            block.append(part)
            depth += part.count("{") - part.count("}")
            if depth <= 0:
                break
        try:
            args = json.loads("\n".join(block))
        except json.JSONDecodeError:
            raise InputError(f"torchtitan's model args after {line[:60]!r} are not JSON") from None
        size = next((int(s.group(3).replace(",", "")) for _, t in cleaned
                     if (s := _TITAN_SIZE.search(t))), None)  # fmt: skip
        return TitanModel(name=m.group(1), flavor=m.group(2), args=args, total_parameters=size)
    return None


def titan_mesh(lines: list[str]) -> dict[str, int]:
    """The degrees of torchtitan's device-mesh line, name to degree (empty when absent)."""
    for line in texts(lines):
        if m := _TITAN_MESH.search(line):
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
    return {}


# torchtitan's model args (torchtitan/models/*/model/args.py) to the ModelSpec they size.
_TITAN_SIZES = {"dim": "hidden_size", "n_layers": "num_layers",
                "n_heads": "num_attention_heads", "vocab_size": "vocab_size"}  # fmt: skip


def check_titan_model(logged: TitanModel, model: ModelSpec, *, where: str) -> None:
    """Refuse a model whose sizes or parameter count the torchtitan log contradicts."""
    for key, field in _TITAN_SIZES.items():
        value = logged.args.get(key)
        if value is not None and value != getattr(model, field):
            raise InputError(f"{where}: torchtitan built {logged.name} {logged.flavor} with "
                             f"{key}={value}, the model {model.name} has {field} "
                             f"{getattr(model, field)}; expected the log's model")  # fmt: skip
    kv = logged.args.get("n_kv_heads")
    if kv is not None and model.mla is None and kv != model.query_groups:
        raise InputError(f"{where}: torchtitan built n_kv_heads={kv}, the model {model.name} "
                         f"has {model.query_groups} key/value heads")  # fmt: skip
    if logged.total_parameters is not None:
        ours = titan_parameter_count(model)
        if ours != logged.total_parameters:
            raise InputError(f"{where}: torchtitan's {logged.name} {logged.flavor} has "
                             f"{logged.total_parameters:,} parameters, the model {model.name} "
                             f"{ours:,}; expected the log's model")  # fmt: skip


def titan_flavor_model(logged: TitanModel | None, *, where: str) -> ModelSpec:
    """The model of the registered torchtitan flavor the log built, as
    :data:`planner.frameworks.torchtitan.FLAVORS` writes it, for a log given without a model
    file; an error naming what is missing otherwise."""
    from planner.frameworks.torchtitan import FLAVORS, VERSION

    if logged is None:
        raise InputError(f"{where}: the log does not say which model it built (torchtitan's "
                         f"'Building NAME FLAVORwith {{...}}' line); pass --model")  # fmt: skip
    found = next((f.spec for f in FLAVORS
                  if (f.name, f.flavor) == (logged.name, logged.flavor)), None)  # fmt: skip
    if found is None:
        raise InputError(f"{where}: torchtitan built {logged.name} {logged.flavor}, which is none "
                         f"of the {VERSION} flavors the planner knows; pass --model")  # fmt: skip
    return found


def titan_parameter_count(model: ModelSpec) -> int:
    """The parameter count torchtitan prints for ``model``: every ``nn.Parameter`` less the
    embedding when it is tied to the output (torchtitan/models/utils.py:406, 428-429 and
    494-495); a router's expert bias is a buffer, not a parameter
    (torchtitan/models/moe/moe.py:459-465); v0.2.2 builds no multi-token prediction."""
    built = model.model_copy(update={"mtp_layers": 0})
    total = parameter_count(lower(built, TrainingSpec(seq_length=1, global_batch_size=1))).total
    if model.tie_word_embeddings:
        total -= model.vocab_size * model.hidden_size
    if model.moe is not None and model.moe.router_expert_bias:
        moe_layers = sum(model.is_moe_layer(i) for i in range(model.num_layers))
        total -= model.moe.num_experts * moe_layers
    return total


def titan_compiled(lines: list[str]) -> tuple[str, ...]:
    """What a torchtitan log says it compiled: ``model`` (each block), ``loss``, both or
    neither (``torchtitan/components/loss.py:33-35`` logs the loss's).

    >>> titan_compiled(["... Compiling the loss function with torch.compile"])
    ('loss',)
    """
    said = {"model": _TITAN_COMPILE, "loss": _TITAN_COMPILE_LOSS}
    return tuple(part for part, text in said.items() if any(text in line for line in lines))


def titan_checkpointing(lines: list[str]) -> str:
    """torchtitan's activation checkpointing mode: ``full``, ``selective`` or ``none``."""
    modes = [m.group(1) for line in texts(lines) if (m := _TITAN_AC.search(line))]
    return modes[0] if modes else "none"


def titan_config_fields(lines: list[str], logged: TitanModel | None) -> dict[str, Any]:
    """The configuration a torchtitan log states: degrees from the mesh line (data parallel =
    dp_replicate x dp_shard, sharded as FSDP2 when dp_shard > 1), the sequence from the model
    args' ``max_seq_len``, which torchtitan sets to ``training.seq_len``
    (``update_from_config``, torchtitan/models/llama3/model/args.py:49-55), and full or no
    recomputation (torchtitan's selective checkpointing is none of the planner's modes:
    :func:`titan_checkpointing` says so, and the caller asks), and the stack: its eager block
    (``torchtitan-eager``), or ``torchtitan-compiled`` where the log says each block was
    compiled; its context parallelism PyTorch's (``cp_algo`` allgather); its tensor
    parallelism with sequence parallelism, which torchtitan always applies to the norms
    (``apply_tp``: ``SequenceParallel`` on every norm, torchtitan/models/llama3/infra/
    parallelize.py:161-233 at 73a0e69); the batch
    sizes (:func:`titan_batch_fields`)."""
    mesh = titan_mesh(lines)
    fields: dict[str, Any] = {}
    # No checkpointing or compile line says "none" only in a log that has its start-up lines.
    if mesh or logged is not None:
        compiled = "model" in titan_compiled(lines)
        fields["stack"] = "torchtitan-compiled" if compiled else "torchtitan-eager"
        if (mode := titan_checkpointing(lines)) != "selective":
            fields["recompute"] = mode
    if mesh:
        fields |= {"tp": mesh.get("tp", 1), "pp": mesh.get("pp", 1), "cp": mesh.get("cp", 1),
                   "ep": mesh.get("ep", 1),
                   "etp": mesh.get("etp") if mesh.get("ep", 1) > 1 else None,
                   "dp": mesh.get("dp_replicate", 1) * mesh.get("dp_shard", 1)}  # fmt: skip
        fields["zero"] = 3 if mesh.get("dp_shard", 1) > 1 else 0
        fields["sp"] = fields["tp"] > 1
        if mesh.get("cp", 1) > 1:  # its training's context parallelism all-gathers K/V
            fields["cp_algo"] = "allgather"
    if logged is not None and isinstance(logged.args.get("max_seq_len"), int):
        fields["seq_len"] = logged.args["max_seq_len"]
    return fields | titan_batch_fields(lines, pp=fields.get("pp", 1))


def titan_batch_fields(lines: list[str], *, pp: int) -> dict[str, int]:
    """The batch sizes a torchtitan log states: ``Trainer is initialized with local batch size
    L, global batch size G, gradient accumulation steps A, ...`` (torchtitan/train.py:354-362 at
    73a0e69), G = L x data-parallel degree x A (train.py:195-214), so L is what each rank runs
    forward and backward at once: the microbatch, without pipeline parallelism. A pipeline
    splits L into the microbatches ``Using pipeline schedule S with N microbatches and K
    stages.`` says (torchtitan/distributed/pipeline_parallel.py:186-213): L / N each; without
    that line the microbatch is not stated.

    >>> titan_batch_fields(["Trainer is initialized with local batch size 2, global batch size "
    ...                     "32, gradient accumulation steps 2, sequence length 8192"], pp=1)
    {'global_batch': 32, 'mbs': 2}
    """
    said = next((m for line in texts(lines) if (m := _TITAN_BATCH.search(line))), None)
    if said is None:
        return {}
    local = int(said.group(1))
    fields = {"global_batch": int(said.group(2))}
    if pp == 1:
        fields["mbs"] = local
    elif split := next((m for line in texts(lines) if (m := _TITAN_PP_SCHEDULE.search(line))),
                       None):  # fmt: skip
        fields["mbs"] = local // int(split.group(1))
    return fields
