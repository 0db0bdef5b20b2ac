"""Event-driven simulation of a plan's pipeline schedule (:mod:`~planner.simulate.events`)."""
