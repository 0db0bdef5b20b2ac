"""The two searches and the one entry point, :func:`~planner.search.targets.solve`, which
picks the search a framework target needs: the framework search
(:mod:`~planner.search.framework`: every uniform configuration a framework launches, priced
at once) and, for ``any``, the per-operator search (:mod:`~planner.search.per_operator`:
the layer ILPs and the stage DP over the outer candidates of :mod:`~planner.search.candidates`,
with the layer options of :mod:`~planner.search.layers` and the bounds of
:mod:`~planner.search.bounds`) bounded by the framework search's best
(:mod:`~planner.search.superset`)."""
