"""A sweep's results: one row per point, the journal the rows are appended to as they finish,
and the Parquet table written from it at the end.

The journal (``RESULTS.parquet.journal.jsonl``) starts with a line naming the sweep's settings
(:meth:`~planner.sweep.file.SweepFile.settings_hash`), then holds one JSON row per point,
flushed as each finishes: a sweep stopped anywhere resumes from it. The Parquet file carries
the same digest in its metadata, so a finished table is resumed from too (a sweep with more
values on an axis solves only the new points).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any

from planner.errors import InputError
from planner.sweep.file import SweepFile, Value
from planner.sweep.points import Point

SETTINGS_KEY = b"planner.sweep.settings"
"""The Parquet metadata key of the sweep's settings digest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """One point's result: its plan's numbers, or why it has none."""

    index: int
    """The point's index in the sweep."""
    values: tuple[Value, ...]
    """Its value on each axis, in the axes' order."""
    summary: str | None
    """The plan in one line (:meth:`~planner.plan.schema.Plan.summary`); None without a plan."""
    devices: int
    """Devices of the point's cluster."""
    step_time_s: float | None
    """Predicted seconds per optimizer step."""
    tokens_per_s: float | None
    """Predicted tokens trained per second."""
    mfu: float | None
    """Predicted model FLOPs utilization (a fraction)."""
    peak_memory_gib: float | None
    """Predicted peak memory of the fullest device."""
    error_band: str | None
    """The prediction's error band as text (``+/- 10 %``, ``uncalibrated``)."""
    time_to_train_s: float | None
    """Seconds to train on the sweep's tokens; None without tokens or a plan."""
    cost: float | None
    """devices x price per device-hour x hours to train; None without a price or a plan."""
    error: str | None
    """Why the point has no plan (the search's message); None with a plan."""


COLUMNS = tuple(f.name for f in fields(SweepRow) if f.name not in ("index", "values"))
"""The result columns after the point's index and its axes."""


def point_key(values: Sequence[Value]) -> str:
    """The key of a point across runs: its axis values, numbers as floats (a column of
    ``[25, 50.5]`` reads back as ``25.0``)."""
    return json.dumps([float(v) if isinstance(v, int | float) and not isinstance(v, bool)
                       else v for v in values])  # fmt: skip


def journal_path(out: Path) -> Path:
    """The journal beside the results: ``RESULTS.parquet.journal.jsonl``."""
    return out.with_name(out.name + ".journal.jsonl")


def rows_done(sweep: SweepFile, out: Path) -> dict[str, SweepRow]:
    """The rows already finished, by :func:`point_key`: those of an earlier table at ``out``
    and of its journal. Either written under other settings is refused."""
    settings = sweep.settings_hash()
    done = _table_rows(sweep, out, settings) if out.exists() else {}
    journal = journal_path(out)
    if journal.exists():
        done |= _journal_rows(sweep, journal, settings)
    return done


def _table_rows(sweep: SweepFile, out: Path, settings: str) -> dict[str, SweepRow]:
    """The rows of an earlier Parquet table of this sweep."""
    import pyarrow.parquet as pq  # pyarrow loads only when a sweep runs

    try:
        table = pq.read_table(out)
    except (OSError, ValueError) as exc:
        raise InputError(f"{out}: exists and is not a sweep's results ({exc}); remove it or "
                         "write elsewhere") from None  # fmt: skip
    written = (table.schema.metadata or {}).get(SETTINGS_KEY, b"").decode()
    if written != settings:
        raise InputError(f"{out}: holds the results of other settings than {sweep.source}'s "
                         "(model, cluster, training, search, tokens, price or axes changed); "
                         "remove it or write elsewhere")  # fmt: skip
    rows = {}
    for record in table.to_pylist():
        values = tuple(record[axis] for axis in sweep.axes)
        row = SweepRow(index=record["point"], values=values,
                       **{c: record[c] for c in COLUMNS})  # fmt: skip
        rows[point_key(values)] = row
    return rows


def _journal_rows(sweep: SweepFile, journal: Path, settings: str) -> dict[str, SweepRow]:
    """The rows of this sweep's journal (a last line cut short by a crash is left out)."""
    lines = journal.read_text().splitlines()
    header = _json_line(lines[0]) if lines else None
    if not isinstance(header, dict) or header.get("settings") != settings:
        raise InputError(f"{journal}: was written under other settings than {sweep.source}'s "
                         "(model, cluster, training, search, tokens, price or axes changed); "
                         "remove it to start over")  # fmt: skip
    rows = {}
    for line in lines[1:]:
        record = _json_line(line)
        if isinstance(record, dict):
            row = SweepRow(**(record | {"values": tuple(record["values"])}))
            rows[point_key(row.values)] = row
    return rows


def _json_line(line: str) -> Any:
    """A journal line, or None if it is not whole JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


class Journal:
    """The journal, open for appending: each row a line, flushed and synced as it is written,
    so that an interrupted sweep loses no finished point."""

    def __init__(self, sweep: SweepFile, out: Path) -> None:
        self.path = journal_path(out)
        fresh = not self.path.exists()
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        if fresh:
            self._write({"settings": sweep.settings_hash(), "sweep": sweep.source,
                         "axes": list(sweep.axes)})  # fmt: skip

    def append(self, row: SweepRow) -> None:
        """Write one finished row."""
        self._write(asdict(row))

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (the journal stays)."""
        self._file.close()


def write_table(sweep: SweepFile, points: Sequence[Point], rows: dict[str, SweepRow],
                out: Path) -> list[SweepRow]:  # fmt: skip
    """Write the Parquet table of every point, in the points' order, from ``rows`` (each
    given its point's index and values as this sweep spells them); then remove the journal,
    which the table now holds. Returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ordered = [_at(rows[point_key(p.values)], p) for p in points]
    columns: dict[str, Any] = {"point": pa.array([r.index for r in ordered], pa.int64())}
    for i, axis in enumerate(sweep.axes):
        columns[axis] = pa.array([r.values[i] for r in ordered])
    for name, kind in _pa_types().items():
        columns[name] = pa.array([getattr(r, name) for r in ordered], kind())
    table = pa.table(columns).replace_schema_metadata({SETTINGS_KEY: sweep.settings_hash()})
    partial = out.with_name(out.name + ".partial")
    pq.write_table(table, partial)
    os.replace(partial, out)
    journal_path(out).unlink(missing_ok=True)
    return ordered


def _at(row: SweepRow, point: Point) -> SweepRow:
    """``row`` with the point's index and values (a resumed row may come from a sweep whose
    axes held other values)."""
    return SweepRow(**(asdict(row) | {"index": point.index, "values": point.values}))


def _pa_types() -> dict[str, Any]:
    """Each result column's Arrow type, by :data:`COLUMNS`' names."""
    import pyarrow as pa

    return {"summary": pa.string, "devices": pa.int64, "step_time_s": pa.float64,
            "tokens_per_s": pa.float64, "mfu": pa.float64, "peak_memory_gib": pa.float64,
            "error_band": pa.string, "time_to_train_s": pa.float64, "cost": pa.float64,
            "error": pa.string}  # fmt: skip
