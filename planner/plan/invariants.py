"""Invariants every valid plan keeps, checked before a plan is returned or after it is read.

A plan breaks none of these whichever method made it (the ILP search, a uniform
configuration, the grid or the heuristic); one that does is a planner bug or a damaged file.
Each family is named at the start of its messages:

- ``layers``: the stages are numbered ``0..p-1`` in order and their decoder layers are
  contiguous ranges covering ``1..L`` once (``L`` the model's layers, when it is known).
- ``ranks``: every rank is in the cluster (``0 <= rank < num_nodes x devices_per_node``) and
  used once; each stage has one rank group per data-parallel replica of the pipeline.
- ``devices``: a stage's mesh has ``num_devices`` devices, and so has each of its rank
  groups; the replicas of all stages use at most the cluster's devices.
- ``degrees``: per stage, as Megatron-LM counts them, ``tp x cp x dp`` is the stage's devices
  and the expert-parallel degree divides the data-parallel ways times the context-parallel
  ways: Megatron-Core (``megatron/core/parallel_state.py``, ``initialize_model_parallel``)
  raises unless ``world_size % (expert_tensor_parallel x ep x pp) == 0``, and with the expert
  tensor parallelism equal to ``tp`` (its default) and ``world_size = tp x cp x dp x pp`` that
  is ``(dp x cp) % ep == 0``, ``dp`` counting every data-parallel rank (the pipeline's
  replicas times the stage's own ``dp``); with the experts folded over the tensor-parallel
  ranks (``etp`` 1) it is ``(tp x dp x cp) % ep == 0``, and the planner asks ``ep`` to be a
  multiple of ``tp`` (the folded groups take whole tensor-parallel groups). The interleaved
  schedule (``virtual_stages > 1``, and only then) needs a pipeline, every stage's layers
  in ``virtual_stages`` equal chunks (Megatron-Core's rule, uneven first and last stages
  included), or on a looped schedule with the embedding's and the loss's slots a layer
  short (:func:`~planner.plan.chunks.cuts_into`), and the microbatches a multiple of the
  stages (``forward_backward_pipelining_with_interleaving`` in
  ``megatron/core/pipeline_parallel/schedules.py``).
- ``batch``: on every stage, ``global batch = micro batch x microbatches x data-parallel
  ranks`` (the micro batch is per data-parallel rank); a per-operator plan may split the
  batch differently in each stage, so its micro batch is the first stage's and every stage
  splits the pipeline's microbatch evenly.
- ``configuration``: a plan that carries a uniform configuration (what an export launches)
  is that configuration: as many stages as its ``pp`` with its split, every stage with its
  degrees, ZeRO stage and recomputation, and its microbatch, global batch, sequence,
  precision and schedule; and a per-operator plan (method ``ilp``) carries none. A uniform
  plan made for ``any`` (the baselines under ``--framework any``) carries its configuration.
- ``memory``: no stage's memory, and not the predicted peak, exceeds the device's memory
  (within float rounding). A configuration priced on request (``planner estimate --out``) may
  exceed it; a plan a search returns as a solution may not.
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.errors import InvalidPlanError
from planner.plan.chunks import cuts_into
from planner.plan.schema import Plan
from planner.spec import ModelSpec
from planner.spec.limits import MAX_MTP_LAYERS

MEMORY_RTOL = 1e-9
"""Relative slack on the memory capacity: float rounding in GiB conversions, nothing more."""
SHOWN = 5
"""Violations quoted in an :class:`~planner.errors.InvalidPlanError`; the rest are counted."""


def plan_violations(
    plan: Plan, model: ModelSpec | None = None, *, memory: bool = True
) -> list[str]:
    """Every invariant ``plan`` breaks, one short sentence each; empty when it is valid.

    ``model`` adds the check that the last stage ends at the model's last layer; ``memory``
    False skips the capacity check (a configuration priced on request, not a solution).
    Messages start with the invariant's family: ``layers``, ``ranks``, ``devices``,
    ``degrees``, ``batch`` or ``memory``.

    Examples
    --------
    >>> from pathlib import Path
    >>> from planner.plan.config import ParallelConfig
    >>> from planner.spec.reading import load_cluster, load_model
    >>> from planner.uniform.plan import uniform_plan
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> model = load_model(root / "models/llama3-8b.json")
    >>> cluster = load_cluster(root / "clusters/dgx-h100-80gb.json", 1)
    >>> plan = uniform_plan(model, cluster, ParallelConfig(tp=2, pp=2, global_batch=64))
    >>> plan_violations(plan, model)
    []
    >>> plan_violations(plan.model_copy(update={"global_batch_size": 96}))[:2]
    ['batch: stage 0: micro batch 1 x 32 microbatches x 2 data-parallel ranks = 64, not the global batch 96', 'batch: stage 1: micro batch 1 x 32 microbatches x 2 data-parallel ranks = 64, not the global batch 96']
    """  # noqa: E501
    checks = [
        _layers(plan, model),
        _ranks(plan),
        _devices(plan),
        _degrees(plan, model),
        _batch(plan),
        _configuration(plan),
        _memory(plan) if memory else iter(()),
    ]
    return [message for check in checks for message in check]


def check_plan(plan: Plan, model: ModelSpec | None = None, *, memory: bool = True) -> Plan:
    """``plan`` unchanged when it keeps every invariant of :func:`plan_violations`.

    Raises :class:`~planner.errors.InvalidPlanError` listing the first violations and how
    many there are.

    >>> from pathlib import Path
    >>> from planner.plan.config import ParallelConfig
    >>> from planner.spec.reading import load_cluster, load_model
    >>> from planner.uniform.plan import uniform_plan
    >>> root = Path(__file__).resolve().parents[2] / "instances"
    >>> model = load_model(root / "models/llama3-8b.json")
    >>> cluster = load_cluster(root / "clusters/dgx-h100-80gb.json", 1)
    >>> plan = uniform_plan(model, cluster, ParallelConfig(tp=8, global_batch=64))
    >>> check_plan(plan, model) is plan
    True
    >>> check_plan(plan.model_copy(update={"num_microbatches": 32}))
    Traceback (most recent call last):
    ...
    planner.errors.InvalidPlanError: uniform plan of llama3-8b on 1 x 8 devices breaks 1 invariant: batch: stage 0: micro batch 1 x 32 microbatches x 1 data-parallel ranks = 32, not the global batch 64
    """  # noqa: E501
    violations = plan_violations(plan, model, memory=memory)
    if not violations:
        return plan
    c = plan.cluster
    count = len(violations)
    text = "; ".join(violations[:SHOWN])
    if count > SHOWN:
        text += f"; and {count - SHOWN} more"
    raise InvalidPlanError(
        f"{plan.method} plan of {plan.model.name} on {c.num_nodes} x {c.devices_per_node} "
        f"devices breaks {count} invariant{'s' * (count > 1)}: {text}"
    )


def _layers(plan: Plan, model: ModelSpec | None) -> Iterator[str]:
    """Stages in index order over contiguous layer ranges from 1 to the model's last."""
    expected_first = 1
    for position, stage in enumerate(plan.stages):
        first, last = stage.layers
        if stage.index != position:
            yield f"layers: stage {stage.index} is listed at position {position}"
        if last < first:
            yield f"layers: stage {stage.index} has layers {first}..{last}, an empty range"
        if first != expected_first:
            how = "overlaps the previous stage" if first < expected_first else "leaves a gap"
            yield (f"layers: stage {stage.index} starts at layer {first}, not "
                   f"{expected_first} ({how})")  # fmt: skip
        expected_first = max(expected_first, last + 1)
    if model is not None and expected_first - 1 != model.num_layers:
        yield (f"layers: the stages end at layer {expected_first - 1}, but {model.name} has "
               f"{model.num_layers} decoder layers")  # fmt: skip


def _ranks(plan: Plan) -> Iterator[str]:
    """One rank group per replica, ranks in the cluster and used once."""
    cluster_devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    owner: dict[int, tuple[int, int]] = {}
    for stage in plan.stages:
        if len(stage.ranks) != plan.data_parallel_replicas:
            yield (f"ranks: stage {stage.index} has {len(stage.ranks)} rank groups, not one "
                   f"per data-parallel replica ({plan.data_parallel_replicas})")  # fmt: skip
        for replica, group in enumerate(stage.ranks):
            for rank in group:
                if not 0 <= rank < cluster_devices:
                    yield (f"ranks: stage {stage.index} replica {replica} uses rank {rank}, "
                           f"outside the cluster's 0..{cluster_devices - 1}")  # fmt: skip
                elif rank in owner:
                    s, r = owner[rank]
                    yield (f"ranks: stage {stage.index} replica {replica} uses rank {rank}, "
                           f"already used by stage {s} replica {r}")  # fmt: skip
                else:
                    owner[rank] = (stage.index, replica)


def _devices(plan: Plan) -> Iterator[str]:
    """Mesh, device count and rank groups agree; the replicas fit in the cluster."""
    for stage in plan.stages:
        rows, cols = stage.mesh
        if rows * cols != stage.num_devices:
            yield (f"devices: stage {stage.index} has mesh {rows} x {cols} = {rows * cols}, "
                   f"not its {stage.num_devices} devices")  # fmt: skip
        sizes = sorted({len(g) for g in stage.ranks if len(g) != stage.num_devices})
        if sizes:
            yield (f"devices: stage {stage.index} has rank groups of {sizes} ranks, not its "
                   f"{stage.num_devices} devices")  # fmt: skip
    per_replica = sum(s.num_devices for s in plan.stages)
    used = plan.data_parallel_replicas * per_replica
    cluster_devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    if used > cluster_devices:
        yield (f"devices: {plan.data_parallel_replicas} replicas x {per_replica} devices = "
               f"{used}, more than the cluster's {cluster_devices}")  # fmt: skip


def _degrees(plan: Plan, model: ModelSpec | None) -> Iterator[str]:
    """Megatron's degree arithmetic per stage, and the interleaved schedule's rules."""
    replicas = plan.data_parallel_replicas
    for stage in plan.stages:
        p = stage.parallel
        if p.tp * p.cp * p.dp != stage.num_devices:
            yield (f"degrees: stage {stage.index}: tp({p.tp}) x cp({p.cp}) x dp({p.dp}) = "
                   f"{p.tp * p.cp * p.dp}, not its {stage.num_devices} devices")  # fmt: skip
        folded = p.etp == 1 and p.tp > 1
        ways = replicas * p.dp * p.cp * (p.tp if folded else 1)
        if ways % p.ep or (folded and p.ep % p.tp):
            tensor = f"tp({p.tp}) x " if folded else ""
            yield (f"degrees: stage {stage.index}: ep({p.ep}) does not divide {tensor}"
                   f"data-parallel ranks({replicas * p.dp}) x cp({p.cp}) = {ways}"
                   f"{' as a multiple of tp' if folded else ''}")  # fmt: skip
    v, stages = plan.schedule.virtual_stages, len(plan.stages)
    if plan.schedule.name == "zb-v":
        if v != 2:
            yield f"degrees: schedule zb-v with virtual_stages {v}: a V is two chunks per stage"
    elif (plan.schedule.name == "interleaved") != (v > 1):
        yield (f"degrees: schedule {plan.schedule.name} with virtual_stages {v}: interleaving "
               "is exactly virtual_stages > 1")  # fmt: skip
    if v == 1:
        return
    if stages == 1:
        yield f"degrees: virtual_stages {v} needs a pipeline, but the plan has one stage"
    if plan.schedule.name == "interleaved" and plan.num_microbatches % stages:
        yield (f"degrees: interleaved schedule: {plan.num_microbatches} microbatches are not "
               f"a multiple of the {stages} stages")  # fmt: skip
    layers = tuple(stage.num_layers for stage in plan.stages)
    equal = all(n % v == 0 for n in layers)
    # Without the model, its multi-token-prediction modules may take slots beside the loss.
    modules = range(MAX_MTP_LAYERS + 1) if model is None else (model.mtp_layers,)
    if not (equal or (plan.schedule.name != "zb-v"
                      and any(cuts_into(layers, v, mtp) for mtp in modules))):  # fmt: skip
        yield (f"degrees: stages of {list(layers)} layers do not cut into virtual_stages({v}) "
               f"chunks: equal, or the embedding's and the loss's slots a layer short")


def _batch(plan: Plan) -> Iterator[str]:
    """Global batch = micro batch x microbatches x data-parallel ranks, on every stage.

    A per-operator plan (method ``ilp``) may split the batch differently in each stage's
    mesh: its micro batch is the first stage's, and every stage must split the pipeline's
    microbatch (the first stage's micro batch times its data-parallel ways) evenly."""
    if plan.method == "ilp" and plan.stages:
        mesh_micro = plan.micro_batch_size * plan.stages[0].parallel.dp
        total = mesh_micro * plan.num_microbatches * plan.data_parallel_replicas
        if total != plan.global_batch_size:
            yield (f"batch: the pipeline's microbatch of {mesh_micro} x "
                   f"{plan.num_microbatches} microbatches x {plan.data_parallel_replicas} "
                   f"replicas = {total}, not the global batch "
                   f"{plan.global_batch_size}")  # fmt: skip
        for stage in plan.stages:
            if mesh_micro % stage.parallel.dp:
                yield (f"batch: stage {stage.index}: the pipeline's microbatch of {mesh_micro} "
                       f"does not split over its {stage.parallel.dp} data-parallel "
                       f"ways")  # fmt: skip
        return
    for stage in plan.stages:
        ranks = plan.data_parallel_replicas * stage.parallel.dp
        total = plan.micro_batch_size * plan.num_microbatches * ranks
        if total != plan.global_batch_size:
            yield (f"batch: stage {stage.index}: micro batch {plan.micro_batch_size} x "
                   f"{plan.num_microbatches} microbatches x {ranks} data-parallel ranks = "
                   f"{total}, not the global batch {plan.global_batch_size}")  # fmt: skip


def _configuration(plan: Plan) -> Iterator[str]:
    c = plan.configuration
    if c is None:
        return
    if plan.method == "ilp":
        yield "configuration: a per-operator plan (method ilp) carries a configuration"
    layers = tuple(s.num_layers for s in plan.stages)
    if len(layers) != c.pp:
        yield f"configuration: {len(layers)} stages, not pp({c.pp})"
    ends = (c.first_stage_layers, c.last_stage_layers)
    if len(layers) > 1 and any(n is not None and n != got
                               for n, got in zip(ends, (layers[0], layers[-1]), strict=True)):
        yield f"configuration: stages hold {list(layers)} layers, not first/last {list(ends)}"
    etp = 1 if c.etp == 1 and c.tp > 1 else None
    knobs = {"tp": c.tp, "cp": c.cp, "ep": c.ep, "sp": c.sp and c.tp > 1, "zero": c.zero,
             "recompute": c.recompute}  # fmt: skip
    for stage in plan.stages:
        p = stage.parallel
        got = {"tp": p.tp, "cp": p.cp, "ep": p.ep, "sp": p.sp, "zero": p.zero,
               "recompute": p.recompute}  # fmt: skip
        want = knobs
        if p.etp != etp:  # said only where the experts are folded on either side
            want, got = knobs | {"etp": etp}, got | {"etp": p.etp}
        if got != want:
            yield f"configuration: stage {stage.index} runs {got}, not {want}"
    run = {"micro_batch_size": c.mbs, "global_batch_size": c.global_batch,
           "seq_length": c.seq_len, "precision": c.precision,
           "virtual_stages": c.vpp}  # fmt: skip
    have = {"micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size, "seq_length": plan.seq_length,
            "precision": plan.precision,
            "virtual_stages": plan.schedule.virtual_stages}  # fmt: skip
    for key, value in run.items():
        if have[key] != value:
            yield f"configuration: {key} {have[key]}, not the configuration's {value}"


def _memory(plan: Plan) -> Iterator[str]:
    """Every stage, and the predicted peak, within the device's memory."""
    capacity = plan.cluster.device_memory_gib
    limit = capacity * (1 + MEMORY_RTOL)
    for stage in plan.stages:
        if stage.memory.total_gib > limit:
            yield (f"memory: stage {stage.index} needs {stage.memory.total_gib:.3f} GiB per "
                   f"device, more than the {capacity:g} GiB a device has")  # fmt: skip
    if plan.predicted.peak_memory_gib > limit:
        yield (f"memory: the predicted peak {plan.predicted.peak_memory_gib:.3f} GiB is more "
               f"than the {capacity:g} GiB a device has")  # fmt: skip
