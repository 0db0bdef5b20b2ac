"""A uniform (Megatron-style) parallel configuration and its divisibility rules.

Field names match the CLI options of ``planner estimate``. :func:`resolve` fills in defaults
from the model's training block and the cluster size and checks that every degree divides
what it splits, with messages that show the arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.errors import ConfigError
from planner.plan.degrees import Degrees, Derived, Shape, degrees_of, derive
from planner.plan.divisibility import RULE, Rule, broken, first_broken
from planner.spec import ClusterSpec, Int, ModelSpec, TrainingSpec
from planner.spec import limits as lim
from planner.spec.reading import check_device, check_stack, fill_training
from planner.vocabulary import (
    DEFAULT_RANK_ORDER,
    DEFAULT_RECOMPUTE_MODULES,
    OP_SAC,
    RECOMPUTE_MODULES,
    ContextParallelism,
    MoeDispatcher,
    Offload,
    OptimizerMoments,
    PipelineSchedule,
    Precision,
    Recompute,
    RecomputeModule,
    Stack,
    rank_order_problem,
)


class ParallelConfig(BaseModel):
    """One uniform configuration: the same sharding on every layer, equal pipeline stages.

    Defaults are Megatron-LM's own (no SP, no distributed optimizer, no overlap), except fused
    (flash) attention, which Megatron-Core uses by default through Transformer Engine.

    >>> config = ParallelConfig(tp=8, pp=16, sp=True, zero=1)
    >>> config.dp, config.mbs, config.schedule, config.flash_attention, config.overlap_grad_reduce
    (None, 1, '1f1b', True, False)

    ``dp`` left at None is the devices left over once a cluster is known
    (:func:`planner.estimate` fills it in).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Degrees are bounded by the largest cluster, layer counts by the largest model: past
    # them a configuration cannot divide anything (planner.spec.limits).
    tp: Int = Field(default=1, gt=0, le=lim.MAX_DEVICES, description="Tensor-parallel degree.")
    pp: Int = Field(default=1, gt=0, le=lim.MAX_LAYERS, description="Pipeline-parallel degree.")
    dp: Int | None = Field(default=None, gt=0, le=lim.MAX_DEVICES, description="Data-parallel "
                           "degree; default: the devices left over.")  # fmt: skip
    cp: Int = Field(default=1, gt=0, le=lim.MAX_DEVICES, description="Context-parallel degree.")
    cp_algo: ContextParallelism = Field(
        default="ring", description="How context parallelism attends: ring (K/V passed around "
        "the ring, Megatron-Core's p2p), ulysses (all-to-alls from sequence to head shards "
        "around the attention core, DeepSpeed-Ulysses) or allgather (K/V all-gathered, their "
        "gradients passed around the ring: PyTorch's context parallelism, torchtitan's).",
    )  # fmt: skip
    ep: Int = Field(default=1, gt=0, le=lim.MAX_DEVICES, description="Expert-parallel degree.")
    etp: Int | None = Field(
        default=None, gt=0, le=lim.MAX_DEVICES, description="Expert tensor-parallel degree: "
        "the tensor-parallel ways of the routed experts; default tp (Megatron's). 1 under "
        "tp > 1 folds the tensor-parallel ranks into the experts' groups (MoE parallel "
        "folding, --expert-tensor-parallel-size 1).",
    )  # fmt: skip
    vpp: Int = Field(default=1, gt=0, le=lim.MAX_LAYERS, description="Virtual pipeline stages "
                     "per device (interleaved 1F1B when > 1).")  # fmt: skip
    first_stage_layers: Int | None = Field(
        default=None, gt=0, le=lim.MAX_LAYERS, description="Decoder layers on the first "
        "pipeline stage when it differs from the rest (Megatron's "
        "--decoder-first-pipeline-num-layers).",
    )  # fmt: skip
    last_stage_layers: Int | None = Field(
        default=None, gt=0, le=lim.MAX_LAYERS, description="Decoder layers on the last pipeline "
        "stage when it differs (--decoder-last-pipeline-num-layers).",
    )  # fmt: skip
    sp: bool = Field(default=False, description="Sequence parallelism with tensor parallelism.")
    mbs: Int = Field(default=1, gt=0, le=lim.MAX_MICRO_BATCH_SIZE, description="Microbatch "
                     "size.")  # fmt: skip
    global_batch: Int | None = Field(
        default=None, gt=0, le=lim.MAX_GLOBAL_BATCH_SIZE, description="Sequences per "
        "optimizer step; default: the model's training block.",
    )  # fmt: skip
    seq_len: Int | None = Field(default=None, gt=0, le=lim.MAX_SEQ_LENGTH, description="Tokens "
                                "per sequence; default: the model's training block.")  # fmt: skip
    recompute: Recompute = Field(
        default="none", description="Activation recomputation: none, selective (the "
        "attention core, Korthikanti et al.) or full (each layer's forward).",
    )  # fmt: skip
    recompute_layers: Int | None = Field(
        default=None, gt=0, le=lim.MAX_LAYERS, description="With full recomputation, the "
        "decoder layers of each model chunk that recompute, the chunk's first ones; the rest "
        "keep their activations (Megatron's --recompute-method block --recompute-num-layers); "
        "default: every layer.",
    )  # fmt: skip
    recompute_modules: str | None = Field(
        default=None, description="With selective recomputation, what it reruns, as "
        "Megatron-Core's --recompute-modules names them, comma-separated: core_attn, moe_act, "
        "layernorm, mla_up_proj, mlp, moe, shared_experts; or op alone, torchtitan's "
        "per-operator policy (selective_ac_option = \"op\"); default: core_attn.",
    )  # fmt: skip
    zero: Literal[0, 1, 2, 3] = Field(
        default=0, description="0: replicated optimizer; 1: optimizer states sharded over "
        "data parallel (Megatron's distributed optimizer); 2: + gradients; 3: + weights.",
    )  # fmt: skip
    offload: Offload = Field(
        default="none", description="What lives in host memory: none, or the optimizer (its "
        "states, master weights and a gradient copy, and the Adam step on the CPU), copied "
        "after the backward (optimizer: Megatron-LM's) or during it (zero-offload: "
        "DeepSpeed's).",
    )  # fmt: skip
    precision: Precision | None = Field(default=None, description="Compute precision; "
                                        "default: the model's training block, else bf16.")
    stack: Stack | None = Field(default=None, description="The software that runs each layer; "
                                "default: the framework's, else the "
                                "model's training block's, else megatron-te.")
    schedule: PipelineSchedule = Field(default="1f1b", description="Pipeline schedule.")
    flash_attention: bool = Field(
        default=True, description="Fused attention: no s x s tensors kept, causal half of the "
        "score FLOPs executed.",
    )  # fmt: skip
    overlap_grad_reduce: bool = Field(
        default=False, description="Overlap the gradient reduction with the last backward."
    )
    overlap_param_gather: bool = Field(
        default=False, description="Overlap ZeRO parameter all-gathers with the forward."
    )
    tp_comm_overlap: bool = Field(
        default=False, description="Overlap tensor-parallel collectives with the adjacent GEMMs."
    )
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False, description="Overlap the experts' all-to-alls of one microbatch with "
        "another's compute (Megatron-Core's combined 1F1B).",
    )  # fmt: skip
    optimizer_moments: OptimizerMoments = Field(
        default="fp32", description="Adam's moments: fp32, or bf16 (Megatron-LM's "
        "precision-aware optimizer, --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, which also "
        "keeps the fp32 master weights as the 16 bits a bf16 weight lacks: 6 bytes of "
        "optimizer state a parameter instead of 12).",
    )  # fmt: skip
    moe_dispatcher: MoeDispatcher = Field(
        default="alltoall", description="How the experts' tokens are exchanged: alltoall "
        "(NCCL's all-to-all, a copy per chosen expert) or deepep (DeepSeek's DeepEP under "
        "Megatron-Core's flex dispatcher: a copy per node over the network, forwarded over "
        "NVLink; the cluster must have DeepEP installed).",
    )  # fmt: skip
    rank_order: str = Field(
        default=DEFAULT_RANK_ORDER,
        description="How ranks are numbered, fastest first (Megatron's process-group order).",
    )

    @field_validator("rank_order")
    @classmethod
    def _known_rank_order(cls, order: str) -> str:
        """A rank order Megatron-LM's spelling takes, checked before any degree divides."""
        problem = rank_order_problem(order)
        if problem is not None:
            raise ValueError(problem)
        return order

    @field_validator("recompute_modules")
    @classmethod
    def _canonical_modules(cls, text: str | None) -> str | None:
        """The modules in Megatron-Core's order, once each; the default as None."""
        if text is None:
            return None
        modules = recompute_modules_of(text)
        return None if modules == DEFAULT_RECOMPUTE_MODULES else ",".join(modules)

    @model_validator(mode="before")
    @classmethod
    def _etp_when_not_tp(cls, data: object) -> object:
        """An expert tensor parallelism equal to tp is the default: said as None, so the same
        configuration is spelled once."""
        if isinstance(data, dict) and data.get("etp") is not None \
                and data.get("etp") == data.get("tp", 1):
            data = {**data, "etp": None}
        return data

    @model_validator(mode="after")
    def _modules_are_selective(self) -> ParallelConfig:
        """Recompute modules say what selective recomputation reruns."""
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ValueError(f"recompute_modules({self.recompute_modules}) needs recompute "
                             f"'selective', not {self.recompute!r}")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _partial_recompute_is_full(self) -> ParallelConfig:
        """A count of recomputed layers means full recomputation of those layers."""
        if self.recompute_layers is not None and self.recompute != "full":
            raise ValueError(f"recompute_layers({self.recompute_layers}) needs recompute "
                             f"'full', not {self.recompute!r}")  # fmt: skip
        return self


def recompute_modules_of(text: str | None) -> tuple[RecomputeModule, ...]:
    """The recompute modules ``text`` names (commas or spaces between them), in Megatron-Core's
    order, once each; None: the default. Raises :class:`ValueError` naming an unknown one.

    >>> recompute_modules_of("layernorm moe_act"), recompute_modules_of(None)
    (('moe_act', 'layernorm'), ('core_attn',))
    """
    if text is None:
        return DEFAULT_RECOMPUTE_MODULES
    names = set(text.replace(",", " ").split())
    unknown = sorted(names - set(RECOMPUTE_MODULES))
    if unknown:
        raise ValueError(f"recompute module {unknown[0]!r}: expected some of "
                         f"{', '.join(RECOMPUTE_MODULES)}")
    if not names:
        raise ValueError("recompute_modules names no module")
    if OP_SAC in names and len(names) > 1:
        raise ValueError(f"recompute module {OP_SAC!r} (torchtitan's per-operator policy) "
                         f"checkpoints the whole block: name it alone")
    return tuple(m for m in RECOMPUTE_MODULES if m in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedConfig:
    """A configuration checked against a model and a cluster, with every default filled in."""

    config: ParallelConfig
    """The configuration as given."""
    training: TrainingSpec
    """The run's sequence length, global batch and precision, defaults filled in."""
    dp: int
    """Data-parallel degree: as given, else the devices left over."""
    num_microbatches: int
    """Microbatches per step: the global batch over ``dp x mbs``."""
    num_devices: int
    """Devices of the cluster."""
    stage_layers: tuple[int, ...] = ()
    """Decoder layers on each pipeline stage, first to last."""

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (only meaningful with TP > 1)."""
        return self.config.sp and self.config.tp > 1

    @property
    def recompute_modules(self) -> tuple[RecomputeModule, ...]:
        """What selective recomputation reruns (meaningful under ``recompute`` selective)."""
        return recompute_modules_of(self.config.recompute_modules)

    @property
    def etp(self) -> int | None:
        """The expert tensor-parallel degree where it is not tp: 1 when the experts are
        folded over the tensor-parallel ranks, else None."""
        c = self.config
        return 1 if c.etp == 1 and c.tp > 1 else None


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _run(model: ModelSpec, cluster: ClusterSpec, seq_len: int | None, global_batch: int | None,
         precision: Precision | None, stack: Stack | None) -> tuple[TrainingSpec, Shape]:
    """A configuration's run (its fields, else the model's training block) on a device that
    runs its stack, and the shape its degrees divide."""
    training = fill_training(model, seq_length=seq_len, global_batch_size=global_batch,
                             precision=precision, stack=stack)
    check_device(training.stack, cluster.device)
    check_stack(training.stack, model)
    return training, Shape(num_devices=cluster.num_devices, num_layers=model.num_layers,
                           global_batch=training.global_batch_size)


def resolve(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> ResolvedConfig:
    """Fill defaults and check divisibility (:data:`planner.plan.divisibility.RULES`, in
    order); raises :class:`ConfigError` naming the first rule broken, with its arithmetic
    (:class:`~planner.errors.InputError` when neither the configuration nor the model's
    training block gives the sequence length or the global batch)."""
    training, shape, d, x = _placed(model, cluster, config)
    for rule in broken(model, training.seq_length, shape, d):
        raise ConfigError(rule.message(model, training.seq_length, shape, d, x))
    return ResolvedConfig(
        config=config, training=training, dp=int(x.dp), num_microbatches=int(x.num_microbatches),
        num_devices=cluster.num_devices, stage_layers=x.stage_layers,
    )  # fmt: skip


def broken_rules(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig
) -> list[tuple[str, str]]:
    """Every rule of :data:`planner.plan.divisibility.RULES` ``config`` breaks, as its name and
    message, in order (:func:`resolve` raises the first's message); empty when it divides."""
    training, shape, d, x = _placed(model, cluster, config)
    return [(rule.name, rule.message(model, training.seq_length, shape, d, x))
            for rule in broken(model, training.seq_length, shape, d)]  # fmt: skip


def _placed(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig
) -> tuple[TrainingSpec, Shape, Degrees, Derived]:
    """``config``'s run, the shape its degrees divide, its degrees and what follows from them
    (data parallelism, microbatches, stage layers): what the rules are evaluated on."""
    training, shape = _run(model, cluster, config.seq_len, config.global_batch,
                           config.precision, config.stack)  # fmt: skip
    d = degrees_of(dict(config))
    return training, shape, d, derive(shape, d)


_KNOBS = ("tp", "pp", "cp", "dp", "ep", "etp", "vpp", "mbs", "first_stage_layers",
          "last_stage_layers", "sp", "cp_algo", "tp_comm_overlap",
          "overlap_moe_expert_parallel_comm", "moe_dispatcher", "recompute", "schedule")
"""The fields :func:`~planner.plan.degrees.degrees_of` reads."""


def resolve_each(
    model: ModelSpec, cluster: ClusterSpec, configs: Sequence[ParallelConfig]
) -> list[ResolvedConfig | None]:
    """:func:`resolve` of every configuration, None for one it refuses with a
    :class:`ConfigError`: the rules run once over columns of the configurations of each run
    (sequence, batch, precision and stack), as the batch estimator runs them, where a
    search's space would run them one configuration at a time (some 100 us each).

    >>> import planner
    >>> model = planner.load_model("instances/models/llama3-8b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1)
    >>> each = resolve_each(model, cluster, [ParallelConfig(tp=2, pp=2), ParallelConfig(tp=3)])
    >>> each[0] == resolve(model, cluster, ParallelConfig(tp=2, pp=2)), each[1]
    (True, None)
    """
    runs: dict[tuple[int | None, int | None, Precision | None, Stack | None], list[int]] = (
        defaultdict(list))
    for i, c in enumerate(configs):
        runs[c.seq_len, c.global_batch, c.precision, c.stack].append(i)
    out: list[ResolvedConfig | None] = [None] * len(configs)
    for (seq_len, global_batch, precision, stack), rows in runs.items():
        training, shape = _run(model, cluster, seq_len, global_batch, precision, stack)
        d = degrees_of({k: np.array([0 if (v := getattr(configs[i], k)) is None else v
                                     for i in rows]) for k in _KNOBS})  # fmt: skip
        x = derive(shape, d)
        keeps = first_broken(model, training.seq_length, shape, d, x) < 0
        for j, i in enumerate(rows):
            if keeps[j]:
                out[i] = ResolvedConfig(
                    config=configs[i], training=training, dp=int(x.dp[j]),
                    num_microbatches=int(x.num_microbatches[j]),
                    num_devices=cluster.num_devices, stage_layers=x.stage_layers_of(j),
                )  # fmt: skip
    return out


def check_sequence(model: ModelSpec, seq_length: int) -> None:
    """A model with learned positions has none beyond its table: refuse longer sequences."""
    _check(RULE["positions"], model, seq_length, Degrees())


_NO_SHAPE = Shape(num_devices=1, num_layers=1, global_batch=1)
"""For rules that read no device count, layers or batch."""


def _check(rule: Rule, model: ModelSpec, seq_length: int, d: Degrees,
           shape: Shape = _NO_SHAPE) -> None:  # fmt: skip
    x = derive(shape, d)
    if not rule.holds(model, seq_length, shape, d, x):
        raise ConfigError(rule.message(model, seq_length, shape, d, x))


def stage_layers(
    num_layers: int, *, pp: int, first: int | None = None, last: int | None = None
) -> tuple[int, ...]:
    """Decoder layers on each of ``pp`` pipeline stages, first to last: the first and the last
    as given (Megatron's ``--decoder-first-pipeline-num-layers`` and
    ``--decoder-last-pipeline-num-layers``), the other stages equal; raises
    :class:`ConfigError` when the rest does not split evenly over them.

    >>> stage_layers(126, pp=16, first=7, last=7)[:3], stage_layers(96, pp=16)[:3]
    ((7, 8, 8), (6, 6, 6))
    """
    if first is None and last is None:
        _need(num_layers % pp == 0, f"num_layers({num_layers}) is not divisible by pp({pp})")
    d = Degrees(pp=pp, first=first or 0, last=last or 0)
    shape = Shape(num_devices=pp, num_layers=num_layers, global_batch=1)
    unused = cast(ModelSpec, None)  # the split's rules read no model and no sequence
    for name in ("split_pp", "split"):
        _check(RULE[name], unused, 0, d, shape)
    return derive(shape, d).stage_layers
