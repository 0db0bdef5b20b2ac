"""A layer profile: the real layers of one model measured on one device by ``planner profile``
(:class:`LayerProfile`, the file), and what pricing reads of it once it is set beside a cluster
(:class:`ProfileFactors`, kept in ``device.efficiency.profile``).

A profile holds what the device did, not what the planner thinks of it: for each layer kind,
tensor-parallel shard and microbatch, the forward and backward seconds and the bytes the
forward keeps for the backward. :func:`planner.sharding.profiled.with_profile` turns each
measurement into factors over the cost model's own price of the same shard, so that a plan
priced from the profile keeps everything the model knows beyond the layer (communication,
overlap, pipeline, memory states) and only the layer's compute and kept bytes come from the
device.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from planner.spec.fields import Float, Int, Name
from planner.spec.fields import Frozen as _Frozen
from planner.spec.model import ModelSpec
from planner.vocabulary import Precision, Stack

PROFILE_SCHEMA = 1
"""The profile format this version writes and reads."""

PROFILED_KINDS = ("embedding", "dense", "moe", "experts", "head")
"""The layer kinds a profile may measure (:attr:`planner.graph.ops.Op.layer_kind`). An MoE
layer is measured in two parts: ``moe``, the layer without its routed experts' computation
(attention, router, the tokens' permutation and combine, shared experts), and ``experts``, a
rank's routed experts on the tokens routed to them (the operators with an ``experts`` dim
that compute: :attr:`planner.graph.ops.Op.routed`, dispatch and combine apart)."""

NOT_SHAPE = frozenset({"name", "num_layers", "max_position_embeddings", "tie_word_embeddings",
                       "rotary_base", "rotary_percent", "rope_scaling", "norm_epsilon",
                       "training"})  # fmt: skip
"""Model fields that leave one layer's work unchanged: a profile of one model prices another
that differs only in these (more layers, another name, a longer position table)."""


class LayerMeasurement(_Frozen):
    """One layer kind at one shard shape and microbatch, measured."""

    kind: str = Field(description="The layer kind: embedding, dense, moe, experts or head.")
    tensor_parallel: Int = Field(default=1, gt=0, description="The tensor-parallel shard "
                                 "measured: heads, KV heads, FFN and vocabulary divided by it "
                                 "(for experts, each expert's FFN: the expert tensor-parallel "
                                 "shard).")
    expert_parallel: Int = Field(default=1, gt=0, description="For experts: the experts "
                                 "divided by it, each receiving the tokens of that many ranks' "
                                 "microbatches.")
    micro_batch_size: Int = Field(gt=0, description="Sequences in the microbatch.")
    seq_length: Int = Field(gt=0, description="Tokens per sequence.")
    forward_s: Float | None = Field(default=None, gt=0, description="Forward seconds.")
    backward_s: Float | None = Field(default=None, gt=0, description="Backward seconds (input "
                                     "and weight gradients).")
    forward_backward_s: Float | None = Field(default=None, gt=0, description="Forward and "
                                             "backward seconds together, where only their sum "
                                             "was measured.")
    kept_bytes: Float | None = Field(default=None, ge=0, description="Bytes the forward keeps "
                                     "for the backward: the layer's input with what its ops "
                                     "save, parameters not counted (None: not measured).")

    @model_validator(mode="after")
    def _timed(self) -> LayerMeasurement:
        if (self.forward_s is None) != (self.backward_s is None):
            raise ValueError("forward_s and backward_s are measured together")
        if (self.forward_s is None) == (self.forward_backward_s is None):
            raise ValueError("give forward_s and backward_s, or forward_backward_s alone")
        return self

    @property
    def tokens(self) -> int:
        """Tokens in the microbatch."""
        return self.micro_batch_size * self.seq_length

    def label(self) -> str:
        """``dense tp2 2x4096``, ``experts tp1 ep4 1x4096``."""
        return shard_label(self.kind, self.tensor_parallel, self.expert_parallel,
                           self.micro_batch_size, self.seq_length)


class SkippedShape(_Frozen):
    """A shape the profile did not measure, and why."""

    kind: str = Field(description="The layer kind.")
    tensor_parallel: Int = Field(default=1, description="The shard.")
    expert_parallel: Int = Field(default=1, description="For experts: the expert shard.")
    micro_batch_size: Int = Field(description="Sequences in the microbatch.")
    seq_length: Int = Field(description="Tokens per sequence.")
    reason: str = Field(description="Why it was not measured.")

    def label(self) -> str:
        """``dense tp8 4x8192``."""
        return shard_label(self.kind, self.tensor_parallel, self.expert_parallel,
                           self.micro_batch_size, self.seq_length)  # fmt: skip


class OptimizerMeasurement(_Frozen):
    """The optimizer step over some parameters, measured."""

    parameters: Int = Field(gt=0, description="Parameters stepped (a decoder layer's).")
    step_s: Float = Field(gt=0, description="Seconds of one step.")


class LayerProfile(_Frozen):
    """What ``planner profile`` writes: one model's layers measured on one device."""

    schema_version: Int = Field(default=PROFILE_SCHEMA, description="The format's version.")
    device: Name = Field(description="The cluster file's device name the profile was measured "
                         "for (``device.name``).")
    device_reported: str = Field(default="", description="What the framework called the device "
                                 "it ran on (e.g. PyTorch's device name).")
    model: Name = Field(description="The model's name.")
    shape: dict[str, Any] = Field(description="The model's fields that shape a layer "
                                  "(:func:`layer_shape`): another model is refused by them.")
    stack: Stack = Field(description="The stack the layers ran as (hf-eager, hf-compiled, ...).")
    precision: Precision = Field(description="The compute precision.")
    layer_code: str = Field(description="Whose layer code ran: torchtitan, megatron-core, "
                            "transformers, or the planner's faithful PyTorch layer.")
    software: str = Field(default="", description="The framework's versions.")
    measured: tuple[LayerMeasurement, ...] = Field(description="The measurements.")
    optimizer: OptimizerMeasurement | None = Field(default=None, description="The optimizer "
                                                   "step over a decoder layer's parameters.")
    skipped: tuple[SkippedShape, ...] = Field(default=(), description="Shapes not measured.")
    source: str = Field(default="", description="How and when it was measured.")


class LayerFactor(_Frozen):
    """One profile measurement as pricing reads it: the measured over the cost model's own
    price of the same shard (:func:`planner.sharding.profiled.with_profile`)."""

    kind: str = Field(description="The layer kind measured.")
    tensor_parallel: Int = Field(gt=0, description="The shard measured.")
    expert_parallel: Int = Field(default=1, gt=0, description="For experts: the expert shard.")
    micro_batch_size: Int = Field(gt=0, description="Sequences in the microbatch.")
    seq_length: Int = Field(gt=0, description="Tokens per sequence.")
    routed_rows: Int | None = Field(default=None, gt=0, description="For experts: the rows "
                                    "the rank's experts computed, what pricing reads them "
                                    "along (None for the other kinds: their tokens).")
    forward: Float = Field(gt=0, description="Measured forward seconds over priced.")
    backward: Float = Field(gt=0, description="Measured backward seconds over priced.")
    kept: Float | None = Field(default=None, gt=0, description="Measured kept bytes over "
                               "priced (None: bytes not measured).")

    @property
    def tokens(self) -> int:
        """Tokens in the microbatch (for experts: the rows their rank computed)."""
        return self.routed_rows or self.micro_batch_size * self.seq_length


class ProfileFactors(_Frozen):
    """A layer profile set beside a cluster (``--profile``): what pricing reads of it, kept in
    the device's ``efficiency.profile``."""

    model: Name = Field(description="The model whose layers were measured.")
    stack: Stack = Field(description="The stack they ran as: only plans on it read them.")
    precision: Precision = Field(description="Their compute precision: likewise.")
    layers: tuple[LayerFactor, ...] = Field(description="Each layer measurement's factors.")
    optimizer: Float | None = Field(default=None, gt=0, description="The optimizer step's "
                                    "measured over priced seconds (None: not measured).")


def shard_label(kind: str, tensor_parallel: int, expert_parallel: int, micro_batch_size: int,
                seq_length: int) -> str:  # fmt: skip
    """How a shape is named in tables and messages.

    >>> shard_label("experts", 2, 4, 1, 4096), shard_label("dense", 1, 1, 2, 2048)
    ('experts tp2 ep4 1x4096', 'dense tp1 2x2048')
    """
    ep = f" ep{expert_parallel}" if expert_parallel > 1 or kind == "experts" else ""
    return f"{kind} tp{tensor_parallel}{ep} {micro_batch_size}x{seq_length}"


def layer_shape(model: ModelSpec) -> dict[str, Any]:
    """The fields of ``model`` that shape its layers' work (all but :data:`NOT_SHAPE`).

    >>> from planner.spec.reading import load_model
    >>> shape = layer_shape(load_model("instances/models/llama3-8b.json"))
    >>> shape["hidden_size"], "num_layers" in shape
    (4096, False)
    """
    return model.model_dump(mode="json", exclude=set(NOT_SHAPE))


def shape_difference(profile: LayerProfile, model: ModelSpec) -> str | None:
    """Where ``model``'s layers differ from those ``profile`` measured, in words; None when
    they are the same.

    >>> from planner.spec.reading import load_model
    >>> small = load_model("instances/models/llama3-8b.json")
    >>> p = LayerProfile(device="x", model="m", shape=layer_shape(small), stack="hf-eager",
    ...                  precision="bf16", layer_code="faithful", measured=())
    >>> shape_difference(p, small.model_copy(update={"num_layers": 2})) is None
    True
    >>> shape_difference(p, small.model_copy(update={"hidden_size": 2048}))
    'hidden_size 4096 in the profile, 2048 in the model'
    """
    ours = layer_shape(model)
    for name in [*ours, *(name for name in profile.shape if name not in ours)]:
        theirs, mine = profile.shape.get(name), ours.get(name)
        if theirs != mine:
            return f"{name} {theirs} in the profile, {mine} in the model"
    return None
