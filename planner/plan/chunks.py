"""How a pipeline split's stages cut into model chunks (interleaving, ``vpp`` a stage), as
Megatron-Core builds them (``megatron/core/transformer/transformer_block.py``
``get_num_layers_to_build``): equal chunks, or every stage the same slots with the embedding
and the loss each taking a layer's (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``). The divisibility rules
(:mod:`planner.plan.divisibility`), the search's chunk counts, the recomputed chunks, the
invariants and the launchers all read the cut from here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Real = Any
"""An int or bool, or a numpy array of them over configurations."""


def slotted_ends(
    *, first: Real, middle: Real, last: Real, pp: Real, vpp: Real, v_shape: Real = False
) -> tuple[Real, Real]:
    """Whether the embedding and the loss each take a layer's slot of an interleaved split
    of ``first``, ``middle`` (each stage between) and ``last`` decoder layers: every stage
    then holds the same slots, a multiple of ``vpp``, and the first stage's first chunk one
    decoder layer fewer (the embedding's slot), the last stage's last chunk one fewer (the
    loss's). Neither where the chunks are equal, or on a V schedule (``v_shape``: its first
    rank holds both ends); arrays over a batch.

    >>> [bool(end) for end in slotted_ends(first=7, middle=8, last=7, pp=16, vpp=8)]
    [True, True]
    """
    top = np.maximum(np.maximum(first, last), np.where(pp > 2, middle, 0))
    # Two stages both a slot short (no middle stage holds the full count) have one slot more.
    both = (pp == 2) & (first == last) & (top % np.maximum(vpp, 1) != 0)
    slots = top + both
    embedding, loss = slots - first, slots - last
    holds = ((vpp > 1) & (v_shape == False) & (slots % np.maximum(vpp, 1) == 0)  # noqa: E712
             & ((pp <= 2) | (middle == slots))
             & ((embedding == 1) | (loss == 1)) & (embedding <= 1) & (loss <= 1))  # fmt: skip
    return holds & (embedding == 1), holds & (loss == 1)


def slots_taken(layers: tuple[int, ...], vpp: int) -> tuple[bool, bool]:
    """:func:`slotted_ends` of stages of ``layers`` decoder layers, first to last: whether
    the embedding and the loss take a layer's slot (what Megatron-LM's launch says with
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``).

    >>> slots_taken((7, 8, 8, 7), 4), slots_taken((8, 8, 8, 7), 8), slots_taken((8, 8), 4)
    ((True, True), (False, True), (False, False))
    >>> slots_taken((9, 8, 8, 8), 3)  # the middle stages hold fewer than the first's slots
    (False, False)
    """
    pp = len(layers)
    embedding, loss = slotted_ends(first=layers[0], middle=layers[1] if pp > 2 else layers[0],
                                   last=layers[-1], pp=pp, vpp=vpp)  # fmt: skip
    return bool(embedding), bool(loss)


def chunk_sizes(layers: tuple[int, ...], vpp: int) -> tuple[tuple[int, ...], ...]:
    """Each stage's decoder layers (``layers``, first to last) cut into its ``vpp`` model
    chunks: equal, or a stage of one layer fewer than a multiple of ``vpp`` short in the
    embedding's slot (the first stage's first chunk) or the loss's (the last stage's last
    chunk) (:func:`slots_taken`); ValueError for a split Megatron-Core does not cut so.

    >>> chunk_sizes((7, 8, 8, 7), 4)
    ((1, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 1))
    >>> chunk_sizes((6, 6), 3), chunk_sizes((7, 7), 8)[0]
    (((2, 2, 2), (2, 2, 2)), (0, 1, 1, 1, 1, 1, 1, 1))
    """
    if all(n % vpp == 0 for n in layers):
        return tuple((n // vpp,) * vpp for n in layers)
    embedding, loss = slots_taken(layers, vpp)
    if not (embedding or loss) or any(n != layers[1] for n in layers[1:-1]):
        raise ValueError(f"stages of {list(layers)} layers do not cut into {vpp} chunks")
    size = (layers[0] + embedding) // vpp
    cut = [[size] * vpp for _ in layers]
    cut[0][0] -= embedding
    cut[-1][-1] -= loss
    return tuple(tuple(chunks) for chunks in cut)


def cuts_into(layers: tuple[int, ...], vpp: int) -> bool:
    """Whether stages of ``layers`` decoder layers cut into ``vpp`` chunks each
    (:func:`chunk_sizes`).

    >>> cuts_into((7, 8, 8, 7), 8), cuts_into((7, 8, 8, 7), 3), cuts_into((3, 8, 8, 8), 4)
    (True, False, False)
    """
    try:
        chunk_sizes(layers, vpp)
    except ValueError:
        return False
    return True
