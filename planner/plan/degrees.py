"""A uniform configuration's degrees and switches as the divisibility rules read them, for
one configuration (Python values) or a batch (numpy arrays, one element per configuration),
and what follows from them: the data-parallel degree, the microbatches and the layer split.

>>> d = derive(Shape(num_devices=1024, num_layers=96, global_batch=1536), Degrees(tp=8, pp=16))
>>> int(d.dp), int(d.num_microbatches), d.stage_layers[:3]
(8, 192, (6, 6, 6))
>>> d = derive(Shape(num_devices=1024, num_layers=96, global_batch=1536),
...            Degrees(tp=np.array([8, 4]), pp=np.array([16, 8])))
>>> d.dp, d.num_microbatches
(array([ 8, 32]), array([192,  48]))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

import numpy as np

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
    etp: Real = 0
    """Expert tensor-parallel degree as given; 0: the tensor-parallel degree."""
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
    deepep: Real = False
    """The experts' tokens exchanged by DeepEP (else NCCL's all-to-all)."""
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
                       etp=self.etp * folded(self), sp=self.sp & (self.tp > 1),
                       ulysses=self.ulysses & (self.cp > 1))  # fmt: skip

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

    >>> degrees_of({"tp": 8, "pp": 4, "cp": 1, "dp": None, "ep": 1, "etp": None, "vpp": 1,
    ...             "mbs": 1,
    ...             "first_stage_layers": None, "last_stage_layers": None, "sp": True,
    ...             "cp_algo": "ring", "tp_comm_overlap": False, "schedule": "1f1b",
    ...             "overlap_moe_expert_parallel_comm": False, "recompute": "none",
    ...             "moe_dispatcher": "alltoall"}).dp
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
                   ep=knobs["ep"], etp=given("etp"), vpp=knobs["vpp"],
                   first=given("first_stage_layers"), last=given("last_stage_layers"),
                   mbs=knobs["mbs"],
                   ulysses=knobs["cp_algo"] == "ulysses", sp=switch("sp"),
                   tp_comm_overlap=switch("tp_comm_overlap"),
                   moe_comm_overlap=switch("overlap_moe_expert_parallel_comm"),
                   deepep=knobs["moe_dispatcher"] == "deepep",
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


def folded(d: Degrees) -> Real:
    """Whether the routed experts are folded over the tensor-parallel ranks (MoE parallel
    folding: ``etp`` 1 under ``tp`` > 1), their expert-parallel groups then taking the
    tensor-parallel ranks first, as Megatron-Core's expert rank generator (order
    ``tp-ep-dp-pp`` with ``tp`` = ``etp``, ``megatron/core/parallel_state.py``) and
    torchtitan's sparse mesh (``ep`` just outside ``etp``,
    ``torchtitan/distributed/parallel_dims.py``) number them.

    >>> bool(folded(Degrees(tp=2, etp=1))), bool(folded(Degrees(tp=2))), bool(folded(Degrees()))
    (True, False, False)
    """
    return (d.etp == 1) & (d.tp > 1)


def expert_ways(d: Degrees, x: Derived) -> Real:
    """The ranks of a stage that Megatron-Core's expert grid spreads the experts over
    (``world / (etp x pp)`` per pipeline stage): the data- and context-parallel ranks, and
    the tensor-parallel ranks too when folded."""
    return x.dp * d.cp * (1 + (d.tp - 1) * folded(d))
