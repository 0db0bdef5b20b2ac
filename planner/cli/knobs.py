"""A configuration's knobs as command-line options, generated from
:class:`~planner.plan.config.ParallelConfig`'s fields: each option's name, type, choices,
range and help come from the field, as torchtitan builds its command line from its config
dataclasses (``torchtitan/config/manager.py``: ``ConfigManager.parse_args`` hands its config
class to ``tyro.cli``), so a knob is declared once.

A command takes the knobs it offers as one dict parameter ``knobs``; :func:`with_knobs`
puts an option per knob in its place in the command's signature, which typer reads.

>>> import inspect
>>> @with_knobs(("tp", "recompute"), pinned=("recompute",))
... def command(knobs: dict, json: bool = False) -> dict:
...     return knobs
>>> list(inspect.signature(command).parameters)
['tp', 'recompute', 'json']
>>> command(tp=2, recompute=None)
{'tp': 2, 'recompute': None}
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Collection, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import annotated_types
import typer
from pydantic.fields import FieldInfo

from planner.errors import InputError
from planner.plan.config import ParallelConfig
from planner.vocabulary import Offload

Command = TypeVar("Command", bound=Callable[..., Any])


def parse_offload(text: str) -> Offload:
    """``--offload``: a comma-separated list of what goes to host memory, as the one value a
    configuration takes (weights and activations are not priced in this release), or
    ``zero-offload``, the optimizer offloaded as DeepSpeed runs it."""
    names = {name.strip() for name in text.split(",") if name.strip()} - {"none"}
    unpriced = sorted(names & {"weights", "activations"})
    if unpriced:
        raise InputError(f"--offload {text}: offloading {' and '.join(unpriced)} is not priced "
                         f"in this release; --offload optimizer is")  # fmt: skip
    unknown = sorted(names - {"optimizer", "zero-offload"})
    if unknown:
        raise InputError(f"--offload {text}: {unknown[0]!r} is not something to offload; "
                         f"give none, optimizer or zero-offload")  # fmt: skip
    if len(names) > 1:
        raise InputError(f"--offload {text}: the optimizer is offloaded one way, Megatron-LM's "
                         f"(optimizer) or DeepSpeed's (zero-offload)")  # fmt: skip
    return "zero-offload" if "zero-offload" in names else "optimizer" if names else "none"


TEXT_KNOBS: dict[str, Callable[[str], Any]] = {"offload": parse_offload}
"""Knobs typed as text on the command line, with what parses them."""


LONGEST_CHOICES = 40
"""Choices longer than this, joined, are listed in an option's help rather than its column:
a terminal 80 wide keeps the option and its text on their lines."""


def _base(annotation: Any) -> tuple[Any, bool]:
    """The field's type as typer takes it, and whether None is allowed: validators stripped
    (``Annotated``), integer choices as integers (their range bounds them)."""
    optional = False
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        (annotation,) = args
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal and all(isinstance(a, int) for a in get_args(annotation)):
        annotation = int
    return annotation, optional


def _bounds(field: FieldInfo, base: Any) -> dict[str, int]:
    """The field's range as typer's ``min`` and ``max`` (integers only)."""
    bounds: dict[str, int] = {}
    if base is not int:
        return bounds
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Gt):
            bounds["min"] = int(meta.gt) + 1  # type: ignore[call-overload]
        elif isinstance(meta, annotated_types.Ge):
            bounds["min"] = int(meta.ge)  # type: ignore[call-overload]
        elif isinstance(meta, annotated_types.Le):
            bounds["max"] = int(meta.le)  # type: ignore[call-overload]
    choices = get_args(field.annotation)
    if choices and all(isinstance(c, int) for c in choices):  # Literal[0, 1, 2, 3]
        bounds = {"min": min(choices), "max": max(choices)}
    return bounds


def knob_parameter(name: str, *, pinned: bool = False, unset: str | None = None
                   ) -> inspect.Parameter:  # fmt: skip
    """The command-line option of ``ParallelConfig``'s field ``name``. ``pinned``: a search's
    pin (default None: the search chooses; its range checked on the command line);
    ``unset``: None is its default, and the text says what that means."""
    field = ParallelConfig.model_fields[name]
    base, optional = _base(field.annotation)
    if name in TEXT_KNOBS:
        base = str
    flag = "--" + name.replace("_", "-")
    decls = [f"{flag}/--no-{flag[2:]}"] if base is bool else [flag]
    text = field.description or ""
    default = field.default
    bounds: dict[str, int] = {}
    if pinned:
        # the field's own default is what a configuration takes; a search chooses instead
        text = text.split("; default: ")[0].removesuffix(".")
        text, default, bounds = f"{text}. Default: searched.", None, _bounds(field, base)
    elif unset is not None:
        text, default = f"{text} Default: {unset}.", None
    choices = get_args(base) if get_origin(base) is Literal else ()
    if (pinned or unset is not None or optional) and default is None:
        base = base | None
    named: dict[str, str] = {}
    if len("|".join(map(str, choices))) > LONGEST_CHOICES:
        # the choices in the text, which wraps, rather than in the option's column
        named["metavar"] = f"<{name}>"
        text = f"{text} One of: {', '.join(map(str, choices))}."
    option = typer.Option(*decls, help=text, **bounds, **named)  # type: ignore[arg-type]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[base, option])  # fmt: skip


def with_parameters(
    added: Sequence[inspect.Parameter], *, into: str,
    build: Callable[[dict[str, Any]], Any] = dict,
) -> Callable[[Command], Command]:
    """Give a command the options ``added`` in place of its parameter ``into``, which receives
    ``build`` of their values by name: options several commands share, declared once."""

    def decorate(command: Command) -> Command:
        hints = typing.get_type_hints(command, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(command).parameters.values()]  # fmt: skip
        at = next(i for i, p in enumerate(own) if p.name == into)
        params = [*own[:at], *added, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                                       for p in own[at + 1:])]  # fmt: skip
        names = [p.name for p in added]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            values = {n: kwargs.pop(n) for n in names}
            return command(*args, **{into: build(values)}, **kwargs)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run  # type: ignore[return-value]

    return decorate


def knob_parameters(
    names: Sequence[str], *, pinned: Collection[str] = (), unset: dict[str, str] | None = None
) -> list[inspect.Parameter]:
    """An option per knob of ``names`` (:func:`knob_parameter`, those of ``pinned`` as pins,
    those of ``unset`` None by default with what that means)."""
    unset = unset or {}
    return [knob_parameter(n, pinned=n in pinned, unset=unset.get(n)) for n in names]


def parsed(knobs: dict[str, Any]) -> dict[str, Any]:
    """``knobs`` with the text knobs given parsed (:data:`TEXT_KNOBS`)."""
    return {n: TEXT_KNOBS[n](v) if n in TEXT_KNOBS and v is not None else v
            for n, v in knobs.items()}  # fmt: skip


def with_knobs(
    names: Sequence[str], *, pinned: Collection[str] = (), unset: dict[str, str] | None = None
) -> Callable[[Command], Command]:
    """Give a command an option per knob of ``names`` (:func:`knob_parameters`) in place of
    its parameter ``knobs``, which receives them as a dict (text knobs parsed)."""
    return with_parameters(knob_parameters(names, pinned=pinned, unset=unset), into="knobs",
                           build=parsed)  # fmt: skip
