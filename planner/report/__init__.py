"""Presentation: rich tables (and, later, figures) built from results. Nothing here prints;
the CLI renders what these functions return."""

from planner.report.tables import (
    calibration_tables,
    estimate_tables,
    info_tables,
    layer_tables,
    plan_tables,
    validation_tables,
)

__all__ = [
    "calibration_tables",
    "estimate_tables",
    "info_tables",
    "layer_tables",
    "plan_tables",
    "validation_tables",
]
