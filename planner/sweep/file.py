"""Reading a sweep file: the model and cluster it starts from, the run's and the search's
settings, the tokens and price that turn a step into a time and a cost, and the axes.

A sweep file is TOML::

    model = "../models/llama3-70b.json"      # our model.json or a Hugging Face config.json
    cluster = "../clusters/dgx-h100-80gb.json"
    tokens = 1.5e13                          # optional: time (and cost) to train on them
    price_per_device_hour = 2.0              # optional: the cost column
    profile = "llama3-70b.profile.json"      # optional: planner profile's layers

    [training]                               # optional: as the model's training block
    global_batch_size = 1024

    [search]                                 # optional: SolveOptions' fields
    framework = "megatron"

    [axes]                                   # dotted field paths to lists of values
    "cluster.num_nodes" = [16, 32]
    "cluster.network.1.bandwidth_gb_s" = [25, 50]

Paths to files are relative to the sweep file's folder. A layer profile prices one model's
layers on one device: with one, no axis may change the model or the device.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.plan.files import load_inputs
from planner.sharding.profiled import with_profile
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.messages import short_repr
from planner.spec.reading import read_profile, read_text

PRICE = "price_per_device_hour"
"""The sweep-only field, top level or as the axis ``cluster.price_per_device_hour``: what a
device costs per hour, for the cost column."""

_KEYS = frozenset({"model", "cluster", "tokens", PRICE, "training", "search", "axes",
                   "profile"})
"""The top-level keys a sweep file may have."""

Value = int | float | str | bool
"""One value of an axis (TOML scalars)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepFile:
    """A sweep file as read: everything the points share, and the axes they differ by."""

    source: str
    """The file's path, as messages name it."""
    model: ModelSpec
    """The model every point starts from."""
    cluster: ClusterSpec
    """The cluster every point starts from."""
    training: dict[str, Any]
    """``[training]``: seq_length, global_batch_size, precision (each optional)."""
    search: dict[str, Any]
    """``[search]``: fields of :class:`~planner.options.SolveOptions` (``pins`` a table)."""
    tokens: float | None
    """Tokens to train on (time and cost to train); None: no such columns."""
    price_per_device_hour: float | None
    """Price of a device-hour for the cost column, unless an axis sets it; None: none."""
    axes: dict[str, tuple[Value, ...]]
    """Dotted field path to its values, in the file's order."""

    @property
    def num_points(self) -> int:
        """Points in the sweep: the product of the axes' lengths."""
        return math.prod(len(values) for values in self.axes.values())

    def settings_hash(self) -> str:
        """A digest of everything but the axes' values (the axes' names included): journals
        and results written under other settings are not this sweep's."""
        settings = {
            "model": self.model.model_dump(mode="json"),
            "cluster": self.cluster.model_dump(mode="json"),
            "training": self.training, "search": self.search, "tokens": self.tokens,
            PRICE: self.price_per_device_hour, "axes": list(self.axes),
        }  # fmt: skip
        text = json.dumps(settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def read_sweep(path: Path) -> SweepFile:
    """Read and check a sweep file's shape (the values of its points are checked by
    :func:`planner.sweep.points.sweep_points`); a malformed file raises one
    :class:`~planner.errors.InputError` line."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        # Said as a JSON input's error is: where first, then what.
        where = re.fullmatch(r"(?s)(.*) \(at (line \d+, column \d+)\)", str(exc))
        what = f" at {where[2]}: {where[1]}" if where else f": {exc}"
        raise InputError(f"{path}: invalid TOML{what}") from None
    unknown = sorted(data.keys() - _KEYS)
    if unknown:
        raise InputError(f"{path}: unknown key {unknown[0]!r} (a sweep file has "
                         f"{', '.join(sorted(_KEYS))})")  # fmt: skip
    for key in ("model", "cluster"):
        if not isinstance(data.get(key), str):
            raise InputError(f"{path}: {key} must be the path of a {key} file, got "
                             f"{short_repr(data.get(key))}")  # fmt: skip
    folder = path.parent
    model, cluster = load_inputs(folder / data["model"], folder / data["cluster"], nodes=None,
                                 names=("model", "cluster"))  # fmt: skip
    axes = _axes(_table(data, "axes", path), path)
    if "profile" in data:
        cluster = _profiled(cluster, model, data["profile"], folder, axes, path)
    return SweepFile(
        source=str(path), model=model, cluster=cluster,
        training=_table(data, "training", path), search=_table(data, "search", path),
        tokens=_positive(data, "tokens", path), price_per_device_hour=_positive(data, PRICE, path),
        axes=axes,
    )  # fmt: skip


def _profiled(cluster: ClusterSpec, model: ModelSpec, profile: Any, folder: Path,
              axes: dict[str, tuple[Value, ...]], path: Path) -> ClusterSpec:  # fmt: skip
    """``cluster`` with the layer profile at ``profile`` (:func:`with_profile`); refused when
    an axis changes what it measured, the model or the device."""
    if not isinstance(profile, str):
        raise InputError(f"{path}: profile must be the path of a layer profile, got "
                         f"{short_repr(profile)}")  # fmt: skip
    changed = [a for a in axes if a.startswith(("model.", "cluster.device."))]
    if changed:
        raise InputError(f"{path}: axis {changed[0]} changes the model or the device, which the "
                         f"profile measured one of: sweep it without the profile")  # fmt: skip
    try:
        return with_profile(cluster, model, read_profile(folder / profile))
    except InputError as exc:
        raise InputError(f"{path}: profile {profile}: {exc}") from None


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """A table of the file (empty when absent)."""
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: {key} must be a table ([{key}]), got {short_repr(table)}")
    return table


def _positive(data: dict[str, Any], key: str, path: Path) -> float | None:
    """A positive finite number of the file, or None when absent."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value > 0
    ):
        raise InputError(f"{path}: {key} must be a positive number, got {short_repr(value)}")
    return float(value)


def _axes(table: dict[str, Any], path: Path) -> dict[str, tuple[Value, ...]]:
    """The axes: each a non-empty list of scalars of one kind (numbers, text or booleans), so
    that its column has one type."""
    if not table:
        raise InputError(f'{path}: no [axes]: give at least one, e.g. "cluster.num_nodes" = '
                         "[16, 32]")  # fmt: skip
    axes = {}
    for name, values in _flat(table).items():
        if not isinstance(values, list) or not values:
            raise InputError(f"{path}: axis {name}: must be a non-empty list of values, got "
                             f"{short_repr(values)}")  # fmt: skip
        kinds = {_kind(v) for v in values}
        if None in kinds or len(kinds) > 1:
            raise InputError(f"{path}: axis {name}: values must be numbers, text or booleans, "
                             f"all of one kind, got {short_repr(values)}")  # fmt: skip
        if len(set(map(repr, values))) < len(values):
            raise InputError(f"{path}: axis {name}: a value is repeated in "
                             f"{short_repr(values)}")  # fmt: skip
        axes[name] = tuple(values)
    return axes


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The axes table with nested tables joined into dotted paths: TOML reads an unquoted
    dotted key (``cluster.num_nodes = [16, 32]``) as nested tables, a quoted one as one key."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _kind(value: object) -> str | None:
    """The kind of an axis value: number, text or boolean; None for anything else."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number" if math.isfinite(value) else None
    return "text" if isinstance(value, str) else None
