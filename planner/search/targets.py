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
from planner.frameworks import ANY, check_framework
from planner.options import DEFAULT_OPTIONS, ProgressFn, SolveOptions, training_of
from planner.plan.schema import Plan
from planner.search.framework import enumerate_plan
from planner.search.superset import solve_any
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.reading import check_device


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    options: SolveOptions = DEFAULT_OPTIONS,
    *,
    progress: ProgressFn | None = None,
) -> Plan:
    """The fastest plan for ``options.framework`` that fits, with the knobs in
    ``options.pins`` fixed and ``options.memory_margin_gib`` left free on every device.

    Raises :class:`~planner.errors.InputError` for an unknown framework,
    :class:`~planner.errors.InfeasibleError` when nothing fits (naming what would) and
    :class:`~planner.errors.TimeLimitError` when the time limit passes before any plan.

    >>> import planner
    >>> model = planner.load_model("instances/models/gpt-1.7b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=1)
    >>> plan = solve(model, cluster)
    >>> plan.summary()
    'TP1 x PP1 x DP8, mbs 8, 1F1B, distributed optimizer'
    >>> round(plan.predicted.step_time_s, 2), round(plan.predicted.mfu, 3), plan.solver.status
    (7.91, 0.597, 'optimal')

    With tensor parallelism pinned at 2, the fastest plan left is slower:

    >>> pinned = solve(model, cluster, SolveOptions(pins=planner.Pins(tp=2)))
    >>> pinned.summary(), round(pinned.predicted.step_time_s, 2)
    ('TP2 x PP1 x DP4, mbs 8, 1F1B, sequence parallel, distributed optimizer', 9.03)
    """
    parse_objective(options.objective)
    framework = check_framework(options.framework)
    training = training_of(model, options)
    check_device(training.stack, cluster.device)
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
    if pins.moe_dispatcher == "deepep" and model.moe is None:
        raise InputError(f"--moe-dispatcher deepep: {model.name} has no experts to exchange")
