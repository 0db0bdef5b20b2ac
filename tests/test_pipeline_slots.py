"""Interleaved pipelines whose embedding and loss each take a layer's slot, as Megatron-Core
builds them (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``): Meta's Llama 3.1 405B on PP16 interleaved, the
Qwen3-235B recipe's 94 layers on PP8 x VPP4. Priced, searched, refused where a framework
cannot run them, and exported."""

from __future__ import annotations

import pytest

import planner
from planner.frameworks import profile
from planner.plan.chunks import chunk_sizes, cuts_into, slots_taken
from planner.plan.config import ParallelConfig, resolve, stage_layers
from planner.spec.reading import load_cluster, load_model
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_columns
from planner.uniform.space import stage_splits, virtual_stages
from tests.conftest import REPO
from tests.test_estimate_batch import agree

LLAMA_405B = REPO / "instances" / "models" / "llama3.1-405b.json"
H100 = REPO / "instances" / "clusters" / "dgx-h100-80gb.json"


def megatron_layers_to_build(layers: int, pp: int, vpp: int, *, embedding: bool,
                             loss: bool) -> list[list[int]]:  # fmt: skip
    """Megatron-Core's ``get_num_layers_to_build`` (``megatron/core/transformer/
    transformer_block.py`` at d98e8a64ddf3), restated for every pipeline rank and virtual
    stage: the slots shared out evenly, one fewer decoder in the embedding's chunk (the first
    rank's first) and in the loss's (the last rank's last)."""
    slots = layers + embedding + loss
    assert slots % pp == 0 and (slots // pp) % vpp == 0
    per_chunk = slots // pp // vpp
    built = [[per_chunk] * vpp for _ in range(pp)]
    built[0][0] -= embedding
    built[-1][-1] -= loss
    return built


@pytest.mark.parametrize(("layers", "pp", "vpp", "ends"), [
    (126, 16, 8, (7, 7)),  # Llama 3.1 405B as Meta ran it: an embedding-only first chunk
    (94, 8, 4, (11, 11)),  # Qwen3-235B, the Megatron-MoE model zoo's H100 recipe
    (63, 8, 2, (7, 8)),  # the embedding's slot only: 64 slots, 8 a stage
    (14, 2, 8, (7, 7)),  # two stages both a slot short
])  # fmt: skip
def test_chunks_are_the_layers_megatron_builds(layers: int, pp: int, vpp: int,
                                               ends: tuple[int, int]) -> None:  # fmt: skip
    """Each chunk holds the decoder layers Megatron-Core builds there, where the split is
    one it builds."""
    first, last = ends
    middle = (layers - first - last) // max(pp - 2, 1)
    stages = (first, *[middle] * (pp - 2), last) if pp > 2 else (first, last)
    if sum(stages) != layers:
        pytest.skip("not a split of the layers")
    embedding, loss = slots_taken(stages, vpp)
    if not (embedding or loss):
        assert not cuts_into(stages, vpp) or all(n % vpp == 0 for n in stages)
        return
    built = megatron_layers_to_build(layers, pp, vpp, embedding=embedding, loss=loss)
    assert [list(c) for c in chunk_sizes(stages, vpp)] == built


def test_the_search_interleaves_metas_split() -> None:
    """126 layers on 16 stages as 7 + 8 x 14 + 7 interleave 2, 4 or 8 ways (8 slots a
    stage); before, only 1F1B. As 8 + 8 x 14 + 6 they cut only into equal halves (the last
    stage two short of its slots)."""
    llama = load_model(LLAMA_405B)
    assert virtual_stages(llama, pp=16, split=(7, 7)) == [1, 2, 4, 8]
    assert virtual_stages(llama, pp=16, split=(8, 6)) == [1, 2]


def test_metas_layout_is_priced_exported_and_refused_where_it_cannot_run() -> None:
    """TP8 PP16 VPP8 on 2,048 nodes: the estimate and the batch agree, the interleaving pays
    less bubble than 1F1B, Megatron-LM's launch says the slots, and Colossal-AI (equal chunks
    only) and DeepSpeed (no interleaving) refuse it."""
    llama = load_model(LLAMA_405B)
    cluster = load_cluster(H100, 2048)
    knobs = dict(tp=8, pp=16, first_stage_layers=7, last_stage_layers=7, sp=True,
                 recompute="full", zero=1, global_batch=2048, seq_len=8192)  # fmt: skip
    interleaved = ParallelConfig(vpp=8, **knobs)
    plain = ParallelConfig(vpp=1, **knobs)
    batch = estimate_batch(llama, cluster, config_columns([interleaved, plain]))
    assert agree(batch, [interleaved, plain], llama, cluster) == 2
    fast, slow = (planner.estimate(llama, cluster, c) for c in (interleaved, plain))
    assert fast.time.pipeline_bubble_s < slow.time.pipeline_bubble_s / 4
    resolved = resolve(llama, cluster, interleaved)
    launch = profile("megatron").launch(resolved, llama)
    assert "--account-for-embedding-in-pipeline-split" in launch.text
    assert "--account-for-loss-in-pipeline-split" in launch.text
    assert "--decoder-first-pipeline-num-layers" not in launch.text
    assert "--num-virtual-stages-per-pipeline-rank 8" in launch.text
    plain_launch = profile("megatron").launch(resolve(llama, cluster, plain), llama)
    assert "--decoder-first-pipeline-num-layers 7" in plain_launch.text
    assert profile("megatron").refusals(resolved, llama) == ()
    assert any("interleav" in r for r in profile("colossalai").refusals(resolved, llama))
    assert profile("deepspeed").refusals(resolved, llama)


def megatron_builds(stages: tuple[int, ...], vpp: int) -> list[list[int]] | None:
    """The chunks Megatron-Core builds for stages of ``stages`` decoder layers on ``vpp``
    chunks a rank, or None where it builds no such split, by brute force over its two ways of
    saying a split: the uneven first/last stage flags (every stage's layers a multiple of vpp,
    ``get_num_layers_to_build``'s first branch), or the embedding's and the loss's slots (its
    second branch, each flag on or off; exclusive of the first)."""
    pp, layers = len(stages), sum(stages)
    if all(n % vpp == 0 for n in stages):
        return [[n // vpp] * vpp for n in stages]
    for embedding in (False, True):
        for loss in (False, True):
            slots = layers + embedding + loss
            if (embedding or loss) and slots % pp == 0 and (slots // pp) % vpp == 0:
                built = megatron_layers_to_build(layers, pp, vpp, embedding=embedding,
                                                 loss=loss)  # fmt: skip
                if tuple(sum(chunks) for chunks in built) == stages:
                    return built
    return None


@pytest.mark.parametrize("layers", [5, 12, 23, 32, 61, 94, 126])
def test_cuts_are_megatrons_by_brute_force(layers: int) -> None:
    """For every pipeline degree, split the search tries and chunk count, the planner cuts a
    split into chunks exactly when Megatron-Core builds it, and its chunks are the ones
    Megatron builds."""
    for pp in range(2, min(layers, 17)):
        splits = [(None, None)] if layers % pp == 0 else []
        splits += stage_splits(layers, pp)
        for first, last in splits:
            stages = stage_layers(layers, pp=pp, first=first, last=last)
            for vpp in range(2, max(stages) + 3):
                built = megatron_builds(stages, vpp)
                assert cuts_into(stages, vpp) == (built is not None), (stages, vpp)
                if built is not None:
                    assert [list(c) for c in chunk_sizes(stages, vpp)] == built
