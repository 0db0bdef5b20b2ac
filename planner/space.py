"""The search space: what :func:`planner.search.solve` may choose from, and the outer
candidates it visits.

A candidate fixes what the layer ILP and the pipeline's dynamic program do not choose: the
data-parallel replicas of the whole pipeline, the submesh every stage runs on (hence the
number of stages), the pipeline's microbatch and the schedule. Candidates come sorted by a
lower bound on their step, their compute at the best GEMM efficiency stretched by the
pipeline's fill and drain, which lets the search stop early and state its gap when a time
limit cuts it short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner import cost
from planner.config import ContextParallelism, Recompute, Schedule, check_sequence
from planner.errors import InputError
from planner.ilp.backends import Backend
from planner.pipeline.stages import submesh_shapes
from planner.reading import training_run
from planner.spec import ClusterSpec, ModelSpec, Precision, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """Knobs the user fixed (``--tp 8`` ...); None leaves one to the search. Spelled as
    ``planner estimate`` spells them."""

    tp: int | None = None
    """Tensor-parallel degree."""
    pp: int | None = None
    """Pipeline stages."""
    cp: int | None = None
    """Context-parallel degree."""
    cp_algo: ContextParallelism | None = None
    """ring or ulysses."""
    ep: int | None = None
    """Expert-parallel degree."""
    vpp: int | None = None
    """Virtual stages per pipeline rank (1: no interleaving)."""
    mbs: int | None = None
    """Sequences per data-parallel rank and microbatch."""
    zero: int | None = None
    """ZeRO stage."""
    recompute: Recompute | None = None
    """none, selective or full."""
    sp: bool | None = None
    """Sequence parallelism (with TP)."""

    def given(self) -> dict[str, object]:
        """The pinned knobs and their values."""
        return {name: getattr(self, name) for name in self.__slots__
                if getattr(self, name) is not None}  # fmt: skip

    def admits(self, **knobs: object) -> bool:
        """Whether every pinned knob among ``knobs`` has its pinned value."""
        return all(getattr(self, k) is None or getattr(self, k) == v for k, v in knobs.items())


NO_PINS = Pins()


@dataclass(frozen=True, slots=True)
class SolveOptions:
    """What the search may choose from, and how hard it tries."""

    global_batch_size: int | None = None
    seq_length: int | None = None
    precision: Precision | None = None
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Sequences per data-parallel rank and microbatch (Megatron's ``--micro-batch-size``);
    a mesh takes this times the data-parallel ways inside it (:func:`mesh_microbatches`)."""
    interleaved: bool = True
    max_mesh_nodes: int | None = None
    """A stage's mesh spans part of a node or 1, 2, 4, ... nodes up to this (Alpa allows any
    count). None: one node for dense models, two for mixtures of experts. Across nodes a mesh
    axis is mostly data parallel, which replicas of the pipeline already give; expert
    parallelism is the common reason to span nodes. Each wider mesh makes its layer ILPs
    slower (a second instead of milliseconds)."""
    backend: Backend = "ortools"
    ilp_time_limit_s: float = 10.0
    """Per layer ILP (cut short by :attr:`time_limit_s` too)."""
    time_limit_s: float | None = None
    """The whole search. Past it the best plan found so far is returned, with status
    ``time_limit`` and its gap to the least bound of the candidates left; None: no limit."""
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    framework: str = "megatron"
    """The framework that will launch the plan (:data:`planner.frameworks.TARGETS`): the search
    produces only what its profile launches; ``any`` searches per-operator shardings."""
    pins: Pins = NO_PINS
    """Knobs the user fixed."""
    memory_margin_gib: float | None = None
    """Device memory plans leave free; None: :data:`planner.cost.DEFAULT_MEMORY_MARGIN` of
    the device."""

    def margin_bytes(self, device_memory_gib: float) -> float:
        """The memory a plan leaves free on a device of ``device_memory_gib``."""
        return cost.memory_margin_bytes(device_memory_gib, self.memory_margin_gib)


DEFAULT_OPTIONS = SolveOptions()
"""What ``solve`` searches when given no options."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One setting of the outer knobs."""

    replicas: int
    mesh: tuple[int, int]
    num_stages: int
    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    vpp: int
    lower_bound_s: float


@dataclass(frozen=True, slots=True)
class Progress:
    """Reported after each candidate: how far the search is and the best step so far."""

    done: int
    total: int
    best_step_s: float | None
    searching: str = ""
    """The candidate being searched, as a user would say it (empty once done)."""


ProgressFn = Callable[[Progress], None]


def training_of(model: ModelSpec, options: SolveOptions) -> TrainingSpec:
    """The run's sequence length, global batch and precision: the options, else the model's
    training block."""
    defaults = model.training
    seq = options.seq_length or (defaults.seq_length if defaults else None)
    gbs = options.global_batch_size or (defaults.global_batch_size if defaults else None)
    if seq is None or gbs is None:
        raise InputError(f"{model.name}: no training block: pass --seq-len and --global-batch")
    precision = options.precision or (defaults.precision if defaults else "bf16")
    check_sequence(model, seq)
    return training_run(seq, gbs, precision)


def candidates(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, options: SolveOptions
) -> list[Candidate]:
    """Every outer setting that divides, cheapest lower bound first."""
    n_dev = cluster.num_devices
    per_node = cluster.devices_per_node
    layers = model.num_layers
    gbs = training.global_batch_size
    flops = model_flops_per_sequence(model, training.seq_length)
    max_nodes = options.max_mesh_nodes or (2 if model.moe else 1)
    out = []
    for replicas in divisors(n_dev):
        devices = n_dev // replicas
        nodes = max(1, devices // per_node)
        for mesh in submesh_shapes(nodes, per_node):
            size = mesh[0] * mesh[1]
            if size > devices or devices % size or (mesh[0] > 1 and devices % per_node):
                continue
            if mesh[0] & (mesh[0] - 1) or mesh[0] > max_nodes:
                continue
            stages = devices // size
            if stages > layers or not options.pins.admits(pp=stages):
                continue
            per_rank = options.micro_batch_sizes
            if options.pins.mbs is not None:
                per_rank = (options.pins.mbs,)
            for b in mesh_microbatches(per_rank, size):
                if gbs % (replicas * b):
                    continue
                m = gbs // (replicas * b)
                per_microbatch = cost.compute_lower_bound_s(
                    cluster.device, training.precision, flops=3 * flops * b / devices
                )
                for schedule, v in _schedules(layers, stages, m, options.interleaved):
                    if not options.pins.admits(vpp=v):
                        continue
                    bound = (m + (stages - 1) / v) * per_microbatch
                    out.append(Candidate(replicas, mesh, stages, b, m, schedule, v, bound))
    out.sort(key=lambda c: (c.lower_bound_s, -c.replicas, c.num_stages, c.micro_batch_size,
                            c.vpp))  # fmt: skip
    return out


def mesh_microbatches(per_rank: Sequence[int], mesh_size: int) -> list[int]:
    """Sequences one mesh takes per microbatch: a per-rank microbatch times the ways the
    layer ILP may split the batch inside the mesh (which it decides), so that a stage whose
    mesh is all data parallel can still run the per-rank microbatches a user would try.

    >>> mesh_microbatches((1, 2), 4)
    [1, 2, 4, 8]
    """
    ways = [d for d in divisors(mesh_size) if d & (d - 1) == 0 or d == mesh_size]
    return sorted({b * d for b in per_rank for d in ways})


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(layers: int, stages: int, m: int, interleaved: bool) -> list[tuple[Schedule, int]]:
    """1F1B, and interleaved 1F1B with ``v`` chunks per stage (Megatron needs the
    microbatches to be a multiple of the stages; the split must give each stage a multiple of
    ``v`` layers, which the dynamic program enforces)."""
    out: list[tuple[Schedule, int]] = [("1f1b", 1)]
    if interleaved and stages > 1 and m % stages == 0:
        out += [("1f1b", v) for v in range(2, layers // stages + 1)]
    return out


def model_flops_per_sequence(model: ModelSpec, seq: int) -> float:
    """Forward FLOPs of one sequence through the whole model."""
    from planner.estimate import _forward_flops  # one definition of the model's FLOPs

    return _forward_flops(model, TrainingSpec(seq_length=seq, global_batch_size=1), 1)


def describe(c: Candidate) -> str:
    """A candidate as a user would say it.

    >>> describe(Candidate(8, (1, 8), 16, 4, 48, "1f1b", 3, 0.0))
    'PP16 of 1x8 meshes, 8 pipeline replicas, microbatch of 4 sequences, v=3'
    >>> describe(Candidate(1, (1, 8), 1, 1, 48, "1f1b", 1, 0.0))
    'PP1 of 1x8 meshes, 1 pipeline replica, microbatch of 1 sequence'
    """
    replicas = f"{c.replicas} pipeline replica" + "s" * (c.replicas > 1)
    sequences = f"{c.micro_batch_size} sequence" + "s" * (c.micro_batch_size > 1)
    text = f"PP{c.num_stages} of {c.mesh[0]}x{c.mesh[1]} meshes, {replicas}, microbatch of "
    return text + sequences + (f", v={c.vpp}" if c.vpp > 1 else "")
