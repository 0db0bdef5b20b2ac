"""Exports: a plan spelled as each framework spells it today, ready to paste into a launcher.

One module per framework, each a plain function ``to_<framework>(plan, *, price=None)``;
:func:`export` picks one by name.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import InputError
from planner.export.base import Export, Format, Price
from planner.export.colossalai import to_colossalai
from planner.export.deepspeed import to_deepspeed
from planner.export.megatron import to_megatron
from planner.export.mindspeed import to_mindspeed
from planner.export.torchtitan import to_torchtitan
from planner.plan import Plan

_EXPORTERS: dict[str, Callable[..., Export]] = {
    "megatron": to_megatron,
    "mindspeed": to_mindspeed,
    "deepspeed": to_deepspeed,
    "colossalai": to_colossalai,
    "torchtitan": to_torchtitan,
}
FORMATS: tuple[str, ...] = tuple(_EXPORTERS)
"""The formats :func:`export` knows."""


def export(plan: Plan, fmt: str, *, price: Price | None = None) -> Export:
    """The plan in format ``fmt``; an unknown format is an :class:`InputError` listing them."""
    exporter = _EXPORTERS.get(fmt)
    if exporter is None:
        raise InputError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    return exporter(plan, price=price)


__all__ = [
    "FORMATS",
    "Export",
    "Format",
    "Price",
    "export",
    "to_colossalai",
    "to_deepspeed",
    "to_megatron",
    "to_mindspeed",
    "to_torchtitan",
]
