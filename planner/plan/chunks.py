"""How a pipeline split's stages cut into model chunks (interleaving, ``vpp`` a stage), as
Megatron-Core builds them (``megatron/core/transformer/transformer_block.py``
``get_num_layers_to_build``): equal chunks, or every stage the same slots with the embedding
and the loss each taking a layer's (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``), or, for a model with multi-token-prediction
modules, the loss's end taking a slot for the loss and one for each module, which only a
``--pipeline-model-parallel-layout`` says (DeepSeek-V3's recipe: ``Et|(tt|)*30mL``;
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` at d98e8a64ddf3). The
divisibility rules (:mod:`planner.plan.divisibility`), the search's chunk counts, the
recomputed chunks, the invariants and the launchers all read the cut from here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

Real = Any
"""An int or bool, or a numpy array of them over configurations."""


def slotted_ends(
    *, first: Real, middle: Real, last: Real, pp: Real, vpp: Real, v_shape: Real = False,
    mtp: Real = 0,
) -> tuple[Real, Real]:
    """The slots the embedding and the loss take of an interleaved split of ``first``,
    ``middle`` (each stage between) and ``last`` decoder layers: every stage then holds the
    same slots, a multiple of ``vpp``, and the first stage's first chunk one decoder layer
    fewer (the embedding's slot), the last stage's last chunk one fewer (the loss's) or, with
    ``mtp`` multi-token-prediction modules, ``1 + mtp`` fewer (the loss's and the modules'
    own, in that chunk). Neither where the chunks are equal, or on a V schedule (``v_shape``:
    its first rank holds both ends); arrays over a batch: the embedding's slot as a bool, the
    loss's end's as a count (0, 1 or ``1 + mtp``).

    >>> [int(end) for end in slotted_ends(first=7, middle=8, last=7, pp=16, vpp=8)]
    [1, 1]
    >>> [int(end) for end in slotted_ends(first=7, middle=8, last=6, pp=8, vpp=4, mtp=1)]
    [1, 2]
    """
    ends = (first, middle, last, pp, vpp, v_shape, mtp)
    if all(np.ndim(end) == 0 for end in ends):  # one configuration: resolve asks it often
        return _scalar_slots(*(int(end) for end in ends))
    return _slots(first, middle, last, pp, vpp, v_shape, mtp)


@lru_cache(maxsize=4096)
def _scalar_slots(first: int, middle: int, last: int, pp: int, vpp: int, v_shape: int,
                  mtp: int) -> tuple[bool, int]:  # fmt: skip
    embedding, loss = _slots(first, middle, last, pp, vpp, bool(v_shape), mtp)
    return bool(embedding), int(loss)


def _slots(first: Real, middle: Real, last: Real, pp: Real, vpp: Real, v_shape: Real,
           mtp: Real) -> tuple[Real, Real]:  # fmt: skip
    """:func:`slotted_ends`' formula, over arrays or scalars."""
    top = np.maximum(np.maximum(first, last), np.where(pp > 2, middle, 0))
    # Two stages both a slot short (no middle stage holds the full count) have one slot more.
    both = (pp == 2) & (first == last) & (top % np.maximum(vpp, 1) != 0)
    slots = top + both
    embedding, loss = slots - first, slots - last
    loss_slots = (loss == 1) | ((mtp > 0) & (loss == 1 + mtp))
    # The loss's chunk (slots / vpp of them) holds the loss's and the modules' slots.
    holds = ((vpp > 1) & (v_shape == False) & (slots % np.maximum(vpp, 1) == 0)  # noqa: E712
             & ((pp <= 2) | (middle == slots))
             & ((embedding == 1) | loss_slots) & (embedding <= 1)
             & (loss_slots | (loss == 0)) & (slots // np.maximum(vpp, 1) >= loss))  # fmt: skip
    return holds & (embedding == 1), np.where(holds & loss_slots, loss, 0)


def slots_taken(layers: tuple[int, ...], vpp: int, mtp: int = 0) -> tuple[bool, int]:
    """:func:`slotted_ends` of stages of ``layers`` decoder layers, first to last: whether
    the embedding takes a layer's slot, and how many the loss's end takes: 1 for the loss
    (what Megatron-LM's launch says with ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``), ``1 + mtp`` for the loss and ``mtp``
    multi-token-prediction modules (which only a layout says).

    >>> slots_taken((7, 8, 8, 7), 4), slots_taken((8, 8, 8, 7), 8), slots_taken((8, 8), 4)
    ((True, 1), (False, 1), (False, 0))
    >>> slots_taken((9, 8, 8, 8), 3)  # the middle stages hold fewer than the first's slots
    (False, 0)
    >>> slots_taken((7, 8, 8, 6), 4, mtp=1), slots_taken((7, 8, 8, 6), 4)
    ((True, 2), (False, 0))
    """
    pp = len(layers)
    embedding, loss = slotted_ends(first=layers[0], middle=layers[1] if pp > 2 else layers[0],
                                   last=layers[-1], pp=pp, vpp=vpp, mtp=mtp)  # fmt: skip
    return bool(embedding), int(loss)


@lru_cache(maxsize=4096)
def chunk_sizes(layers: tuple[int, ...], vpp: int, mtp: int = 0) -> tuple[tuple[int, ...], ...]:
    """Each stage's decoder layers (``layers``, first to last) cut into its ``vpp`` model
    chunks: equal, or a stage of fewer than a multiple of ``vpp`` short in the embedding's
    slot (the first stage's first chunk) or the loss's end's (the last stage's last chunk:
    one, or ``1 + mtp`` with ``mtp`` multi-token-prediction modules) (:func:`slots_taken`);
    ValueError for a split Megatron-Core does not cut so.

    >>> chunk_sizes((7, 8, 8, 7), 4)
    ((1, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 1))
    >>> chunk_sizes((6, 6), 3), chunk_sizes((7, 7), 8)[0]
    (((2, 2, 2), (2, 2, 2)), (0, 1, 1, 1, 1, 1, 1, 1))
    >>> chunk_sizes((3, 4, 4, 2), 2, mtp=1)  # DeepSeek's Et|tt|tt|tt|tt|tt|tt|mL, shortened
    ((1, 2), (2, 2), (2, 2), (2, 0))
    """
    if all(n % vpp == 0 for n in layers):
        return tuple((n // vpp,) * vpp for n in layers)
    embedding, loss = slots_taken(layers, vpp, mtp)
    if not (embedding or loss) or any(n != layers[1] for n in layers[1:-1]):
        raise ValueError(f"stages of {list(layers)} layers do not cut into {vpp} chunks")
    size = (layers[0] + embedding) // vpp
    cut = [[size] * vpp for _ in layers]
    cut[0][0] -= embedding
    cut[-1][-1] -= loss
    return tuple(tuple(chunks) for chunks in cut)


@lru_cache(maxsize=4096)
def cuts_into(layers: tuple[int, ...], vpp: int, mtp: int = 0) -> bool:
    """Whether stages of ``layers`` decoder layers cut into ``vpp`` chunks each
    (:func:`chunk_sizes`; ``mtp``: the model's multi-token-prediction modules).

    >>> cuts_into((7, 8, 8, 7), 8), cuts_into((7, 8, 8, 7), 3), cuts_into((3, 8, 8, 8), 4)
    (True, False, False)
    >>> cuts_into((3, 4, 4, 2), 2), cuts_into((3, 4, 4, 2), 2, mtp=1)
    (False, True)
    """
    try:
        chunk_sizes(layers, vpp, mtp)
    except ValueError:
        return False
    return True


def layout(layers: tuple[int, ...], vpp: int, mtp: int) -> str:
    """The split as Megatron-LM's ``--pipeline-model-parallel-layout`` says it: its chunks in
    the order the layout lists them (the first virtual stage of every pipeline rank, then the
    second, ...), ``E`` the embedding, ``t`` a decoder layer, ``m`` a multi-token-prediction
    module, ``L`` the loss, with ``(chunk|)*n`` for runs
    (``PipelineParallelLayerLayout.parse_str_to_list``).

    >>> layout((3, 4, 4, 2), 2, 1)  # four stages interleaved two ways
    'Et|(tt|)*6mL'
    >>> layout((7, 8, 8, 8, 8, 8, 8, 6), 4, 1)  # DeepSeek-V3's H100 recipe, PP8 VPP4
    'Et|(tt|)*30mL'
    """
    cut = chunk_sizes(layers, vpp, mtp)
    chunks = ["t" * cut[stage][virtual] for virtual in range(vpp) for stage in range(len(cut))]
    chunks[0] = "E" + chunks[0]
    chunks[-1] += "m" * mtp + "L"
    groups: list[tuple[str, int]] = []
    for chunk in chunks:
        if groups and groups[-1][0] == chunk:
            groups[-1] = (chunk, groups[-1][1] + 1)
        else:
            groups.append((chunk, 1))
    text = ""
    for i, (chunk, run) in enumerate(groups):
        last = i == len(groups) - 1
        if run > 1 and not last:
            text += f"({chunk}|)*{run}"
        else:
            text += "|".join([chunk] * run) + ("" if last else "|")
    return text


def virtual_stages(pp: int, vpp: int, *, v_shape: bool = False) -> list[tuple[int, int]]:
    """The model's virtual stages in order, each as (pipeline stage, its chunk): virtual stage
    ``c x pp + s`` is stage s's chunk c (Megatron-Core's ``get_transformer_layer_offset``,
    PyTorch's looped schedules), or on a V schedule (``v_shape``, two chunks) stage s holds
    virtual stages s and ``2 pp - 1 - s`` (PyTorch's ``ScheduleZBVZeroBubble``).

    >>> virtual_stages(2, 2), virtual_stages(2, 2, v_shape=True)
    ([(0, 0), (1, 0), (0, 1), (1, 1)], [(0, 0), (1, 0), (1, 1), (0, 1)])
    """
    if v_shape:
        return [(s, 0) for s in range(pp)] + [(s, 1) for s in reversed(range(pp))]
    return [(s, c) for c in range(vpp) for s in range(pp)]


def chunk_layers(layers: tuple[int, ...], vpp: int, *, v_shape: bool = False,
                 mtp: int = 0) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Each stage's model chunks as the decoder layers they hold (first and last, from 1),
    the empty ones left out, placed in :func:`virtual_stages`' order; the cut is
    :func:`chunk_sizes`' (ValueError where there is none).

    >>> chunk_layers((4, 4), 2)
    (((1, 2), (5, 6)), ((3, 4), (7, 8)))
    >>> chunk_layers((4, 4), 2, v_shape=True)
    (((1, 2), (7, 8)), ((3, 4), (5, 6)))
    >>> chunk_layers((7, 8, 8, 7), 4)[0]  # the embedding's slot: the first chunk a layer short
    ((1, 1), (8, 9), (16, 17), (24, 25))
    """
    cut = chunk_sizes(layers, vpp, mtp)
    held: list[list[tuple[int, int]]] = [[] for _ in layers]
    start = 1
    for stage, chunk in virtual_stages(len(layers), vpp, v_shape=v_shape):
        size = cut[stage][chunk]
        if size:
            held[stage].append((start, start + size - 1))
        start += size
    for chunks in held:
        chunks.sort()
    return tuple(tuple(chunks) for chunks in held)
