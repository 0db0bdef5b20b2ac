"""Configurations as columns: a numpy array per :class:`~planner.plan.config.ParallelConfig`
field, and the numbering of their distinct values that
:func:`~planner.uniform.batch.estimate_batch` prices each part of the cost model once per.

>>> first, number = factorize(np.array([8, 8, 4, 8]), np.array([1, 2, 1, 1]))
>>> first.tolist(), number.tolist()
([2, 0, 1], [1, 2, 0, 1])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from planner.errors import InputError
from planner.plan.config import ParallelConfig

DEFAULTS = {name: f.default for name, f in ParallelConfig.model_fields.items()}
"""Every configuration field and its default."""
OPTIONAL = ("dp", "etp", "first_stage_layers", "last_stage_layers", "global_batch", "seq_len",
            "recompute_layers")  # fmt: skip
"""Integer fields whose None (the default) a column writes as 0."""
def python_value(value: Any) -> Any:
    """A numpy scalar as the Python value it holds."""
    return value.item() if isinstance(value, np.generic) else value


def config_from_row(row: Mapping[str, Any]) -> ParallelConfig:
    """One row of configuration columns (0 for None) as a :class:`ParallelConfig`."""
    values = {k: python_value(v) for k, v in row.items()}
    return ParallelConfig(**{k: (None if k in OPTIONAL and v == 0 else v)
                             for k, v in values.items()})  # fmt: skip


def config_columns(configs: Sequence[ParallelConfig]) -> dict[str, np.ndarray]:
    """The columns of ``configs``, a numpy array per :class:`ParallelConfig` field (0 for a
    field left to its default of None)."""
    rows = [c.model_dump() for c in configs]
    return {name: np.array([(0 if r[name] is None and name in OPTIONAL else r[name])
                            for r in rows]) for name in DEFAULTS}  # fmt: skip


def normalized(
    configs: Mapping[str, Any] | Sequence[ParallelConfig],
) -> dict[str, np.ndarray]:
    """Every field as a column: given columns broadcast to one length, the rest defaults."""
    if not isinstance(configs, Mapping):
        return config_columns(list(configs))
    unknown = sorted(set(configs) - set(DEFAULTS))
    if unknown:
        raise InputError(f"estimate_batch: no configuration field {unknown[0]!r}; fields: "
                         f"{', '.join(DEFAULTS)}")  # fmt: skip
    given = {k: np.asarray(v) for k, v in configs.items()}
    length = max((v.size for v in given.values()), default=0)
    columns = {}
    for name, default in DEFAULTS.items():
        if name in given:
            column = given[name].ravel()
            if name in OPTIONAL and column.dtype == object:
                # None, the field's default, is the column's 0 (given, it priced nothing)
                column = np.array([0 if v is None else v for v in column.tolist()])
            if column.size not in (1, length):
                raise InputError(f"estimate_batch: column {name!r} has {column.size} values, "
                                 f"the longest {length}: give one value or {length}")  # fmt: skip
            columns[name] = np.broadcast_to(column, (length,))
            _check_values(name, columns[name])
        else:  # one value for every row, as a view
            value = 0 if default is None and name in OPTIONAL else default
            columns[name] = np.broadcast_to(np.array(value, dtype=object if value is None
                                                     else None), (length,))  # fmt: skip
    _check_partial_recompute(columns)
    return columns


def _check_partial_recompute(columns: dict[str, np.ndarray]) -> None:
    """Refuse a count of recomputed layers beside a mode other than full, and recompute
    modules beside a mode other than selective, as :class:`ParallelConfig` does."""
    for name, mode, given in (
        ("recompute_layers", "full", columns["recompute_layers"].astype(np.int64) > 0),
        ("recompute_modules", "selective", columns["recompute_modules"] != None),  # noqa: E711
    ):  # fmt: skip
        wrong = given & (columns["recompute"] != mode)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise InputError(f"estimate_batch: row {i}: {name}({columns[name][i]}) needs "
                             f"recompute {mode!r}, not "
                             f"{python_value(columns['recompute'][i])!r}")  # fmt: skip


_BESIDE = {"recompute_layers": {"recompute": "full"},
           "recompute_modules": {"recompute": "selective"}}
"""What a field's value is checked beside when alone (the pair is checked on its own)."""


def _check_values(name: str, column: np.ndarray) -> None:
    """Refuse a column with a value :class:`ParallelConfig` refuses (its bounds, its names),
    as ``estimate`` would: numbers by their least and greatest, other values each."""
    if not len(column):
        return
    if column.dtype.kind in "iub":
        values = {python_value(column.min()), python_value(column.max())}
    elif column.dtype.kind == "f":
        raise InputError(f"estimate_batch: column {name!r} holds floats; it takes "
                         f"{type(DEFAULTS[name]).__name__ if DEFAULTS[name] is not None else 'int'}"
                         f" values")  # fmt: skip
    else:
        values = set(codes(column)[0])
    for value in values:
        if name in OPTIONAL and value == 0:
            continue  # the column's word for None
        try:
            ParallelConfig.model_validate({name: value, **_BESIDE.get(name, {})})
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise InputError(f"estimate_batch: column {name!r}: {value!r}: {reason}") from None


def factorize(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct key, each row's key number) of the rows' tuples of
    non-negative integers, numbered in the order of the tuples."""
    n = len(keys[0])
    code = np.zeros(n, dtype=np.int64)
    distinct = 1
    for k in keys:
        k = np.asarray(k, dtype=np.int64)
        top = int(k.max()) + 1 if n else 1
        code, distinct = _compact(code * top + k, distinct * top)
    first = np.empty(distinct, dtype=np.int64)
    first[code[::-1]] = np.arange(n - 1, -1, -1)
    return first, code


def _compact(code: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """``code`` renumbered 0, 1, ... in order of value, and how many distinct values: by a
    table when the values span little (the usual case: a few knobs' few values), else by a
    sort."""
    if span <= max(4 * len(code), 1 << 16):
        seen = np.zeros(span, dtype=bool)
        seen[code] = True
        number = np.cumsum(seen) - 1
        return number[code], int(seen.sum())
    values, inverse = np.unique(code, return_inverse=True)
    return inverse.ravel(), len(values)


def optional_int(value: Any) -> int | None:
    """A column's 0 (or None) as None, else the int."""
    value = python_value(value)
    return None if value is None or value == 0 else int(value)


def codes(column: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """(distinct values, each row's value number) of a column of any values (a knob's few
    values: one comparison over the column per value)."""
    codes = np.full(len(column), -1, dtype=np.int64)
    values: list[Any] = []
    left = np.flatnonzero(codes < 0)
    while len(left):
        value = column[left[0]]
        codes[column == value] = len(values)
        values.append(python_value(value))
        left = np.flatnonzero(codes < 0)
    return values, codes
