"""DeepSpeed's pipeline partition of Megatron-DeepSpeed's ``GPTModelPipe``: which decoder
layers each pipeline stage builds.

Megatron-DeepSpeed hands DeepSpeed's ``PipelineModule`` a flat list of layer specs
(deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/model/gpt_model.py:349-440``): a cast to
16 bits, the embedding, one ``ParallelTransformerLayerPipe`` per decoder layer, the MoE loss
helper of an MoE model, the final norm, the head (the embedding again, tied, or
``LMHeadPipe``), a cast back to fp32. ``PipelineModule._partition_layers``
(deepspeedai/DeepSpeed@edaa722 ``deepspeed/runtime/pipe/module.py:396-447``) with a
``type:REGEX`` method weighs each spec 1 when the regex matches its class or function name
(ignoring case, ``module.py:322-341``) and 0 otherwise, and cuts the list with
``partition_balanced`` (``deepspeed/runtime/utils.py:627-665``). Megatron-DeepSpeed@4efb479
passes ``type:transformer`` (``gpt_model.py:463``); BLOOM's fork
(bigscience-workshop/Megatron-DeepSpeed@8387ae1, ``megatron/model/gpt_model.py:310-319``,
``--pp-partition-method``, ``megatron/arguments.py:578``) also ran
``type:transformer|embedding``, which counts the embedding and the tied head as a block each.

BLOOM 176B, 70 layers on 12 stages with ``type:transformer|embedding``: 72 weighted slots, 6 a
stage, so the first and the last stage hold 5 blocks beside the embedding and the head:

>>> deepspeed_stage_layers(70, pp=12, method="type:transformer|embedding",
...                        tied_embeddings=True)
(5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5)
>>> deepspeed_stage_layers(70, pp=12, method="type:transformer", tied_embeddings=True)
(6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5)
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np

from planner.errors import InputError
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec

DEFAULT_METHOD = "type:transformer"
"""What Megatron-DeepSpeed@4efb479's ``GPTModelPipe`` passes (``gpt_model.py:463``)."""
PARTITION_METHODS = (DEFAULT_METHOD,)
"""The pipeline partitions the target launches as exported, without a source edit:
Megatron-DeepSpeed@4efb479 hard-codes ``type:transformer`` (``gpt_model.py:463``) and has no
flag for it. BLOOM's fork's ``type:transformer|embedding`` (``--pp-partition-method``) is
priced for run records (``planner.diagnose.run_records.pipeline_ends``) but not searched, since
the pinned target cannot launch it as printed."""
BLOCK = "ParallelTransformerLayerPipe"
"""The spec of one decoder layer (``gpt_model.py:388``)."""


def layer_specs(num_layers: int, *, tied_embeddings: bool, moe: bool = False) -> tuple[str, ...]:
    """The names ``_find_layer_type`` reads of ``GPTModelPipe``'s specs, in order
    (``gpt_model.py:349-440``; bf16 or fp16 training, so the cast back is there).

    >>> layer_specs(2, tied_embeddings=False)
    ('_to_float16', 'EmbeddingPipe', 'ParallelTransformerLayerPipe', \
'ParallelTransformerLayerPipe', 'LayerNorm', 'LMHeadPipe', 'float16_to_fp32')
    """
    head = "EmbeddingPipe" if tied_embeddings else "LMHeadPipe"
    return ("_to_float16", "EmbeddingPipe", *(BLOCK,) * num_layers,
            *("_calculate_moe_loss",) * moe, "LayerNorm", head, "float16_to_fp32")  # fmt: skip


def type_weights(names: tuple[str, ...], method: str) -> tuple[int, ...]:
    """``type:REGEX``'s binary weights (``module.py:412-417``): 1 where ``REGEX`` matches the
    name, ignoring case; a regex that matches nothing is refused, as DeepSpeed refuses it."""
    if not method.startswith("type:"):
        raise InputError(f"pipeline partition method {method!r}: the planner reads DeepSpeed's "
                         f"'type:REGEX' methods (e.g. 'type:transformer|embedding')")  # fmt: skip
    try:
        pattern = re.compile(method.split(":")[1], re.IGNORECASE)
    except re.error as exc:
        raise InputError(f"pipeline partition method {method!r}: not a regex ({exc})") from None
    weights = tuple(int(pattern.search(name) is not None) for name in names)
    if not any(weights):
        raise InputError(f"pipeline partition method {method!r} found no valid layers to "
                         f"partition")  # fmt: skip
    return weights


def partition_uniform(num_items: int, num_parts: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_uniform`` (``utils.py:606-624``): part bounds, the first
    ``num_items % num_parts`` parts one item longer.

    >>> partition_uniform(7, 3), partition_uniform(2, 3)
    ((0, 3, 5, 7), (0, 1, 2, 2))
    """
    if num_items <= num_parts:
        return tuple(min(p, num_items) for p in range(num_parts + 1))
    chunk, residual = divmod(num_items, num_parts)
    return tuple(p * chunk + min(p, residual) for p in range(num_parts + 1))


def partition_balanced(weights: tuple[float, ...], num_parts: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_balanced`` (``utils.py:627-665``), restated with the inner loop
    over the previous cut as arrays: for each prefix of ``i`` items in ``j`` parts it keeps the
    cut ``k`` with the least spread (heaviest part less lightest) of the prefix's parts, where
    the spread of ``k`` is that of the best cut of ``k`` items into ``j - 1`` parts extended
    by items ``k .. i - 1``; ties go to the last ``k`` (DeepSpeed's ``>=``). Part bounds.

    >>> partition_balanced((1, 1, 1, 1), 2), partition_balanced((3, 1, 1, 1), 2)
    ((0, 2, 4), (0, 1, 4))
    """
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    dp_cost = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=np.intp)
    dp_max[0, 0] = dp_cost[0, 0] = 0.0
    with np.errstate(invalid="ignore"):  # inf - inf where no cut of k items exists
        for i in range(1, n + 1):
            part = prefix[i] - prefix[:i]  # the last part, items k .. i - 1, for each k < i
            for j in range(1, min(i, m) + 1):
                highest = np.maximum(dp_max[:i, j - 1], part)
                lowest = np.minimum(dp_min[:i, j - 1], part)
                cost = np.where(np.isinf(highest), np.inf, highest - lowest)
                k = i - 1 - int(np.argmin(cost[::-1]))  # the last of the least
                dp_cost[i, j], dp_max[i, j], dp_min[i, j] = cost[k], highest[k], lowest[k]
                position[i, j] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(reversed(parts))


@functools.cache
def deepspeed_stage_layers(
    num_layers: int, *, pp: int, method: str = DEFAULT_METHOD, tied_embeddings: bool,
    moe: bool = False,
) -> tuple[int, ...]:  # fmt: skip
    """Decoder layers each of ``pp`` stages builds when DeepSpeed partitions ``GPTModelPipe``
    with ``method``, first stage first (the embedding is on the first stage and the head on
    the last, as the cut keeps the specs in order)."""
    names = layer_specs(num_layers, tied_embeddings=tied_embeddings, moe=moe)
    bounds = partition_balanced(type_weights(names, method), pp)
    blocks = np.concatenate([[0], np.cumsum([name == BLOCK for name in names])])
    return tuple(int(blocks[b] - blocks[a]) for a, b in itertools.pairwise(bounds))


def as_ends(stage_layers: tuple[int, ...]) -> tuple[int | None, int | None] | None:
    """A stage split as the planner's ``first_stage_layers`` and ``last_stage_layers`` (None:
    as the middle stages), or None when the middle stages differ and no such pair says it.

    >>> as_ends((5, 6, 6, 5)), as_ends((6, 6, 6)), as_ends((6, 6, 5, 5))
    ((5, 5), (None, None), None)
    """
    if len(stage_layers) < 2:
        return None, None
    middle = set(stage_layers[1:-1])
    if len(middle) > 1:
        return None
    each = next(iter(middle)) if middle else None
    if each is None:  # two stages: any pair
        first, last = stage_layers
        return (None, None) if first == last else (first, last)
    first, last = stage_layers[0], stage_layers[-1]
    return (None if first == each else first, None if last == each else last)


def partition_method(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """The ``partition_method`` of :data:`PARTITION_METHODS` under which DeepSpeed cuts
    ``GPTModelPipe`` into the plan's stages (the first that does), or None when none does."""
    c = resolved.config
    if c.pp == 1:
        return DEFAULT_METHOD
    return next((method for method in PARTITION_METHODS
                 if stage_partition(model, pp=c.pp, method=method) == resolved.stage_layers),
                None)  # fmt: skip


def stage_partition(model: ModelSpec, *, pp: int, method: str) -> tuple[int, ...] | None:
    """DeepSpeed's stages of ``model`` on ``pp`` stages under ``method`` (None: fewer blocks
    than stages, which DeepSpeed's partition leaves a stage without)."""
    if model.num_layers < pp:
        return None
    return deepspeed_stage_layers(model.num_layers, pp=pp, method=method,
                                  tied_embeddings=model.tie_word_embeddings,
                                  moe=model.moe is not None)  # fmt: skip


def partition_comment(resolved: ResolvedConfig, model: ModelSpec) -> str:
    """With a pipeline, the partition method and the decoder layers it puts on each stage
    (what DeepSpeed prints as ``stage=N layers=M``), for the header line."""
    if resolved.config.pp == 1:
        return ""
    return (f"; pipeline partition_method {partition_method(resolved, model)!r}: "
            f"{'+'.join(map(str, resolved.stage_layers))} decoder layers")
