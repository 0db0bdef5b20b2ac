"""Sweeps over cluster designs and search options: a TOML file of axes (dotted field paths to
lists of values), every point of their Cartesian product solved, one table of results
(Parquet) to decide with.

``read_sweep`` reads the file (:mod:`planner.sweep.file`), ``sweep_points`` builds and checks
every point before any search (:mod:`planner.sweep.points`), ``run_sweep`` solves them here or
on Ray, journaling each row so that an interrupted sweep resumes (:mod:`planner.sweep.run`,
:mod:`planner.sweep.results`)."""

from planner.sweep.file import SweepFile, read_sweep
from planner.sweep.points import MAX_POINTS, Point, check_size, sweep_points
from planner.sweep.results import COLUMNS, SweepRow, journal_path
from planner.sweep.run import ENGINES, Engine, SweepResult, check_engine, run_sweep, solve_point

__all__ = ["COLUMNS", "ENGINES", "MAX_POINTS", "Engine", "Point", "SweepFile", "SweepResult",
           "SweepRow", "check_engine", "check_size", "journal_path", "read_sweep", "run_sweep",
           "solve_point", "sweep_points"]
