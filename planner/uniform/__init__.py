"""Uniform (Megatron-style) configurations: pricing one (:mod:`~planner.uniform.estimate`),
writing one as a plan, enumerating the ones a framework launches and what would make one fit."""
