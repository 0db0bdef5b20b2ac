"""The grid baseline: every uniform (Megatron-style) configuration, priced by :func:`estimate`.

The space is what a Megatron-LM user can launch with flags:

- ``tp``: divisors of the devices in a node that divide the attention heads, the KV groups
  and the FFN (tensor parallelism stays inside a node);
- ``pp``: divisors of the decoder layers; ``vpp`` (interleaved 1F1B): every count of equal
  chunks, when ``options.interleaved``;
- ``cp``: 1, 2, 4, 8 with ``tp * cp`` within a node, only from :data:`LONG_SEQUENCE` on;
- ``ep``: divisors of the experts (mixtures of experts only);
- ``mbs``: ``options.micro_batch_sizes``; recomputation none, selective or full; ZeRO 0 or 1
  (the distributed optimizer), 0 to 3 without a pipeline;
- sequence parallelism whenever ``tp > 1``; flash attention and the overlap flags as the
  options say; data parallelism takes the devices left over.

The answer is the least predicted step time among the configurations that divide and fit, ties
broken by the smallest ``(tp, pp, cp, ep, vpp, mbs, recompute, zero)``. Two prunings skip work
without changing it: a branch of degrees ``(tp, pp, cp, ep)`` is dropped when its leanest
configuration (no interleaving, the smallest microbatch, full recomputation, the highest ZeRO
stage) does not fit, and within a branch a larger microbatch is not tried once a smaller one
does not fit (activations grow with the microbatch; 1F1B's in-flight count times the
microbatch never shrinks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from planner.config import ParallelConfig, Recompute
from planner.errors import ConfigError, InfeasibleError
from planner.estimate import Estimate, estimate
from planner.plan import Plan, SolverSummary
from planner.search import Progress, ProgressFn, SolveOptions, divisors, training_of
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.uniform import uniform_plan

DEFAULT_OPTIONS = SolveOptions()
"""What :func:`planner.search.solve` assumes when given no options."""
LONG_SEQUENCE = 8192
"""Context parallelism is tried from this sequence length on. Below it the attention's
activations are small next to the rest of a layer's, and NVIDIA's recipes keep CP at 1 (their
first with CP 2 is Llama 3 8B at 8192)."""
CP_DEGREES = (1, 2, 4, 8)
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class Branch:
    """The degrees that decide how devices are grouped; everything else varies inside."""

    tp: int
    pp: int
    cp: int
    ep: int


def tp_degrees(model: ModelSpec, cluster: ClusterSpec) -> list[int]:
    """Tensor-parallel degrees inside a node that split heads, KV groups and FFN evenly."""
    per_node = cluster.devices_per_node
    # MLA's keys and values come from one shared latent: there are no KV groups to split
    kv_groups = model.num_attention_heads if model.mla else model.query_groups
    return [t for t in range(1, per_node + 1)
            if per_node % t == 0 and model.num_attention_heads % t == 0
            and kv_groups % t == 0 and model.ffn % t == 0]  # fmt: skip


def branches(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> list[Branch]:
    """Every ``(tp, pp, cp, ep)`` whose model-parallel group divides the devices."""
    n = cluster.num_devices
    cps = CP_DEGREES if training.seq_length >= LONG_SEQUENCE else (1,)
    experts = model.moe.num_experts if model.moe else 1
    out = []
    for tp in tp_degrees(model, cluster):
        for cp in (c for c in cps if tp * c <= cluster.devices_per_node):
            for pp in divisors(model.num_layers):
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                out += [Branch(tp, pp, cp, ep) for ep in divisors(experts) if (dp * cp) % ep == 0]
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
    microbatch ascending."""
    b = branch
    vpps = [1]
    if options.interleaved and b.pp > 1:
        vpps += [v for v in range(2, model.num_layers // b.pp + 1)
                 if model.num_layers % (b.pp * v) == 0]  # fmt: skip
    zeros = (0, 1, 2, 3) if b.pp == 1 else (0, 1)
    mbss = sorted(set(options.micro_batch_sizes))
    return [
        [run_config(training, options, tp=b.tp, pp=b.pp, cp=b.cp, ep=b.ep, vpp=v, sp=b.tp > 1,
                    mbs=m, recompute=r, zero=z) for m in mbss]
        for v in vpps for r in RECOMPUTE for z in zeros
    ]  # fmt: skip


def grid_space(
    model: ModelSpec, cluster: ClusterSpec, options: SolveOptions = DEFAULT_OPTIONS
) -> list[ParallelConfig]:
    """Every configuration the grid considers (some do not divide or fit)."""
    training = training_of(model, options)
    return [config for branch in branches(model, cluster, training)
            for group in branch_groups(branch, model, training, options)
            for config in group]  # fmt: skip


def config_key(config: ParallelConfig) -> tuple[int, ...]:
    """The tie-break order: simpler configurations first."""
    c = config
    return (c.tp, c.pp, c.cp, c.ep, c.vpp, c.mbs, RECOMPUTE.index(c.recompute), c.zero)


Verdict = Literal["fits", "too big", "refused"]


@dataclass(slots=True)
class _Search:
    """The best configuration so far and the leanest one that did not fit."""

    best: tuple[float, tuple[int, ...], ParallelConfig] | None = None
    leanest: tuple[float, ParallelConfig] | None = None
    first_refusal: str | None = None

    def price(self, model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig) -> Verdict:
        """Price ``config`` and keep it if it is the best so far."""
        try:
            result: Estimate = estimate(model, cluster, config)
        except ConfigError as exc:
            self.first_refusal = self.first_refusal or str(exc)
            return "refused"
        if not result.fits:
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
    """The fastest uniform configuration that fits, as a plan (method ``"grid"``).

    Raises :class:`~planner.errors.InfeasibleError` when none fits and
    :class:`~planner.errors.ConfigError` when none even divides.
    """
    started = time.perf_counter()
    training = training_of(model, options)
    work = [branch_groups(b, model, training, options) for b in branches(model, cluster, training)]
    total = sum(len(group) for groups in work for group in groups)
    search = _Search()
    done = 0
    for groups in work:
        size = sum(len(group) for group in groups)
        leanest = min((g[0] for g in groups), key=_leanness)
        if search.price(model, cluster, leanest) != "too big":
            for group in groups:
                for config in group:
                    if search.price(model, cluster, config) == "too big":
                        break  # a larger microbatch holds more
        done += size
        if progress is not None:
            progress(Progress(done, total, search.best[0] if search.best else None))
    if search.best is None:
        raise _failure(model, cluster, training, search)
    plan = uniform_plan(model, cluster, search.best[2], method="grid")
    summary = SolverSummary(time_s=time.perf_counter() - started, status="optimal",
                            objective=plan.predicted.step_time_s)  # fmt: skip
    return plan.model_copy(update={"solver": summary})


def _leanness(config: ParallelConfig) -> tuple[int, int, int, int]:
    """Smaller is leaner: no interleaving, small microbatch, more recomputation, more ZeRO."""
    return (config.vpp, config.mbs, -RECOMPUTE.index(config.recompute), -config.zero)


def _failure(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, search: _Search
) -> InfeasibleError | ConfigError:
    where = (f"{model.name} on {cluster.num_devices} x {cluster.device.name} at global batch "
             f"{training.global_batch_size}, sequence {training.seq_length}")  # fmt: skip
    if search.leanest is None:
        return ConfigError(f"no uniform configuration divides {where}: e.g. "
                           f"{search.first_refusal}")  # fmt: skip
    return nothing_fits(model, cluster, training, search.leanest,
                        searched="no uniform configuration", advice="add nodes or shorten the "
                        "sequence")  # fmt: skip


def nothing_fits(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    leanest: tuple[float, ParallelConfig],
    *,
    searched: str,
    advice: str,
) -> InfeasibleError:
    """The error for a search where nothing fits, naming the leanest configuration tried and
    the memory it needs."""
    need_gib, c = leanest
    return InfeasibleError(
        f"{searched} fits {model.name} on {cluster.num_devices} x {cluster.device.name} "
        f"({cluster.device.memory_gib:g} GiB) at global batch {training.global_batch_size}, "
        f"sequence {training.seq_length}; the leanest tried (tp {c.tp}, pp {c.pp}, cp {c.cp}, "
        f"ep {c.ep}, mbs {c.mbs}, {c.recompute} recompute, ZeRO-{c.zero}) needs "
        f"{need_gib:.1f} GiB per device; {advice}"
    )

