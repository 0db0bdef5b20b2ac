"""Framework targets: what each framework launches (its profile) and how to write it.

One module per framework (``megatron``, ``mindspeed``, ``deepspeed``, ``colossalai``,
``torchtitan``), each with its ``PROFILE``; :func:`profile` picks one by name, and
:func:`launch` writes a plan for one, or refuses, in one line, what it cannot launch.
"""

from __future__ import annotations

from planner.errors import InputError
from planner.frameworks import colossalai, deepspeed, megatron, mindspeed, torchtitan
from planner.frameworks.base import (
    ANY,
    FRAMEWORKS,
    TARGETS,
    Framework,
    Launch,
    Profile,
    Rule,
)
from planner.plan.config import ResolvedConfig, resolve
from planner.plan.inputs import at_plan_size, check_inputs
from planner.plan.schema import Plan
from planner.spec import ClusterSpec, DeviceSpec, ModelSpec
from planner.vocabulary import Stack

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (megatron.PROFILE, mindspeed.PROFILE, deepspeed.PROFILE, colossalai.PROFILE,
              torchtitan.PROFILE)
}  # fmt: skip
"""Each framework's profile, by name."""


def check_framework(name: str, *, option: str = "--framework", allow_any: bool = True) -> str:
    """``name`` if it is a framework target (or ``any`` when allowed), else an InputError
    listing them."""
    known = TARGETS if allow_any else FRAMEWORKS
    if name not in known:
        raise InputError(f"{option} {name!r} is not a framework the planner knows; choose from "
                         f"{', '.join(known)}")  # fmt: skip
    return name


def profile(name: str) -> Profile:
    """The profile of framework ``name`` (an InputError listing the known ones otherwise)."""
    return PROFILES[check_framework(name, option="framework", allow_any=False)]


def check_platform(framework: str, device: DeviceSpec) -> None:
    """Refuse ``framework`` (one of :data:`FRAMEWORKS`) on a device whose platform it does not
    run on (:meth:`Profile.platform_refusal`), naming those that do.

    >>> from planner.spec import DeviceSpec
    >>> gpu = DeviceSpec(name="H100", memory_gib=80, memory_bandwidth_gb_s=3350,
    ...                  peak_tflops={"bf16": 989}, platform="cuda")
    >>> check_platform("mindspeed", gpu)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    planner.errors.InputError: MindSpeed runs on ascend, not on H100's cuda (...): plan with \
--framework megatron, deepspeed, colossalai or torchtitan
    """
    reason = profile(framework).platform_refusal(device)
    if reason is None:
        return
    others = [p.name for p in PROFILES.values() if device.platform in p.platforms]
    raise InputError(f"{reason}: plan with --framework {', '.join(others[:-1])}"
                     f"{' or ' if len(others) > 1 else ''}{others[-1]}")


def default_stack(framework: str, model: ModelSpec, stack: Stack | None = None) -> Stack | None:
    """The stack ``framework`` runs ``model``'s layers on: ``stack`` when given, else the
    model's training block's when the framework runs it, else the framework's own (its
    profile's first); None for ``any``, whose stack is the model's.

    >>> import planner
    >>> model = planner.load_model("instances/models/llama3-8b.json")
    >>> default_stack("deepspeed", model), default_stack("megatron", model)
    ('megatron-deepspeed', 'megatron-te')
    """
    if stack is not None or framework == "any":
        return stack
    stacks = profile(framework).stacks
    block = model.training.stack if model.training is not None else None
    return block if block in stacks else stacks[0]


Paths = tuple[str, str]
"""The model's and the cluster's files, as the user named them."""
PLACEHOLDERS: Paths = ("MODEL", "CLUSTER")


def solve_command(plan: Plan, framework: str, paths: Paths = PLACEHOLDERS) -> str:
    """The command that solves ``plan``'s problem for ``framework``."""
    return (f"planner solve {paths[0]} {paths[1]} --nodes {plan.cluster.num_nodes} "
            f"--global-batch {plan.global_batch_size} --seq-len {plan.seq_length} "
            f"--precision {plan.precision} --framework {framework}")  # fmt: skip


def plan_configuration(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, *, framework: str = "megatron",
    paths: Paths = PLACEHOLDERS,
) -> ResolvedConfig:  # fmt: skip
    """The uniform configuration ``plan`` is, resolved against its inputs; an InputError when
    the plan has none (a per-operator plan, which no framework launches) or when ``model`` or
    ``cluster`` is not what it was made for (a launch of another model's plan would run what
    was never priced)."""
    named = paths != PLACEHOLDERS
    check_inputs(plan, model, cluster, model_label=paths[0] if named else None,
                 cluster_label=paths[1] if named else None)  # fmt: skip
    if plan.configuration is None:
        raise InputError(f"the plan was solved for {plan.framework} with per-operator "
                         f"shardings, which no framework launches; solve for the framework: "
                         f"{solve_command(plan, framework, paths)}")  # fmt: skip
    return resolve(model, at_plan_size(plan, cluster), plan.configuration)


def launch(
    plan: Plan, framework: str, *, model: ModelSpec, cluster: ClusterSpec,
    paths: Paths = PLACEHOLDERS,
) -> Launch:  # fmt: skip
    """``plan`` in ``framework``'s own words, exactly as it was priced.

    Raises :class:`InputError` naming everything the framework cannot launch, with the
    command that solves the problem for it, when its profile refuses the configuration.
    """
    target = profile(framework)
    check_platform(framework, cluster.device)
    resolved = plan_configuration(plan, model, cluster, framework=framework, paths=paths)
    reasons = target.refusals(resolved, model)
    if reasons:
        raise InputError(f"{target.title} cannot launch this plan: {'; '.join(reasons)}; "
                         f"solve for it: {solve_command(plan, framework, paths)}")  # fmt: skip
    return target.launch(resolved, model)


__all__ = [
    "ANY",
    "FRAMEWORKS",
    "PROFILES",
    "TARGETS",
    "Framework",
    "Launch",
    "Paths",
    "Profile",
    "Rule",
    "check_framework",
    "check_platform",
    "default_stack",
    "launch",
    "plan_configuration",
    "profile",
    "solve_command",
]
