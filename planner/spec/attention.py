"""Sliding-window (local) attention: which decoder layers attend to a window of keys only.

Gemma 2 alternates local and global layers (``Gemma2DecoderLayer``: layer ``i`` is sliding
when ``i`` is even), Gemma 3 has five local layers to each global one (``sliding_window_pattern``
6: layer ``i`` is global when ``(i + 1) % 6 == 0``), and Phi-3 / Mistral v0.1 attend locally in
every layer. A local layer's query at position ``i`` attends to keys ``i - window + 1 .. i``
(transformers' sliding-window causal mask), so its attention work and its fused kernel's key
blocks are bounded by the window, not the sequence.

>>> gemma3 = SlidingWindowSpec(window=1024, global_every=6)
>>> [gemma3.is_local(i) for i in range(7)]
[True, True, True, True, True, False, True]
>>> SlidingWindowSpec(window=4096).key_span(8192), SlidingWindowSpec(window=4096).key_span(4096)
(6144.0, 4096.0)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from planner.spec import limits as lim


class SlidingWindowSpec(BaseModel):
    """Local attention in some or all decoder layers (transformers' ``sliding_window``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    window: StrictInt = Field(
        gt=0, le=lim.MAX_SEQ_LENGTH,
        description="Keys each query of a local layer attends to, itself included.",
    )  # fmt: skip
    global_every: StrictInt = Field(
        default=0, ge=0, le=lim.MAX_LAYERS,
        description="Every global_every-th decoder layer (counting from 1) attends to the whole "
        "sequence: 2 for Gemma 2, 6 for Gemma 3; 0 = every layer is local (Phi-3, Mistral).",
    )  # fmt: skip

    def is_local(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) attends to the window only."""
        return self.global_every == 0 or (index + 1) % self.global_every != 0

    def key_span(self, seq_length: int) -> float:
        """Keys per query in the full-square convention of model FLOPs: the ``s`` of ``s x s``
        scores that a causal kernel halves. A causal window of ``w < s`` keys scores
        ``s w - w^2 / 2`` query-key pairs (``w^2 / 2`` fewer at the start, where fewer than
        ``w`` keys precede), which is half of ``s (2 w - w^2 / s)``; at ``w >= s`` it is ``s``.
        """
        s, w = float(seq_length), float(self.window)
        return s if w >= s else 2.0 * w - w * w / s
