"""A uniform (Megatron-style) parallel configuration and its divisibility rules.

Field names match the CLI options of ``planner estimate``. :func:`resolve` fills in defaults
from the model's training block and the cluster size and checks that every degree divides
what it splits, with messages that show the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import ConfigError
from planner.spec import ClusterSpec, Int, ModelSpec, TrainingSpec
from planner.spec import limits as lim
from planner.spec.reading import fill_training
from planner.vocabulary import (
    DEFAULT_RANK_ORDER,
    ContextParallelism,
    PipelineSchedule,
    Precision,
    Recompute,
)


class ParallelConfig(BaseModel):
    """One uniform configuration: the same sharding on every layer, equal pipeline stages.

    Defaults are Megatron-LM's own (no SP, no distributed optimizer, no overlap), except fused
    (flash) attention, which Megatron-Core uses by default through Transformer Engine.
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
        "the ring, Megatron-Core's p2p) or ulysses (all-to-alls from sequence to head shards "
        "around the attention core, DeepSpeed-Ulysses).",
    )  # fmt: skip
    ep: Int = Field(default=1, gt=0, le=lim.MAX_DEVICES, description="Expert-parallel degree.")
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
    global_batch: Int | None = Field(default=None, gt=0, le=lim.MAX_GLOBAL_BATCH_SIZE)
    seq_len: Int | None = Field(default=None, gt=0, le=lim.MAX_SEQ_LENGTH)
    recompute: Recompute = "none"
    zero: Literal[0, 1, 2, 3] = Field(
        default=0, description="0: replicated optimizer; 1: optimizer states sharded over "
        "data parallel (Megatron's distributed optimizer); 2: + gradients; 3: + weights.",
    )  # fmt: skip
    precision: Precision | None = None
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
    rank_order: str = Field(
        default=DEFAULT_RANK_ORDER,
        description="How ranks are numbered, fastest first (Megatron's process-group order).",
    )


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


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def resolve(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> ResolvedConfig:
    """Fill defaults and check divisibility; raises :class:`ConfigError` naming the rule
    (:class:`~planner.errors.InputError` when neither the configuration nor the model's
    training block gives the sequence length or the global batch)."""
    training = fill_training(model, seq_length=config.seq_len,
                             global_batch_size=config.global_batch,
                             precision=config.precision)  # fmt: skip
    seq, gbs = training.seq_length, training.global_batch_size

    c = config
    n = cluster.num_devices
    model_parallel = c.tp * c.pp * c.cp
    _need(n % model_parallel == 0,
          f"tp({c.tp}) x pp({c.pp}) x cp({c.cp}) = {model_parallel} does not divide the "
          f"{n} devices")  # fmt: skip
    dp = c.dp or n // model_parallel
    _need(model_parallel * dp == n,
          f"tp({c.tp}) x pp({c.pp}) x cp({c.cp}) x dp({dp}) = {model_parallel * dp} != "
          f"{n} devices")  # fmt: skip
    heads, groups = model.num_attention_heads, model.query_groups
    _need(heads % c.tp == 0, f"num_attention_heads({heads}) is not divisible by tp({c.tp})")
    _need(groups % c.tp == 0 or model.mla is not None,
          f"num_query_groups({groups}) is not divisible by tp({c.tp})")  # fmt: skip
    _need(model.ffn % c.tp == 0, f"ffn_hidden_size({model.ffn}) is not divisible by tp({c.tp})")
    layers = _stage_layers(model.num_layers, c)
    _need(c.vpp == 1 or c.pp > 1, f"vpp({c.vpp}) > 1 needs pp > 1")
    _need(c.vpp == 1 or c.schedule == "1f1b", "vpp > 1 is the interleaved 1F1B schedule")
    per_step = dp * c.mbs
    _need(gbs % per_step == 0,
          f"global_batch({gbs}) is not divisible by dp({dp}) x mbs({c.mbs}) = {per_step}")
    microbatches = gbs // per_step
    _need(c.vpp == 1 or microbatches % c.pp == 0,
          f"interleaved schedule: microbatches({microbatches}) must be a multiple of "
          f"pp({c.pp})")  # fmt: skip
    check_sequence(model, seq)
    _need(not c.tp_comm_overlap or c.tp == 1 or c.sp,
          "tp_comm_overlap needs sequence parallelism (--sp), as in Megatron-Core")
    if c.cp_algo == "ring":
        _need(c.cp == 1 or seq % (2 * c.cp) == 0,
              f"seq_len({seq}) is not divisible by 2 x cp({c.cp}) (load-balanced causal CP)")
    else:  # the all-to-all trades sequence shards for head shards
        _need(seq % c.cp == 0, f"seq_len({seq}) is not divisible by cp({c.cp})")
        _need(heads % (c.tp * c.cp) == 0 and (model.mla is not None or
                                               groups % (c.tp * c.cp) == 0),
              f"ulysses context parallelism splits heads over tp x cp: num_attention_heads"
              f"({heads}) and num_query_groups({groups}) must divide by tp({c.tp}) x "
              f"cp({c.cp}) = {c.tp * c.cp}")  # fmt: skip
    if model.moe is None:
        _need(c.ep == 1, f"ep({c.ep}) > 1 but {model.name} has no experts")
    else:
        experts = model.moe.num_experts
        _need(experts % c.ep == 0, f"num_experts({experts}) is not divisible by ep({c.ep})")
        _need((dp * c.cp) % c.ep == 0,
              f"ep({c.ep}) must divide dp({dp}) x cp({c.cp}) = {dp * c.cp}")  # fmt: skip
    return ResolvedConfig(
        config=c, training=training, dp=dp, num_microbatches=microbatches, num_devices=n,
        stage_layers=layers,
    )  # fmt: skip


def check_sequence(model: ModelSpec, seq_length: int) -> None:
    """A model with learned positions has none beyond its table: refuse longer sequences."""
    _need(model.position_embedding != "learned" or seq_length <= model.max_position_embeddings,
          f"seq_len({seq_length}) > max_position_embeddings({model.max_position_embeddings}) of "
          f"a model with learned positions")  # fmt: skip


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
        return (num_layers // pp,) * pp
    _need(pp > 1, "first/last stage layers need pp > 1")
    given = [n for n in (first, last) if n is not None]
    middle = pp - len(given)
    rest = num_layers - sum(given)
    even = rest == 0 if middle == 0 else rest >= middle and rest % middle == 0
    _need(even,
          f"num_layers({num_layers}) minus the first/last stage layers ({sum(given)}) does not "
          f"split evenly over the other {middle} stages")  # fmt: skip
    each = rest // middle if middle else 0
    return (first or each, *([each] * (pp - 2)), last or each)


def _stage_layers(num_layers: int, c: ParallelConfig) -> tuple[int, ...]:
    """:func:`stage_layers` of ``c``; with virtual stages every stage's layers split into
    ``vpp`` equal chunks (as Megatron-Core requires).

    >>> _stage_layers(126, ParallelConfig(pp=16, first_stage_layers=7, last_stage_layers=7))[:3]
    (7, 8, 8)
    """
    first, last = c.first_stage_layers, c.last_stage_layers
    if first is None and last is None:
        # checked before the split, to name the virtual stages along with the pipeline's
        stages = c.pp * c.vpp
        _need(num_layers % stages == 0,
              f"num_layers({num_layers}) is not divisible by pp({c.pp}) x vpp({c.vpp}) = "
              f"{stages}")  # fmt: skip
    layers = stage_layers(num_layers, pp=c.pp, first=first, last=last)
    _need(all(n % c.vpp == 0 for n in layers),
          f"with vpp({c.vpp}) every stage's layers must divide into equal chunks; stages hold "
          f"{sorted(set(layers))}")  # fmt: skip
    return layers
