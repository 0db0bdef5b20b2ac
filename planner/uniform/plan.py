"""A uniform (Megatron-style) configuration as a :class:`~planner.plan.Plan`.

The same sharding on every layer, equal stages, ranks in Megatron's default order
(``tp-cp-ep-dp-pp``: tensor-parallel ranks adjacent inside a node, pipeline stages outermost).
Baselines and exports use it; the search's plans have the same shape.
"""

from __future__ import annotations

from planner.placement.ranks import megatron_order
from planner.plan.config import ParallelConfig, resolve
from planner.plan.degrees import Degrees
from planner.plan.inputs import cluster_ref, model_ref
from planner.plan.invariants import check_plan
from planner.plan.schema import (
    Plan,
    PlanStage,
    RunFlags,
    ScheduleSpec,
    SolverSummary,
    StageParallel,
)
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import Estimate, estimate
from planner.vocabulary import DEFAULT_RANK_ORDER, schedule_name


def megatron_ranks(
    *, tp: int, cp: int, dp: int, pp: int, order: str = DEFAULT_RANK_ORDER
) -> list[list[list[int]]]:
    """``ranks[stage][replica]``: the ranks of each stage in each data-parallel replica, the
    ranks of one stage listed context-major then tensor, numbered in ``order``
    (:func:`planner.placement.ranks.megatron_order`).

    >>> megatron_ranks(tp=2, cp=1, dp=2, pp=2)
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    >>> megatron_ranks(tp=2, cp=1, dp=2, pp=1, order="cp-ep-dp-tp-pp")
    [[[0, 2], [1, 3]]]
    """
    ranks = megatron_order(order, Degrees(tp=tp, cp=cp, dp=dp, pp=pp))
    return [[ranks.ranks(at={"pp": stage, "dp": r}, over=("cp", "tp")) for r in range(dp)]
            for stage in range(pp)]  # fmt: skip


def uniform_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    config: ParallelConfig,
    *,
    method: str = "uniform",
    framework: str = "megatron",
    memory_margin_gib: float = 0.0,
) -> Plan:
    """Price ``config`` and describe it as a plan for ``framework``, carrying the configuration
    with every default filled in (what an export launches).

    The plan keeps the structural invariants of :func:`~planner.plan.invariants.check_plan`
    (raising :class:`~planner.errors.InvalidPlanError` otherwise) but may not fit in memory:
    ``planner estimate --out`` writes what it was asked to price; the searches that return
    a uniform plan as their answer check its memory themselves.
    """
    resolved = resolve(model, cluster, config)
    c = resolved.config
    result: Estimate = estimate(model, cluster, config)
    ranks = megatron_ranks(tp=c.tp, cp=c.cp, dp=resolved.dp, pp=c.pp, order=c.rank_order)
    bounds = [0]
    for count in resolved.stage_layers:
        bounds.append(bounds[-1] + count)
    parallel = StageParallel(tp=c.tp, dp=1, cp=c.cp, ep=c.ep, etp=resolved.etp, sp=resolved.sp,
                             zero=c.zero, recompute=c.recompute)  # fmt: skip
    stages = tuple(
        PlanStage(
            index=i,
            layers=(bounds[i] + 1, bounds[i + 1]),
            num_devices=c.tp * c.cp,
            mesh=(c.cp, c.tp),
            ranks=tuple(tuple(r) for r in ranks[i]),
            parallel=parallel,
            memory=s.memory,
            time=s.time,
        )
        for i, s in enumerate(result.stages)
    )
    schedule = ScheduleSpec(name=schedule_name(c.schedule, c.vpp),
                            virtual_stages=c.vpp)  # fmt: skip
    complete = c.model_copy(update={
        "dp": resolved.dp, "global_batch": resolved.training.global_batch_size,
        "seq_len": resolved.training.seq_length, "precision": resolved.training.precision,
        "stack": resolved.training.stack,
    })  # fmt: skip
    plan = Plan(
        method=method,
        framework=framework,
        configuration=complete,
        memory_margin_gib=memory_margin_gib,
        model=model_ref(model),
        cluster=cluster_ref(cluster),
        precision=resolved.training.precision,
        stack=resolved.training.stack,
        global_batch_size=resolved.training.global_batch_size,
        seq_length=resolved.training.seq_length,
        micro_batch_size=c.mbs,
        num_microbatches=resolved.num_microbatches,
        schedule=schedule,
        data_parallel_replicas=resolved.dp,
        flags=RunFlags(flash_attention=c.flash_attention,
                       overlap_grad_reduce=c.overlap_grad_reduce,
                       overlap_param_gather=c.overlap_param_gather,
                       tp_comm_overlap=c.tp_comm_overlap,
                       overlap_moe_expert_parallel_comm=c.overlap_moe_expert_parallel_comm,
                       moe_dispatcher=c.moe_dispatcher, optimizer_moments=c.optimizer_moments),
        stages=stages,
        predicted=result.headline(),
        solver=SolverSummary(time_s=0.0, status="priced"),
    )
    return check_plan(plan, model, memory=False)

