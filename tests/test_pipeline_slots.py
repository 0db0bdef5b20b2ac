"""Interleaved pipelines whose embedding and loss each take a layer's slot, as Megatron-Core
builds them (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``): Meta's Llama 3.1 405B on PP16 interleaved, the
Qwen3-235B recipe's 94 layers on PP8 x VPP4. Priced, searched, refused where a framework
cannot run them, and exported."""

from __future__ import annotations

import re

import pytest

import planner
from planner.frameworks import profile
from planner.plan.chunks import chunk_sizes, cuts_into, layout, slots_taken
from planner.plan.config import ParallelConfig, resolve, stage_layers
from planner.spec.reading import load_cluster, load_model
from planner.uniform.batch import estimate_batch
from planner.uniform.columns import config_columns
from planner.uniform.space import stage_splits, virtual_stages
from tests.conftest import REPO
from tests.test_estimate_batch import agree
from tests.test_framework_megatron import read_flags

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


DEEPSEEK_V3 = REPO / "instances" / "models" / "deepseek-v3.json"


def megatron_parse_layout(text: str, pp: int) -> list[list[str]]:
    """Megatron-LM's ``PipelineParallelLayerLayout.parse_str_to_list`` and its 2-D view
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py`` at d98e8a64ddf3),
    restated: commas dropped, ``(x)*n`` then ``c*n`` unrolled, chunks split on ``|``, chunk
    ``k`` on pipeline rank ``k % pp`` as its virtual stage ``k // pp``."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    chunks = text.split("|")
    assert len(chunks) % pp == 0
    return [[chunks[v * pp + rank] for v in range(len(chunks) // pp)] for rank in range(pp)]


def test_deepseek_v3_recipes_layout_is_written_as_the_recipe_writes_it() -> None:
    """NVIDIA's DeepSeek-V3 H100 recipe (yanring/Megatron-MoE-ModelZoo
    ``best_practice/deepseek-v3/run_deepseek_v3_h100.sh`` at e865051: PP8 VPP4 TP2 EP64 on
    1,024 H100, ``--pipeline-model-parallel-layout "Et|(tt|)*30mL"``) is 7 + 8 x 6 + 6 layers
    with the loss's end a slot short for the MTP module too: Megatron-LM's launch writes the
    recipe's string, which Megatron parses back into the planner's chunks, the module in the
    last rank's last chunk with the loss; MindSpeed (core_v0.12.1, no layout argument) refuses
    it."""
    model = load_model(DEEPSEEK_V3)
    stages = (7, 8, 8, 8, 8, 8, 8, 6)
    assert slots_taken(stages, 4, model.mtp_layers) == (True, 2)
    assert not cuts_into(stages, 4)  # without the module's slot, no cut
    config = ParallelConfig(tp=2, pp=8, vpp=4, ep=64, etp=1, sp=True, zero=1,
                            first_stage_layers=7, last_stage_layers=6, recompute="selective",
                            recompute_modules="mla_up_proj,mlp", global_batch=8192,
                            seq_len=4096)  # fmt: skip
    resolved = resolve(model, load_cluster(H100, 128), config)
    assert resolved.stage_layers == stages
    flags = read_flags(profile("megatron").launch(resolved, model).text)
    assert flags["--pipeline-model-parallel-layout"] == "Et|(tt|)*30mL"
    assert flags["--mtp-num-layers"] == "1"
    assert not {"--num-virtual-stages-per-pipeline-rank", "--account-for-loss-in-pipeline-split",
                "--decoder-first-pipeline-num-layers"} & set(flags)
    parsed = megatron_parse_layout(flags["--pipeline-model-parallel-layout"], 8)
    cut = chunk_sizes(stages, 4, model.mtp_layers)
    assert [[chunk.count("t") for chunk in rank] for rank in parsed] == [list(c) for c in cut]
    assert parsed[0][0].startswith("E") and parsed[-1][-1].endswith("mL")
    # MindSpeed brings the layout to its core_v0.12.1 and launches it too
    assert profile("megatron").refusals(resolved, model) == ()
    assert profile("mindspeed").refusals(resolved, model) == ()


def assert_megatron_parses(stages: tuple[int, ...], vpp: int, mtp: int) -> None:
    """The layout of the cut parses, by Megatron's rules restated, into the same decoder
    layers a chunk, every layer and module once, the modules with the loss in the last
    rank's last chunk (``PipelineParallelLayerLayout.validate_layer_layout``)."""
    pp = len(stages)
    parsed = megatron_parse_layout(layout(stages, vpp, mtp), pp)
    cut = chunk_sizes(stages, vpp, mtp)
    assert [[c.count("t") for c in rank] for rank in parsed] == [list(c) for c in cut]
    flat = "".join(parsed[r][v] for v in range(vpp) for r in range(pp))
    assert flat.count("t") == sum(stages) and flat.count("m") == mtp
    assert flat[0] == "E" and flat.endswith("m" * mtp + "L")
    assert all("m" not in chunk for rank in parsed for chunk in rank[:-1])


@pytest.mark.parametrize("layers", [60, 61])
def test_module_slots_cut_as_megatrons_layout_builds_them(layers: int) -> None:
    """For every split the search tries of DeepSeek-V3 (with 60 and 61 layers) on 2-16
    stages and every chunk count: a cut with the module's slot beside the loss's is written as
    a layout Megatron parses back into the planner's chunks."""
    model = load_model(DEEPSEEK_V3).model_copy(update={"num_layers": layers})
    written = 0
    for pp in range(2, 17):
        for first, last in stage_splits(model.num_layers, pp):
            stages = stage_layers(model.num_layers, pp=pp, first=first, last=last)
            for vpp in virtual_stages(model, pp=pp, split=(first, last)):
                if vpp > 1 and slots_taken(stages, vpp, model.mtp_layers)[1] > 1:
                    assert_megatron_parses(stages, vpp, model.mtp_layers)
                    written += 1
    assert written > 0


def test_two_modules_take_two_slots() -> None:
    """Two modules: the loss's end three slots short, in a chunk of three or more slots."""
    assert slots_taken((5, 6, 6, 3), 2, mtp=2) == (True, 3)
    assert_megatron_parses((5, 6, 6, 3), 2, 2)
    assert not cuts_into((5, 6, 6, 3), 3, mtp=2)  # chunks of two slots cannot hold three


def test_module_slots_are_priced_alike_by_estimate_and_the_batch() -> None:
    """The recipe's split with its module's slot: the batch pricer agrees with estimate."""
    model = load_model(DEEPSEEK_V3)
    cluster = load_cluster(H100, 256)
    configs = [ParallelConfig(tp=4, pp=8, vpp=v, ep=32, etp=1, sp=True, zero=1,
                              first_stage_layers=7, last_stage_layers=6, recompute="full")
               for v in (2, 4)]  # fmt: skip
    batch = estimate_batch(model, cluster, config_columns(configs))
    assert agree(batch, configs, model, cluster) == 2
