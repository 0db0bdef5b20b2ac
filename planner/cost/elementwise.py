"""Elementwise maximum, minimum and choice that keep Python floats as Python floats and act
per element on numpy arrays.

The step's formulas are written once with these, so the same lines price one configuration
(:func:`planner.estimate`, floats in, floats out) and a million at once
(:func:`planner.uniform.batch.estimate_batch`, arrays over the configurations).

>>> maximum(1.0, 2.0), minimum(1.0, 2.0), where(True, 1.0, 0.0)
(2.0, 1.0, 1.0)
>>> maximum(np.array([1.0, 3.0]), 2.0)
array([2., 3.])
>>> first_argmax([np.array([1.0, 5.0]), np.array([2.0, 5.0])]), first_argmax([1.0, 2.0, 2.0])
(array([1, 0]), 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

Real: TypeAlias = Any
"""A float, or a numpy array of them over configurations (annotated ``Any``: numpy's array
type does not mix with ``float`` in arithmetic for the type checker)."""


def _arrays(*values: object) -> bool:
    # A loop, not any() over a generator: the scalar pricer calls this tens of thousands of
    # times a configuration batch, and the generator's setup was a tenth of its time.
    for v in values:  # noqa: SIM110 (see above)
        if isinstance(v, np.ndarray):
            return True
    return False


def maximum(a: Real, b: Real) -> Real:
    """The larger of ``a`` and ``b``, per element for arrays."""
    return np.maximum(a, b) if _arrays(a, b) else max(a, b)


def minimum(a: Real, b: Real) -> Real:
    """The smaller of ``a`` and ``b``, per element for arrays."""
    return np.minimum(a, b) if _arrays(a, b) else min(a, b)


def where(condition: Real, a: Real, b: Real) -> Real:
    """``a`` where ``condition`` holds, else ``b``, per element for arrays."""
    if _arrays(condition, a, b):
        return np.where(condition, a, b)
    return a if condition else b


def first_argmax(values: Sequence[Real]) -> Real:
    """Index of the largest of ``values``, the first on ties (Python's ``max``), per element
    for arrays."""
    if _arrays(*values):
        return np.argmax(np.broadcast_arrays(*values), axis=0)
    return max(range(len(values)), key=lambda i: values[i])


def pick(values: Sequence[Real], index: Real) -> Real:
    """``values[index]``, per element for an array of indices."""
    if isinstance(index, np.ndarray):
        stacked = np.broadcast_arrays(*values, index)[:-1]
        return np.take_along_axis(np.stack(stacked), index[None], axis=0)[0]
    return values[index]
