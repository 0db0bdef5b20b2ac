"""Multi-token prediction (DeepSeek-V3's MTP module, Megatron-Core's ``--mtp-num-layers``):
what it adds to the graph, and that the last pipeline stage carries it, by known answers."""

from __future__ import annotations

import hashlib
import json

import pytest

from planner.graph import index_layers, lower
from planner.plan.config import ParallelConfig
from planner.plan.inputs import model_hashes
from planner.spec import ModelSpec, TrainingSpec
from planner.spec.reading import load_cluster, load_model
from planner.uniform.estimate import estimate
from tests.conftest import HF, shared, skip_module_without
from tests.framework_cases import H100

skip_module_without(HF / "DeepSeek-V3.config.json")

GIB = 2**30
TRAINING = TrainingSpec(seq_length=4096, global_batch_size=1)
# TP4 x PP16 x EP8 folded, stages of 2 + 14 x 4 + 3 layers of DeepSeek-V3's 61.
CONFIG = ParallelConfig(tp=4, pp=16, ep=8, etp=1, sp=True, zero=1, first_stage_layers=2,
                        last_stage_layers=3, seq_len=4096, global_batch=4096)  # fmt: skip


def _deepseek(**changes: int) -> ModelSpec:
    model = load_model(shared(HF / "DeepSeek-V3.config.json"))
    return model.model_copy(update=changes)


def _flops(model: ModelSpec) -> float:
    graph = lower(model, TRAINING)
    return sum(graph.nodes[n]["op"].flops for n in graph)


def test_the_config_trains_one_module_and_the_head_runs_it_after_its_loss() -> None:
    """num_nextn_predict_layers 1: one module, its ops in the head after the model's loss."""
    model = _deepseek()
    assert model.mtp_layers == 1 and model.embedding_on_last_stage
    head = [op.name for op in index_layers(lower(model, TRAINING)).representative("head")]
    assert head[:3] == ["final_norm", "lm_head", "loss"]
    assert head[-3:] == ["mtp1.head.final_norm", "mtp1.head.lm_head", "mtp1.head.loss"]
    assert not _deepseek(mtp_layers=0).embedding_on_last_stage  # untied, no module


def test_a_module_computes_the_last_layer_a_projection_and_an_output_layer() -> None:
    """Its forward FLOPs: the last decoder layer's (an MoE layer), ``eh_proj``'s 2 x tokens x
    2h x h, and the shared output layer's 2 x tokens x h x V; two modules, twice that."""
    model = _deepseek(mtp_layers=0)
    graph = lower(model, TRAINING)
    last = sum(graph.nodes[n]["op"].flops for n in graph
               if graph.nodes[n]["op"].layer == model.num_layers)  # fmt: skip
    tokens, h, vocab = TRAINING.seq_length, model.hidden_size, model.vocab_size
    module = last + 2 * tokens * 2 * h * h + 2 * tokens * h * vocab
    assert _flops(_deepseek(mtp_layers=1)) - _flops(model) == pytest.approx(module, rel=1e-12)
    assert _flops(_deepseek(mtp_layers=2)) - _flops(model) == pytest.approx(2 * module,
                                                                          rel=1e-12)


@pytest.fixture(scope="module")
def stages() -> dict[int, list]:
    """The stages of CONFIG with and without the module, and with a 62nd layer on the last
    stage instead."""
    cluster = load_cluster(H100, nodes=256)
    return {
        1: estimate(_deepseek(mtp_layers=1), cluster, CONFIG).stages,
        0: estimate(_deepseek(mtp_layers=0), cluster, CONFIG).stages,
        62: estimate(_deepseek(mtp_layers=0, num_layers=62), cluster,
                     CONFIG.model_copy(update={"last_stage_layers": 4})).stages,
    }  # fmt: skip


def test_only_the_last_stage_carries_the_module(stages: dict[int, list]) -> None:
    """Megatron-Core builds the module on the last pipeline stage only
    (``get_mtp_num_layers_to_build``): the middle stages are priced exactly as without it;
    the first one's step ends later by the embedding gradients' all-reduce with the last
    stage, and it holds that group's communicator (NCCL's 544 MB for two ranks), which only
    the ends connect."""
    for with_module, without in zip(stages[1][1:-1], stages[0][1:-1], strict=True):
        assert with_module == without
    first_with, first_without = stages[1][0], stages[0][0]
    assert first_with.time.compute_s == first_without.time.compute_s
    assert first_with.time.sync_tail_s > first_without.time.sync_tail_s
    group = first_with.memory.other_gib - first_without.memory.other_gib
    assert group * GIB == pytest.approx(544e6, rel=1e-9)
    assert stages[1][-1].time.compute_s > stages[0][-1].time.compute_s


def test_the_last_stage_holds_a_layer_a_projection_and_an_embedding_copy(
    stages: dict[int, list],
) -> None:
    """Its 16-bit weights grow by one MoE layer's (what a 62nd layer adds to that stage), the
    embedding's copy the module reads (V x h over TP 4, summed with the first stage's as a
    tied copy is), ``eh_proj`` (2h x h over TP 4) and three norms; the output layer is the
    model's own."""
    model = _deepseek()
    h, vocab, tp = model.hidden_size, model.vocab_size, CONFIG.tp
    layer = stages[62][-1].memory.weights_gib - stages[0][-1].memory.weights_gib
    module = layer + (vocab * h / tp + 2 * h * h / tp + 3 * h) * 2 / GIB
    grown = stages[1][-1].memory.weights_gib - stages[0][-1].memory.weights_gib
    assert grown == pytest.approx(module, rel=1e-9)


def test_the_last_stage_computes_a_layer_and_a_head_more(stages: dict[int, list]) -> None:
    """Its compute a microbatch grows by at least a layer and an output layer with its loss
    (the head of the stage without the module, less its three layers) and by at most 15 %
    more: the projection, the norms and the embedding lookup."""
    layer = stages[62][-1].time.compute_s - stages[0][-1].time.compute_s
    head = stages[0][-1].time.compute_s - 3 * layer
    grown = stages[1][-1].time.compute_s - stages[0][-1].time.compute_s
    assert layer + head < grown < 1.15 * (layer + head)


def test_plans_made_before_multi_token_prediction_name_the_model_without_it() -> None:
    """A plan written before ``mtp_layers`` existed hashed the model's JSON without it: it
    still names the model while the field is 0, and not the model that trains a module."""
    without = _deepseek(mtp_layers=0)
    # nor rotary_percent, added after it
    dumped = without.model_dump(mode="json", exclude={"mtp_layers", "rotary_percent"})
    before = hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()
    assert before in model_hashes(without)
    assert before not in model_hashes(_deepseek())


def test_a_modules_lookup_writes_the_tables_gradient_as_the_embedding_does() -> None:
    """The module embeds the next tokens with the shared table (a copy on the last stage): its
    lookup's backward writes a dense gradient of the whole table as the first stage's does,
    and the stack sums it into the weight's the same way (Megatron-Core's hook: 12 bytes a
    parameter; ``planner.graph.unfused.embedding_gradient_bytes``)."""
    ops = index_layers(lower(_deepseek(), TRAINING)).ops_by_layer
    lookups = [op for layer in ops.values() for op in layer if op.kind == "embedding"]
    assert [op.name for op in lookups] == ["embedding", "mtp1.embedding"]
    first, module = lookups
    assert module.tied_to == "embedding" and module.weight == first.weight
    assert module.unfused == first.unfused
    assert first.unfused is not None and first.unfused.weight_backward_bytes == 12.0
