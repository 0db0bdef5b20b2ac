"""A layer profile from the shared H100 layer measurements (``layers.jsonl``, written by
``../shared/validation/h100/scripts/real_layer.py`` and ``real_extra.py``): the conversion
the tests price the one-GPU steps of ``runs_one_gpu.json`` with.

Each record becomes a dense layer's measurement, of its tensor-parallel shard, microbatch and
sequence: the forward is the record's forward under ``no_grad`` (``fwd_nograd_s``), the
backward its forward with backward less that (``fwd_bwd_s - fwd_nograd_s``), and the bytes
kept its ``activations_gib`` with the layer's fp32 input, which the record leaves out and the
planner counts. The head with its loss was timed forward and backward together
(``head_fwd_bwd_s``), on an fp32 input without the final norm; its kept bytes
(``head_kept_gib``) likewise count neither the norm's two fp32 tensors nor the input, which are
added. The final norm's seconds are not: a norm over the hidden states is under 1 % of the
head's matmul and loss. The loss's working peak through its backward is not part of a profile
(it stays priced).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from planner.graph.stacks import FP32_BYTES
from planner.spec import ModelSpec
from planner.spec.profile import LayerMeasurement, LayerProfile, layer_shape
from planner.vocabulary import GIB


def profile_from_records(
    records: Iterable[Mapping[str, Any]], model: ModelSpec, *, device: str, compiled: bool
) -> LayerProfile:
    """The records of ``model`` (by its name) run ``compiled`` or eager, as the profile of
    ``device`` (a cluster file's device name) on the ``hf-compiled`` or ``hf-eager`` stack."""
    measured: list[LayerMeasurement] = []
    heads: dict[tuple[int, int], LayerMeasurement] = {}
    for r in records:
        if r["model"] != model.name or bool(r["compiled"]) != compiled:
            continue
        fp32_input = FP32_BYTES * r["tokens"] * model.hidden_size
        measured.append(LayerMeasurement(
            kind="dense", tensor_parallel=int(r.get("tp", 1)), micro_batch_size=r["mbs"],
            seq_length=r["seq"], forward_s=r["fwd_nograd_s"],
            backward_s=r["fwd_bwd_s"] - r["fwd_nograd_s"],
            kept_bytes=r["activations_gib"] * GIB + fp32_input))  # fmt: skip
        heads.setdefault((r["mbs"], r["seq"]), LayerMeasurement(
            kind="head", micro_batch_size=r["mbs"], seq_length=r["seq"],
            forward_backward_s=r["head_fwd_bwd_s"],
            kept_bytes=r["head_kept_gib"] * GIB + 2 * fp32_input))  # fmt: skip
    unique = {(m.kind, m.tensor_parallel, m.micro_batch_size, m.seq_length): m
              for m in (*measured, *heads.values())}  # fmt: skip
    return LayerProfile(
        device=device, model=model.name, shape=layer_shape(model),
        stack="hf-compiled" if compiled else "hf-eager", precision="bf16",
        layer_code="transformers (LlamaDecoderLayer)", measured=tuple(unique.values()),
        source="../shared/validation/h100/layers.jsonl, converted by "
        "planner.diagnose.profile_records")  # fmt: skip
