"""The vocabulary Megatron-LM pads (``--make-vocab-size-divisible-by``), which the Megatron-LM,
MindSpeed, DeepSpeed (Megatron-DeepSpeed) and Colossal-AI launchers all spell: the divisor
that pads nothing where the vocabulary allows, and the embedding's rows it gives
(``megatron/training/tokenizer/tokenizer.py``, ``_vocab_size_with_padding``)."""

from __future__ import annotations

MAX_VOCAB_DIVISOR = 128
"""Megatron-LM's default ``--make-vocab-size-divisible-by``: the largest multiple the launcher
asks for (smaller powers of two when the model's vocabulary is not a multiple of it)."""

def vocab_divisor(vocab_size: int, tp: int) -> int:
    """``--make-vocab-size-divisible-by``: the largest power of two up to 128 for which Megatron,
    which pads the vocabulary to a multiple of this times tp, pads nothing; 1 when the vocabulary
    is no multiple of tp (Megatron then pads it to the next multiple of tp, as the planner
    prices the vocab-parallel embedding).

    >>> vocab_divisor(128256, 1), vocab_divisor(128256, 8), vocab_divisor(50257, 2)
    (128, 32, 1)
    """
    divisor = MAX_VOCAB_DIVISOR
    while divisor > 1 and vocab_size % (divisor * tp):
        divisor //= 2
    return divisor


def padded_vocab(vocab_size: int, tp: int, divisor: int | None = None) -> int:
    """The rows of the embedding Megatron builds under ``--make-vocab-size-divisible-by
    divisor`` (default :func:`vocab_divisor`'s).

    >>> padded_vocab(50257, 2), padded_vocab(50257, 2, divisor=MAX_VOCAB_DIVISOR)
    (50258, 50432)
    """
    multiple = (vocab_divisor(vocab_size, tp) if divisor is None else divisor) * tp
    return -(-vocab_size // multiple) * multiple
