"""Bounds that let the search skip a candidate before it splits its layers into stages, most
of them before it solves any layer ILP: a lower bound on its step (every layer at least as
fast as a bound on its time, the slowest stage no faster than an equal share, stretched by
the pipeline's fill and drain) and a lower bound on what its busiest stage holds. A candidate
whose bound reaches the incumbent's step, or whose stage cannot fit, cannot hold a faster
plan (:func:`planner.search.per_operator.evaluate`)."""

from __future__ import annotations

from collections.abc import Mapping

from planner import cost
from planner.pipeline.options import LayerOption, held_bytes
from planner.search.candidates import Candidate
from planner.search.layers import SearchContext, kind_least_bytes

BOUND_SLACK = 0.01
"""The share :func:`layers_bound_s` leaves below the options' step for the composer's exact
sync."""


def options_bound_s(
    c: Candidate, kinds: list[str], options: dict[str, list[LayerOption]], *, send_s: float,
    in_flight: float | None = None, memory_bytes: float = float("inf"),
    floor_s: Mapping[str, float] | None = None,
) -> float:  # fmt: skip
    """:func:`layers_bound_s` from ``c``'s layer options: every layer at its fastest option
    whatever its memory, and with ``in_flight`` (the fewest microbatches a stage holds) and
    ``memory_bytes`` (what a stage may use), for each decoder layer kind the fastest option
    whose states and kept activations fit the ``ceil(n / p)`` layers some stage holds (they
    all take one sharding). A kind without options yet (its frontier not walked) takes its
    ``floor_s``, a bound below every option it will have
    (:func:`planner.search.layers.kind_least_s`), and no bound on what fits."""
    fastest = {**(floor_s or {}),
               **{kind: min(o.latency_s for o in kept) for kind, kept in options.items()}}
    fitting: dict[str, float] = {}
    for kind in dict.fromkeys(k for k in kinds if k in options) if in_flight is not None else ():
        most = -(-kinds.count(kind) // c.num_stages)
        fitting[kind] = min((o.latency_s for o in options[kind]
                             if held_bytes(most, o.state_bytes, o.kept_bytes, in_flight)
                             + o.working_bytes <= memory_bytes), default=float("inf"))  # fmt: skip
    return layers_bound_s(c, kinds, fastest, send_s=send_s, fitting_s=fitting)


def least_state_bytes(ctx: SearchContext, c: Candidate) -> float:
    """The least weight-state bytes a device of ``c``'s busiest stage holds, whatever the
    sharding: some stage holds at least an equal share of the parameters, each of them on
    some device of its mesh with its gradient (a pipeline allows ZeRO 1 at most), and the
    optimizer states at best sharded over every device that holds a copy. 0 when the
    parameters were not counted."""
    size = c.mesh[0] * c.mesh[1]
    share = ctx.parameters / c.num_stages
    precision = cost.states_precision(ctx.training.precision, ctx.training.stack)
    if c.num_stages == 1:
        return share * cost.state_bytes_per_param(precision, zero=3,
                                                  shards=size * c.replicas).total  # fmt: skip
    per_param = cost.state_bytes_per_param(precision, zero=1, shards=c.replicas)
    return share * per_param.total / size


def may_fit(
    ctx: SearchContext, c: Candidate, kinds: list[str], in_flight: int, stage_bytes: float
) -> bool:
    """Whether ``c``'s busiest stage may fit in ``stage_bytes`` by the lower bounds alone:
    the weight states (:func:`least_state_bytes`), and for each decoder layer kind with ``n``
    layers the ``ceil(n / p)`` of them some stage holds, at the least memory any sharding of
    them needs with the fewest microbatches any stage holds in flight
    (:func:`planner.search.layers.kind_least_bytes`)."""
    if least_state_bytes(ctx, c) > stage_bytes:
        return False
    for kind in dict.fromkeys(kinds):
        most = -(-kinds.count(kind) // c.num_stages)
        if kind_least_bytes(ctx, kind, c, layers=most, in_flight=in_flight) > stage_bytes:
            return False
    return True


def layers_bound_s(
    c: Candidate, kinds: list[str], least_s: Mapping[str, float], *, send_s: float,
    fitting_s: Mapping[str, float] | None = None,
) -> float:  # fmt: skip
    """A lower bound on the step of ``c``'s plans from a bound on each layer kind's time
    (``least_s``: :func:`planner.search.layers.kind_least_s` before any layer is solved, the
    fastest options after), the stages' sends, and the slowest stage no faster than an equal
    share (:func:`planner.cost.fill_and_drain` grows with the slowest stage and with their
    sum). With ``fitting_s``, a bound on a decoder layer kind's time when the ``ceil(n / p)``
    of its ``n`` layers that some stage holds fit in it: that stage is no faster than that
    many such layers (infinite: none fits, nor does any plan of ``c``).

    Less :data:`BOUND_SLACK`: the options amortise the once-per-step sync over the
    microbatches where the composer prices it exactly (its step came up to 0.1 % below the
    options' on Llama 3 8B at 8K tokens on 16 H100)."""
    total_s = _layers_s(c, kinds, least_s, send_s=send_s)
    slowest_s = total_s / c.num_stages
    for kind, least in (fitting_s or {}).items():
        if least == float("inf"):
            return least
        slowest_s = max(slowest_s, -(-kinds.count(kind) // c.num_stages) * least + send_s)
        total_s = max(total_s, slowest_s)
    step_s, _ = cost.fill_and_drain(sum_s=total_s, max_s=slowest_s,
                                    num_microbatches=c.num_microbatches, vpp=c.vpp)  # fmt: skip
    return float(step_s) * (1 - BOUND_SLACK)


def _layers_s(
    c: Candidate, kinds: list[str], per_layer_s: Mapping[str, float], *, send_s: float
) -> float:
    """Every layer's time, the embedding's and the head's, and each stage's sends."""
    return (sum(per_layer_s[kind] for kind in kinds) + per_layer_s["embedding"]
            + per_layer_s["head"] + c.num_stages * send_s)  # fmt: skip
