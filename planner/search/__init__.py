"""The search: the outer candidates (:mod:`~planner.search.space`), the layer options each
candidate offers its pipeline (:mod:`~planner.search.layers`), the per-operator solve loop
(:mod:`~planner.search.loop`) and the entry point that picks the search a framework target
needs (:mod:`~planner.search.targets`)."""
