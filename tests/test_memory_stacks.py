"""Memory as the allocator sees it, held to what a real H100 measured
(``../shared/validation/h100/``: ``layers.jsonl``, ``runs_one_gpu.json``) and to arithmetic by
hand for the parts no shared measurement isolates (ZeRO-3's gathered layers, the reserve).

The stacks count what each operator keeps (:mod:`planner.graph.lower`); a layer measurement is
the bytes a forward keeps less its input and output, which the step keeps once per layer
anyway: the planner's layer bytes less its fp32 input are held to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import cost
from planner.diagnose.layer_memory import (
    LayerMemoryCheck,
    layer_memory_checks,
    read_layer_records,
)
from planner.plan.config import ParallelConfig, resolve
from planner.spec import ClusterSpec, ModelSpec
from planner.spec.reading import load_cluster
from planner.uniform.estimate import estimate
from planner.uniform.stages import communicators, uniform_stage
from planner.vocabulary import GIB
from tests.h100_layers import H100, SHAPES

INSTANCES = Path(__file__).parents[1] / "instances"


@pytest.fixture(scope="module")
def h100() -> ClusterSpec:
    """One DGX H100 node: eight devices."""
    return load_cluster(INSTANCES / "clusters" / "dgx-h100-80gb.json", nodes=1)


CHECKS = layer_memory_checks(read_layer_records(H100 / "layers.jsonl"), SHAPES,
                             load_cluster(INSTANCES / "clusters" / "dgx-h100-80gb.json"))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name.replace(" ", "-"))
def test_a_layer_and_the_loss_keep_what_the_h100_measured(check: LayerMemoryCheck) -> None:
    """Eager and compiled layers, whole and tensor-parallel shards (no sequence parallelism:
    norms and residuals whole), and Hugging Face's loss on fp32 logits (the head keeps the
    fp32 log-probabilities and bf16 copies of its weight and input; its backward peaks 8
    bytes per logit above that): each within 1 % (the issue's target is 10 %)."""
    assert abs(check.error) < 0.01


def test_every_measurement_is_checked() -> None:
    """18 layer records, and the head of the 7 whole eager ones twice (kept, peak)."""
    assert len(CHECKS) == 18 + 2 * 7


def _small_model() -> ModelSpec:
    """A model whose decoder layer outweighs its embedding and head, so ZeRO-3 gathers a layer."""
    return ModelSpec(name="small", num_layers=8, hidden_size=1024, num_attention_heads=8,
                     ffn_hidden_size=2816, vocab_size=1000, max_position_embeddings=4096,
                     activation="swiglu", normalization="rmsnorm", position_embedding="rope",
                     tie_word_embeddings=False, bias=False)  # fmt: skip


def test_zero3_holds_three_gathered_layers_and_two_gradient_buffers_by_hand(
    h100: ClusterSpec,
) -> None:
    """A layer of 4h^2 + 3hf + 2h = 12,847,104 parameters, bf16 under FSDP2's order: three
    layers' bf16 parameters (the one running, the next prefetched, the last one's buffer not
    yet freed) and two fp32 reduce-scatter inputs: 3 x 2 + 2 x 4 = 14 bytes each."""
    layer = 4 * 1024**2 + 3 * 1024 * 2816 + 2 * 1024
    assert layer == 12_847_104
    config = ParallelConfig(dp=8, zero=3, mbs=1, global_batch=8, seq_len=1024)
    e = estimate(_small_model(), h100, config)
    assert e.memory.gathered_parameters_gib * GIB == pytest.approx(14 * layer, rel=1e-9)
    below = estimate(_small_model(), h100, config.model_copy(update={"zero": 2}))
    assert below.memory.gathered_parameters_gib == 0


def test_megatron_loss_workspace_is_the_bf16_gradient_of_the_vocab_shard(
    h100: ClusterSpec,
) -> None:
    """Megatron-Core's vocab-parallel cross entropy turns the kept fp32 softmax into the
    gradient in place; the copy cast back to bf16 is the transient: 2 bytes per token and
    vocabulary entry of the rank's shard, on the last stage."""
    model = _small_model()
    config = ParallelConfig(tp=2, pp=2, dp=2, mbs=1, global_batch=8, seq_len=1024)
    e = estimate(model, h100, config)
    last = e.stages[-1].memory
    assert last.loss_workspace_gib * GIB == pytest.approx(2 * 1024 * 1000 / 2, rel=1e-9)
    assert e.stages[0].memory.loss_workspace_gib == 0


def test_the_reserve_is_context_nccl_and_fragmentation_by_hand(h100: ClusterSpec) -> None:
    """TP 8 x PP 2 x DP 2 over 32 H100: a tensor group of 8 (688 MB), a data-parallel group
    of 2 (544 MB), the pipeline's neighbours (544 MB); then 0.5 GiB of CUDA context and 8 %
    of what the plan allocates."""
    cluster = h100.model_copy(update={"num_nodes": 4})
    model = _small_model()
    resolved = resolve(model, cluster, ParallelConfig(tp=8, pp=2, mbs=1, global_batch=8,
                                                      seq_len=1024))  # fmt: skip
    comms = communicators(uniform_stage(resolved), cluster=cluster)
    assert comms == cost.Communicators(groups=(8, 1, 2), pairs=1)
    assert comms.bytes == pytest.approx(688e6 + 544e6 + 544e6)
    e = estimate(model, cluster, resolved.config)
    first = e.stages[0].memory
    allocated = first.total_gib - first.other_gib
    assert first.other_gib * GIB == pytest.approx(
        0.5 * GIB + comms.bytes + 0.08 * allocated * GIB, rel=1e-9)


def test_only_the_end_stages_connect_the_embedding_group(h100: ClusterSpec) -> None:
    """Tied word embeddings on PP 4: the first and last stages sum the copy's gradients in a
    two-rank communicator (544 MB of NCCL's buffers, Megatron-LM's ``_EMBEDDING_GROUP``); the
    first stage holds that much more reserve than untied, the middle stages exactly what
    they hold untied (NCCL connects a communicator on first use)."""
    cluster = h100.model_copy(update={"num_nodes": 2})
    config = ParallelConfig(tp=4, pp=4, mbs=1, global_batch=8, seq_len=1024)
    untied = estimate(_small_model(), cluster, config).stages
    tied = estimate(_small_model().model_copy(update={"tie_word_embeddings": True}), cluster,
                    config).stages  # fmt: skip
    assert [s.memory for s in tied[1:-1]] == [s.memory for s in untied[1:-1]]
    first = (tied[0].memory.other_gib - untied[0].memory.other_gib) * GIB
    assert first == pytest.approx(544e6, rel=1e-9)
    assert tied[0].memory.total_gib - tied[0].memory.other_gib == pytest.approx(
        untied[0].memory.total_gib - untied[0].memory.other_gib, rel=1e-12)


def test_autocast_keeps_fp32_states_without_a_master_copy(h100: ClusterSpec) -> None:
    """PyTorch AMP: fp32 weights and gradients and Adam's two fp32 moments, 16 bytes a
    parameter; Megatron's bf16 weights, fp32 main gradients, fp32 master and moments, 18."""
    model = _small_model()
    config = ParallelConfig(mbs=1, global_batch=1, seq_len=1024)
    one = h100.model_copy(update={"num_nodes": 1, "devices_per_node": 1})
    amp = estimate(model, one, config.model_copy(update={"stack": "hf-eager"})).memory
    te = estimate(model, one, config).memory
    states = (amp.weights_gib, amp.gradients_gib, amp.optimizer_gib)
    assert [x / states[0] for x in states] == [1.0, 1.0, 2.0]
    megatron = (te.weights_gib, te.gradients_gib, te.optimizer_gib)
    assert [x / megatron[0] for x in megatron] == [1.0, 2.0, 6.0]


def test_composer_fsdp_gathers_as_fsdp1_and_keeps_the_fused_losss_logits(
    h100: ClusterSpec,
) -> None:
    """MosaicML's Composer with FSDP1 (BACKWARD_POST, PURE bf16 reductions): a unit's
    gradient, its padded copy and the next unit prefetched, 3 x 2 = 6 bytes a parameter of the
    largest layer; flash-attn's fused cross entropy keeps the bf16 logits (2 bytes each) and
    writes a new bf16 gradient (2 more), where Megatron keeps fp32 softmax (4) and casts 2."""
    layer = 12_847_104  # the small model's decoder layer, as above
    config = ParallelConfig(dp=8, zero=3, mbs=1, global_batch=8, seq_len=1024)
    composer = estimate(_small_model(), h100, config.model_copy(update={"stack": "composer-fsdp"}))
    assert composer.memory.gathered_parameters_gib * GIB == pytest.approx(6 * layer, rel=1e-9)
    assert composer.memory.loss_workspace_gib * GIB == pytest.approx(2 * 1024 * 1000, rel=1e-9)
    megatron = estimate(_small_model(), h100, config)
    logits = 1024 * 1000
    assert (megatron.memory.activations_gib - composer.memory.activations_gib) * GIB == \
        pytest.approx(2 * logits, rel=1e-9)  # fmt: skip
