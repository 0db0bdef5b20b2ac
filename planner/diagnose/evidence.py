"""The validated runs a cluster file keeps, what its error bands rest on
(:class:`~planner.spec.ValidatedRun`, :mod:`planner.cost.uncertainty`): built from the rows of
``planner validate`` or ``planner calibrate`` and written into the file's
``device.efficiency.evidence``, a run a line."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from planner.diagnose.validation_rows import ValidationRow
from planner.errors import InputError
from planner.spec import ValidatedRun
from planner.spec.reading import read_json


def validated_runs(rows: Sequence[ValidationRow]) -> tuple[ValidatedRun, ...]:
    """The runs of ``rows`` with a measured step time, each with its regime, error, MFU and
    hardware FLOPs utilisation (a run that ran out of memory has no step time to have
    missed)."""
    return tuple(
        ValidatedRun(**row.regime.model_dump() | {
                         "gflop_per_token": round(row.regime.gflop_per_token, 4),
                         "network_gb_s": round(row.regime.network_gb_s, 2)},
                     id=row.id, family=row.family,
                     error=round(row.error, 4), mfu=round(row.mfu, 4),
                     hfu=round(row.hfu, 4),
                     communication_share=row.communication_share,
                     memory_error=_memory_error(row))
        for row in rows if row.error is not None
    )  # fmt: skip


def _memory_error(row: ValidationRow) -> float | None:
    """The run's peak memory error: allocated where it measured that, else against
    nvidia-smi's memory in use."""
    error = row.memory_error if row.memory_error is not None else row.device_memory_error
    return None if error is None else round(error, 4)


def write_evidence(
    path: Path, runs: Sequence[ValidatedRun],
    edit: Callable[[dict[str, Any]], None] = lambda efficiency: None,
) -> None:  # fmt: skip
    """Write ``runs`` as the evidence of the cluster file at ``path``, after ``edit`` changed
    its ``device.efficiency`` (a fit's knobs), keeping the rest of the file as it is; bands by
    kind an older calibration wrote are dropped, the runs replace them."""
    data = read_json(path)
    eff = data["device"].setdefault("efficiency", {})
    edit(eff)
    eff.pop("validation", None)
    eff["evidence"] = [run.model_dump(mode="json", exclude_defaults=True) for run in runs]
    try:
        path.write_text(cluster_json(data))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def cluster_json(data: dict[str, Any]) -> str:
    """A cluster file's text as every command that writes one lays it out: indented, each
    validated run on one line, so that a hundred runs stay a hundred lines a reader can scan
    and a write that changes one value is a one-line diff."""
    eff = data.get("device", {}).get("efficiency") or {}
    if "evidence" not in eff:
        return json.dumps(data, indent=2) + "\n"
    runs = eff.pop("evidence")
    eff["evidence"] = ["\0"] * len(runs)
    text = json.dumps(data, indent=2)
    for run in runs:
        text = text.replace('"\\u0000"', json.dumps(run), 1)
    eff["evidence"] = runs
    return text + "\n"
