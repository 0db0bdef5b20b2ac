"""Model FLOPs and executed FLOPs are separate quantities (issue 13).

Model FLOPs count every matrix multiply with the full ``s x s`` attention scores, three times
the forward (Narayanan et al., SC'21, Eq. 3): the convention MFU is reported in. Executed
FLOPs are what the GPUs run (:func:`planner.cost.executed_flops`): fused causal attention
computes half the scores and recomputes them in its backward, and recomputation reruns the
forward. Hardware FLOP/s are executed FLOPs over the step's time, which the same cost model
prices, so they can never exceed the device's peak.
"""

from __future__ import annotations

import numpy as np
import pytest

import planner
from planner.errors import ConfigError
from planner.options import SolveOptions, training_of
from planner.plan.config import ParallelConfig
from planner.search.per_operator import solve_per_operator
from planner.spec.reading import load_cluster, load_model
from planner.uniform.space import (
    branch_groups,
    branches,
    context_algorithms,
    folds_experts,
    grid_space,
)
from tests.conftest import CLUSTERS, MODELS

LONG = 131072
"""128K tokens: attention dominates a layer's FLOPs."""


SAMPLES = {LONG: 100, 4096: 50, 2048: 50, 1024: 50}
"""The most configurations priced for a model and cluster at each sequence length: more at
128K, where attention's executed FLOPs part most from the model's."""


def _sampled(model_name: str, cluster_name: str, seq: int, count: int) -> list[ParallelConfig]:
    """Up to ``count`` configurations of the per-operator search's space at ``seq``,
    spread over its branches (its ``(tp, pp, cp, ep)`` and layer splits) and, within each
    branch taken, over its configurations; none where the model's positions stop short of
    ``seq``. Only the branches taken are built: on 64 H100 at 128K tokens DeepSeek-V3's space
    holds 301,952 configurations in 2,407 branches and Mixtral's 240,160 in 820, and building
    them all was half of this test's time (nearly every configuration of theirs prices a layer
    of its own, so the sample is kept small too)."""
    model = load_model(MODELS / model_name)
    cluster = load_cluster(CLUSTERS / cluster_name, 8)
    options = SolveOptions(seq_length=seq, global_batch_size=64, framework="any")
    try:
        training = training_of(model, options)
    except ConfigError:  # learned positions stop at their table (GPT-3's 2,048)
        return []
    every = branches(model, cluster, training=training, pins=options.pins,
                     fold=folds_experts(options), attending=context_algorithms(options))
    taking = min(len(every), count)
    taken = [every[i * len(every) // taking] for i in range(taking)]
    each = max(1, count // taking)
    out = []
    for i, branch in enumerate(taken):
        configs = [c for group in branch_groups(branch, model, training=training,
                                                options=options) for c in group]  # fmt: skip
        stride = max(1, len(configs) // each)
        out += configs[i % stride::stride][:each]
    return out


SAME_AT_8_NODES = {"h100-3level-oversubscribed.json": "dgx-h100-80gb.json"}
"""Bundled files that price 8 nodes exactly as another does: the three-level fabric's 64 GPUs
sit inside one leaf, whose links are the DGX H100 file's InfiniBand."""


@pytest.mark.parametrize("cluster_name", sorted(p.name for p in CLUSTERS.glob("*.json")
                                                if p.name not in SAME_AT_8_NODES))
@pytest.mark.parametrize("model_name", sorted(p.name for p in MODELS.glob("*.json")))
def test_hardware_flops_never_exceed_the_peak(model_name: str, cluster_name: str) -> None:
    """Over every bundled model and cluster, at 128K, 4K, 2K and 1K tokens (as far as the model's
    positions reach), no configuration's
    hardware TFLOP/s pass the device's peak (the 128K case printed 1,022.6 on a 989 TFLOP/s
    H100 when full attention FLOPs were counted against the causal half's time). The sample
    is priced by the batch estimator (which agrees with ``estimate``:
    ``tests/test_estimate_batch.py``), and its busiest configuration by ``estimate`` too."""
    model = load_model(MODELS / model_name)
    cluster = load_cluster(CLUSTERS / cluster_name, 8)
    peak = cluster.device.peak_tflops["bf16"]
    configs = [c for seq, count in SAMPLES.items()
               for c in _sampled(model_name, cluster_name, seq, count)]  # fmt: skip
    batch = planner.estimate_batch(model, cluster, configs)
    divides = batch.columns["divides"]
    assert divides.any(), "no configuration of the space divides"
    hardware = np.where(divides, batch.columns["hardware_tflops_per_gpu"], -np.inf)
    assert hardware.max() <= peak
    busiest = planner.estimate(model, cluster, configs[int(hardware.argmax())])
    assert busiest.hardware_tflops_per_gpu <= peak
    assert busiest.hardware_tflops_per_gpu == pytest.approx(hardware.max(), rel=1e-6)


def test_hardware_equals_model_flops_without_fused_attention_or_recompute() -> None:
    """Unfused attention computes the full scores and nothing is rerun: the two counts agree
    (to rounding)."""
    model = load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
    e = planner.estimate(model, cluster, ParallelConfig(tp=8, flash_attention=False,
                                                        global_batch=8, seq_len=2048))
    assert e.hardware_tflops_per_gpu == pytest.approx(e.model_tflops_per_gpu, rel=1e-12)


def test_causal_attention_executes_fewer_flops_than_the_model_counts() -> None:
    """Fused causal attention at 128K: executed FLOPs fall below model FLOPs even with full
    recomputation added, by the attention's uncomputed half (known answer from the graph)."""
    model = load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 4)
    config = ParallelConfig(tp=8, cp=4, seq_len=LONG, global_batch=16)
    e = planner.estimate(model, cluster, config)
    assert e.hardware_tflops_per_gpu < e.model_tflops_per_gpu
    full = planner.estimate(model, cluster, config.model_copy(update={"recompute": "full"}))
    assert full.hardware_tflops_per_gpu < full.model_tflops_per_gpu


def test_the_search_reports_hardware_flops_below_the_peak() -> None:
    """The per-operator search's plan at a long sequence (its own pricing path)."""
    model = load_model(MODELS / "llama3-8b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 1)
    plan = solve_per_operator(model, cluster, SolveOptions(seq_length=32768, global_batch_size=8,
                                              framework="any"))  # fmt: skip
    assert 0 < plan.predicted.hardware_tflops_per_gpu <= cluster.device.peak_tflops["bf16"]


def test_the_files_left_out_price_8_nodes_as_their_twins() -> None:
    """What ``SAME_AT_8_NODES`` assumes: the same configuration steps in the same time."""
    model = load_model(MODELS / "mixtral-8x7b.json")
    config = ParallelConfig(tp=2, pp=2, ep=4, sp=True, global_batch=64, seq_len=4096)
    for name, twin in SAME_AT_8_NODES.items():
        steps = [planner.estimate(model, load_cluster(CLUSTERS / n, 8), config).step_time_s
                 for n in (name, twin)]
        assert steps[0] == steps[1]


def test_the_sample_is_drawn_from_the_search_space() -> None:
    """What ``_sampled`` assumes: the per-operator search's space is its branches' groups, as
    they are (no framework's rules drop or change any), so a sample of them is a sample of
    it (Mixtral 8x7B at 4K tokens on 64 H100: 25,936 configurations)."""
    model = load_model(MODELS / "mixtral-8x7b.json")
    cluster = load_cluster(CLUSTERS / "dgx-h100-80gb.json", 8)
    options = SolveOptions(seq_length=4096, global_batch_size=64, framework="any")
    training = training_of(model, options)
    groups = [c for branch in branches(model, cluster, training=training, pins=options.pins,
                                       fold=folds_experts(options),
                                       attending=context_algorithms(options))
              for group in branch_groups(branch, model, training=training, options=options)
              for c in group]  # fmt: skip
    assert groups == grid_space(model, cluster, options)
    sample = _sampled("mixtral-8x7b.json", "dgx-h100-80gb.json", 4096, 250)
    assert 0 < len(sample) <= 250 and set(sample) <= set(groups)
    assert len({(c.tp, c.pp, c.cp, c.cp_algo, c.ep, c.etp, c.first_stage_layers)
                for c in sample}) == len(branches(model, cluster, training=training,
                                                  pins=options.pins,
                                                  fold=folds_experts(options),
                                                  attending=context_algorithms(options)))
