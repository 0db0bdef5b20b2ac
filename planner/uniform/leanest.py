"""The leanest uniform configurations, and what a search that found nothing within memory
says: the least memory any uniform configuration needs, the fewest nodes on which one fits,
optimizer offload, a shorter sequence (:func:`infeasible_message`). Each branch's leanest
configuration is priced in one batch (:func:`~planner.uniform.batch.estimate_batch`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner import cost
from planner.frameworks import FRAMEWORKS, profile
from planner.options import SolveOptions
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec, physics
from planner.uniform import space
from planner.uniform.batch import estimate_batch
from planner.uniform.describe import describe
from planner.uniform.estimate import estimate
from planner.uniform.launched import launched_variant, offloaded_variant
from planner.uniform.remedies import MAX_NODE_FACTOR, fits_gib, node_factors
from planner.vocabulary import GIB, OFFLOADS

SEQUENCE_HALVINGS = 3
"""A shorter sequence is tried down to the run's halved this many times."""
def leanest_uniform(
    model: ModelSpec, cluster: ClusterSpec, *, training: TrainingSpec, options: SolveOptions
) -> tuple[float, ParallelConfig] | None:
    """The least peak memory per device (GiB) of any uniform configuration the grid considers,
    and the configuration; None when none divides. Only each branch's leanest is priced (see
    :func:`~planner.uniform.space.branch_leanest`)."""
    priced = _leanest_priced(model, cluster, training, options)
    if not priced:
        return None
    lean = min(priced, key=lambda p: p.peak_memory_gib)
    return lean.peak_memory_gib, lean.config


def nodes_to_fit(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    training: TrainingSpec,
    options: SolveOptions,
    max_factor: int = MAX_NODE_FACTOR,
) -> tuple[int, float, ParallelConfig] | None:
    """The fewest nodes, the cluster's times 2, 4, ... up to ``max_factor``, on which some
    uniform configuration fits: the node count, the leanest configuration there and its peak
    memory per device (GiB); None when none of them is enough."""
    for factor in node_factors(cluster, max_factor):
        bigger = cluster.with_nodes(cluster.num_nodes * factor)
        found = leanest_uniform(model, bigger, training=training, options=options)
        if found is not None and fits_gib(bigger, found[0], _margin_gib(bigger, training, options)):
            return bigger.num_nodes, found[0], found[1]
    return None


def infeasible_message(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    options: SolveOptions,
    *,
    searched: str,
    least_gib: float,
    leanest: str,
) -> str:
    """One line (the CLI's ``error:``) for a search that found no plan within memory.

    ``searched`` names the space as the sentence's subject (``"no uniform configuration"``),
    ``least_gib`` is the least peak memory per device any of its plans needs, the reserved
    memory included as :func:`estimate` counts it, and ``leanest`` says which plan needs it
    (:func:`describe_leanest` for a uniform one). Then what would fit, priced over the uniform
    space: that space on these devices when the search was narrower, the fewest nodes
    (:func:`nodes_to_fit`), optimizer offload, a shorter sequence.
    """
    device = cluster.device
    margin = options.margin_bytes(device, training.stack) / GIB
    pins = ", ".join(options.pins.flags().values())
    head = (f"{searched} fits {model.name} on {cluster.num_devices} x {device.name} "
            f"({device.memory_gib:g} GiB, {margin:.1f} GiB kept free) at global batch "
            f"{training.global_batch_size}, sequence {training.seq_length}"
            f"{f' with {pins}' if pins else ''}; the leanest ({leanest}) "
            f"needs {least_gib:.1f} GiB per device")  # fmt: skip
    return "; ".join([head, *_ways_out(model, cluster, training, options, least_gib)])


def _ways_out(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    options: SolveOptions,
    least_gib: float,
) -> Iterator[str]:
    """The clauses of :func:`infeasible_message` after its head."""
    priced = _leanest_priced(model, cluster, training, options)
    lean = min(priced, key=lambda p: p.peak_memory_gib, default=None)
    if lean is not None and lean.fits:
        yield (f"a uniform configuration fits: {describe(lean.config)} needs "
               f"{lean.peak_memory_gib:.1f} GiB (--method grid)")  # fmt: skip
        return
    found = nodes_to_fit(model, cluster, training=training, options=options)
    tried = node_factors(cluster)
    if found is None and tried:
        yield f"more nodes alone do not help up to {cluster.num_nodes * tried[-1]} nodes"
    elif found is None:  # the fabric is full
        yield (f"more nodes alone do not help: the outermost network level holds at most "
               f"{physics.most_nodes(cluster)} nodes, fewer than twice {cluster.num_nodes}")
    else:
        nodes, gib, config = found
        yield (f"add nodes: on {nodes} nodes ({nodes * cluster.devices_per_node} devices) "
               f"{describe(config)} needs {gib:.1f} GiB")  # fmt: skip
    if lean is None:
        return  # no uniform configuration divides: nothing to offload or shorten
    saved_gib = lean.optimizer_gib
    left_gib = lean.peak_memory_gib - saved_gib
    on = "" if abs(lean.peak_memory_gib - least_gib) < 0.05 else (
        f" on the leanest uniform configuration ({describe(lean.config)}, "
        f"{lean.peak_memory_gib:.1f} GiB)")  # fmt: skip
    enough = ("enough" if fits_gib(cluster, left_gib, _margin_gib(cluster, training, options))
              else "not enough")
    # Priced where the cluster has host figures, as the framework runs it (planner.cost.offload)
    who = "DeepSpeed ZeRO-Offload" if cluster.host is None else (
        f"{_WHO[_offloaded(model, cluster, lean.config, options).offload]}, as priced")
    yield (f"optimizer offload to the CPU ({who}){on} saves {saved_gib:.1f} "
           f"GiB, leaving {left_gib:.1f} GiB: {enough}; "
           f"{_offload_time(model, cluster, lean.config, options)}")  # fmt: skip
    yield _shorter_sequence(model, cluster, training, options, priced)


def _offload_time(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
                  options: SolveOptions) -> str:  # fmt: skip
    """What the offload's step takes (:func:`estimate` of it offloaded as the target runs it,
    else as Megatron-LM does), and whether the target launches it; or, without host figures,
    that it is not priced."""
    if cluster.host is None:
        return "the planner does not price its time"
    offloaded = _offloaded(model, cluster, config, options)
    off = estimate(model, cluster, offloaded)
    launched = launched_variant(offloaded, model, cluster=cluster, options=options)
    refused = "" if launched is not None else f" ({_why_not(offloaded, model, cluster, options)})"
    return (f"its step takes {off.step_time_s:.2f} s, {off.time.optimizer_s:.2f} s of them the "
            f"host copies and CPU Adam{refused}")


def _why_not(config: ParallelConfig, model: ModelSpec, cluster: ClusterSpec,
             options: SolveOptions) -> str:  # fmt: skip
    """Why the target offloads ``config``'s optimizer in none of the ways priced: its rule
    that refuses its own way (not one that points to another: ``use offload ...``), which
    says whether the framework cannot run it or the planner does not price how it does."""
    if options.framework not in FRAMEWORKS:
        return f"{options.framework} does not launch it"
    target = profile(options.framework)
    reasons = [r for offload in OFFLOADS[1:] for r in target.refusals(
        resolve(model, cluster, config.model_copy(update={"offload": offload})), model)]
    own = [r for r in reasons if "use offload" not in r] or reasons
    return f"{target.title}: {own[0]}" if own else f"{target.title} does not launch it"


def _offloaded(model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig,
               options: SolveOptions) -> ParallelConfig:  # fmt: skip
    """``config`` offloaded as the target launches it, else as Megatron-LM runs it (its
    overlaps as they are: the launch is checked apart)."""
    launched = offloaded_variant(config, model, cluster=cluster, options=options)
    offload = "optimizer" if launched is None else launched.offload
    return config.model_copy(update={"offload": offload})


def _margin_gib(cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions) -> float:
    """The margin the search leaves free on ``cluster``'s devices for ``training``'s stack."""
    return options.margin_bytes(cluster.device, training.stack) / GIB


_WHO: dict[str, str] = {"optimizer": "Megatron-LM's", "zero-offload": "DeepSpeed's ZeRO-Offload"}
"""Whose offload each offloaded value is priced as."""


def _shorter_sequence(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    options: SolveOptions,
    priced: Sequence[_Lean],
) -> str:
    """Whether a shorter sequence fits: never when what does not scale with it (weights,
    gradients, optimizer states, reserved memory) is over the device in every uniform
    configuration; else the longest of the run's halved up to :data:`SEQUENCE_HALVINGS`
    times."""
    # What scales with the sequence, and the allocator's slack on it, off each peak.
    fixed_gib = min(r.peak_memory_gib - r.sequence_gib
                    - cost.allocator_slack_bytes(cluster.device, r.sequence_gib * GIB) / GIB
                    for r in priced)  # fmt: skip
    margin = _margin_gib(cluster, training, options)
    if not fits_gib(cluster, fixed_gib, margin):
        return (f"a shorter sequence would not help: weights, gradients, optimizer states and "
                f"reserved memory alone need {fixed_gib:.1f} GiB per device in every uniform "
                f"configuration on these devices")  # fmt: skip
    seq = training.seq_length
    for _ in range(SEQUENCE_HALVINGS):
        if seq < 2:
            break
        seq //= 2
        shorter = training.model_copy(update={"seq_length": seq})
        found = leanest_uniform(model, cluster, training=shorter, options=options)
        if found is not None and fits_gib(cluster, found[0], margin):
            return (f"a shorter sequence: at {seq} (--seq-len {seq}) {describe(found[1])} "
                    f"needs {found[0]:.1f} GiB")  # fmt: skip
    return f"a shorter sequence: not even {seq} fits"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Lean:
    """A branch's leanest configuration, priced: what the remedies read of it."""

    config: ParallelConfig
    """The configuration."""
    peak_memory_gib: float
    """Its peak memory per device."""
    fits: bool
    """Whether it fits beside the default margin (:func:`estimate`'s ``fits``)."""
    optimizer_gib: float
    """Its optimizer states per device."""
    sequence_gib: float
    """What of its peak grows with the sequence: the activations and the largest transient."""


def _leanest_priced(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[_Lean]:
    """Each branch's leanest configuration that divides, priced (in one batch:
    :func:`~planner.uniform.batch.estimate_batch`)."""
    configs = space.branch_leanest(model, cluster, training=training, options=options)
    if not configs:
        return []
    columns = estimate_batch(model, cluster, configs).columns
    return [_Lean(config=c, peak_memory_gib=float(columns["peak_memory_gib"][i]),
                  fits=bool(columns["fits"][i]),
                  optimizer_gib=float(columns["memory.optimizer_gib"][i]),
                  sequence_gib=float(columns["memory.activations_gib"][i]
                                     + columns["memory.working_gib"][i]
                                     + columns["memory.loss_workspace_gib"][i]))
            for i, c in enumerate(configs) if columns["divides"][i]]  # fmt: skip
