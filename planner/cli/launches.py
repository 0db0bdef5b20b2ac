"""A plan's launch as ``export`` and ``solve --export`` print it: the launch text, its
notes and the plan's prediction against the device; and what export refuses before writing
one (a plan that does not fit, a plan made for no one framework)."""

from __future__ import annotations

from pathlib import Path

from planner import cost, frameworks
from planner.cli.app import note
from planner.errors import InfeasibleError, InputError
from planner.frameworks import FRAMEWORKS
from planner.plan.schema import Plan
from planner.report.bands import band_line, with_band
from planner.spec import DeviceSpec
from planner.vocabulary import GIB


def print_launch(plan: Plan, launch: frameworks.Launch) -> None:
    """The launch text on stdout; its environment, notes and the plan's predicted step and
    memory against the device on stderr."""
    print(launch.text, end="" if launch.text.endswith("\n") else "\n")
    print_notes(plan, launch)


def print_notes(plan: Plan, launch: frameworks.Launch) -> None:
    """What the launch needs beside its text, and the plan's prediction, on stderr."""
    for name, value in launch.environment.items():
        note(f"set {name}={value} in the launch environment")
    for text in launch.notes:
        note(text)
    note(_prediction(plan))
    note(band_line(plan.predicted.error_band))


def _prediction(plan: Plan) -> str:
    """The plan's predicted step with its error band and peak memory against the device's
    capacity: what is left beside the peak, the margin within it (``explain`` says what is
    free beyond the margin)."""
    p, capacity = plan.predicted, plan.cluster.device_memory_gib
    free = capacity - p.peak_memory_gib
    return (f"predicted {with_band(p.step_time_s, p.error_band)} per step, "
            f"{p.peak_memory_gib:.1f} GiB peak "
            f"per device of {capacity:g} GiB ({free:.1f} GiB left, "
            f"{plan.memory_margin_gib:.1f} of it the margin)")  # fmt: skip


def check_fits(plan: Plan, device: DeviceSpec, target: str, *, model: Path,
               cluster: Path) -> None:  # fmt: skip
    """Refuse to export a plan whose peak does not fit beside its margin on ``device`` (the
    cost model's :func:`~planner.cost.fits`; ``estimate --out`` writes such a plan, to record
    what was priced): its launch would run out of memory."""
    p, capacity = plan.predicted, device.memory_gib
    if cost.fits(p.peak_memory_gib * GIB, device, plan.memory_margin_gib):
        return
    usable = capacity - plan.memory_margin_gib
    raise InfeasibleError(
        f"the plan needs {p.peak_memory_gib:.1f} GiB a device where {usable:.1f} may be filled "
        f"({capacity:g} GiB less its {plan.memory_margin_gib:.1f} GiB margin): its launch would "
        f"run out of memory; solve for one that fits: planner solve {model} {cluster} "
        f"--nodes {plan.cluster.num_nodes} --framework {target}")  # fmt: skip


def made_for(plan: Plan) -> str:
    """The framework ``plan`` was solved (or estimated) for, which ``export`` writes when no
    ``--format`` is given; a plan made for ``any`` names none, so the user must."""
    if plan.framework in FRAMEWORKS:
        return plan.framework
    raise InputError(f"the plan was made for {plan.framework!r}, not for one framework: pass "
                     f"--format, one of {', '.join(FRAMEWORKS)}")  # fmt: skip
