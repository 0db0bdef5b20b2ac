"""The rules a uniform configuration must keep to divide the model, the batch and the cluster,
each written once and evaluated on one configuration (:func:`planner.plan.config.resolve`,
which raises the first broken rule's message) or on arrays over many
(:func:`planner.uniform.batch.estimate_batch`, which keeps a mask and the first broken rule's
index per configuration), over the degrees of :mod:`planner.plan.degrees`.

A rule's test uses ``&``, ``|`` and comparisons only, so Python ints and numpy arrays both
pass through it; its message is formatted for one configuration.

>>> from pathlib import Path
>>> from planner.spec.reading import load_model
>>> model = load_model(Path(__file__).resolve().parents[2] / "instances/models/gpt3-175b.json")
>>> shape = Shape(num_devices=1024, num_layers=96, global_batch=1536)
>>> [rule.name for rule in broken(model, 2048, shape, Degrees(tp=8, pp=5))][:3]
['devices', 'dp', 'layers']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from planner.plan.chunks import slotted_ends
from planner.plan.degrees import (
    Degrees,
    Derived,
    Real,
    Shape,
    combined_1f1b,
    derive,
    expert_ways,
    folded,
)
from planner.spec import ModelSpec


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


def _slotted(m: ModelSpec, d: Degrees, x: Derived) -> Real:
    embedding, loss = slotted_ends(first=x.first_layers, middle=x.middle_layers,
                                   last=x.last_layers, pp=d.pp, vpp=d.vpp, v_shape=d.zb_v,
                                   mtp=m.mtp_layers)  # fmt: skip
    return embedding | (loss > 0)


def _batches_that_divide(shape: Shape, per_step: int) -> str:
    """The global batches nearest ``shape``'s that ``per_step`` sequences divide (the
    multiples of it either side), as a remedy's words."""
    below = shape.global_batch // per_step * per_step
    nearest = [b for b in (below, below + per_step) if b > 0]
    return f": a global batch of {' or '.join(map(str, nearest))} would divide"


def _chunked(m: ModelSpec, d: Degrees, x: Derived) -> Real:
    """Every stage's decoder layers cut into ``vpp`` chunks as Megatron-Core cuts them: equal
    chunks, or the embedding's and the loss's (and multi-token-prediction modules') slots
    short (:func:`~planner.plan.chunks.slotted_ends`)."""
    equal = ((x.first_layers % d.vpp == 0) & (x.last_layers % d.vpp == 0)
             & ((d.pp <= 2) | (x.middle_layers % d.vpp == 0)))  # fmt: skip
    return equal | _slotted(m, d, x)


def _split(d: Degrees) -> Real:
    return (d.first > 0) | (d.last > 0)


def _given(d: Degrees) -> int:
    return int(d.first) + int(d.last)


def _middle(d: Degrees) -> int:
    return int(d.pp) - int(d.first > 0) - int(d.last > 0)


def _modules_too(m: ModelSpec) -> str:
    return " (and the loss's end one more a multi-token-prediction module)" * (m.mtp_layers > 0)


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
         | ((s.num_layers % d.pp == 0) & _slotted(m, d, x)),
         message=lambda m, q, s, d, x: f"num_layers({s.num_layers}) is not divisible by "
         f"pp({d.pp}) x vpp({d.vpp}) = {d.pp * d.vpp} (end stages of fewer layers may cut "
         f"into chunks: estimate's --first-stage-layers and --last-stage-layers)"),
    Rule(name="split_pp",
         holds=lambda m, q, s, d, x: (d.first == 0) & (d.last == 0) | (d.pp > 1),
         message=lambda m, q, s, d, x: "first/last stage layers need pp > 1"),
    Rule(name="split",
         holds=lambda m, q, s, d, x: (d.first == 0) & (d.last == 0) | _even_split(s, d),
         message=lambda m, q, s, d, x: f"num_layers({s.num_layers}) minus the first/last "
         f"stage layers ({_given(d)}) does not split evenly over the other {_middle(d)} "
         f"stages"),
    Rule(name="chunks",
         holds=lambda m, q, s, d, x: _chunked(m, d, x),
         message=lambda m, q, s, d, x: f"with vpp({d.vpp}) every stage's layers must divide "
         f"into equal chunks, or every stage's slots with the embedding and the loss taking "
         f"one each{_modules_too(m)}; stages hold {_held(x)}"),
    Rule(name="vpp_pp",
         holds=lambda m, q, s, d, x: (d.vpp == 1) | (d.pp > 1),
         message=lambda m, q, s, d, x: f"vpp({d.vpp}) > 1 needs pp > 1"),
    Rule(name="vpp_schedule",
         holds=lambda m, q, s, d, x: (d.vpp == 1) | (d.gpipe == False),  # noqa: E712
         message=lambda m, q, s, d, x: "vpp > 1 is the interleaved 1F1B schedule"),
    Rule(name="batch",
         holds=lambda m, q, s, d, x: s.global_batch % np.maximum(x.dp * d.mbs, 1) == 0,
         message=lambda m, q, s, d, x: f"global_batch({s.global_batch}) is not divisible by "
         f"dp({x.dp}) x mbs({d.mbs}) = {x.dp * d.mbs}{_batches_that_divide(s, x.dp * d.mbs)}"),
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
         holds=lambda m, q, s, d, x: (m.moe is not None)
         | ((d.ep == 1) & (folded(d) == False)),  # noqa: E712
         message=lambda m, q, s, d, x: f"{f'ep({d.ep}) > 1' if d.ep > 1 else 'etp(1)'} but "
         f"{m.name} has no experts"),
    Rule(name="etp",
         holds=lambda m, q, s, d, x: (d.etp == 0) | (d.etp == d.tp) | (d.etp == 1),
         message=lambda m, q, s, d, x: f"etp({d.etp}) must be tp({d.tp}) or 1: the planner "
         f"splits the experts like the rest of the layer or folds them over the "
         f"tensor-parallel ranks"),
    Rule(name="folded_ep",
         holds=lambda m, q, s, d, x: (folded(d) == False) | (d.ep % d.tp == 0),  # noqa: E712
         message=lambda m, q, s, d, x: f"etp(1) folds the tensor-parallel ranks into the "
         f"experts' groups, which take them first: ep({d.ep}) must be a multiple of "
         f"tp({d.tp})"),
    Rule(name="folded_sp",
         holds=lambda m, q, s, d, x: (folded(d) == False) | d.sp,  # noqa: E712
         message=lambda m, q, s, d, x: "etp(1) sends each tensor-parallel rank's sequence "
         "shard to its experts: it needs sequence parallelism (sp)"),
    Rule(name="experts",
         holds=lambda m, q, s, d, x: (m.moe is None) | (_experts(m) % d.ep == 0),
         message=lambda m, q, s, d, x: f"num_experts({_experts(m)}) is not divisible by "
         f"ep({d.ep})"),
    Rule(name="expert_ranks",
         holds=lambda m, q, s, d, x: (m.moe is None) | (expert_ways(d, x) % d.ep == 0),
         message=lambda m, q, s, d, x: f"ep({d.ep}) must divide "
         f"{f'tp({d.tp}) x ' if folded(d) else ''}dp({x.dp}) x cp({d.cp}) = "
         f"{expert_ways(d, x)}"),
    Rule(name="moe_comm_overlap",
         holds=lambda m, q, s, d, x: (d.moe_comm_overlap == False) | (d.ep > 1),  # noqa: E712
         message=lambda m, q, s, d, x: "overlap_moe_expert_parallel_comm needs expert "
         f"parallelism: ep({d.ep}) has no all-to-all to overlap"),
    Rule(name="deepep",
         holds=lambda m, q, s, d, x: (d.deepep == False) | ((m.moe is not None)  # noqa: E712
                                                            & (d.ep > 1)),
         message=lambda m, q, s, d, x: "moe_dispatcher deepep exchanges the experts' tokens "
         f"over expert-parallel ranks: ep({d.ep}){'' if m.moe else ' of a dense model'} has "
         "none to exchange"),
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
