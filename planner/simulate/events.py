"""An event-driven simulator of one training step's pipeline schedule.

Each stage runs its own list of operations strictly in the schedule's order (GPipe, 1F1B as
in PipeDream-Flush and Megatron-LM, Megatron-LM's interleaved 1F1B, or the zero-bubble ZB-H1
and ZB-V, whose weight-gradient passes run as operations of their own); an operation starts
when its stage is free and the tensor it needs has arrived. The result is a timeline that
checks the closed forms of :mod:`planner.cost` (step time, bubble, microbatches in flight) and
shows where they are approximate: unequal stages, point-to-point sends, the data-parallel
gradient sync at the end of the step.

Vocabulary: a *virtual stage* is one model chunk on one stage; with ``p`` stages and ``v``
chunks per stage, chunk ``c`` of stage ``i`` is virtual stage ``c p + i``, and activations
flow through virtual stages ``0 .. p v - 1`` in order (Narayanan et al., SC'21, Sec. 2.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain, repeat
from typing import Literal, NamedTuple

import numpy as np

from planner.cost import bubble_share, held_in_flight, in_flight_microbatches
from planner.errors import ConfigError, InputError
from planner.pipeline.schedules import StageOps, stage_ops
from planner.plan.schema import Plan
from planner.vocabulary import ZERO_BUBBLE, ScheduleName, configured_schedule

Phase = Literal["forward", "backward", "weight", "recompute", "send", "sync", "optimizer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageDurations:
    """Seconds one stage spends on ONE microbatch through all of its model chunks."""

    forward_s: float
    """Forward compute, with its share of the stage's collectives."""
    backward_s: float
    """Backward compute, with its share of the stage's collectives."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradients: a pass of their own (W) under a zero-bubble
    schedule, the rest (B) being the input gradient the previous stage waits for."""
    recompute_s: float = 0.0
    """Forward work rerun just before the backward (0: no recomputation)."""
    send_s: float = 0.0
    """Point-to-point traffic over all chunks and both directions: one activation (or
    gradient) of one chunk, one way, takes ``send_s / (2 v)``."""
    sync_s: float = 0.0
    """Once per step, after the stage's last backward: exposed data-parallel gradient sync."""


class Event(NamedTuple):
    """One operation on one stage; ``microbatch`` and ``chunk`` are None for sync and
    optimizer. (A named tuple, not a dataclass: a long pipeline has a million of them.)"""

    stage: int
    phase: Phase
    microbatch: int | None
    chunk: int | None
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        """How long the operation runs."""
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulation:
    """The simulated timeline of one step and what it adds up to."""

    events: tuple[Event, ...]
    """Every operation, stage by stage, each stage's in execution order."""
    step_s: float
    """Makespan: forward-backward, gradient sync and the optimizer step."""
    pipeline_s: float
    """End of the last forward, backward or send on any stage (the forward-backward part)."""
    busy_s: tuple[float, ...]
    """Per stage: seconds of forward, backward, recompute and send operations."""
    bubble_s: tuple[float, ...]
    """Per stage: idle seconds within ``[0, pipeline_s]``."""
    peak_in_flight: tuple[float, ...]
    """Per stage: the most model chunks whose forward has started and whose backward has not
    finished, over time, divided by ``v`` (microbatches' worth of activations)."""
    num_microbatches: int
    """Microbatches of the step."""
    virtual_stages: int
    """Model chunks per stage (``v``)."""

    @property
    def num_stages(self) -> int:
        """Pipeline stages (rows of the timeline)."""
        return len(self.busy_s)

    @property
    def bubble_fraction(self) -> float:
        """The busiest stage's idle time within the pipeline over the step
        (:func:`planner.cost.bubble_share`, the share a plan predicts): for equal stages
        without sends, sync or optimizer, ``(p - 1) / (v m + p - 1)`` like
        :func:`planner.cost.bubble_fraction`."""
        critical = max(range(self.num_stages), key=lambda i: self.busy_s[i])
        return float(bubble_share(bubble_s=self.bubble_s[critical], step_s=self.step_s))


def _check(stages: Sequence[StageDurations], *, m: int, schedule: ScheduleName, vpp: int) -> None:
    """Preconditions, raised as the planner's errors with the numbers that fail."""
    pp = len(stages)
    if pp < 1:
        raise InputError("simulate: no stages given")
    if m < 1:
        raise ConfigError(f"simulate: num_microbatches({m}) must be at least 1")
    if schedule not in ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"):
        raise ConfigError(f"simulate: unknown schedule {schedule!r}; expected 'gpipe', "
                          "'1f1b', 'interleaved', 'zb-h1' or 'zb-v'")  # fmt: skip
    if schedule == "zb-v":
        if vpp != 2:
            raise ConfigError(f"zb-v schedule: virtual_stages({vpp}) must be 2 (a V of two "
                              "chunks per stage)")  # fmt: skip
    elif schedule == "interleaved":
        if vpp < 2:
            raise ConfigError(f"interleaved schedule: virtual_stages({vpp}) must be at least 2")
        if pp < 2:
            raise ConfigError(f"interleaved schedule: needs pp >= 2 stages, got {pp}")
        if m % pp:
            raise ConfigError(f"interleaved schedule: num_microbatches({m}) must be a "
                              f"multiple of pp({pp}); {m} % {pp} = {m % pp}")  # fmt: skip
    elif vpp != 1:
        raise ConfigError(f"{schedule} schedule: virtual_stages({vpp}) must be 1 "
                          "(use 'interleaved' for v > 1)")  # fmt: skip
    for i, s in enumerate(stages):
        parts = (s.forward_s, s.backward_s, s.weight_s, s.recompute_s, s.send_s, s.sync_s)
        if any(not x >= 0 for x in parts):  # also rejects NaN
            raise InputError(f"simulate: stage {i} has a negative or NaN duration: {s}")
        if s.weight_s > s.backward_s:
            raise InputError(f"simulate: stage {i}'s weight_s({s.weight_s}) is more than its "
                             f"backward_s({s.backward_s}), of which it is a part")  # fmt: skip


# --------------------------------------------------------------------------- engine


@dataclass(frozen=True, slots=True, kw_only=True)
class _Durations:
    """One stage's seconds per operation: a chunk's forward, backward and recomputation, and
    one send of one chunk one way."""

    forward_s: float
    """One chunk's forward."""
    backward_s: float
    """One chunk's backward (its input gradient under a zero-bubble schedule)."""
    weight_s: float
    """One chunk's weight gradient, when it runs as its own pass (else 0)."""
    recompute_s: float
    """One chunk's recomputation before its backward."""
    send_s: float
    """One chunk's activation (or gradient) sent one way."""

    @classmethod
    def of(cls, d: StageDurations, vpp: int, *, split: bool) -> _Durations:
        """Each chunk holds ``1/v`` of the stage's layers; ``split``: the weight gradient is
        a pass of its own."""
        weight = d.weight_s if split else 0.0
        return cls(forward_s=d.forward_s / vpp, backward_s=(d.backward_s - weight) / vpp,
                   weight_s=weight / vpp, recompute_s=d.recompute_s / vpp,
                   send_s=d.send_s / (2 * vpp))  # fmt: skip


def _spans(ops: StageOps, d: _Durations) -> tuple[np.ndarray, np.ndarray]:
    """Per operation of a stage: seconds of compute (a backward's includes the recomputation
    that reruns its forward just before it), and seconds the stage is busy with it (plus the
    blocking send of what it produced)."""
    kind = ops.order.kind
    work = np.choose(kind, [d.forward_s, d.recompute_s + d.backward_s, d.weight_s])
    return work, work + np.where(ops.made >= 0, d.send_s, 0.0)


def _run(ops: Sequence[StageOps], spans: Sequence[np.ndarray]) -> list[list[float]]:
    """When each stage starts each of its operations, given how long each keeps it busy.

    A stage advances until its next operation needs a tensor not yet produced, then parks on
    that tensor; producing it wakes the stage. Each operation is visited once, so the loop is
    O(total operations); it allocates no objects.
    Tensor keys: virtual stage ``vs``'s activation of microbatch ``j`` is ``vs m + j``, its
    input gradient ``n + vs m + j`` (``n = p v m``); ``ready[key]`` is when the tensor reaches
    its consumer (None: not yet).
    """
    pp = len(ops)
    ready: list[float | None] = [None] * sum(len(o.need) for o in ops)
    parked: dict[int, int] = {}  # tensor key -> the stage waiting for it
    columns = [
        (o.need.tolist(), s.tolist(), o.made.tolist()) for o, s in zip(ops, spans, strict=True)
    ]
    starts = [[0.0] * len(o.need) for o in ops]
    pos, free = [0] * pp, [0.0] * pp
    todo = list(range(pp))
    while todo:
        i = todo.pop()
        (needs, span, mades), start, t = columns[i], starts[i], free[i]
        for k in range(pos[i], len(needs)):
            need = needs[k]
            if need >= 0:
                got = ready[need]
                if got is None:
                    parked[need] = i
                    break
                if got > t:
                    t = got
            start[k] = t
            t += span[k]  # the sends block: the tensor is there when the stage is free again
            made = mades[k]
            if made >= 0:
                ready[made] = t
                if made in parked:
                    todo.append(parked.pop(made))
        else:
            k = len(needs)
        pos[i], free[i] = k, t
    stuck = [i for i in range(pp) if pos[i] < len(ops[i].need)]
    if stuck:  # cannot happen for the schedules above; a guard for future ones
        raise RuntimeError(f"pipeline schedule deadlocked on stages {stuck}")
    return starts


# An operation's events in order, by slot: its recomputation, itself, its send.
_SLOT_PHASES: tuple[Phase, ...] = ("recompute", "forward", "backward", "weight", "send")


def _stage_events(
    stage: int, ops: StageOps, start: np.ndarray, d: _Durations
) -> tuple[list[Event], float]:
    """A stage's events from its operations' start times, and its busy seconds: per
    operation, in order, its recomputation (backward only), the forward or backward, and its
    send. Zero-length recomputations and sends are left out. Ends are computed as in
    :func:`_run` (start plus span), so that they agree with it to the last bit."""
    kind = ops.order.kind
    backward = kind == 1
    work, span = _spans(ops, d)
    main = start + np.where(backward, d.recompute_s, 0.0)
    begins = np.stack([start, main, start + work], axis=1).ravel()
    ends = np.stack([main, start + work, start + span], axis=1).ravel()
    phase = np.stack([np.zeros_like(kind), kind + 1, np.full(len(kind), 4)], axis=1).ravel()
    keep = np.stack([backward & (d.recompute_s > 0), np.ones_like(backward),
                     (ops.made >= 0) & (d.send_s > 0)], axis=1).ravel()  # fmt: skip
    columns = (
        repeat(stage, int(keep.sum())),
        np.array(_SLOT_PHASES, dtype=object)[phase[keep]].tolist(),
        np.repeat(ops.order.microbatch, 3)[keep].tolist(),
        np.repeat(ops.order.chunk, 3)[keep].tolist(),
        begins[keep].tolist(),
        ends[keep].tolist(),
    )
    # Event(...) without a Python frame per event: there may be millions.
    events = list(map(partial(tuple.__new__, Event), zip(*columns, strict=True)))
    return events, float(np.sum(span))


# --------------------------------------------------------------------------- public


def simulate(
    stages: Sequence[StageDurations],
    *,
    num_microbatches: int,
    schedule: ScheduleName,
    virtual_stages: int = 1,
    optimizer_s: float = 0.0,
) -> Simulation:
    """Simulate one step of ``num_microbatches`` through ``stages`` under ``schedule``.

    Zero-length operations (sends, recomputation, sync, optimizer of 0 s) are left out of
    the events. After its last backward each stage runs its gradient sync; the optimizer
    step starts on every stage when the last sync ends.

    Examples
    --------
    Four equal stages, eight microbatches: ``m t + (p - 1) t`` with ``t = 3``, the bubble
    ``(p - 1) t`` = 9 s of the 33 s step, and stage ``i`` holding ``p - i`` microbatches:

    >>> sim = simulate([StageDurations(forward_s=1.0, backward_s=2.0)] * 4,
    ...                num_microbatches=8, schedule="1f1b")
    >>> sim.pipeline_s, round(sim.bubble_fraction, 4), sim.peak_in_flight
    (33.0, 0.2727, (4.0, 3.0, 2.0, 1.0))
    """
    m, vpp = num_microbatches, virtual_stages
    _check(stages, m=m, schedule=schedule, vpp=vpp)
    if not optimizer_s >= 0:
        raise InputError(f"simulate: optimizer_s({optimizer_s}) must be non-negative")
    pp = len(stages)
    split = schedule in ZERO_BUBBLE
    durations = [_Durations.of(d, vpp, split=split) for d in stages]
    ops = stage_ops(schedule, pp=pp, vpp=vpp, m=m)
    starts = _run(ops, [_spans(o, d)[1] for o, d in zip(ops, durations, strict=True)])
    built = [_stage_events(i, o, np.array(starts[i]), durations[i]) for i, o in enumerate(ops)]
    events = [stage for stage, _ in built]
    busy = tuple(seconds for _, seconds in built)
    free = [stage[-1].end_s for stage in events]
    pipeline_s = max(free)
    # Each stage syncs its gradients right after its own last backward (and send); the
    # optimizer steps everywhere once every stage's sync is done.
    sync_end = [free[i] + d.sync_s for i, d in enumerate(stages)]
    optimizer_start = max(sync_end)
    for i, d in enumerate(stages):
        if d.sync_s > 0:
            events[i].append(Event(i, "sync", None, None, free[i], sync_end[i]))
        if optimizer_s > 0:
            end = optimizer_start + optimizer_s
            events[i].append(Event(i, "optimizer", None, None, optimizer_start, end))
    in_flight = [np.cumsum(o.order.is_forward.astype(np.int64) - o.order.releases).max()
                 for o in ops]  # fmt: skip
    return Simulation(
        events=tuple(chain.from_iterable(events)),
        step_s=optimizer_start + optimizer_s,
        pipeline_s=pipeline_s,
        busy_s=busy,
        bubble_s=tuple(max(0.0, pipeline_s - x) for x in busy),  # not rounding noise
        # Chunks are held from their forward's start to their backward's end (their weight
        # gradient's under a zero-bubble schedule), and a stage
        # runs them in order: the peak is the running count's maximum along its order.
        peak_in_flight=tuple(float(c) / vpp for c in in_flight),
        num_microbatches=m,
        virtual_stages=vpp,
    )


def stage_durations(plan: Plan) -> list[StageDurations]:
    """The simulator's view of a plan's stages (seconds per microbatch, sync once per step)."""
    return [
        StageDurations(
            forward_s=s.time.forward_s,
            backward_s=s.time.backward_s,
            weight_s=s.time.weight_s,
            recompute_s=s.time.recompute_s,
            send_s=s.time.pipeline_s,
            sync_s=s.time.sync_tail_s,
        )
        for s in plan.stages
    ]


def simulate_plan(plan: Plan) -> Simulation:
    """Simulate one step of ``plan`` with its stages' phase times, its schedule and its
    predicted optimizer step."""
    return simulate(
        stage_durations(plan),
        num_microbatches=plan.num_microbatches,
        schedule=plan.schedule.name,
        virtual_stages=plan.schedule.virtual_stages,
        optimizer_s=plan.predicted.time.optimizer_s,
    )


def closed_form_in_flight(plan: Plan) -> list[float]:
    """Per stage, the microbatches' worth of activations the cost model holds at the peak
    (:func:`planner.cost.in_flight_microbatches`, and with the experts' all-to-alls overlapped
    the chunk more :func:`planner.cost.held_in_flight` counts, which the simulated schedule
    does not run), beside :attr:`Simulation.peak_in_flight`."""
    schedule = configured_schedule(plan.schedule.name)
    vpp, m = plan.schedule.virtual_stages, plan.num_microbatches
    return [float(held_in_flight(in_flight_microbatches(schedule, stage=s.index,
                                                        pp=len(plan.stages), vpp=vpp,
                                                        num_microbatches=m),
                                 vpp=vpp, num_microbatches=m,
                                 overlap_moe_comm=plan.flags.overlap_moe_expert_parallel_comm))
            for s in plan.stages]  # fmt: skip
