"""The inter-operator pass: the options each layer kind offers a stage
(:mod:`~planner.pipeline.options`), the submeshes a stage may run on
(:mod:`~planner.pipeline.submeshes`), layers into stages (Alpa's dynamic program,
:mod:`~planner.pipeline.split`), the schedules' op orders (:mod:`~planner.pipeline.schedules`)
and the found pipeline priced and written as plan stages (:mod:`~planner.pipeline.assemble`)."""
