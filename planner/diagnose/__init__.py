"""Diagnostics over plans and runs: methods compared, published runs priced and calibrated,
and what the planner understood of a model."""
