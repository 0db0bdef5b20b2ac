"""What would make a training run fit in memory when it does not, priced by the one cost model.

- One configuration (``planner estimate``): :func:`config_remedies` prices each single change a
  Megatron-LM or DeepSpeed user would try (for each knob the mildest setting that fits, else
  its leanest), and all of them at once when none fits alone. Told the framework that will
  launch it, only changes that framework launches, with the switches its search sets
  (:func:`~planner.uniform.defaults.framework_defaults`): torchtitan keeps FSDP under a
  pipeline, where DeepSpeed drops to ZeRO-1, and is never offered an offload it does not run.
- A search that found nothing (``planner solve``):
  :func:`planner.uniform.leanest.infeasible_message` says by how much the least memory any
  plan needs is over the device, and what would fit: the uniform space when the search was
  narrower, more nodes, optimizer offload, a shorter sequence.

Every number is an :func:`~planner.uniform.estimate.estimate`'s, and fit is its test: the peak
memory per device, the device's reserved memory included, within the device's memory. Optimizer
offload (DeepSpeed's ZeRO-Offload, Ren et al. 2021; Megatron-LM's ``--optimizer-cpu-offload``)
keeps the optimizer states and the Adam step on the CPU: its memory is the estimate's peak less
the optimizer states; on a cluster with host figures it is priced as ``--offload optimizer``
(:mod:`planner.cost.offload`: the host copies and the CPU's Adam, and the node's host memory),
else its time cannot be.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from planner import cost
from planner.errors import ConfigError
from planner.frameworks import ANY
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec, physics
from planner.spec.reading import stack_for
from planner.uniform import space
from planner.uniform.describe import describe, leanest_zero
from planner.uniform.estimate import Estimate, estimate
from planner.uniform.framework_changes import FrameworkChanges, Option
from planner.uniform.groups import tp_degrees, within_scale_up
from planner.uniform.recomputations import own_selective_modules
from planner.vocabulary import GIB, RECOMPUTE_MODES

MAX_NODE_FACTOR = 64
"""More nodes are tried up to this multiple of the cluster's (x2, x4, ...)."""
OFFLOAD = 'DeepSpeed "offload_optimizer": {"device": "cpu"}'
"""ZeRO-Offload's switch, in the ``zero_optimization`` block of a DeepSpeed config."""
_FLAGS = ("tp", "pp", "cp", "ep", "etp", "vpp", "first_stage_layers", "last_stage_layers", "sp",
          "mbs", "recompute", "recompute_modules", "recompute_layers", "zero")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Remedy:
    """One change to a configuration that does not fit, priced by :func:`estimate`."""

    change: str
    """As the user would type it: ``--recompute full``, ``--pp 8 --zero 1``, ``--nodes 4``."""
    memory_gib: float
    """Peak memory per device with the change, reserved memory included."""
    fits: bool
    """Whether that peak leaves the memory margin free on the device."""
    note: str | None = None
    """What else the change means or costs."""


def config_remedies(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *,
    memory_margin_gib: float | None = None, framework: str | None = None,
    given: Collection[str] = (),
) -> list[Remedy]:  # fmt: skip
    """What would make ``config`` fit beside ``memory_margin_gib`` (default: estimate's), each
    priced as a whole configuration; none if it fits.

    One remedy per knob, the mildest setting that fits else the leanest: ``--mbs 1`` (the same
    global batch in more microbatches), selective then full recomputation, ZeRO-1 then ZeRO-3
    (only without a pipeline), wider tensor parallelism inside a node (with sequence
    parallelism), more pipeline stages (ZeRO-1 at most), more nodes (only with ZeRO >= 1: more
    data-parallel ranks share the sharded states); then, when none of these fits, all of them
    at once; last, optimizer offload (:func:`offload_remedy`, priced where the cluster has host
    figures).

    For a ``framework``, only what it launches, each change with the switches its search sets
    where they are not ``given`` (field names; :func:`framework_defaults`): its own selective
    recomputation (torchtitan's per-operator policy), a deeper pipeline with the highest ZeRO
    stage it runs there, its own offload or none. A dense model over one data- and
    context-parallel rank is offered no higher ZeRO stage: it would shard nothing. Raises
    :class:`~planner.errors.ConfigError` when ``config`` does not divide.
    """
    margin = plan_margin_gib(model, cluster, config, memory_margin_gib)
    base = estimate(model, cluster, config, memory_margin_gib=margin)
    if base.fits:
        return []
    launch = FrameworkChanges(model=model, framework=framework, given=tuple(given))
    remedies = [remedy for options in _knobs(model, cluster, config, launch)
                if (remedy := _mildest(model, cluster, config, options, margin)) is not None]
    if not any(r.fits for r in remedies):
        combined = _mildest(model, cluster, config, _combined(model, cluster, config, launch),
                            margin)  # fmt: skip
        # all knobs at once may come to one knob's change (more nodes alone): said once
        if combined is not None and all(r.change != combined.change for r in remedies):
            remedies.append(combined)
    if config.offload == "none":
        offload = (offload_remedy(model, cluster, config, base, memory_margin_gib=margin)
                   if framework is None else _own_offload(launch, cluster, config, base, margin))
        remedies += [offload] if offload is not None else []
    return remedies


def offload_remedy(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, base: Estimate, *,
    memory_margin_gib: float | None = None,
) -> Remedy:  # fmt: skip
    """Optimizer offload for ``config`` (priced ``base``): ``--offload optimizer`` priced by
    :func:`estimate` where the cluster has host figures, its step and what the host copies and
    the CPU's Adam take; else ZeRO-Offload's switch with the GiB it saves, unpriced."""
    margin_gib = plan_margin_gib(model, cluster, config, memory_margin_gib)
    if cluster.host is None:
        return _offloaded(model, cluster, base, margin_gib, change=OFFLOAD,
                          who="ZeRO-Offload (ZeRO >= 1): ")  # fmt: skip
    zero = "" if config.zero >= 1 else "; Megatron-LM offloads only with --zero 1"
    return _offloaded(model, cluster, base, margin_gib, change="--offload optimizer",
                      offloaded=config.model_copy(update={"offload": "optimizer"}),
                      suffix=zero)  # fmt: skip


def _own_offload(launch: FrameworkChanges, cluster: ClusterSpec, config: ParallelConfig,
                 base: Estimate, margin_gib: float) -> Remedy | None:  # fmt: skip
    """``launch``'s framework's own optimizer offload of ``config`` (priced ``base``):
    Megatron-LM's or DeepSpeed's ZeRO-Offload, the first it launches; None when it launches
    neither."""
    for offload in ("optimizer", "zero-offload"):
        option = launch((_with(config, offload=offload), cluster, None))
        if option is not None:
            return _offloaded(launch.model, cluster, base, margin_gib,
                              change=f"--offload {offload}", offloaded=option[0])  # fmt: skip
    return None


def _offloaded(
    model: ModelSpec, cluster: ClusterSpec, base: Estimate, margin_gib: float, *, change: str,
    offloaded: ParallelConfig | None = None, who: str = "", suffix: str = "",
) -> Remedy:  # fmt: skip
    """The remedy ``change``: ``offloaded`` priced by :func:`estimate` with its step and host
    memory where the cluster has host figures, else ``base``'s peak less its optimizer
    states, unpriced."""
    if cluster.host is None or offloaded is None:
        optimizer_gib = base.memory.optimizer_gib
        left_gib = base.peak_memory_gib - optimizer_gib
        return Remedy(change=change, memory_gib=left_gib,
                      fits=fits_gib(cluster, left_gib, margin_gib),
                      note=f"{who}{optimizer_gib:.1f} GiB of optimizer states and the Adam step "
                      "on the CPU; its time is not priced")  # fmt: skip
    off = estimate(model, cluster, offloaded, memory_margin_gib=margin_gib)
    host = f"{off.host_memory_gib:.0f} of {cluster.host.memory_gib:g} GiB of host memory"
    return Remedy(change=change, memory_gib=off.peak_memory_gib, fits=off.fits,
                  note=f"step {off.step_time_s:.2f} s instead of {base.step_time_s:.2f}: the "
                  f"host copies and CPU Adam take {off.time.optimizer_s:.2f} s; {host} per "
                  f"node{suffix}")  # fmt: skip


def config_infeasible_message(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, *,
    memory_margin_gib: float | None = None, framework: str | None = None,
    given: Collection[str] = (),
) -> str:  # fmt: skip
    """One line for ``planner estimate`` when ``config`` does not fit beside
    ``memory_margin_gib`` (default: estimate's): the memory it needs, what a device may use,
    and :func:`config_remedies` (for ``framework``, with the switches ``given``), those that
    fit first."""
    margin = plan_margin_gib(model, cluster, config, memory_margin_gib)
    result = estimate(model, cluster, config, memory_margin_gib=margin)
    if result.fits:
        raise ValueError(f"{describe(config)} fits: nothing to remedy")
    device = cluster.device
    line = (f"{describe(config)} needs {result.peak_memory_gib:.1f} GiB per device "
            f"({result.memory.other_gib:.1f} GiB of reserve included), more than the "
            f"{device.memory_gib - margin:.2f} GiB a device may use ({device.name}'s "
            f"{device.memory_gib:g} GiB less a {margin:.2f} GiB margin)")  # fmt: skip
    if fits_gib(cluster, result.peak_memory_gib, margin) and cluster.host is not None:
        # The devices hold their part: the node's host memory is what is short.
        line = (f"{describe(config)}: its devices offload {result.host_memory_gib:.1f} GiB per "
                f"node to host memory, more than a node's {cluster.host.memory_gib:g} GiB")
    remedies = config_remedies(model, cluster, config, memory_margin_gib=margin,
                               framework=framework, given=given)  # fmt: skip
    for fits, heading in ((True, "would fit"), (False, "would not fit")):
        listed = [f"{r.change} ({r.memory_gib:.1f} GiB{'; ' + r.note if r.note else ''})"
                  for r in remedies if r.fits == fits]  # fmt: skip
        line += f"; {heading}: {', '.join(listed)}" if listed else ""
    if not remedies and framework is not None:
        line += (f"; {FrameworkChanges(model=model, framework=framework).title} launches none "
                 f"of the changes tried")
    return line


def _knobs(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
           launch: FrameworkChanges) -> list[list[Option]]:  # fmt: skip
    """Per knob, its settings leaner than ``config``'s, mildest first, each drawn from the
    uniform space (:mod:`planner.uniform.space`) and as ``launch``'s framework launches it."""
    c = config
    knobs: list[list[Option]] = []
    if c.mbs > 1:
        knobs.append([(_with(c, mbs=1), cluster, "the same global batch in more microbatches")])
    if recomputes := RECOMPUTE_MODES[RECOMPUTE_MODES.index(c.recompute) + 1 :]:
        # the target's own selective recomputation (torchtitan's per-operator policy)
        own = (own_selective_modules(model, launch.framework)
               if launch.framework is not None else None)  # fmt: skip
        modules = {"selective": {"recompute_modules": own}} if own is not None else {}
        knobs.append([(_with(c, recompute=r, **modules.get(r, {})), cluster, None)
                      for r in recomputes])  # fmt: skip
    if c.recompute_layers is not None:  # every layer of each chunk
        knobs.append([(_with(c, recompute_layers=None), cluster, None)])
    # ZeRO shards a dense model's states over its data- and context-parallel ranks; over one
    # it saves nothing (ZeRO-3 adds its gather buffers). Experts folded over the TP ranks are
    # sharded over more, so a mixture of experts keeps the knob.
    shards = resolve(model, cluster, c).dp * c.cp  # the configuration was just priced
    if (shards > 1 or model.moe is not None) and (zeros := launch.zero_stages(c)):
        knobs.append([(_with(c, zero=z), cluster, launch.zero_note(z)) for z in zeros])
    if tps := _wider_tps(model, cluster, c):
        sp = space.sequence_parallel(max(tps), launch.framework or ANY, model)
        sp_note = f"with sequence parallelism, as {launch.title} runs TP" if sp > c.sp else None
        knobs.append([(_with(c, tp=t, sp=sp, dp=None), cluster, sp_note) for t in tps])
    if pps := _deeper_pps(model, cluster, c):
        knobs.append([option for p in pps
                      if (option := _deeper(model, cluster, c, p, launch)) is not None])
    if c.zero >= 1:
        knobs.append([(_with(c, dp=None), cluster.with_nodes(cluster.num_nodes * f),
                       "more data-parallel ranks share the ZeRO-sharded states")
                      for f in node_factors(cluster)])  # fmt: skip
    return [[launched for option in options if (launched := launch(option)) is not None]
            for options in knobs]  # fmt: skip


def _deeper(model: ModelSpec, cluster: ClusterSpec, c: ParallelConfig, pp: int,
            launch: FrameworkChanges) -> Option | None:  # fmt: skip
    """``c`` on ``pp`` stages with the highest ZeRO stage up to its own that ``launch``'s
    framework runs there (DeepSpeed's rule without one: ZeRO-1 at most); None if none."""
    if launch.framework is None:
        zero = min(c.zero, leanest_zero(pp))
        note = None if zero == c.zero else (f"no framework here runs ZeRO-{c.zero} with a "
                                            f"pipeline")
        return (_pipelined(model, c, pp, zero=zero), cluster, note)
    # the framework's own reason to drop the stage (torchtitan's FSDP2 is ZeRO-1 under one)
    why = launch.refusal((_pipelined(model, c, pp, zero=c.zero), cluster, None))
    for zero in range(c.zero, -1, -1):
        if (option := launch((_pipelined(model, c, pp, zero=zero), cluster, why))) is not None:
            return option
    return None


def _combined(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
              launch: FrameworkChanges) -> list[Option]:  # fmt: skip
    """Every knob of :func:`_knobs` at its leanest at once, the pipeline as shallow and the
    nodes as few as will do (the leanest ZeRO stage each depth launches, and never less than
    ``config``'s at its own depth), as ``launch``'s framework launches it."""
    c = config
    tp = max([c.tp, *_wider_tps(model, cluster, c)])
    lean = _with(c, mbs=1, recompute="full", tp=tp, dp=None,
                 sp=c.sp or space.sequence_parallel(tp, launch.framework or ANY, model))
    options: list[Option] = []
    for factor in (1, *node_factors(cluster)):
        where = cluster.with_nodes(cluster.num_nodes * factor)
        for pp in (c.pp, *_deeper_pps(model, cluster, lean)):
            zeros = (leanest_zero(pp),) if launch.framework is None else (3, 2, 1, 0)
            # at the configuration's own depth never below its stage (each stage tried once)
            for zero in dict.fromkeys(max(c.zero, z) if pp == c.pp else z for z in zeros):
                option = launch((_pipelined(model, lean, pp, zero=zero), where,
                                 "every knob at its leanest, on the fewest nodes"))  # fmt: skip
                if option is not None:
                    options.append(option)
                    break
    return options


def _wider_tps(model: ModelSpec, cluster: ClusterSpec, c: ParallelConfig) -> list[int]:
    """Tensor-parallel degrees above ``c``'s that stay inside a node with its CP."""
    return [t for t in tp_degrees(model, cluster)
            if t > c.tp and within_scale_up(cluster, tp=t, cp=c.cp)]  # fmt: skip


def _deeper_pps(model: ModelSpec, cluster: ClusterSpec, c: ParallelConfig) -> list[int]:
    """Pipeline degrees above ``c``'s that divide the devices left by TP and CP."""
    return [p for p in space.pipeline_degrees(model, cluster.num_devices // (c.tp * c.cp))
            if p > c.pp]  # fmt: skip


def _pipelined(model: ModelSpec, c: ParallelConfig, pp: int, *, zero: int) -> ParallelConfig:
    """``c`` on ``pp`` stages: a new depth takes the heuristic's split (the first of
    :func:`~planner.uniform.space.stage_splits`) and keeps its interleaving only if it is
    still one of the depth's :func:`~planner.uniform.space.virtual_stages`."""
    if pp == c.pp:
        return _with(c, zero=zero)
    split = space.stage_splits(model.num_layers, pp)[0]
    vpp = c.vpp if c.vpp in space.virtual_stages(model, pp=pp, split=split) else 1
    return _with(c, pp=pp, first_stage_layers=split[0], last_stage_layers=split[1], vpp=vpp,
                 zero=zero, dp=None)  # fmt: skip


def _mildest(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, options: list[Option],
    margin_gib: float | None = None,
) -> Remedy | None:  # fmt: skip
    """The first option that fits beside ``margin_gib`` (default: estimate's), else the one
    that needs least; None if none divides."""
    best: Remedy | None = None
    for changed, where, note in options:
        result = _price(model, where, changed, margin_gib)
        if result is None:
            continue
        remedy = Remedy(change=_flags(config, changed, cluster, where, result),
                        memory_gib=result.peak_memory_gib, fits=result.fits,
                        note=note)  # fmt: skip
        if remedy.fits:
            return remedy
        if best is None or remedy.memory_gib < best.memory_gib:
            best = remedy
    return best


def _flags(
    old: ParallelConfig,
    new: ParallelConfig,
    old_cluster: ClusterSpec,
    new_cluster: ClusterSpec,
    result: Estimate,
) -> str:
    """The ``planner estimate`` options that turn ``old`` into ``new``."""
    parts = []
    for name in _FLAGS:
        before, after = getattr(old, name), getattr(new, name)
        flag = "--" + name.replace("_", "-")
        if after == before:
            continue
        if after is None:
            parts.append(f"without {flag}")
        elif isinstance(after, bool):
            parts.append(flag if after else f"--no-{name}")
        else:
            parts.append(f"{flag} {after}")
    if old.dp is not None and result.dp != old.dp:
        parts.append(f"--dp {result.dp}")  # an explicit --dp must follow the new degrees
    if new_cluster.num_nodes != old_cluster.num_nodes:
        parts.append(f"--nodes {new_cluster.num_nodes}")
    return " ".join(parts)


def _with(config: ParallelConfig, **update: object) -> ParallelConfig:
    """``config`` with ``update``: selective recomputation's modules dropped when it stops
    being selective, validated (so a folding the new degrees make moot reads as none)."""
    if update.get("recompute", "selective") != "selective":
        update.setdefault("recompute_modules", None)
    return ParallelConfig(**{**config.model_dump(), **update})


def _price(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
           margin_gib: float | None = None) -> Estimate | None:  # fmt: skip
    """The estimate, or None when the configuration does not divide."""
    try:
        return estimate(model, cluster, config, memory_margin_gib=margin_gib)
    except ConfigError:
        return None


def plan_margin_gib(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
                    memory_margin_gib: float | None = None) -> float:
    """The margin ``config`` leaves free on ``cluster``'s devices: ``memory_margin_gib``, else
    the share its stack's memory model was measured to miss by (:data:`cost.MEMORY_MARGIN`)."""
    stack = stack_for(model, config.stack)
    return cost.memory_margin_bytes(cluster.device.memory_gib, memory_margin_gib, stack) / GIB


def fits_gib(cluster: ClusterSpec, gib: float, memory_margin_gib: float) -> bool:
    """:func:`estimate`'s test: a peak (reserved memory included) that leaves the margin
    (:func:`plan_margin_gib`) free on the device."""
    return bool(cost.fits(gib * GIB, cluster.device, memory_margin_gib))


def node_factors(cluster: ClusterSpec, max_factor: int = MAX_NODE_FACTOR) -> list[int]:
    """2, 4, ... up to ``max_factor``, as far as the outermost network level holds the
    nodes (past it, a cluster is refused: :func:`planner.spec.physics.check_fabric`).

    >>> from planner.spec.reading import load_cluster
    >>> h100 = load_cluster("instances/clusters/dgx-h100-80gb.json")
    >>> node_factors(h100.with_nodes(16)), node_factors(h100.with_nodes(1024))
    ([2, 4, 8, 16, 32, 64], [2, 4])
    """
    most = min(max_factor, physics.most_nodes(cluster) // cluster.num_nodes)
    return [2**k for k in range(1, most.bit_length()) if 2**k <= most]
