"""Messages about inputs: a value quoted short, a pydantic error as one line a user reads.

Shared by every reader of inputs (:mod:`planner.spec.reading`, :mod:`planner.spec.hf`, plan
files and validation records), so each says what was given and what is allowed the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

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


_OWN_WORDS = frozenset({"missing", "extra_forbidden", "value_error", "assertion_error"})
"""Errors whose message needs no quote of the input (it is absent, or the message has it)."""


def describe_validation_error(
    path: Path | str, exc: ValidationError, *, keys: Mapping[str, str] | None = None
) -> str:
    """One line naming the file, the first failing field, the problem and what is allowed.

    ``keys`` maps a field (dotted, as ``moe.top_k``) to the key the file spelled it with, for
    inputs translated into a spec (a Hugging Face ``config.json``)."""
    err = exc.errors()[0]
    field = ".".join(_loc_part(p) for p in err["loc"]) or "(top level)"
    if keys and keys.get(field, field) != field:
        field = f"{keys[field]} (read as {field})"
    # The innermost named part with a limit (peak_tflops.bf16 is bounded as peak_tflops).
    name = next((str(p) for p in reversed(err["loc"]) if lim.reason(str(p))), "")
    kind, ctx, given = err["type"], err.get("ctx", {}), err.get("input")
    msg = err["msg"]
    if kind == "extra_forbidden":
        msg = "unknown field"
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
    elif kind not in _OWN_WORDS:
        msg = f"{msg}, got {short_repr(given)}"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{path}: {field}: {msg}{more}"
