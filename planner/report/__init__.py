"""Presentation: rich tables and figures built from results. Nothing here prints; the CLI
renders the tables these functions return, and figures are written only where asked."""

from planner.report.simulation import simulation_json, simulation_tables
from planner.report.tables import (
    compare_tables,
    estimate_tables,
    info_tables,
    layer_tables,
    plan_tables,
)
from planner.report.validation import (
    bench_json,
    bench_tables,
    calibration_tables,
    network_fit_tables,
    validation_tables,
)

__all__ = [
    "bench_json",
    "bench_tables",
    "calibration_tables",
    "compare_tables",
    "estimate_tables",
    "info_tables",
    "layer_tables",
    "network_fit_tables",
    "plan_tables",
    "simulation_json",
    "simulation_tables",
    "validation_tables",
]
