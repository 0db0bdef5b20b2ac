"""Placement: which physical ranks hold each stage, replica and mesh axis, and the
communication groups that numbering makes (:mod:`~planner.placement.ranks`)."""
