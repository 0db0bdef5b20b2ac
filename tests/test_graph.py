"""The operator graph: structure, layer kinds, and FLOP counts against the papers."""

from __future__ import annotations

import networkx as nx
import pytest

import planner
from planner.diagnose.run_records import model_flops_eq, narayanan_eq3_flops
from planner.graph import index_layers, lower
from planner.spec import ClusterSpec, TrainingSpec
from planner.spec.reading import load_model
from tests.conftest import HF, MODELS, shared

TRAINING = TrainingSpec(seq_length=2048, global_batch_size=1)


def test_graph_is_a_dag_with_every_op_tagged() -> None:
    """One connected DAG; layer 0 embeds, L + 1 holds the head, each op knows its layer."""
    model = load_model(MODELS / "gpt3-175b.json")
    graph = lower(model, TRAINING)
    assert nx.is_directed_acyclic_graph(graph)
    assert nx.is_weakly_connected(graph)
    layers = {graph.nodes[n]["op"].layer for n in graph}
    assert layers == set(range(model.num_layers + 2))
    assert [n for n in graph if graph.in_degree(n) == 0] == ["embedding"]
    assert [n for n in graph if graph.out_degree(n) == 0] == ["loss"]


def test_identical_layers_are_recognisable() -> None:
    """All decoder layers of a kind have the same ops (kind, shapes, FLOPs, saved tensors)."""
    index = index_layers(lower(load_model(MODELS / "llama3-70b.json"), TRAINING))
    first, *rest = (index.ops_by_layer[layer] for layer in index.layers_by_kind["dense"])

    def shape(ops: tuple) -> list:
        return [(op.kind, op.inputs, op.output, op.weight, op.flops, op.saved) for op in ops]

    assert all(shape(ops) == shape(first) for ops in rest)
    assert len(rest) == 79


def test_deepseek_layer_kinds() -> None:
    """DeepSeek-V3: 3 dense layers first, then 58 MoE layers (first_k_dense_replace = 3)."""
    index = index_layers(lower(load_model(shared(HF / "DeepSeek-V3.config.json")), TRAINING))
    assert index.layers_by_kind["dense"] == (1, 2, 3)
    assert index.layers_by_kind["moe"] == tuple(range(4, 62))
    kinds = {op.kind for op in index.representative("moe")}
    assert {"router", "dispatch", "expert_linear", "combine"} <= kinds


def test_forward_flops_match_korthikanti_eq7() -> None:
    """3 x the graph's forward FLOPs = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for a GPT."""
    model = load_model(MODELS / "gpt3-175b.json")
    graph = lower(model, TRAINING, micro_batch_size=2)
    forward = sum(graph.nodes[n]["op"].flops for n in graph)
    expected = model_flops_eq(batch=2, seq=2048, layers=96, hidden=12288, vocab=51200)
    assert 3 * forward == pytest.approx(expected, rel=1e-12)


def test_full_recompute_hardware_flops_match_narayanan_eq3(a100: ClusterSpec) -> None:
    """With full recomputation and unfused attention (as Megatron-LM's 2021 runs), the
    executed FLOPs per step are Narayanan Eq. 3, so the estimate's hardware TFLOP/s are the
    ones Megatron reports."""
    model = load_model(MODELS / "gpt3-175b.json")
    config = planner.ParallelConfig(tp=8, pp=16, recompute="full", flash_attention=False)
    est = planner.estimate(model, a100, config)
    step_flops = est.hardware_tflops_per_gpu * 1e12 * est.step_time_s * est.num_devices
    expected = narayanan_eq3_flops(batch=1536, seq=2048, layers=96, hidden=12288, vocab=51200)
    assert step_flops == pytest.approx(expected, rel=1e-9)
    assert est.model_tflops_per_gpu < est.hardware_tflops_per_gpu


def test_gqa_and_mla_shrink_the_kv_projection() -> None:
    """Llama 3 70B's QKV projection has (64 + 2 x 8) x 128 outputs, not 3 x 8192."""
    index = index_layers(lower(load_model(shared(HF / "Meta-Llama-3.1-70B.config.json")), TRAINING))
    qkv = next(op for op in index.representative("dense") if op.name.endswith("qkv_proj"))
    assert qkv.weight is not None
    assert qkv.weight.dims == (("hidden", 8192), ("heads", (64 + 2 * 8) * 128))
