"""Where a simulated step's communication runs, as the Gantt chart's lanes draw it: per stage,
tensor, context and expert parallel collectives, data-parallel (ZeRO) gathers and
reduce-scatters and pipeline sends, each exposed (on the critical path) or hidden (behind
compute), in seconds the cost model priced.

The cost model prices a stage's collectives per microbatch, not per phase, and shares them
among the forward, backward and recomputation in proportion to compute (the simulator's phase
times include them, :func:`planner.cost.step.compose_step`). The lanes share them the same
way: an operation of ``d`` seconds on a stage whose microbatch takes ``P`` seconds of phases
carries ``d / P`` of each exposed kind, drawn at its end, and ``d / P`` of each hidden one
(tensor parallel under ``tp_comm_overlap``, ring attention's K/V exchange), drawn from its
start, over the compute that hides it. The hidden per-microbatch data-parallel traffic is
shared the same way among the phases that hide it (the backward, and the forward with
``overlap_param_gather``). The once-per-step
gradient reduction hidden behind the last backward is drawn ending with it; the weight gather
hidden behind the next step's first forward, starting with this step's first forward (the
steady state). A send is pipeline traffic; a sync, exposed data-parallel traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from planner.plan.schema import Plan, StageTime
from planner.simulate.events import Simulation

CommKind = Literal["TP", "CP", "EP", "DP", "PP", "other"]
COMM_KINDS: tuple[CommKind, ...] = ("TP", "CP", "EP", "DP", "PP", "other")
"""The lanes' kinds, in their order under a stage."""
COMM_NAMES: dict[CommKind, str] = {
    "TP": "tensor parallel",
    "CP": "context parallel (ring)",
    "EP": "expert all-to-all",
    "DP": "data parallel / ZeRO",
    "PP": "pipeline sends",
    "other": "collectives (not recorded by kind)",
}
_IN_PHASES: tuple[CommKind, ...] = ("TP", "CP", "EP", "DP", "other")
"""The kinds shared among the compute phases (sends and syncs are operations of their own)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageComm:
    """One stage's communication as the cost model priced it."""

    exposed_s: dict[CommKind, float]
    """Per microbatch, within the forward, backward and recomputation: each kind's seconds
    on the critical path (``other``: what a plan written before the parts were recorded does
    not attribute)."""
    hidden_in_phases_s: dict[CommKind, float] = field(default_factory=dict)
    """Per microbatch, shared among the compute phases as the exposed parts are: the tensor,
    context and expert parallel traffic hidden behind compute."""
    hidden_s: float = 0.0
    """Per microbatch: the data-parallel traffic the compute hides."""
    reduce_hidden_s: float = 0.0
    """Once per step: the gradient reduction hidden behind the last backward."""
    gather_hidden_s: float = 0.0
    """Once per step: the weight gather hidden behind the next forward."""
    phases_s: float = 0.0
    """Per microbatch: forward, backward and recomputation, communication included."""
    hiding_s: float = 0.0
    """Per microbatch: the phases ``hidden_s`` hides behind, communication included: the
    backward, and the forward too with ``overlap_param_gather``
    (:func:`planner.cost.exposed_sync`'s window)."""
    hides_in_forward: bool = False
    """Whether the forward hides data-parallel traffic (``overlap_param_gather``)."""

    @classmethod
    def of(cls, t: StageTime, *, overlap_param_gather: bool = False) -> StageComm:
        """A plan stage's per-microbatch parts, under the plan's overlap flag for gathers."""
        exposed: dict[CommKind, float] = {
            "TP": t.tensor_parallel_comm_s, "CP": t.context_parallel_comm_s,
            "EP": t.expert_parallel_comm_s, "DP": t.data_parallel_comm_s,
            "other": max(0.0, t.communication_s - t.attributed_comm_s),
        }  # fmt: skip
        hidden: dict[CommKind, float] = {
            "TP": t.tensor_parallel_hidden_s, "CP": t.context_parallel_hidden_s,
            "EP": t.expert_parallel_hidden_s,
        }  # fmt: skip
        return cls(exposed_s=exposed, hidden_in_phases_s=hidden, hidden_s=t.data_parallel_hidden_s,
                   reduce_hidden_s=t.grad_reduce_hidden_s,
                   gather_hidden_s=t.param_gather_hidden_s,
                   phases_s=t.forward_s + t.backward_s + t.recompute_s,
                   hiding_s=t.backward_s + (t.forward_s if overlap_param_gather else 0.0),
                   hides_in_forward=overlap_param_gather)  # fmt: skip


def stage_comm(plan: Plan) -> list[StageComm]:
    """Each stage's communication, from the plan's stage times and overlap flags."""
    gather = plan.flags.overlap_param_gather
    return [StageComm.of(s.time, overlap_param_gather=gather) for s in plan.stages]


class Segment(NamedTuple):
    """A stretch of one kind of communication on one stage."""

    stage: int
    kind: CommKind
    hidden: bool
    start_s: float
    end_s: float


# An operation's phases that carry a share of the stage's collectives.
_COMPUTE = frozenset({"forward", "backward", "weight", "recompute"})


def comm_segments(sim: Simulation, comm: Sequence[StageComm]) -> list[Segment]:
    """Every stretch of communication in ``sim``, as the module's docstring lays them out."""
    out: list[Segment] = []
    first_forward: dict[int, float] = {}
    last_backward: dict[int, float] = {}
    for e in sim.events:
        c = comm[e.stage]
        if e.phase in _COMPUTE and c.phases_s > 0:
            share = (e.end_s - e.start_s) / c.phases_s
            t = e.end_s
            for kind in reversed(_IN_PHASES):
                seconds = c.exposed_s.get(kind, 0.0) * share
                if seconds > 0:
                    out.append(Segment(e.stage, kind, False, t - seconds, t))
                    t -= seconds
            for kind, seconds in c.hidden_in_phases_s.items():
                if seconds > 0:
                    out.append(Segment(e.stage, kind, True, e.start_s,
                                       e.start_s + seconds * share))  # fmt: skip
            hides = e.phase in ("backward", "weight") or (e.phase == "forward"
                                                          and c.hides_in_forward)  # fmt: skip
            if c.hidden_s > 0 and hides and c.hiding_s > 0:
                seconds = c.hidden_s * (e.end_s - e.start_s) / c.hiding_s
                out.append(Segment(e.stage, "DP", True, e.start_s, e.start_s + seconds))
            if e.phase == "forward":
                first_forward.setdefault(e.stage, e.start_s)
            elif e.phase in ("backward", "weight"):
                last_backward[e.stage] = max(e.end_s, last_backward.get(e.stage, 0.0))
        elif e.phase == "send":
            out.append(Segment(e.stage, "PP", False, e.start_s, e.end_s))
        elif e.phase == "sync":
            out.append(Segment(e.stage, "DP", False, e.start_s, e.end_s))
    for stage, c in enumerate(comm):
        if c.reduce_hidden_s > 0 and stage in last_backward:
            end = last_backward[stage]
            out.append(Segment(stage, "DP", True, end - c.reduce_hidden_s, end))
        if c.gather_hidden_s > 0 and stage in first_forward:
            start = first_forward[stage]
            out.append(Segment(stage, "DP", True, start, start + c.gather_hidden_s))
    return out


def lane_kinds(segments: Sequence[Segment]) -> list[CommKind]:
    """The kinds that occur, in lane order."""
    present = {s.kind for s in segments if s.end_s > s.start_s}
    return [k for k in COMM_KINDS if k in present]
