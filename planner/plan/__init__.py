"""The plan: the value every search returns and every consumer reads.

:mod:`~planner.plan.schema` is the immutable value and its JSON, :mod:`~planner.plan.config`
the uniform configuration a framework launches (the knobs a plan may carry),
:mod:`~planner.plan.invariants` what every valid plan keeps, and :mod:`~planner.plan.files`
reads a plan file back through all of them.
"""
