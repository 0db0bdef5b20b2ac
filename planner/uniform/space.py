"""The uniform (Megatron-style) configurations a search enumerates, in one place: the grid
baseline, the framework targets, the heuristic, the remedies and the failure messages all draw
their degrees from the functions here.

The space is what a Megatron-LM user can launch with flags:

- ``tp`` and ``cp`` (:func:`~planner.uniform.groups.context_groups`): divisors of the devices
  in a scale-up domain (a node, or an NVL72 rack) that divide the attention heads, the KV
  groups and the FFN; context parallelism from 8,192 tokens on, 1, 2, 4, 8 with ``tp * cp``
  inside a domain, and any power of two that leaves each rank 8,192 tokens with ``tp * cp``
  across whole domains (1,024 where the batch needs it,
  :func:`~planner.uniform.groups.batch_bound`); each as ring attention and as Ulysses
  all-to-alls;
- ``pp``: any degree up to the decoder layers that divides the devices left by ``tp * cp``
  (:func:`pipeline_degrees`), with the layers split by :func:`stage_splits`: equal stages
  where ``pp`` divides the layers, and Megatron's uneven first and last stage around middle
  stages of the fewest layers or one more (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``);
- ``vpp`` (interleaved 1F1B), when ``options.interleaved``: every count of chunks that divides
  every stage's layers (:func:`virtual_stages`; Megatron-Core's rule, uneven stages included);
- the zero-bubble schedules for a target that launches them (:func:`schedules`): ZB-H1, and
  ZB-V (two chunks per stage) when ``options.interleaved`` and two chunks divide the stages;
- ``ep``: divisors of the experts that divide the data- and context-parallel ranks
  (:func:`expert_degrees`; mixtures of experts only);
- ``mbs``: ``options.micro_batch_sizes`` (:func:`micro_batch_sizes`); recomputation none,
  selective or full; ZeRO 0 or 1 (the distributed optimizer), 0 to 3 without a pipeline
  (:func:`zero_stages`);
- sequence parallelism whenever ``tp > 1`` where the framework runs it
  (:func:`sequence_parallel`); flash attention and the overlap flags as the options say, the
  overlaps as the framework launches them
  (:mod:`planner.uniform.defaults`); data parallelism takes the devices left over.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.frameworks import ANY, profile
from planner.options import DEFAULT_OPTIONS, NO_PINS, Pins, SolveOptions, training_of
from planner.plan.chunks import cuts_into
from planner.plan.config import ParallelConfig, stage_layers
from planner.plan.degrees import Degrees, combined_1f1b
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform.defaults import sequence_parallel
from planner.uniform.groups import context_groups, cp_algorithms
from planner.uniform.launched import launched_variant, launched_variants
from planner.uniform.recomputations import recomputations
from planner.vocabulary import (
    CONTEXT_PARALLELISMS,
    RECOMPUTE_MODES,
    ContextParallelism,
    PipelineSchedule,
)

StageEnds = tuple[int | None, int | None]
"""Decoder layers of the first and last pipeline stage; ``(None, None)``: all stages equal."""


def stage_splits(num_layers: int, pp: int) -> list[StageEnds]:
    """The layer splits tried for ``pp`` stages: ``pp - 2`` middle stages of ``m`` layers and
    the first and last stage sharing the rest (Megatron's uneven first and last stage), equal
    stages first where ``pp`` divides the layers.

    ``m`` is ``ceil(num_layers / pp)``, the least the busiest stage can hold, or one more (the
    ends then lighten by ``pp - 2`` layers between them: room for the embedding and the head,
    stages that cut into chunks the equal split does not (DeepSeek-V2's 60 layers on PP4
    VPP2: 14 + 16 x 2 + 14), and an equal split when ``pp`` is odd and the least ``m`` leaves
    an odd remainder). The ends share what the middle leaves, at least one layer each:
    equally when it is even (Llama 3.1 405B on PP16: 7 + 8 x 14 + 7), else one apart, either
    way round. At most four splits per ``pp``; none when the middle leaves fewer than two
    layers (126 layers on PP48).

    >>> stage_splits(126, 16), stage_splits(96, 16), stage_splits(60, 4)
    ([(7, 7)], [(None, None)], [(None, None), (14, 14)])
    >>> stage_splits(32, 3)
    [(10, 11), (11, 10), (10, 10)]
    """
    if pp == 1:
        return [(None, None)]
    if pp > num_layers:
        return []
    least = -(-num_layers // pp)
    splits: dict[StageEnds, None] = {}  # ordered, and pp 2 gives the same ends for either m
    for middle in (least, least + 1):
        ends = num_layers - (pp - 2) * middle
        if ends < 2:
            continue
        lighter = ends // 2
        for split in ((lighter, ends - lighter), (ends - lighter, lighter)):
            equal = num_layers % pp == 0 and split == (least, least)
            splits[(None, None) if equal else split] = None
    return list(splits)


@dataclass(frozen=True, slots=True, kw_only=True)
class Branch:
    """The degrees that decide how devices are grouped, and the layers' split over the
    stages; everything else varies inside."""

    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline stages."""
    cp: int
    """Context-parallel degree."""
    ep: int
    """Expert-parallel degree."""
    etp: int | None = None
    """1: the experts folded over the tensor-parallel ranks; None: split like the layer."""
    split: StageEnds = (None, None)
    """Decoder layers of the first and last stage (None: all stages equal)."""
    cp_algo: ContextParallelism = "ring"
    """How context parallelism attends: ring or ulysses."""


def pipeline_degrees(model: ModelSpec, devices: int) -> list[int]:
    """Pipeline degrees that divide ``devices`` and split the decoder layers somehow."""
    return [p for p in divisors(devices) if p <= model.num_layers
            and stage_splits(model.num_layers, p)]  # fmt: skip


def virtual_stages(model: ModelSpec, *, pp: int, split: StageEnds) -> list[int]:
    """Virtual stages per pipeline rank (``vpp``) on ``pp`` stages split as ``split``: 1, and
    with a pipeline every count of chunks every stage's layers cut into (Megatron-Core's
    rule, uneven stages included, and the embedding and the loss each taking a layer's slot:
    :func:`~planner.plan.chunks.cuts_into`).

    >>> from pathlib import Path
    >>> from planner.spec.reading import load_model
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> llama = load_model(root / "models/llama3.1-405b.json")  # 126 layers
    >>> # two stages of 63: 64 slots each with the embedding and the loss (2, 4, ... 64)
    >>> virtual_stages(llama, pp=2, split=(None, None)), virtual_stages(llama, pp=16, split=(7, 7))
    ([1, 2, 3, 4, 7, 8, 9, 16, 21, 32, 63, 64], [1, 2, 4, 8])
    """
    if pp == 1:
        return [1]
    first, last = split
    layers = stage_layers(model.num_layers, pp=pp, first=first, last=last)
    return [1, *(v for v in range(2, max(layers) + 2 + model.mtp_layers)
                 if cuts_into(layers, v, model.mtp_layers))]


def expert_degrees(model: ModelSpec, *, dp: int, cp: int, tp: int = 1) -> list[int]:
    """Expert-parallel degrees, ascending: the divisors of the experts that divide the
    data- and context-parallel ranks the experts are spread over (1 for a dense model); with
    the experts folded over ``tp`` tensor-parallel ranks, the multiples of ``tp`` that divide
    ``tp x dp x cp`` and whose part beyond ``tp`` divides or is divided by ``cp``
    (:func:`~planner.sharding.uniform.uniform_layout`)."""
    experts = model.moe.num_experts if model.moe else 1
    if tp == 1:
        return [e for e in divisors(experts) if (dp * cp) % e == 0]
    return [e for e in divisors(experts) if e % tp == 0 and (dp * cp) % (e // tp) == 0
            and (cp % (e // tp) == 0 or (e // tp) % cp == 0)]  # fmt: skip


def zero_stages(pp: int) -> tuple[int, ...]:
    """ZeRO stages with ``pp`` pipeline stages: 0 to 3 without a pipeline; with one, 0 and 1
    (Megatron's distributed optimizer), as no framework here runs ZeRO-2/3 under a pipeline
    (each one's rules refuse them: DeepSpeed's pipeline engine, Megatron-FSDP and Colossal-AI's
    plugin refuse them, torchtitan's FSDP2 keeps the states whole until the last microbatch)."""
    return (0, 1, 2, 3) if pp == 1 else (0, 1)


def micro_batch_sizes(options: SolveOptions) -> list[int]:
    """The microbatch sizes tried, ascending: the options', or the pinned one."""
    pinned = options.pins.mbs
    return sorted(set(options.micro_batch_sizes) if pinned is None else {pinned})


def branches(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, pins: Pins = NO_PINS,
    fold: bool = False, attending: tuple[ContextParallelism, ...] = ("ring", "ulysses"),
) -> list[Branch]:  # fmt: skip
    """Every ``(tp, pp, cp, ep)`` whose model-parallel group divides the devices, once per
    layer split and context-parallel algorithm of ``attending``, among the pinned degrees;
    with ``fold``, the experts folded over the tensor-parallel ranks too (``etp`` 1, under
    sequence parallelism)."""
    n = cluster.num_devices
    out = []
    for tp, cp in context_groups(model, cluster, training=training, pins=pins):
        folds = (None, 1) if fold and tp > 1 and model.moe and pins.sp is not False else (None,)
        for pp in (p for p in pipeline_degrees(model, n // (tp * cp)) if pins.admits(pp=p)):
            dp = n // (tp * pp * cp)
            out += [Branch(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, split=split, cp_algo=algo)
                    for split in stage_splits(model.num_layers, pp)
                    for etp in folds
                    for ep in expert_degrees(model, dp=dp, cp=cp, tp=tp if etp else 1)
                    for algo in cp_algorithms(cp, attending)
                    if pins.admits(ep=ep, etp=etp or tp, cp_algo=algo)]  # fmt: skip
    return out


def context_algorithms(options: SolveOptions) -> tuple[ContextParallelism, ...]:
    """How the target's context parallelism may attend (``any``: every framework's way), and
    a pinned way the target does not run, which stays in the space for the target's rules to
    say why it cannot launch it (else the search would only find nothing divides)."""
    if options.framework == ANY:
        return CONTEXT_PARALLELISMS
    own, pinned = profile(options.framework).context_parallelism, options.pins.cp_algo
    return own if pinned is None or pinned in own else (*own, pinned)


def folds_experts(options: SolveOptions) -> bool:
    """Whether the search tries the experts folded over the tensor-parallel ranks: for a
    target that launches it (and ``any``)."""
    return options.framework == ANY or profile(options.framework).folds_experts


def run_config(training: TrainingSpec, options: SolveOptions, **degrees: object) -> ParallelConfig:
    """A configuration of the run's batch, sequence, precision, stack and switches, with
    ``degrees`` (``tp``, ``pp``, ``recompute``, ...) on top."""
    return ParallelConfig(
        global_batch=training.global_batch_size, seq_len=training.seq_length,
        precision=training.precision, stack=training.stack,
        flash_attention=options.flash_attention,
        overlap_grad_reduce=options.overlap_grad_reduce,
        overlap_param_gather=options.overlap_param_gather, **degrees,  # type: ignore[arg-type]
    )  # fmt: skip


def branch_groups(
    branch: Branch, model: ModelSpec, *, training: TrainingSpec, options: SolveOptions
) -> list[list[ParallelConfig]]:
    """The branch's configurations, one list per ``(vpp, recompute, zero, overlap of the
    experts' all-to-alls)`` with the microbatch ascending, among the pinned knobs (sequence
    parallelism whenever TP > 1 and the framework runs it, unless pinned)."""
    b, pins = branch, options.pins
    vpps = virtual_stages(model, pp=b.pp, split=b.split) if options.interleaved else [1]
    sp = sequence_parallel(b.tp, options.framework, model) if pins.sp is None else pins.sp
    first, last = b.split
    # The experts' all-to-alls overlapped or not: overlap costs a microbatch in flight, so
    # both are tried where there are all-to-alls and the target overlaps them.
    a2a = options.framework == ANY or profile(options.framework).moe_comm_overlap
    overlaps = (False, True) if b.ep > 1 and a2a else (False,)
    dispatcher = (pins.moe_dispatcher or "alltoall") if b.ep > 1 else "alltoall"
    moments = pins.optimizer_moments or "fp32"
    sizes = micro_batch_sizes(options)
    ParallelConfig(mbs=sizes[-1])  # the field's bounds, which the copies below skip
    groups = [
        _by_microbatch(run_config(training, options, tp=b.tp, pp=b.pp, cp=b.cp,
                                  cp_algo=b.cp_algo, ep=b.ep, etp=b.etp, vpp=v,
                                  sp=sp or b.etp == 1, schedule=schedule,
                                  first_stage_layers=first, last_stage_layers=last,
                                  mbs=sizes[0], recompute=r, recompute_modules=modules,
                                  zero=z, overlap_moe_expert_parallel_comm=a2a,
                                  moe_dispatcher=dispatcher,
                                  optimizer_moments=moments if z == 1 else "fp32"), sizes)
        for schedule, v in schedules(vpps, pp=b.pp, options=options)
        for r, modules in recomputations(model, training=training, options=options)
        for z in zero_stages(b.pp) for a2a in overlaps
        if pins.admits(vpp=v, recompute=r, zero=z)
        and combined_1f1b(Degrees(moe_comm_overlap=a2a, full_recompute=r == "full",
                                  gpipe=schedule == "gpipe", zb_h1=schedule == "zb-h1",
                                  zb_v=schedule == "zb-v"))
    ]  # fmt: skip
    return [group for group in groups if group]


def _by_microbatch(config: ParallelConfig, sizes: list[int]) -> list[ParallelConfig]:
    """``config`` (built at ``sizes[0]``) at each microbatch size of ``sizes``: validated
    once, since no rule of a configuration's own reads its microbatch (a search builds some
    60,000 of them; the largest size is checked against the field's bounds apart)."""
    return [config, *(config.model_copy(update={"mbs": m}) for m in sizes[1:])]


def schedules(
    vpps: list[int], *, pp: int, options: SolveOptions
) -> list[tuple[PipelineSchedule, int]]:
    """(schedule, vpp) pairs tried on ``pp`` stages whose chunk counts are ``vpps``: 1F1B
    (interleaved when ``vpp > 1``); with a pipeline and a target that launches them (``any``,
    whose space holds every framework's, included), ZB-H1, and ZB-V where two chunks divide
    every stage (``2 in vpps``, so only when interleaving is allowed).

    >>> from planner.options import SolveOptions
    >>> schedules([1, 2], pp=4, options=SolveOptions(framework="torchtitan"))
    [('1f1b', 1), ('1f1b', 2), ('zb-h1', 1), ('zb-v', 2)]
    >>> schedules([1, 2], pp=4, options=SolveOptions(framework="megatron"))
    [('1f1b', 1), ('1f1b', 2)]
    """
    out: list[tuple[PipelineSchedule, int]] = [("1f1b", v) for v in vpps]
    zero_bubble = options.framework == ANY or profile(options.framework).zero_bubble
    if pp == 1 or not zero_bubble:
        return out
    return out + [("zb-h1", 1)] + ([("zb-v", 2)] if 2 in vpps else [])


def branch_space(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, options: SolveOptions
) -> list[tuple[ParallelConfig, list[list[ParallelConfig]]]]:
    """Every branch's leanest configuration (no interleaving, the smallest microbatch, full
    recomputation, the highest ZeRO stage) and its groups, among what ``options.framework``
    launches: the grid prices the leanest first to drop the branch,
    :func:`planner.uniform.leanest.leanest_uniform` prices only the leanest."""
    space = []
    for branch in branches(model, cluster, training=training, pins=options.pins,
                           fold=folds_experts(options),
                           attending=context_algorithms(options)):
        groups = branch_groups(branch, model, training=training, options=options)
        every = launched_variants([c for group in groups for c in group], model,
                                  cluster=cluster, options=options)  # fmt: skip
        launched, start = [], 0
        for group in groups:
            launched.append(every[start:start + len(group)])
            start += len(group)
        groups = [kept for group in launched if (kept := [c for c in group if c is not None])]
        if groups:
            space.append((min((group[0] for group in groups), key=_leanness), groups))
    return space


def branch_leanest(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, options: SolveOptions
) -> list[ParallelConfig]:
    """Each branch's leanest configurations, as :func:`branch_space` gives them, without the
    rest of its groups: a branch's configurations are tried leanest first and the first the
    framework launches at each ZeRO stage is the branch's (no two of them are equally lean;
    ZeRO-3's gathered layers may outweigh the weights it shards, so which stage is leanest
    is priced, not assumed). What needs only the leanest (:mod:`planner.uniform.remedies`)
    asks here."""
    out = []
    for branch in branches(model, cluster, training=training, pins=options.pins,
                           fold=folds_experts(options),
                           attending=context_algorithms(options)):
        groups = branch_groups(branch, model, training=training, options=options)
        leanest: dict[int, ParallelConfig] = {}
        for config in sorted((c for group in groups for c in group), key=_leanness):
            if config.zero in leanest:
                continue
            if (launched := launched_variant(config, model, cluster=cluster,
                                             options=options)) is not None:  # fmt: skip
                leanest[config.zero] = launched
        out += [leanest[zero] for zero in sorted(leanest, reverse=True)]
    return out


def grid_space(
    model: ModelSpec, cluster: ClusterSpec, options: SolveOptions = DEFAULT_OPTIONS
) -> list[ParallelConfig]:
    """Every configuration the grid considers for ``options.framework`` (some do not divide
    or fit)."""
    training = training_of(model, options)
    return [config for _, groups in branch_space(model, cluster, training=training,
                                                 options=options)
            for group in groups for config in group]  # fmt: skip


def config_key(config: ParallelConfig) -> tuple[int, ...]:
    """The tie-break order: simpler configurations first (equal stages before uneven)."""
    c = config
    return (c.tp, c.pp, c.first_stage_layers or 0, c.last_stage_layers or 0, c.cp,
            CONTEXT_PARALLELISMS.index(c.cp_algo), c.ep, c.vpp, c.mbs,
            RECOMPUTE_MODES.index(c.recompute),
            c.zero, ("1f1b", "gpipe", "zb-h1", "zb-v").index(c.schedule),
            c.recompute_layers or 0, int(c.offload != "none"))  # fmt: skip


def _leanness(config: ParallelConfig) -> tuple[int, int, int, int]:
    """Smaller is leaner: no interleaving, small microbatch, more recomputation, more ZeRO."""
    return (config.vpp, config.mbs, -RECOMPUTE_MODES.index(config.recompute), -config.zero)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]
