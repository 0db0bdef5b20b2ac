"""The memory one decoder layer and the loss keep, priced against a device's measurement of
them (``../shared/validation/h100/layers.jsonl``, written by its ``scripts/real_layer.py``):
one Hugging Face Llama layer under autocast, eager or compiled, whole or one tensor-parallel
rank's shard, and the LM head with its loss on fp32 logits.

A layer's measured bytes are what its forward keeps less its input and its output (both held
by the step anyway: the output is the next layer's input). The planner counts a layer's kept
bytes with its input, so the fp32 input is taken off. The head is measured on an fp32 input
with no final norm: the planner's two fp32 norm tensors are taken off.

>>> check = LayerMemoryCheck(name="x", stack="hf-eager", predicted_gib=1.0, measured_gib=1.25)
>>> round(check.error, 2)
-0.2
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.cost.layer import LayerParts
from planner.errors import InputError
from planner.graph.stacks import FP32_BYTES
from planner.plan.degrees import Degrees
from planner.sharding.uniform import UniformQuery, uniform_layout, uniform_parts
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import read_json, read_text
from planner.vocabulary import GIB, Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerMemoryCheck:
    """One measured quantity and the planner's price of it."""

    name: str
    """What was measured: the model, its shard, the tokens and the stack."""
    stack: Stack
    """The stack priced."""
    predicted_gib: float
    """The planner's bytes."""
    measured_gib: float
    """The device's."""

    @property
    def error(self) -> float:
        """Predicted over measured, less one."""
        return self.predicted_gib / self.measured_gib - 1


def read_layer_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``layers.jsonl`` file (one JSON object a line; failed cases, which
    carry ``error``, left out)."""
    records = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if "error" not in record:
            records.append(record)
    return records


def measured_layer_models(runs_one_gpu: Path) -> dict[str, ModelSpec]:
    """The two shapes ``real_layer.py`` builds (its ``SHAPES``), as model specs by the records'
    ``model`` names: Llama-3.2-1B as the one-GPU runs file at ``runs_one_gpu`` gives it
    (``model.spec`` of its first run), and Llama-3.1-8B, the same layer at hidden 4,096 and
    FFN 14,336 with its own (untied) head."""
    spec = ModelSpec.model_validate(read_json(runs_one_gpu)[0]["model"]["spec"])
    wide = spec.model_copy(update={"name": "llama3.1-8b", "num_layers": 32, "hidden_size": 4096,
                                   "ffn_hidden_size": 14336, "tie_word_embeddings": False})
    return {"llama3.2-1b": spec, "llama3.1-8b": wide}


def layer_parts(model: ModelSpec, cluster: ClusterSpec, record: Mapping[str, Any], kind: str,
                stack: Stack, tp: int) -> LayerParts:  # fmt: skip
    """One layer of ``kind`` priced as a record measured it: one device, ``tp`` the tensor
    parallel shard it ran (no sequence parallelism), the record's microbatch and sequence, in
    bf16 on ``stack``."""
    query = UniformQuery(kind=kind, layout=uniform_layout(Degrees(tp=tp)),
                         micro_batch_size=record["mbs"], seq_length=record["seq"],
                         precision="bf16", stack=stack)  # fmt: skip
    return uniform_parts(model, cluster, query)


def layer_memory_checks(
    records: list[dict[str, Any]], models: Mapping[str, ModelSpec], cluster: ClusterSpec
) -> list[LayerMemoryCheck]:
    """Each record's layer bytes (``activations_gib``) and, for whole eager layers, the
    head's kept bytes and its peak through the loss's backward (``head_kept_gib``,
    ``head_peak_over_start_gib``), each with the planner's price; ``models`` by the records'
    ``model`` names, ``cluster`` any cluster (bytes do not depend on it)."""
    checks = []
    for r in records:
        model = models[r["model"]]
        tp = int(r.get("tp", 1))
        stack: Stack = "hf-compiled" if r["compiled"] else "hf-eager"
        shard = f" tp{tp}" if r["kind"] == "tp_shard_layer" else ""
        name = f"{r['model']}{shard} {r['seq']}x{r['mbs']} {stack}"
        layer = layer_parts(model, cluster, r, "dense", stack, tp)
        fp32_input = FP32_BYTES * r["tokens"] * model.hidden_size
        checks.append(LayerMemoryCheck(name=f"layer {name}", stack=stack,
                                       predicted_gib=(layer.kept_bytes[0] - fp32_input) / GIB,
                                       measured_gib=r["activations_gib"]))  # fmt: skip
        if r["kind"] != "layer" or r["compiled"]:
            continue  # the same head as the eager whole layer's record
        head = layer_parts(model, cluster, r, "head", "hf-eager", 1)
        kept = head.kept_bytes[0] - 2 * fp32_input  # the final norm's two fp32 tensors
        checks.append(LayerMemoryCheck(name=f"head kept {name}", stack="hf-eager",
                                       predicted_gib=kept / GIB,
                                       measured_gib=r["head_kept_gib"]))  # fmt: skip
        checks.append(LayerMemoryCheck(name=f"head peak {name}", stack="hf-eager",
                                       predicted_gib=(kept + head.loss_bytes) / GIB,
                                       measured_gib=r["head_peak_over_start_gib"]))  # fmt: skip
    return checks
