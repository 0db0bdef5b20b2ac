"""A user's own changes to a configuration, as ``--why-not`` spells them: ``"tp=8,pp=16"`` read
into :class:`~planner.plan.config.ParallelConfig` fields and their values, which
:func:`~planner.diagnose.notches.with_changes` then applies."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import ValidationError

from planner.diagnose.notches import PROBLEM, SWITCHES
from planner.errors import InputError
from planner.plan.config import ParallelConfig


def parse_changes(text: str, *, option: str = "--why-not") -> dict[str, Any]:
    """``"tp=8,pp=16,recompute=full"`` as configuration fields and their values (names as
    ``planner estimate``'s options, ``-`` or ``_``; switches ``on``/``off``, ``true``/``false``
    or ``1``/``0``); an InputError naming the pair that does not read.

    >>> parse_changes("tp=8, pp=16,sp=on,overlap-grad-reduce=false")
    {'tp': 8, 'pp': 16, 'sp': True, 'overlap_grad_reduce': False}
    >>> parse_changes("cross-entropy-loss-fusion=on,recompute-modules=moe_act")
    {'cross_entropy_loss_fusion': True, 'recompute_modules': 'moe_act'}
    >>> parse_changes("compile=off")
    {'compile': False}
    >>> parse_changes("tp=8 pp=16")
    Traceback (most recent call last):
    planner.errors.InputError: --why-not: 'tp=8 pp=16': separate the knobs with commas (tp=8,pp=16)
    """
    fields = ParallelConfig.model_fields
    changes: dict[str, Any] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, raw = (s.strip() for s in pair.partition("="))
        name = key.replace("-", "_")
        if not sep or not raw:
            raise InputError(f"{option}: {pair!r} is not knob=value (e.g. tp=8,pp=16,mbs=2)")
        if "=" in raw:  # "tp=8 pp=16" read "8 pp=16: not an integer"
            raise InputError(f"{option}: {pair!r}: separate the knobs with commas "
                             "(tp=8,pp=16)")
        if name in PROBLEM:
            raise InputError(f"{option}: {key} is the training run, not a knob; the comparison "
                             "keeps the plan's")  # fmt: skip
        if name in changes:
            raise InputError(f"{option}: {key} is given twice")
        if name in SWITCHES:  # a switch that stands for a stack
            if raw.lower() not in _SWITCH:
                raise InputError(f"{option}: {key}={raw}: a switch takes on or off")
            changes[name] = _SWITCH[raw.lower()]
            continue
        if name not in fields:
            knobs = ", ".join(k.replace("_", "-") for k in (*fields, *SWITCHES)
                              if k not in PROBLEM)  # fmt: skip
            raise InputError(f"{option}: no knob {key!r}; knobs: {knobs}")
        changes[name] = _value(name, raw, option=option)
    if not changes:
        raise InputError(f"{option}: no knob=value given (e.g. tp=8,pp=16,mbs=2)")
    return changes


_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
_IMPLIES = {"recompute_modules": {"recompute": "selective"},
            "recompute_layers": {"recompute": "full"}}
"""What a field given alone implies, as :func:`~planner.diagnose.notches.with_changes` applies
it: modules mean selective recomputation, a count of layers full."""


def _value(name: str, raw: str, *, option: str) -> Any:
    """``raw`` as the type of field ``name`` (the field's own validation decides the rest)."""
    default = ParallelConfig.model_fields[name].default
    if isinstance(default, bool):
        if raw.lower() not in _SWITCH:
            raise InputError(f"{option}: {name.replace('_', '-')}={raw}: a switch takes on or "
                             "off")  # fmt: skip
        return _SWITCH[raw.lower()]
    value: Any = raw
    if _integer(ParallelConfig.model_fields[name].annotation):
        try:
            value = int(raw)
        except ValueError:
            raise InputError(f"{option}: {name.replace('_', '-')}={raw}: not an integer") from None
    try:
        ParallelConfig.model_validate({name: value, **_IMPLIES.get(name, {})})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        raise InputError(f"{option}: {name.replace('_', '-')}={raw}: {reason[0].lower()}"
                         f"{reason[1:]}") from None
    return value


def _integer(annotation: Any) -> bool:
    """Whether a field so annotated takes an integer: ``int``, ``Int``, a ``Literal`` of
    integers, or one of them or None (a string or a stack's name is read as given)."""
    if annotation is int:
        return True
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return all(isinstance(a, int) and not isinstance(a, bool) for a in args)
    if get_origin(annotation) is Annotated:
        return _integer(args[0])
    return any(_integer(a) for a in args if a is not type(None))
