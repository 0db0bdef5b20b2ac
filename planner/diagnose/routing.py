"""How much a mixture of experts' plan rests on its routing: the plan's configuration priced
with the experts' loads spread as dropless routing measured, or balanced where the model says
they spread (:attr:`planner.spec.MoESpec.expert_load_cv`, :mod:`planner.cost.expert_load`).

A plan of a dropless model is priced balanced unless the model states a spread; the only
spread measured for such a model is the one that prices NVIDIA's dropless Qwen3-235B runs
from their force-balanced ones (:data:`MEASURED_SPREAD`), so that is the one set beside it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from planner import cost
from planner.plan.schema import Plan
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import estimate

MEASURED_SPREAD = 1.65
"""The spread of tokens per expert that prices NVIDIA's four dropless long-context
Qwen3-235B runs on 256 H100 (TP4 PP8 VPP4 EP8) from the same runs force-balanced, each within
0.5 % (``benchmarks/moe_modelzoo.py``: the rows imply 1.59-1.68)."""


class RoutingWhatIf(BaseModel):
    """The plan's configuration priced with its experts' loads spread otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spread: float
    """The spread the plan was priced with (the model's ``moe.expert_load_cv``)."""
    expert_parallel: int
    """The plan's expert-parallel ranks."""
    busiest_load: float
    """The busiest rank's routed tokens over its share, at the plan's spread."""
    other_spread: float
    """The spread priced beside it: :data:`MEASURED_SPREAD` for a plan priced balanced, 0
    (balanced) for one priced spread."""
    other_busiest_load: float
    """The busiest rank's load at ``other_spread``."""
    step_time_s: float
    """The plan's configuration's step at ``other_spread``."""
    delta_s: float
    """That step less the plan's configuration's own (priced now)."""


def routing_what_if(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> RoutingWhatIf | None:
    """The plan's configuration priced at the other spread; None where routing cannot slow
    it: a dense model, experts padded to a capacity, one rank holding every expert, or a
    per-operator plan (no configuration to price)."""
    moe, config = model.moe, plan.configuration
    if moe is None or moe.capacity_factor is not None or config is None or config.ep <= 1:
        return None
    other = MEASURED_SPREAD if moe.expert_load_cv == 0 else 0.0
    steps = [estimate(model.model_copy(update={"moe": moe.model_copy(
        update={"expert_load_cv": cv})}), cluster, config).step_time_s
        for cv in (moe.expert_load_cv, other)]  # fmt: skip

    def load(cv: float) -> float:
        return cost.busiest_rank_load(experts=moe.num_experts, expert_parallel=config.ep, cv=cv)

    return RoutingWhatIf(spread=moe.expert_load_cv, expert_parallel=config.ep,
                         busiest_load=load(moe.expert_load_cv), other_spread=other,
                         other_busiest_load=load(other), step_time_s=steps[1],
                         delta_s=steps[1] - steps[0])  # fmt: skip
