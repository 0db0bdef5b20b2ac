"""The seconds one decoder layer and the head take, priced against a device's measurement of
them (``../shared/validation/h100/layers.jsonl``, written by its ``scripts/real_layer.py``):
one Hugging Face Llama layer under autocast, eager or compiled, whole or one tensor-parallel
rank's shard, forward alone (under ``no_grad``) and forward with backward; and the LM head
with its loss on fp32 logits, forward with backward (measured on an fp32 input with no final
norm: the planner's final norm is taken off).

What is priced is the layer's compute with the stack's separate kernels
(:mod:`planner.graph.unfused`); no communication (one device), no recomputation.

>>> check = LayerTimeCheck(name="x", stack="hf-eager", part="layer", predicted_s=0.9,
...                        measured_s=1.0)
>>> round(check.error, 2)
-0.1
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from planner.cost import op_time
from planner.diagnose.layer_memory import layer_parts
from planner.graph import lowered
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.vocabulary import Stack

TimedPart = Literal["layer", "forward", "head"]
"""What a check times: a layer's forward and backward, its forward alone, the head and loss's
forward and backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTimeCheck:
    """One measured time and the planner's price of it."""

    name: str
    """What was measured: the model, its shard, the tokens and the stack."""
    stack: Stack
    """The stack priced."""
    part: TimedPart
    """What was timed."""
    predicted_s: float
    """The planner's seconds."""
    measured_s: float
    """The device's."""

    @property
    def error(self) -> float:
        """Predicted over measured, less one."""
        return self.predicted_s / self.measured_s - 1


def layer_time_checks(
    records: list[dict[str, Any]], models: Mapping[str, ModelSpec], cluster: ClusterSpec
) -> list[LayerTimeCheck]:
    """Each record's layer forward and forward with backward (``fwd_nograd_s``,
    ``fwd_bwd_s``) and, once per whole eager layer's record, the head's (``head_fwd_bwd_s``),
    each priced on ``cluster``'s device; ``models`` by the records' ``model`` names."""
    checks = []
    for r in records:
        model = models[r["model"]]
        tp = int(r.get("tp", 1))
        stack: Stack = "hf-compiled" if r["compiled"] else "hf-eager"
        shard = f" tp{tp}" if r["kind"] == "tp_shard_layer" else ""
        name = f"{r['model']}{shard} {r['seq']}x{r['mbs']} {stack}"
        layer = layer_parts(model, cluster, r, "dense", stack, tp)
        checks.append(LayerTimeCheck(name=name, stack=stack, part="layer",
                                     predicted_s=layer.forward_s + layer.backward_s,
                                     measured_s=r["fwd_bwd_s"]))  # fmt: skip
        checks.append(LayerTimeCheck(name=name, stack=stack, part="forward",
                                     predicted_s=layer.forward_s,
                                     measured_s=r["fwd_nograd_s"]))  # fmt: skip
        if r["kind"] != "layer" or r["compiled"]:
            continue  # the same head as the eager whole layer's record
        head = layer_parts(model, cluster, r, "head", "hf-eager", 1)
        predicted = head.forward_s + head.backward_s - _final_norm_s(model, cluster, r)
        checks.append(LayerTimeCheck(name=name, stack="hf-eager", part="head",
                                     predicted_s=predicted,
                                     measured_s=r["head_fwd_bwd_s"]))  # fmt: skip
    return checks


def _final_norm_s(model: ModelSpec, cluster: ClusterSpec, record: Mapping[str, Any]) -> float:
    """The final norm's forward and backward seconds, eager, on one device."""
    training = TrainingSpec(seq_length=record["seq"], global_batch_size=record["mbs"],
                            stack="hf-eager")  # fmt: skip
    ops = lowered(model, training, record["mbs"])[1].ops_by_layer[model.num_layers + 1]
    norm = next(op for op in ops if op.kind == "norm")
    time = op_time(norm, cluster.device, "bf16", activation_degrees={}, weight_degrees={},
                   compute_degree=1)  # fmt: skip
    return time.forward_s + time.backward_s
