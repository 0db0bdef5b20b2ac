"""Bounds that let the search skip a candidate before it splits its layers into stages, most
of them before it solves any layer ILP: a lower bound on its step (every layer at least as
fast as a bound on its time, the slowest stage no faster than an equal share, stretched by
the pipeline's fill and drain) and a lower bound on what its busiest stage holds. A candidate
whose bound reaches the incumbent's step, or whose stage cannot fit, cannot hold a faster
plan (:func:`planner.search.per_operator.evaluate`). :func:`bounded_out` takes them cheapest
first; :func:`walk_options` walks a candidate's frontiers kind by kind under the same bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from planner import cost
from planner.pipeline.options import LayerOption, held_bytes
from planner.search.candidates import Candidate
from planner.search.fitting import fits_under
from planner.search.layers import (
    SearchContext,
    kind_least_bytes,
    kind_least_s,
    kind_options,
    kind_solved,
    walk_size,
)

WORTH_A_SPLIT = 300
"""The fewest strategy and edge variables a decoder layer's program still to be walked must
have for :func:`split_reaches` to be tried on a candidate. Its bounds cost 5-10 ms a
candidate (numpy, no solver), and the candidates of a mesh share one walk: smaller programs
(Llama 3 70B's layer on 1x2 to 1x8 meshes, 109-191) walk their whole frontier in 10-30 ms,
cheaper than the bound over the candidates it would drop; DeepSeek-V3's MoE layer takes
0.04-0.09 s on 1x4 and 1x8 meshes (353) and 0.3-2.5 s on 2x8 (8,578). A cost, not a result:
the bound is exact, so this only decides where it is worth its time."""

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


def split_reaches(
    ctx: SearchContext, c: Candidate, kinds: list[str], least_s: Mapping[str, float], *,
    in_flight: Sequence[float], send_s: float, stage_bytes: float, bound_s: float,
) -> bool:  # fmt: skip
    """Whether every split of ``c``'s layers into its stages puts the step at ``bound_s`` or
    past it, by what each stage can hold: stage ``i`` holds ``in_flight[i]`` microbatches, so
    the more layers of the kind with the most a stage takes, the leaner and slower their
    sharding must be (:func:`planner.search.fitting.fits_under`). Find the least slowest
    stage at which :func:`layers_bound_s`'s step reaches ``bound_s`` (the other layers at
    ``least_s``); count how many of the kind's layers each stage could hold and run faster
    than that; if all the stages together cannot take them all, some stage is that slow in
    every split. Exact: a stage's time is at least its layers' of that kind, each at least
    the bound for that many fitting (other kinds, the embedding and the head only add time
    and memory), and that bound only grows with the layers (a longer run holds more).

    Not taken where every decoder kind's frontier still to be walked is a small program
    (:data:`WORTH_A_SPLIT`): its walk is cheaper, and its options bound the candidate
    exactly (:func:`options_bound_s`). It drops the candidates whose busiest stages need a
    lean, recomputing sharding where every layer's fastest is far from it: on DeepSeek-V3 on
    1,024 H100, the PP16 candidates on 2x8 meshes whose fastest layers bound them at
    33.8-35.5 s against the incumbent's 36.2 s, and whose plans take 48.1-48.3 s."""
    if all(walk_size(ctx, k, c.mesh, c.mesh_micro_batch_size) < WORTH_A_SPLIT
           for k in dict.fromkeys(kinds)):  # fmt: skip
        return False  # the walks cost less than this bound would: the options decide
    return stages_reach(ctx, c, kinds, least_s, in_flight=in_flight, send_s=send_s,
                        stage_bytes=stage_bytes, bound_s=bound_s)  # fmt: skip


def stages_reach(
    ctx: SearchContext, c: Candidate, kinds: list[str], least_s: Mapping[str, float], *,
    in_flight: Sequence[float], send_s: float, stage_bytes: float, bound_s: float,
) -> bool:  # fmt: skip
    """:func:`split_reaches`'s test, wherever it is worth taking or not."""
    kind = max(dict.fromkeys(kinds), key=kinds.count)
    n, p = kinds.count(kind), c.num_stages
    cut_s = _least_slowest_s(c, _layers_s(c, kinds, least_s, send_s=send_s), bound_s)
    even = -(-n // p)
    if fits_under(ctx, kind, c, layers=even, in_flight=[max(in_flight)],
                  memory_bytes=stage_bytes, within_s=(cut_s - send_s) / even).all():
        return False  # an even split may fit every stage at that pace (most candidates)
    # Stage by stage, how many of the kind's layers it could hold at that pace: all the
    # stages still in the running are asked about one more layer at a time.
    running = np.asarray(in_flight, dtype=float)
    held = layers = 0
    while len(running) and layers < n:
        layers += 1
        fits = fits_under(ctx, kind, c, layers=layers, in_flight=running,
                          memory_bytes=stage_bytes, within_s=(cut_s - send_s) / layers)
        held += (layers - 1) * int((~fits).sum())
        running = running[fits]
        if held + layers * len(running) >= n:
            return False
    return True


def _least_slowest_s(c: Candidate, total_s: float, bound_s: float) -> float:
    """The least time of the slowest stage at which :func:`layers_bound_s`'s step, with
    every layer's time adding up to ``total_s``, reaches ``bound_s`` (bisection: the step
    only grows with it)."""

    def step_s(slowest_s: float) -> float:
        slowest_s = max(slowest_s, total_s / c.num_stages)
        step, _ = cost.fill_and_drain(sum_s=max(total_s, slowest_s), max_s=slowest_s,
                                      num_microbatches=c.num_microbatches, vpp=c.vpp)  # fmt: skip
        return float(step) * (1 - BOUND_SLACK)

    low, high = 0.0, bound_s / (1 - BOUND_SLACK) + total_s
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if step_s(mid) >= bound_s else (mid, high)
    return high


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
    if c.num_stages > 1:
        # Every stage holds a layer (planner.pipeline.split): the last one, the head and at
        # least the fastest decoder layer too, which binds where the head is heavy (a
        # multi-token-prediction module is a decoder layer and an output layer more).
        fastest_s = min(least_s[kind] for kind in kinds)
        slowest_s = max(slowest_s, least_s["head"] + fastest_s + send_s)
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


def walk_options(
    ctx: SearchContext, c: Candidate, kinds: list[str], held: tuple[str, ...], *,
    send_s: float, in_flight: float, stage_bytes: float, bound_s: float,
) -> dict[str, list[LayerOption]] | None:  # fmt: skip
    """Each held kind's options along its whole frontier
    (:func:`~planner.search.layers.kind_options`), or None when
    a kind has none or, under an incumbent, when what fits a stage puts the step at
    ``bound_s`` or past it (:func:`options_bound_s`). Under an incumbent the decoder kinds
    are walked most layers first, and the bound is checked after each with the kinds not
    walked yet at their floor (:func:`~planner.search.layers.kind_least_s`, below any option
    they will have): the
    bound only grows as kinds are walked, so a candidate it stops early is one the whole
    walk would have stopped, and the other kinds' ILPs are not solved (DeepSeek-V3's dense
    layers, once its MoE layers no longer fit at the incumbent's pace). Without an incumbent,
    a candidate that cannot fit goes on to the stage table, which notes the least memory it
    needs (what the error says when nothing fits)."""
    bounded = bound_s < float("inf")
    floors = ({kind: kind_least_s(ctx, kind, c.mesh, c.mesh_micro_batch_size) for kind in held}
              if bounded else {})  # fmt: skip
    decoders = sorted(dict.fromkeys(kinds), key=kinds.count, reverse=True)
    options: dict[str, list[LayerOption]] = {}
    for kind in (*(k for k in held if k not in decoders), *decoders):
        options[kind] = kind_options(ctx, kind, c)
        if not options[kind]:
            return None
        if bounded and kind in decoders and options_bound_s(
            c, kinds, options, send_s=send_s, in_flight=in_flight, memory_bytes=stage_bytes,
            floor_s=floors,
        ) >= bound_s:  # fmt: skip
            return None
    return options


def bounded_out(
    ctx: SearchContext, c: Candidate, kinds: list[str], held: tuple[str, ...], *,
    send_s: float, in_flight: Sequence[float], stage_bytes: float, bound_s: float,
) -> bool:  # fmt: skip
    """Whether ``c`` cannot beat ``bound_s``, by bounds cheaper than its stage table: its
    states alone not fitting (the message that nothing fits needs no note of it: there is a
    plan), a bound on each layer's time (an LP, no ILP: most candidates stop here), then each
    layer's fastest sharding (one ILP, where most of the others stop) and what each stage can
    hold at what pace (:func:`split_reaches`, no solver), the latter first unless an earlier
    candidate on the mesh solved the former."""
    if not may_fit(ctx, c, kinds, min(in_flight), stage_bytes):
        return True
    for resharding in (False, True):
        least = {kind: kind_least_s(ctx, kind, c.mesh, c.mesh_micro_batch_size,
                                    resharding=resharding) for kind in held}  # fmt: skip
        if layers_bound_s(c, kinds, least, send_s=send_s) >= bound_s:
            return True
    # What each stage can hold costs no ILP; each layer's fastest sharding costs one, unless
    # an earlier candidate on the same mesh solved it: the cheaper first.
    solved = all(kind_solved(ctx, kind, c.mesh, c.mesh_micro_batch_size) for kind in held)
    splits = {"in_flight": in_flight, "send_s": send_s, "stage_bytes": stage_bytes,
              "bound_s": bound_s}  # fmt: skip
    if not solved and split_reaches(ctx, c, kinds, least, **splits):
        return True
    fastest = {kind: kind_options(ctx, kind, c, whole=False) for kind in held}
    if all(fastest.values()) and options_bound_s(c, kinds, fastest, send_s=send_s) >= bound_s:
        return True
    return solved and split_reaches(ctx, c, kinds, least, **splits)
