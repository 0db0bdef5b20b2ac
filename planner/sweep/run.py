"""Running a sweep: each point solved (in this process, or as Ray tasks), its row journaled
as it finishes, the table written once every point has its row.

A point whose search fails (nothing fits, the time limit, a combination the planner refuses)
is a row with its reason: a sweep is never lost to one point.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Generator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from planner.errors import InputError, PlannerError
from planner.options import Progress, ProgressFn
from planner.search.targets import solve
from planner.sweep.file import SweepFile, Value
from planner.sweep.points import PRICE_AXIS, Point
from planner.sweep.results import Journal, SweepRow, point_key, rows_done, write_table

Engine = Literal["local", "ray"]
ENGINES: tuple[Engine, ...] = ("local", "ray")
"""Where the points are solved: this process, or Ray tasks."""

_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding this ``planner`` package: a local Ray's workers import it from here
(the driver may run a checkout that is not the installed package)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """A finished sweep: every point's row, in order, and how many were already done."""

    rows: tuple[SweepRow, ...]
    """One row per point, by index."""
    skipped: int
    """Rows taken from an earlier run's journal or table instead of solved."""
    out: Path
    """The Parquet file written."""

    @property
    def failed(self) -> int:
        """Rows without a plan."""
        return sum(row.error is not None for row in self.rows)

    @property
    def best(self) -> SweepRow | None:
        """The row with the shortest step (the first of equals); None if no point has a plan."""
        solved = [row for row in self.rows if row.step_time_s is not None]
        return min(solved, key=lambda row: row.step_time_s or 0.0) if solved else None


def check_engine(engine: str) -> Engine:
    """``engine`` if it can run here; Ray's engine without Ray installed is refused."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r}: choose from {', '.join(ENGINES)}")
    if engine == "ray" and importlib.util.find_spec("ray") is None:
        raise InputError("--engine ray needs Ray, which is not installed: pip install "
                         "'planner[ray]'")  # fmt: skip
    return engine  # type: ignore[return-value]


def solve_point(point: Point, tokens: float | None) -> SweepRow:
    """One point solved with :func:`planner.search.targets.solve`, as its row; a search that
    fails is the row's ``error``."""
    devices = point.cluster.num_devices
    try:
        plan = solve(point.model, point.cluster, point.options)
    except PlannerError as exc:
        return SweepRow(index=point.index, values=point.values, summary=None, devices=devices,
                        step_time_s=None, tokens_per_s=None, mfu=None, peak_memory_gib=None,
                        error_band=None, time_to_train_s=None, cost=None,
                        error=str(exc))  # fmt: skip
    p = plan.predicted
    row = SweepRow(index=point.index, values=point.values, summary=plan.summary(),
                   devices=devices, step_time_s=p.step_time_s, tokens_per_s=p.tokens_per_s,
                   mfu=p.mfu, peak_memory_gib=p.peak_memory_gib,
                   error_band=p.error_band.text if p.error_band is not None else None,
                   time_to_train_s=tokens / p.tokens_per_s if tokens is not None else None,
                   cost=None, error=None)  # fmt: skip
    return _priced(row, point)


def run_sweep(
    sweep: SweepFile,
    points: Sequence[Point],
    *,
    out: Path,
    engine: Engine = "local",
    address: str | None = None,
    num_cpus: int | None = None,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Solve every point not already in ``out``'s journal or table, journaling each row as it
    finishes, then write the table of all of them to ``out`` (Parquet).

    ``engine`` ``ray`` runs a task per point on the Ray cluster at ``address`` (None: a local
    one of ``num_cpus`` CPUs, default all). ``progress`` is called after each row with the
    points done and the best step so far. An interruption (Ctrl-C, an exception from
    ``progress``) leaves the journal; the same call resumes from it."""
    check_engine(engine)
    done = rows_done(sweep, out)
    todo = [p for p in points if point_key(p.values) not in done]
    skipped = len(points) - len(todo)
    best = min((r.step_time_s for r in done.values() if r.step_time_s is not None),
               default=None)  # fmt: skip
    journal = Journal(sweep, out)
    try:
        if progress is not None:
            progress(Progress(done=skipped, total=len(points), best_step_s=best))
        # Points that differ only in price share one search.
        same = _by_problem(sweep, todo)
        first = [group[0] for group in same.values()]
        solved = _local(first, sweep.tokens) if engine == "local" else _ray(
            first, sweep.tokens, address=address, num_cpus=num_cpus)  # fmt: skip
        count = skipped
        # closing: an interruption shuts Ray down now, not when the traceback is freed.
        with closing(solved) as rows:
            for solved_row in rows:
                for point in same[_problem(sweep, solved_row.values)]:
                    row = _priced(solved_row, point)
                    journal.append(row)
                    done[point_key(row.values)] = row
                    count += 1
                if solved_row.step_time_s is not None:
                    best = min(best or solved_row.step_time_s, solved_row.step_time_s)
                if progress is not None:
                    progress(Progress(done=count, total=len(points), best_step_s=best))
    finally:
        journal.close()
    written = write_table(sweep, points, done, out)
    return SweepResult(rows=tuple(written), skipped=skipped, out=out)


def _problem(sweep: SweepFile, values: Sequence[Value]) -> str:
    """A point's values but its price: the search it needs."""
    return point_key([v for axis, v in zip(sweep.axes, values, strict=True)
                      if axis != PRICE_AXIS])  # fmt: skip


def _by_problem(sweep: SweepFile, points: Sequence[Point]) -> dict[str, list[Point]]:
    """The points grouped by the search they need, in order of their first point."""
    groups: dict[str, list[Point]] = {}
    for point in points:
        groups.setdefault(_problem(sweep, point.values), []).append(point)
    return groups


def _priced(row: SweepRow, point: Point) -> SweepRow:
    """``row``, solved for a point with the same search, as ``point``'s row (its price)."""
    price, train_s = point.price_per_device_hour, row.time_to_train_s
    priced = price is not None and train_s is not None
    cost = row.devices * price * train_s / 3600 if priced else None  # type: ignore[operator]
    return replace(row, index=point.index, values=point.values, cost=cost)


def _local(points: Sequence[Point], tokens: float | None) -> Generator[SweepRow, None, None]:
    """The points solved one after another in this process."""
    for point in points:
        yield solve_point(point, tokens)


def _ray(
    points: Sequence[Point], tokens: float | None, *, address: str | None, num_cpus: int | None
) -> Generator[SweepRow, None, None]:
    """The points solved as Ray tasks, yielded as they finish (the table is ordered by
    index at the end, so the order here does not matter)."""
    import ray

    if not points:
        return
    started = not ray.is_initialized()
    if started:
        _ray_start(ray, address, num_cpus)
    try:
        task: Any = ray.remote(solve_point)
        pending = [task.remote(point, tokens) for point in points]
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            yield ray.get(finished[0])
    finally:
        if started:
            ray.shutdown()


def _ray_start(ray: Any, address: str | None, num_cpus: int | None) -> None:
    """Start a local Ray, or join the cluster at ``address``; one that cannot be joined is
    refused as the user's ``--address``, with what Ray said and what to try."""
    try:
        ray.init(**_ray_init(address, num_cpus))
    except ConnectionError as exc:
        if address is None:
            raise
        raise InputError(_join_failure(address, exc)) from None


def _join_failure(address: str, exc: ConnectionError) -> str:
    """Why the Ray cluster at ``address`` could not be joined, and what to try.

    >>> cause = RuntimeError("... AuthenticationError: RPC error: InvalidAuthToken: ...")
    >>> exc = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    >>> exc.__cause__ = cause
    >>> print(_join_failure("10.0.0.1:6379", exc))  # doctest: +NORMALIZE_WHITESPACE
    --address 10.0.0.1:6379: cannot join the Ray cluster there (Failed to connect to Ray
    cluster at 10.0.0.1:6379): it requires a token; set RAY_AUTH_MODE=token here (the token
    in ~/.ray/auth_token or RAY_AUTH_TOKEN_PATH), or give --address auto on one of its nodes
    """
    # Ray 2.59 and later start a cluster on one machine with token authentication, but a
    # driver given its address sends no token unless RAY_AUTH_MODE=token; only the text of
    # the error's cause says that this is why.
    if "InvalidAuthToken" in str(exc.__cause__):
        hint = ("it requires a token; set RAY_AUTH_MODE=token here (the token in "
                "~/.ray/auth_token or RAY_AUTH_TOKEN_PATH), or give --address auto on one of "
                "its nodes")  # fmt: skip
    else:
        hint = "is a Ray head running there (ray start --head)?"
    return f"--address {address}: cannot join the Ray cluster there ({exc}): {hint}"


def _ray_init(address: str | None, num_cpus: int | None) -> dict[str, Any]:
    """``ray.init``'s arguments: a cluster runs its own installed planner; a local Ray's
    workers import this one. Without ``address`` a new local Ray is started: ``ray.init``
    would otherwise join the cluster ``RAY_ADDRESS`` or the last ``ray start`` on this machine
    names (``/tmp/ray/ray_current_cluster``), and refuse ``num_cpus`` there."""
    # Ray's own notes at INFO (a local instance started) would run through the progress bar.
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is not None:
        return {"address": address, **quiet}
    # "local": without it ray.init joins the cluster RAY_ADDRESS names, or the last one
    # `ray start` left on this machine, instead of starting the local Ray asked for.
    return {"address": "local", "num_cpus": num_cpus, "include_dashboard": False, **quiet,
            "runtime_env": {"env_vars": {"PYTHONPATH": _SOURCE_ROOT}}}  # fmt: skip
