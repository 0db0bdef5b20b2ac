"""How much a mixture of experts' plan rests on its routing: the plan's configuration priced
with the experts' loads spread as dropless routing was measured to spread them, or balanced
where the model says they spread (:attr:`planner.spec.MoESpec.expert_load_cv`,
:mod:`planner.cost.expert_load`).

A plan of a dropless model is priced balanced unless the model states a spread. Two spreads
were measured, each the one that prices a model's dropless runs from the same runs
force-balanced (:data:`MEASURED_SPREADS`); they are 37 times apart, so the spread is the
router's, not a constant of dropless routing, and both are set beside a balanced plan.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from planner import cost
from planner.plan.schema import Plan
from planner.spec import ClusterSpec, ModelSpec
from planner.uniform.estimate import estimate


class MeasuredSpread(BaseModel):
    """A spread of tokens per expert read off published dropless runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spread: float
    """The spread (``moe.expert_load_cv``) that prices the dropless runs from the balanced."""
    runs: str
    """Whose runs, in a few words."""


MEASURED_SPREADS = (
    MeasuredSpread(spread=0.045, runs="Mixtral 8x22B"),
    MeasuredSpread(spread=1.65, runs="Qwen3-235B, 16K-128K tokens"),
)
"""NVIDIA's Megatron-MoE-ModelZoo runs on H100 measured with and without
``--moe-router-force-load-balancing`` (``benchmarks/moe_modelzoo.py``): Mixtral 8x22B's on
128 (TP2 PP8 VPP7 EP8, 4,096 tokens; its released, trained router), 445 against 465 TFLOP/s
a GPU, 0.045; Qwen3-235B's four long-context runs on 256 (TP4 PP8 VPP4 EP8, 16K-128K tokens),
each within 0.5 % at 1.65 (the rows imply 1.59-1.68)."""


class SpreadPrice(BaseModel):
    """The plan's configuration priced at one spread of its experts' loads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spread: float
    """The spread priced (0: balanced)."""
    runs: str | None
    """Whose dropless runs measured it (:data:`MEASURED_SPREADS`); None for balanced."""
    busiest_load: float
    """The busiest expert-parallel rank's routed tokens over its share at that spread."""
    step_time_s: float
    """The plan's configuration's step at that spread."""
    delta_s: float
    """That step less the plan's configuration's own (priced now)."""


class RoutingWhatIf(BaseModel):
    """The plan's configuration priced with its experts' loads spread otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spread: float
    """The spread the plan was priced with (the model's ``moe.expert_load_cv``)."""
    expert_parallel: int
    """The plan's expert-parallel ranks."""
    busiest_load: float
    """The busiest rank's routed tokens over its share, at the plan's spread."""
    others: tuple[SpreadPrice, ...]
    """The spreads priced beside it: :data:`MEASURED_SPREADS` for a plan priced balanced,
    balanced for one priced spread."""


def routing_what_if(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> RoutingWhatIf | None:
    """The plan's configuration priced at the other spreads; None where routing cannot slow
    it: a dense model, experts padded to a capacity, one rank holding every expert, or a
    per-operator plan (no configuration to price)."""
    moe, config = model.moe, plan.configuration
    if moe is None or moe.capacity_factor is not None or config is None or config.ep <= 1:
        return None

    def step(cv: float) -> float:
        return estimate(model.model_copy(update={"moe": moe.model_copy(
            update={"expert_load_cv": cv})}), cluster, config).step_time_s  # fmt: skip

    def load(cv: float) -> float:
        return cost.busiest_rank_load(experts=moe.num_experts, expert_parallel=config.ep, cv=cv)

    own = step(moe.expert_load_cv)

    def price(cv: float, runs: str | None) -> SpreadPrice:
        at = step(cv)
        return SpreadPrice(spread=cv, runs=runs, busiest_load=load(cv), step_time_s=at,
                           delta_s=at - own)

    others = ([price(m.spread, m.runs) for m in MEASURED_SPREADS] if moe.expert_load_cv == 0
              else [price(0.0, None)])  # fmt: skip
    return RoutingWhatIf(spread=moe.expert_load_cv, expert_parallel=config.ep,
                         busiest_load=load(moe.expert_load_cv), others=tuple(others))
