"""Messages about inputs: a value quoted short, a pydantic error as one line a user reads.

Shared by every reader of inputs (:mod:`planner.spec.reading`, :mod:`planner.spec.hf`, plan
files and validation records), so each says what was given and what is allowed the same way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from planner.spec import limits as lim

_SHORT = 60
"""Characters of an offending value quoted in a message."""


def short_repr(value: Any) -> str:
    """``repr(value)`` on one line, cut to :data:`_SHORT` characters, for quoting an input in
    a message."""
    text = repr(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _loc_part(part: int | str) -> str:
    """One step of a field's location, quoted if it is not a plain name (a key from the
    input may hold anything, a newline included)."""
    text = str(part)
    plain = text.isprintable() and len(text) <= _SHORT and not any(c in text for c in ". ")
    return text if plain and text else short_repr(part)


_SHAPES = {"dict_type": "an object {...}", "model_type": "an object {...}",
           "model_attributes_type": "an object {...}", "tuple_type": "a list [...]",
           "list_type": "a list [...]"}
"""Pydantic's errors of a value of the wrong JSON shape, as the shape the field takes (its
own words name Python's types: "a valid dictionary or instance of DeviceSpec")."""


def _json_kind(value: Any) -> str:
    """A value's JSON kind, as a file holds it (``null``, not ``None``).

    >>> _json_kind(None), _json_kind([1]), _json_kind({"a": 1}), _json_kind("x")
    ('null', 'a list', 'an object', "'x'")
    """
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return short_repr(value)


_OWN_WORDS = frozenset({"missing", "extra_forbidden", "value_error", "assertion_error"})
"""Errors whose message needs no quote of the input (it is absent, or the message has it)."""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The spec class a field's type holds (through ``X | None``, ``tuple[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def known_fields(spec: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The fields of the spec found at ``loc`` (a pydantic error's location, indices and all)
    under ``spec``; empty when ``loc`` leads to no spec.

    >>> from planner.spec import ClusterSpec
    >>> known_fields(ClusterSpec, ("network", 1, "efficiency"))
    ['bandwidth_fraction', 'source']
    """
    model: type[BaseModel] | None = spec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


LISTED_FIELDS = 12
"""An object with at most this many fields lists them after an unknown one that is close to
none (a cluster file's efficiency block: its kernels and figures); a larger one would not fit
the line."""


def _unknown_field(err: Any, spec: type[BaseModel] | None) -> str:
    """``unknown field``, with the known field nearest its spelling when one is close, else the
    known ones of a small object.

    >>> from planner.spec import ClusterSpec
    >>> err = {"loc": ("device", "efficiency", "flash3")}
    >>> _unknown_field(err, ClusterSpec)  # doctest: +ELLIPSIS
    'unknown field (known: gemm, attention, grouped_gemm, fp8, ...)'
    """
    name, parent = str(err["loc"][-1]), tuple(err["loc"][:-1])
    known = known_fields(spec, parent) if spec else []
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown field (did you mean {close[0]!r}?)"
    if 0 < len(known) <= LISTED_FIELDS:
        return f"unknown field (known: {', '.join(known)})"
    return "unknown field"


def describe_validation_error(
    path: Path | str,
    exc: ValidationError,
    *,
    keys: Mapping[str, str] | None = None,
    spec: type[BaseModel] | None = None,
) -> str:
    """One line naming the file, the first failing field, the problem and what is allowed.

    An unknown key comes first: a misspelt key is also a missing one, and the unknown
    spelling is what the user must change (``spec``, the class validated, gives the nearest
    known key to suggest). ``keys`` maps a field (dotted, as ``moe.top_k``) to the key the
    file spelled it with, for inputs translated into a spec (a Hugging Face
    ``config.json``)."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    field = ".".join(_loc_part(p) for p in err["loc"]) or "(top level)"
    if keys and keys.get(field, field) != field:
        field = f"{keys[field]} (read as {field})"
    # The innermost named part with a limit (peak_tflops.bf16 is bounded as peak_tflops).
    name = next((str(p) for p in reversed(err["loc"]) if lim.reason(str(p))), "")
    kind, ctx, given = err["type"], err.get("ctx", {}), err.get("input")
    msg = err["msg"]
    if kind == "extra_forbidden":
        msg = _unknown_field(err, spec)
    elif kind == "literal_error":
        msg = f"got {short_repr(given)}, allowed: {ctx.get('expected', '')}"
    elif kind == "missing":
        msg = "required field is missing"
    elif kind in ("less_than_equal", "less_than") and lim.reason(name):
        limit = ctx.get("le", ctx.get("lt"))
        msg = f"{short_repr(given)} is above the limit of {limit} ({lim.reason(name)})"
    elif kind == "string_pattern_mismatch":
        msg = f"must be printable text on one line, got {short_repr(given)}"
    elif kind == "int_from_float":
        msg = f"must be a whole number, got {short_repr(given)}"
    elif kind in _SHAPES:
        msg = f"must be {_SHAPES[kind]}, got {_json_kind(given)}"
    elif kind == "too_short":
        msg = (f"needs at least {ctx.get('min_length', 1)} item(s), got "
               f"{ctx.get('actual_length', 0)}")  # fmt: skip
    elif kind == "value_error" and "error" in ctx:
        msg = _in_file_keys(str(ctx["error"]), keys or {})  # without pydantic's "Value error, "
    elif kind not in _OWN_WORDS:
        msg = f"{msg}, got {'null' if given is None else short_repr(given)}"
    msg += _unit_hint(str(err["loc"][-1]) if err["loc"] else "", kind, given, ctx)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    # A check over the whole object (a model validator) names no field.
    where = f"{field}: " if err["loc"] else ""
    return f"{path}: {where}{msg}{more}"


def _unit_hint(name: str, kind: str, given: object, ctx: Mapping[str, Any]) -> str:
    """The unit a value over its field's limit was likely written in, where one explains it:
    a percent for a fraction, MiB for GiB; a platform a device of another vendor leaves out.

    >>> _unit_hint("max_fraction", "less_than_equal", 70, {"le": 1})
    '; a fraction, not a percent: 0.7'
    >>> _unit_hint("memory_gib", "less_than_equal", 196608, {"le": 16384})
    '; GiB, not MiB: 192'
    >>> _unit_hint("max_fraction", "less_than_equal", 1.05, {"le": 1}), _unit_hint(
    ...     "memory_gib", "less_than_equal", 20000, {"le": 16384})
    ('', '')
    """
    if kind == "literal_error" and name == "platform":
        return " (a device of another vendor leaves it out: then no framework is refused on it)"
    limit = ctx.get("le", ctx.get("lt"))
    if kind not in ("less_than_equal", "less_than") or not isinstance(given, int | float) \
            or isinstance(given, bool) or not isinstance(limit, int | float):
        return ""
    # a percent reads as one from 5 on (1.05 is more likely 105 % than 1.05 %); MiB as
    # whole GiB (a device's memory in MiB is a multiple of 1,024)
    if name.endswith("fraction") and limit <= 1 and 5 <= given <= 100:
        return f"; a fraction, not a percent: {given / 100:g}"
    if name.endswith("_gib") and given % 1024 == 0 and given / 1024 <= limit:
        return f"; GiB, not MiB: {given / 1024:g}"
    return ""


def _in_file_keys(message: str, keys: Mapping[str, str]) -> str:
    """A check's ``message`` with each top-level field it names spelt as the file's key
    (``keys``), so that what it asks to change is what the file holds.

    >>> _in_file_keys("heads (32) not divisible by num_query_groups (5); set kv_channels",
    ...               {"num_query_groups": "num_key_value_heads", "kv_channels": "head_dim"})
    'heads (32) not divisible by num_key_value_heads (5); set head_dim'
    """
    for field, key in keys.items():
        # "name" is a word too common in messages to stand for the field
        if "." not in field and field != "name":
            message = re.sub(rf"\b{re.escape(field)}\b", key, message)
    return message
