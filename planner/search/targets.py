"""``planner.solve``: the fastest plan the target framework launches.

For a framework (``megatron``, ``mindspeed``, ``deepspeed``, ``colossalai``, ``torchtitan``)
a layer's sharding follows from its degrees, so the search enumerates every uniform
configuration the framework's profile launches, prices each with the one cost model and
keeps the fastest that fits (:func:`planner.search.framework.enumerate_plan`); for ``any`` it
is the union of those spaces, then the per-operator search (the layer ILP and the stage
dynamic program) bounded by the union's best (:func:`planner.search.superset.solve_any`).
"""

from __future__ import annotations

from planner import cost
from planner.cost.risk import parse_objective
from planner.errors import InputError
from planner.frameworks import ANY, check_framework, check_platform
from planner.options import DEFAULT_OPTIONS, Pins, ProgressFn, SolveOptions, training_of
from planner.plan.schema import Plan
from planner.search.framework import enumerate_plan
from planner.search.superset import solve_any
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import check_device, check_stack


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest plan for ``options.framework`` that fits, with the knobs in
    ``options.pins`` fixed and ``options.memory_margin_gib`` left free on every device.

    Raises :class:`~planner.errors.InputError` for an unknown framework or inputs it cannot
    take, :class:`~planner.errors.ConfigError` when the framework launches no configuration of
    the model (its rules refuse the architecture), :class:`~planner.errors.InfeasibleError`
    when nothing fits (naming what would) and :class:`~planner.errors.TimeLimitError` when
    the time limit passes before any plan.

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt-1.7b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=1)
    >>> plan = solve(model, cluster)
    >>> plan.summary()
    'TP1 x PP1 x DP8, mbs 8, 1F1B, distributed optimizer'
    >>> round(plan.predicted.step_time_s, 2), round(plan.predicted.mfu, 3), plan.solver.status
    (8.11, 0.583, 'optimal')

    With tensor parallelism pinned at 2, the fastest plan left is slower:

    >>> pinned = solve(model, cluster, SolveOptions(pins=planner.Pins(tp=2)))
    >>> pinned.summary(), round(pinned.predicted.step_time_s, 2)
    ('TP2 x PP1 x DP4, mbs 8, 1F1B, sequence parallel, distributed optimizer', 9.23)
    """
    parse_objective(options.objective)
    framework = check_framework(options.framework)
    training = training_of(model, options)
    check_device(training.stack, cluster.device)
    check_stack(training.stack, model)
    if framework != ANY:
        check_platform(framework, cluster.device)
    _check_pins(model, training, options)
    if framework == ANY:
        return solve_any(model, cluster, options, progress=progress)
    return enumerate_plan(model, cluster, options, progress=progress)


def _check_pins(model: ModelSpec, training: TrainingSpec, options: SolveOptions) -> None:
    """Refuse, in one line before searching, a pin no configuration of the run can keep
    (rather than a plan that silently goes without it): bf16 moments where the run's
    precision and stack have no precision-aware optimizer, DeepEP for a model without
    experts."""
    pins = options.pins
    if pins.optimizer_moments == "bf16":
        cost.states_precision(training.precision, training.stack, "bf16")
        if pins.zero not in (None, 1):
            raise InputError(f"--optimizer-moments bf16 with --zero {pins.zero}: Adam's moments "
                             f"are bf16 only inside Megatron-LM's distributed optimizer "
                             f"(ZeRO 1), which the pin leaves out")  # fmt: skip
    if pins.moe_dispatcher == "deepep" and model.moe is None:
        raise InputError(f"--moe-dispatcher deepep: {model.name} has no experts to exchange")


def pins_left_unused(plan: Plan, pins: Pins) -> list[str]:
    """The pins that apply only where a configuration has room for them, said where ``plan``
    has none: DeepEP on a plan that spreads no experts over ranks, bf16 moments on one whose
    optimizer is not ZeRO 1 (Megatron-LM's precision-aware optimizer runs only inside its
    distributed optimizer), each with how to have it. The search keeps such a pin wherever it
    applies; this says when the fastest plan that fits is not such a place.

    >>> from planner.uniform.plan import uniform_plan
    >>> from planner.plan.config import ParallelConfig
    >>> from planner.spec.reading import load_cluster, load_model
    >>> plan = uniform_plan(load_model("instances/models/mixtral-8x7b.json"),
    ...                     load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1),
    ...                     ParallelConfig(tp=8, zero=2, global_batch=64))
    >>> for line in pins_left_unused(plan, Pins(moe_dispatcher="deepep",
    ...                                         optimizer_moments="bf16")):
    ...     print(line.split(":")[0], "|", line.split("(")[1])
    --moe-dispatcher deepep | pin --ep to spread them)
    --optimizer-moments bf16 | pin --zero 1 to keep them in bf16)
    """
    out = []
    if pins.moe_dispatcher == "deepep" and plan.flags.moe_dispatcher != "deepep":
        out.append("--moe-dispatcher deepep: the plan spreads no experts over ranks, so DeepEP "
                   "exchanges none (pin --ep to spread them)")
    if pins.optimizer_moments == "bf16" and plan.flags.optimizer_moments != "bf16":
        zero = max(s.parallel.zero for s in plan.stages)
        out.append(f"--optimizer-moments bf16: the plan's optimizer is ZeRO-{zero}, so Adam's "
                   f"moments stay fp32 (pin --zero 1 to keep them in bf16)")
    return out
