"""The command that sweeps cluster designs and search options: sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app, console, stderr_console
from planner.cli.messages import format_message, wrap
from planner.cli.progress import search_bars
from planner.errors import InputError
from planner.report.output import SWEEP_REPORT, check_folder, check_target
from planner.sweep import (
    MAX_POINTS,
    Engine,
    SweepResult,
    check_engine,
    journal_path,
    read_sweep,
    run_sweep,
    sweep_points,
)
from planner.vocabulary import counted

INTERRUPTED = 130
"""The exit code of a sweep stopped with Ctrl-C (128 + SIGINT, as shells report it)."""


@app.command("sweep", short_help="Solve every point of a sweep; one table of results.")
def sweep_cmd(
    sweep_file: Annotated[Path, typer.Argument(help="The sweep (TOML): model, cluster, "
                                               "settings and [axes].")],
    out: Annotated[Path, typer.Option(help="The results table (Parquet); its journal beside "
                                      "it resumes an interrupted sweep.")],
    engine: Annotated[Engine, typer.Option(help="local: solve in this process; ray: one Ray "
                                           "task per point.")] = "local",
    address: Annotated[str | None, typer.Option(help="The Ray cluster to run on (ray only; "
                                                "default: a local Ray).")] = None,
    max_points: Annotated[int, typer.Option(min=1, help="Refuse a sweep of more points.")] = (
        MAX_POINTS),
    report: Annotated[Path | None, typer.Option(
        help="Write the Pareto front, a step-time heatmap (PNG, SVG) and index.html (hover a "
        "point for its plan) into this folder.")] = None,
    heatmap: Annotated[str | None, typer.Option(
        help="The heatmap's axes as X,Y, named as in the sweep file's axes (with --report; "
        "default: the first two).")] = None,
) -> None:
    """Solve every point of a sweep over clusters and options; one table of results."""
    check_engine(engine)
    if address is not None and engine != "ray":
        raise InputError(f"--address {address}: only with --engine ray")
    if heatmap is not None and report is None:
        raise InputError(f"--heatmap {heatmap}: only with --report")
    check_target(out, inputs=(sweep_file,))
    if out.suffix.lower() not in (".parquet", ".pq"):  # a .csv holding Parquet misleads
        raise InputError(f"--out {out}: the results table is Parquet; name it .parquet")
    if report is not None:
        # before the sweep, not after hours of it
        check_folder(report, option="--report", files=SWEEP_REPORT)
        # matplotlib loads only when pictures are asked (0.8 s off every other command)
        from planner.report.sweep_figures import check_heatmap_axes, write_sweep_report
    sweep = read_sweep(sweep_file)
    heatmap_axes = None if heatmap is None else check_heatmap_axes(
        list(sweep.axes), [axis.strip() for axis in heatmap.split(",")])  # fmt: skip
    points = sweep_points(sweep, max_points=max_points)
    try:
        with search_bars(stderr_console()) as bar:
            result = run_sweep(sweep, points, out=out, engine=engine, address=address,
                               progress=bar("sweep"))  # fmt: skip
    except KeyboardInterrupt:
        message = (f"the points done are kept in {journal_path(out)}; run the same command "
                   "again to resume")  # fmt: skip
        print(format_message("interrupted:", message, width=stderr_console().width),
              file=sys.stderr)  # fmt: skip
        raise typer.Exit(INTERRUPTED) from None
    width = console().width
    print("\n".join(summary_lines(result, width=width)))
    from planner.report.sweep_table import sweep_table_lines

    print("\n".join(sweep_table_lines(result.rows, list(sweep.axes), width=width,
                                      out=str(result.out))))  # fmt: skip
    if report is not None:
        written = write_sweep_report(result.rows, list(sweep.axes), report,
                                     title=sweep_file.stem, heatmap_axes=heatmap_axes)  # fmt: skip
        print("\n".join(wrap(f"wrote {', '.join(str(p) for p in written)}",
                             console().width)))  # fmt: skip


def summary_lines(result: SweepResult, *, width: int) -> list[str]:
    """What the sweep did, wrapped to ``width``; the table of its points, best first,
    follows it."""
    rows = len(result.rows)
    head = (f"wrote {result.out}: {counted(rows, 'point')}, {rows - result.failed} with a plan, "
            f"{result.failed} without, {result.skipped} already done")  # fmt: skip
    return wrap(head, width)
