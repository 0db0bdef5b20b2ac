"""The field types every spec is built from: integers and numbers that refuse true/false,
printable labels, and the frozen base model."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _not_bool(value: Any) -> Any:
    # JSON's true is an int to pydantic (bool subclasses int), but `"num_layers": true` is a
    # mistake, not one layer.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
"""An integer field that refuses true/false."""
Float = Annotated[float, BeforeValidator(_not_bool)]
"""A number field that refuses true/false (NaN and infinities are refused by the models)."""
Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")]
"""A label that appears in messages: one printable line."""


class Frozen(BaseModel):
    """A spec: immutable, no unknown keys, no NaN or infinity."""

    # NaN or an infinity in an input is a mistake, and would poison every sum it enters.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
