"""The grid baseline: every uniform (Megatron-style) configuration, priced by :func:`estimate`.

The space is what a Megatron-LM user can launch with flags:

- ``tp``: divisors of the devices in a node that divide the attention heads, the KV groups
  and the FFN (tensor parallelism stays inside a node);
- ``pp``: any degree up to the decoder layers that divides the devices left by ``tp * cp``,
  with the layers split by :func:`stage_splits`: equal stages when ``pp`` divides the layers,
  else Megatron's uneven first and last stage (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``);
- ``vpp`` (interleaved 1F1B), when ``options.interleaved``: every count of chunks that divides
  every stage's layers (Megatron-Core's rule, uneven stages included);
- ``cp``: 1, 2, 4, 8 with ``tp * cp`` within a node, only from :data:`LONG_SEQUENCE` on,
  each as ring attention and as Ulysses all-to-alls;
- ``ep``: divisors of the experts (mixtures of experts only);
- ``mbs``: ``options.micro_batch_sizes``; recomputation none, selective or full; ZeRO 0 or 1
  (the distributed optimizer), 0 to 3 without a pipeline;
- sequence parallelism whenever ``tp > 1``; flash attention and the overlap flags as the
  options say; data parallelism takes the devices left over.

The answer is the least predicted step time among the configurations that divide and fit, ties
broken by the smallest ``(tp, pp, first, last, cp, ep, vpp, mbs, recompute, zero)``. Two
prunings skip work without changing it: a branch (degrees ``(tp, pp, cp, ep)`` and one layer
split) is dropped when its leanest configuration (no interleaving, the smallest microbatch,
full recomputation, the highest ZeRO stage) does not fit, and within a branch a larger
microbatch is not tried once a smaller one does not fit (activations grow with the microbatch;
1F1B's in-flight count times the microbatch never shrinks).

The plan's ``solver.configurations`` counts the configurations :func:`estimate` priced, once
each: neither the pruned ones nor the ones it refused as not dividing (the batch over
``dp x mbs``, interleaving's microbatches over ``pp``) are counted, and the winner's re-pricing
as a plan is not either. ``solver.time_s`` is the wall time of the whole search. When nothing
fits, the error gives the least memory per device (the leanest branch's) and what would fit
(:func:`planner.remedies.infeasible_message`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

from planner.config import ContextParallelism, ParallelConfig, Recompute, resolve
from planner.errors import ConfigError, TimeLimitError
from planner.estimate import Estimate, estimate
from planner.frameworks import ANY, profile
from planner.invariants import check_plan
from planner.plan import Plan, SolverSummary
from planner.search import Progress, ProgressFn, SolveOptions, divisors, training_of
from planner.space import NO_PINS, Pins
from planner.spec import GIB, ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform import uniform_plan

DEFAULT_OPTIONS = SolveOptions()
"""What :func:`planner.search.solve` assumes when given no options."""
LONG_SEQUENCE = 8192
"""Context parallelism is tried from this sequence length on. Below it the attention's
activations are small next to the rest of a layer's, and NVIDIA's recipes keep CP at 1 (their
first with CP 2 is Llama 3 8B at 8192)."""
CP_DEGREES = (1, 2, 4, 8)
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")

Split = tuple[int | None, int | None]
"""Decoder layers of the first and last pipeline stage; ``(None, None)``: all stages equal."""


def stage_splits(num_layers: int, pp: int) -> list[Split]:
    """The layer splits tried for ``pp`` stages: equal stages when ``pp`` divides the layers;
    else Megatron's uneven first and last stage around ``pp - 2`` middle stages of ``m`` layers.

    ``m`` is ``ceil(num_layers / pp)``, the least the busiest stage can hold, or one more (the
    ends then lighten by ``pp - 2`` layers between them: room for the embedding and the head,
    and an equal split when ``pp`` is odd and the least ``m`` leaves an odd remainder). The ends
    share what the middle leaves, at least one layer each: equally when it is even (Llama 3.1
    405B on PP16: 7 + 8 x 14 + 7), else one apart, either way round. At most four splits per
    ``pp``; none when the middle leaves fewer than two layers (126 layers on PP48).

    >>> stage_splits(126, 16), stage_splits(96, 16)
    ([(7, 7)], [(None, None)])
    >>> stage_splits(32, 3)
    [(10, 11), (11, 10), (10, 10)]
    """
    if num_layers % pp == 0:
        return [(None, None)]
    if pp > num_layers:
        return []
    least = -(-num_layers // pp)
    splits: dict[Split, None] = {}  # ordered, and pp 2 gives the same ends for either m
    for middle in (least, least + 1):
        ends = num_layers - (pp - 2) * middle
        if ends < 2:
            continue
        lighter = ends // 2
        splits[lighter, ends - lighter] = None
        splits[ends - lighter, lighter] = None
    return list(splits)


def stage_layers(num_layers: int, pp: int, split: Split) -> tuple[int, ...]:
    """Decoder layers on each stage, first to last.

    >>> stage_layers(126, 16, (7, 7))[:3], stage_layers(96, 16, (None, None))[:3]
    ((7, 8, 8), (6, 6, 6))
    """
    first, last = split
    if first is None or last is None:
        return (num_layers // pp,) * pp
    middle = (num_layers - first - last) // (pp - 2) if pp > 2 else 0
    return (first, *([middle] * (pp - 2)), last)


@dataclass(frozen=True, slots=True)
class Branch:
    """The degrees that decide how devices are grouped, and the layers' split over the
    stages; everything else varies inside."""

    tp: int
    pp: int
    cp: int
    ep: int
    split: Split = (None, None)
    cp_algo: ContextParallelism = "ring"


def tp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Tensor-parallel degrees inside a node that split heads, KV groups and FFN evenly."""
    per_node = cluster.devices_per_node
    # MLA's keys and values come from one shared latent: there are no KV groups to split
    kv_groups = model.num_attention_heads if model.mla else model.query_groups
    return [t for t in range(1, per_node + 1)
            if per_node % t == 0 and model.num_attention_heads % t == 0
            and kv_groups % t == 0 and model.ffn % t == 0]  # fmt: skip


def pipeline_degrees(model: ModelSpec, devices: int) -> list[int]:
    """Pipeline degrees that divide ``devices`` and split the decoder layers somehow."""
    return [p for p in divisors(devices) if p <= model.num_layers
            and stage_splits(model.num_layers, p)]  # fmt: skip


def branches(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, pins: Pins = NO_PINS
) -> list[Branch]:
    """Every ``(tp, pp, cp, ep)`` whose model-parallel group divides the devices, once per
    layer split, among the pinned degrees."""
    n = cluster.num_devices
    cps = CP_DEGREES if training.seq_length >= LONG_SEQUENCE else (1,)
    if pins.cp is not None:
        cps = (pins.cp,)
    experts = model.moe.num_experts if model.moe else 1
    out = []
    for tp in (t for t in tp_degrees(model, cluster) if pins.admits(tp=t)):
        for cp in (c for c in cps if tp * c <= cluster.devices_per_node and n % (tp * c) == 0):
            for pp in (p for p in pipeline_degrees(model, n // (tp * cp)) if pins.admits(pp=p)):
                dp = n // (tp * pp * cp)
                algos: tuple[ContextParallelism, ...] = ("ring", "ulysses") if cp > 1 else ("ring",)
                out += [Branch(tp, pp, cp, ep, split, algo)
                        for split in stage_splits(model.num_layers, pp)
                        for ep in divisors(experts)
                        for algo in algos
                        if (dp * cp) % ep == 0 and pins.admits(ep=ep, cp_algo=algo)]  # fmt: skip
    return out


def run_config(training: TrainingSpec, options: SolveOptions, **degrees: object) -> ParallelConfig:
    """A configuration of the run's batch, sequence, precision and switches, with ``degrees``
    (``tp``, ``pp``, ``recompute``, ...) on top."""
    return ParallelConfig(
        global_batch=training.global_batch_size, seq_len=training.seq_length,
        precision=training.precision, flash_attention=options.flash_attention,
        overlap_grad_reduce=options.overlap_grad_reduce,
        overlap_param_gather=options.overlap_param_gather, **degrees,  # type: ignore[arg-type]
    )  # fmt: skip


def branch_groups(
    branch: Branch, model: ModelSpec, training: TrainingSpec, options: SolveOptions
) -> list[list[ParallelConfig]]:
    """The branch's configurations, one list per ``(vpp, recompute, zero)`` with the
    microbatch ascending, among the pinned knobs (sequence parallelism whenever TP > 1 unless
    pinned)."""
    b, pins = branch, options.pins
    vpps = [1]
    if options.interleaved and b.pp > 1:
        layers = set(stage_layers(model.num_layers, b.pp, b.split))
        vpps += [v for v in range(2, min(layers) + 1) if all(n % v == 0 for n in layers)]
    zeros = (0, 1, 2, 3) if b.pp == 1 else (0, 1)
    mbss = sorted(set(options.micro_batch_sizes) if pins.mbs is None else {pins.mbs})
    sp = b.tp > 1 if pins.sp is None else pins.sp
    first, last = b.split
    groups = [
        [run_config(training, options, tp=b.tp, pp=b.pp, cp=b.cp, cp_algo=b.cp_algo, ep=b.ep,
                    vpp=v, sp=sp,
                    first_stage_layers=first, last_stage_layers=last, mbs=m, recompute=r,
                    zero=z) for m in mbss]
        for v in vpps for r in RECOMPUTE for z in zeros
        if pins.admits(vpp=v, recompute=r, zero=z)
    ]  # fmt: skip
    return [group for group in groups if group]


def branch_space(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[tuple[ParallelConfig, list[list[ParallelConfig]]]]:
    """Every branch's leanest configuration (no interleaving, the smallest microbatch, full
    recomputation, the highest ZeRO stage) and its groups, among what ``options.framework``
    launches: the grid prices the leanest first to drop the branch,
    :func:`planner.remedies.leanest_uniform` prices only the leanest."""
    space = []
    for branch in branches(model, cluster, training, options.pins):
        groups = branch_groups(branch, model, training, options)
        launched = ([launched_variant(c, model, cluster, options) for c in group]
                    for group in groups)
        groups = [kept for group in launched if (kept := [c for c in group if c is not None])]
        if groups:
            space.append((min((group[0] for group in groups), key=_leanness), groups))
    return space


def launched_variant(
    config: ParallelConfig, model: ModelSpec, cluster: ClusterSpec, options: SolveOptions
) -> ParallelConfig | None:
    """``config`` as the target framework launches it, or None when it cannot.

    Frameworks fix some overlaps by ZeRO stage and pipeline (DeepSpeed's pipeline engine
    reduces gradients after the last microbatch, torchtitan's FSDP2 overlaps its own
    gathers...): the most overlapped setting of the two overlap flags the framework launches,
    among those the options allow, is taken (overlap never makes a step slower in the cost
    model). One that does not even divide is kept as it is, for the pricing to refuse with its
    reason."""
    if options.framework == ANY:
        return config
    try:
        resolved = resolve(model, cluster, config)
    except ConfigError:
        return config
    target = profile(options.framework)
    grads = (True, False) if options.overlap_grad_reduce else (False,)
    gathers = (True, False) if options.overlap_param_gather else (False,)
    for grad in grads:
        for gather in gathers:
            variant = config.model_copy(update={"overlap_grad_reduce": grad,
                                                "overlap_param_gather": gather})  # fmt: skip
            # The flags change no divisibility: the resolution holds for every variant.
            if target.launches(replace(resolved, config=variant), model):
                return variant
    return None


def grid_space(
    model: ModelSpec, cluster: ClusterSpec, options: SolveOptions = DEFAULT_OPTIONS
) -> list[ParallelConfig]:
    """Every configuration the grid considers for ``options.framework`` (some do not divide
    or fit)."""
    training = training_of(model, options)
    return [config for _, groups in branch_space(model, cluster, training, options)
            for group in groups for config in group]  # fmt: skip


def config_key(config: ParallelConfig) -> tuple[int, ...]:
    """The tie-break order: simpler configurations first (equal stages before uneven)."""
    c = config
    return (c.tp, c.pp, c.first_stage_layers or 0, c.last_stage_layers or 0, c.cp,
            int(c.cp_algo == "ulysses"), c.ep, c.vpp, c.mbs, RECOMPUTE.index(c.recompute),
            c.zero)  # fmt: skip


Verdict = Literal["fits", "too big", "refused"]


@dataclass(slots=True)
class _Search:
    """The best configuration so far, the leanest one that did not fit, and how many were
    priced."""

    usable_bytes: float
    """What a plan may use of a device (its memory less the margin)."""
    best: tuple[float, tuple[int, ...], ParallelConfig] | None = None
    leanest: tuple[float, ParallelConfig] | None = None
    first_refusal: str | None = None
    priced: int = 0

    def price(self, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> Verdict:
        """Price ``config`` and keep it if it is the best so far."""
        try:
            result: Estimate = estimate(model, cluster, config)
        except ConfigError as exc:
            self.first_refusal = self.first_refusal or str(exc)
            return "refused"
        self.priced += 1
        if result.peak_memory_gib * GIB > self.usable_bytes:
            if self.leanest is None or result.peak_memory_gib < self.leanest[0]:
                self.leanest = (result.peak_memory_gib, config)
            return "too big"
        key = (result.step_time_s, config_key(config), config)
        if self.best is None or key[:2] < self.best[:2]:
            self.best = key
        return "fits"


def grid_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest uniform configuration ``options.framework`` launches that fits, as a plan
    (method ``"grid"``); see :func:`enumerate_plan`."""
    return enumerate_plan(model, cluster, options, progress=progress, method="grid")


def enumerate_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
    method: str = "search",
) -> Plan:
    """The fastest uniform configuration ``options.framework`` launches that fits beside the
    memory margin, every knob not pinned searched, as a plan with the configurations priced
    in ``solver.configurations``.

    Raises :class:`~planner.errors.InfeasibleError` when none fits and
    :class:`~planner.errors.ConfigError` when none even divides. Past
    ``options.time_limit_s`` the best so far is returned with status ``time_limit`` (and no
    gap: the grid has no bound on what it did not price), or a TimeLimitError when none yet.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    work = branch_space(model, cluster, training, options)
    total = sum(len(group) for _, groups in work for group in groups)
    usable = cluster.device.memory_bytes - options.margin_bytes(cluster.device.memory_gib)
    search = _Search(usable_bytes=usable)
    done = 0
    cut = False
    for leanest, groups in work:
        if options.time_limit_s is not None and (
            time.perf_counter() - started >= options.time_limit_s
        ):
            cut = True
            break
        if progress is not None:
            progress(Progress(done, total, search.best[0] if search.best else None,
                              f"TP{leanest.tp} PP{leanest.pp} CP{leanest.cp} "
                              f"EP{leanest.ep}"))  # fmt: skip
        _search_branch(model, cluster, leanest, groups, search)
        done += sum(len(group) for group in groups)
    if progress is not None:
        progress(Progress(total, total, search.best[0] if search.best else None))
    if search.best is None and cut:
        raise TimeLimitError(f"the time limit ({options.time_limit_s:g} s) passed after "
                             f"{search.priced} of {total} configurations and none of them "
                             f"fits yet; raise --time-limit")  # fmt: skip
    if search.best is None:
        # the failure path prices remedies over this module's space: imported here
        from planner.baselines.failure import nothing_found

        raise nothing_found(model, cluster, training, options, leanest=search.leanest,
                            first_refusal=search.first_refusal)
    plan = uniform_plan(model, cluster, search.best[2], method=method,
                        framework=options.framework,
                        memory_margin_gib=options.margin_bytes(cluster.device.memory_gib) / GIB)
    summary = SolverSummary(time_s=time.perf_counter() - started,
                            status="time_limit" if cut else "optimal",
                            objective=plan.predicted.step_time_s,
                            configurations=search.priced)  # fmt: skip
    return check_plan(plan.model_copy(update={"solver": summary}), model)


def _search_branch(
    model: ModelSpec,
    cluster: ClusterSpec,
    leanest: ParallelConfig,
    groups: list[list[ParallelConfig]],
    search: _Search,
) -> None:
    """Price one branch's groups, pruned as the module says; the leanest is priced once."""
    if search.price(model, cluster, leanest) == "too big":
        return
    for group in groups:
        for config in group:
            if config is leanest:
                continue  # priced above: it fits or does not divide
            if search.price(model, cluster, config) == "too big":
                break  # a larger microbatch holds more


def _leanness(config: ParallelConfig) -> tuple[int, int, int, int]:
    """Smaller is leaner: no interleaving, small microbatch, more recomputation, more ZeRO."""
    return (config.vpp, config.mbs, -RECOMPUTE.index(config.recompute), -config.zero)
