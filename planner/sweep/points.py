"""A sweep's points: each axis checked against the fields it names, the Cartesian product of
the axes in the file's order, and every point's specs built and checked before any search
runs (a value past a field's limits is one error naming the axis, not a failed row)."""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from planner.errors import InputError
from planner.frameworks import check_framework
from planner.options import SEARCH_TIME_LIMIT_S, SolveOptions
from planner.spec import ClusterSpec, ModelSpec, TrainingSpec
from planner.spec.messages import describe_validation_error, short_repr
from planner.spec.reading import check_cluster
from planner.sweep.file import PRICE, SweepFile, Value

TRAINING_FIELDS = tuple(TrainingSpec.model_fields)
"""``[training]``'s fields; :class:`SolveOptions` carries them, so ``search`` does not."""

PRICE_AXIS = f"cluster.{PRICE}"
"""The axis of the price per device-hour (no field of :class:`ClusterSpec`)."""

_ROOTS: dict[str, Any] = {"model": ModelSpec, "cluster": ClusterSpec, "training": TrainingSpec,
                          "search": SolveOptions}  # fmt: skip
"""What each axis path starts from."""

_OPTIONS = TypeAdapter(SolveOptions)
"""SolveOptions checked as pydantic checks the specs (types, literals, the pins' table)."""

MAX_POINTS = 200_000
"""The default bound on a sweep's points (``--max-points``): at a second a point, two days."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One point of a sweep: its axis values and the problem they make."""

    index: int
    """Its place in the Cartesian product (the order of the results)."""
    values: tuple[Value, ...]
    """One value per axis, in the axes' order."""
    model: ModelSpec
    """The model at this point."""
    cluster: ClusterSpec
    """The cluster at this point."""
    options: SolveOptions
    """The search's options at this point (the run's settings included)."""
    price_per_device_hour: float | None
    """Price of a device-hour at this point; None: no cost."""


def check_size(sweep: SweepFile, *, max_points: int = MAX_POINTS) -> None:
    """Refuse a sweep of more points than ``max_points`` (before any is built)."""
    if sweep.num_points > max_points:
        sizes = " x ".join(str(len(v)) for v in sweep.axes.values())
        raise InputError(f"{sweep.source}: {sizes} = {sweep.num_points} points is above "
                         f"--max-points {max_points}")  # fmt: skip


def sweep_points(sweep: SweepFile, *, max_points: int = MAX_POINTS) -> list[Point]:
    """Every point of the sweep, in order, each with its specs built and checked.

    Raises one :class:`~planner.errors.InputError` for an axis that names no field, a sweep
    past ``max_points``, or a point whose value a spec refuses (naming the axis and value)."""
    check_size(sweep, max_points=max_points)
    check_search(sweep)
    for axis in sweep.axes:
        check_axis(sweep, axis)
    if sweep.tokens is None and (sweep.price_per_device_hour is not None
                                 or PRICE_AXIS in sweep.axes):  # fmt: skip
        raise InputError(f"{sweep.source}: a price per device-hour needs tokens (the cost is "
                         "that of training on them)")  # fmt: skip
    # Points share their model, cluster and options across the other axes: build each once.
    cache: dict[Hashable, Any] = {}
    return [_point(sweep, index, values, cache=cache)
            for index, values in enumerate(itertools.product(*sweep.axes.values()))]  # fmt: skip


def _point(
    sweep: SweepFile, index: int, values: tuple[Value, ...], *, cache: dict[Hashable, Any]
) -> Point:
    """The point at ``values``, its specs taken from ``cache`` when another point built them."""
    at = dict(zip(sweep.axes, values, strict=True))
    part = {root: tuple((a, v) for a, v in at.items() if a.split(".")[0] == root)
            for root in _ROOTS}  # fmt: skip
    where = _Where(sweep=sweep, index=index, at=at)
    model = _cached(cache, ("model", part["model"]), lambda: _model(sweep, at, where))
    cluster = _cached(cache, ("cluster", part["cluster"]), lambda: _cluster(sweep, at, where))
    options = _cached(cache, ("options", part["training"], part["search"], part["model"]),
                      lambda: _options(sweep, at, where, model=model))  # fmt: skip
    price = at.get(PRICE_AXIS, sweep.price_per_device_hour)
    if price is not None and (isinstance(price, bool | str) or price <= 0):
        raise InputError(f"{sweep.source}: axis {PRICE_AXIS} = {short_repr(price)}: must be "
                         "a positive number")  # fmt: skip
    return Point(index=index, values=values, model=model, cluster=cluster, options=options,
                 price_per_device_hour=None if price is None else float(price))


T = TypeVar("T")


def _cached(cache: dict[Hashable, Any], key: Hashable, build: Callable[[], T]) -> T:
    """``cache[key]``, built on first use."""
    if key not in cache:
        cache[key] = build()
    return typing.cast(T, cache[key])


# --------------------------------------------------------------------------- axis paths


def check_axis(sweep: SweepFile, axis: str) -> None:
    """Refuse an axis that names no field: the path is walked through the specs' fields
    (a network level by its index in the sweep's cluster, a precision's peak by its name)."""
    parts = axis.split(".")
    if axis == PRICE_AXIS:
        return
    if parts[0] not in _ROOTS or len(parts) < 2:
        raise InputError(f"{sweep.source}: axis {axis!r} names no field: a path starts with "
                         f"{', '.join(_ROOTS)} and names a field (cluster.num_nodes)")  # fmt: skip
    if parts[0] == "search" and parts[1] in TRAINING_FIELDS:
        raise InputError(f"{sweep.source}: axis {axis!r}: the run's {parts[1]} is "
                         f"training.{parts[1]}")  # fmt: skip
    data = {"model": sweep.model.model_dump(), "cluster": sweep.cluster.model_dump()}
    problem = _walk(_ROOTS[parts[0]], data.get(parts[0]), parts[1:], done=parts[0])
    if problem is not None:
        raise InputError(f"{sweep.source}: axis {axis!r} names no field: {problem}")


def check_search(sweep: SweepFile) -> None:
    """Refuse a key of ``[search]`` that is no field of the options (pydantic would ignore
    it, and the user would believe a setting applied that did not)."""
    for key, value in sweep.search.items():
        if key in TRAINING_FIELDS:
            raise InputError(f"{sweep.source}: [search] {key}: the run's {key} goes in "
                             "[training]")  # fmt: skip
        sub = value.keys() if key == "pins" and isinstance(value, dict) else [None]
        for name in sub:
            parts = [key] if name is None else [key, name]
            problem = _walk(SolveOptions, None, parts, done="search", whole=True)
            if problem is not None:
                raise InputError(f"{sweep.source}: [search] {'.'.join(parts)}: {problem}")


def _walk(
    annotation: Any, value: Any, parts: list[str], *, done: str, whole: bool = False
) -> str | None:
    """Why ``parts`` names no value under a field of type ``annotation`` (``value`` is the
    sweep's own, for the lengths of lists); None when it names one. ``whole``: a table or
    list may be named whole (a setting), not only a single value (an axis)."""
    annotation = _unwrap(annotation)
    fields = _fields(annotation)
    origin = get_origin(annotation)
    if not parts:
        nested = fields is not None or origin in (tuple, list, dict)
        return f"{done} is a table: name one of its fields" if nested and not whole else None
    part, rest = parts[0], parts[1:]
    if fields is not None:
        if part not in fields:
            return f"{done} has no field {part!r} (it has {', '.join(fields)})"
        sub = value.get(part) if isinstance(value, dict) else None
        return _walk(fields[part], sub, rest, done=f"{done}.{part}", whole=whole)
    if origin in (tuple, list):
        length = len(value) if isinstance(value, list | tuple) else 0
        if not part.isdigit() or int(part) >= length:
            return f"{done} has {length} entries, numbered from 0, not {part!r}"
        return _walk(get_args(annotation)[0], value[int(part)], rest, done=f"{done}.{part}")
    if origin is dict:
        key_type, value_type = get_args(annotation)
        keys = get_args(_unwrap(key_type)) if get_origin(_unwrap(key_type)) is Literal else ()
        if keys and part not in keys:
            return f"{done} has no key {part!r} (keys: {', '.join(map(str, keys))})"
        sub = value.get(part) if isinstance(value, dict) else None
        return _walk(value_type, sub, rest, done=f"{done}.{part}")
    return f"{done} is a value, not a table"


def _unwrap(annotation: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            kept = [a for a in get_args(annotation) if a is not type(None)]
            if len(kept) != 1:
                return annotation
            annotation = kept[0]
        else:
            return annotation


def _fields(annotation: Any) -> dict[str, Any] | None:
    """The fields of a spec or options type, with their types; None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {name: f.annotation for name, f in annotation.model_fields.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        skip = TRAINING_FIELDS if annotation is SolveOptions else ()
        return {f.name: hints[f.name] for f in dataclasses.fields(annotation)
                if f.name not in skip}  # fmt: skip
    return None


# --------------------------------------------------------------------------- building specs


@dataclass(frozen=True, slots=True, kw_only=True)
class _Where:
    """A point being built, for the messages about it."""

    sweep: SweepFile
    """The sweep."""
    index: int
    """The point's index."""
    at: dict[str, Value]
    """Its value on each axis."""

    def error(self, root: str, exc: ValidationError) -> InputError:
        """A spec refused at this point, as one line naming the axis and value that broke it
        (or the whole point, for a check across fields)."""
        full = describe_validation_error(root, exc)
        loc = ".".join(str(p) for p in exc.errors()[0]["loc"])
        path = f"{root}.{loc}" if loc else root
        axis = next((a for a in self.at if loc and (a == path or path.startswith(a + "."))),
                    None)  # fmt: skip
        if axis is not None:
            detail = full.split(": ", 2)[-1]
            return InputError(f"{self.sweep.source}: axis {axis} = "
                              f"{short_repr(self.at[axis])}: {detail}")  # fmt: skip
        point = ", ".join(f"{a}={short_repr(v)}" for a, v in self.at.items())
        return InputError(f"{self.sweep.source}: point {self.index} ({point}): {full}")


def _set(data: Any, parts: list[str], value: Value) -> Any:
    """A copy of the nested dicts and lists ``data`` with ``value`` at ``parts`` (a missing
    table, such as a dense model's ``moe``, is started)."""
    if not parts:
        return value
    if isinstance(data, list | tuple):
        copy = list(data)
        copy[int(parts[0])] = _set(copy[int(parts[0])], parts[1:], value)
        return copy
    copy = dict(data) if isinstance(data, dict) else {}
    copy[parts[0]] = _set(copy.get(parts[0]), parts[1:], value)
    return copy


def _with_axes(root: str, data: dict[str, Any], at: dict[str, Value]) -> dict[str, Any]:
    """``data`` with this point's values of the axes under ``root``."""
    for axis, value in at.items():
        parts = axis.split(".")
        if parts[0] == root and axis != PRICE_AXIS:
            data = _set(data, parts[1:], value)
    return data


def _model(sweep: SweepFile, at: dict[str, Value], where: _Where) -> ModelSpec:
    """The point's model, checked."""
    if not any(a.startswith("model.") for a in at):
        return sweep.model
    try:
        return ModelSpec.model_validate(_with_axes("model", sweep.model.model_dump(), at))
    except ValidationError as exc:
        raise where.error("model", exc) from None


def _cluster(sweep: SweepFile, at: dict[str, Value], where: _Where) -> ClusterSpec:
    """The point's cluster, checked."""
    if not any(a.startswith("cluster.") and a != PRICE_AXIS for a in at):
        return sweep.cluster
    try:
        cluster = ClusterSpec.model_validate(_with_axes("cluster", sweep.cluster.model_dump(),
                                                        at))  # fmt: skip
    except ValidationError as exc:
        raise where.error("cluster", exc) from None
    try:
        # a figure no hardware has, as a cluster file's is refused (a 400 Gb/s NIC written as
        # 400 GB/s is the sweep's usual slip), and more devices than the outer level holds
        check_cluster(cluster, source="cluster", nodes_field="cluster.num_nodes")
    except InputError as exc:
        point = ", ".join(f"{a}={short_repr(v)}" for a, v in at.items())
        raise InputError(f"{sweep.source}: point {where.index} ({point}): {exc}") from None
    return cluster


def _options(
    sweep: SweepFile, at: dict[str, Value], where: _Where, *, model: ModelSpec
) -> SolveOptions:
    """The point's search options, the run's settings checked as a training block (the
    file's ``[training]``, else the model's own)."""
    given = _with_axes("training", dict(sweep.training), at)
    block = model.training.model_dump() if model.training is not None else {}
    try:
        training = TrainingSpec.model_validate(block | given)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "missing":
            raise InputError(f"{sweep.source}: {model.name} has no training block: give "
                             "[training] seq_length and global_batch_size") from None  # fmt: skip
        raise where.error("training", exc) from None
    search = _with_axes("search", dict(sweep.search), at)
    framework = search.get("framework", "megatron")
    axis = "search.framework"
    check_framework(framework, option=f"{sweep.source}: {axis}" if axis not in at else
                    f"{sweep.source}: axis {axis} =")  # fmt: skip
    search.setdefault("time_limit_s", SEARCH_TIME_LIMIT_S)
    try:
        return _OPTIONS.validate_python(search | training.model_dump())
    except ValidationError as exc:
        raise where.error("search", exc) from None
    except InputError as exc:  # SolveOptions' and Pins' own checks, after the types'
        point = ", ".join(f"{a}={short_repr(v)}" for a, v in at.items())
        raise InputError(f"{sweep.source}: point {where.index} ({point}): search: {exc}") from None
