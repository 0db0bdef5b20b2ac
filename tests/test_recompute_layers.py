"""Full recomputation of some layers per model chunk (``recompute_layers``, Megatron's
``--recompute-method block``): its memory against Korthikanti et al.'s count by hand, its
limits, and the search's fewest recomputed layers against pricing every count."""

from __future__ import annotations

import numpy as np
import pytest

import planner
from planner.errors import InputError
from planner.options import Pins, SolveOptions
from planner.plan.config import ParallelConfig
from planner.search.framework import enumerate_plan
from planner.uniform.batch import estimate_batch
from planner.uniform.fewest_recomputed import chunk_layers
from planner.uniform.remedies import config_infeasible_message
from planner.uniform.space import config_key, grid_space, launched_variant
from planner.vocabulary import GIB
from tests.conftest import CLUSTERS, MODELS

GPT3 = MODELS / "gpt3-175b.json"
A100 = CLUSTERS / "dgx-a100-80gb.json"


def _gpt3_megatron(n: int | None) -> planner.Estimate:
    """GPT-3 175B as Megatron-LM trained it (TP8 PP16, fp16, unfused attention, no SP), with
    ``n`` of each stage's 6 layers recomputed."""
    model = planner.load_model(GPT3)
    cluster = planner.load_cluster(A100, nodes=128)
    return planner.estimate(model, cluster, ParallelConfig(
        tp=8, pp=16, recompute="full", recompute_layers=n, flash_attention=False,
        precision="fp16"))  # fmt: skip


def test_kept_activations_by_hand() -> None:
    """Korthikanti et al. (MLSys'23, Eq. 2): a layer keeps ``sbh (10 + 24/t + 5as/(ht))``
    bytes without recomputation, ``2sbh`` (its fp16 input) with; for GPT-3 (s 2048, h 12288,
    a 96, t 8) ``23 sbh`` and ``2 sbh``. Stage 0 of 16 holds 16 microbatches: each layer
    recomputed keeps ``16 x 21 sbh`` fewer bytes. While a chunk's first layers are rebuilt its
    later ones have freed theirs, so the transient appears only when all 6 recompute: one
    layer's ``23 sbh`` (the breakdown's ``working``)."""
    sbh = 2048 * 1 * 12288
    memories = [_gpt3_megatron(n).memory for n in range(1, 7)]
    activations = [(m.activations_gib + m.working_gib) * GIB for m in memories]
    assert [m.working_gib * GIB for m in memories] == [0] * 5 + [23 * sbh]
    for n in range(1, 5):
        assert activations[n - 1] - activations[n] == 16 * 21 * sbh
    assert activations[4] - activations[5] == 16 * 21 * sbh - 23 * sbh


def test_time_grows_with_each_layer_recomputed() -> None:
    """Each layer recomputed adds the same rerun on every stage; N at or past a chunk's
    layers is full recomputation of all of them, to the last key."""
    steps = [_gpt3_megatron(n).step_time_s for n in range(1, 7)]
    gaps = np.diff(steps)
    assert (gaps > 0).all() and gaps == pytest.approx(gaps[0], rel=1e-9)
    assert _gpt3_megatron(6).to_dict() == _gpt3_megatron(None).to_dict()
    assert _gpt3_megatron(9).to_dict() == _gpt3_megatron(None).to_dict()


def test_needs_full_recomputation() -> None:
    with pytest.raises(ValueError, match=r"recompute_layers\(2\) needs recompute 'full'"):
        ParallelConfig(recompute="selective", recompute_layers=2)
    model = planner.load_model(GPT3)
    cluster = planner.load_cluster(A100, nodes=128)
    with pytest.raises(InputError, match=r"row 0: recompute_layers\(3\) needs recompute"):
        estimate_batch(model, cluster, {"recompute": ["none"], "recompute_layers": [3]})


def brute_force(model: planner.ModelSpec, cluster: planner.ClusterSpec,
                options: SolveOptions) -> ParallelConfig:  # fmt: skip
    """The fastest fitting configuration of the grid with every count of recomputed layers
    the framework launches beside each full recomputation, ties to the smallest key."""
    configs = grid_space(model, cluster, options)
    for config in list(configs):
        if config.recompute != "full" or options.pins.recompute is not None:
            continue
        for n in range(1, chunk_layers(model, cluster, config)):
            probe = config.model_copy(update={"recompute_layers": n})
            if launched_variant(probe, model, cluster=cluster, options=options) == probe:
                configs.append(probe)
    batch = estimate_batch(model, cluster, configs)
    usable = options.usable_bytes(cluster.device, "megatron-te")
    fits = batch.columns["divides"] & (batch.columns["peak_memory_gib"] * GIB <= usable)
    step = batch.columns["step_time_s"]
    best = min(np.flatnonzero(fits), key=lambda i: (step[i], config_key(configs[i])))
    return configs[best]


H100 = CLUSTERS / "dgx-h100-80gb.json"
LLAMA = MODELS / "llama3-70b.json"


@pytest.mark.parametrize(("model_path", "cluster_path", "nodes", "framework", "pins", "layers"), [
    (GPT3, A100, 32, "megatron", Pins(tp=8, pp=8, sp=False, zero=0), 5),
    (GPT3, A100, 32, "megatron", Pins(tp=8, sp=False), None),
    (GPT3, A100, 32, "megatron", Pins(tp=8, pp=8, sp=False, zero=0, recompute="full"), None),
    (LLAMA, H100, 4, "torchtitan", Pins(tp=4, pp=4), None),
    (LLAMA, H100, 4, "colossalai", Pins(tp=4, pp=4, zero=1), 15),
    (LLAMA, H100, 4, "megatron", Pins(tp=4, pp=4, zero=1), 1),
])  # fmt: skip
def test_search_takes_fewest_recomputed_layers_as_brute_force(
    model_path: str, cluster_path: str, nodes: int, framework: str, pins: Pins,
    layers: int | None,
) -> None:  # fmt: skip
    """GPT-3 175B on 256 A100s at TP8 PP8 without SP or ZeRO, as Megatron-LM trained it:
    keeping every activation does not fit (85.7 GiB), recomputing all does (59.3 GiB) at
    33 % more time; the search recomputes the fewest layers that fit (5 of 12: 74.6 GiB), as
    pricing every count finds, where the framework launches it (not under a pinned full
    recomputation, nor on torchtitan; with SP and ZeRO searched nothing needs it). Llama-3
    70B on 32 H100s at TP4 PP4, its ends a layer lighter (19 + 21 x 2 + 19: the first stage
    holds the most microbatches in flight): 15 layers per stage on Colossal-AI (Hugging
    Face's norms keep their input's fp32 copy; 16 of 20 on equal stages); Megatron-LM adds
    CP2 and recomputes 1 (5 on equal stages); torchtitan recomputes all."""
    model = planner.load_model(model_path)
    cluster = planner.load_cluster(cluster_path, nodes=nodes)
    options = SolveOptions(framework=framework, pins=pins)
    plan = enumerate_plan(model, cluster, options)
    want = brute_force(model, cluster, options)
    got = plan.configuration
    assert got.recompute_layers == want.recompute_layers == layers
    assert config_key(got) == config_key(want)
    assert plan.predicted.step_time_s == pytest.approx(
        planner.estimate(model, cluster, want).step_time_s, rel=1e-12)


def test_a_partial_recompute_that_does_not_fit_is_told_to_recompute_every_layer() -> None:
    """GPT-3 175B at TP8 PP8 on 256 A100s, 1 of 12 layers recomputed: 83.5 GiB does not
    fit; recomputing every layer (59.3 GiB) is the first remedy."""
    model = planner.load_model(GPT3)
    cluster = planner.load_cluster(A100, nodes=32)
    config = ParallelConfig(tp=8, pp=8, recompute="full", recompute_layers=1)
    message = config_infeasible_message(model, cluster, config)
    assert "full (1 per chunk) recompute" in message
    assert "would fit: without --recompute-layers (59.3 GiB)" in message
