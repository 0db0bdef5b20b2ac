"""The rules a uniform configuration must keep to divide the model, the batch and the cluster,
each written once and evaluated on one configuration (:func:`planner.plan.config.resolve`,
which raises the first broken rule's message) or on arrays over many
(:func:`planner.uniform.batch.estimate_batch`, which keeps a mask and the first broken rule's
index per configuration).

A rule's test uses ``&``, ``|`` and comparisons only, so Python ints and numpy arrays both
pass through it; its message is formatted for one configuration.

>>> d = derive(Shape(num_devices=1024, num_layers=96, global_batch=1536), Degrees(tp=8, pp=16))
>>> int(d.dp), int(d.num_microbatches), d.stage_layers[:3]
(8, 192, (6, 6, 6))
>>> d = derive(Shape(num_devices=1024, num_layers=96, global_batch=1536),
...            Degrees(tp=np.array([8, 4]), pp=np.array([16, 8])))
>>> d.dp, d.num_microbatches
(array([ 8, 32]), array([192,  48]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

import numpy as np

from planner.plan.chunks import slotted_ends
from planner.spec import ModelSpec

Real: TypeAlias = Any
"""An int or bool, or a numpy array of them over configurations."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Degrees:
    """A configuration's integers and switches: Python values for one configuration, numpy
    arrays (one element per configuration) for a batch."""

    tp: Real = 1
    """Tensor-parallel degree."""
    pp: Real = 1
    """Pipeline-parallel degree."""
    cp: Real = 1
    """Context-parallel degree."""
    dp: Real = 0
    """Data-parallel degree as given; 0: the devices left over."""
    ep: Real = 1
    """Expert-parallel degree."""
    vpp: Real = 1
    """Virtual pipeline stages per device."""
    first: Real = 0
    """Decoder layers on the first stage when given; 0: an equal split."""
    last: Real = 0
    """Decoder layers on the last stage when given; 0: an equal split."""
    mbs: Real = 1
    """Microbatch size."""
    ulysses: Real = False
    """Context parallelism by all-to-alls (else ring attention)."""
    sp: Real = False
    """Sequence parallelism asked for."""
    tp_comm_overlap: Real = False
    """Tensor-parallel communication overlap asked for."""
    moe_comm_overlap: Real = False
    """The experts' all-to-all overlapped with another microbatch's compute, asked for."""
    full_recompute: Real = False
    """Full recomputation of (some) layers."""
    gpipe: Real = False
    """The GPipe schedule (else 1F1B)."""
    zb_h1: Real = False
    """The ZB-H1 zero-bubble schedule."""
    zb_v: Real = False
    """The ZB-V zero-bubble schedule."""

    def placed(self, dp: Real) -> Degrees:
        """The degrees that shape a stage's mesh and number its ranks, with ``dp``
        data-parallel ranks (the rest at their defaults): sequence parallelism only where
        tensor parallelism is, Ulysses only where context parallelism is. Configurations
        that share them share their stages' meshes and groups
        (:func:`planner.uniform.stages.placed_stage`).

        >>> d = Degrees(tp=1, cp=2, sp=True, ulysses=True, mbs=4).placed(dp=8)
        >>> d.dp, d.sp, d.ulysses, d.mbs
        (8, False, True, 1)
        """
        return Degrees(tp=self.tp, pp=self.pp, cp=self.cp, dp=dp, ep=self.ep,
                       sp=self.sp & (self.tp > 1), ulysses=self.ulysses & (self.cp > 1))

    def at(self, row: int) -> Degrees:
        """Configuration ``row``'s degrees, as Python values, from a batch's columns."""
        names = [f.name for f in fields(self)]
        return Degrees(**{n: c[row].item() for n, c in zip(names, self.columns(), strict=True)})

    def columns(self) -> tuple[np.ndarray, ...]:
        """Every field as a column of one length, for numbering distinct degrees."""
        return tuple(np.broadcast_arrays(*(getattr(self, f.name) for f in fields(self))))


def degrees_of(knobs: Mapping[str, Any]) -> Degrees:
    """The integers and switches the rules read, from a configuration's knobs by
    :class:`~planner.plan.config.ParallelConfig` field name: Python values for one (None for
    a default), or columns for a batch (0 for a default).

    >>> degrees_of({"tp": 8, "pp": 4, "cp": 1, "dp": None, "ep": 1, "vpp": 1, "mbs": 1,
    ...             "first_stage_layers": None, "last_stage_layers": None, "sp": True,
    ...             "cp_algo": "ring", "tp_comm_overlap": False, "schedule": "1f1b",
    ...             "overlap_moe_expert_parallel_comm": False, "recompute": "none"}).dp
    0
    """

    def given(name: str) -> Real:
        value = knobs[name]
        return 0 if value is None else value

    def switch(name: str) -> Real:
        value = knobs[name]
        return value.astype(bool) if isinstance(value, np.ndarray) else bool(value)

    schedule = knobs["schedule"]
    return Degrees(tp=knobs["tp"], pp=knobs["pp"], cp=knobs["cp"], dp=given("dp"),
                   ep=knobs["ep"], vpp=knobs["vpp"], first=given("first_stage_layers"),
                   last=given("last_stage_layers"), mbs=knobs["mbs"],
                   ulysses=knobs["cp_algo"] == "ulysses", sp=switch("sp"),
                   tp_comm_overlap=switch("tp_comm_overlap"),
                   moe_comm_overlap=switch("overlap_moe_expert_parallel_comm"),
                   full_recompute=knobs["recompute"] == "full",
                   gpipe=schedule == "gpipe",
                   zb_h1=schedule == "zb-h1", zb_v=schedule == "zb-v")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """What the configurations divide: the cluster's devices, the model's layers and the run's
    global batch (sequences)."""

    num_devices: int
    """Devices of the cluster."""
    num_layers: int
    """Decoder layers of the model."""
    global_batch: int
    """Sequences per step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Derived:
    """What follows from a configuration's degrees (meaningful where the rules hold)."""

    dp: Real
    """Data-parallel degree: as given, else the devices left over."""
    num_microbatches: Real
    """Microbatches per step: the global batch over ``dp x mbs``."""
    first_layers: Real
    """Decoder layers on the first stage."""
    middle_layers: Real
    """Decoder layers on each stage between the first and the last."""
    last_layers: Real
    """Decoder layers on the last stage."""
    pp: Real
    """Pipeline stages."""

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Decoder layers on each stage, first to last (one configuration only)."""
        return self.stage_layers_of(None)

    def stage_layers_of(self, row: int | None) -> tuple[int, ...]:
        """Decoder layers on each stage of configuration ``row`` of a batch (None: of the one
        configuration)."""

        def at(values: Real) -> int:
            return int(values if row is None else np.asarray(values)[row])

        if at(self.pp) == 1:
            return (at(self.first_layers),)
        middle = (at(self.middle_layers),) * (at(self.pp) - 2)
        return (at(self.first_layers), *middle, at(self.last_layers))


def derive(shape: Shape, d: Degrees) -> Derived:
    """The data-parallel degree, the microbatches and the layer split of ``d``."""
    model_parallel = d.tp * d.pp * d.cp
    dp = np.where(d.dp > 0, d.dp, shape.num_devices // model_parallel)
    middle_stages = d.pp - (d.first > 0) - (d.last > 0)
    rest = shape.num_layers - d.first - d.last
    each = rest // np.maximum(middle_stages, 1)
    return Derived(
        dp=dp,
        num_microbatches=shape.global_batch // np.maximum(dp * d.mbs, 1),
        first_layers=np.where(d.first > 0, d.first, each),
        middle_layers=each,
        last_layers=np.where(d.last > 0, d.last, each),
        pp=d.pp,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One rule: its test (true where it holds) and what it says when broken."""

    name: str
    """A short name (tests and the batch's refusal codes)."""
    holds: Callable[[ModelSpec, int, Shape, Degrees, Derived], Real]
    """Model, sequence length, shape, degrees, derived -> where the rule holds."""
    message: Callable[[ModelSpec, int, Shape, Degrees, Derived], str]
    """The one-line refusal for one broken configuration."""


def _even_split(s: Shape, d: Degrees) -> Real:
    middle = d.pp - (d.first > 0) - (d.last > 0)
    rest = s.num_layers - d.first - d.last
    return ((middle == 0) & (rest == 0)) | (
        (middle > 0) & (rest >= middle) & (rest % np.maximum(middle, 1) == 0)
    )


def _slotted(d: Degrees, x: Derived) -> Real:
    embedding, loss = slotted_ends(first=x.first_layers, middle=x.middle_layers,
                                   last=x.last_layers, pp=d.pp, vpp=d.vpp, v_shape=d.zb_v)
    return embedding | loss


def _chunked(d: Degrees, x: Derived) -> Real:
    """Every stage's decoder layers cut into ``vpp`` chunks as Megatron-Core cuts them: equal
    chunks, or the embedding's and the loss's slots short
    (:func:`~planner.plan.chunks.slotted_ends`)."""
    equal = ((x.first_layers % d.vpp == 0) & (x.last_layers % d.vpp == 0)
             & ((d.pp <= 2) | (x.middle_layers % d.vpp == 0)))  # fmt: skip
    return equal | _slotted(d, x)


def combined_1f1b(d: Degrees) -> Real:
    """Where the experts' all-to-alls may overlap another microbatch's compute: combined 1F1B,
    the one implementation (Megatron-Core's ``transformer_config.py:3002-3037``), pairs a
    1F1B schedule's forwards and backwards, with no full recomputation. The search asks it
    before it builds a configuration, the rules after.

    >>> bool(combined_1f1b(Degrees(moe_comm_overlap=True, zb_h1=True)))
    False
    """
    return (d.moe_comm_overlap == False) | (  # noqa: E712
        (d.gpipe == False) & (d.zb_h1 == False) & (d.zb_v == False)  # noqa: E712
        & (d.full_recompute == False))  # noqa: E712


def _split(d: Degrees) -> Real:
    return (d.first > 0) | (d.last > 0)


def _given(d: Degrees) -> int:
    return int(d.first) + int(d.last)


def _middle(d: Degrees) -> int:
    return int(d.pp) - int(d.first > 0) - int(d.last > 0)


def _held(x: Derived) -> str:
    return str(sorted(set(x.stage_layers)))


def _tp_cp(d: Degrees) -> Real:
    return d.tp * d.cp


RULES: tuple[Rule, ...] = (
    Rule(name="devices",
         holds=lambda m, q, s, d, x: s.num_devices % (d.tp * d.pp * d.cp) == 0,
         message=lambda m, q, s, d, x: f"tp({d.tp}) x pp({d.pp}) x cp({d.cp}) = "
         f"{d.tp * d.pp * d.cp} does not divide the {s.num_devices} devices"),
    Rule(name="dp",
         holds=lambda m, q, s, d, x: d.tp * d.pp * d.cp * x.dp == s.num_devices,
         message=lambda m, q, s, d, x: f"tp({d.tp}) x pp({d.pp}) x cp({d.cp}) x dp({x.dp}) = "
         f"{d.tp * d.pp * d.cp * x.dp} != {s.num_devices} devices"),
    Rule(name="heads",
         holds=lambda m, q, s, d, x: m.num_attention_heads % d.tp == 0,
         message=lambda m, q, s, d, x: f"num_attention_heads({m.num_attention_heads}) is not "
         f"divisible by tp({d.tp})"),
    Rule(name="query_groups",
         holds=lambda m, q, s, d, x: (m.query_groups % d.tp == 0) | (m.mla is not None),
         message=lambda m, q, s, d, x: f"num_query_groups({m.query_groups}) is not divisible "
         f"by tp({d.tp})"),
    Rule(name="ffn",
         holds=lambda m, q, s, d, x: m.ffn % d.tp == 0,
         message=lambda m, q, s, d, x: f"ffn_hidden_size({m.ffn}) is not divisible by "
         f"tp({d.tp})"),
    # Checked before the split, to name the virtual stages along with the pipeline's.
    Rule(name="layers",
         holds=lambda m, q, s, d, x: _split(d) | (s.num_layers % (d.pp * d.vpp) == 0)
         | ((s.num_layers % d.pp == 0) & _slotted(d, x)),
         message=lambda m, q, s, d, x: f"num_layers({s.num_layers}) is not divisible by "
         f"pp({d.pp}) x vpp({d.vpp}) = {d.pp * d.vpp}"),
    Rule(name="split_pp",
         holds=lambda m, q, s, d, x: (d.first == 0) & (d.last == 0) | (d.pp > 1),
         message=lambda m, q, s, d, x: "first/last stage layers need pp > 1"),
    Rule(name="split",
         holds=lambda m, q, s, d, x: (d.first == 0) & (d.last == 0) | _even_split(s, d),
         message=lambda m, q, s, d, x: f"num_layers({s.num_layers}) minus the first/last "
         f"stage layers ({_given(d)}) does not split evenly over the other {_middle(d)} "
         f"stages"),
    Rule(name="chunks",
         holds=lambda m, q, s, d, x: _chunked(d, x),
         message=lambda m, q, s, d, x: f"with vpp({d.vpp}) every stage's layers must divide "
         f"into equal chunks, or every stage's slots with the embedding and the loss taking "
         f"one each; stages hold {_held(x)}"),
    Rule(name="vpp_pp",
         holds=lambda m, q, s, d, x: (d.vpp == 1) | (d.pp > 1),
         message=lambda m, q, s, d, x: f"vpp({d.vpp}) > 1 needs pp > 1"),
    Rule(name="vpp_schedule",
         holds=lambda m, q, s, d, x: (d.vpp == 1) | (d.gpipe == False),  # noqa: E712
         message=lambda m, q, s, d, x: "vpp > 1 is the interleaved 1F1B schedule"),
    Rule(name="batch",
         holds=lambda m, q, s, d, x: s.global_batch % np.maximum(x.dp * d.mbs, 1) == 0,
         message=lambda m, q, s, d, x: f"global_batch({s.global_batch}) is not divisible by "
         f"dp({x.dp}) x mbs({d.mbs}) = {x.dp * d.mbs}"),
    Rule(name="interleaved_microbatches",
         holds=lambda m, q, s, d, x: (d.vpp == 1) | (d.zb_v == True)  # noqa: E712
         | (x.num_microbatches % d.pp == 0),
         message=lambda m, q, s, d, x: f"interleaved schedule: microbatches"
         f"({x.num_microbatches}) must be a multiple of pp({d.pp})"),
    Rule(name="zb_h1_vpp",
         holds=lambda m, q, s, d, x: (d.zb_h1 == False) | (d.vpp == 1),  # noqa: E712
         message=lambda m, q, s, d, x: f"zb-h1 runs one model chunk per stage: vpp({d.vpp}) "
         f"must be 1"),
    Rule(name="zb_v_vpp",
         holds=lambda m, q, s, d, x: (d.zb_v == False) | (d.vpp == 2),  # noqa: E712
         message=lambda m, q, s, d, x: f"zb-v runs two model chunks per stage in a V: "
         f"vpp({d.vpp}) must be 2"),
    Rule(name="zb_v_microbatches",
         holds=lambda m, q, s, d, x: (d.zb_v == False)  # noqa: E712
         | (x.num_microbatches >= 2 * d.pp - 1),
         message=lambda m, q, s, d, x: f"zb-v: microbatches({x.num_microbatches}) must be at "
         f"least 2 x pp({d.pp}) - 1 = {2 * d.pp - 1} (the planner prices the full V only)"),
    Rule(name="positions",
         holds=lambda m, q, s, d, x: (m.position_embedding != "learned")
         | (q <= m.max_position_embeddings),
         message=lambda m, q, s, d, x: f"seq_len({q}) > max_position_embeddings"
         f"({m.max_position_embeddings}) of a model with learned positions"),
    Rule(name="tp_comm_overlap",
         holds=lambda m, q, s, d, x: (d.tp_comm_overlap == False) | (d.tp == 1) | d.sp,  # noqa: E712
         message=lambda m, q, s, d, x: "tp_comm_overlap needs sequence parallelism (--sp), as "
         "in Megatron-Core"),
    Rule(name="cp_ring",
         holds=lambda m, q, s, d, x: d.ulysses | (d.cp == 1) | (q % (2 * d.cp) == 0),
         message=lambda m, q, s, d, x: f"seq_len({q}) is not divisible by 2 x cp({d.cp}) "
         f"(load-balanced causal CP)"),
    Rule(name="cp_ulysses",
         holds=lambda m, q, s, d, x: (d.ulysses == False) | (q % d.cp == 0),  # noqa: E712
         message=lambda m, q, s, d, x: f"seq_len({q}) is not divisible by cp({d.cp})"),
    Rule(name="cp_ulysses_heads",
         holds=lambda m, q, s, d, x: (d.ulysses == False)  # noqa: E712
         | ((m.num_attention_heads % _tp_cp(d) == 0)
            & ((m.mla is not None) | (m.query_groups % _tp_cp(d) == 0))),
         message=lambda m, q, s, d, x: f"ulysses context parallelism splits heads over tp x "
         f"cp: num_attention_heads({m.num_attention_heads}) and num_query_groups"
         f"({m.query_groups}) must divide by tp({d.tp}) x cp({d.cp}) = {d.tp * d.cp}"),
    Rule(name="no_experts",
         holds=lambda m, q, s, d, x: (m.moe is not None) | (d.ep == 1),
         message=lambda m, q, s, d, x: f"ep({d.ep}) > 1 but {m.name} has no experts"),
    Rule(name="experts",
         holds=lambda m, q, s, d, x: (m.moe is None) | (_experts(m) % d.ep == 0),
         message=lambda m, q, s, d, x: f"num_experts({_experts(m)}) is not divisible by "
         f"ep({d.ep})"),
    Rule(name="expert_ranks",
         holds=lambda m, q, s, d, x: (m.moe is None) | ((x.dp * d.cp) % d.ep == 0),
         message=lambda m, q, s, d, x: f"ep({d.ep}) must divide dp({x.dp}) x cp({d.cp}) = "
         f"{x.dp * d.cp}"),
    Rule(name="moe_comm_overlap",
         holds=lambda m, q, s, d, x: (d.moe_comm_overlap == False) | (d.ep > 1),  # noqa: E712
         message=lambda m, q, s, d, x: "overlap_moe_expert_parallel_comm needs expert "
         f"parallelism: ep({d.ep}) has no all-to-all to overlap"),
    Rule(name="moe_comm_overlap_schedule",
         holds=lambda m, q, s, d, x: combined_1f1b(d),
         message=lambda m, q, s, d, x: "overlap_moe_expert_parallel_comm pairs a 1F1B "
         "schedule's forwards and backwards (combined 1F1B): not with GPipe, a zero-bubble "
         "schedule or full recomputation"),
)  # fmt: skip
"""Every rule, in the order :func:`~planner.plan.config.resolve` checks them."""
RULE = {rule.name: rule for rule in RULES}
"""The rules by name."""


def _experts(model: ModelSpec) -> int:
    return model.moe.num_experts if model.moe is not None else 1


def broken(model: ModelSpec, seq_length: int, shape: Shape, d: Degrees) -> Iterator[Rule]:
    """The rules one configuration breaks, in order."""
    x = derive(shape, d)
    return (r for r in RULES if not r.holds(model, seq_length, shape, d, x))


def first_broken(
    model: ModelSpec, seq_length: int, shape: Shape, d: Degrees, x: Derived | None = None
) -> Real:
    """Per configuration of a batch, the index in :data:`RULES` of the first rule it breaks,
    -1 where it keeps them all (``x``: :func:`derive` of ``d``, when already at hand)."""
    x = derive(shape, d) if x is None else x
    first = np.full(np.shape(d.tp), -1, dtype=np.int16)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i, rule in reversed(list(enumerate(RULES))):
            holds = np.broadcast_to(rule.holds(model, seq_length, shape, d, x), first.shape)
            first[~holds] = i
    return first
