"""torchtitan v0.2.2's activation checkpointing (``torchtitan/distributed/
activation_checkpoint.py``) as the planner prices it: ``full``; ``selective`` per operator
(``selective_ac_option = "op"``, the recompute module ``op``); and ``selective`` every
``n``-th block (``selective_ac_option = n``), which is the planner's full recomputation of
some layers where it recomputes as many blocks in every model chunk.

The every-``n``-th count is one counter per process (``_layer_sac_count``, a module global),
advanced by each block of each model part the rank builds, in order: a block is checkpointed
when the counter, after it, divides by ``n`` (``_apply_layer_sac``, lines 27-49).
"""

from __future__ import annotations

from planner.frameworks._torchtitan_flavors import REPO
from planner.graph.builder import decoder_layer_kind
from planner.plan.chunks import chunk_sizes
from planner.plan.config import ResolvedConfig
from planner.spec import ModelSpec
from planner.vocabulary import OP_SAC

CHECKPOINTING = f"{REPO} torchtitan/distributed/activation_checkpoint.py"
"""torchtitan's activation checkpointing, which the rules cite."""


def checkpointed_per_chunk(chunks: tuple[int, ...], every: int) -> tuple[int, ...]:
    """Blocks checkpointed in each of one rank's model chunks (``chunks``: their block
    counts, in the order the rank builds them) under ``selective_ac_option = every``.

    >>> checkpointed_per_chunk((32,), 2), checkpointed_per_chunk((3, 3), 2)
    ((16,), (1, 2))
    """
    out, start = [], 0
    for size in chunks:
        out.append((start + size) // every - start // every)
        start += size
    return tuple(out)


def layer_frequency(resolved: ResolvedConfig, model: ModelSpec) -> int | None:
    """The smallest ``n`` for which torchtitan's every-``n``-th-block checkpointing recomputes
    ``recompute_layers`` blocks of every model chunk (all of a smaller chunk's), as the
    planner prices them; None where no ``n`` does, or where the model's blocks are of several
    kinds (which of them the ``n``-th ones are differs from the chunk's first ones priced).

    >>> from planner.plan.config import ParallelConfig, resolve
    >>> from planner.spec.reading import load_cluster, load_model
    >>> model = load_model("instances/models/llama3-8b.json")
    >>> cluster = load_cluster("instances/clusters/dgx-h100-80gb.json", nodes=1)
    >>> layers = lambda k: ParallelConfig(recompute="full", recompute_layers=k)
    >>> [layer_frequency(resolve(model, cluster, layers(k)), model) for k in (16, 10, 12)]
    [2, 3, None]
    """
    k = resolved.config.recompute_layers
    if k is None:
        return 1
    if not _one_kind(model):
        return None
    ranks = chunk_sizes(resolved.stage_layers, resolved.config.vpp, model.mtp_layers)
    most = max(max(chunks) for chunks in ranks)
    for every in range(1, most + 1):
        if all(checkpointed_per_chunk(chunks, every) == tuple(min(k, c) for c in chunks)
               for chunks in ranks):  # fmt: skip
            return every
    return None


def selective_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Selective AC is per operator (``selective_ac_option = "op"``: the recompute module
    ``op``), priced on dense blocks and on MoE blocks without tensor parallelism (whose
    reduce-scatter around the experts was not checked); not Megatron's attention core."""
    if resolved.config.recompute != "selective":
        return None
    if resolved.recompute_modules != (OP_SAC,):
        return ("selective recompute: torchtitan's selective checkpointing saves attention and "
                "every other matmul and recomputes the rest (recompute_modules op), not "
                f"{' and '.join(resolved.recompute_modules)}")
    if model.mla is not None:
        return (f"recompute_modules(op): the per-operator policy is priced on dense and MoE "
                f"blocks only, and {model.name} has latent attention")
    if model.moe is not None and resolved.config.tp > 1:
        return (f"recompute_modules(op) with tp({resolved.config.tp}): the per-operator policy "
                f"on MoE blocks is priced without tensor parallelism only")
    return None


def partial_recompute(resolved: ResolvedConfig, model: ModelSpec) -> str | None:
    """Layer-wise selective AC checkpoints every n-th block a rank builds, counted across its
    model chunks: some layers recomputed only where that is as many in every chunk."""
    k = resolved.config.recompute_layers
    if k is None or layer_frequency(resolved, model) is not None:
        return None
    every_nth = (f"recompute_layers({k}): torchtitan checkpoints every n-th transformer block "
                 f"a rank builds (selective_ac_option = n)")
    if not _one_kind(model):
        return (f"{every_nth}, which among {model.name}'s blocks of several kinds reaches "
                f"others than each chunk's first {k}, as priced")
    return (f"{every_nth}, and no n recomputes {k} in every model chunk of "
            f"{list(resolved.stage_layers)} layers per stage, vpp {resolved.config.vpp}")


def _one_kind(model: ModelSpec) -> bool:
    return len({decoder_layer_kind(model, i) for i in range(1, model.num_layers + 1)}) == 1


def activation_checkpoint_table(resolved: ResolvedConfig, model: ModelSpec) -> dict[str, str]:
    """``[activation_checkpoint]``: none, full, selective with the per-operator policy, or
    selective every ``n``-th block for some layers recomputed (the only modes the rules let
    through)."""
    mode = resolved.config.recompute
    if mode == "selective":
        return {"mode": mode, "selective_ac_option": OP_SAC}
    every = layer_frequency(resolved, model) if mode == "full" else 1
    if every is None or every == 1:
        return {"mode": mode}
    return {"mode": "selective", "selective_ac_option": str(every)}
