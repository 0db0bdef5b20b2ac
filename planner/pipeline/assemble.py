"""A found pipeline (a split of the layers, each stage's choice, a placement) priced by the one
step composer (:func:`planner.cost.step.compose_step`) and written as a :class:`~planner.plan.Plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner import cost
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.profiled import profile_coverage
from planner.cost.rates import headline, throughput
from planner.cost.regimes import stage_mechanisms
from planner.cost.stage_weights import (
    StageCost,
    TiedCopy,
    Weights,
)
from planner.cost.step import (
    PipelineKnobs,
    StepCost,
    compose_step,
)
from planner.ilp.layer import LayerSolution
from planner.pipeline.options import LayerOption, StageChoice
from planner.placement.ranks import PipelinePlacement
from planner.plan.schema import MemoryBreakdown, PlanStage, Predicted, StageParallel
from planner.sharding.layout import LogicalMesh
from planner.spec import ModelSpec, MoESpec, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundStage:
    """One stage of a found pipeline: layers ``first..last`` (1-based) and its choice."""

    first: int
    """Its first layer (1-based)."""
    last: int
    """Its last layer (inclusive)."""
    choice: StageChoice
    """The options it runs."""


def option_cost(option: LayerOption, count: int) -> LayerCost:
    """``count`` layers of one option as the composer's per-microbatch cost."""
    return layer_cost(option.parts, option.recompute, count=count)


def stage_cost(
    stage: FoundStage,
    kinds: Sequence[str],
    placement: PipelinePlacement,
    *,
    is_first: bool,
    is_last: bool,
    pipeline_comm_s: float,
) -> StageCost:
    """The composer's view of one stage: its layers' costs and its weights by group."""
    counts: dict[str, int] = {}
    for kind in kinds[stage.first - 1 : stage.last]:
        counts[kind] = counts.get(kind, 0) + 1
    if is_first and "embedding" in stage.choice.options:
        counts["embedding"] = 1
    if is_last and "head" in stage.choice.options:
        counts["head"] = 1
    total = LayerCost.zero()
    params: dict[tuple[int, ...], float] = {}
    for kind, count in counts.items():
        option = stage.choice.options[kind]
        total = total + option_cost(option, count)
        for axes, n in option.parts.weight_groups():
            params[axes] = params.get(axes, 0.0) + n * count
    weights = tuple(Weights(params=n, data_parallel=placement.weight_group(axes))
                    for axes, n in sorted(params.items()))  # fmt: skip
    return StageCost(time=total.with_pipeline_comm(pipeline_comm_s), weights=weights,
                     zero=stage.choice.zero)  # fmt: skip


def tied_copy(model: ModelSpec, stages: Sequence[FoundStage],
              placement: PipelinePlacement) -> TiedCopy | None:  # fmt: skip
    """The last stage's copy of the word embeddings (tied, or read by the multi-token-prediction
    modules), sharded as the first stage's embedding."""
    embedding = stages[0].choice.options.get("embedding")
    if not model.embedding_on_last_stage or len(stages) == 1 or embedding is None:
        return None
    groups = embedding.parts.weight_groups()
    if not groups:
        return None
    axes, _ = max(groups, key=lambda g: g[1])
    split = placement.mesh.num_devices // max(1, _copies(placement.mesh, axes))
    return TiedCopy(params=model.vocab_size * model.hidden_size / split,
                    data_parallel=placement.weight_group(axes),
                    sync_group=placement.neighbour_group())  # fmt: skip


def _copies(mesh: LogicalMesh, axes: tuple[int, ...]) -> int:
    n = 1
    for axis in axes:
        n *= mesh.size(axis)
    return n


def compose(
    stages: Sequence[FoundStage],
    kinds: Sequence[str],
    *,
    model: ModelSpec,
    cluster: cost.ClusterSpec,
    knobs: PipelineKnobs,
    placement: PipelinePlacement,
    pipeline_comm_s: float,
) -> StepCost:
    """The step of the found pipeline under ``placement``."""
    p = len(stages)
    costs = [
        stage_cost(s, kinds, placement, is_first=i == 0, is_last=i == p - 1,
                   pipeline_comm_s=pipeline_comm_s if p > 1 else 0.0)
        for i, s in enumerate(stages)
    ]  # fmt: skip
    return compose_step(cluster, knobs, costs, tied=tied_copy(model, stages, placement))


def launchable(solution: LayerSolution, mesh: tuple[int, int]) -> bool:
    """Whether a framework can launch the layer's sharding: every mesh axis has a role in
    attention (heads, sequence or batch), so the degrees a user sets multiply to the mesh,
    and the experts are split over data- and context-parallel ways (Megatron-Core's ``ep``
    dividing ``dp x cp`` with expert tensor parallelism equal to TP), or over every
    tensor-parallel way too (folded: ``etp`` 1, ``ep`` a multiple of ``tp``). The ILP may
    leave an axis replicated (devices doing the same work, or only the MLP split along it)
    or split the experts along some tensor-parallel axes only, which no framework's ``world
    = tp x cp x dp x pp`` with those expert rules can express."""
    summary = summarise(solution, mesh)
    degrees = {k: int(v) for k, v in summary.items()}
    whole = degrees["tp"] * degrees["cp"] * degrees["dp"] == mesh[0] * mesh[1]
    tensor_experts = degrees["tensor_experts"]
    if tensor_experts not in (1, degrees["tp"]):
        return False
    return whole and (degrees["dp"] * degrees["cp"] * tensor_experts) % degrees["ep"] == 0


def summarise(solution: LayerSolution, mesh: tuple[int, int]) -> dict[str, int | bool]:
    """A transformer layer's sharding in the degrees a user sets: tensor parallel = the mesh
    axes splitting attention heads, context = splitting its sequence, data = its batch,
    expert = the experts (``tensor_experts`` of them along tensor-parallel axes); sequence
    parallel when the norms split the sequence along a tensor-parallel axis."""
    degrees = {"tp": 1, "cp": 1, "dp": 1, "ep": 1, "tensor_experts": 1}
    sp = False
    by_op = {c.op.split(".", 1)[-1]: c for c in solution.choices}
    attention = next((c for name, c in by_op.items() if name == "attention"), None)
    tp_axes: set[int] = set()
    if attention is not None:
        for axis, dim in enumerate(attention.strategy.split(",")):
            key = {"heads": "tp", "seq": "cp", "batch": "dp"}.get(dim)
            if key is not None:
                degrees[key] *= mesh[axis]
                tp_axes |= {axis} if key == "tp" else set()
    for name, choice in by_op.items():
        dims = choice.strategy.split(",")
        if name == "input_norm":
            sp = any(dims[axis] == "seq" for axis in tp_axes)
        # The experts' own split, not the dispatch's: the ILP may keep the tokens on their
        # ranks through the dispatch and reshard them to the experts' ranks after it, the
        # same exchange priced as a resharding; the experts are spread either way.
        if name == "expert_up":
            for axis, dim in enumerate(dims):
                split = mesh[axis] if dim == "experts" else 1
                degrees["ep"] *= split
                degrees["tensor_experts"] *= split if axis in tp_axes else 1
    return {**degrees, "sp": sp}


def folded_etp(summary: dict[str, int | bool]) -> int | None:
    """1 where the experts split along every tensor-parallel axis (folded), else None."""
    tp = int(summary["tp"])
    return 1 if tp > 1 and summary["tensor_experts"] == tp else None


def plan_stages(
    stages: Sequence[FoundStage],
    kinds: Sequence[str],
    *,
    placement: PipelinePlacement,
    step: StepCost,
) -> tuple[PlanStage, ...]:
    """The plan's stages: layers, mesh, ranks, the sharding summarised, memory and time."""
    mesh = placement.mesh.shape
    out = []
    for i, s in enumerate(stages):
        held = set(kinds[s.first - 1 : s.last])
        if i == 0:
            held.add("embedding")
        if i == len(stages) - 1:
            held.add("head")
        options = {k: o for k, o in s.choice.options.items() if k in held}
        # The layer kind that says the stage's degrees: the experts' where there are any.
        main = next(options[k] for k in ("moe", "dense", "local") if k in options)
        summary = summarise(main.solution, mesh)
        shardings = {
            f"{option.kind}.{c.op.split('.', 1)[-1]}": c.strategy
            for option in options.values() for c in option.solution.choices
        }  # fmt: skip
        out.append(PlanStage(
            index=i, layers=(s.first, s.last), num_devices=placement.mesh.num_devices,
            mesh=mesh, ranks=placement.stage_ranks(i),
            parallel=StageParallel(tp=int(summary["tp"]), dp=int(summary["dp"]),
                                   cp=int(summary["cp"]), ep=int(summary["ep"]),
                                   etp=folded_etp(summary),
                                   sp=bool(summary["sp"]), zero=s.choice.zero,
                                   recompute=s.choice.recompute),  # type: ignore[arg-type]
            op_shardings=dict(sorted(shardings.items())),
            memory=MemoryBreakdown.from_bytes(step.stage_memory_bytes[i]),
            time=step.stage_times()[i],
        ))  # fmt: skip
    return tuple(out)


def predicted(
    step: StepCost,
    stages: Sequence[FoundStage],
    kinds: Sequence[str],
    *,
    cluster: cost.ClusterSpec,
    training: TrainingSpec,
    forward_flops_per_sequence: float,
    executed_flops_per_sequence: float,
    micro_batch_size: int,
    parallel: Sequence[StageParallel],
    moe: MoESpec | None,
    deepep: bool = False,
) -> Predicted:
    """The plan's headline numbers; ``micro_batch_size`` is the pipeline's (the recomputed
    FLOPs of the stages' options are per pipeline microbatch); ``parallel`` is the stages'
    sharding in degrees (:func:`plan_stages`), whose mechanisms place the error band; ``moe``:
    the model's routed experts, if any; ``deepep``: DeepEP exchanges their tokens."""
    rerun = 0.0
    for s in stages:
        for kind in kinds[s.first - 1 : s.last]:
            option = s.choice.options[kind]
            rerun += option.parts.rerun_flops[option.parts.mode(option.recompute)]
    rates = throughput(step.step_s, training, cluster,
                       forward_flops_per_sequence=forward_flops_per_sequence,
                       executed_flops_per_sequence=executed_flops_per_sequence,
                       recompute_flops_per_sequence=rerun / micro_batch_size)  # fmt: skip
    profiled: list[str] = []
    for p in parallel:  # each stage's shard; a line once however many stages share it
        lines = profile_coverage(
            cluster.device.efficiency.profile, kinds=("embedding", *dict.fromkeys(kinds), "head"),
            stack=training.stack, precision=training.precision, tensor_parallel=p.tp,
            micro_batch_size=max(1, micro_batch_size // max(1, p.dp)),
            seq_length=training.seq_length // max(1, p.cp), moe=moe,
            expert_parallel=p.ep, expert_tensor_parallel=p.etp)  # fmt: skip
        profiled += [line for line in lines if line not in profiled]
    return headline(step, rates, cluster=cluster, training=training, moe=moe is not None,
                    used=stage_mechanisms(parallel, deepep=deepep), profiled=tuple(profiled))
