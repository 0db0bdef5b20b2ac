"""The planner's one exception family.

Every error a user can cause is a :class:`PlannerError`; the CLI turns it into one line and
exit code 2. Messages say what was given and what was needed.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every error the planner raises on purpose."""


class InputError(PlannerError):
    """A model, cluster, plan or option that cannot be read or does not make sense."""


class ConfigError(PlannerError):
    """A parallel configuration that does not divide the model, batch or cluster."""


class InfeasibleError(PlannerError):
    """No plan fits in the devices' memory."""


class SolverError(PlannerError):
    """A solver failed in a way the planner cannot recover from."""


class InvalidPlanError(SolverError):
    """A plan that breaks an invariant every valid plan keeps (each layer in one stage, ranks
    disjoint and in the cluster, degrees that multiply out, batch arithmetic, memory within
    capacity). From a search it is a planner bug; from a file, a damaged or hand-edited plan."""


class TimeLimitError(SolverError):
    """The time limit passed before the search found any plan."""
