"""The order in which each pipeline stage runs its forwards and backwards: GPipe, 1F1B
(PipeDream-Flush, Megatron-LM's non-interleaved schedule), Megatron-LM's interleaved 1F1B and
the zero-bubble schedules ZB-H1 and ZB-V (:mod:`planner.pipeline.zero_bubble`), with the tensor
each operation waits for and the one it produces (for the simulator in
:mod:`planner.simulate.events`).

A *virtual stage* is one model chunk on one stage; with ``p`` stages and ``v`` chunks per
stage, chunk ``c`` of stage ``i`` is virtual stage ``c p + i``, and activations flow through
virtual stages ``0 .. p v - 1`` in order (Narayanan et al., SC'21, Sec. 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.pipeline import warmup_forwards
from planner.pipeline.zero_bubble import FORWARD, INPUT_GRADIENT, WEIGHT_GRADIENT, zero_bubble_order
from planner.vocabulary import ScheduleName


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sequences:
    """Microbatch and chunk of each forward, and of each backward, in order."""

    forward_microbatch: np.ndarray
    """The microbatch of the ``k``-th forward."""
    forward_chunk: np.ndarray
    """The model chunk of the ``k``-th forward."""
    backward_microbatch: np.ndarray
    """The microbatch of the ``k``-th backward."""
    backward_chunk: np.ndarray
    """The model chunk of the ``k``-th backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """One stage's operations in order, as columns: kind, microbatch, chunk."""

    kind: np.ndarray
    """:data:`~planner.pipeline.zero_bubble.FORWARD`, ``INPUT_GRADIENT`` (the whole backward
    outside the zero-bubble schedules) or ``WEIGHT_GRADIENT``."""
    microbatch: np.ndarray
    """The microbatch each operation runs."""
    chunk: np.ndarray
    """The model chunk each operation runs (0 without interleaving)."""
    virtual_stage: np.ndarray
    """The virtual stage each operation runs (where its chunk sits in the model)."""

    @property
    def is_forward(self) -> np.ndarray:
        """True for a forward."""
        return self.kind == FORWARD

    @property
    def releases(self) -> np.ndarray:
        """True for the operation after which a chunk's activations are freed: its weight
        gradient under a zero-bubble schedule, else its backward."""
        last = WEIGHT_GRADIENT if (self.kind == WEIGHT_GRADIENT).any() else INPUT_GRADIENT
        return self.kind == last


def _sequences(schedule: ScheduleName, *, pp: int, vpp: int, m: int) -> _Sequences:
    """Every stage's forwards and backwards, each in the order the stage runs them (the same
    on all stages; only how they interleave differs).

    Megatron's interleaved order (``get_model_chunk_id``): the ``k``-th forward takes
    microbatches in groups of ``p`` through chunk 0, then the same group through chunk 1, and
    so on; the ``k``-th backward takes the same microbatch through chunk ``v - 1 - c``. With
    ``v = 1`` that is microbatch order (1F1B). GPipe runs its backwards in reverse microbatch
    order, as autograd does over GPipe's concatenated microbatches (Huang et al., 2019, Fig.
    2c).
    """
    k = np.arange(m * vpp)
    microbatch = (k // (pp * vpp)) * pp + k % pp
    chunk = (k // pp) % vpp
    if schedule == "gpipe":
        return _Sequences(forward_microbatch=microbatch, forward_chunk=chunk,
                          backward_microbatch=microbatch[::-1], backward_chunk=chunk)
    return _Sequences(forward_microbatch=microbatch, forward_chunk=chunk,
                      backward_microbatch=microbatch, backward_chunk=vpp - 1 - chunk)


def _interleave(seq: _Sequences, warmup: int, *, stage: int, pp: int) -> Order:
    """``warmup`` forwards, then forward ``warmup + k`` and backward ``k`` in turn, then the
    remaining backwards."""
    total = len(seq.forward_chunk)
    steady = total - warmup
    is_forward = np.zeros(2 * total, dtype=bool)
    microbatch = np.empty(2 * total, dtype=np.int64)
    chunk = np.empty(2 * total, dtype=np.int64)
    # Positions of the forwards and of the backwards in the stage's order.
    fwd_at = np.concatenate([np.arange(warmup), warmup + 2 * np.arange(steady)])
    bwd_at = np.concatenate([warmup + 2 * np.arange(steady) + 1,
                             warmup + 2 * steady + np.arange(total - steady)])  # fmt: skip
    is_forward[fwd_at] = True
    microbatch[fwd_at], chunk[fwd_at] = seq.forward_microbatch, seq.forward_chunk
    microbatch[bwd_at], chunk[bwd_at] = seq.backward_microbatch, seq.backward_chunk
    kind = np.where(is_forward, FORWARD, INPUT_GRADIENT)
    return Order(kind=kind, microbatch=microbatch, chunk=chunk, virtual_stage=chunk * pp + stage)


def _order(schedule: ScheduleName, *, stage: int, pp: int, vpp: int, m: int) -> Order:
    """One stage's order under any schedule."""
    if schedule in ("zb-h1", "zb-v"):
        kind, microbatch, chunk, virtual_stage = zero_bubble_order(schedule, stage=stage, pp=pp,
                                                                  m=m)  # fmt: skip
        return Order(kind=kind, microbatch=microbatch, chunk=chunk, virtual_stage=virtual_stage)
    seq = _sequences(schedule, pp=pp, vpp=vpp, m=m)
    warmup = warmup_forwards(schedule, stage=stage, pp=pp, vpp=vpp, num_microbatches=m)
    return _interleave(seq, warmup, stage=stage, pp=pp)


def stage_order(
    schedule: ScheduleName, *, stage: int, pp: int, vpp: int, m: int
) -> list[tuple[bool, int, int]]:
    """One stage's forwards and backwards as ``(is_forward, microbatch, chunk)``, in the order
    it runs them: warm-up forwards (:func:`~planner.cost.pipeline.warmup_forwards`), then one
    forward and one backward in turn, then the remaining backwards.

    >>> [("F" if f else "B") + str(j) for f, j, _ in stage_order("1f1b", stage=1, pp=3,
    ...                                                           vpp=1, m=3)]
    ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
    """
    order = _order(schedule, stage=stage, pp=pp, vpp=vpp, m=m)
    return list(zip(order.is_forward.tolist(), order.microbatch.tolist(), order.chunk.tolist(),
                    strict=True))  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOps:
    """One stage's order with, per operation, the tensor it waits for and the one it
    produces (keys as in :func:`planner.simulate.events._run`; -1: none)."""

    order: Order
    """The stage's operations in order."""
    need: np.ndarray
    """Per operation, the key of the tensor it waits for (-1: none)."""
    made: np.ndarray
    """Per operation, the key of the tensor it sends on (-1: none)."""


def stage_ops(schedule: ScheduleName, *, pp: int, vpp: int, m: int) -> list[StageOps]:
    """Every stage's order and tensors, computed on arrays so that the event loop does no
    index arithmetic."""
    n, last = pp * vpp * m, (pp * vpp - 1) * m
    ops = []
    for i in range(pp):
        order = _order(schedule, stage=i, pp=pp, vpp=vpp, m=m)
        fwd, bwd = order.kind == FORWARD, order.kind == INPUT_GRADIENT
        key = order.virtual_stage * m + order.microbatch
        # A forward needs the previous virtual stage's activation (none for the first), a
        # backward the next one's gradient (none for the last: its own forward came first); a
        # weight gradient only its own backward, which the stage ran before it.
        need = np.where(fwd, np.where(key >= m, key - m, -1),
                        np.where(bwd & (key < last), n + key + m, -1))  # fmt: skip
        # A forward sends its activation on (not from the last virtual stage), a backward its
        # input gradient back (not from the first); a weight gradient sends nothing.
        made = np.where(fwd, np.where(key < last, key, -1),
                        np.where(bwd & (key >= m), n + key, -1))  # fmt: skip
        ops.append(StageOps(order=order, need=need, made=made))
    return ops
