"""The zero-bubble schedules' op orders (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24):
each backward runs as an input-gradient pass (B), which the previous stage waits for, and a
weight-gradient pass (W), which nothing waits for and which the schedule moves into what would
otherwise be the pipeline's bubble.

The orders are PyTorch's (``torch.distributed.pipelining``), which torchtitan launches:

- ZB-H1 is ``ScheduleInterleavedZeroBubble`` with one stage per rank: 1F1B's warm-up of
  ``p - 1 - i`` forwards, then each backward followed by the weight gradient of the backward
  ``i`` places before it (``num_1f1b_microbatches = rank``), the ``i`` delayed ones at the end.
- ZB-V is ``ScheduleZBVZeroBubble``: two chunks per stage in a V (stage ``i`` holds virtual
  stages ``i`` and ``2p - 1 - i``), orders generated for ``max(2p - 1, m)`` microbatches and the
  ones past ``m`` dropped.

(pytorch/pytorch@cf30153 torch/distributed/pipelining/schedules.py:2735-2870 and :3072-3127
for ZB-H1; :3199-3390 for ZB-V.)
"""

from __future__ import annotations

from typing import Literal

import numpy as np

FORWARD, INPUT_GRADIENT, WEIGHT_GRADIENT = 0, 1, 2
"""Operation kinds (``INPUT_GRADIENT`` is the whole backward outside zero-bubble schedules)."""

ZeroBubble = Literal["zb-h1", "zb-v"]

_Op = tuple[int, int, int]
"""(kind, microbatch, chunk)."""


def _zb_h1(*, stage: int, pp: int, m: int) -> list[_Op]:
    """Stage ``stage``'s ZB-H1 order: warm-up forwards, then forward (while any are left),
    backward and, from the ``stage``-th backward on, the oldest pending weight gradient."""
    warmup = min(pp - 1 - stage, m)
    ops: list[_Op] = [(FORWARD, j, 0) for j in range(warmup)]
    weights = 0
    for k in range(m):
        if warmup + k < m:
            ops.append((FORWARD, warmup + k, 0))
        ops.append((INPUT_GRADIENT, k, 0))
        if k >= stage:
            ops.append((WEIGHT_GRADIENT, weights, 0))
            weights += 1
    ops += [(WEIGHT_GRADIENT, j, 0) for j in range(weights, m)]
    return ops


def _zb_v(*, stage: int, pp: int, m: int) -> list[_Op]:
    """Stage ``stage``'s ZB-V order over chunk 0 (down the V) and chunk 1 (back up)."""
    n = max(2 * pp - 1, m)
    ops: list[_Op] = []
    count = {(kind, chunk): 0 for kind in range(3) for chunk in range(2)}

    def run(kind: int, chunk: int, microbatch: int | None = None) -> None:
        j = count[kind, chunk] if microbatch is None else microbatch
        ops.append((kind, j, chunk))
        count[kind, chunk] += 1

    def full_backward(chunk: int) -> None:
        run(INPUT_GRADIENT, chunk)
        run(WEIGHT_GRADIENT, chunk)

    # Warm-up: chunk 0 fills the V's descent; stages near the bottom then alternate the chunks;
    # every stage ends its warm-up with a forward and a whole backward of chunk 1 per hop.
    for _ in range(2 * (pp - stage) - 1):
        run(FORWARD, 0)
    for _ in range(stage):
        run(FORWARD, 1)
        run(FORWARD, 0)
    for _ in range(pp - stage):
        run(FORWARD, 1)
        full_backward(1)
    # Steady state: one forward and one whole backward per chunk in turn.
    while count[FORWARD, 1] < count[FORWARD, 0] or count[FORWARD, 0] < n:
        if count[FORWARD, 0] < n:
            run(FORWARD, 0)
        full_backward(0)
        run(FORWARD, 1)
        full_backward(1)
    # Cool-down: the remaining input gradients first, the weight gradients they free after.
    weights = {0: count[WEIGHT_GRADIENT, 0], 1: count[WEIGHT_GRADIENT, 1]}
    for _ in range(stage):
        run(INPUT_GRADIENT, 0)
        run(INPUT_GRADIENT, 1)
    for _ in range(pp - stage):
        run(INPUT_GRADIENT, 0)
        run(WEIGHT_GRADIENT, 0, weights[0])
        weights[0] += 1
    ops += [(WEIGHT_GRADIENT, j, 1) for j in range(weights[1], count[INPUT_GRADIENT, 1])]
    ops += [(WEIGHT_GRADIENT, j, 0) for j in range(weights[0], count[INPUT_GRADIENT, 0])]
    return [op for op in ops if op[1] < m]


def zero_bubble_order(
    schedule: ZeroBubble, *, stage: int, pp: int, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stage ``stage``'s operations under ``schedule`` as columns: kind, microbatch, chunk and
    virtual stage (ZB-H1: the stage; ZB-V: ``i`` for chunk 0, ``2p - 1 - i`` for chunk 1).

    >>> kind, microbatch, chunk, virtual = zero_bubble_order("zb-v", stage=0, pp=1, m=2)
    >>> ["FBW"[k] + str(j) + "ab"[c] for k, j, c in zip(kind, microbatch, chunk)]
    ['F0a', 'F0b', 'B0b', 'W0b', 'F1a', 'B0a', 'W0a', 'F1b', 'B1b', 'W1b', 'B1a', 'W1a']
    """
    build = _zb_h1 if schedule == "zb-h1" else _zb_v
    ops = np.array(build(stage=stage, pp=pp, m=m), dtype=np.int64).reshape(-1, 3)
    kind, microbatch, chunk = ops[:, 0], ops[:, 1], ops[:, 2]
    virtual = np.where(chunk == 0, stage, 2 * pp - 1 - stage)
    return kind, microbatch, chunk, virtual
